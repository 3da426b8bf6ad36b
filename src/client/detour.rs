//! Where a data connection goes, and the way round when it cannot get there. `braid cp`'s data
//! connections go straight to the machine ssh reached; where that does not answer (a
//! firewall in front of the far side's data ports), they go through ssh's own channel: a
//! SOCKS forward (`ssh -O forward -D`) on the connection ssh already shares, set up by the
//! first connection that fails and taken by every one after. The data stays TLS bound to the
//! session, now inside ssh's encryption too.

use super::error::{ClientError, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long a straight data connection may take before the way through ssh is tried: a
/// blocked port answers nothing, and waiting the usual 30 s for it would look like a hang.
const STRAIGHT_LIMIT: Duration = Duration::from_secs(5);

/// A data connection's destination, and the way round if there is one.
#[derive(Debug, Clone)]
pub struct DataAddr {
    pub target: SocketAddr,
    /// The same port as the far side knows itself (its greeting's data address): where ssh
    /// connects to from there when the connection goes round.
    pub round: SocketAddr,
    pub detour: Option<Arc<Detour>>,
}

/// The way through ssh's channel for a transfer's data connections.
pub struct Detour {
    /// `ssh [options] -o ControlPath=... -O forward -D` without the port and destination.
    forward: Vec<String>,
    destination: String,
    /// The local SOCKS port, once set up (or why it could not be).
    proxy: OnceLock<std::result::Result<SocketAddr, String>>,
    /// A straight connection failed: every later one goes round at once.
    taken: AtomicBool,
}

impl std::fmt::Debug for Detour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Detour({})", self.destination)
    }
}

/// One way round per transfer: two are the same only if they are one.
impl PartialEq for Detour {
    fn eq(&self, other: &Detour) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Detour {}

impl Detour {
    /// Through the OpenSSH connection shared at `control_path` (`%C` in a private
    /// directory), which the ssh of `program` (with its options) reaches `destination` by.
    pub fn new(program: &[String], control_path: String, destination: &str) -> Detour {
        let mut forward = program.to_vec();
        if forward.is_empty() {
            forward.push("ssh".into());
        }
        forward.extend(["-o".into(), format!("ControlPath={control_path}")]);
        forward.extend(["-O".into(), "forward".into(), "-D".into()]);
        Detour {
            forward,
            destination: destination.to_string(),
            proxy: OnceLock::new(),
            taken: AtomicBool::new(false),
        }
    }

    /// Whether the data connections went through ssh's channel.
    pub fn taken(&self) -> bool {
        self.taken.load(Ordering::Acquire)
    }

