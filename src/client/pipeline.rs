//! Small files in a row on a session's kept MODE E data connections, each moved ahead of its
//! turn, from and to a server that reads pipelined commands in order (braid, the Globus
//! GridFTP server). Downloads: the next files' RETR, end and CKSM go out together; the server
//! queues what comes during a transfer, and on every connection its blocks for a file follow
//! the EOD of the file before. Uploads to braid: each file's checksum, STOR and data go out
//! together (`OPTS STOR Eager=1`); the server reads each file's blocks in turn and drops those
//! of a file it refuses. Uploads to GridFTP: each file's ALLO, STOR and CKSM go out together,
//! its data after its own `125`. A file then costs at most the wait for that `125`, where
//! asking for each in turn costs a round trip or more: on a 20 ms path that is 50 files a
//! second per session, whatever their size.

use super::Options;
use super::control::Control;
use super::error::{ClientError, Result};
use super::job::{PartFile, local_err, part_path};
use super::peer::{Peer, STALL};
use super::summary::Summary;
use super::url::Target;
use super::verify::agree_with;
use crate::engine::receive::{Progress, Shared, receive};
use crate::engine::send::{Source, send};
use crate::engine::sink::Sink;
use crate::engine::transfer::Joins;
use braid_proto::Command;
use braid_proto::checksum;
use braid_proto::client::{Direction, Op, Outcome};
use braid_proto::ranges::RangeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// Larger files go on their own, with the self-tuning, a progress bar and a record to resume
/// from; below this a file takes well under a second on any path worth pipelining.
pub const MAX_SIZE: u64 = 4 << 20;

/// Files a session asks for ahead at first; the flight then grows to what the path holds
/// (`inflight::Flight`: 64 files of 4 KiB are 13 Mbit/s over 20 ms).
pub const AHEAD: usize = super::inflight::START;

/// Files asked for ahead on one session at most: 1,024 files' commands and answers fit in
/// the control connection's buffers (a flight that outgrew them could leave both ends
/// writing), and over 20 ms they carry 4 KiB files at 1.6 Gbit/s.
pub const MOST_AHEAD: usize = 1024;

/// Files stored ahead on a GridFTP server at most: each is an open file until its data goes
/// after its `125` (8 sessions of 32 stay well under the usual limit of 1024). Files
/// announced to braid are open only while they are read.
pub const GRIDFTP_UPLOADS_AHEAD: usize = 32;

/// Whether the session can move files this way: a server that reads pipelined commands in
/// order (braid, the Globus GridFTP server), with data connections kept from the file before,
/// carrying data the same way, and no background mode (whose controller steers each
/// transfer). Uploads to braid go announced ahead ([`announce`]: its server reads a refused
/// file's data and drops it), to GridFTP stored ahead ([`store`]: data after each `125`).
pub fn ready(c: &mut Control, opts: &Options, direction: Direction) -> bool {
    let peer = Peer::of(c);
    c.session().pipelining()
        && c.session().can_reuse(direction)
        && match (direction, peer) {
            (Direction::Upload, Some(Peer::Braid)) => c.session().features().announced_uploads(),
            (_, peer) => peer.is_some(),
        }
        && opts.background.is_none()
}

/// A file requested ahead.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub remote: String,
    pub local: PathBuf,
    /// Exact (from MLSD): a file that changed since is caught by the length and checksum.
    pub size: u64,
}

/// Requests downloads of `files`, behind any already out: for each its RETR, its end and its
/// CKSM (braid's own algorithm from a braid server, ADLER32 or MD5 from a GridFTP server).
pub fn request<'a>(c: &mut Control, files: impl IntoIterator<Item = &'a Wanted>) -> Result<()> {
    let alg = Peer::of(c).unwrap_or(Peer::Braid).checksum(c);
    c.begin_all(files.into_iter().flat_map(|w| {
        [
            Op::StartTransfer(Command::Retr(w.remote.clone())),
            Op::FinishTransfer,
            Op::Checksum {
                alg: alg.into(),
                path: w.remote.clone(),
            },
        ]
    }))
}

/// Why a file requested ahead did not arrive, and whether the session can go on: it cannot
/// once the data connections or the dialogue may be out of step.
#[derive(Debug)]
pub struct Failed {
    pub error: ClientError,
    pub session_broken: bool,
}

impl Failed {
    pub(super) fn file(error: ClientError) -> Failed {
        Failed {
            error,
            session_broken: false,
        }
    }

