//! A tree's small files stored as bundles on a braid server (`BRAID-BUNDLE 2`, see
//! [`braid_proto::bundle`]): `BNDL` names a run of files with their sizes and times, `SCKS
//! XXH3 *` says the checksum of the whole follows, and `SBND` takes them end to end as one
//! MODE E upload on the session's kept connections. The server writes each into a partial
//! and names them all (with their times: no MFMT each) only once every byte arrived and the
//! checksum agrees; anything else leaves none of them, and the files go again one by one.

use super::Options;
use super::control::Control;
use super::error::ClientError;
use super::parallel::{open_and_start, transfer_failed};
use super::peer::STALL;
use super::pipeline::{Failed, Wanted, summary};
use super::summary::Summary;
use super::url::Target;
use crate::engine::bundle::Files;
use crate::engine::send::{Options as SendOptions, Source};
use crate::engine::transfer::Joins;
use braid_proto::Command;
use braid_proto::bundle::{Layout, Named};
use braid_proto::checksum;
use braid_proto::client::{Direction, Op};
use braid_proto::ranges::RangeSet;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Whether this session can store bundles: where it could fetch them, a server that also
/// stores them, and an upload that braid need not pace itself (`--rate-limit` steers each
/// file's sending).
pub fn offered(c: &mut Control, opts: &Options) -> bool {
    super::bundle::offered(c, opts)
        && c.session().features().stores_bundles()
        && opts.rate_limit.is_none()
}

/// A file to store in a bundle: where it is and goes, its size when the tree was walked, and
/// the time the server gives it.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub wanted: Wanted,
    pub mtime: Option<i64>,
}

/// A bundle whose data went, the server's answers to it still to be read ([`answers`]).
pub struct Sent {
    files: Vec<Outgoing>,
    /// Answers to read before the data's end: BNDL lines and `SCKS *`, then SBND's start,
    /// when all went in one write ahead of the data.
    unread: Option<usize>,
    sum: String,
    per_conn: Vec<u64>,
    at: Instant,
}

/// Sends `files` as one bundle: on the data connections the session's last upload left open,
/// its commands and its data at once (`OPTS STOR Eager=1`: a bundle refused is read and
/// dropped by the server), or (the session's first) on new ones once the server has
/// answered. Its checksum follows the data; the answers are read by [`answers`], after the
/// next bundle has gone too. Err: the bundle failed; `session_broken` says whether the
/// session may go on.
pub fn send(
    c: &mut Control,
    files: Vec<Outgoing>,
    opts: &Options,
    stop: &(dyn Fn() -> bool + Sync),
) -> std::result::Result<Sent, Failed> {
    let at = Instant::now();
    let layout = Layout::new(files.iter().map(|f| f.wanted.size));
    let total = layout.total();
    let (joins, elastic, unread) = start(c, &files, total, opts)?;
    let transfer = super::parallel::transfer(c, Direction::Upload, elastic);
    // A file read at a size other than the walk's would be stored cut short or with a tail
    // missing, under a checksum that agrees: it fails the bundle instead.
    let open = |i: usize| -> std::io::Result<File> {
        let w = &files[i].wanted;
        let f = File::open(&w.local)?;
        let len = f.metadata()?.len();
        if len != w.size {
            return Err(std::io::Error::other(format!(
                "{} changed while being sent ({len} bytes, not {})",
                w.local.display(),
                w.size
            )));
        }
        Ok(f)
    };
    let source = Files {
        layout: &layout,
        open: &open,
    };
    let todo: RangeSet = [(0, total)].into_iter().filter(|(_, e)| *e > 0).collect();
    let options = SendOptions {
        block: crate::engine::DEFAULT_BLOCK,
        hash: true,
        keep: true,
    };
    let progress = AtomicU64::new(0);
    let sent = super::bundle::until_stopped(&transfer, stop, || {
        let source = Source::Bundle(&source);
        crate::engine::send::send(&transfer, source, &todo, joins, options, &progress)
    });
    let sent = sent.map_err(|e| {
        Failed::session(ClientError::Interrupted {
            bytes: progress.load(Ordering::Relaxed),
            why: format!("sending a bundle of {} files: {e}", files.len()),
            partial: None,
        })
    })?;
    let sum = sent
        .sum
        .map(|s| checksum::hex(s.finish(total)))
        .ok_or_else(|| {
            Failed::session(ClientError::Protocol(
                "a bundle's blocks were not hashed as they went".into(),
            ))
        })?;
    let scks = Command::Scks {
        alg: checksum::NAME.into(),
        value: Some(sum.clone()),
    };
    c.send(&scks).map_err(Failed::session)?;
    c.keep_data_connections(Direction::Upload, sent.kept);
    Ok(Sent {
        files,
        unread,
        sum,
        per_conn: sent.per_conn,
        at,
    })
}

