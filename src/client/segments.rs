//! Segmented downloads from servers without MODE E (vsftpd, pure-ftpd, most of the internet),
//! as lftp's `pget -n` and aria2's `-x` do: the missing bytes are cut into ranges, each
//! fetched on a session of its own with REST and RETR, whose data connection is closed (and
//! the transfer aborted) once its range has arrived. What is stored is recorded in the same
//! sidecar as a MODE E download, so `--resume` fetches only the holes.

use super::Options;
use super::control::Control;
use super::error::{ClientError, Result};
use super::interrupt::send_abort;
use super::job::{PartFile, local_err, not_a_partial};
use super::records::Sidecar;
use super::sessions::{another_session, session};
use super::summary::{Summary, summary};
use super::url::Target;
use super::watch::Watch;
use crate::engine::Abort;
use crate::engine::receive::Progress;
use braid_proto::Command;
use braid_proto::ranges::RangeSet;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// No segment smaller than this, but where a hole is smaller: below it a session's login and
/// REST cost more than its share of the bytes.
pub const MIN_SEGMENT: u64 = 1 << 20;

/// Attempts at one segment (a connection that breaks mid-way leaves the rest of its range to
/// the next attempt, on whichever session takes it).
const ATTEMPTS: u32 = 3;

/// Cuts the holes of a `size`-byte file into at most `n` ranges of about equal length, at
/// least [`MIN_SEGMENT`] each (a smaller hole is one range), in file order.
pub fn plan(missing: &RangeSet, n: usize) -> Vec<(u64, u64)> {
    let total = missing.len();
    if total == 0 {
        return Vec::new();
    }
    let share = total.div_ceil(n.max(1) as u64).max(MIN_SEGMENT);
    let mut out = Vec::new();
    for (start, end) in missing.iter() {
        let pieces = (end - start).div_ceil(share).max(1);
        let step = (end - start).div_ceil(pieces);
        let mut at = start;
        while at < end {
            let stop = (at + step).min(end);
            out.push((at, stop));
            at = stop;
        }
    }
    out
}

/// A range being fetched: how far it has come, and where it now ends (a session that found
/// nothing left to take moves the end back and takes the second half).
struct Running {
    at: AtomicU64,
    end: AtomicU64,
}

/// Which running range to split, and where: the one with the most left, in two halves of at
/// least [`MIN_SEGMENT`]; None when none has that much left. `ranges`: (at, end) of each.
pub fn split(ranges: &[(u64, u64)]) -> Option<(usize, u64)> {
    let (i, &(at, end)) = ranges
        .iter()
        .enumerate()
        .max_by_key(|(_, (at, end))| end.saturating_sub(*at))?;
    let left = end.saturating_sub(at);
    (left >= 2 * MIN_SEGMENT).then(|| (i, at + left / 2))
}

/// What the worker threads share.
struct Shared<'a> {
    target: &'a Target,
    opts: &'a Options,
    file: &'a File,
    size: u64,
    /// Ranges to fetch, with the attempts each has had.
    queue: Mutex<VecDeque<(u64, u64, u32)>>,
    running: Mutex<Vec<Arc<Running>>>,
    stored: Mutex<RangeSet>,
    bytes: AtomicU64,
    /// Data connections opened: one per range, and one per attempt after a break.
    opened: AtomicU64,
    /// Sessions that logged in (the server may refuse some: 421, a per-client limit).
    sessions: AtomicU64,
    abort: Abort,
    /// The first failure that ends the download (a segment out of attempts, a local error).
    failed: Mutex<Option<ClientError>>,
}

