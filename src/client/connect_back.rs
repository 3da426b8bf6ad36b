//! Data connections the far side opens towards us (`braid connect-back` there, started through
//! ssh's shared connection): for a far side behind a firewall that lets nothing in but ssh and
//! lets connections out. We listen on a port of our own; for each connection wanted, one
//! request goes down ssh's channel and the far side connects to that port and to its own
//! session's data port, and carries the bytes between them. Its first 16 bytes are the
//! request's token, which tells our requests (and strangers) apart; the data connection's TLS,
//! bound to the session, then runs end to end as on a straight connection.

use super::channel::Said;
use braid_proto::connect_back::{Request, failure};
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// What a waiting request gets: its connection, or why not.
type Answer = Result<TcpStream, String>;

/// The far side's `braid connect-back` and our port it connects to.
pub struct Back {
    child: Mutex<Child>,
    requests: Mutex<ChildStdin>,
    port: u16,
    waiting: Arc<Mutex<Waiting>>,
    closing: Arc<AtomicBool>,
    /// How long a request waits for its connection.
    limit: Duration,
}

#[derive(Default)]
struct Waiting {
    by_token: HashMap<[u8; 16], mpsc::Sender<Answer>>,
    /// Why no request can be answered any more (the far side's connect-back ended).
    gone: Option<String>,
}

