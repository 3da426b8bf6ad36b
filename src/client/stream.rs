//! The stream route: a file over one plain FTP data connection, which every server offers.
//! Only the final reply (and the size) tells a finished transfer from a broken one; a braid
//! server's whole-file checksum is compared where it offers one.

use super::control::Control;
use super::error::{ClientError, Result};
use super::job::{Dest, PartFile, Source, cannot_write, local_err, not_a_partial};
use super::stream_yield::{self, OnStream};
use super::summary::{Summary, display_url, summary};
use super::url::Target;
use super::verify::{compare_with_server, whole_file_checksum};
use super::watch::{TICK, Watch};
use super::wire::Wire;
use super::{BUF, Options};
use crate::engine::Abort;
use crate::engine::stream::{self, CopyError};
use braid_proto::Command;
use braid_proto::checksum::{self, ChunkSum};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Downloads `target` (`size` bytes, if SIZE said) into `dest` over one data connection,
/// continuing a partial from its end with `--resume`.
pub fn get(
    c: &mut Control,
    target: &Target,
    dest: &Dest,
    size: Option<u64>,
    opts: &Options,
) -> Result<Summary> {
    let (mut out, part, offset) = open_output(dest, size, opts.resume)?;
    let started = Instant::now();
    let partial = part.as_ref().map(PartFile::name);
    // A resumed download whose partial is already whole needs no data connection.
    let (received, background) = if offset > 0 && size == Some(offset) {
        (0, None)
    } else {
        receive(c, target, &mut out, partial, size, offset, opts)?
    };
    drop(out);
    let total = offset + received;
    if let Some(s) = size
        && (total < s || (total > s && !opts.growing))
    {
        return Err(ClientError::Integrity(format!(
            "received {total} bytes but the server announced {s}; the partial data is kept, run again with --resume"
        )));
    }
    let local = match part {
        Some(p) => p.commit(None)?,
        None => "-".into(),
    };
    let mut s = summary(
        "get",
        target,
        local,
        received,
        size.or(Some(total)),
        offset,
        started,
    );
    s.background = background.and_then(|b| b.report());
    Ok(s)
}

/// Where a stream-mode download writes, the partial it fills, and where it starts (a kept
/// partial's end).
fn open_output(
    dest: &Dest,
    size: Option<u64>,
    resume: bool,
) -> Result<(Box<dyn Write>, Option<PartFile>, u64)> {
    let path = match dest {
        Dest::Stdout => return Ok((Box::new(std::io::stdout().lock()), None, 0)),
        Dest::Null => return Ok((Box::new(std::io::sink()), None, 0)),
        Dest::File(path) => path,
    };
    let part = PartFile::open(path, resume)?;
    let have = part.held()?;
    if let Some(s) = size
        && have > s
    {
        return Err(not_a_partial(&part.part, have, s));
    }
    let writer = part
        .file
        .try_clone()
        .map_err(local_err("cannot duplicate file handle"))?;
    let mut w = std::io::BufWriter::with_capacity(BUF, writer);
    w.seek(std::io::SeekFrom::Start(have))
        .map_err(local_err("seek"))?;
    Ok((Box::new(w), Some(part), have))
}

