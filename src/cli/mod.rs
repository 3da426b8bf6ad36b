//! The command line: parse, validate, dispatch, map failures to exit codes. Every subcommand
//! has the same shape: its arguments (a clap `Args` struct) and a `run` that returns the exit
//! code, in a module of its own here or in the part of braid it drives.

mod cp;
mod get;
mod logging;
mod ls;
mod options;
mod passwd;
mod put;
mod report;
mod serve;

use crate::client::error::{ClientError, exit};
use crate::server::settings::ServeArgs;
use crate::units::parse_size;
use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  other error
  2  usage error (bad arguments or URL)
  3  cannot connect to the server
  4  login refused
  5  the server refused the request (no such file, permission denied, ...)
  6  local file error (cannot read or write, disk full)
  7  transfer interrupted (partial download kept as DEST.part: rerun with --resume)
  8  integrity check failed (size or checksum mismatch)
  9  protocol error (not an FTP server, or a reply that makes no sense)
  10 TLS failed (handshake refused, certificate not trusted)
  11 some files of a recursive transfer (-r) failed; the others were moved, and the
     summary lists each failure with its cause

Credentials: ftp://user:password@host/path, or the password from BRAID_PASSWORD, or a
~/.netrc entry for the host (login and password). Without a user, braid logs in anonymously.";

#[derive(Parser, Debug)]
#[command(
    name = "braid",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("BRAID_COMMIT"), ")"),
    about = "Move large files fast over long, fat, slow or lossy networks",
    long_about = "braid is an FTP-compatible server and client built to move large files fast.\n\
                  Start with `braid demo` to see a verified transfer on loopback.",
    after_help = "`braid COMMAND -h` for a command's options in short, --help for all of it.",
    after_long_help = EXIT_CODES
)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve a directory over FTP (anonymous and read-only unless told otherwise).
    Serve(Box<ServeArgs>),
    /// Download files: braid get ftp://host/path [DEST], or many: braid get URL... DIR
    #[command(after_long_help = EXIT_CODES)]
    Get(get::GetArgs),
    /// Upload files: braid put FILE... ftp://host/path (a path ending in / keeps the names)
    #[command(after_long_help = EXIT_CODES)]
    Put(put::PutArgs),
    /// Copy over ssh, as scp does: braid cp host:path DEST, braid cp FILE... host:path
    ///
    /// Your ssh starts a one-shot braid on the far side (braid serve --stdio); the dialogue
    /// runs over ssh's channel, the data over braid's own parallel connections, each TLS with
    /// the certificate the far side named over ssh (no CA, nothing to set up), with braid's
    /// tuning, checksums and resume. Where a firewall blocks the far side's data ports, the
    /// far side connects back, or else the data goes through ssh's channel (-v says which).
    #[command(after_long_help = EXIT_CODES, override_usage = "braid cp [OPTIONS] SRC... DEST")]
    Cp(cp::CpArgs),
    /// List a remote directory.
    #[command(after_long_help = EXIT_CODES)]
    Ls(ls::LsArgs),
    /// Add or replace an account in a users file for `braid serve --users`.
    ///
    /// The password is read from the terminal (twice) or, when not on a terminal, from the
    /// first line of stdin.
    Passwd(passwd::PasswdArgs),
    /// Throughput, retransmissions, RTT and windows per TCP connection from a pcap file.
    Trace(crate::trace::TraceArgs),
    /// The link emulator: two network namespaces joined by an emulated link (needs root).
    #[command(subcommand)]
    Lab(Box<crate::lab::LabCmd>),
    /// Predict throughput and transfer time on a path, and say which limit binds.
    ///
    /// From the published models: window, slow start with N connections, loss, N-stream
    /// sharing, echo.
    Model(Box<crate::model::ModelArgs>),
    /// Measure transfers on emulated links, loopback or a server, with statistics and plots.
    ///
    /// A sweep over scenarios, streams, buffers, block sizes, directions and tools, each cell
    /// repeated in shuffled rounds, with ping across the link during every run, statistics,
    /// the model's prediction beside each cell, and JSON, CSV, Markdown and SVG results (root
    /// for the lab; --loopback and --url need none).
    Bench(Box<crate::bench::BenchArgs>),
    /// Print a shell completion script, e.g. `braid completions bash`.
    ///
    /// `braid completions bash > /etc/bash_completion.d/braid` (zsh: into a directory on
    /// $fpath as `_braid`).
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff), or write one per subcommand into a directory.
    ///
    /// `braid man > /usr/local/share/man/man1/braid.1`; with a directory, a page for braid and
    /// one for each subcommand there.
    Man {
        /// Where to write braid.1, braid-get.1, ...
        dir: Option<PathBuf>,
    },
    /// Run a loopback server, download a generated file from it, verify it and print the rate.
    Demo(DemoArgs),
    /// The far side's data connections towards a braid cp client that it can reach but that
    /// cannot reach it; braid cp runs this through ssh.
    #[command(hide = true)]
    ConnectBack,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Size of the generated file, e.g. 256MiB, 1GiB, 1000000.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    size: u64,
}

pub fn main() -> ExitCode {
    // A write past the file size limit (`ulimit -f`) then fails with EFBIG, which fails that
    // file alone with a message, instead of SIGXFSZ killing the process and every other
    // transfer with it (a client's tree, a server's sessions).
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = e
                .downcast_ref::<ClientError>()
                .map_or(exit::OTHER, ClientError::exit_code);
            eprintln!("braid: error: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// Writes generated text to stdout; a reader that stops early (`| head`) is not an error.
fn print_all(bytes: &[u8]) -> anyhow::Result<u8> {
    use std::io::Write;
    match std::io::stdout().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(exit::OK),
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Cmd::Serve(args) => serve::run(*args).map(|()| exit::OK),
        Cmd::Get(args) => get::run(args),
        Cmd::Put(args) => put::run(args),
        Cmd::Cp(args) => cp::run(args),
        Cmd::Ls(args) => ls::run(args),
        Cmd::Passwd(args) => passwd::run(args),
        Cmd::Completions { shell } => completions(shell),
        Cmd::Man { dir } => man(dir),
        Cmd::Demo(args) => crate::demo::run(args.size).map(|()| exit::OK),
        Cmd::ConnectBack => crate::server::connect_back::run().map(|()| exit::OK),
        Cmd::Lab(cmd) => crate::lab::main(*cmd),
        Cmd::Trace(args) => crate::trace::main(args),
        Cmd::Model(args) => crate::model::main(*args),
        Cmd::Bench(args) => crate::bench::main(*args),
    }
}

fn completions(shell: clap_complete::Shell) -> anyhow::Result<u8> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "braid", &mut script);
    print_all(&script)
}

fn man(dir: Option<PathBuf>) -> anyhow::Result<u8> {
    let cmd = <Cli as clap::CommandFactory>::command();
    let Some(dir) = dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        return print_all(&page);
    };
    clap_mangen::generate_to(cmd, &dir)
        .with_context(|| format!("cannot write manual pages into {}", dir.display()))?;
    eprintln!("braid: manual pages written to {}", dir.display());
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges() {
        assert_eq!(
            crate::server::settings::parse_range("50000-50100"),
            Ok((50000, 50100))
        );
        assert!(crate::server::settings::parse_range("5-1").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