impl Shared<'_> {
    fn take(&self) -> Option<(u64, u64, u32)> {
        if self.abort.is_aborted() || self.failed().is_some() {
            return None;
        }
        let queued = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        queued.or_else(|| self.steal())
    }

    /// With nothing queued, the second half of the running range with the most left: its
    /// session stops at the middle, so all sessions keep moving data to the end instead of
    /// the last range finishing alone.
    fn steal(&self) -> Option<(u64, u64, u32)> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let now: Vec<(u64, u64)> = running
            .iter()
            .map(|r| (r.at.load(Ordering::Acquire), r.end.load(Ordering::Acquire)))
            .collect();
        let (i, middle) = split(&now)?;
        let end = running[i].end.swap(middle, Ordering::AcqRel);
        Some((middle, end, 0))
    }

    fn opened(&self) -> u32 {
        self.opened.load(Ordering::Relaxed) as u32
    }

    fn sessions(&self) -> u32 {
        self.sessions.load(Ordering::Relaxed) as u32
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, Option<ClientError>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, e: ClientError) {
        self.failed().get_or_insert(e);
        self.abort.abort();
    }

    fn progress(&self) -> Progress {
        Progress::holding(
            self.stored
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// Downloads `target` (`size` bytes, known from SIZE) into `dest` over up to `n` sessions,
/// the first of which is `c`.
pub fn get(
    c: &mut Control,
    target: &Target,
    dest: &Path,
    size: u64,
    n: usize,
    opts: &Options,
) -> Result<Summary> {
    let part = PartFile::open(dest, opts.resume)?;
    let record = part.record(&target.path, Some(size));
    let have = if opts.resume {
        held(&part, &record, size)?
    } else {
        RangeSet::new()
    };
    let resumed_from = have.len();
    let segments = plan(&have.missing(size), n);
    let started = Instant::now();
    let shared = Shared {
        target,
        opts,
        file: &part.file,
        size,
        queue: Mutex::new(segments.iter().map(|&(s, e)| (s, e, 0)).collect()),
        running: Mutex::new(Vec::new()),
        stored: Mutex::new(have),
        bytes: AtomicU64::new(0),
        opened: AtomicU64::new(0),
        sessions: AtomicU64::new(1),
        abort: Abort::new(),
        failed: Mutex::new(None),
    };
    record.save(&shared.progress());
    let sessions = n.min(segments.len()).max(1);
    let watch = Watch::start(opts, Some(size), resumed_from);
    let mut last_save = Instant::now();
    let work = || on_sessions(c, &shared, sessions);
    watch.run(&shared.abort, work, || {
        watch
            .bar
            .set_position(resumed_from + shared.bytes.load(Ordering::Relaxed));
        if last_save.elapsed() > Duration::from_secs(1) {
            record.save(&shared.progress());
            last_save = Instant::now();
        }
    });
    let got = shared.progress();
    let received = shared.bytes.load(Ordering::Relaxed);
    if !got.ranges.covers(0, size) {
        record.save_last(&got);
        let partial = Some(part.name());
        if watch.stopped() {
            return Err(watch.stop(c, received, "", partial));
        }
        let why = match shared.failed().take() {
            // A local failure (a full disk) keeps its own exit code; what arrived is kept.
            Some(e @ ClientError::Local { .. }) => return Err(e),
            Some(e) => e.to_string(),
            None => format!("bytes {} never arrived", got.ranges.missing(size)),
        };
        return Err(ClientError::Interrupted {
            bytes: received,
            why,
            partial,
        });
    }
    let (opened, logged_in) = (shared.opened(), shared.sessions());
    let local = part.commit(Some(size))?;
    record.remove();
    let mut s = summary(
        "get",
        target,
        local,
        received,
        Some(size),
        resumed_from,
        started,
    );
    s.streams = logged_in;
    s.new_data_connections = opened;
    s.mode = "stream-segmented";
    Ok(s)
}

/// Runs the ranges on `sessions` sessions: `c` and as many more as log in.
fn on_sessions(c: &mut Control, shared: &Shared, sessions: usize) {
    std::thread::scope(|scope| {
        for _ in 1..sessions {
            scope.spawn(|| match session(shared.target, shared.opts, None) {
                Ok(mut extra) => {
                    shared.sessions.fetch_add(1, Ordering::Relaxed);
                    work(&mut extra, shared);
                    extra.quit();
                }
                // One session fewer (a server's per-client limit, 421): the others take its
                // ranges.
                Err(e) => tracing::info!("a segment's session could not start: {e}"),
            });
        }
        work(c, shared);
    })
}

/// What a partial download holds: its sidecar's ranges, or (a stream-mode partial, which has
/// none) its bytes from the start, which must not be more than the file has.
fn held(part: &PartFile, record: &Sidecar, size: u64) -> Result<RangeSet> {
    if let Some(p) = record.load() {
        return Ok(p.ranges);
    }
    let len = part.held()?;
    if len > size {
        return Err(not_a_partial(&part.part, len, size));
    }
    Ok([(0, len)].into_iter().collect())
}

/// Fetches ranges on `c` until none are left or the download ends.
fn work(c: &mut Control, shared: &Shared) {
    while let Some((start, end, tries)) = shared.take() {
        let range = Arc::new(Running {
            at: AtomicU64::new(start),
            end: AtomicU64::new(end),
        });
        let mut running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
        running.push(range.clone());
        drop(running);
        let fetched = fetch(c, shared, &range);
        let mut running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|r| !Arc::ptr_eq(r, &range));
        drop(running);
        // Where it ends now (another session may have taken its second half).
        let end = range.end.load(Ordering::Acquire);
        match fetched {
            Ok(()) => {}
            Err(Fetch::Local(e)) => return shared.fail(e),
            Err(Fetch::Broken(_)) if shared.abort.is_aborted() => return,
            Err(Fetch::Broken(e)) => {
                let done = shared
                    .stored
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .overlap(start, end);
                let rest = (start + done, end);
                if tries + 1 >= ATTEMPTS {
                    return shared.fail(e);
                }
                tracing::info!("range {start}-{end} broke ({e}); its rest goes out again");
                shared
                    .queue
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back((rest.0, rest.1, tries + 1));
                // The session may be what broke: start a new one, in the old one's place (a
                // server that allows this client N sessions still counts the old one until
                // it has gone: 421 meanwhile).
                if let Some(sock) = c.socket() {
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
                match another_session(shared.target, shared.opts, || shared.abort.is_aborted()) {
                    Ok(fresh) => *c = fresh,
                    Err(e) => return tracing::info!("no new session for a broken range: {e}"),
                }
            }
        }
    }
}

enum Fetch {
    /// Writing here failed: no other attempt can do better.
    Local(ClientError),
    /// The connection or the server failed: another attempt may succeed.
    Broken(ClientError),
}

/// Fetches `range` on `c`: REST, RETR, the range's bytes written at their offsets as they
/// come, up to where it ends (which may move back meanwhile), then (unless the range ends the
/// file) the data connection closed and the transfer aborted.
fn fetch(c: &mut Control, shared: &Shared, range: &Running) -> std::result::Result<(), Fetch> {
    let start = range.at.load(Ordering::Acquire);
    let retr = Command::Retr(shared.target.path.clone());
    let mut data = c.stream_transfer(&retr, start).map_err(Fetch::Broken)?;
    shared.opened.fetch_add(1, Ordering::Relaxed);
    let tracked = Tracked::new(&shared.abort, data.tcp());
    let mut buf = vec![0u8; 256 << 10];
    let mut at = start;
    let end = |r: &Running| r.end.load(Ordering::Acquire);
    while at < end(range) {
        let want = ((end(range) - at) as usize).min(buf.len());
        let n = match data.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(Fetch::Broken(ClientError::Interrupted {
                    bytes: at - start,
                    why: format!(
                        "the data connection closed at byte {at}, before {}",
                        end(range)
                    ),
                    partial: None,
                }));
            }
            Ok(n) => n,
            Err(e) => {
                return Err(Fetch::Broken(ClientError::Interrupted {
                    bytes: at - start,
                    why: format!("data connection: {e}"),
                    partial: None,
                }));
            }
        };
        // Past where the range now ends, another session fetches the same bytes: writing
        // them twice would be harmless, but they are not this range's to count.
        let keep = (n as u64).min(end(range).saturating_sub(at)) as usize;
        shared
            .file
            .write_all_at(&buf[..keep], at)
            .map_err(|e| Fetch::Local(local_err("cannot write the download")(e)))?;
        shared
            .stored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(at, at + keep as u64);
        shared.bytes.fetch_add(keep as u64, Ordering::Relaxed);
        at += n as u64;
        range.at.store(at, Ordering::Release);
    }
    if end(range) == shared.size {
        // The file's last range: the server ends it, and says so.
        let mut rest = [0u8; 1];
        let _ = data.read(&mut rest);
        data.finish();
        drop(data);
        c.finish_transfer(&retr).map_err(Fetch::Broken)?;
    } else {
        // The server would send on to the end of the file: stop it. Closed for good (no
        // duplicate left open), the connection is reset, which ends a server's blocked send
        // even where it reads ABOR only between transfers (vsftpd under TLS).
        let _ = data.tcp().shutdown(std::net::Shutdown::Both);
        drop(data);
        drop(tracked);
        send_abort(c);
    }
    Ok(())
}

