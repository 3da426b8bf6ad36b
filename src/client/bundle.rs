//! A tree's small files fetched as bundles from a braid server (FEAT `BRAID-BUNDLE`, see
//! [`braid_proto::bundle`]): `BNDL` names a run of files with their listed sizes, `RBND`
//! sends them end to end as one MODE E transfer on the session's kept connections, and its
//! 226 names the checksum of the whole. The files are written as their blocks arrive, into
//! partials that take their names only once everything arrived and checked. Anything that
//! goes wrong before that (a file refused or changed since it was listed, a checksum that
//! differs) leaves no partial behind, and the files go again one by one, each with its own
//! answer; a bundle only ever saves work.

use super::Options;
use super::control::Control;
use super::error::ClientError;
use super::job::{local_err, part_path};
use super::parallel::{block_mode, open_and_start};
use super::peer::{Peer, STALL, offers_elastic};
use super::pipeline::{Failed, Wanted, started_on_kept, summary};
use super::plan::{PathHint, Plan};
use super::summary::Summary;
use super::url::Target;
use super::verify::agree_with;
use crate::engine::bundle::Writer;
use crate::engine::receive::{Progress, Shared};
use crate::engine::sink::Sink;
use crate::engine::transfer::{Joins, Transfer};
use braid_proto::Command;
use braid_proto::bundle::{Layout, Named, runs, sum_in};
use braid_proto::checksum;
use braid_proto::client::{Direction, Op, Outcome};
use braid_proto::ranges::RangeSet;
use braid_proto::retr_opts::RetrOpts;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// Files in one bundle at most: enough that its set-up (a round trip or two) is nothing
/// against its data, few enough that the sessions of a tree share its files.
pub const MOST_FILES: usize = 4096;

/// Bytes in a session's first bundle; later ones carry what the path moved in
/// [`BUNDLE_TIME`], between these bounds.
pub const FIRST_BYTES: u64 = 4 << 20;
pub const LEAST_BYTES: u64 = 256 << 10;
pub const MOST_BYTES: u64 = 256 << 20;

/// What a bundle's data should take: its files land only once it is whole, so on a slow path
/// a bundle sized for a fast one would show nothing for minutes (and Ctrl-C would lose it).
pub const BUNDLE_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// The bytes of the next bundle, from what the last one moved and took.
pub fn next_bytes(moved: u64, took: std::time::Duration) -> u64 {
    let rate = moved as f64 / took.as_secs_f64().max(1e-3);
    ((rate * BUNDLE_TIME.as_secs_f64()) as u64).clamp(LEAST_BYTES, MOST_BYTES)
}

/// The largest file a bundle takes: a larger one costs little more alone (its own RETR and
/// CKSM against a data phase of its own), and keeps a record to resume from if stopped.
pub const LARGEST_FILE: u64 = 1 << 20;

/// Longest `BNDL` argument: the command line's limit, less the verb and CRLF.
const LINE: usize = braid_proto::MAX_LINE - 16;

/// Runs a bundle's data phase; Ctrl-C stops it part-way (on a slow path one takes seconds):
/// its connections are shut, so the sending or receiving ends at once.
pub(super) fn until_stopped<R>(
    transfer: &Transfer,
    stop: &(dyn Fn() -> bool + Sync),
    data: impl FnOnce() -> R,
) -> R {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if stop() {
                    transfer.abort().abort();
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        let r = data();
        done.store(true, std::sync::atomic::Ordering::Release);
        r
    })
}

/// Reads the answers to a bundle's `lines` BNDL lines (and whatever else was asked with
/// them). A refused BNDL empties the bundle, so the RBND or SBND behind it is refused too:
/// the first refusal is the bundle's error, for the caller to give once that is read. Err:
/// the session broke.
pub(super) fn named(
    c: &mut Control,
    lines: usize,
) -> std::result::Result<Option<ClientError>, Failed> {
    let mut refused = None;
    for _ in 0..lines {
        match c.outcome(Some("BNDL".into())) {
            Ok(_) => {}
            Err(e @ ClientError::Remote { .. }) => refused = refused.or(Some(e)),
            Err(e) => return Err(Failed::session(e)),
        }
    }
    Ok(refused)
}

