//! MODE E downloads and uploads: N data connections, blocks at offsets, the whole-file
//! checksum confirmed on the control connection, and a sidecar so `--resume` fetches only what
//! is missing.

use super::control::{Control, connect_data};
use super::error::{ClientError, Result};
use super::interrupt::{Interrupt, stopped, supervise};
use super::records::{UploadRecord, load_sidecar, remove_sidecar, save_sidecar, sidecar_path};
use super::url::Target;
use super::{Dest, Options, PartFile, Summary, cannot_write, local_err, part_path, progress_bar};
use crate::blocks::receive::{Accept, Conns, Progress, Shared};
use crate::blocks::send::Source;
use crate::blocks::sink::{Reorder, Sink};
use crate::blocks::{self, Abort, EngineError};
use braid_proto::checksum;
use braid_proto::command::Mode;
use braid_proto::ranges::RangeSet;
use braid_proto::{Command, Reply};
use std::fs::{File, OpenOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The kind of MODE E server, from its FEAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// braid: the client opens the data connections both ways, XXH3 checksums.
    Braid,
    /// A GridFTP server: it connects to us when it sends; MD5 through CKSM.
    GridFtp,
}

impl Peer {
    /// None also under TLS: MODE E data connections are not encrypted yet, so a TLS session
    /// moves its data over one stream-mode connection, which is.
    pub fn of(c: &Control) -> Option<Peer> {
        if c.uses_tls() {
            None
        } else if c.has_feature("BRAID") {
            Some(Peer::Braid)
        } else if c.has_feature("PARALLEL") {
            Some(Peer::GridFtp)
        } else {
            None
        }
    }
}

/// How long a reorder buffer may wait for a missing block, and how long a receiver waits for
/// a data connection.
const STALL: Duration = Duration::from_secs(120);

