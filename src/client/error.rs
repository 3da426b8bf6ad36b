//! Client errors, each with the exit code scripts can rely on.

use braid_proto::Reply;

/// Exit codes of `braid get`, `put` and `ls` (also listed in `--help`).
pub mod exit {
    pub const OK: u8 = 0;
    pub const OTHER: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const CONNECT: u8 = 3;
    pub const LOGIN: u8 = 4;
    pub const REMOTE: u8 = 5;
    pub const LOCAL: u8 = 6;
    pub const INTERRUPTED: u8 = 7;
    pub const INTEGRITY: u8 = 8;
}

/// What went wrong, in words that say what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {cause}")]
    Connect { addr: String, cause: std::io::Error },
    #[error("login as {user} refused by the server: {reply}")]
    Login { user: String, reply: Reply },
    #[error("server refused {what}: {reply}")]
    Remote { what: String, reply: Reply },
    #[error("{what}: {cause}")]
    Local { what: String, cause: std::io::Error },
    #[error("transfer interrupted after {bytes} bytes: {why}{}", hint(.partial))]
    Interrupted {
        bytes: u64,
        why: String,
        partial: Option<String>,
    },
    #[error("{0}")]
    Integrity(String),
    #[error("control connection: {0}")]
    Protocol(String),
    #[error("{0}")]
    Usage(String),
}

fn hint(partial: &Option<String>) -> String {
    match partial {
        Some(p) => {
            format!("; the partial data is kept in {p}, run again with --resume to continue")
        }
        None => String::new(),
    }
}

impl ClientError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Connect { .. } => exit::CONNECT,
            ClientError::Login { .. } => exit::LOGIN,
            ClientError::Remote { .. } => exit::REMOTE,
            ClientError::Local { .. } => exit::LOCAL,
            ClientError::Interrupted { .. } => exit::INTERRUPTED,
            ClientError::Integrity(_) => exit::INTEGRITY,
            ClientError::Protocol(_) => exit::INTERRUPTED,
            ClientError::Usage(_) => exit::USAGE,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;
