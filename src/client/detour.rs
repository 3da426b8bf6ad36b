//! Where a data connection goes, and the ways round when it cannot get there. `braid cp`'s
//! data connections go straight to the machine ssh reached. Where that does not answer (a
//! firewall in front of the far side's data ports), the far side opens them towards us
//! instead (`braid connect-back` there, see [`super::connect_back`]); where that fails too (a
//! firewall on this side as well), they go through ssh's own channel: a SOCKS forward (`ssh -O
//! forward -D`) on the connection ssh already shares. The first connection that fails finds
//! the way; every one after takes it at once. The data stays TLS bound to the session.

use super::connect_back::Back;
use super::error::{ClientError, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

/// How long a straight data connection, or one the far side opens, may take before the next
/// way is tried: a blocked port answers nothing, and waiting the usual 30 s for it would look
/// like a hang.
const STRAIGHT_LIMIT: Duration = Duration::from_secs(5);

/// A data connection's destination, and the way round if there is one.
#[derive(Debug, Clone)]
pub struct DataAddr {
    pub target: SocketAddr,
    /// The same port as the far side knows itself (its greeting's data address): where the far
    /// side connects to when the connection goes round.
    pub round: SocketAddr,
    pub detour: Option<Arc<Detour>>,
}

pub use super::ways::Way;

/// The ways round for a transfer's data connections, through ssh's shared connection.
pub struct Detour {
    /// `ssh [options] -o ControlPath=...`, without the destination.
    shared: Vec<String>,
    destination: String,
    /// The braid to run on the far side for `connect-back`.
    remote_braid: String,
    /// The local SOCKS port, once set up (or why it could not be).
    proxy: OnceLock<std::result::Result<SocketAddr, String>>,
    /// The far side's connect-back, once started (or why it could not be).
    back: OnceLock<std::result::Result<Back, String>>,
    /// The way every new connection takes: only ever further down the list.
    way: AtomicU8,
    /// Where the way found is kept for the next run to this destination ([`super::ways`]).
    memory: Option<PathBuf>,
    /// The way was found by an earlier run (kept again only if it changes: kept each time
    /// it is taken, it would never be tried straight again).
    recalled: bool,
    /// Whether `-v` has been told that the way comes from an earlier run.
    told: AtomicBool,
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
    /// directory), which the ssh of `program` (with its options) reaches `destination` by;
    /// `remote_braid` is the braid there.
    /// `memory`: the file where the way found to `destination` is kept between runs
    /// ([`super::ways::file`]), none to keep nothing.
    pub fn new(
        program: &[String],
        control_path: String,
        destination: &str,
        remote_braid: &str,
        memory: Option<PathBuf>,
    ) -> Detour {
        let mut shared = program.to_vec();
        if shared.is_empty() {
            shared.push("ssh".into());
        }
        shared.extend(["-o".into(), format!("ControlPath={control_path}")]);
        let now = std::time::SystemTime::now();
        let recalled = memory
            .as_deref()
            .and_then(|m| super::ways::recall(m, destination, now));
        Detour {
            shared,
            destination: destination.to_string(),
            remote_braid: remote_braid.to_string(),
            proxy: OnceLock::new(),
            back: OnceLock::new(),
            way: AtomicU8::new(recalled.unwrap_or(Way::Straight) as u8),
            memory,
            recalled: recalled.is_some(),
            told: AtomicBool::new(false),
        }
    }

    /// The way the data connections took (the last one tried, if they differed).
    pub fn way(&self) -> Way {
        Way::from_u8(self.way.load(Ordering::Acquire))
    }

    /// Takes `way` from now on; one further down the list than before is kept for the next
    /// run.
    fn take(&self, way: Way) {
        let before = self.way.fetch_max(way as u8, Ordering::AcqRel);
        if way as u8 > before
            && let Some(m) = &self.memory
        {
            let now = std::time::SystemTime::now();
            if let Err(e) = super::ways::remember(m, &self.destination, way, now) {
                tracing::debug!("cannot keep the way found in {}: {e}", m.display());
            }
        }
    }

    /// Says once (`-v`) that the data connections take the way an earlier run found.
    fn tell_recalled(&self) {
        if self.recalled && !self.told.swap(true, Ordering::AcqRel) {
            let hours = super::ways::REMEMBERED_FOR.as_secs() / 3600;
            tracing::info!(
                "data connections to {} go as an earlier run found they must: {} (kept in {}; tried straight again {hours} h after it was found)",
                self.destination,
                match self.way() {
                    Way::Back => "the far side connects back",
                    _ => "through ssh's channel",
                },
                self.memory
                    .as_deref()
                    .map_or(String::new(), |m| m.display().to_string()),
            );
        }
    }

    /// `ssh [options] -o ControlPath=...` and then `rest`.
    fn ssh(&self, rest: &[&str]) -> Command {
        let mut c = Command::new(&self.shared[0]);
        c.args(&self.shared[1..]).args(rest);
        c
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
                let out = self
                    .ssh(&[
                        "-O",
                        "forward",
                        "-D",
                        &format!("127.0.0.1:{port}"),
                        &self.destination,
                    ])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .map_err(|e| format!("{} did not run: {e}", self.shared[0]))?;
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

    /// A connection the far side opens to us, for its data port `target`.
    fn back(&self, target: SocketAddr) -> std::result::Result<TcpStream, String> {
        let back = self.back.get_or_init(|| {
            let far = self.ssh(&[&self.destination, &self.remote_braid, "connect-back"]);
            Back::start(far, target.ip(), STRAIGHT_LIMIT)
        });
        back.as_ref().map_err(String::clone)?.connect(target)
    }

    /// A connection to `addr` by the ways round, from the way taken so far on: the straight
    /// one failed with `straight`.
    fn round(&self, addr: &DataAddr, straight: &str) -> Result<TcpStream> {
        let from = self.way();
        let mut back_failed = None;
        if from <= Way::Back {
            match self.back(addr.round) {
                Ok(s) => {
                    if from < Way::Back {
                        tracing::info!(
                            "data connection {} failed ({straight}): the far side connects back",
                            addr.target
                        );
                    }
                    self.take(Way::Back);
                    return Ok(s);
                }
                Err(e) => back_failed = Some(e),
            }
        }
        if self.way() < Way::Channel {
            tracing::info!(
                "data connection {} failed ({straight}{}): the data goes through ssh's channel",
                addr.target,
                back_failed
                    .as_ref()
                    .map_or(String::new(), |b| format!("; connecting back, {b}"))
            );
        }
        let s = through_channel(self, addr.round).map_err(|r| {
            ClientError::Protocol(format!(
                "no data connection reaches {}: straight, {straight} (a firewall in front of \
                 the far side's ports?); connecting back, {}; through ssh's channel, {r}",
                addr.target,
                back_failed.as_deref().unwrap_or("not tried again")
            ))
        })?;
        // Kept for the next run only once it worked: where no way works (the far side gone
        // as a failed transfer ends), the next run must not skip the straight one for a day.
        self.take(Way::Channel);
        Ok(s)
    }
}

/// Opens one data connection to `addr`: straight, or, where that fails and there are ways
/// round, by them (and from then on by the way that worked); with `limit` as its read and
/// write timeout.
pub fn connect(addr: &DataAddr, limit: Duration, straight_limit: Duration) -> Result<TcpStream> {
    let s = match &addr.detour {
        None => TcpStream::connect_timeout(&addr.target, straight_limit).map_err(|cause| {
            ClientError::Connect {
                addr: format!("data connection {}", addr.target),
                cause,
            }
        })?,
        Some(d) => match d.way() {
            Way::Straight => match TcpStream::connect_timeout(&addr.target, STRAIGHT_LIMIT) {
                Ok(s) => s,
                Err(e) => d.round(addr, &e.to_string())?,
            },
            _ => {
                d.tell_recalled();
                d.round(addr, "failed before")?
            }
        },
    };
    s.set_read_timeout(Some(limit)).ok();
    s.set_write_timeout(Some(limit)).ok();
    Ok(s)
}

/// A connection to `target` through the detour's SOCKS forward.
fn through_channel(d: &Detour, target: SocketAddr) -> Result<TcpStream> {
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

    /// A far side that is gone (its port refuses, its ssh runs nothing): no way works, and
    /// none is kept for the next run, which tries the straight one first.
    #[test]
    fn a_connection_no_way_reaches_leaves_no_way_kept() {
        let dir = tempfile::tempdir().unwrap();
        let memory = dir.path().join("ways");
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let d = Arc::new(Detour::new(
            &["false".into()],
            "/nonexistent/%C".into(),
            "ann@box",
            "braid",
            Some(memory.clone()),
        ));
        let addr = DataAddr {
            target: closed,
            round: closed,
            detour: Some(d.clone()),
        };
        let e = connect(&addr, Duration::from_secs(1), Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("no data connection reaches"), "{e}");
        assert!(!memory.exists(), "a way was kept though none worked");
        assert_eq!(
            crate::client::ways::recall(&memory, "ann@box", std::time::SystemTime::now()),
            None
        );
    }

    #[test]
    fn the_forward_is_asked_of_the_shared_connection_with_the_users_options() {
        let d = Detour::new(
            &["ssh".into(), "-p".into(), "2222".into()],
            "/tmp/x/%C".into(),
            "ann@box",
            "/opt/braid",
            None,
        );
        let line = |c: Command| {
            std::iter::once(c.get_program())
                .chain(c.get_args())
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            line(d.ssh(&["-O", "forward", "-D", "127.0.0.1:1", "ann@box"])),
            "ssh -p 2222 -o ControlPath=/tmp/x/%C -O forward -D 127.0.0.1:1 ann@box"
        );
        assert_eq!(d.way(), Way::Straight);
        d.take(Way::Channel);
        d.take(Way::Back);
        assert_eq!(
            d.way(),
            Way::Channel,
            "the way only goes further down the list"
        );
    }
}