/// Downloads in MODE E. `size` is what SIZE said.
pub fn get(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    dest: &Dest,
    size: Option<u64>,
    opts: &Options,
) -> Result<Summary> {
    let n = opts.streams.max(1);
    let remote = target.path.as_str();
    c.expect(&Command::Mode(Mode::Extended), &[200])?;
    let mut retr_opts = format!("RETR Parallelism={n},{n},{n};");
    if let Some(b) = opts.block_size {
        retr_opts.push_str(&format!("blocksize={b};"));
    }
    c.expect(&Command::Opts(retr_opts), &[200])?;
    if let Some(b) = opts.buffer {
        c.expect(&Command::Sbuf(b), &[200])?;
    }
    let (sink, part, start) = match dest {
        Dest::Null => (Sink::Discard, None, Progress::holding(RangeSet::new())),
        Dest::Stdout => {
            // Room for a couple of blocks per connection, within bounds.
            let block = opts.block_size.unwrap_or(blocks::DEFAULT_BLOCK) as usize;
            let cap = (block * n as usize * 2).clamp(8 << 20, 256 << 20);
            let out = Box::new(std::io::stdout());
            let start = Progress::holding(RangeSet::new());
            (Sink::Ordered(Reorder::new(out, cap, STALL)), None, start)
        }
        Dest::File(path) => {
            let part = part_path(path);
            let sidecar = sidecar_path(&part);
            // Blocks land at their offsets, so a partial may have holes: only its sidecar says
            // what it holds. Without one (or for another file) it starts over.
            let resume = if opts.resume {
                let found = load_sidecar(&sidecar, remote, size);
                if found.is_none() && part.exists() {
                    eprintln!(
                        "braid: {} has no matching record of what it holds ({}); downloading again",
                        part.display(),
                        sidecar.display()
                    );
                }
                found
            } else {
                None
            };
            let mut oo = OpenOptions::new();
            oo.write(true).read(true).create(true);
            let file = if resume.is_some() {
                oo.open(&part)
            } else {
                oo.truncate(true).open(&part)
            }
            .map_err(local_err(format!("cannot write {}", part.display())))?;
            let start = resume.unwrap_or_else(|| {
                remove_sidecar(&sidecar);
                Progress::holding(RangeSet::new())
            });
            let writer = file
                .try_clone()
                .map_err(local_err("cannot duplicate file handle"))?;
            let part = PartFile {
                final_path: path.clone(),
                part,
                file,
            };
            (Sink::File(writer), Some(part), start)
        }
    };
    let resumed_from = start.ranges.len();
    let have = start.ranges.clone();
    let started = Instant::now();
    let bytes = Arc::new(AtomicU64::new(0));
    let shared = Shared::new(start, bytes.clone());
    let abort = Abort::new();
    let complete_already = size.is_some_and(|s| have.covers(0, s)) && resumed_from > 0;
    let retr = Command::Retr(target.path.clone());
    let partial_name = part.as_ref().map(|p| p.part.display().to_string());
    let save = |p: &Progress| {
        if let (Some(part), Some(s)) = (&part, size) {
            save_sidecar(&sidecar_path(&part.part), remote, s, p);
        }
    };
    if !complete_already {
        // Written now, so the space for the next version is reserved before data arrives.
        save(&shared.snapshot());
        let conns = match peer {
            Peer::Braid => {
                let addr = c.passive_addr()?;
                if !have.is_empty() {
                    c.expect(&Command::RestRanges(have.clone()), &[350])?;
                }
                Conns::fixed(open_and_start(c, &retr, addr, n, opts.buffer)?)
            }
            Peer::GridFtp => {
                let listener = c.active_listener()?;
                if !have.is_empty() {
                    c.expect(&Command::RestRanges(have.clone()), &[350])?;
                }
                c.start_transfer(&retr)?;
                Conns::accept(Accept {
                    listener,
                    peer: braid_proto::session::canonical_ip(c.peer().ip()),
                    wait: STALL,
                    max: 4 * n as usize + 4,
                    buffer: opts.buffer,
                })
            }
        };
        let bar = progress_bar(opts, size, resumed_from);
        let interrupt = Interrupt::install();
        let mut last_save = Instant::now();
        let result = supervise(
            &abort,
            &interrupt,
            || blocks::receive::receive(conns, &sink, size, &shared, &abort).map(drop),
            || {
                bar.set_position(resumed_from + bytes.load(Ordering::Relaxed));
                if last_save.elapsed() > Duration::from_secs(1) {
                    save(&shared.snapshot());
                    last_save = Instant::now();
                }
            },
        );
        bar.finish_and_clear();
        let received = bytes.load(Ordering::Relaxed);
        if interrupt.hit() {
            save(&shared.snapshot());
            return Err(stopped(c, received, "", partial_name));
        }
        if let Err(e) = result {
            save(&shared.snapshot());
            let what = cannot_write(partial_name.as_deref());
            return Err(data_phase_failed(
                c,
                &retr,
                e,
                &what,
                received,
                partial_name,
            ));
        }
        if let Err(e) = c.finish_transfer(&retr) {
            save(&shared.snapshot());
            return Err(ClientError::Interrupted {
                bytes: received,
                why: e.to_string(),
                partial: partial_name,
            });
        }
    }
    let got = shared.snapshot();
    let total = size.unwrap_or_else(|| got.ranges.iter().last().map_or(0, |(_, e)| e));
    let missing = got.ranges.missing(total);
    if !missing.is_empty() {
        save(&got);
        return Err(ClientError::Integrity(format!(
            "the server ended the transfer but bytes {missing} of {total} never arrived; run again with --resume"
        )));
    }
    let verified = verify(c, peer, target, total, &got, part.as_ref().map(|p| &p.file))?;
    let local = match part {
        Some(p) => {
            let sidecar = sidecar_path(&p.part);
            let local = p.commit(Some(total))?;
            remove_sidecar(&sidecar);
            local
        }
        None => "-".into(),
    };
    let s = super::summary(
        "get",
        target,
        local,
        got.per_conn.iter().sum(),
        Some(total),
        resumed_from,
        started,
    );
    Ok(extended(s, got.per_conn, verified))
}

