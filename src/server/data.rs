//! Moving a transfer's bytes over its data connection, on a blocking thread: `sendfile` for
//! binary downloads, large `pwrite`s for uploads. The control task aborts a transfer by shutting
//! the socket down under it.

use crate::engine::receive::Kept;
use crate::engine::sink::Sink;
use crate::engine::stream::{self, CopyError};
use crate::engine::tls::DataConn;
use crate::engine::transfer::{Joins, Transfer};
use crate::engine::{self, EngineError};
use crate::fsroot::{Upload, io_to_fs};
use crate::server::tls::SessionTls;
use braid_proto::ranges::RangeSet;
use braid_proto::session::FsError;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The local side of a transfer, opened before the 150 reply.
pub enum Job {
    Retr {
        file: File,
        offset: u64,
        ascii: bool,
        /// Read whole already, to be sent from memory (see [`super::inline`]).
        whole: Option<WholeFile>,
        /// On a data node: the stripe its front end ordered, the only blocks it sends.
        stripe: Option<braid_proto::stripes::NodeOrder>,
    },
    Stor {
        upload: Upload,
        file: File,
        offset: u64,
        ascii: bool,
        /// Stream mode: hash the whole file once it is in, for a checksum the client
        /// announced (SCKS; MODE E hashes as blocks arrive).
        check: bool,
        /// The account's quota, charged as the file grows.
        charge: Option<super::quota::Charge>,
        /// On a data node: the blocks go into the front end's partial, which the front end
        /// checks and names once every node is done.
        stripe: bool,
    },
    List {
        text: Vec<u8>,
    },
    /// RBND: files opened one by one as their bytes go, each at the size BNDL named.
    Bundle {
        root: Arc<crate::fsroot::Root>,
        files: Vec<(braid_proto::VPath, u64)>,
    },
    /// SBND: every file's partial open before the data comes, each at the size BNDL named.
    StoreBundle {
        partials: crate::fsroot::Partials,
        layout: braid_proto::bundle::Layout,
    },
}

/// A download's bytes, read whole before it starts, and the file's version then (for the
/// checksum computed while they are sent).
#[derive(Debug)]
pub struct WholeFile {
    pub bytes: Vec<u8>,
    pub version: super::FileVersion,
}

/// Why the data phase failed.
#[derive(Debug)]
pub enum DataError {
    /// The data connection broke, or was shut down by an abort.
    Net(std::io::Error),
    /// The local file failed.
    Local(FsError),
    /// A TLS data connection failed its handshake or does not belong to this session.
    NotSecured(String),
}

/// A finished upload waits here until the control task decides it is complete.
pub struct Finished {
    pub bytes: u64,
    pub upload: Option<(Upload, File)>,
    /// Uploads: the file's length and its checksum (MODE E: as received, when every byte of
    /// `[0, length)` arrived in this run; stream mode: when the client announced one).
    pub received: Option<(u64, Option<u128>)>,
    /// MODE E: the data connections left open for the session's next transfer.
    pub kept: Kept,
    /// A bundle: what all it sent hashes to, which its 226 names.
    pub checksum: Option<String>,
    /// A stored bundle, whole: its files, to name once the client's checksum agrees.
    pub stored: Option<Box<crate::fsroot::Partials>>,
}

impl Finished {
    /// What a MODE E download ends with: its bytes, the connections it leaves open and, for
    /// a bundle, the checksum of all it sent.
    fn sent(bytes: u64, socks: Vec<DataConn>, checksum: Option<String>) -> Finished {
        Finished {
            bytes,
            upload: None,
            received: None,
            kept: Kept {
                socks,
                listener: None,
            },
            checksum,
            stored: None,
        }
    }
}

/// Data connections for a MODE E transfer.
pub enum BlockConns {
    /// The server sends on these.
    Send(Joins),
    /// The server receives on these, into this state (which the control task reads for the
    /// 111 Range Markers); the listener, when no connection may join this transfer, waits
    /// for the session's next one.
    Receive(
        Joins,
        Arc<engine::receive::Shared>,
        Option<std::net::TcpListener>,
    ),
}

/// The receiving state of a MODE E upload that already holds `have` (REST ranges).
pub fn upload_state(have: &RangeSet, progress: Arc<AtomicU64>) -> Arc<engine::receive::Shared> {
    let resume = engine::receive::Progress::holding(have.clone());
    Arc::new(engine::receive::Shared::new(resume, progress))
}