/// The BNDL lines that name `files`, each as long as a command line may be.
pub(super) fn lines(files: &[Named]) -> Vec<Op> {
    runs(files, LINE)
        .into_iter()
        .map(|run| Op::Simple {
            cmd: Command::Bundle(run.to_vec()),
            ok: vec![200],
        })
        .collect()
}

/// Whether this session can fetch bundles: a braid server that offers them and reads
/// pipelined commands, outside background mode (whose controller steers each transfer).
pub fn offered(c: &mut Control, opts: &Options) -> bool {
    c.session().features().bundles()
        && c.session().pipelining()
        && Peer::of(c) == Some(Peer::Braid)
        && opts.background.is_none()
}

/// A bundle asked for: how many BNDL lines named it, and whether its RBND went with them
/// (on the data connections the transfer before it will leave open) or is still to go, on
/// new ones ([`start`]).
pub struct Asked {
    lines: usize,
    rbnd: bool,
}

impl Asked {
    /// Its RBND is still to go, on data connections it opens: no bundle may be named behind
    /// it before that, or its BNDL lines would join this one.
    pub fn opens_connections(&self) -> bool {
        !self.rbnd
    }
}

/// Asks for `files` as one bundle, behind whatever was asked for before: their BNDL lines
/// and, where the session has data connections to carry it (or will have, once the transfer
/// ahead of it ends), RBND and its end.
pub fn request(c: &mut Control, files: &[Wanted], rbnd: bool) -> super::error::Result<Asked> {
    let named: Vec<Named> = files
        .iter()
        .map(|w| Named {
            size: w.size,
            path: w.remote.clone(),
            mtime: None,
        })
        .collect();
    let mut ops = lines(&named);
    let lines = ops.len();
    if rbnd {
        ops.push(Op::StartTransfer(Command::RetrBundle));
        ops.push(Op::FinishTransfer);
    }
    c.begin_all(ops)?;
    Ok(Asked { lines, rbnd })
}

/// Asks for the MODE E settings of a session's bundles this way from here on (and of the
/// listing ahead of downloads) and for the address of their data connections, without
/// reading the answers: as many connections as a file of `bytes` starts with (`-n`
/// honoured); a download's sender, the server, is told `--rate-limit` and `--congestion`
/// too. The plan, and whether the transfers are elastic.
pub(super) fn settings(
    c: &mut Control,
    opts: &Options,
    direction: Direction,
    bytes: u64,
) -> super::error::Result<(Plan, bool)> {
    let hint = || PathHint::of(c, direction, opts.buffer);
    let plan = Plan::new(opts, Peer::Braid, offers_elastic(c), Some(bytes), hint);
    let retr = match direction {
        Direction::Download => RetrOpts {
            parallelism: Some((plan.start, plan.start.min(1), plan.max)),
            block_size: Some(plan.block),
            max_rate: opts.rate_limit,
            congestion: opts.congestion,
            ..RetrOpts::default()
        },
        Direction::Upload => RetrOpts::default(),
    };
    let elastic = block_mode(c, direction, retr, opts)?;
    c.passive_ahead()?;
    Ok((plan, elastic))
}

/// A bundle under way: its data connections and the transfer they make up.
pub struct Started {
    joins: Joins,
    transfer: Transfer,
    pub at: Instant,
}