/// The data phase of a download: RETR from `offset`, everything the connection brings written
/// to `out` (never more than SIZE announced, unless `--growing`), then the final reply. The
/// bytes received, and background mode's controller for its report.
fn receive(
    c: &mut Control,
    target: &Target,
    out: &mut dyn Write,
    partial: Option<String>,
    size: Option<u64>,
    offset: u64,
    opts: &Options,
) -> Result<(u64, Option<OnStream>)> {
    let retr = Command::Retr(target.path.clone());
    let deflated = c.deflate_next()?;
    let mut data = c.stream_transfer(&retr, offset)?;
    let mut on = Watched::start(c, &data, opts, size, offset, false)?;
    // A server that does not stop (or a file that grows while it is sent) would otherwise
    // fill the disk; in MODE Z, what it inflates to.
    let limit = size.filter(|_| !opts.growing);
    let mut capped = Capped::new(
        super::wire::reading(&mut data, deflated),
        limit.map(|s| s.saturating_sub(offset)),
    );
    let bar = on.watch.bar.clone();
    let copied =
        on.run(|| stream::read_to_end(&mut capped, out, false, |n| bar.set_position(offset + n)));
    let overran = capped.overran;
    // Lets go of the connection (and of its decoder, in MODE Z) before it is ended.
    drop(capped);
    let flushed = out.flush();
    if on.watch.stopped() {
        flushed.map_err(local_err(cannot_write(partial.as_deref())))?;
        let n = copied.unwrap_or_else(|e| e.moved());
        return Err(on.watch.stop(c, n, "", partial));
    }
    // Under TLS this sends close_notify first: vsftpd, for one, waits for it before its 226.
    data.finish();
    let received = match copied {
        Ok(n) => n,
        Err(CopyError::Read(n, _)) if overran => {
            flushed.map_err(local_err(cannot_write(partial.as_deref())))?;
            return Err(ClientError::Integrity(format!(
                "{}: the server sent more than the {} bytes its SIZE announced: the file \
                 is growing on the server (take what comes with --growing), or the server \
                 is broken; the first {} bytes are kept{}",
                display_url(target),
                size.unwrap_or(0),
                offset + n,
                partial.map(|p| format!(" in {p}")).unwrap_or_default()
            )));
        }
        Err(CopyError::Read(n, e)) => {
            return Err(ClientError::Interrupted {
                bytes: n,
                why: format!("data connection: {e}"),
                partial,
            });
        }
        Err(CopyError::Write(_, e)) => {
            return Err(ClientError::Local {
                what: cannot_write(partial.as_deref()),
                cause: e,
            });
        }
    };
    flushed.map_err(local_err(cannot_write(partial.as_deref())))?;
    // Stream mode cannot tell a finished download from a server that died: only the 226
    // (and the size check after it) can.
    let finished = c.finish_transfer(&retr);
    if deflated {
        c.plain_again()?;
    }
    if let Err(e) = finished {
        let why = match e {
            ClientError::Remote { reply, .. } => format!("server reported {reply}"),
            e => e.to_string(),
        };
        return Err(ClientError::Interrupted {
            bytes: received,
            why,
            partial,
        });
    }
    Ok((received, on.background))
}

/// A stream-mode data phase's one connection under the watch: Ctrl-C closes it, and
/// background mode's controller (if asked for) steers it, ticked twice as often.
struct Watched {
    tcp: TcpStream,
    background: Option<OnStream>,
    watch: Watch,
}

impl Watched {
    /// Watches `data`, which carries `total` bytes (None: unknown) from `at`; `sending`: an
    /// upload.
    fn start(
        c: &Control,
        data: &Wire,
        opts: &Options,
        total: Option<u64>,
        at: u64,
        sending: bool,
    ) -> Result<Watched> {
        let tcp = data
            .tcp()
            .try_clone()
            .map_err(local_err("data connection"))?;
        let background = stream_yield::start(c, &tcp, opts, sending);
        let watch = Watch::start(opts, total, at);
        let watch = if background.is_some() {
            watch.every(TICK / 2)
        } else {
            watch
        };
        Ok(Watched {
            tcp,
            background,
            watch,
        })
    }

    /// Runs the data phase on this thread under the watch.
    fn run<R>(&mut self, work: impl FnOnce() -> R) -> R {
        let abort = Abort::new();
        abort.register(&self.tcp);
        let background = &mut self.background;
        self.watch.run(&abort, work, || {
            if let Some(b) = background.as_mut() {
                b.tick();
            }
        })
    }
}

/// Says, in verbose mode, why this transfer uses one stream-mode connection, and how
/// background mode steers it.
pub fn explain(opts: &Options) {
    if !opts.verbose {
        return;
    }
    if opts.background.is_some() {
        eprintln!(
            "braid: --background on one stream-mode connection: paced by the data connection's own round trip when sending, by the window it advertises when receiving (RFC 9840)"
        );
    }
    if opts.tls.is_some() {
        eprintln!(
            "braid: TLS: using one stream-mode connection (the server does not protect MODE E data connections: FEAT has no BRAID 3)"
        );
    } else {
        eprintln!(
            "braid: the server offers no MODE E (no PARALLEL in FEAT): using one stream-mode connection"
        );
    }
}

