//! The kind of MODE E server at the other end, from its FEAT: what its data connections,
//! checksums and elasticity allow.

use super::control::Control;
use super::error::ClientError;
use braid_proto::checksum;
use braid_proto::client::BlockPeer;
use std::time::Duration;

/// The kind of MODE E server, from its FEAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// braid: the client opens the data connections both ways, XXH3 checksums.
    Braid,
    /// A GridFTP server: it connects to us when it sends; ADLER32 or MD5 through CKSM.
    GridFtp,
}

impl Peer {
    /// The CKSM algorithm a whole file is checked with: braid's own with a braid server; with
    /// a GridFTP server ADLER32 where it offers it (as grid data management checks files),
    /// else MD5. MD5 costs both ends several times as much CPU: a tree of 1,000 files of
    /// 1 MiB to and from globus-gridftp-server on loopback took 2.4 s with it, and
    /// globus-url-copy, which checks nothing, 0.6 s.
    pub fn checksum(self, c: &Control) -> &'static str {
        match self {
            Peer::Braid => checksum::NAME,
            Peer::GridFtp if c.checksum_offered("ADLER32") => "ADLER32",
            Peer::GridFtp => "MD5",
        }
    }

    /// None also under TLS: MODE E data connections are not encrypted yet, so a TLS session
    /// moves its data over one stream-mode connection, which is.
    pub fn of(c: &Control) -> Option<Peer> {
        match c.block_peer()? {
            // Under TLS only a braid server that protects MODE E connections too; others get
            // one TLS stream-mode connection (GridFTP servers protect data with GSI).
            _ if c.uses_tls() && !c.private_blocks() => None,
            BlockPeer::Braid { .. } => Some(Peer::Braid),
            BlockPeer::GridFtp => Some(Peer::GridFtp),
        }
    }
}

/// How long a reorder buffer may wait for a missing block, and how long a receiver waits for
/// a data connection.
pub const STALL: Duration = Duration::from_secs(120);

pub fn background_needs_braid() -> ClientError {
    ClientError::Usage(
        "--background needs a braid server at the other end (FEAT BRAID 2): it tells the sender its rate and times probes by the server's answers; use --rate-limit for a fixed cap".into(),
    )
}

/// Whether the server can let connections join, leave and break mid-transfer (FEAT
/// `BRAID 2`).
pub fn offers_elastic(c: &Control) -> bool {
    matches!(c.block_peer(), Some(BlockPeer::Braid { elastic: true }))
}
