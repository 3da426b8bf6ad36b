//! `braid get`, `put` and `ls`: a blocking FTP client. One thread per data connection is plenty
//! for a client and keeps the data path a plain read/write loop.
//!
//! A transfer is a local side ([`job`]: the partial file and its record, or the file sent), a
//! route chosen once per file ([`route`]: MODE E blocks in [`parallel`], ranges on several
//! sessions in [`segments`], or one connection in [`stream`]), and one supervision loop
//! ([`watch`]: progress, Ctrl-C, the route's steering). Around them: the control connection
//! ([`control`], [`wire`], [`trust`]), sessions ([`sessions`]), listings ([`listing`]), records
//! for `--resume` ([`records`]), what a transfer reports ([`summary`]), and whole trees
//! ([`tree`], with [`pipeline`] for small files many at a time, as many as [`inflight`] finds the
//! path holds).

mod block_get;
mod block_put;
mod bundle;
mod bundle_put;
mod channel;
mod connect_back;
pub(crate) mod control;
pub mod detour;
pub mod error;
mod gsi;
mod gsi_creds;
mod gsi_proxy;
mod inflight;
mod interrupt;
pub mod job;
mod listing;
pub mod names;
mod parallel;
mod peer;
mod pipeline;
mod plan;
mod probe;
mod records;
mod route;
mod segments;
mod sessions;
pub mod ssh;
mod stream;
mod stream_yield;
mod striped;
pub mod summary;
#[cfg(test)]
mod testing;
pub mod third_party;
mod tickets;
pub mod tree;
mod trust;
pub mod url;
mod verify;
mod watch;
pub mod ways;
pub mod wildcards;
pub(crate) mod wire;

pub use control::Control;
use error::{ClientError, Result};
pub use job::{Dest, part_path, resolve_dest};
use job::{Held, refuse_read_only};
pub use listing::{ListEntry, ls};
use route::{get_on, put_into_on, put_on};
use sessions::session;
use std::path::{Path, PathBuf};
pub use summary::{Batch, SenderSeen, Summary, display_url, human_bytes};
use url::Target;
pub use wire::client_config as tls_config;

/// Data-path buffer size: big reads and writes, few syscalls.
const BUF: usize = 1 << 20;

/// Options shared by the client commands.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub resume: bool,
    /// Show a progress bar (only ever on a terminal).
    pub progress: bool,
    /// Print the control dialogue on stderr.
    pub verbose: bool,
    /// Data connections for MODE E transfers (1 still uses MODE E's checksummed framing);
    /// None: braid chooses, and changes the count while the data moves (`-n auto`).
    pub streams: Option<u32>,
    /// Block size for MODE E (None: the default).
    pub block_size: Option<u64>,
    /// Fixed socket buffer size (None: kernel autotuning).
    pub buffer: Option<u64>,
    /// `--tls`: AUTH TLS before login, and PROT P data connections.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// `--schedule`: connection counts over the transfer (braid servers only).
    pub schedule: Option<crate::engine::hooks::Schedule>,
    /// `--rate-limit`: cap on the sending rate, bytes/s (the server's, for a download).
    pub rate_limit: Option<u64>,
    /// `--background`: yield to other traffic, adding at most this much queueing delay.
    pub background: Option<std::time::Duration>,
    /// `--congestion`: the TCP congestion control of the sending side's data connections
    /// (a braid server's, for a download).
    pub congestion: Option<braid_proto::retr_opts::CcName>,
    /// `--compress`: compressed MODE E blocks with a braid server that offers them.
    pub compress: braid_proto::compress::Policy,
    /// MODE E uploads end with EOD but without CLOSE, so the next upload of the session can
    /// use the same data connections (set for batches).
    pub keep_connections: bool,
    /// `--growing`: a download may go past the size the server announced (a file still being
    /// written); otherwise more than announced is an error.
    pub growing: bool,
    /// `braid cp`: sessions run over ssh to a one-shot braid on the far side.
    pub ssh: Option<ssh::Ssh>,
}

