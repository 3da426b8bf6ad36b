//! `braid cp`: scp's syntax, braid's transfers. The user's ssh starts a one-shot braid on the
//! far side (`braid serve --stdio`); the dialogue runs over ssh's channel and the data over
//! braid's own parallel connections, TLS with the certificate the far side named over ssh.

use super::get::download;
use super::options::Shared;
use super::put::copy_up;
use crate::client::detour::Detour;
use crate::client::error::ClientError;
use crate::client::ssh::{Ssh, control_path, parse_remote};
use crate::client::url::Target;
use crate::client::wildcards;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Sources, then the destination: local paths or [user@]host:path as scp takes them.
    ///
    /// host:path is relative to the home directory there, host:/path absolute. Either all
    /// sources are on one host and the destination is here (a download), or the sources are
    /// here and the destination is on a host (an upload). As with scp, a destination that is
    /// a directory takes the files under their own names, with or without its final /;
    /// `host:~/path` is the home's, and a remote wildcard (`'host:logs/*.gz'`, quoted for
    /// the local shell) fetches every file there whose name it matches (with -r,
    /// directories too).
    ///
    /// Or two braid servers, `ftp://A/path ftp://B/path` (with --tls): A sends the file
    /// straight to B over TLS data connections only B's session can accept; this machine
    /// drives both and checks both ends' checksums. A destination ending in / takes the
    /// source's name. With -r the destination's missing parents are made, and a tree's files
    /// of up to 64 MiB go many to a transfer (bundles). Two GridFTP servers under GSI,
    /// `gsiftp://A/path gsiftp://B/path`, the same way.
    ///
    /// Or a server and here: `ftp://host/f .` downloads and `f ftp://host/dir` uploads, as
    /// get and put do (`gsiftp://` too), into a directory as above.
    #[arg(required = true, num_args = 2.., value_names = ["SRC", "DEST"])]
    args: Vec<String>,
    /// Continue an interrupted transfer from where it stopped.
    #[arg(long)]
    resume: bool,
    /// The remote shell, with its options: `-e "ssh -p 2222"`.
    #[arg(
        short = 'e',
        long = "ssh",
        value_name = "COMMAND",
        default_value = "ssh"
    )]
    ssh: String,
    /// The braid to run on the far side (found on the PATH ssh gives commands).
    #[arg(long, value_name = "PATH", default_value = "braid")]
    remote_braid: String,
    #[command(flatten)]
    shared: Shared,
}

pub fn run(a: CpArgs) -> anyhow::Result<u8> {
    use crate::client::url::is_url;
    if a.args.iter().all(|s| is_url(s)) {
        return between_servers(&a);
    }
    if a.args.iter().any(|s| is_url(s)) {
        return with_a_server(&a);
    }
    if a.shared.tls.tls || a.shared.tls.tls_ca.is_some() {
        return Err(ClientError::Usage(
            "--tls is for ftp:// servers; braid cp encrypts by itself, with keys it learns \
             over ssh"
                .into(),
        )
        .into());
    }
    let program: Vec<String> = a.ssh.split_whitespace().map(str::to_string).collect();
    if program.is_empty() {
        return Err(ClientError::Usage("--ssh needs a command, e.g. ssh".into()).into());
    }
    // OpenSSH shares one connection among a transfer's sessions, through a socket in a
    // directory of this run's own (removed at the end).
    let is_openssh = std::path::Path::new(&program[0])
        .file_name()
        .is_some_and(|n| n == "ssh");
    let sharing = if is_openssh {
        let dir = tempfile::Builder::new()
            .prefix("braid-ssh-")
            .tempdir()
            .map_err(|e| anyhow::anyhow!("cannot make a directory for ssh's socket: {e}"))?;
        Some(dir)
    } else {
        None
    };
    let mut args = a.args;
    let dest = args.pop().unwrap_or_default();
    let ssh = |destination: String, host: &str| -> anyhow::Result<Ssh> {
        let shared_connection = sharing.as_ref().map(|d| d.path().to_path_buf());
        let detour = shared_connection.as_ref().map(|dir| {
            Arc::new(Detour::new(
                &program,
                control_path(dir),
                &destination,
                &a.remote_braid,
                crate::client::ways::file(),
            ))
        });
        Ok(Ssh {
            data_host: Ssh::data_host(&program, host)?,
            program: program.clone(),
            destination,
            remote_braid: a.remote_braid.clone(),
            shared_connection,
            detour,
        })
    };
    let base = a.shared.options(a.resume)?;
    match parse_remote(&dest) {
        Some((destination, host, path)) => {
            if let Some(r) = args.iter().find(|s| parse_remote(s).is_some()) {
                return Err(ClientError::Usage(format!(
                    "{r} and {dest} are both remote: braid cp copies between here and one host"
                ))
                .into());
            }
            let files: Vec<PathBuf> = args.iter().map(PathBuf::from).collect();
            let opts = crate::client::Options {
                ssh: Some(ssh(destination, &host)?),
                ..base
            };
            copy_up(&files, &far(host, path), &opts, &a.shared)
        }
        None => {
            let mut targets = Vec::new();
            let mut on: Option<(String, String)> = None;
            for arg in &args {
                let Some((destination, host, path)) = parse_remote(arg) else {
                    return Err(ClientError::Usage(format!(
                        "{arg} and {dest} are both here: braid cp copies between here and one \
                         host ([user@]host:path); use cp for local copies"
                    ))
                    .into());
                };
                if on.as_ref().is_some_and(|(d, _)| *d != destination) {
                    return Err(ClientError::Usage(format!(
                        "{arg} is on another host than the first source: one braid cp reaches one host"
                    ))
                    .into());
                }
                on = Some((destination, host.clone()));
                targets.push(far(host, path));
            }
            let ssh = match on {
                Some((destination, host)) => Some(ssh(destination, &host)?),
                None => None,
            };
            let opts = crate::client::Options { ssh, ..base };
            let sources = wildcards::expand(targets, &opts, a.shared.tree.recursive)?;
            download(sources, Some(&dest), &opts, &a.shared)
        }
    }
}

