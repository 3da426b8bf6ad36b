//! braid's FTP protocol logic, free of I/O.
//!
//! Everything here takes bytes or events in and gives bytes or events out: no sockets, no files,
//! no clock reads. That keeps the protocol unit-testable and fuzzable; the `braid` crate drives
//! it with real sockets and files.

pub mod addr;
pub mod ascii;
pub mod block;
pub mod checksum;
pub mod client;
pub mod command;
pub mod line;
pub mod listing;
pub mod markers;
#[cfg(test)]
mod pair;
pub mod path;
pub mod ranges;
pub mod reply;
pub mod retr_opts;
pub mod session;
pub mod time;

pub use command::{Command, ParseError};
pub use path::VPath;
pub use reply::{Reply, ReplyParser};

/// Longest control line braid accepts, CRLF included. RFC 959 sets no limit; a limit keeps a
/// hostile client from making the server buffer without bound.
pub const MAX_LINE: usize = 8192;

/// Entry points for cargo-fuzz targets (see `fuzz/`).
/// Entry points for `fuzz/` (cargo-fuzz). Compiled always so the unit tests exercise them too.
#[doc(hidden)]
pub mod fuzzing {
    /// Feeds arbitrary bytes through the line splitter and the command parser. Whatever parses
    /// must encode to a line that parses back to the same command: what the server logs and
    /// what the client sends are the same thing.
    pub fn command_parser(data: &[u8]) {
        let mut lines = crate::line::LineBuffer::new(crate::MAX_LINE);
        lines.extend(data);
        while let Ok(Some(line)) = lines.next_line() {
            if let Ok(cmd) = crate::Command::parse(&line) {
                let mut wire = Vec::new();
                cmd.encode(&mut wire);
                let again = crate::Command::parse(&wire[..wire.len() - 2]);
                assert_eq!(
                    again.as_ref(),
                    Ok(&cmd),
                    "{:?} re-encoded as {:?}",
                    String::from_utf8_lossy(&line),
                    String::from_utf8_lossy(&wire)
                );
            }
        }
    }
}
