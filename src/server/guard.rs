//! Logins under attack. A password check (argon2, 19 MiB for tens of milliseconds) costs the
//! server far more than a guess costs the client, so checks run on a fixed pool of threads
//! with a bounded queue (a flood of guesses used to run one check per blocking thread at once:
//! 6 GB), and failures cost the guesser time that grows with each failure from the same
//! address range or for the same account, across connections. The bookkeeping is pure
//! ([`Failures`]: times in, delays out); the pool is the thin part around argon2.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A failure is forgotten this long after the last one from the same source.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// The longest delay before a failure is answered.
const MOST_DELAY: Duration = Duration::from_secs(30);
/// After this many failures from one address range, passwords from it are not even checked
/// until the failures are forgotten: the guesses cost the server nothing.
const STOP_CHECKING_AFTER: u32 = 30;
/// Sources remembered at most (the oldest go first), so a spread-out attack cannot grow the
/// table without bound.
const MOST_SOURCES: usize = 10_000;

/// Where failures come from: an address range (IPv4 /24, IPv6 /64, as one host or one
/// customer usually holds) or an account name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Source {
    Range(IpAddr),
    Account(String),
}

/// The address range `ip` is in: its /24 or /64.
fn prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            IpAddr::from([a, b, c, 0])
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0])
        }
    }
}

fn range_of(ip: IpAddr) -> Source {
    Source::Range(prefix(ip))
}

/// Recent failed logins by source.
#[derive(Debug, Default)]
pub struct Failures {
    seen: HashMap<Source, (u32, Instant)>,
}

impl Failures {
    fn count(&self, s: &Source, now: Instant) -> u32 {
        self.seen
            .get(s)
            .filter(|(_, last)| now.duration_since(*last) < FORGET_AFTER)
            .map_or(0, |(n, _)| *n)
    }

    /// How long to wait before answering a failed login: `base` for the first failure,
    /// doubling with each earlier one from the same range or for the same account, up to 30 s.
    pub fn delay(&self, base: Duration, ip: IpAddr, user: &str, now: Instant) -> Duration {
        let n = self
            .count(&range_of(ip), now)
            .max(self.count(&Source::Account(user.to_string()), now));
        base.saturating_mul(1 << n.min(16)).min(MOST_DELAY)
    }

    /// Whether a password from `ip` is not worth checking: its range failed too often lately.
    pub fn stop_checking(&self, ip: IpAddr, now: Instant) -> bool {
        self.count(&range_of(ip), now) >= STOP_CHECKING_AFTER
    }

    pub fn failed(&mut self, ip: IpAddr, user: &str, now: Instant) {
        for s in [range_of(ip), Source::Account(user.to_string())] {
            let n = self.count(&s, now);
            self.seen.insert(s, (n.saturating_add(1), now));
        }
        if self.seen.len() > MOST_SOURCES {
            self.seen
                .retain(|_, (_, last)| now.duration_since(*last) < FORGET_AFTER);
            while self.seen.len() > MOST_SOURCES {
                let oldest = self
                    .seen
                    .iter()
                    .min_by_key(|(_, (_, last))| *last)
                    .map(|(s, _)| s.clone());
                match oldest {
                    Some(s) => self.seen.remove(&s),
                    None => break,
                };
            }
        }
    }

    /// A good password: the account's failures are forgotten (its owner got in).
    pub fn succeeded(&mut self, user: &str) {
        self.seen.remove(&Source::Account(user.to_string()));
    }
}

/// Connections not logged in yet, by address range: one range may hold only a share of the
/// server's connections that way (256 pre-login connections from 16 addresses used to lock
/// everyone else out for the login timeout), and when half the connections are waiting to log
/// in, new ones get a short login timeout.
#[derive(Debug, Default)]
pub struct Waiting {
    by_range: HashMap<IpAddr, usize>,
}

/// The login timeout under pressure.
pub const SHORT_LOGIN_TIMEOUT: Duration = Duration::from_secs(10);

impl Waiting {
    /// Most connections one range may have waiting to log in, of `max` in all.
    pub fn per_range(max: usize) -> usize {
        (max / 8).max(2)
    }

    /// Takes a pre-login place for `ip`, or says why not.
    pub fn enter(&mut self, ip: IpAddr, max: usize) -> Result<(), String> {
        let here = self.by_range.entry(prefix(ip)).or_insert(0);
        if *here >= Self::per_range(max) {
            return Err(format!(
                "Too many connections from your network waiting to log in (limit {}).",
                Self::per_range(max)
            ));
        }
        *here += 1;
        Ok(())
    }

