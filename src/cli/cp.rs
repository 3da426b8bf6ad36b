//! `braid cp`: scp's syntax, braid's transfers. The user's ssh starts a one-shot braid on the
//! far side (`braid serve --stdio`); the dialogue runs over ssh's channel and the data over
//! braid's own parallel connections, TLS with the certificate the far side named over ssh.

use super::get::download;
use super::options::Shared;
use super::put::upload;
use crate::client::detour::Detour;
use crate::client::error::ClientError;
use crate::client::ssh::{Ssh, control_path, parse_remote};
use crate::client::url::Target;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Sources, then the destination: local paths or [user@]host:path as scp takes them.
    ///
    /// host:path is relative to the home directory there, host:/path absolute. Either all
    /// sources are on one host and the destination is here (a download), or the sources are
    /// here and the destination is on a host (an upload).
    ///
    /// Or two braid servers, `ftp://A/path ftp://B/path` (with --tls): A sends the file
    /// straight to B over TLS data connections only B's session can accept; this machine
    /// drives both and checks both ends' checksums. A destination ending in / takes the
    /// source's name.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DEST")]
    args: Vec<String>,
    /// Continue an interrupted transfer from where it stopped.
    #[arg(long)]
    resume: bool,
    /// The remote shell, with its options: `-e "ssh -p 2222"` [default: ssh].
    #[arg(
        short = 'e',
        long = "ssh",
        value_name = "COMMAND",
        default_value = "ssh"
    )]
    ssh: String,
    /// The braid to run on the far side [default: braid, on the PATH ssh gives commands].
    #[arg(long, value_name = "PATH", default_value = "braid")]
    remote_braid: String,
    #[command(flatten)]
    shared: Shared,
}

pub fn run(a: CpArgs) -> anyhow::Result<u8> {
    if a.args.iter().all(|s| s.starts_with("ftp://")) {
        return between_servers(&a);
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
            upload(&files, &far(host, path), &opts, &a.shared)
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
            download(targets, Some(&dest), &opts, &a.shared)
        }
    }
}

/// `braid cp ftp://A/f ftp://B/g`: A sends the file straight to B.
fn between_servers(a: &CpArgs) -> anyhow::Result<u8> {
    let [src, dst] = a.args.as_slice() else {
        return Err(ClientError::Usage(
            "a copy between servers takes one source URL and one destination URL".into(),
        )
        .into());
    };
    if a.shared.tree.recursive || a.resume {
        return Err(ClientError::Usage(
            "-r and --resume are not available yet for copies between servers".into(),
        )
        .into());
    }
    let sources = crate::client::url::CredentialSources::from_env();
    let src = crate::client::url::parse(src, &sources)?;
    let mut dst = crate::client::url::parse(dst, &sources)?;
    // A destination that names a directory takes the source's name.
    if dst.path.is_empty() || dst.path.ends_with('/') {
        let name = src.path.rsplit('/').next().unwrap_or_default();
        dst.path.push_str(name);
    }
    let opts = a.shared.options(false)?;
    let done = crate::client::third_party::copy(&src, &dst, &opts)?;
    if a.shared.out.json {
        let v = serde_json::json!({
            "source": format!("{}:{}/{}", src.host, src.port, src.path),
            "destination": format!("{}:{}/{}", dst.host, dst.port, dst.path),
            "route": "third-party",
            "bytes": done.bytes,
            "seconds": done.seconds,
            "streams": done.streams,
            "checksum": { "algorithm": done.algorithm, "value": done.checksum },
        });
        println!("{v}");
    } else if !a.shared.out.quiet {
        eprintln!(
            "{} → {}: {} bytes in {:.1} s ({:.1} MB/s), sent server to server on {} connections; {} {} at both ends",
            src.path,
            dst.host,
            done.bytes,
            done.seconds,
            done.bytes as f64 / done.seconds.max(1e-9) / 1e6,
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
        host,
        port: 0,
        user: "anonymous".into(),
        password: String::new(),
        path,
    }
}
