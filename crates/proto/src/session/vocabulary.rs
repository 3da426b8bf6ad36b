//! The words the server session and its I/O driver share: what a command asks the caller to
//! do ([`Action`]), what the caller reports back, and what a transfer is.

use crate::listing::Entry;
use crate::path::VPath;
use crate::ranges::RangeSet;
use crate::reply::Reply;
use std::net::SocketAddr;

/// What a logged-in user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    ReadOnly,
    ReadWrite,
}

/// Settings that shape every session of a server.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// `None`: anonymous login refused. Otherwise what anonymous users may do.
    pub anonymous: Option<Perm>,
    /// After this many failed logins the connection is closed.
    pub max_login_failures: u32,
    /// Most data connections one MODE E transfer may use.
    pub max_streams: u32,
    /// The server has a certificate: AUTH TLS, PBSZ and PROT are offered (RFC 4217).
    pub tls: bool,
    /// After AUTH TLS, transfers need PROT P: clear data is refused with 522.
    pub private_data_required: bool,
    /// `braid serve --compress`: off refuses compressed blocks both ways; on compresses
    /// downloads unless the client says off; auto follows the client.
    pub compress: crate::compress::Policy,
    /// Logged-in users of a TLS session may have this server send to, or take from, another
    /// braid server (OPTS BRAID PEER): the data connections then prove themselves over TLS.
    /// `braid serve --no-third-party` turns it off.
    pub third_party: bool,
    /// `braid serve --data-node`: a front end logs in here and gives orders for each transfer
    /// (OPTS BRAID NODE): whose data connections to take, which stripe to move.
    pub data_node: bool,
    /// `braid serve --data-nodes`: SPAS lists the data nodes' addresses, and a transfer after
    /// it is moved by the nodes (the caller drives them).
    pub striped: bool,
    /// `braid serve --gsi-cert`: AUTH GSSAPI is offered (GSI logins, DCAU A).
    pub gsi: bool,
}

/// What the caller's GSI context made of an ADAT token ([`Session::adat_done`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdatOutcome {
    /// The context needs more: this token goes back in a 335.
    More(String),
    /// The context is complete (a last token, if any, goes in the 235); `delegated`: the
    /// client delegated a credential, with which data connections can be authenticated.
    Done {
        token: Option<String>,
        delegated: bool,
    },
    /// The handshake failed, for this reason.
    Failed(String),
}

/// OPTS BRAID PEER: a session's data connections join this server with another braid server
/// (a third-party transfer the client drives), not with the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThirdParty {
    /// They may come from any address: each proves this control session's binding under TLS
    /// before it counts.
    Accept,
    /// They go to another braid server.
    Connect(Box<PeerProof>),
}

/// What this server checks of another braid server, and proves to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerProof {
    /// The SHA-256 of its certificate, as the client saw it.
    pub certificate: [u8; 32],
    /// The binding of the client's control session with it (the client passed it on).
    pub binding: [u8; 32],
}

/// Whether `name` asks for anonymous login (RFC 1635: `anonymous` or `ftp`, any case).
pub fn is_anonymous(name: &str) -> bool {
    ["anonymous", "ftp"]
        .iter()
        .any(|a| a.eq_ignore_ascii_case(name))
}

/// Where the next data connection comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataEndpoint {
    /// The caller holds a passive listener at this address.
    Passive(SocketAddr),
    /// Connect here: the client (checked against the control peer), or under OPTS BRAID PEER
    /// another braid server.
    Active(SocketAddr),
    /// XFTP's MPRT: one connection to each of these (all at the control peer).
    ActivePorts(Vec<SocketAddr>),
    /// SPAS on a striped front end: one data node listens at each (in stripe order).
    Striped(Vec<SocketAddr>),
    /// MODE E: the data connections the previous transfer in the same direction left open
    /// (GridFTP data-channel caching; the transfer opens with 125 instead of 150).
    Cached,
}

/// Which way a transfer's data flows, seen from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// RETR, LIST, NLST, MLSD.
    ToClient,
    /// STOR, APPE.
    FromClient,
}

