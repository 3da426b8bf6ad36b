//! Recent failed logins, and when to answer a login. Failures count against the (range,
//! account) they came from, and as pressure against the account and the range: the guesser's
//! own pair is slowed down hard, everyone else touching the account or the range a little (a
//! neighbour behind the attacker's NAT logs in to their own account without waiting out the
//! attacker's penalty). Under pressure a correct password is answered no sooner than a wrong
//! one would be, so a guesser cannot hang up early on a slow answer and take it for "wrong".

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A failure is forgotten this long after the last one from the same source.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// The longest delay before a (range, account) that failed again and again is answered.
pub const MOST_DELAY: Duration = Duration::from_secs(30);
/// The longest delay pressure on an account or a range adds for everyone else: an honest user
/// logs in within two seconds during an attack.
pub const MOST_PRESSURE_DELAY: Duration = Duration::from_secs(1);
/// After this many failures of one (range, account), its passwords are not even checked until
/// the failures are forgotten: such guesses cost the server nothing.
pub const STOP_CHECKING_AFTER: u32 = 30;
/// Sources remembered at most (the oldest go first), so a spread-out attack cannot grow the
/// table without bound.
pub const MOST_SOURCES: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Source {
    Pair(IpAddr, String),
    Account(String),
    Range(IpAddr),
}

/// When a login is answered, from the time its check starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub failure_after: Duration,
    pub success_after: Duration,
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

    fn pair(range: IpAddr, user: &str) -> Source {
        Source::Pair(range, user.to_string())
    }

    /// When to answer a login of `user` from `range` whose check starts now: a failure after
    /// `base`, doubling with each earlier failure of the pair (up to 30 s) and at least the
    /// pressure on the account or range (`base` doubling, up to 1 s); a success at once,
    /// unless any of them failed lately, then no sooner than a failure.
    pub fn answer(&self, base: Duration, range: IpAddr, user: &str, now: Instant) -> Answer {
        let pair = self.count(&Self::pair(range, user), now);
        let pressure = self
            .count(&Source::Account(user.to_string()), now)
            .max(self.count(&Source::Range(range), now));
        let doubled = |n: u32| base.saturating_mul(1 << n.min(16));
        let failure_after = doubled(pair)
            .min(MOST_DELAY)
            .max(doubled(pressure).min(MOST_PRESSURE_DELAY));
        let success_after = if pair + pressure > 0 {
            failure_after
        } else {
            Duration::ZERO
        };
        Answer {
            failure_after,
            success_after,
        }
    }

    /// Whether a password of `user` from `range` is not worth checking: that pair failed too
    /// often lately.
    pub fn stop_checking(&self, range: IpAddr, user: &str, now: Instant) -> bool {
        self.count(&Self::pair(range, user), now) >= STOP_CHECKING_AFTER
    }

    pub fn failed(&mut self, range: IpAddr, user: &str, now: Instant) {
        for s in [
            Self::pair(range, user),
            Source::Account(user.to_string()),
            Source::Range(range),
        ] {
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

    /// A good password: the pair's failures are forgotten (the account's owner got in from
    /// there). Pressure on the account and the range fades on its own.
    pub fn succeeded(&mut self, range: IpAddr, user: &str) {
        self.seen.remove(&Self::pair(range, user));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(500);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_guessing_pair_is_slowed_hard_and_its_neighbours_a_little() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        let (nat, elsewhere) = (ip("198.18.0.0"), ip("198.19.5.0"));
        let calm = f.answer(BASE, nat, "alice", t0);
        assert_eq!(calm.failure_after, BASE);
        assert_eq!(calm.success_after, Duration::ZERO, "no pressure: at once");
        for _ in 0..31 {
            f.failed(nat, "root", t0);
        }
        let guesser = f.answer(BASE, nat, "root", t0);
        assert_eq!(guesser.failure_after, MOST_DELAY);
        assert_eq!(guesser.success_after, MOST_DELAY, "no early-close oracle");
        assert!(f.stop_checking(nat, "root", t0));
        // The neighbour behind the same NAT logs in to their own account, at most a second
        // later, and is checked.
        let neighbour = f.answer(BASE, nat, "alice", t0);
        assert_eq!(neighbour.success_after, MOST_PRESSURE_DELAY);
        assert!(!f.stop_checking(nat, "alice", t0));
        // root's owner elsewhere too.
        let owner = f.answer(BASE, elsewhere, "root", t0);
        assert_eq!(owner.success_after, MOST_PRESSURE_DELAY);
        assert_eq!(
            f.answer(BASE, elsewhere, "bob", t0).success_after,
            Duration::ZERO
        );
        // Forgotten after a quiet while; a good password clears its pair at once.
        let later = t0 + FORGET_AFTER + Duration::from_secs(1);
        assert!(!f.stop_checking(nat, "root", later));
        assert_eq!(f.answer(BASE, nat, "root", later).failure_after, BASE);
        f.succeeded(nat, "root");
        assert!(!f.stop_checking(nat, "root", t0));
    }

    #[test]
    fn one_failure_doubles_the_pairs_delay_and_puts_the_account_under_pressure() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        let (a, b) = (ip("198.18.0.0"), ip("198.18.1.0"));
        f.failed(a, "alice", t0);
        let again = f.answer(BASE, a, "alice", t0);
        assert_eq!(again.failure_after, BASE * 2);
        assert_eq!(again.success_after, again.failure_after);
        assert_eq!(f.answer(BASE, b, "alice", t0).success_after, BASE * 2);
    }

    #[test]
    fn the_table_of_sources_stays_bounded() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        for i in 0..(MOST_SOURCES as u32 + 500) {
            let range = IpAddr::from((i << 8).to_be_bytes());
            f.failed(range, "u", t0 + Duration::from_millis(i.into()));
        }
        assert!(f.seen.len() <= MOST_SOURCES);
    }
}