/// A range's data connection, known to the download's [`Abort`] (Ctrl-C closes it) while the
/// range runs, and no longer once it ends.
struct Tracked<'a> {
    abort: &'a Abort,
    sock: Option<Arc<std::net::TcpStream>>,
}

impl<'a> Tracked<'a> {
    fn new(abort: &'a Abort, sock: &std::net::TcpStream) -> Tracked<'a> {
        let sock = sock.try_clone().ok().map(Arc::new);
        if let Some(s) = &sock {
            abort.register_handle(s.clone());
        }
        Tracked { abort, sock }
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.sock.take() {
            self.abort.forget(&s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(r: &[(u64, u64)]) -> RangeSet {
        r.iter().copied().collect()
    }

    #[test]
    fn an_idle_session_takes_the_second_half_of_the_range_with_most_left() {
        let mib = MIN_SEGMENT;
        assert_eq!(
            split(&[(0, 3 * mib), (4 * mib, 10 * mib), (12 * mib, 13 * mib)]),
            Some((1, 7 * mib))
        );
        // Halves below the minimum are not worth a session's login and slow start.
        assert_eq!(split(&[(0, 2 * mib - 1)]), None);
        assert_eq!(split(&[(5, 5)]), None);
        assert_eq!(split(&[]), None);
    }

    #[test]
    fn the_holes_are_cut_into_about_n_ranges_of_at_least_the_minimum() {
        let mib = MIN_SEGMENT;
        // A whole file: n equal ranges that tile it.
        assert_eq!(
            plan(&set(&[(0, 8 * mib)]), 4),
            [
                (0, 2 * mib),
                (2 * mib, 4 * mib),
                (4 * mib, 6 * mib),
                (6 * mib, 8 * mib)
            ]
        );
        // Never below the minimum: 3 MiB in 8 wanted ranges makes 3.
        assert_eq!(plan(&set(&[(0, 3 * mib)]), 8).len(), 3);
        // Holes are never bridged, and a small hole is one range.
        let holes = set(&[(100, 200), (4 * mib, 8 * mib)]);
        let p = plan(&holes, 4);
        assert_eq!(p[0], (100, 200));
        assert_eq!(p.iter().map(|(s, e)| e - s).sum::<u64>(), holes.len());
        assert!(p.iter().all(|&(s, e)| holes.covers(s, e)));
        assert!(plan(&RangeSet::new(), 4).is_empty());
        // One session: one range per hole.
        assert_eq!(plan(&holes, 1), [(100, 200), (4 * mib, 8 * mib)]);
    }

    fn shared<'a>(target: &'a Target, opts: &'a Options, file: &'a File) -> Shared<'a> {
        Shared {
            target,
            opts,
            file,
            size: 16 * MIN_SEGMENT,
            queue: Mutex::new(VecDeque::new()),
            running: Mutex::new(Vec::new()),
            stored: Mutex::new(RangeSet::new()),
            bytes: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            sessions: AtomicU64::new(1),
            abort: Abort::new(),
            failed: Mutex::new(None),
        }
    }

    fn target() -> Target {
        Target {
            gsi: false,
            host: "h".into(),
            port: 21,
            user: "anonymous".into(),
            password: String::new(),
            path: "f".into(),
        }
    }

    #[test]
    fn with_nothing_queued_a_session_takes_the_second_half_of_the_longest_running_range() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let (t, o) = (target(), Options::default());
        let s = shared(&t, &o, &file);
        s.queue.lock().unwrap().push_back((0, MIN_SEGMENT, 0));
        assert_eq!(s.take(), Some((0, MIN_SEGMENT, 0)), "the queue first");
        let long = Arc::new(Running {
            at: AtomicU64::new(2 * MIN_SEGMENT),
            end: AtomicU64::new(10 * MIN_SEGMENT),
        });
        s.running.lock().unwrap().push(long.clone());
        assert_eq!(s.take(), Some((6 * MIN_SEGMENT, 10 * MIN_SEGMENT, 0)));
        // The running range now stops at the middle.
        assert_eq!(long.end.load(Ordering::Acquire), 6 * MIN_SEGMENT);
        // Too little left to split: nothing.
        long.at.store(5 * MIN_SEGMENT, Ordering::Release);
        assert_eq!(s.take(), None);
    }

    #[test]
    fn after_a_failure_or_an_abort_no_range_is_taken_and_the_first_failure_stays() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let (t, o) = (target(), Options::default());
        let s = shared(&t, &o, &file);
        s.queue.lock().unwrap().push_back((0, MIN_SEGMENT, 0));
        s.fail(ClientError::Protocol("first".into()));
        s.fail(ClientError::Protocol("second".into()));
        assert!(s.abort.is_aborted());
        assert_eq!(s.take(), None);
        assert_eq!(
            s.failed().as_ref().map(|e| e.to_string()),
            Some("first".into())
        );
    }

    #[test]
    fn a_partial_without_a_record_holds_its_length_unless_that_is_too_long() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        let part = PartFile::open(&dest, false).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&part.file, &[7u8; 1000], 0).unwrap();
        let record = part.record("f", Some(5000));
        assert_eq!(held(&part, &record, 5000).unwrap().to_string(), "0-1000");
        // A record, where there is one, says what it holds (it may have holes).
        let ranges: RangeSet = [(0u64, 100u64), (500, 600)].into_iter().collect();
        record.save(&Progress::holding(ranges));
        assert_eq!(
            held(&part, &record, 5000).unwrap().to_string(),
            "0-100,500-600"
        );
        record.remove();
        assert!(matches!(
            held(&part, &record, 999),
            Err(ClientError::Integrity(_))
        ));
    }

    #[test]
    fn no_range_is_cut_for_nothing_missing_and_zero_sessions_count_as_one() {
        assert!(plan(&RangeSet::new(), 0).is_empty());
        let whole: RangeSet = [(0u64, 3 * MIN_SEGMENT)].into_iter().collect();
        assert_eq!(plan(&whole, 0), plan(&whole, 1));
        assert_eq!(plan(&whole, 1), [(0, 3 * MIN_SEGMENT)]);
    }
}
