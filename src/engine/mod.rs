//! The parallel data phase (GridFTP extended block mode) on blocking threads, one per data
//! connection, shared by the server and the client.
//!
//! - [`transfer`]: the set of data connections of one transfer, which may grow and shrink
//!   while data flows, and where connections join from.
//! - [`send`] and [`receive`]: the two sides. The sender cuts the file into blocks and each
//!   connection's thread takes the next block from one atomic cursor, so a slow connection
//!   simply takes fewer blocks. The receiver writes each block at its offset and folds it into
//!   the whole-file checksum as it passes. No lock is held per byte; shared state is touched
//!   once per block.
//! - [`roster`]: the sender's accounting (who is sending, what EOF will say) as a pure state
//!   machine, with an in-memory model of the whole elastic protocol as its test.
//! - [`sink`]: where received blocks go (a file at offsets, or in order to a stream).
//! - [`bundle`]: many small files as one byte range, read by the sender and written by the
//!   receiver.
//! - [`stream`]: stream mode's copy loops (one connection, ASCII conversion, TLS), for client
//!   and server; binary files in clear go by [`file_send`], which picks `sendfile` or a copy
//!   by where the peer is.
//! - [`tls`]: TLS on MODE E data connections (PROT P), each bound to the control session;
//!   [`gsi_data`]: GridFTP's GSI authentication of data connections (DCAU A).
//! - [`stats`]: per-connection samples (bytes, rate, `TCP_INFO`) taken off the data path.
//! - [`hooks`]: the **policy** (open and close connections, resize buffers) and the **pacer**
//!   (cap the rate of the whole transfer), and the steering that applies them.
//! - [`background`]: background mode's controller; [`background_stream`] runs it on one
//!   stream-mode connection to a server that is not braid.
//! - [`sockets`]: congestion control, DSCP and bbr's restart on a data socket.
//! - [`compress`] and [`compress_level`]: zstd for compressed blocks (a braid extension),
//!   and each sending connection's choice of whether and how hard to compress, from what its
//!   last blocks measured.
//! - [`tune`]: the self-tuning policy (`-n auto`): the connection count from measured
//!   goodput, loss and queueing delay.

pub mod background;
pub mod background_stream;
pub mod bundle;
pub mod compress;
pub mod compress_level;
pub mod file_send;
pub mod gsi_data;
pub mod gsi_tokens;
pub mod hooks;
pub mod receive;
pub mod roster;
pub mod send;
pub mod sink;
pub mod sockets;
pub mod stats;
pub mod stream;
pub mod tls;
pub mod transfer;
pub mod tune;
pub mod widen;
pub mod yield_report;

use braid_proto::block::BlockError;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Default block size. Measured on loopback (2 GiB, 4 connections, 2026-11-22): 256 KiB to
/// 64 MiB all move ~4.25 GB/s, so the header and per-block syscalls cost nothing at 1 MiB. What
/// decides is the end of a transfer on a slow path: each connection finishes its last block
/// alone, and 1 MiB takes 5 s at T1 rate where 4 MiB would take 21 s.
pub const DEFAULT_BLOCK: u64 = 1 << 20;

/// Bytes read or written per syscall on the copying paths; a multiple of the checksum chunk.
pub const PIECE: usize = 256 << 10;

/// Why a parallel data phase failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("data connection {conn}: {source}")]
    Net {
        conn: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("data connection {conn}: protocol error: {source}")]
    Protocol {
        conn: usize,
        #[source]
        source: BlockError,
    },
    #[error("local file: {0}")]
    Local(#[source] std::io::Error),
    #[error("data connection: {0}")]
    Tls(#[source] tls::SecureError),
    #[error("could not set up the data connections: {0}")]
    Setup(String),
    #[error("transfer aborted")]
    Aborted,
    #[error("every data connection broke")]
    AllLost,
    #[error(
        "nothing moved on the data connections for {0} s (the peer stalled, or announced more connections than came)"
    )]
    Stalled(u64),
}

impl EngineError {
    /// A connection broke (as opposed to the peer breaking the protocol, or a local file
    /// error): an elastic transfer survives this on its other connections.
    pub fn is_connection_loss(&self) -> bool {
        matches!(
            self,
            EngineError::Net { .. }
                | EngineError::Protocol {
                    source: BlockError::ClosedBeforeEod(_),
                    ..
                }
        )
    }
}

/// Stops a running data phase from another thread: shuts down every data connection, which
/// wakes each thread from its blocking read or write.
#[derive(Debug, Default)]
pub struct Abort {
    aborted: AtomicBool,
    socks: Mutex<Vec<Arc<TcpStream>>>,
}

impl Abort {
    pub fn new() -> Abort {
        Abort::default()
    }

    /// Tracks a data connection so that [`Abort::abort`] can close it.
    pub fn register(&self, sock: &TcpStream) {
        if let Ok(clone) = sock.try_clone() {
            self.register_handle(Arc::new(clone));
        }
    }

    /// The same with a handle the caller shares (a transfer's [`transfer::Link`]), so that
    /// one duplicate of the socket serves both.
    pub fn register_handle(&self, sock: Arc<TcpStream>) {
        if self.is_aborted() {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
        self.socks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(sock);
    }

    /// Stops tracking a connection registered with [`Abort::register_handle`], dropping the
    /// duplicate: a connection closed on purpose must really close (a peer still sending is
    /// then reset, not left blocked on a socket that nobody reads).
    pub fn forget(&self, sock: &Arc<TcpStream>) {
        self.socks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| !Arc::ptr_eq(s, sock));
    }

    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        let socks = self.socks.lock().unwrap_or_else(|p| p.into_inner());
        for s in socks.iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }
}

/// The error that failed a data phase: the first one, not the echoes of the abort it causes
/// on the other connections.
#[derive(Debug, Default)]
struct FirstError(Mutex<Option<EngineError>>);

impl FirstError {
    /// Records `e` unless something already failed (or the caller aborted), then stops every
    /// connection: one broken connection fails the transfer.
    fn fail(&self, e: EngineError, abort: &Abort) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() && !abort.is_aborted() {
            *slot = Some(e);
        }
        drop(slot);
        abort.abort();
    }

    fn into_inner(self) -> Option<EngineError> {
        self.0.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// Applies a fixed socket buffer size (SBUF, `--buffer`); without one the kernel's autotuning
/// stays on, which setting any size switches off.
pub fn set_buffer(sock: &TcpStream, bytes: Option<u64>) {
    if let Some(b) = bytes {
        let b = usize::try_from(b).unwrap_or(usize::MAX);
        let s = socket2::SockRef::from(sock);
        let _ = s.set_send_buffer_size(b);
        let _ = s.set_recv_buffer_size(b);
    }
}