/// Reads the server's answers to a bundle sent: its start (if not read before the data),
/// then, once it has checked the checksum and named every file, its end. Each file's summary.
pub fn answers(
    c: &mut Control,
    sent: Sent,
    server: &Target,
    stop: &(dyn Fn() -> bool + Sync),
) -> std::result::Result<Vec<Summary>, Failed> {
    let Sent {
        files,
        unread,
        sum,
        per_conn,
        at,
    } = sent;
    if let Some(lines) = unread {
        started(c, lines, true)?;
    }
    conclude(c, stop)?;
    tracing::debug!(files = files.len(), checksum = %sum, "bundle stored");
    let n = files.len() as u32;
    Ok(files
        .iter()
        .map(|f| {
            let local = f.wanted.local.display().to_string();
            let verified = Some(format!("{} {sum}", checksum::NAME));
            let per_conn = per_conn.clone();
            let mut s = summary("put", server, &f.wanted, local, at, per_conn, verified);
            s.bundle = Some(n);
            s
        })
        .collect())
}

/// Reads the answers to a bundle's `lines` BNDL lines and `SCKS *` and, with `sbnd`, to its
/// SBND on the kept connections ([`super::bundle::named`]).
fn started(c: &mut Control, lines: usize, sbnd: bool) -> std::result::Result<(), Failed> {
    let refused = super::bundle::named(c, lines)?;
    if sbnd {
        return match c.transfer_started(&Command::StorBundle) {
            Ok(true) => refused.map_or(Ok(()), |e| Err(Failed::session(e))),
            Ok(false) => Err(Failed::session(ClientError::Protocol(
                "SBND: the server opened new data connections where it had kept some".into(),
            ))),
            Err(e @ ClientError::Remote { .. }) => Err(Failed::file(refused.unwrap_or(e))),
            Err(e) => Err(Failed::session(e)),
        };
    }
    refused.map_or(Ok(()), |e| Err(Failed::file(e)))
}

/// Names the files (BNDL, with their sizes and times), says their checksum follows and starts
/// SBND: on the connections the session's last upload left open, all in one write with the
/// answers left to read, or (the session's first) on new ones, as many as a file of the
/// bundle's size would start with. The data connections, whether they are elastic, and how
/// many answers before SBND's are still to read (None: all were).
fn start(
    c: &mut Control,
    files: &[Outgoing],
    total: u64,
    opts: &Options,
) -> std::result::Result<(Joins, bool, Option<usize>), Failed> {
    let mut ops = commands(files);
    let lines = ops.len();
    let cmd = Command::StorBundle;
    let session = |e: ClientError| Failed::session(e);
    if c.session().can_reuse(Direction::Upload) {
        c.later(Op::Eager(true), None).map_err(session)?;
        ops.push(Op::StartTransfer(cmd));
        c.begin_all(ops).map_err(session)?;
        c.reset_stored(RangeSet::new());
        let elastic = c.session().elastic();
        let socks = c.take_data_connections();
        let joins = Joins::cached(socks, STALL).protected(c.data_tls());
        return Ok((joins, elastic, Some(lines)));
    }
    c.begin_all(ops).map_err(session)?;
    // The data connections' settings and address go with the lines: one round trip for all.
    let (plan, elastic) =
        super::bundle::settings(c, opts, Direction::Upload, total).map_err(session)?;
    if let Err(f) = started(c, lines, false) {
        if !f.session_broken {
            c.settle_passive_ahead().map_err(session)?;
        }
        return Err(f);
    }
    let fresh = |c: &mut Control| -> super::error::Result<(Joins, bool, Option<usize>)> {
        let addr = c.passive_addr()?;
        c.reset_stored(RangeSet::new());
        let socks = open_and_start(c, &cmd, &addr, plan.start, opts.buffer, elastic)?;
        let joins = Joins::fixed(socks, STALL).protected(c.data_tls());
        Ok((joins, elastic, None))
    };
    fresh(c).map_err(|e| match e {
        e @ ClientError::Remote { .. } if c.in_step() => Failed::file(e),
        e => Failed::session(e),
    })
}