/// Runs a MODE E transfer. `have`: ranges the receiver already holds (REST ranges).
/// `sums`: where a checksum computed while sending the whole file is kept for CKSM.
pub fn run_blocks(
    job: Job,
    conns: BlockConns,
    have: &RangeSet,
    block: u64,
    progress: Arc<AtomicU64>,
    transfer: &Transfer,
    sums: &super::ChecksumCache,
) -> Result<Finished, DataError> {
    let engine = |e: EngineError| match e {
        EngineError::Local(e) => DataError::Local(io_to_fs(&e)),
        EngineError::Aborted => DataError::Net(std::io::Error::other("aborted")),
        e => DataError::Net(std::io::Error::other(e.to_string())),
    };
    match (job, conns) {
        (
            Job::Retr {
                file,
                whole,
                stripe,
                ..
            },
            BlockConns::Send(socks),
        ) => {
            let (source, before) = match &whole {
                // Sent from memory: hashing it on the way spares CKSM a read.
                Some(w) => (engine::send::Source::Memory(&w.bytes), Some(w.version)),
                None => {
                    let size = file
                        .metadata()
                        .map_err(|e| DataError::Local(io_to_fs(&e)))?
                        .len();
                    // Under TLS every byte passes through memory to be encrypted, so hashing
                    // it on the way costs next to nothing and spares CKSM a second read of
                    // the whole file.
                    let before = (socks.is_protected() && have.is_empty())
                        .then(|| super::ChecksumCache::version(&file).ok())
                        .flatten();
                    (engine::send::Source::File { file: &file, size }, before)
                }
            };
            let size = source.size();
            let todo = match &stripe {
                Some(order) => order.share(&have.missing(size)),
                None => have.missing(size),
            };
            let options = engine::send::Options {
                hash: before.is_some(),
                ..keep(block)
            };
            let sent = engine::send::send(transfer, source, &todo, socks, options, &progress)
                .map_err(engine)?;
            if let (Some(sum), Some(before)) = (&sent.sum, before) {
                sums.remember(&file, before, sum.finish(size));
            }
            Ok(Finished::sent(todo.len(), sent.kept, None))
        }
        (Job::Bundle { root, files }, BlockConns::Send(socks)) => {
            let layout = braid_proto::bundle::Layout::new(files.iter().map(|(_, n)| *n));
            let open = |i: usize| bundle_file(&root, &files[i]);
            let source = engine::bundle::Files {
                layout: &layout,
                open: &open,
            };
            let todo = have.missing(layout.total());
            // Read through memory anyway (many files to a block): hashing it on the way is
            // what lets the 226 name the checksum, with no second read.
            let options = engine::send::Options {
                hash: have.is_empty(),
                ..keep(block)
            };
            let source = engine::send::Source::Bundle(&source);
            let sent = engine::send::send(transfer, source, &todo, socks, options, &progress)
                .map_err(engine)?;
            let sum = sent.sum.map(|s| s.finish(layout.total()));
            let sum = sum.map(braid_proto::checksum::hex);
            Ok(Finished::sent(todo.len(), sent.kept, sum))
        }
        (Job::List { text }, BlockConns::Send(socks)) => {
            let todo: RangeSet = [(0, text.len() as u64)].into_iter().collect();
            let source = engine::send::Source::Memory(&text);
            let sent = engine::send::send(transfer, source, &todo, socks, keep(block), &progress)
                .map_err(engine)?;
            Ok(Finished::sent(text.len() as u64, sent.kept, None))
        }
        (
            Job::Stor {
                upload,
                file,
                charge,
                stripe,
                ..
            },
            BlockConns::Receive(conns, shared, parked),
        ) => {
            let writer = file
                .try_clone()
                .map_err(|e| DataError::Local(io_to_fs(&e)))?;
            if let Some(room) = room_for(&file) {
                shared.limit_to(room);
            }
            if let Some(mut charge) = charge {
                shared.charge_with(Box::new(move |end| charge.reach(end)));
            }
            let mut kept =
                engine::receive::receive(transfer, conns, &Sink::File(writer), None, &shared)
                    .map_err(engine)?;
            kept.listener = kept.listener.or(parked);
            if stripe {
                return Ok(Finished {
                    stored: None,
                    checksum: None,
                    bytes: transfer.per_link_bytes().iter().sum(),
                    upload: None,
                    received: None,
                    kept,
                });
            }
            let got = shared.snapshot();
            let whole = match got.ranges.iter().collect::<Vec<_>>().as_slice() {
                [] => Some(0),
                [(0, end)] => Some(*end),
                _ => None,
            };
            let Some(len) = whole else {
                return Err(DataError::Net(std::io::Error::other(format!(
                    "the sender finished but bytes are missing: have {}",
                    got.ranges
                ))));
            };
            // An earlier, longer partial must not leave a tail behind.
            file.set_len(len)
                .map_err(|e| DataError::Local(io_to_fs(&e)))?;
            let sum = match got.sum {
                Some(s) => Some(s.finish(len)),
                None => Some(
                    crate::sums::xxh3(&file, len).map_err(|e| DataError::Local(io_to_fs(&e)))?,
                ),
            };
            Ok(Finished {
                stored: None,
                checksum: None,
                bytes: transfer.per_link_bytes().iter().sum(),
                upload: Some((upload, file)),
                received: Some((len, sum)),
                kept,
            })
        }
        (Job::StoreBundle { partials, layout }, BlockConns::Receive(conns, shared, parked)) => {
            let total = layout.total();
            let sink = Sink::Landing(engine::bundle::Landing::new(layout, partials.files()));
            // Its size is known: no block may reach past it.
            let limit = Some(total);
            let mut kept =
                engine::receive::receive(transfer, conns, &sink, limit, &shared).map_err(engine)?;
            drop(sink);
            kept.listener = kept.listener.or(parked);
            let got = shared.snapshot();
            let missing = got.ranges.missing(total);
            if !missing.is_empty() {
                return Err(DataError::Net(std::io::Error::other(format!(
                    "the sender finished but bytes {missing} of the bundle's {total} never came"
                ))));
            }
            // A braid client's blocks sit on the checksum's chunks, so the bundle is hashed
            // as it arrives; the client's checksum is checked against this before any file
            // takes its name.
            let Some(sum) = got.sum else {
                return Err(DataError::Net(std::io::Error::other(format!(
                    "the bundle's blocks do not sit on {}-byte checksum chunks",
                    braid_proto::checksum::CHUNK
                ))));
            };
            Ok(Finished {
                stored: Some(Box::new(partials)),
                checksum: None,
                bytes: transfer.per_link_bytes().iter().sum(),
                upload: None,
                received: Some((total, Some(sum.finish(total)))),
                kept,
            })
        }
        _ => Err(DataError::Local(FsError::Other(
            "internal error: transfer direction and data connections disagree".into(),
        ))),
    }
}