    pub(super) fn session(error: ClientError) -> Failed {
        Failed {
            error,
            session_broken: true,
        }
    }
}

/// Reads the start of a transfer asked for ahead: on the kept connections, or refused. A
/// refused transfer's end, begun ahead, fails with it, and the refusal is the file's alone.
pub(super) fn started_on_kept(c: &mut Control, what: &str) -> std::result::Result<(), Failed> {
    match c.outcome(Some(what.into())) {
        Ok(Outcome::Started { reused: true }) => Ok(()),
        Ok(o) => Err(Failed::session(ClientError::Protocol(format!(
            "{what}: the server opened new data connections ({o:?}) where it had kept some"
        )))),
        Err(e @ ClientError::Remote { .. }) => match c.outcome(None) {
            Err(_) => Err(Failed::file(e)),
            Ok(_) => Err(Failed::session(e)),
        },
        Err(e) => Err(Failed::session(e)),
    }
}

/// [`started_on_kept`] for a transfer with CKSM asked for behind it: a refused one's CKSM is
/// answered on its own, and read here.
fn started_with_checksum_behind(c: &mut Control, what: &str) -> std::result::Result<(), Failed> {
    started_on_kept(c, what).map_err(|mut f| {
        if !f.session_broken && c.outcome(None).is_err() {
            f.session_broken = true;
        }
        f
    })
}

/// The server's answer to the CKSM asked for behind a transfer.
fn checksum_behind(c: &mut Control) -> std::result::Result<Option<String>, Failed> {
    match c.outcome(None) {
        Ok(Outcome::Checksum(sum)) => Ok(sum),
        Ok(o) => Err(Failed::session(ClientError::Protocol(format!(
            "CKSM: unexpected answer {o:?}"
        )))),
        Err(e) => Err(Failed::session(e)),
    }
}

/// What a file moved ahead reports, as `get` and `put` do for MODE E on kept connections.
pub(super) fn summary(
    op: &'static str,
    server: &Target,
    w: &Wanted,
    local: String,
    started: Instant,
    per_connection_bytes: Vec<u64>,
    checksum: Option<String>,
) -> Summary {
    let target = Target {
        gsi: false,
        path: w.remote.clone(),
        ..server.clone()
    };
    let mut s = super::summary::summary(op, &target, local, w.size, Some(w.size), 0, started);
    s.mode = "extended-block";
    s.streams = per_connection_bytes.len() as u32;
    s.checksum = checksum;
    s.new_data_connections = 0;
    s.per_connection_bytes = per_connection_bytes;
    s
}

/// Receives the oldest file requested ahead: its start, its data (into its partial, renamed
/// once whole and checked), its end and the server's checksum of it. A file the server
/// refuses, or whose checksum differs, fails alone; the answers to it are read either way.
pub fn receive_next(
    c: &mut Control,
    w: &Wanted,
    server: &Target,
) -> std::result::Result<Summary, Failed> {
    let started = Instant::now();
    let peer = Peer::of(c).unwrap_or(Peer::Braid);
    let part = part_path(&w.local);
    // Opened before the start is read: a file that cannot be written still has its data
    // read (and dropped), so the next file's blocks are not taken for its.
    let file = PartFile::open(&w.local, false);
    let retr = format!("RETR {}", w.remote);
    if let Err(f) = started_with_checksum_behind(c, &retr) {
        // Opened empty just above: nothing of it is worth keeping.
        if file.is_ok() {
            let _ = std::fs::remove_file(&part);
        }
        return Err(f);
    }
    let (sink, file) = match file.and_then(|p| {
        let writer = p
            .file
            .try_clone()
            .map_err(local_err("cannot duplicate file handle"))?;
        Ok((writer, p))
    }) {
        Ok((writer, f)) => (Sink::File(writer), Ok(f)),
        Err(e) => (Sink::Discard, Err(e)),
    };
    let shared = Shared::new(
        Progress::holding(RangeSet::new()),
        Arc::new(AtomicU64::new(0)),
    );
    let elastic = c.session().elastic();
    let transfer = super::parallel::transfer(c, Direction::Download, elastic);
    let joins = Joins::cached(c.take_data_connections(), STALL).protected(c.data_tls());
    let kept = receive(&transfer, joins, &sink, Some(w.size), &shared).map_err(|e| {
        let _ = std::fs::remove_file(&part);
        Failed::session(ClientError::Interrupted {
            bytes: shared.snapshot().ranges.len(),
            why: format!("data connection: {e}"),
            partial: None,
        })
    })?;
    c.keep_data_connections(Direction::Download, kept.socks);
    let end = c.outcome(Some(retr));
    let theirs = checksum_behind(c)?;
    let alg = peer.checksum(c);
    let checked = (|| {
        end?;
        let file = file?;
        let got = shared.snapshot();
        let missing = got.ranges.missing(w.size);
        if !missing.is_empty() {
            return Err(ClientError::Integrity(format!(
                "the server ended the transfer but bytes {missing} of {} never arrived",
                w.size
            )));
        }
        // braid's sum is taken as the blocks arrive; a GridFTP server's only reads back a
        // file of at most MAX_SIZE, in the page cache.
        let ours = match peer {
            Peer::Braid => got
                .sum
                .map(|s| checksum::hex(s.finish(w.size)))
                .ok_or_else(|| ClientError::Protocol("blocks off the checksum chunks".into()))?,
            Peer::GridFtp => crate::sums::named(alg, &file.file, 0, w.size)
                .map_err(local_err("cannot read the download back to check it"))?,
        };
        let ours_are = "the data received hashes to";
        let checksum = agree_with(theirs, alg, &w.remote, &ours, ours_are, "")?;
        let local = file.commit(Some(w.size))?;
        Ok((local, checksum))
    })();
    let (local, checksum) = checked.map_err(|e| {
        let _ = std::fs::remove_file(&part);
        Failed::file(e)
    })?;
    let per_conn = transfer.per_link_bytes();
    Ok(summary(
        "get", server, w, local, started, per_conn, checksum,
    ))
}