/// MODE E settings that travel with one transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMode {
    /// Data connections the server opens or accepts when it sends (OPTS RETR Parallelism).
    pub parallelism: u32,
    /// As many as it may open, where it opens them and tunes their count (a copy between
    /// servers; OPTS RETR Parallelism's third number).
    pub most: u32,
    /// REST ranges: what the receiver already holds, so it is not sent again.
    pub have: RangeSet,
    /// Block size the client asked for (OPTS RETR blocksize=), when the server sends.
    pub block_size: Option<u64>,
    /// Connections may join, leave and break while data flows (braid clients only): the
    /// server accepts more while it sends, takes a client's half-close as "stop using this
    /// one", and sends a broken connection's blocks again on the others.
    pub elastic: bool,
    /// Cap on the server's sending rate, bytes/s (OPTS RETR MaxRate).
    pub max_rate: Option<u64>,
    /// The congestion control for the connections it sends on (OPTS RETR Congestion).
    pub congestion: Option<crate::retr_opts::CcName>,
    /// The DSCP of the packets it sends (OPTS RETR Dscp).
    pub dscp: Option<u8>,
    /// It yields to other traffic on its own, adding at most this many milliseconds of
    /// queueing delay (OPTS RETR Background).
    pub background: Option<u32>,
    /// An upload sent ahead (`OPTS STOR Eager=1`) on the open data connections: they carry
    /// all of it and none joins, so the server need not watch for more.
    pub fixed: bool,
    /// Compressed blocks, when the client asked for them (`OPTS BRAID COMPRESS`): what the
    /// server does as the sender (`Off` for uploads, whose blocks it only accepts).
    pub compression: Option<crate::compress::Policy>,
}

/// An upload's expected checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// `SCKS XXH3 <hex>`: known before the data.
    Value(String),
    /// `SCKS XXH3 *`: the client sends `SCKS XXH3 <hex>` once its data is out; the upload waits
    /// for it before taking its final name.
    Deferred,
}

/// How a directory listing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStyle {
    /// LIST: `ls -l` lines.
    Long,
    /// NLST: names only.
    Names,
    /// MLSD: RFC 3659 facts.
    Machine,
    /// MLSR: MLSD lines for every entry beneath the directory, named by their paths relative
    /// to it; symbolic links are described, not followed.
    MachineTree,
}

/// What a transfer moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferKind {
    Retr(VPath),
    /// RBND: the files BNDL named, each at the size named, end to end ([`crate::bundle`]).
    Bundle(Vec<(VPath, u64)>),
    /// SBND: the files BNDL named, each at the size and with the time named, end to end.
    StoreBundle(Vec<(VPath, u64, Option<i64>)>),
    Stor(VPath),
    Appe(VPath),
    List(VPath, ListStyle),
}

impl TransferKind {
    pub fn direction(&self) -> Direction {
        match self {
            TransferKind::Stor(_) | TransferKind::Appe(_) | TransferKind::StoreBundle(_) => {
                Direction::FromClient
            }
            TransferKind::Retr(_) | TransferKind::Bundle(_) | TransferKind::List(..) => {
                Direction::ToClient
            }
        }
    }
}

/// A transfer for the caller to run: open the file or directory, send the 150 reply from
/// [`Transfer::opening`], move the data, then call [`Session::transfer_done`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub kind: TransferKind,
    /// Byte offset from REST (0 when none was given).
    pub offset: u64,
    pub ascii: bool,
    pub endpoint: DataEndpoint,
    /// Whether the user may change the listed entries (MLSD `perm` facts).
    pub writable: bool,
    /// MLSx facts to show, lower-case.
    pub facts: Vec<String>,
    /// Extended block mode, when MODE E is in effect.
    pub block: Option<BlockMode>,
    /// SBUF: socket buffer size for the data connections (None: kernel autotuning).
    pub buffer: Option<u64>,
    /// PROT P: the data connection is TLS.
    pub private: bool,
    /// DCAU A under GSI: each data connection runs GSI's handshake with the delegated
    /// credential, and the other end must show one of the same user, whatever its address.
    pub gsi: bool,
    /// MODE Z: the data is one zlib stream, deflated here at this level (or inflated).
    pub deflate: Option<u8>,
    /// What an upload's checksum must be (SCKS), in either mode: the whole file, REST prefix
    /// or ranges included, must hash to it before it takes its name.
    pub expect: Option<Expected>,
    /// ALLO before an upload: the size the file will have.
    pub allocate: Option<u64>,
    /// The data connections join this server with another braid server (OPTS BRAID PEER).
    pub third_party: Option<ThirdParty>,
    /// On a data node: the front end's order for this transfer (OPTS BRAID NODE).
    pub stripe: Option<crate::stripes::NodeOrder>,
}