    /// Gives the place back (logged in, or gone).
    pub fn leave(&mut self, ip: IpAddr) {
        let range = prefix(ip);
        if let Some(n) = self.by_range.get_mut(&range) {
            *n -= 1;
            if *n == 0 {
                self.by_range.remove(&range);
            }
        }
    }

    /// The login timeout for a new connection: the configured one, or a short one when half
    /// of the `max` connections are waiting to log in.
    pub fn login_timeout(&self, configured: Duration, max: usize) -> Duration {
        if self.by_range.values().sum::<usize>() * 2 > max {
            configured.min(SHORT_LOGIN_TIMEOUT)
        } else {
            configured
        }
    }
}

/// Password checks waiting at most, beyond those running; more are answered "busy".
const QUEUE: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads for password checks, started on first use: at most that many
/// argon2 computations at once, each thread reusing its own memory.
#[derive(Default)]
pub struct Checks {
    queue: OnceLock<SyncSender<Job>>,
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checks")
    }
}

impl Checks {
    /// Runs `check` on the pool; None if the queue is full (or the pool could not start).
    pub async fn run<T: Send + 'static>(
        &self,
        check: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(check());
        });
        match self.queue.get_or_init(start_pool).try_send(job) {
            Ok(()) => rx.await.ok(),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => None,
        }
    }
}

fn start_pool() -> SyncSender<Job> {
    let (tx, rx) = sync_channel::<Job>(QUEUE);
    let rx = Arc::new(Mutex::new(rx));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    for i in 0..threads {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("braid-login-{i}"))
            .spawn(move || {
                loop {
                    let job = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start a password-check thread: {e}");
        }
    }
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_slow_down_a_range_and_an_account_across_connections() {
        let base = Duration::from_millis(500);
        let t0 = Instant::now();
        let mut f = Failures::default();
        let a: IpAddr = "198.18.0.7".parse().unwrap();
        let neighbour: IpAddr = "198.18.0.200".parse().unwrap();
        let elsewhere: IpAddr = "198.19.5.5".parse().unwrap();
        assert_eq!(f.delay(base, a, "alice", t0), base);
        for _ in 0..3 {
            f.failed(a, "alice", t0);
        }
        // Doubling per failure, for the whole /24 and for the account from anywhere.
        assert_eq!(f.delay(base, neighbour, "bob", t0), base * 8);
        assert_eq!(f.delay(base, elsewhere, "alice", t0), base * 8);
        assert_eq!(f.delay(base, elsewhere, "bob", t0), base);
        for _ in 0..40 {
            f.failed(neighbour, "root", t0);
        }
        assert_eq!(f.delay(base, a, "x", t0), MOST_DELAY);
        assert!(f.stop_checking(a, t0) && !f.stop_checking(elsewhere, t0));
        // Forgotten after a quiet while; a good password clears the account.
        let later = t0 + FORGET_AFTER + Duration::from_secs(1);
        assert!(!f.stop_checking(a, later));
        assert_eq!(f.delay(base, a, "root", later), base);
        f.succeeded("alice");
        assert_eq!(f.delay(base, elsewhere, "alice", t0), base);
    }

    #[test]
    fn one_range_cannot_take_every_pre_login_place() {
        let mut w = Waiting::default();
        let max = 32;
        let a = |i: u8| IpAddr::from([198, 18, 0, i]);
        for i in 0..Waiting::per_range(max) as u8 {
            assert!(w.enter(a(i), max).is_ok());
        }
        assert!(w.enter(a(200), max).is_err(), "the range is full");
        assert!(
            w.enter(IpAddr::from([198, 18, 1, 1]), max).is_ok(),
            "another range is not"
        );
        w.leave(a(0));
        assert!(w.enter(a(200), max).is_ok());
        let configured = Duration::from_secs(60);
        assert_eq!(w.login_timeout(configured, max), configured);
        for i in 2..=14u8 {
            w.enter(IpAddr::from([198, 18, i, 1]), max).unwrap();
        }
        assert_eq!(w.login_timeout(configured, max), SHORT_LOGIN_TIMEOUT);
    }

    #[test]
    fn the_table_of_sources_stays_bounded() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        for i in 0..(MOST_SOURCES as u32 + 500) {
            let ip = IpAddr::from((i << 8).to_be_bytes());
            f.failed(ip, "u", t0 + Duration::from_millis(i.into()));
        }
        assert!(f.seen.len() <= MOST_SOURCES);
    }
}