/// `braid cp ftp://host/f .` and `braid cp f ftp://host/dir/`: a download or an upload, as
/// `get` and `put` do them (the URL may be `gsiftp://`).
fn with_a_server(a: &CpArgs) -> anyhow::Result<u8> {
    use crate::client::url::{CredentialSources, is_url, parse};
    let [sources @ .., dest] = a.args.as_slice() else {
        return Err(ClientError::Usage("braid cp needs a source and a destination".into()).into());
    };
    let mixed = || {
        ClientError::Usage(
            "braid cp copies between here and servers (URLs) or between here and one ssh host \
             (host:path), each command one way: give local paths on the other side"
                .into(),
        )
    };
    let local = |s: &String| !is_url(s) && parse_remote(s).is_none();
    let opts = a.shared.options(a.resume)?;
    let creds = CredentialSources::from_env();
    if is_url(dest) {
        if !sources.iter().all(local) {
            return Err(mixed().into());
        }
        let files: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
        return copy_up(&files, &parse(dest, &creds)?, &opts, &a.shared);
    }
    if !local(dest) || !sources.iter().all(|s| is_url(s)) {
        return Err(mixed().into());
    }
    let targets = sources
        .iter()
        .map(|u| parse(u, &creds))
        .collect::<Result<Vec<_>, _>>()?;
    download(targets, Some(dest), &opts, &a.shared)
}

/// `braid cp ftp://A/f ftp://B/g`: A sends the file straight to B; with -r a directory and
/// everything in it.
fn between_servers(a: &CpArgs) -> anyhow::Result<u8> {
    use crate::client::third_party::Peers;
    let [src, dst] = a.args.as_slice() else {
        return Err(ClientError::Usage(
            "a copy between servers takes one source URL and one destination URL".into(),
        )
        .into());
    };
    let sources = crate::client::url::CredentialSources::from_env();
    let src = crate::client::url::parse(src, &sources)?;
    let mut dst = crate::client::url::parse(dst, &sources)?;
    // A destination that names a directory takes the source's name (a tree: the source's
    // directory goes under it, as with get -r; the server's top directory has no name).
    let name = src
        .path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    if dst.path.is_empty() || dst.path.ends_with('/') {
        dst.path = format!("{}{name}", dst.path);
    }
    let opts = a.shared.options(false)?;
    let out = &a.shared.out;
    let mut peers = Peers::open(&src, &dst, &opts)?;
    let place = |t: &crate::client::url::Target, path: &str| {
        format!("{}:{}/{}", t.host, t.port, path.trim_start_matches('/'))
    };
    if a.shared.tree.recursive {
        let done = peers.copy_tree(&src.path, &dst.path, a.shared.tree.update, a.resume)?;
        peers.quit();
        let bytes: u64 = done.files.iter().map(|f| f.bytes).sum();
        if out.json {
            let v = serde_json::json!({
                "op": "cp-tree",
                "route": "third-party",
                "source": place(&src, &src.path),
                "destination": place(&dst, &dst.path),
                "bytes": bytes,
                "seconds": done.seconds,
                "files": done.files,
                "skipped": done.skipped,
                "failed": done.failed.iter().map(|(f, why)| serde_json::json!({"file": f, "error": why})).collect::<Vec<_>>(),
                "directories_made": done.directories_made,
            });
            println!("{v}");
        } else if !out.quiet {
            eprintln!(
                "{} → {}: {} files, {} bytes in {:.1} s, sent server to server; {} skipped, {} failed",
                place(&src, &src.path),
                place(&dst, &dst.path),
                done.files.len(),
                bytes,
                done.seconds,
                done.skipped.len(),
                done.failed.len()
            );
            for (f, why) in &done.failed {
                eprintln!("  failed: {f}: {why}");
            }
        }
        return Ok(if done.failed.is_empty() { 0 } else { 11 });
    }
    let source = peers.source(&src.path)?;
    let done = peers.copy(&src.path, &dst.path, source, a.resume)?;
    peers.quit();
    if out.json {
        let v = serde_json::json!({
            "op": "cp",
            "route": "third-party",
            "source": place(&src, &src.path),
            "destination": place(&dst, &dst.path),
            "bytes": done.bytes,
            "resumed_from": done.resumed_from,
            "seconds": done.seconds,
            "streams": done.streams,
            "tuning": done.tuning,
            "checksum": { "algorithm": done.algorithm, "value": done.checksum },
        });
        println!("{v}");
    } else if !out.quiet {
        let moved = done.bytes - done.resumed_from;
        let resumed = match done.resumed_from {
            0 => String::new(),
            n => format!(" (resumed: {n} were there already)"),
        };
        eprintln!(
            "{} → {}: {moved} bytes{resumed} in {:.1} s ({:.1} MB/s), sent server to server on {} connections; {} {} at both ends",
            place(&src, &src.path),
            place(&dst, &dst.path),
            done.seconds,
            moved as f64 / done.seconds.max(1e-9) / 1e6,
            done.streams,
            done.algorithm,
            done.checksum
        );
    }
    Ok(0)
}

/// The far side's file as a session target: its one-shot server takes anonymous logins,
/// ssh having authenticated the user; port 0, as no port of the far side's is reached for the
/// dialogue (and summaries show `host:path`).
fn far(host: String, path: String) -> Target {
    Target {
        gsi: false,
        host,
        port: 0,
        user: "anonymous".into(),
        password: String::new(),
        path,
    }
}