/// How far an upload's blocks may reach: what the file holds now plus the space free for it.
fn room_for(file: &std::fs::File) -> Option<u64> {
    let fs = rustix::fs::fstatvfs(file).ok()?;
    let free = fs.f_bavail.saturating_mul(fs.f_frsize);
    Some(file.metadata().ok()?.len().saturating_add(free))
}

/// The server sends like the Globus server: without CLOSE, so that the client may send the
/// next transfer command without a new PORT or PASV.
/// A bundle's file, if it is still the size the client named: a file that changed since it
/// was listed fails the bundle (the client then takes the files one by one, each checked).
fn bundle_file(
    root: &crate::fsroot::Root,
    (path, size): &(braid_proto::VPath, u64),
) -> std::io::Result<File> {
    let (file, entry) = root
        .open_read(path)
        .map_err(|e| std::io::Error::other(format!("{path}: {e}")))?;
    if entry.size != *size {
        return Err(std::io::Error::other(format!(
            "{path} is {} bytes now, not the {size} it was listed with",
            entry.size
        )));
    }
    Ok(file)
}

fn keep(block: u64) -> engine::send::Options {
    engine::send::Options {
        block,
        hash: false,
        keep: true,
    }
}

/// Runs a stream-mode transfer; `tls` (PROT P) makes the data connection TLS; `deflate`
/// (MODE Z) makes the data one zlib stream, deflated at that level when this side sends.
pub fn run(
    job: Job,
    sock: TcpStream,
    tls: Option<SessionTls>,
    deflate: Option<u8>,
    progress: Arc<AtomicU64>,
) -> Result<Finished, DataError> {
    match tls {
        None => run_clear(job, sock, deflate, &progress),
        Some(tls) => run_tls(job, sock, &tls, deflate, &progress),
    }
}