    /// The local SOCKS port ssh forwards through its channel, asked for once.
    fn proxy(&self) -> std::result::Result<SocketAddr, String> {
        self.proxy
            .get_or_init(|| {
                // A free port now; ssh takes it at once.
                let port = std::net::TcpListener::bind(("127.0.0.1", 0))
                    .and_then(|l| l.local_addr())
                    .map_err(|e| format!("no free local port: {e}"))?
                    .port();
                let (program, options) = self.forward.split_first().ok_or("no ssh")?;
                let out = std::process::Command::new(program)
                    .args(options)
                    .arg(format!("127.0.0.1:{port}"))
                    .arg(&self.destination)
                    .stdin(std::process::Stdio::null())
                    .output()
                    .map_err(|e| format!("{program} did not run: {e}"))?;
                if !out.status.success() {
                    return Err(format!(
                        "ssh would not forward ({}): {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
                Ok(SocketAddr::from(([127, 0, 0, 1], port)))
            })
            .clone()
    }
}

/// Opens one data connection to `addr`: straight, or, where that fails and there is a way
/// round, through it (and from then on straight through it); with `limit` as its read and
/// write timeout.
pub fn connect(addr: &DataAddr, limit: Duration, straight_limit: Duration) -> Result<TcpStream> {
    let failed = |cause| ClientError::Connect {
        addr: format!("data connection {}", addr.target),
        cause,
    };
    let s = match &addr.detour {
        None => TcpStream::connect_timeout(&addr.target, straight_limit).map_err(failed)?,
        Some(d) if d.taken() => round(d, addr.round)?,
        Some(d) => match TcpStream::connect_timeout(&addr.target, STRAIGHT_LIMIT) {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(
                    "data connection {} failed ({e}): the data goes through ssh's channel",
                    addr.target
                );
                d.taken.store(true, Ordering::Release);
                round(d, addr.round).map_err(|r| {
                    ClientError::Protocol(format!(
                        "no data connection reaches {}: straight, {e} (a firewall in front \
                         of the far side's ports?); through ssh's channel, {r}",
                        addr.target
                    ))
                })?
            }
        },
    };
    s.set_read_timeout(Some(limit)).ok();
    s.set_write_timeout(Some(limit)).ok();
    Ok(s)
}

/// A connection to `target` through the detour's SOCKS forward.
fn round(d: &Detour, target: SocketAddr) -> Result<TcpStream> {
    let proxy = d.proxy().map_err(ClientError::Protocol)?;
    socks_connect(proxy, target).map_err(|e| ClientError::Connect {
        addr: format!("data connection {target} through ssh's channel"),
        cause: e,
    })
}

/// SOCKS 5 (RFC 1928) CONNECT without authentication, as ssh's `-D` forward speaks it.
fn socks_connect(proxy: SocketAddr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let refused = |what: String| std::io::Error::new(std::io::ErrorKind::ConnectionRefused, what);
    let mut s = TcpStream::connect_timeout(&proxy, STRAIGHT_LIMIT)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(&[5, 1, 0])?;
    let mut chosen = [0u8; 2];
    s.read_exact(&mut chosen)?;
    if chosen != [5, 0] {
        return Err(refused(format!("the SOCKS forward answered {chosen:?}")));
    }
    let mut ask = vec![5, 1, 0];
    match target {
        SocketAddr::V4(a) => {
            ask.push(1);
            ask.extend(a.ip().octets());
        }
        SocketAddr::V6(a) => {
            ask.push(4);
            ask.extend(a.ip().octets());
        }
    }
    ask.extend(target.port().to_be_bytes());
    s.write_all(&ask)?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head)?;
    if head[1] != 0 {
        return Err(refused(format!(
            "ssh could not connect to {target} from the far side (SOCKS reply {})",
            head[1]
        )));
    }
    // The address the far side bound: skipped.
    let rest = match head[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        _ => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len)?;
            usize::from(len[0]) + 2
        }
    };
    s.read_exact(&mut vec![0u8; rest])?;
    s.set_read_timeout(None)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A SOCKS 5 server for one connection: checks the greeting and the CONNECT to
    /// `expected`, answers `status`, then echoes.
    fn socks_server(expected: SocketAddr, status: u8) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut greeting = [0u8; 3];
            s.read_exact(&mut greeting).unwrap();
            assert_eq!(greeting, [5, 1, 0]);
            s.write_all(&[5, 0]).unwrap();
            let mut ask = [0u8; 10];
            s.read_exact(&mut ask).unwrap();
            let SocketAddr::V4(e) = expected else {
                panic!("v4 only here")
            };
            assert_eq!(&ask[..4], &[5, 1, 0, 1]);
            assert_eq!(&ask[4..8], &e.ip().octets());
            assert_eq!(&ask[8..], &e.port().to_be_bytes());
            s.write_all(&[5, status, 0, 1, 127, 0, 0, 1, 0, 80])
                .unwrap();
            let mut buf = [0u8; 5];
            if status == 0 && s.read_exact(&mut buf).is_ok() {
                let _ = s.write_all(&buf);
            }
        });
        at
    }

    #[test]
    fn a_connection_through_the_socks_forward_carries_bytes_to_its_target() {
        let target: SocketAddr = "198.18.0.2:40000".parse().unwrap();
        let mut s = socks_connect(socks_server(target, 0), target).unwrap();
        s.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello");
    }

    #[test]
    fn a_target_the_far_side_cannot_reach_is_an_error_that_says_so() {
        let target: SocketAddr = "198.18.0.2:40001".parse().unwrap();
        let e = socks_connect(socks_server(target, 5), target).unwrap_err();
        assert!(
            e.to_string()
                .contains("could not connect to 198.18.0.2:40001"),
            "{e}"
        );
    }

    #[test]
    fn the_forward_is_asked_of_the_shared_connection_with_the_users_options() {
        let d = Detour::new(
            &["ssh".into(), "-p".into(), "2222".into()],
            "/tmp/x/%C".into(),
            "ann@box",
        );
        assert_eq!(
            d.forward,
            [
                "ssh",
                "-p",
                "2222",
                "-o",
                "ControlPath=/tmp/x/%C",
                "-O",
                "forward",
                "-D"
            ]
        );
        assert!(!d.taken());
    }
}