/// Marks a summary as a MODE E transfer over these connections.
fn extended(mut s: Summary, per_conn: Vec<u64>, checksum: Option<String>) -> Summary {
    s.mode = "extended-block";
    s.streams = per_conn.len() as u32;
    s.per_connection_bytes = per_conn;
    s.checksum = checksum;
    s
}

/// Compares the whole-file checksum with the server's. braid peers: XXH3 from the blocks as
/// they arrived. GridFTP peers: MD5, which needs one read of the file. Returns what was
/// checked; a mismatch is an error that says so.
fn verify(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    total: u64,
    got: &Progress,
    file: Option<&File>,
) -> Result<Option<String>> {
    let (alg, local) = match (peer, got.sum, file) {
        (Peer::Braid, Some(sum), _) => (checksum::NAME, checksum::hex(sum.finish(total))),
        (Peer::Braid, None, Some(f)) => (
            checksum::NAME,
            checksum::hex(
                crate::sums::xxh3(f, total)
                    .map_err(local_err("cannot read the download back to check it"))?,
            ),
        ),
        (Peer::GridFtp, _, Some(f)) => (
            "MD5",
            crate::sums::md5(f, 0, total)
                .map_err(local_err("cannot read the download back to check it"))?,
        ),
        // Standard output from a GridFTP server: nothing to read back.
        _ => return Ok(None),
    };
    let ours = "the data received hashes to";
    let advice = "; the data is kept, rerun without --resume to fetch it again";
    compare_with_server(c, alg, &target.path, &local, ours, advice)
}

/// Compares `local` with the server's CKSM of the whole file: `ALG hex` when they agree,
/// None when the server offers no such checksum, an integrity error (saying what `ours` is)
/// when they differ.
pub(super) fn compare_with_server(
    c: &mut Control,
    alg: &str,
    path: &str,
    local: &str,
    ours: &str,
    advice: &str,
) -> Result<Option<String>> {
    let r = c.cmd(&Command::Cksm {
        alg: alg.into(),
        offset: 0,
        length: None,
        path: path.into(),
    })?;
    if r.code != 213 {
        tracing::info!(reply = %r, "the server offers no {alg} checksum; size check only");
        return Ok(None);
    }
    let remote = r.text().trim().to_ascii_lowercase();
    if remote != local {
        return Err(ClientError::Integrity(format!(
            "checksum mismatch: the server's {alg} of {path} is {remote}, {ours} {local}{advice}"
        )));
    }
    Ok(Some(format!("{alg} {local}")))
}

/// A MODE E upload: the local file, and what the server already holds of it (REST ranges,
/// from the record a broken earlier run left).
pub struct Upload<'a> {
    pub file: &'a File,
    pub len: u64,
    pub record: UploadRecord,
    pub have: RangeSet,
}

