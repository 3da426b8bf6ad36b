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

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::testing::{Script, done, scripted};
    use super::super::url::Target;

    /// A session logged in to a scripted server (login, FEAT, TYPE I).
    fn logged_in(script: &'static [u8]) -> (Control, Script) {
        let (mut c, server) = scripted(script);
        let target = Target {
            gsi: false,
            host: "127.0.0.1".into(),
            port: 21,
            user: "anonymous".into(),
            password: "x".into(),
            path: String::new(),
        };
        c.start(&target, None).unwrap();
        (c, server)
    }

    #[test]
    fn a_braid_server_is_checked_with_xxh3_and_a_gridftp_server_with_adler32_where_offered() {
        let (braid, s1) = logged_in(
            b"331 p\r\n230 in\r\n211-Features:\r\n PARALLEL\r\n BRAID 3\r\n211 End\r\n200 I\r\n",
        );
        assert_eq!(Peer::of(&braid), Some(Peer::Braid));
        assert!(offers_elastic(&braid));
        assert_eq!(Peer::Braid.checksum(&braid), checksum::NAME);
        let (gridftp, s2) = logged_in(
            b"331 p\r\n230 in\r\n211-Features:\r\n PARALLEL\r\n CKSM MD5;ADLER32;CRC32\r\n211 End\r\n200 I\r\n",
        );
        assert_eq!(Peer::of(&gridftp), Some(Peer::GridFtp));
        assert!(!offers_elastic(&gridftp));
        assert_eq!(Peer::GridFtp.checksum(&gridftp), "ADLER32");
        let (md5_only, s3) = logged_in(
            b"331 p\r\n230 in\r\n211-Features:\r\n PARALLEL\r\n CKSM MD5\r\n211 End\r\n200 I\r\n",
        );
        assert_eq!(Peer::GridFtp.checksum(&md5_only), "MD5");
        let (plain, s4) =
            logged_in(b"331 p\r\n230 in\r\n211-Features:\r\n REST STREAM\r\n211 End\r\n200 I\r\n");
        assert_eq!(Peer::of(&plain), None, "no MODE E: the stream route");
        for (c, s) in [(braid, s1), (gridftp, s2), (md5_only, s3), (plain, s4)] {
            assert!(done(c, s).starts_with("USER anonymous\r\nPASS x\r\nFEAT\r\nTYPE I\r\n"));
        }
    }
}