/// Starts the oldest bundle asked for: on the data connections kept from the transfer before,
/// or (the session's first) on new ones, as many as a file of the bundle's size would start
/// with. A refused bundle is the files' failure, not the session's.
pub fn start(
    c: &mut Control,
    asked: Asked,
    bytes: u64,
    opts: &Options,
) -> std::result::Result<Started, Failed> {
    let at = Instant::now();
    if asked.rbnd {
        let refused = named(c, asked.lines)?;
        started_on_kept(c, "RBND").map_err(|f| match refused {
            Some(e) if !f.session_broken => Failed::file(e),
            _ => f,
        })?;
        let elastic = c.session().elastic();
        let transfer = super::parallel::transfer(c, Direction::Download, elastic);
        let joins = Joins::cached(c.take_data_connections(), STALL).protected(c.data_tls());
        return Ok(Started {
            joins,
            transfer,
            at,
        });
    }
    // The session's first: its data connections' settings and address are asked for before
    // the BNDL lines' answers are read, so that all come back in one round trip.
    let settings = settings(c, opts, Direction::Download, bytes);
    let refused = named(c, asked.lines)?;
    let (plan, elastic) = settings.map_err(Failed::session)?;
    if let Some(e) = refused {
        c.settle_passive_ahead().map_err(Failed::session)?;
        return Err(Failed::file(e));
    }
    let fresh = |c: &mut Control| -> super::error::Result<Started> {
        let addr = c.passive_addr()?;
        let transfer = super::parallel::transfer(c, Direction::Download, elastic);
        let cmd = Command::RetrBundle;
        let socks = open_and_start(c, &cmd, &addr, plan.start, opts.buffer, elastic)?;
        // Its end is asked for now, ahead of the next bundle's lines.
        c.begin_all([Op::FinishTransfer])?;
        let joins = Joins::fixed(socks, STALL).protected(c.data_tls());
        Ok(Started {
            joins,
            transfer,
            at,
        })
    };
    fresh(c).map_err(|e| match e {
        e @ ClientError::Remote { .. } if c.in_step() => Failed::file(e),
        e => Failed::session(e),
    })
}

/// A bundle's data, all received; its end still to be read on the control connection
/// ([`conclude`]).
pub struct Received {
    files: Vec<Wanted>,
    parts: Vec<std::path::PathBuf>,
    sink: Sink,
    shared: Shared,
    total: u64,
    kept: Vec<crate::engine::tls::DataConn>,
    per_conn: Vec<u64>,
    at: Instant,
}

impl Received {
    /// Removes what it wrote (its end is not to be read: the session broke).
    pub fn discard(self) {
        discard(&self.sink);
    }
}

/// Receives a started bundle's data into its files' partials. It needs no control
/// connection, so that the session asks for the next bundle meanwhile. Err: nothing of it is
/// kept, and the session is broken.
pub fn receive(
    files: Vec<Wanted>,
    started: Started,
    stop: &(dyn Fn() -> bool + Sync),
) -> std::result::Result<Received, Failed> {
    let Started {
        joins,
        transfer,
        at,
    } = started;
    let layout = Layout::new(files.iter().map(|w| w.size));
    let total = layout.total();
    let parts: Vec<_> = files.iter().map(|w| part_path(&w.local)).collect();
    let sink = Sink::Bundle(Writer::new(layout, parts.clone()));
    let shared = Shared::new(
        Progress::holding(RangeSet::new()),
        Arc::new(AtomicU64::new(0)),
    );
    let received = until_stopped(&transfer, stop, || {
        crate::engine::receive::receive(&transfer, joins, &sink, Some(total), &shared)
    });
    match received {
        Ok(kept) => Ok(Received {
            files,
            parts,
            sink,
            shared,
            total,
            kept: kept.socks,
            per_conn: transfer.per_link_bytes(),
            at,
        }),
        Err(e) => {
            discard(&sink);
            Err(Failed::session(ClientError::Interrupted {
                bytes: shared.snapshot().ranges.len(),
                why: format!("data connection: {e}"),
                partial: None,
            }))
        }
    }
}

/// Reads a received bundle's end and checks it whole. Err: nothing of it is kept;
/// `session_broken` says whether the session may go on.
pub fn conclude(
    c: &mut Control,
    received: Received,
    server: &Target,
) -> std::result::Result<Arrived, Failed> {
    let Received {
        files,
        parts,
        sink,
        shared,
        total,
        kept,
        per_conn,
        at,
    } = received;
    c.keep_data_connections(Direction::Download, kept);
    let checked = c
        .outcome(Some("RBND".into()))
        .and_then(|end| check(end, &shared, total));
    match checked {
        Ok(sum) => {
            tracing::debug!(files = files.len(), bytes = total, checksum = ?sum, "bundle arrived");
            Ok(Arrived {
                files,
                parts,
                sink,
                per_conn,
                at,
                server: server.clone(),
            })
        }
        Err(e) => {
            discard(&sink);
            Err(Failed::file(e))
        }
    }
}