/// PROT P: the same transfer through TLS, which rules out sendfile: the bytes must pass
/// through user space to be encrypted.
fn run_tls(
    job: Job,
    sock: TcpStream,
    tls: &SessionTls,
    deflate: Option<u8>,
    progress: &AtomicU64,
) -> Result<Finished, DataError> {
    let tls = tls.stream_data();
    let conn = rustls::ServerConnection::new(tls.config.clone())
        .map_err(|e| DataError::Net(std::io::Error::other(e)))?;
    let mut s = rustls::StreamOwned::new(conn, sock);
    // The handshake comes first, whatever follows: an empty file or listing has nothing to
    // write, and a close_notify sent before the ServerHello is a broken handshake to the
    // client (curl, Python and rclone failed on empty files so).
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .map_err(|e| DataError::NotSecured(format!("TLS handshake failed: {e}")))?;
    }
    if let Err(why) = tls.admits(&s.conn) {
        // An orderly end, so that the client goes on to read the reply that says why.
        s.conn.send_close_notify();
        let _ = s.flush();
        return Err(DataError::NotSecured(format!(
            "{why}, which this server requires so that nobody else can take the connection \
             (a client that cannot resume needs a server run with --tls-session-reuse optional)"
        )));
    }
    let (bytes, upload) = move_copied(job, &mut s, deflate, progress)?;
    // close_notify tells the client the data ended here, not by a cut connection.
    s.conn.send_close_notify();
    let ended = s.flush();
    if upload.is_none() {
        ended.map_err(DataError::Net)?;
        finish_send(s.sock)?;
    }
    stream_finished(bytes, upload)
}

fn run_clear(
    job: Job,
    mut sock: TcpStream,
    deflate: Option<u8>,
    progress: &AtomicU64,
) -> Result<Finished, DataError> {
    let (bytes, upload) = match (job, deflate) {
        (
            Job::Retr {
                file,
                offset,
                ascii: false,
                ..
            },
            None,
        ) => (send_binary(&file, offset, &sock, progress)?, None),
        (job, deflate) => move_copied(job, &mut sock, deflate, progress)?,
    };
    if upload.is_none() {
        finish_send(sock)?;
    }
    stream_finished(bytes, upload)
}

/// The bytes a stream transfer moved, and an upload's file (and whether to hash it whole).
type Moved = (u64, Option<(Upload, File, bool)>);

/// What a stream transfer moves through user space (listings, ASCII, TLS, MODE Z): the bytes
/// of the file or listing, and an upload's file.
fn move_copied<S: Read + Write>(
    job: Job,
    s: &mut S,
    deflate: Option<u8>,
    progress: &AtomicU64,
) -> Result<Moved, DataError> {
    match job {
        Job::Stor {
            upload,
            file,
            offset,
            ascii,
            check,
            charge,
            ..
        } => {
            let n = match deflate {
                None => receive(&file, offset, ascii, charge, s, progress)?,
                Some(_) => {
                    let mut inflating = flate2::read::ZlibDecoder::new(s);
                    receive(&file, offset, ascii, charge, &mut inflating, progress)?
                }
            };
            Ok((n, Some((upload, file, check))))
        }
        Job::Bundle { .. } | Job::StoreBundle { .. } => Err(DataError::Local(FsError::Other(
            "a bundle moves in MODE E only".into(),
        ))),
        Job::List { text } => {
            let n = deflated(s, deflate, |out| {
                out.write_all(&text).map_err(DataError::Net)?;
                progress.store(text.len() as u64, Ordering::Relaxed);
                Ok(text.len() as u64)
            })?;
            Ok((n, None))
        }
        Job::Retr {
            file,
            offset,
            ascii,
            ..
        } => {
            let n = deflated(s, deflate, |mut out| {
                send_copied(&file, offset, ascii, &mut out, progress)
            })?;
            Ok((n, None))
        }
    }
}

/// Runs `send` on `out`, or on a zlib stream at `level` into it, ended once `send` is done.
fn deflated<W: Write>(
    out: &mut W,
    level: Option<u8>,
    send: impl FnOnce(&mut dyn Write) -> Result<u64, DataError>,
) -> Result<u64, DataError> {
    let Some(level) = level else {
        return send(out);
    };
    let mut z = flate2::write::ZlibEncoder::new(out, flate2::Compression::new(level.into()));
    let n = send(&mut z)?;
    z.finish().map_err(DataError::Net)?;
    Ok(n)
}