/// Uploads in MODE E, sending only what the server does not hold yet. While the data moves,
/// the server's `111 Range Marker` replies are written to the upload record, so a broken
/// upload (Ctrl-C, either side killed) can continue with `--resume`.
pub fn put(
    c: &mut Control,
    peer: Peer,
    up: Upload,
    target: &Target,
    opts: &Options,
) -> Result<Summary> {
    let Upload {
        file,
        len,
        record,
        have,
    } = up;
    let n = opts.streams.max(1);
    c.expect(&Command::Mode(Mode::Extended), &[200])?;
    if let Some(b) = opts.buffer {
        c.expect(&Command::Sbuf(b), &[200])?;
    }
    // A fresh upload hashes the blocks as they go out and announces the checksum at the end;
    // a resumed one sends only some blocks, so it reads the file once up front.
    let hash_while_sending = peer == Peer::Braid && have.is_empty();
    match peer {
        Peer::Braid => {
            let value = if have.is_empty() {
                None
            } else {
                let sum =
                    crate::sums::xxh3(file, len).map_err(local_err("cannot read the file"))?;
                Some(checksum::hex(sum))
            };
            let scks = Command::Scks {
                alg: checksum::NAME.into(),
                value,
            };
            c.expect(&scks, &[200])?;
        }
        Peer::GridFtp => {
            c.expect(&Command::Allo(len.to_string()), &[200, 202])?;
            // Range markers every second instead of every 5: less to resend after a break.
            // Only the Globus server knows TREV; others may refuse it.
            let trev = Command::Unknown {
                verb: "TREV".into(),
                arg: Some("RESTART 1".into()),
            };
            let _ = c.cmd(&trev);
        }
    }
    // The record exists from the start: a later --resume then knows this upload was in MODE E.
    if let Err(e) = record.save(&have) {
        eprintln!(
            "braid: cannot keep a record of this upload in {} ({e}); if it breaks, it starts over",
            record.location()
        );
    }
    let addr = c.passive_addr()?;
    if !have.is_empty() {
        c.expect(&Command::RestRanges(have.clone()), &[350])?;
    }
    c.reset_stored(have.clone());
    let stor = Command::Stor(target.path.clone());
    // Connect before waiting for 150: the Globus server sends it only once data connections
    // have arrived; a braid server accepts them from its backlog after sending it.
    let socks = match open_and_start(c, &stor, addr, n, opts.buffer) {
        Err(ClientError::Remote { reply, .. }) if !have.is_empty() => {
            eprintln!(
                "braid: the server cannot continue the earlier upload ({reply}); sending the whole file"
            );
            let again = Upload {
                file,
                len,
                record,
                have: RangeSet::new(),
            };
            return put(c, peer, again, target, opts);
        }
        r => r?,
    };
    let resumed_from = have.len();
    let started = Instant::now();
    let todo = have.missing(len);
    let block = opts.block_size.unwrap_or(blocks::DEFAULT_BLOCK);
    let progress = AtomicU64::new(0);
    let abort = Abort::new();
    let bar = progress_bar(opts, Some(len), resumed_from);
    let interrupt = Interrupt::install();
    let mut recorded = have.clone();
    let mut keep_record = |c: &Control| {
        if *c.stored() != recorded {
            recorded = c.stored().clone();
            let _ = record.save(&recorded);
        }
    };
    let result = supervise(
        &abort,
        &interrupt,
        || {
            let source = Source::File { file, size: len };
            let options = blocks::send::Options {
                block,
                hash: hash_while_sending,
                keep: false,
            };
            blocks::send::send(source, &todo, socks, options, &progress, &abort)
        },
        || {
            bar.set_position(resumed_from + progress.load(Ordering::Relaxed));
            if c.poll().is_ok() {
                keep_record(c);
            }
        },
    );
    bar.finish_and_clear();
    let keeps = match peer {
        Peer::Braid => {
            "the server keeps what arrived (not under the final name): run again with --resume to send the rest"
        }
        Peer::GridFtp => "the server keeps what arrived: run again with --resume to send the rest",
    };
    let stop_upload = |c: &mut Control| {
        let advice = format!("; {keeps}");
        let e = stopped(c, progress.load(Ordering::Relaxed), &advice, None);
        let _ = record.save(c.stored());
        e
    };
    if interrupt.hit() {
        return Err(stop_upload(c));
    }
    let sent = result.map_err(|e| {
        let what = "cannot read the file being uploaded";
        let e = data_phase_failed(c, &stor, e, what, progress.load(Ordering::Relaxed), None);
        keep_record(c);
        match e {
            ClientError::Interrupted { bytes, why, .. } => ClientError::Interrupted {
                bytes,
                why: format!("{why}; {keeps}"),
                partial: None,
            },
            e => e,
        }
    })?;
    let mut verified = None;
    if let Some(sum) = sent.sum {
        let hex = checksum::hex(sum.finish(len));
        let scks = Command::Scks {
            alg: checksum::NAME.into(),
            value: Some(hex.clone()),
        };
        c.send(&scks)?;
        let Some(r) = c.final_reply_unless(|| interrupt.hit())? else {
            return Err(stop_upload(c));
        };
        if r.code != 200 {
            return Err(upload_failed(r, &record, c));
        }
        verified = Some(format!("{} {hex}", checksum::NAME));
    }
    let Some(r) = c.final_reply_unless(|| interrupt.hit())? else {
        return Err(stop_upload(c));
    };
    if r.code != 226 && r.code != 250 {
        return Err(upload_failed(r, &record, c));
    }
    record.remove();
    // Done: from here (reading the file back to check it) Ctrl-C exits at once.
    drop(interrupt);
    if peer == Peer::Braid && verified.is_none() {
        // Announced before the data (resumed upload); the server checked it before the 226.
        let sum = crate::sums::xxh3(file, len).map_err(local_err("cannot read the file"))?;
        verified = Some(format!("{} {}", checksum::NAME, checksum::hex(sum)));
    }
    if peer == Peer::GridFtp {
        let local = crate::sums::md5(file, 0, len).map_err(local_err("cannot read the file"))?;
        let ours = "the file sent hashes to";
        verified = compare_with_server(c, "MD5", &target.path, &local, ours, "")?;
    }
    let s = super::summary(
        "put",
        target,
        String::new(),
        sent.per_conn.iter().sum(),
        Some(len),
        resumed_from,
        started,
    );
    Ok(extended(s, sent.per_conn, verified))
}

