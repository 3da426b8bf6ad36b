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
    pub const PROTOCOL: u8 = 9;
    pub const TLS: u8 = 10;
    /// A recursive transfer ended, but some files did not make it (its summary lists them).
    pub const SOME_FAILED: u8 = 11;
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
    /// A remote wildcard (`host:logs/*.gz`) that no name there matches.
    #[error("no file matches {0}")]
    NoMatch(String),
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
    /// The peer does not speak FTP as expected: nothing or garbage where a greeting or a reply
    /// should be.
    #[error("{0}")]
    Protocol(String),
    /// The control connection broke or went silent in the middle of the session.
    #[error("control connection: {0}")]
    ControlLost(String),
    /// TLS could not be set up: the handshake failed or the certificate is not trusted.
    #[error("{0}")]
    Tls(String),
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
            ClientError::Remote { .. } | ClientError::NoMatch(_) => exit::REMOTE,
            ClientError::Local { .. } => exit::LOCAL,
            ClientError::Interrupted { .. } => exit::INTERRUPTED,
            ClientError::Integrity(_) => exit::INTEGRITY,
            ClientError::Protocol(_) => exit::PROTOCOL,
            ClientError::ControlLost(_) => exit::INTERRUPTED,
            ClientError::Tls(_) => exit::TLS,
            ClientError::Usage(_) => exit::USAGE,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_exit_code_and_an_interruption_says_where_the_data_is() {
        let io = || std::io::Error::other("x");
        let reply = || braid_proto::Reply::new(550, "no");
        let cases = [
            (
                ClientError::Connect {
                    addr: "h:21".into(),
                    cause: io(),
                },
                exit::CONNECT,
            ),
            (
                ClientError::Login {
                    user: "u".into(),
                    reply: reply(),
                },
                exit::LOGIN,
            ),
            (
                ClientError::Remote {
                    what: "RETR f".into(),
                    reply: reply(),
                },
                exit::REMOTE,
            ),
            (
                ClientError::Local {
                    what: "w".into(),
                    cause: io(),
                },
                exit::LOCAL,
            ),
            (ClientError::Integrity("x".into()), exit::INTEGRITY),
            (ClientError::Protocol("x".into()), exit::PROTOCOL),
            (ClientError::ControlLost("x".into()), exit::INTERRUPTED),
            (ClientError::Tls("x".into()), exit::TLS),
            (ClientError::Usage("x".into()), exit::USAGE),
        ];
        for (e, code) in cases {
            assert_eq!(e.exit_code(), code, "{e}");
        }
        let kept = ClientError::Interrupted {
            bytes: 10,
            why: "stopped".into(),
            partial: Some("f.part".into()),
        };
        assert_eq!(kept.exit_code(), exit::INTERRUPTED);
        assert!(
            kept.to_string().contains("kept in f.part") && kept.to_string().contains("--resume")
        );
        let upload = ClientError::Interrupted {
            bytes: 10,
            why: "stopped".into(),
            partial: None,
        };
        assert!(!upload.to_string().contains("kept in"));
    }
}