/// The end of a stream transfer. An upload whose client announced the whole file's checksum
/// (a resumed one, whose partial may not have been a prefix of the file) is hashed whole here,
/// on the data thread, for the control task to check before the file takes its name.
fn stream_finished(
    bytes: u64,
    upload: Option<(Upload, File, bool)>,
) -> Result<Finished, DataError> {
    let local = |e: std::io::Error| DataError::Local(io_to_fs(&e));
    let received = match &upload {
        Some((_, file, true)) => {
            let len = file.metadata().map_err(local)?.len();
            Some((len, Some(crate::sums::xxh3(file, len).map_err(local)?)))
        }
        _ => None,
    };
    Ok(Finished {
        stored: None,
        checksum: None,
        bytes,
        upload: upload.map(|(u, f, _)| (u, f)),
        received,
        kept: Kept::default(),
    })
}

/// Ends a stream-mode download: FIN after the last byte. Closing without waiting for the
/// client is what FTP servers do; the kernel still delivers what is queued.
fn finish_send(sock: TcpStream) -> Result<(), DataError> {
    sock.shutdown(std::net::Shutdown::Write)
        .map_err(DataError::Net)
}

fn send_binary(
    file: &File,
    offset: u64,
    sock: &TcpStream,
    progress: &AtomicU64,
) -> Result<u64, DataError> {
    let size = file
        .metadata()
        .map_err(|e| DataError::Local(io_to_fs(&e)))?
        .len();
    // A file that shrinks meanwhile just ends early: stream mode has no length to keep.
    let reached = engine::file_send::FileSender::kernel()
        .send(sock, file, offset, size, false, |at| {
            progress.store(at - offset, Ordering::Relaxed)
        })
        .map_err(DataError::Net)?;
    Ok(reached - offset)
}

/// A download through user space: ASCII (converted to CRLF) or through TLS.
fn send_copied(
    file: &File,
    offset: u64,
    ascii: bool,
    out: &mut impl Write,
    progress: &AtomicU64,
) -> Result<u64, DataError> {
    // A file that shrinks meanwhile just ends early: stream mode has no length to keep.
    stream::write_from_file(file, offset, None, out, ascii, |n| {
        progress.store(n, Ordering::Relaxed)
    })
    .map_err(|e| match e {
        CopyError::Read(_, e) => DataError::Local(io_to_fs(&e)),
        CopyError::Write(_, e) => DataError::Net(e),
    })
}

fn receive(
    file: &File,
    offset: u64,
    ascii: bool,
    charge: Option<super::quota::Charge>,
    sock: &mut impl Read,
    progress: &AtomicU64,
) -> Result<u64, DataError> {
    let mut to = Charged {
        to: stream::AtOffset { file, offset },
        charge,
    };
    let mut tolerant = EofIsEnd(sock);
    stream::read_to_end(&mut tolerant, &mut to, ascii, |n| {
        progress.store(n, Ordering::Relaxed)
    })
    .map_err(|e| match e {
        CopyError::Read(_, e) => DataError::Net(e),
        CopyError::Write(_, e) => {
            // Over the quota: the rest is read and dropped (within bounds) before the data
            // connection closes, so that the client, still sending, gets the 552 that says
            // why instead of a reset.
            if e.raw_os_error() == Some(rustix::io::Errno::DQUOT.raw_os_error()) {
                drain(tolerant.0);
            }
            DataError::Local(io_to_fs(&e))
        }
    })
}

/// Reads and drops what a sender still sends: up to 64 MiB or 10 s.
fn drain(sock: &mut impl Read) {
    let started = std::time::Instant::now();
    let mut buf = vec![0u8; 1 << 16];
    let mut left: u64 = 64 << 20;
    while left > 0 && started.elapsed() < std::time::Duration::from_secs(10) {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n as u64),
        }
    }
}

/// Writes at offsets, each one charged to the account's quota first.
struct Charged<'a> {
    to: stream::AtOffset<'a>,
    charge: Option<super::quota::Charge>,
}

impl Write for Charged<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(c) = &mut self.charge {
            c.reach(self.to.offset + buf.len() as u64)?;
        }
        self.to.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A TLS client that closed without close_notify, as many FTPS clients do, ended its upload
/// (vsftpd accepts this too unless strict_ssl_read_eof is set).
struct EofIsEnd<'a, R>(&'a mut R);

impl<R: Read> Read for EofIsEnd<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.0.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
            r => r,
        }
    }
}