/// A bundle that arrived whole and checked, its files still under their partial names.
pub struct Arrived {
    files: Vec<Wanted>,
    parts: Vec<std::path::PathBuf>,
    sink: Sink,
    per_conn: Vec<u64>,
    at: Instant,
    server: Target,
}

impl Arrived {
    /// Names every file (off the session's thread, so that the next bundle's data is read
    /// meanwhile), and what each reports. Err: none of them is kept.
    pub fn commit(self) -> super::error::Result<Vec<Summary>> {
        if let Err(e) = commit(&self.files, &self.parts) {
            discard(&self.sink);
            return Err(e);
        }
        let n = self.files.len() as u32;
        Ok(self
            .files
            .iter()
            .map(|w| {
                let local = w.local.display().to_string();
                let per_conn = self.per_conn.clone();
                let mut s = summary("get", &self.server, w, local, self.at, per_conn, None);
                s.bundle = Some(n);
                s
            })
            .collect())
    }
}

/// Removes what a bundle that failed wrote.
fn discard(sink: &Sink) {
    if let Sink::Bundle(w) = sink {
        for p in w.created() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The bundle's end: every byte arrived and hashes to what the server's 226 names.
fn check(end: Outcome, shared: &Shared, total: u64) -> super::error::Result<Option<String>> {
    let theirs = match end {
        Outcome::Done(reply) => sum_in(&reply.text()),
        o => {
            return Err(ClientError::Protocol(format!(
                "RBND: unexpected answer {o:?}"
            )));
        }
    };
    let got = shared.snapshot();
    let missing = got.ranges.missing(total);
    if !missing.is_empty() {
        return Err(ClientError::Integrity(format!(
            "the server ended the bundle but bytes {missing} of {total} never arrived"
        )));
    }
    let ours = got
        .sum
        .map(|s| checksum::hex(s.finish(total)))
        .ok_or_else(|| ClientError::Protocol("bundle blocks off the checksum chunks".into()))?;
    if theirs.is_none() {
        return Err(ClientError::Protocol(
            "the server's end of the bundle names no checksum".into(),
        ));
    }
    agree_with(
        theirs,
        checksum::NAME,
        "the bundle",
        &ours,
        "the data received hashes to",
        "",
    )
}

/// Gives every file of a checked bundle its name: the data reaches the disk first (one
/// `syncfs` for them all, where a file alone is synced before its rename), then the renames.
fn commit(files: &[Wanted], parts: &[std::path::PathBuf]) -> super::error::Result<()> {
    for (w, part) in files.iter().zip(parts) {
        if w.size == 0 {
            std::fs::File::create(part)
                .map_err(local_err(format!("cannot create {}", part.display())))?;
        }
    }
    if let Some(dir) = parts.first().and_then(|p| p.parent()) {
        let dir = if dir.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            dir
        };
        std::fs::File::open(dir)
            .and_then(|d| rustix::fs::syncfs(&d).map_err(std::io::Error::from))
            .map_err(local_err(format!(
                "cannot flush the files in {}",
                dir.display()
            )))?;
    }
    for (w, part) in files.iter().zip(parts) {
        std::fs::rename(part, &w.local).map_err(local_err(format!(
            "cannot rename {} to {}",
            part.display(),
            w.local.display()
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bundle_carries_what_the_path_moves_in_two_seconds_within_bounds() {
        // 1 Gbit/s: as much as the limit allows; a T1: a few hundred kB; a stall: the least.
        assert_eq!(next_bytes(200 << 20, Duration::from_secs(1)), MOST_BYTES);
        let t1 = next_bytes(190_000, Duration::from_secs(1));
        assert!((370_000..=390_000).contains(&t1), "{t1}");
        assert_eq!(next_bytes(1000, Duration::from_secs(30)), LEAST_BYTES);
        assert_eq!(next_bytes(1000, Duration::ZERO), 2_000_000);
    }
}