/// `braid put - URL`: standard input, of a length nobody knows beforehand, over one
/// stream-mode connection; a braid server's checksum of what it stored is compared with the
/// one of what was read.
pub fn put_stdin(c: &mut Control, target: &Target, opts: &Options) -> Result<Summary> {
    let started = Instant::now();
    let stor = Command::Stor(target.path.clone());
    let mut data = c.stream_transfer(&stor, 0)?;
    let mut sum = ChunkSum::new();
    let mut on = Watched::start(c, &data, opts, None, 0, true)?;
    let bar = on.watch.bar.clone();
    let r = on.run(|| {
        copy_hashing(&mut std::io::stdin().lock(), &mut data, &mut sum, |at| {
            bar.set_position(at)
        })
    });
    if on.watch.stopped() {
        drop(data);
        let n = r.unwrap_or_else(|(n, _)| n);
        return Err(on.watch.stop(c, n, "", None));
    }
    let sent = r.map_err(|(n, e)| ClientError::Interrupted {
        bytes: n,
        why: e.to_string(),
        partial: None,
    })?;
    end_upload(data);
    c.finish_transfer(&stor)?;
    let mut s = summary("put", target, "-".into(), sent, Some(sent), 0, started);
    s.background = on.background.and_then(|b| b.report());
    if c.has_feature("BRAID") {
        let local = checksum::hex(sum.finish(sent));
        let ours = "standard input hashes to";
        s.checksum = compare_with_server(c, checksum::NAME, &target.path, &local, ours, "")?;
    }
    Ok(s)
}

/// Copies `input` to `out` to its end in whole buffers (so the checksum's chunks line up),
/// folding it into `sum`; the bytes copied, or how far it got and why it stopped.
fn copy_hashing(
    input: &mut impl Read,
    out: &mut impl Write,
    sum: &mut ChunkSum,
    mut moved: impl FnMut(u64),
) -> std::result::Result<u64, (u64, std::io::Error)> {
    let mut buf = vec![0u8; BUF];
    let mut at = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let e = std::io::Error::new(e.kind(), format!("standard input: {e}"));
                    return Err((at, e));
                }
            }
        }
        let last = filled < buf.len();
        // Whole buffers are whole chunks; only the last may be short.
        let _ = sum.add(at, &buf[..filled], last);
        out.write_all(&buf[..filled]).map_err(|e| {
            (
                at,
                std::io::Error::new(e.kind(), format!("data connection: {e}")),
            )
        })?;
        at += filled as u64;
        moved(at);
        if last {
            return Ok(at);
        }
    }
}

/// Uploads `src` over one data connection. `continue_from_size`: the server's partial (its
/// SIZE) is continued (`--resume` without a record of a MODE E upload).
pub fn put(
    c: &mut Control,
    src: &Source,
    opts: &Options,
    continue_from_size: bool,
) -> Result<Summary> {
    let (target, len) = (&src.target, src.size());
    let offset = if continue_from_size {
        held_by_server(c, src)?
    } else {
        0
    };
    let started = Instant::now();
    // Even with nothing left to send, STOR is what makes the server's partial take the final
    // name.
    let stor = Command::Stor(target.path.clone());
    // A partial this continues was not ours to vouch for: a braid server is told what the
    // whole file hashes to and checks it before the file takes its name.
    let checked = offset > 0 && c.has_feature("BRAID");
    if checked {
        c.expect(&whole_file_checksum(&src.file, len)?, &[200])?;
    }
    let deflated = c.deflate_next()?;
    let (sent, background) = send(c, &stor, &src.file, (offset, len), deflated, opts)?;
    let finished = c.finish_transfer(&stor);
    if deflated {
        c.plain_again()?;
    }
    finished.map_err(|e| match e {
        ClientError::Remote { reply, .. } => ClientError::Interrupted {
            bytes: sent,
            why: format!("server reported {reply}; run again with --resume to continue"),
            partial: None,
        },
        ClientError::Integrity(m) if checked => ClientError::Integrity(format!(
            "{m}; the partial on the server was not a prefix of this file: send it again without --resume"
        )),
        e => e,
    })?;
    let mut s = summary("put", target, src.name(), sent, Some(len), offset, started);
    s.background = background.and_then(|b| b.report());
    Ok(s)
}