/// A file-system request for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsOp {
    /// Is this a directory the user may enter?
    ChangeDir(VPath),
    Size {
        path: VPath,
        ascii: bool,
    },
    Mdtm(VPath),
    /// MFMT: set the modification time (seconds since the epoch).
    SetMtime(VPath, i64),
    Mkd(VPath),
    Rmd(VPath),
    Dele(VPath),
    /// Does the source of a rename exist?
    RenameFrom(VPath),
    Rename {
        from: VPath,
        to: VPath,
    },
    /// Facts about one entry for MLST.
    Mlst(VPath),
    /// `ls -l` lines for STAT with a path.
    StatList(VPath),
    /// CKSM over `[offset, offset+length)` (length None: to the end).
    Checksum {
        path: VPath,
        alg: ChecksumAlg,
        offset: u64,
        length: Option<u64>,
    },
}

/// Checksums CKSM computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumAlg {
    /// braid's chunked XXH3-128 ([`crate::checksum`]); whole files only.
    Xxh3,
    Md5,
    Adler32,
}

impl ChecksumAlg {
    pub fn parse(name: &str) -> Option<ChecksumAlg> {
        match name.to_ascii_uppercase().as_str() {
            crate::checksum::NAME => Some(ChecksumAlg::Xxh3),
            "MD5" => Some(ChecksumAlg::Md5),
            "ADLER32" => Some(ChecksumAlg::Adler32),
            _ => None,
        }
    }
}

/// What the file system gave back for an [`FsOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsOutcome {
    Done,
    Size(u64),
    Mtime(i64),
    Entry(Entry),
    Lines(Vec<String>),
    /// A checksum, in lower-case hex.
    Checksum(String),
}

/// Why a file-system request or a transfer's local side failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotADirectory,
    #[error("not a plain file")]
    NotAFile,
    #[error("permission denied")]
    PermissionDenied,
    #[error("already exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("path leads outside your root directory")]
    Escapes,
    #[error("no space left on the server's disk")]
    NoSpace,
    /// The account's quota (or the kernel's disk quota) has no room for this.
    #[error("over your storage quota ({0})")]
    Quota(String),
    #[error("restart offset {offset} is beyond the {size} bytes already stored")]
    BadRestart { offset: u64, size: u64 },
    #[error("no partial upload to continue; send STOR without REST")]
    NothingToResume,
    /// Another upload of the same name is running.
    #[error("another upload of this name is in progress; try again when it ends")]
    Busy,
    #[error("{0}")]
    Other(String),
}

impl FsError {
    pub fn reply(&self, what: &VPath) -> Reply {
        match self {
            // 552: RFC 959's "exceeded storage allocation".
            FsError::NoSpace | FsError::Quota(_) => {
                Reply::new(552, format!("{what}: {self}; transfer aborted."))
            }
            FsError::BadRestart { .. } | FsError::NothingToResume => {
                Reply::new(554, format!("{what}: {self}."))
            }
            FsError::Other(_) => Reply::new(451, format!("{what}: local error: {self}.")),
            // 450: transient, try again (RFC 959's "file unavailable (e.g., file busy)").
            FsError::Busy => Reply::new(450, format!("{what}: {self}.")),
            _ => Reply::new(550, format!("{what}: {self}.")),
        }
    }
}

/// How a transfer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferOutcome {
    Complete {
        bytes: u64,
        /// MODE E: the data connections stayed open for the next transfer.
        kept: bool,
        /// What all the data sent hashes to, for a transfer whose end names it (a bundle).
        checksum: Option<String>,
    },
    /// The client sent ABOR.
    Aborted,
    /// The data connection could not be set up.
    NoConnection(String),
    /// The data connection broke or the peer went away.
    ConnectionLost(String),
    /// A TLS data connection failed its handshake or did not prove it belongs to this session.
    NotSecured(String),
    /// The local file failed (disk full, I/O error).
    Local(FsError),
    /// The server is shutting down.
    Shutdown,
    /// The upload arrived whole but its checksum is not the one the client announced. The data
    /// is kept as a partial upload.
    ChecksumMismatch { expected: String, actual: String },
}