/// The error for an upload the server did not accept at the end. A checksum mismatch means
/// the server's partial is bad: the record goes, so the next run sends everything.
fn upload_failed(r: Reply, record: &UploadRecord, c: &Control) -> ClientError {
    let e = transfer_failed(r);
    if matches!(e, ClientError::Integrity(_)) {
        record.remove();
    } else {
        let _ = record.save(c.stored());
    }
    e
}

/// The error for a data phase that failed: a local file error as such, anything else as an
/// interrupted transfer, with the server's final reply, which usually says why.
fn data_phase_failed(
    c: &mut Control,
    cmd: &Command,
    e: EngineError,
    local_what: &str,
    bytes: u64,
    partial: Option<String>,
) -> ClientError {
    let why = match c.finish_transfer(cmd) {
        Err(ClientError::Remote { reply, .. }) => format!("{e}; server reported {reply}"),
        _ => e.to_string(),
    };
    match e {
        EngineError::Local(cause) => ClientError::Local {
            what: local_what.into(),
            cause,
        },
        _ => ClientError::Interrupted {
            bytes,
            why,
            partial,
        },
    }
}

/// Sends the transfer command, opens `n` data connections to the server's passive address,
/// then waits for 150. Connecting before the 150 matters: the Globus server sends it only once
/// data connections have arrived (a braid server takes them from its backlog after sending
/// it). If the server refused the command instead, that refusal is the error reported.
fn open_and_start(
    c: &mut Control,
    cmd: &Command,
    addr: std::net::SocketAddr,
    n: u32,
    buffer: Option<u64>,
) -> Result<Vec<std::net::TcpStream>> {
    c.send(cmd)?;
    let socks = (0..n)
        .map(|_| {
            let s = connect_data(addr)?;
            blocks::set_buffer(&s, buffer);
            Ok(s)
        })
        .collect::<Result<Vec<_>>>();
    match socks {
        Ok(socks) => {
            c.transfer_started(cmd)?;
            Ok(socks)
        }
        Err(e) => {
            c.transfer_started(cmd)?;
            Err(e)
        }
    }
}

fn transfer_failed(r: Reply) -> ClientError {
    if r.code == 550 && r.text().contains("checksum mismatch") {
        ClientError::Integrity(format!("the server refused the upload: {r}"))
    } else {
        ClientError::Interrupted {
            bytes: 0,
            why: format!("server reported {r}"),
            partial: None,
        }
    }
}
