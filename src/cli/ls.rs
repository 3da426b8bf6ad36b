//! `braid ls`: a remote directory's entries.

use super::options::{OutputArgs, TlsArgs, options};
use crate::client::error::exit;
use crate::client::{self, ListEntry, url};
use clap::Args;

#[derive(Args, Debug)]
pub struct LsArgs {
    /// ftp://[user[:password]@]host[:port]/path of the directory (or gsiftp://host/abs/path).
    url: String,
    /// Print the entries as one JSON array (name, type, size, modify).
    #[arg(long)]
    json: bool,
    /// Only errors on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// Show the control dialogue on stderr.
    #[arg(short, long, conflicts_with = "quiet")]
    verbose: bool,
    #[command(flatten)]
    tls: TlsArgs,
}

pub fn run(a: LsArgs) -> anyhow::Result<u8> {
    let out = OutputArgs {
        json: a.json,
        quiet: a.quiet,
        verbose: a.verbose,
    };
    let target = url::parse(&a.url, &url::CredentialSources::from_env())?;
    let entries = client::ls(&target, &options(&out, false, None, &a.tls)?)?;
    if a.json {
        println!("{}", serde_json::to_string(&entries)?);
        return Ok(exit::OK);
    }
    for e in &entries {
        println!("{}", line(e));
    }
    Ok(exit::OK)
}

/// One entry as `ls` shows it: the server's own line where it sent LIST, else type, size,
/// time (UTC) and name.
fn line(e: &ListEntry) -> String {
    if let Some(raw) = &e.raw {
        return raw.clone();
    }
    let when = e.modify.map(braid_proto::time::Civil::from_unix).map(|c| {
        format!(
            "{:04}-{:02}-{:02} {:02}:{:02}",
            c.year, c.month, c.day, c.hour, c.minute
        )
    });
    let kind = if e.kind.as_deref() == Some("dir") {
        "d"
    } else {
        "-"
    };
    format!(
        "{kind} {:>14} {:16} {}",
        e.size.map(|s| s.to_string()).unwrap_or_default(),
        when.unwrap_or_default(),
        e.name
    )
}