impl Back {
    /// Starts `far` (ssh running `braid connect-back` on the far side) and listens for its
    /// connections on every address of `family`'s kind.
    pub fn start(mut far: Command, family: IpAddr, limit: Duration) -> Result<Back, String> {
        let any = match family {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let listener = TcpListener::bind((any, 0))
            .map_err(|e| format!("cannot listen for the far side's connections: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("listener address: {e}"))?
            .port();
        let mut child = far
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run ssh for connect-back: {e}"))?;
        let (Some(requests), Some(answers), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            return Err("ssh's pipes are missing".into());
        };
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let closing = Arc::new(AtomicBool::new(false));
        let words = Said::default();
        words.keep(stderr);
        std::thread::spawn({
            let waiting = waiting.clone();
            move || read_answers(answers, &waiting, &words)
        });
        std::thread::spawn({
            let (waiting, closing) = (waiting.clone(), closing.clone());
            move || accept(listener, &waiting, &closing, limit)
        });
        Ok(Back {
            child: Mutex::new(child),
            requests: Mutex::new(requests),
            port,
            waiting,
            closing,
            limit,
        })
    }

    /// A data connection to `target` (the far side's data port, as it knows it), opened by the
    /// far side.
    pub fn connect(&self, target: SocketAddr) -> Result<TcpStream, String> {
        let r = Request {
            target,
            port: self.port,
            token: rand::random(),
        };
        let (tx, rx) = mpsc::channel();
        {
            let mut w = lock(&self.waiting);
            if let Some(why) = &w.gone {
                return Err(why.clone());
            }
            w.by_token.insert(r.token, tx);
        }
        let asked = {
            let mut requests = lock(&self.requests);
            requests
                .write_all(r.line().as_bytes())
                .and_then(|()| requests.flush())
        };
        let answer = match asked {
            // A far side that ended says why on its way out.
            Err(e) => rx
                .recv_timeout(Duration::from_secs(1))
                .unwrap_or_else(|_| Err(format!("cannot ask the far side: {e}"))),
            Ok(()) => match rx.recv_timeout(self.limit) {
                Ok(answer) => answer,
                Err(_) => Err(format!(
                    "the far side's connection did not arrive in {} s (a firewall in front \
                     of this side too?)",
                    self.limit.as_secs()
                )),
            },
        };
        lock(&self.waiting).by_token.remove(&r.token);
        answer
    }
}

impl Drop for Back {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        // Wakes the acceptor, which then stops.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)),
            Duration::from_secs(1),
        );
        let mut child = lock(&self.child);
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes the far side's connections; each that starts with a waiting request's token answers
/// it, any other is closed.
fn accept(
    listener: TcpListener,
    waiting: &Arc<Mutex<Waiting>>,
    closing: &AtomicBool,
    limit: Duration,
) {
    let reading = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if closing.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut s) = conn else { continue };
        // A stranger who sends nothing holds up only its own thread, for `limit` at most, and
        // a flood of them no more than `MOST_READING` threads: past that, connections are
        // closed at once (the far side's own then fail, and the data goes through ssh).
        if reading.fetch_add(1, Ordering::AcqRel) >= MOST_READING {
            reading.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (waiting, reading) = (waiting.clone(), reading.clone());
        std::thread::spawn(move || {
            let _done = Done(&reading);
            let mut token = [0u8; 16];
            let _ = s.set_read_timeout(Some(limit));
            if s.read_exact(&mut token).is_err() || s.set_read_timeout(None).is_err() {
                return;
            }
            if let Some(tx) = lock(&waiting).by_token.remove(&token) {
                let _ = tx.send(Ok(s));
            }
        });
    }
}

/// Connections whose token is being read at most at once.
const MOST_READING: usize = 64;

/// Counts a reading thread out when it ends, however it ends.
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answers requests the far side could not carry out; when it ends, every request still
/// waiting, and every later one, gets why.
fn read_answers(answers: impl Read, waiting: &Mutex<Waiting>, words: &Said) {
    for line in std::io::BufReader::new(answers).lines() {
        let Ok(line) = line else { break };
        if let Some((token, why)) = failure(&line)
            && let Some(tx) = lock(waiting).by_token.remove(&token)
        {
            let _ = tx.send(Err(format!("the far side: {why}")));
        }
    }
    // Its last words come on standard error, which closes with it.
    let said = words.last(Duration::from_secs(1));
    let said = said.trim();
    let why = if said.is_empty() {
        "the far side's braid connect-back ended".to_string()
    } else {
        format!("the far side's braid connect-back ended: {said}")
    };
    let mut w = lock(waiting);
    for (_, tx) in w.by_token.drain() {
        let _ = tx.send(Err(why.clone()));
    }
    w.gone = Some(why);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Listens for a stand-in far side: `script`, run by bash (which can connect with
    /// /dev/tcp), reading the requests.
    fn start(script: &str, limit: Duration) -> Back {
        let mut far = Command::new("bash");
        far.args(["-c", script]);
        Back::start(far, IpAddr::V4(Ipv4Addr::LOCALHOST), limit).unwrap()
    }

    #[test]
    fn a_requested_connection_arrives_with_its_token_and_carries_bytes() {
        // Reads `TARGET PORT TOKEN`, connects back, writes the token (hex to bytes) and a
        // greeting, as the real far side's target would speak first.
        let script = r#"
            while read target port token; do
                exec 3<>/dev/tcp/127.0.0.1/$port
                printf "$(echo $token | sed 's/../\\x&/g')hello" >&3
                exec 3>&-
            done"#;
        let back = start(script, Duration::from_secs(5));
        for _ in 0..2 {
            let mut s = back.connect("127.0.0.1:1".parse().unwrap()).unwrap();
            let mut got = String::new();
            s.read_to_string(&mut got).unwrap();
            assert_eq!(got, "hello");
        }
    }

    #[test]
    fn a_failure_the_far_side_reports_and_its_end_are_errors_that_say_why() {
        let script = r#"
            read target port token; echo "failed $token cannot connect to $target"
            echo "no more" >&2"#;
        let back = start(script, Duration::from_secs(5));
        let target: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let e = back.connect(target).unwrap_err();
        assert_eq!(e, "the far side: cannot connect to 127.0.0.1:9");
        let e = back.connect(target).unwrap_err();
        assert!(e.contains("connect-back ended: no more"), "{e}");
    }

    #[test]
    fn a_flood_of_silent_strangers_holds_a_bounded_number_of_threads() {
        let back = start("read line", Duration::from_secs(60));
        let at = SocketAddr::from((Ipv4Addr::LOCALHOST, back.port));
        let silent: Vec<TcpStream> = (0..MOST_READING)
            .map(|_| TcpStream::connect(at).unwrap())
            .collect();
        // The next is closed at once rather than waited on for 60 s.
        let mut one_more = TcpStream::connect(at).unwrap();
        one_more
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(one_more.read(&mut [0u8; 1]).unwrap(), 0);
        drop(silent);
    }

    #[test]
    fn a_connection_that_never_comes_is_an_error_after_the_limit() {
        let back = start("read line; sleep 10", Duration::from_millis(300));
        let e = back.connect("127.0.0.1:9".parse().unwrap()).unwrap_err();
        assert!(e.contains("did not arrive"), "{e}");
    }
}
