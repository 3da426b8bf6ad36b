//! `braid put`: one file, standard input, a batch of files on one session, or whole trees
//! (-r).

use super::options::Shared;
use super::report::{per_file, report, report_batch, report_tree};
use crate::client::error::ClientError;
use crate::client::{self, url};
use anyhow::Context;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct PutArgs {
    /// The files to upload, then ftp://[user[:password]@]host[:port]/path.
    ///
    /// A URL path ending in / names a directory: the files keep their names there. Several
    /// files share one session: one login, and in MODE E one file's data connections carry
    /// the next; the URL then names a directory (ends in /). `-` uploads standard input
    /// (alone, over one connection; the URL names the file). `gsiftp://host/abs/path` logs
    /// in with your GSI credential, as `braid get --help` says.
    #[arg(required = true, value_name = "FILE... URL")]
    args: Vec<String>,
    /// Continue an interrupted upload from what the server already holds.
    #[arg(long)]
    resume: bool,
    #[command(flatten)]
    shared: Shared,
}

pub fn run(a: PutArgs) -> anyhow::Result<u8> {
    let (files, url) = files_and_url(a.args)?;
    let target = url::parse(&url, &url::CredentialSources::from_env())?;
    let opts = a.shared.options(a.resume)?;
    upload(&files, &target, &opts, &a.shared)
}

/// Uploads `files` to `target`: a tree each with -r, one file, or a batch on one session.
pub fn upload(
    files: &[PathBuf],
    target: &url::Target,
    opts: &client::Options,
    shared: &Shared,
) -> anyhow::Result<u8> {
    send(files, target, opts, shared, client::put)
}

/// `braid cp`'s uploads: as `put`'s, except that a destination the far side holds as a
/// directory takes the files into it with or without its final `/`, as scp and cp do
/// (several files always go into one).
pub fn copy_up(
    files: &[PathBuf],
    target: &url::Target,
    opts: &client::Options,
    shared: &Shared,
) -> anyhow::Result<u8> {
    let mut dir = target.clone();
    if files.len() > 1 && !(dir.path.is_empty() || dir.path.ends_with('/')) {
        dir.path.push('/');
    }
    send(files, &dir, opts, shared, client::put_into)
}

/// Uploads `files` as [`upload`] says, a single file by `one` (`put`'s way or `cp`'s).
fn send(
    files: &[PathBuf],
    target: &url::Target,
    opts: &client::Options,
    shared: &Shared,
    one: fn(&Path, &url::Target, &client::Options) -> client::error::Result<client::Summary>,
) -> anyhow::Result<u8> {
    if shared.tree.recursive {
        let pairs = put_tree_tops(files, target)?;
        let s = client::tree::put_tree(&pairs, opts, shared.tree.options(), |s| {
            per_file(s, &shared.out)
        })?;
        return report_tree(&s, &shared.out);
    }
    if let [file] = files {
        let summary = one(file, target, opts)?;
        return report(&summary, &shared.out, false);
    }
    let batch = client::put_batch(files, target, opts, |s| per_file(s, &shared.out))?;
    report_batch(&batch, &shared.out)
}

/// Splits `put`'s arguments into the files and the URL, which comes last.
fn files_and_url(mut args: Vec<String>) -> anyhow::Result<(Vec<PathBuf>, String)> {
    let is_url = url::is_url;
    let url = match args.pop() {
        Some(last) if is_url(&last) => last,
        Some(last) => {
            return Err(ClientError::Usage(format!(
                "the URL is missing: {last:?} is not an ftp:// URL (braid put FILE... ftp://host/path)"
            ))
            .into());
        }
        None => return Err(ClientError::Usage("nothing to upload".into()).into()),
    };
    if args.is_empty() {
        return Err(ClientError::Usage(format!(
            "no file to upload to {url}: braid put FILE... ftp://host/path (- for standard input)"
        ))
        .into());
    }
    if let Some(u) = args.iter().find(|a| is_url(a)) {
        return Err(ClientError::Usage(format!(
            "{u}: put takes one URL, after the files (braid put FILE... URL)"
        ))
        .into());
    }
    Ok((args.into_iter().map(PathBuf::from).collect(), url))
}

/// Where each source of `put -r` goes: URL/NAME, the URL naming a directory (with or without
/// its final /).
pub fn put_tree_tops(
    files: &[PathBuf],
    target: &url::Target,
) -> anyhow::Result<Vec<(PathBuf, url::Target)>> {
    use ClientError::Usage;
    files
        .iter()
        .map(|f| {
            if f == Path::new("-") {
                return Err(Usage(
                    "-r cannot read standard input (-): put it alone, without -r".into(),
                )
                .into());
            }
            let full =
                std::fs::canonicalize(f).with_context(|| format!("cannot read {}", f.display()))?;
            let name = full.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
                Usage(format!(
                    "{} has no name to give it on the server",
                    f.display()
                ))
            })?;
            let mut top = target.clone();
            if !(top.path.is_empty() || top.path.ends_with('/')) {
                top.path.push('/');
            }
            top.path.push_str(name);
            Ok((f.clone(), top))
        })
        .collect()
}
