//! Third-party transfers between braid servers (`braid cp ftp://A/f ftp://B/f`): the file goes
//! from A to B directly, over MODE E data connections A opens to B; this side only drives the
//! two control connections and checks the checksums of both ends.
//!
//! Who may join is settled by TLS alone. B listens (EPSV) and takes data connections from any
//! address, but each must prove the binding of this side's control session with B (only this
//! side and B know it). This side passes that binding to A, with the SHA-256 of the
//! certificate B showed it, over A's own TLS control connection: A checks it reaches that B
//! and proves the binding. A stranger reaching B's port proves nothing; a PORT to anyone but
//! the client stays refused without this (FTP bounce).

use super::Options;
use super::error::{ClientError, Result};
use super::sessions::session;
use super::url::Target;
use braid_proto::checksum;
use braid_proto::client::{BlockSetup, Direction, Op};
use braid_proto::command::Command;
use braid_proto::retr_opts::RetrOpts;
use std::time::Instant;

/// Data connections A opens to B when `-n` does not say.
const STREAMS: u32 = 4;

/// What a third-party copy did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Copied {
    pub bytes: u64,
    pub seconds: f64,
    pub streams: u32,
    /// Both servers' checksum of the file (they agreed).
    pub checksum: String,
    pub algorithm: &'static str,
}

/// Copies `src` (on server A) to `dst` (on server B), A sending to B.
pub fn copy(src: &Target, dst: &Target, opts: &Options) -> Result<Copied> {
    if opts.tls.is_none() {
        return Err(ClientError::Usage(
            "a copy between two servers needs TLS on both (ftps:// or --tls): the data \
             connections between them prove through it that they belong to this copy"
                .into(),
        ));
    }
    let mut a = session(src, opts, Some(&src.path))?;
    let mut b = session(dst, opts, None)?;
    for (c, t) in [(&a, src), (&b, dst)] {
        if !c.has_feature("BRAID-PEER") || !c.private_blocks() {
            return Err(ClientError::Usage(format!(
                "{}:{} does not take part in copies between servers (it lists no FEAT \
                 BRAID-PEER): it is not a braid server, or its admin turned them off \
                 (--no-third-party); copy through this machine with get and put instead",
                t.host, t.port
            )));
        }
    }
    let size = a.size(&src.path)?;
    let bytes = match size.code {
        213 => size.text().trim().parse::<u64>().ok(),
        _ => None,
    }
    .ok_or_else(|| ClientError::Remote {
        what: format!("SIZE {}", src.path),
        reply: size.clone(),
    })?;
    let streams = opts.streams.unwrap_or(STREAMS).max(1);
    let block = |direction, retr| {
        Op::BlockMode(BlockSetup {
            direction,
            retr,
            buffer: opts.buffer,
            compress: None,
        })
    };
    a.run(block(
        Direction::Download,
        RetrOpts {
            parallelism: Some((streams, streams, streams)),
            max_rate: opts.rate_limit,
            ..RetrOpts::default()
        },
    ))?;
    b.run(block(Direction::Upload, RetrOpts::default()))?;
    b.expect(&Command::Opts("BRAID PEER=*".into()), &[200])?;
    let there = b.passive_addr()?.target;
    let (Some(certificate), Some(binding)) = (b.server_certificate(), b.binding()) else {
        return Err(ClientError::Tls(format!(
            "{}: no TLS session to bind the data connections to",
            dst.host
        )));
    };
    a.expect(
        &Command::Opts(format!(
            "BRAID PEER={}:{}",
            hex(&certificate),
            hex(&binding.to_bytes())
        )),
        &[200],
    )?;
    a.expect(&Command::Eprt(there), &[200])?;
    let started = Instant::now();
    b.start_transfer(&Command::Stor(dst.path.clone()))?;
    a.start_transfer(&Command::Retr(src.path.clone()))?;
    let sent = a.final_reply()?;
    let taken = b.final_reply()?;
    let seconds = started.elapsed().as_secs_f64();
    for (reply, what) in [(&sent, "sending"), (&taken, "receiving")] {
        if reply.code / 100 != 2 {
            return Err(ClientError::Remote {
                what: format!("the {what} server"),
                reply: reply.clone(),
            });
        }
    }
    let algorithm = checksum::NAME;
    let ends = [
        a.checksum(algorithm, &src.path)?,
        b.checksum(algorithm, &dst.path)?,
    ];
    let [Some(from), Some(to)] = ends else {
        return Err(ClientError::Integrity(
            "a server gave no checksum of the file: the copy is unchecked".into(),
        ));
    };
    if from != to {
        return Err(ClientError::Integrity(format!(
            "{} on {} has checksum {from}, the copy on {} {to}: the copy is damaged",
            src.path, src.host, dst.host
        )));
    }
    a.quit();
    b.quit();
    Ok(Copied {
        bytes,
        seconds,
        streams,
        checksum: to,
        algorithm,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