impl TransferOutcome {
    /// One stable word for logs and scripts.
    pub fn word(&self) -> &'static str {
        match self {
            TransferOutcome::Complete { .. } => "complete",
            TransferOutcome::Aborted => "aborted",
            TransferOutcome::NoConnection(_) => "no_connection",
            TransferOutcome::ConnectionLost(_) => "connection_lost",
            TransferOutcome::NotSecured(_) => "not_secured",
            TransferOutcome::Local(_) => "local_error",
            TransferOutcome::Shutdown => "shutdown",
            TransferOutcome::ChecksumMismatch { .. } => "checksum_mismatch",
        }
    }

    /// Why, in words, when it did not complete.
    pub fn detail(&self) -> Option<String> {
        match self {
            TransferOutcome::Complete { .. }
            | TransferOutcome::Aborted
            | TransferOutcome::Shutdown => None,
            TransferOutcome::NoConnection(why)
            | TransferOutcome::ConnectionLost(why)
            | TransferOutcome::NotSecured(why) => Some(why.clone()),
            TransferOutcome::Local(e) => Some(e.to_string()),
            TransferOutcome::ChecksumMismatch { expected, actual } => {
                Some(format!("announced {expected}, received {actual}"))
            }
        }
    }
}

/// What the caller must do next. One per command, moved once: a transfer's settings stay
/// inline rather than behind a box for the size of the other answers.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Reply(Reply),
    /// Send the reply, then close the control connection.
    Close(Reply),
    /// Check the credentials, then call [`Session::login_done`].
    Login {
        user: String,
        password: String,
    },
    /// Open a passive listener on the control connection's local address, then call
    /// [`Session::passive_done`].
    Passive {
        extended: bool,
    },
    /// SPAS on a striped front end: have each data node listen, then call
    /// [`Session::striped_passive_done`].
    StripedPassive,
    /// Do the file-system request, then call [`Session::fs_done`].
    Fs(FsOp),
    /// Run the transfer, then call [`Session::transfer_done`].
    Transfer(Transfer),
    /// Send the reply (234), then run the TLS handshake on the control connection; if it
    /// fails, close the connection.
    StartTls(Reply),
    /// Give the token (base64) to the GSI context AUTH GSSAPI began, then call
    /// [`Session::adat_done`].
    Adat(String),
}

impl Transfer {
    /// The 150 reply that opens the data connection (125 when cached connections carry it).
    pub fn opening(&self, size: Option<u64>) -> Reply {
        if self.endpoint == DataEndpoint::Cached {
            let what = match (&self.kind, size) {
                (TransferKind::Retr(p), Some(n)) => format!(" of {p} ({n} bytes)"),
                (TransferKind::Bundle(files), _) => format!(" of {} files", files.len()),
                (TransferKind::StoreBundle(files), _) => format!(" of {} files", files.len()),
                (TransferKind::List(..), _) => String::new(),
                _ => format!(" of {}", self.path()),
            };
            return Reply::new(
                125,
                format!("Beginning transfer{what}; reusing existing data connection."),
            );
        }
        let mode = if self.ascii { "ASCII" } else { "BINARY" };
        let text = match (&self.kind, size) {
            (TransferKind::Retr(p), Some(n)) => {
                format!("Opening {mode} mode data connection for {p} ({n} bytes).")
            }
            (TransferKind::Retr(p) | TransferKind::Stor(p) | TransferKind::Appe(p), _) => {
                format!("Opening {mode} mode data connection for {p}.")
            }
            (TransferKind::Bundle(files), _) => {
                format!(
                    "Opening {mode} mode data connection for {} files.",
                    files.len()
                )
            }
            (TransferKind::StoreBundle(files), _) => {
                format!(
                    "Opening {mode} mode data connection for {} files.",
                    files.len()
                )
            }
            (TransferKind::List(..), _) => "Here comes the directory listing.".to_string(),
        };
        Reply::new(150, text)
    }

    /// Why it could not be done: a file's error names the file; a bundle's names the file
    /// of the bundle that failed in its own text.
    pub fn refusal(&self, e: &FsError) -> Reply {
        match &self.kind {
            TransferKind::Bundle(files) => Reply::new(
                e.reply(self.path()).code,
                format!("RBND of {} files: {e}.", files.len()),
            ),
            TransferKind::StoreBundle(files) => Reply::new(
                e.reply(self.path()).code,
                format!("SBND of {} files: {e}.", files.len()),
            ),
            _ => e.reply(self.path()),
        }
    }

    pub fn direction(&self) -> Direction {
        self.kind.direction()
    }

    pub fn path(&self) -> &VPath {
        match &self.kind {
            TransferKind::Retr(p)
            | TransferKind::Stor(p)
            | TransferKind::Appe(p)
            | TransferKind::List(p, _) => p,
            // Named by its first file (RBND refuses an empty bundle).
            TransferKind::Bundle(files) => files.first().map_or(&crate::path::ROOT, |(p, _)| p),
            TransferKind::StoreBundle(files) => {
                files.first().map_or(&crate::path::ROOT, |(p, ..)| p)
            }
        }
    }
}
