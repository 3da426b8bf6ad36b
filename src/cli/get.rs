//! `braid get`: one file, a batch of files on one session, or whole trees (-r).

use super::options::Shared;
use super::report::{per_file, report, report_batch, report_tree};
use crate::client::error::ClientError;
use crate::client::{self, Options, url};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct GetArgs {
    /// ftp://[user[:password]@]host[:port]/path..., and last where to save [default: here].
    ///
    /// The destination: a file, a directory (a name ending in / is created), `-` for standard
    /// output, or /dev/null to measure (the data is still checked); without one, the remote
    /// file's name in the current directory. Several URLs (all on one server) share one
    /// session: one login, and in MODE E one file's data connections carry the next; the
    /// destination is then a directory, created if missing. `gsiftp://host[:port]/abs/path`
    /// logs in to a GridFTP server with your GSI credential (a proxy in X509_USER_PROXY or
    /// /tmp/x509up_u<uid>, else X509_USER_CERT and X509_USER_KEY; CAs in X509_CERT_DIR).
    #[arg(value_name = "URL", required_unless_present = "input")]
    args: Vec<String>,
    /// Read more URLs from this file, one per line (blank lines and # comments skipped).
    #[arg(short = 'i', long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Continue a partial download (DEST.part) from where it stopped.
    #[arg(long)]
    resume: bool,
    /// Take what comes past the size the server announced (a file still being written).
    ///
    /// Otherwise more than announced stops the download with an error (exit 8).
    #[arg(long)]
    growing: bool,
    #[command(flatten)]
    shared: Shared,
}

pub fn run(a: GetArgs) -> anyhow::Result<u8> {
    let (urls, dest) = get_args(a.args, a.input.as_deref())?;
    let opts = Options {
        growing: a.growing,
        ..a.shared.options(a.resume)?
    };
    let sources = url::CredentialSources::from_env();
    let targets = urls
        .iter()
        .map(|u| url::parse(u, &sources))
        .collect::<Result<Vec<_>, _>>()?;
    download(targets, dest.as_deref(), &opts, &a.shared)
}

/// Downloads `targets` (one server's) into `dest`: a tree each with -r, one file, or a batch
/// on one session; `braid cp`'s downloads too.
pub fn download(
    targets: Vec<url::Target>,
    dest: Option<&str>,
    opts: &Options,
    shared: &Shared,
) -> anyhow::Result<u8> {
    if shared.tree.recursive {
        let pairs = get_tree_tops(targets, dest)?;
        let s = client::tree::get_tree(&pairs, opts, shared.tree.options(), |s| {
            per_file(s, &shared.out)
        })?;
        return report_tree(&s, &shared.out);
    }
    if let [target] = targets.as_slice() {
        client::job::make_dest_dir(dest)?;
        let dest = client::resolve_dest(dest, &target.path)?;
        let summary = client::get(target, &dest, opts)?;
        return report(&summary, &shared.out, matches!(dest, client::Dest::Stdout));
    }
    let dir = batch_dir(dest)?;
    let mut jobs = Vec::new();
    for target in targets {
        let dest = client::resolve_dest(Some(&dir), &target.path)?;
        jobs.push((target, dest));
    }
    let batch = client::get_batch(&jobs, opts, |s| per_file(s, &shared.out))?;
    report_batch(&batch, &shared.out)
}

/// The directory a batch of downloads goes into: DEST, created if missing (as `get -r` does),
/// or the current directory.
fn batch_dir(dest: Option<&str>) -> anyhow::Result<String> {
    let dir = dest.unwrap_or(".").to_string();
    let path = Path::new(&dir);
    if path.exists() && !path.is_dir() {
        return Err(ClientError::Usage(format!(
            "{dir} is not a directory: with several URLs the destination is a directory"
        ))
        .into());
    }
    // A batch's destination is a directory, with or without its final /.
    client::job::make_dest_dir(Some(&format!("{}/", dir.trim_end_matches('/'))))?;
    Ok(dir)
}

/// Where each source of `get -r` goes: DEST/NAME (default: NAME here); the server's top
/// directory, which has no name, into DEST itself.
pub fn get_tree_tops(
    targets: Vec<url::Target>,
    dest: Option<&str>,
) -> anyhow::Result<Vec<(url::Target, PathBuf)>> {
    use ClientError::Usage;
    if matches!(dest, Some("-" | "/dev/null")) {
        return Err(Usage(
            "-r needs a directory to write into, not standard output or /dev/null".into(),
        )
        .into());
    }
    let dest = PathBuf::from(dest.unwrap_or("."));
    targets
        .into_iter()
        .map(|t| {
            let name = t
                .path
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or("");
            if name.is_empty() {
                return Ok((t, dest.clone()));
            }
            if let Some(why) = client::names::unsafe_name(name) {
                let url = client::display_url(&t);
                return Err(Usage(format!("{url}: the source's name is {why}")).into());
            }
            let top = dest.join(name);
            Ok((t, top))
        })
        .collect()
}

/// Splits `get`'s arguments into URLs and a destination: the last argument is the
/// destination when there are several and it is not a URL. `--input` adds URLs from a file.
pub fn get_args(
    mut args: Vec<String>,
    input: Option<&Path>,
) -> anyhow::Result<(Vec<String>, Option<String>)> {
    let is_url = url::is_url;
    let dest = match args.last() {
        Some(last) if !is_url(last) && (args.len() > 1 || input.is_some()) => args.pop(),
        _ => None,
    };
    if let Some(bad) = args.iter().find(|a| !is_url(a)) {
        return Err(ClientError::Usage(format!(
            "{bad:?} is not an ftp:// URL (only the last argument may be a destination)"
        ))
        .into());
    }
    if let Some(file) = input {
        let text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read the URL list {}: {e}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !is_url(line) {
                return Err(ClientError::Usage(format!(
                    "{}:{}: {line:?} is not an ftp:// URL",
                    file.display(),
                    n + 1
                ))
                .into());
            }
            args.push(line.to_string());
        }
    }
    if args.is_empty() {
        return Err(ClientError::Usage("no URL to download".into()).into());
    }
    Ok((args, dest))
}
