//! What the client prints when a transfer ends: a line for people on stderr (unless -q), or
//! JSON on stdout (--json), and the exit code.

use super::options::OutputArgs;
use crate::client;
use crate::client::error::exit;
use std::io::IsTerminal;

/// One file of a batch done: a JSON line, or a line of text with -v.
pub fn per_file(s: &client::Summary, out: &OutputArgs) {
    if out.json {
        println!("{}", serde_json::to_string(s).unwrap_or_default());
    } else if out.verbose {
        eprintln!("braid: {}", s.human());
    }
}

/// `N files, SIZE in S s (RATE/s)`: what a batch or a tree moved, for people.
fn moved(files: u64, bytes: u64, seconds: f64, bytes_per_second: f64) -> String {
    format!(
        "{files} files, {} in {seconds:.2} s ({}/s)",
        client::human_bytes(bytes as f64),
        client::human_bytes(bytes_per_second)
    )
}

/// The end of a batch: a last JSON line, or one line of text.
pub fn report_batch(batch: &client::Batch, out: &OutputArgs) -> anyhow::Result<u8> {
    if out.json {
        println!("{}", serde_json::to_string(batch)?);
    } else if !out.quiet {
        eprintln!(
            "braid: {}, one session, {} data connection(s)",
            moved(
                batch.files,
                batch.bytes,
                batch.seconds,
                batch.bytes_per_second
            ),
            batch.data_connections
        );
    }
    Ok(exit::OK)
}

/// The end of a tree transfer: its summary (a JSON line, or text with every failure), and the
/// exit code that says whether every file made it.
pub fn report_tree(s: &client::tree::TreeSummary, out: &OutputArgs) -> anyhow::Result<u8> {
    if out.json {
        println!("{}", serde_json::to_string(s)?);
        return Ok(s.exit_code());
    }
    if !out.quiet {
        eprintln!(
            "braid: {}{}, {} director{}, {} session(s){}",
            moved(s.files, s.bytes, s.seconds, s.bytes_per_second),
            if s.up_to_date > 0 {
                format!(", {} already up to date", s.up_to_date)
            } else {
                String::new()
            },
            s.directories,
            if s.directories == 1 { "y" } else { "ies" },
            s.sessions,
            match s.stopped_by {
                Some(cause) =>
                    format!("; stopped by {cause}: run again with --update to move the rest"),
                None => String::new(),
            },
        );
        for k in &s.skipped {
            eprintln!("braid: skipped {}: {}", k.path, k.why);
        }
    }
    for f in &s.failed {
        eprintln!("braid: failed {}: {}", f.path, f.error);
    }
    if !s.failed.is_empty() {
        eprintln!(
            "braid: {} of {} failed",
            s.failed.len(),
            s.failed.len() as u64 + s.files + s.up_to_date
        );
    }
    Ok(s.exit_code())
}

pub fn report(
    summary: &client::Summary,
    out: &OutputArgs,
    data_on_stdout: bool,
) -> anyhow::Result<u8> {
    if out.json {
        let line = serde_json::to_string(summary)?;
        if data_on_stdout {
            eprintln!("{line}")
        } else {
            println!("{line}")
        }
    } else if !out.quiet && std::io::stderr().is_terminal() {
        eprintln!("braid: {}", summary.human());
    }
    Ok(exit::OK)
}