/// What the server holds of an upload's file already, from its size; more than the local file
/// has cannot be a beginning of it.
fn held_by_server(c: &mut Control, src: &Source) -> Result<u64> {
    let r = c.size(&src.target.path)?;
    let held = match r.code {
        213 => r.text().trim().parse::<u64>().unwrap_or(0),
        _ => 0,
    };
    if held > src.size() {
        return Err(ClientError::Integrity(format!(
            "the server already holds {held} bytes of {}, more than the {} bytes of {}",
            src.target.path,
            src.size(),
            src.name()
        )));
    }
    Ok(held)
}

/// The data phase of an upload: `[offset, len)` of `file` after STOR; the bytes sent.
fn send(
    c: &mut Control,
    stor: &Command,
    file: &File,
    (offset, len): (u64, u64),
    deflated: bool,
    opts: &Options,
) -> Result<(u64, Option<OnStream>)> {
    let mut data = c.stream_transfer(stor, offset)?;
    let mut on = Watched::start(c, &data, opts, Some(len), offset, true)?;
    let bar = on.watch.bar.clone();
    let r = on.run(|| match &mut data {
        wire if deflated => {
            let level = flate2::Compression::new(braid_proto::session::DEFLATE_LEVEL.into());
            let mut z = flate2::write::ZlibEncoder::new(wire, level);
            let n = send_copied(file, offset, len, &mut z, |at| bar.set_position(at))?;
            z.finish().map_err(|e| (n, e))?;
            Ok(n)
        }
        Wire::Clear(sock) => send_file(file, offset, len, sock, |at| bar.set_position(at)),
        tls => send_copied(file, offset, len, tls, |at| bar.set_position(at)),
    });
    if on.watch.stopped() {
        drop(data);
        let n = r.unwrap_or_else(|(n, _)| n);
        let advice = "; run again with --resume to send the rest";
        return Err(on.watch.stop(c, n, advice, None));
    }
    let sent = r.map_err(|(n, e)| ClientError::Interrupted {
        bytes: n,
        why: format!("data connection: {e}"),
        partial: None,
    })?;
    end_upload(data);
    Ok((sent, on.background))
}

/// Ends a stream-mode upload's data (close_notify under TLS, then FIN) and waits for the
/// server to close its side, so that the 226 describes the whole file.
fn end_upload(mut data: Wire) {
    data.finish();
    let mut sink = [0u8; 64];
    let _ = data.read(&mut sink);
}

/// Sends `[offset, len)` of a file on a clear connection (`sendfile` to another host).
fn send_file(
    file: &File,
    offset: u64,
    len: u64,
    sock: &TcpStream,
    mut moved: impl FnMut(u64),
) -> std::result::Result<u64, (u64, std::io::Error)> {
    let mut at = offset;
    let reached = crate::engine::file_send::FileSender::for_socket(sock)
        .send(sock, file, offset, len, false, |now| {
            at = now;
            moved(now);
        })
        .map_err(|e| (at - offset, e))?;
    if reached < len {
        return Err((
            reached - offset,
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "local file shrank during upload",
            ),
        ));
    }
    Ok(reached - offset)
}

/// Sends `[offset, len)` of a file through a writer that needs the bytes (TLS).
fn send_copied(
    file: &File,
    offset: u64,
    len: u64,
    out: &mut impl Write,
    mut moved: impl FnMut(u64),
) -> std::result::Result<u64, (u64, std::io::Error)> {
    stream::write_from_file(file, offset, Some(len), out, false, |n| moved(offset + n)).map_err(
        |e| match e {
            CopyError::Read(n, e) | CopyError::Write(n, e) => (n, e),
        },
    )
}

/// A reader that fails once more than `limit` bytes come (none is passed on of the read that
/// goes past it), and says so in `overran`.
struct Capped<R> {
    inner: R,
    left: Option<u64>,
    overran: bool,
}