/// A bundle's commands before SBND: its BNDL lines (each file with its size and time), and
/// `SCKS XXH3 *` (its checksum follows its data).
fn commands(files: &[Outgoing]) -> Vec<Op> {
    let named: Vec<Named> = files
        .iter()
        .map(|f| Named {
            size: f.wanted.size,
            path: f.wanted.remote.clone(),
            mtime: f.mtime,
        })
        .collect();
    store_commands(&named)
}

/// The commands before SBND that store `named`: BNDL lines and `SCKS XXH3 *`.
pub(super) fn store_commands(named: &[Named]) -> Vec<Op> {
    let mut ops = super::bundle::lines(named);
    ops.push(Op::Simple {
        cmd: Command::Scks {
            alg: checksum::NAME.into(),
            value: None,
        },
        ok: vec![200],
    });
    ops
}

/// The answers to a bundle's checksum and, once the server has checked it and named every
/// file, to its data.
fn conclude(c: &mut Control, stop: &(dyn Fn() -> bool + Sync)) -> std::result::Result<(), Failed> {
    let session = |e: ClientError| Failed::session(e);
    let stopped = || {
        Failed::session(ClientError::Interrupted {
            bytes: 0,
            why: "stopped while the server checked the bundle".into(),
            partial: None,
        })
    };
    let Some(r) = c.final_reply_unless(stop).map_err(session)? else {
        return Err(stopped());
    };
    // The checksum's answer, then the transfer's end (a mismatch is that end's error).
    let Some(end) = c.final_reply_unless(stop).map_err(session)? else {
        return Err(stopped());
    };
    match (r.code, end.code) {
        (200, 226 | 250) => Ok(()),
        (_, 226 | 250) => Err(Failed::file(ClientError::Protocol(format!(
            "the server refused the bundle's checksum ({r}) but reported it stored"
        )))),
        _ => Err(Failed::file(transfer_failed(end))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{self, Shutdown};
    use braid_proto::session::Perm;
    use std::path::Path;
    use std::time::Duration;

    /// A braid server in this process on a free loopback port, anonymous with write access,
    /// stopped when dropped.
    struct Served {
        rt: tokio::runtime::Runtime,
        stop: tokio::sync::watch::Sender<Shutdown>,
        task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
        url: String,
    }

    impl Served {
        fn start(root: &Path) -> Served {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let listener = rt
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stop_rx) = tokio::sync::watch::channel(Shutdown::Running);
            let mut config = server::Config::new(root.to_path_buf());
            config.anonymous = Some(Perm::ReadWrite);
            // A checksum the server waits for in vain fails the test in seconds.
            config.idle_timeout = Duration::from_secs(5);
            let (_keep, configs) = tokio::sync::watch::channel(std::sync::Arc::new(config));
            let task = Some(rt.spawn(server::run(listener, configs, stop_rx)));
            Served {
                rt,
                stop,
                task,
                url: format!("ftp://{addr}/"),
            }
        }
    }

    impl Drop for Served {
        fn drop(&mut self) {
            let _ = self.stop.send(Shutdown::Abort);
            if let Some(task) = self.task.take() {
                let _ = self.rt.block_on(task);
            }
        }
    }

    /// `n` files named `{stem}{i}` of varied sizes in `dir`, each with a time of its own.
    fn files(dir: &Path, stem: &str, n: usize) -> Vec<Outgoing> {
        (0..n)
            .map(|i| {
                let local = dir.join(format!("{stem}{i}"));
                let data: Vec<u8> = (0..(i * 1777) % 9000).map(|b| (b * 7 + i) as u8).collect();
                std::fs::write(&local, &data).unwrap();
                Outgoing {
                    wanted: Wanted {
                        remote: format!("{stem}{i}"),
                        local,
                        size: data.len() as u64,
                    },
                    mtime: Some(1_700_000_000 + i as i64),
                }
            })
            .collect()
    }

    fn whole_sum(files: &[Outgoing]) -> String {
        let all: Vec<u8> = files
            .iter()
            .flat_map(|f| std::fs::read(&f.wanted.local).unwrap())
            .collect();
        checksum::hex(checksum::of(&all))
    }

    #[test]
    fn bundles_sent_ahead_of_their_answers_are_stored_each_with_its_checksum() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (root, local) = (dir.path().join("served"), dir.path().join("local"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&local).unwrap();
        let served = Served::start(&root);
        let target = super::super::url::parse(&served.url, &Default::default()).unwrap();
        let opts = Options::default();
        let mut c = super::super::sessions::session(&target, &opts, None).unwrap();
        let never = || false;
        // The first opens the session's data connections.
        let a = files(&local, "a", 40);
        let sent = send(&mut c, a.clone(), &opts, &never).unwrap_or_else(|f| panic!("{}", f.error));
        let stored =
            answers(&mut c, sent, &target, &never).unwrap_or_else(|f| panic!("{}", f.error));
        assert_eq!(stored.len(), 40);
        assert!(stored.iter().all(|s| s.bundle == Some(40)));
        // The next two go ahead of any answer, each checksum before any data: the server reads
        // the second's commands and checksum while the first's data is still to come, and
        // must still match that checksum to the second (it waits first in its queue then).
        let (b, d) = (files(&local, "b", 7), files(&local, "d", 5));
        let (joins, _, lines_b) =
            start(&mut c, &b, 0, &opts).unwrap_or_else(|f| panic!("{}", f.error));
        let scks = |sum| Command::Scks {
            alg: checksum::NAME.into(),
            value: Some(sum),
        };
        c.send(&scks(whole_sum(&b))).unwrap();
        let mut ops = commands(&d);
        let lines_d = ops.len();
        ops.push(Op::StartTransfer(Command::StorBundle));
        c.begin_all(ops).unwrap();
        c.send(&scks(whole_sum(&d))).unwrap();
        let mut joins = Some(joins);
        for set in [&b, &d] {
            let layout = Layout::new(set.iter().map(|f| f.wanted.size));
            let open = |i: usize| File::open(&set[i].wanted.local);
            let source = Files {
                layout: &layout,
                open: &open,
            };
            let todo: RangeSet = [(0, layout.total())].into_iter().collect();
            let options = SendOptions {
                block: crate::engine::DEFAULT_BLOCK,
                hash: false,
                keep: true,
            };
            let transfer = super::super::parallel::transfer(&mut c, Direction::Upload, true);
            let progress = AtomicU64::new(0);
            let sent = crate::engine::send::send(
                &transfer,
                Source::Bundle(&source),
                &todo,
                joins.take().unwrap(),
                options,
                &progress,
            )
            .unwrap();
            joins = Some(Joins::cached(sent.kept, STALL));
        }
        for lines in [lines_b.unwrap(), lines_d] {
            started(&mut c, lines, true).unwrap_or_else(|f| panic!("{}", f.error));
            conclude(&mut c, &never).unwrap_or_else(|f| panic!("{}", f.error));
        }
        for f in a.iter().chain(&b).chain(&d) {
            let there = root.join(&f.wanted.remote);
            assert_eq!(
                std::fs::read(&there).unwrap(),
                std::fs::read(&f.wanted.local).unwrap()
            );
            assert_eq!(std::fs::metadata(&there).unwrap().mtime(), f.mtime.unwrap());
        }
        let names = std::fs::read_dir(&root).unwrap().count();
        assert_eq!(names, 52, "no partial is left beside the files");
        c.quit();
    }
}
