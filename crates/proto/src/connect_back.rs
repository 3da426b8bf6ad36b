//! The requests `braid cp` sends to `braid connect-back` on the far side, one line each:
//! `TARGET PORT TOKEN`: connect to PORT at the client's address, then to the far side's own
//! data port TARGET, and write the 16 bytes of TOKEN (hex on the line) to the client first,
//! so that it knows which of its requests a connection answers. A failure comes back as
//! `failed TOKEN why`.

use std::net::SocketAddr;

/// One data connection asked of the far side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub target: SocketAddr,
    pub port: u16,
    pub token: [u8; 16],
}

impl Request {
    pub fn parse(line: &str) -> Result<Request, String> {
        let bad = || format!("not a connect-back request: {line:?}");
        let mut words = line.split_whitespace();
        let target = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        let port = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        let token = words.next().and_then(unhex).ok_or_else(bad)?;
        if words.next().is_some() {
            return Err(bad());
        }
        Ok(Request {
            target,
            port,
            token,
        })
    }

    pub fn line(&self) -> String {
        format!("{} {} {}\n", self.target, self.port, hex(&self.token))
    }

    /// The answer to this request when it failed.
    pub fn failed(&self, why: &str) -> String {
        format!("failed {} {}\n", hex(&self.token), why.replace('\n', " "))
    }
}

/// A `failed TOKEN why` line: the token and why (None for any other line).
pub fn failure(line: &str) -> Option<([u8; 16], &str)> {
    let rest = line.strip_prefix("failed ")?;
    let (token, why) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((unhex(token)?, why.trim()))
}

fn hex(token: &[u8; 16]) -> String {
    crate::hex::encode(token)
}

fn unhex(s: &str) -> Option<[u8; 16]> {
    crate::hex::decode(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_its_failure_go_through_their_lines_and_back() {
        let r = Request {
            target: "[::1]:40000".parse().unwrap(),
            port: 51234,
            token: *b"0123456789abcdef",
        };
        assert_eq!(Request::parse(r.line().trim()).unwrap(), r);
        let said = r.failed("no answer\nfrom 127.0.0.1:1");
        assert_eq!(
            failure(said.trim()),
            Some((r.token, "no answer from 127.0.0.1:1"))
        );
        assert_eq!(failure("ready"), None);
        assert_eq!(failure("failed nothex why"), None);
        for bad in [
            "",
            "127.0.0.1:1 2",
            "127.0.0.1:1 2 abc",
            "x 2 00112233445566778899aabbccddeeff",
            "127.0.0.1:1 2 00112233445566778899aabbccddeeff more",
            "127.0.0.1:1 2 0011223344556677889éaabbccddeeff",
        ] {
            assert!(
                Request::parse(bad)
                    .unwrap_err()
                    .contains("not a connect-back")
            );
        }
    }
}