impl<R> Capped<R> {
    fn new(inner: R, limit: Option<u64>) -> Capped<R> {
        Capped {
            inner,
            left: limit,
            overran: false,
        }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(left) = &mut self.left {
            if n as u64 > *left {
                self.overran = true;
                return Err(std::io::Error::other("more data than announced"));
            }
            *left -= n as u64;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_reader_passes_the_announced_bytes_and_fails_past_them() {
        let mut r = Capped::new(&b"0123456789"[..], Some(10));
        let mut out = Vec::new();
        r.read_to_end(&mut out).expect("exactly the limit");
        assert_eq!(out, b"0123456789");
        assert!(!r.overran);
        let mut r = Capped::new(&b"0123456789"[..], Some(4));
        let mut buf = [0u8; 16];
        let e = r.read(&mut buf).expect_err("past the limit");
        assert!(r.overran, "{e}");
        let mut r = Capped::new(&b"0123456789"[..], None);
        out.clear();
        r.read_to_end(&mut out).expect("no limit");
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn hashing_while_copying_gives_the_checksum_of_the_whole_input() {
        // More than one buffer, and a short last one: the chunks line up either way.
        let input: Vec<u8> = (0..(BUF + BUF / 3)).map(|i| (i * 7 % 251) as u8).collect();
        let mut sum = ChunkSum::new();
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let n =
            copy_hashing(&mut &input[..], &mut out, &mut sum, |at| seen.push(at)).expect("copied");
        assert_eq!(n, input.len() as u64);
        assert_eq!(out, input);
        assert_eq!(seen.last(), Some(&n));
        assert_eq!(sum.finish(n), checksum::of(&input));
    }

    #[test]
    fn a_failing_input_says_how_far_it_got() {
        struct Broken(usize);
        impl Read for Broken {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0 == 0 {
                    return Err(std::io::Error::other("gone"));
                }
                let n = buf.len().min(self.0);
                self.0 -= n;
                Ok(n)
            }
        }
        let mut sum = ChunkSum::new();
        let mut out = Vec::new();
        let (at, e) = copy_hashing(&mut Broken(BUF + 5), &mut out, &mut sum, |_| {})
            .expect_err("broken input");
        assert_eq!(at, BUF as u64, "one whole buffer went out");
        assert!(e.to_string().contains("standard input"), "{e}");
    }

    #[test]
    fn a_download_into_a_file_continues_a_kept_partial_from_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        std::fs::write(super::super::job::part_path(&dest), b"0123").unwrap();
        let (mut w, part, at) = open_output(&Dest::File(dest.clone()), Some(10), true).unwrap();
        assert_eq!(at, 4, "--resume continues at the partial's end");
        w.write_all(b"456789").unwrap();
        drop(w);
        let part = part.unwrap();
        assert_eq!(part.commit(None).unwrap(), dest.display().to_string());
        assert_eq!(std::fs::read(&dest).unwrap(), b"0123456789");
        // Without --resume the partial starts over; longer than the file, it is no partial.
        std::fs::write(super::super::job::part_path(&dest), b"0123").unwrap();
        let (_, _, at) = open_output(&Dest::File(dest.clone()), Some(10), false).unwrap();
        assert_eq!(at, 0);
        std::fs::write(super::super::job::part_path(&dest), b"0123456789AB").unwrap();
        let e = open_output(&Dest::File(dest), Some(10), true)
            .err()
            .unwrap();
        assert!(matches!(e, ClientError::Integrity(_)), "{e}");
        let (_, part, at) = open_output(&Dest::Null, Some(10), true).unwrap();
        assert!(part.is_none() && at == 0);
    }

    #[test]
    fn a_range_of_a_file_is_sent_through_a_writer_and_progress_counts_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let mut out = Vec::new();
        let mut last = 0;
        let sent = send_copied(&file, 1000, data.len() as u64, &mut out, |at| last = at).unwrap();
        assert_eq!(sent, data.len() as u64 - 1000);
        assert_eq!(out, &data[1000..]);
        assert_eq!(
            last,
            data.len() as u64,
            "positions are in the file, not the range"
        );
    }
}