/// A file to upload ahead: read once it is its turn to go.
pub struct Outgoing {
    wanted: Wanted,
    /// Open from the start for GridFTP, which takes the data after its `125`; for braid,
    /// opened only to be read whole, so that a long flight holds no file open.
    file: Option<std::fs::File>,
    read: Read,
    /// Once its data went: the bytes on each connection.
    sent: Vec<u64>,
    started: Instant,
}

impl Outgoing {
    /// Opened now (for [`store`]): a file that cannot be read fails before it is asked for.
    pub fn open(wanted: Wanted) -> Result<Outgoing> {
        let shown = wanted.local.display().to_string();
        let file = std::fs::File::open(&wanted.local)
            .map_err(local_err(format!("cannot read {shown}")))?;
        Ok(Outgoing {
            file: Some(file),
            ..Outgoing::to_read(wanted)
        })
    }

    /// Opened when it is read (for [`announce`]), which is when it fails if it cannot be.
    pub fn to_read(wanted: Wanted) -> Outgoing {
        Outgoing {
            wanted,
            file: None,
            read: Read::Pending,
            sent: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Reads the whole file into `into`, which is its size, and keeps its checksum (or
    /// why it could not be read); the file is closed after.
    fn read(&mut self, into: &mut [u8]) {
        use std::os::unix::fs::FileExt;
        let read = match self.file.take() {
            Some(file) => Ok(file),
            None => std::fs::File::open(&self.wanted.local),
        }
        .and_then(|file| file.read_exact_at(into, 0));
        let shown = self.wanted.local.display();
        self.read = match read {
            Ok(()) => Read::Sum(checksum::hex(checksum::of(into))),
            Err(cause) => Read::Failed(ClientError::Local {
                what: match cause.kind() {
                    std::io::ErrorKind::UnexpectedEof => {
                        format!("cannot read {shown} (did it shrink since the walk?)")
                    }
                    _ => format!("cannot read {shown}"),
                },
                cause,
            }),
        };
    }

    /// What its upload reports once the server took it.
    fn report(self, server: &Target, checksum: Option<String>) -> Summary {
        let local = String::new();
        summary(
            "put",
            server,
            &self.wanted,
            local,
            self.started,
            self.sent,
            checksum,
        )
    }

    /// Its checksum, once it was read whole.
    fn sum(&self) -> Option<&str> {
        match &self.read {
            Read::Sum(sum) => Some(sum),
            _ => None,
        }
    }
}

/// What reading a file ahead gave.
enum Read {
    Pending,
    /// Read whole: its checksum goes out with its STOR.
    Sum(String),
    /// Unreadable: nothing went out for it.
    Failed(ClientError),
}

/// Files read at once before their commands go out: a few files' commands per write, and
/// a session's memory for uploads ahead bounded by this (files are at most [`MAX_SIZE`]).
const READ_AT_ONCE: u64 = MAX_SIZE;

/// Announces uploads of `files`, behind any already out, and sends their data, a few files
/// at a time: they are read into `buf` and hashed (each file is read once), then for each
/// its checksum (SCKS), its STOR and its end go out together, then their blocks on the kept
/// connections, without waiting for any answer. The server reads the data of each file in
/// turn, and reads and drops that of a file it refuses (`OPTS STOR Eager=1`), so the
/// connections stay in step. A file that cannot be read fails alone, before anything goes
/// out for it. Any other error here leaves the session out of step: it must go.
pub fn announce(c: &mut Control, files: &mut [&mut Outgoing], buf: &mut Vec<u8>) -> Result<()> {
    c.later(Op::Eager(true), None)?;
    let mut rest = files;
    while !rest.is_empty() {
        let mut n = 0;
        let mut bytes = 0;
        while let Some(o) = rest.get(n)
            && (n == 0 || bytes + o.wanted.size <= READ_AT_ONCE)
        {
            bytes += o.wanted.size;
            n += 1;
        }
        let (group, later) = std::mem::take(&mut rest).split_at_mut(n);
        rest = later;
        // At most READ_AT_ONCE, or one file of at most MAX_SIZE.
        let len = bytes as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        // Each file at its place in the buffer, one after the other.
        let places = group.iter().scan(0, |at, o| {
            let start = *at;
            *at += o.wanted.size as usize;
            Some(start..*at)
        });
        let places: Vec<_> = places.collect();
        for (o, place) in group.iter_mut().zip(&places) {
            o.read(&mut buf[place.clone()]);
        }
        c.begin_all(
            group
                .iter()
                .filter_map(|o| o.sum().map(|sum| (o, sum)))
                .flat_map(|(o, sum)| {
                    [
                        Op::Simple {
                            cmd: Command::Scks {
                                alg: checksum::NAME.into(),
                                value: Some(sum.to_string()),
                            },
                            ok: vec![200],
                        },
                        Op::StartTransfer(Command::Stor(o.wanted.remote.clone())),
                        Op::FinishTransfer,
                    ]
                }),
        )?;
        for (o, place) in group.iter_mut().zip(places) {
            if o.sum().is_none() {
                continue;
            }
            o.sent = send_on_kept(c, Source::Memory(&buf[place]))?;
        }
    }
    Ok(())
}

/// Sends one whole file on the session's kept data connections, keeping them open for the
/// next (EOD without CLOSE); the bytes each carried.
fn send_on_kept(c: &mut Control, source: Source) -> Result<Vec<u64>> {
    let mut todo = RangeSet::new();
    todo.insert(0, source.size());
    let elastic = c.session().elastic();
    let transfer = super::parallel::transfer(c, Direction::Upload, elastic);
    let joins = Joins::cached(c.take_data_connections(), STALL).protected(c.data_tls());
    let options = crate::engine::send::Options {
        block: crate::engine::DEFAULT_BLOCK,
        hash: false,
        keep: true,
    };
    let progress = AtomicU64::new(0);
    let sent = send(&transfer, source, &todo, joins, options, &progress).map_err(|e| {
        ClientError::Interrupted {
            bytes: progress.load(std::sync::atomic::Ordering::Relaxed),
            why: format!("data connection: {e}"),
            partial: None,
        }
    })?;
    c.keep_data_connections(Direction::Upload, sent.kept);
    Ok(sent.per_conn)
}

/// Asks a GridFTP server to store `files`, behind any already asked for: for each its ALLO,
/// its STOR and CKSM behind it, all at once. Their data waits for each STOR's `125`
/// ([`stored_next`]): that server would take a refused file's bytes for the next file's.
pub fn store(c: &mut Control, files: &[&Outgoing]) -> Result<()> {
    let alg = Peer::GridFtp.checksum(c);
    c.begin_all(files.iter().flat_map(|o| {
        [
            Op::Simple {
                cmd: Command::Allo(o.wanted.size.to_string()),
                ok: vec![200, 202],
            },
            Op::StartTransfer(Command::Stor(o.wanted.remote.clone())),
            Op::FinishTransfer,
            Op::Checksum {
                alg: alg.into(),
                path: o.wanted.remote.clone(),
            },
        ]
    }))
}

/// The oldest file [`store`] asked for: its ALLO's answer, its STOR's `125`, then its data on
/// the kept connections, the server's 226 and its checksum of what it stored, checked against the
/// file's. A file the server refuses fails alone; the answers to it are read either way.
pub fn stored_next(
    c: &mut Control,
    mut o: Outgoing,
    server: &Target,
) -> std::result::Result<Summary, Failed> {
    if let Err(e) = c.outcome(Some(format!("ALLO {}", o.wanted.size))) {
        return Err(Failed::session(e));
    }
    let stor = format!("STOR {}", o.wanted.remote);
    started_with_checksum_behind(c, &stor)?;
    let Some(file) = o.file.take() else {
        let e = ClientError::Protocol("a file stored ahead unopened (a bug in braid)".into());
        return Err(Failed::session(e));
    };
    let source = Source::File {
        file: &file,
        size: o.wanted.size,
    };
    o.sent = send_on_kept(c, source).map_err(Failed::session)?;
    let end = c.outcome(Some(stor));
    let theirs = checksum_behind(c)?;
    let alg = Peer::GridFtp.checksum(c);
    let checked = (|| {
        end?;
        let ours = crate::sums::named(alg, &file, 0, o.wanted.size)
            .map_err(local_err("cannot read the file back to check it"))?;
        agree_with(
            theirs,
            alg,
            &o.wanted.remote,
            &ours,
            "the file sent hashes to",
            "",
        )
    })();
    let checksum = checked.map_err(Failed::file)?;
    Ok(o.report(server, checksum))
}

/// The server's answers for the oldest file announced ahead: its STOR's, then its verdict
/// (226 once the data arrived whole, the checksum matched and the file took its name). A file
/// the server refuses fails alone.
pub fn send_next(
    c: &mut Control,
    mut o: Outgoing,
    server: &Target,
) -> std::result::Result<Summary, Failed> {
    // Nothing went out for a file not read whole: the session has no answer to read.
    let sum = match std::mem::replace(&mut o.read, Read::Pending) {
        Read::Sum(sum) => sum,
        Read::Failed(e) => return Err(Failed::file(e)),
        Read::Pending => {
            let e = ClientError::Protocol("a file never announced (a bug in braid)".into());
            return Err(Failed::file(e));
        }
    };
    let stor = format!("STOR {}", o.wanted.remote);
    if let Err(e) = c.outcome(Some("SCKS".into())) {
        return Err(Failed::session(e));
    }
    started_on_kept(c, &stor)?;
    c.outcome(Some(stor)).map_err(Failed::file)?;
    let checksum = Some(format!("{} {sum}", checksum::NAME));
    Ok(o.report(server, checksum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_read_ahead_carries_its_checksum_and_one_that_shrank_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("f");
        std::fs::write(&local, b"hello world").unwrap();
        let wanted = |size| Wanted {
            remote: "f".into(),
            local: local.clone(),
            size,
        };
        let mut o = Outgoing::open(wanted(11)).unwrap();
        assert_eq!(o.sum(), None, "not read yet");
        let mut buf = vec![0u8; 11];
        o.read(&mut buf);
        assert_eq!(
            o.sum(),
            Some(checksum::hex(checksum::of(b"hello world")).as_str())
        );
        assert!(o.file.is_none(), "closed once read");
        // Listed at 20 bytes, it has 11 now: its upload fails with a reason, nothing goes out.
        let mut o = Outgoing::to_read(wanted(20));
        let mut buf = vec![0u8; 20];
        o.read(&mut buf);
        assert_eq!(o.sum(), None);
        assert!(matches!(&o.read, Read::Failed(e) if e.to_string().contains("shrink")));
        let gone = Wanted {
            local: dir.path().join("none"),
            ..wanted(1)
        };
        assert!(Outgoing::open(gone.clone()).is_err());
        // Opened only when read: a file gone by then fails then, alone.
        let mut o = Outgoing::to_read(gone);
        o.read(&mut [0u8; 1]);
        assert!(matches!(&o.read, Read::Failed(e) if e.to_string().contains("cannot read")));
    }

    #[test]
    fn a_session_that_does_not_pipeline_moves_files_one_at_a_time() {
        use super::super::testing::{done, scripted};
        let (mut c, server) = scripted(b"");
        for direction in [Direction::Download, Direction::Upload] {
            assert!(!ready(&mut c, &Options::default(), direction));
        }
        assert_eq!(done(c, server), "", "deciding costs no command");
    }
}
