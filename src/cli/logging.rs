//! Log lines on stderr: the server's for its log, the client's for the person at the terminal.

use crate::server::settings::LogFormat;
use std::io::IsTerminal;

/// Standard error for log lines, where a line that cannot be written is dropped. Whoever
/// read the log may have gone (a closed pipe); tracing-subscriber reports a failed write with
/// `eprintln!`, which panics on a closed stderr, and the panic took each new session of the
/// server with it.
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Log lines on stderr up to `level`, or as `RUST_LOG` says when it is set. The server's
/// carry time and source, for its log, as text or JSON; the client's (`terse`) only the level
/// and the message, for the person at the terminal.
pub fn init_logging(level: tracing::Level, terse: bool, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(level.as_str().to_ascii_lowercase()));
    let fmt = tracing_subscriber::fmt()
        .with_writer(|| LogWriter)
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && format == LogFormat::Text);
    let _ = match (terse, format) {
        (true, _) => fmt.without_time().with_target(false).try_init(),
        (false, LogFormat::Json) => fmt.json().flatten_event(true).try_init(),
        (false, LogFormat::Text) => fmt.try_init(),
    };
}

/// The client's own messages: warnings, and with -v what it decided and why (the
/// self-tuning's steps, fallbacks); -q keeps only errors.
pub fn client_logging(verbose: bool, quiet: bool) {
    let level = match (verbose, quiet) {
        (true, _) => tracing::Level::INFO,
        (_, true) => tracing::Level::ERROR,
        _ => tracing::Level::WARN,
    };
    init_logging(level, true, LogFormat::Text);
}