/// Downloads one file.
pub fn get(target: &Target, dest: &Dest, opts: &Options) -> Result<Summary> {
    refuse_read_only(dest)?;
    let mut c = session(target, opts, Some(&target.path))?;
    let s = get_on(&mut c, target, dest, opts)?;
    c.quit();
    Ok(s)
}

/// Downloads many files from one server in one session: one login, the settings sent once,
/// and in MODE E the data connections of one file carry the next (reply 125). Stops at the
/// first failure; what was done is reported through `done` as it completes.
pub fn get_batch(
    targets: &[(Target, Dest)],
    opts: &Options,
    mut done: impl FnMut(&Summary),
) -> Result<Batch> {
    let Some((first, _)) = targets.first() else {
        return Err(ClientError::Usage("no files to download".into()));
    };
    for (_, dest) in targets {
        refuse_read_only(dest)?;
    }
    let mut batch = Batch::start("get-batch");
    let mut c = session(first, opts, Some(&first.path))?;
    for (target, dest) in targets {
        if (&target.host, target.port, &target.user) != (&first.host, first.port, &first.user) {
            return Err(ClientError::Usage(format!(
                "{} is on another server than {}: one batch is one session",
                display_url(target),
                display_url(first)
            )));
        }
        let s = get_on(&mut c, target, dest, opts)?;
        batch.add(&s);
        done(&s);
    }
    c.quit();
    Ok(batch.finish())
}

/// Uploads one file. A URL ending in `/` names a directory: the file keeps its name.
pub fn put(local: &Path, target: &Target, opts: &Options) -> Result<Summary> {
    put_to(local, target, opts, false)
}

/// Uploads one file as `scp` and `cp` do ([`route::put_into_on`]).
pub fn put_into(local: &Path, target: &Target, opts: &Options) -> Result<Summary> {
    put_to(local, target, opts, true)
}

fn put_to(local: &Path, target: &Target, opts: &Options, into_directory: bool) -> Result<Summary> {
    if local == Path::new("-") {
        if target.path.is_empty() || target.path.ends_with('/') {
            return Err(ClientError::Usage(format!(
                "standard input has no name: give the remote file's, e.g. {}data.bin",
                display_url(target)
            )));
        }
        if opts.resume {
            return Err(ClientError::Usage(
                "--resume cannot continue standard input (what was sent is gone from it)".into(),
            ));
        }
    }
    let mut c = session(target, opts, None)?;
    let s = if local == Path::new("-") {
        stream::put_stdin(&mut c, target, opts)?
    } else {
        let put = if into_directory { put_into_on } else { put_on };
        put(&mut c, local, target, opts, Held::asked(opts))?
    };
    c.quit();
    Ok(s)
}

/// Uploads many files into one directory on one server in one session: one login, the
/// settings sent once, and in MODE E the data connections of one file carry the next. Stops
/// at the first failure; what was done is reported through `done` as it completes.
pub fn put_batch(
    locals: &[PathBuf],
    dir: &Target,
    opts: &Options,
    mut done: impl FnMut(&Summary),
) -> Result<Batch> {
    if !(dir.path.is_empty() || dir.path.ends_with('/')) {
        return Err(ClientError::Usage(format!(
            "{}: with several files the URL names a directory and ends with /",
            display_url(dir)
        )));
    }
    if locals.iter().any(|l| l == Path::new("-")) {
        return Err(ClientError::Usage(
            "standard input (-) is uploaded alone: braid put - ftp://host/path/name".into(),
        ));
    }
    let mut batch = Batch::start("put-batch");
    let mut c = session(dir, opts, None)?;
    let opts = Options {
        keep_connections: true,
        ..opts.clone()
    };
    for local in locals {
        let s = put_on(&mut c, local, dir, &opts, Held::asked(&opts))?;
        batch.add(&s);
        done(&s);
    }
    c.quit();
    Ok(batch.finish())
}
