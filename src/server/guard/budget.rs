//! How many password checks may start, per account and per address range: token buckets,
//! refilled with time. A guesser holding any number of ranges gets one check per second for an
//! account (a password planted as the 150th guess takes two and a half minutes, not seven
//! seconds), and one range spraying many accounts two per second.
//!
//! A budget per account would let the guesser spend its owner's checks too, so a (range,
//! account) that logged in lately is familiar and checked on a budget of its own, as
//! "smart lockout" systems tell familiar locations from the rest: the attacker would have to
//! share the owner's range, and then only shares the owner's budget. Familiar pairs are
//! remembered in memory, so after a restart the owner's first login competes with strangers.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// One lane's refill rate and burst.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_second: f64,
    burst: f64,
}

/// Checks of an account from ranges it did not log in from lately.
const STRANGERS: Rate = Rate {
    per_second: 1.0,
    burst: 3.0,
};
/// Checks of an account from one range it logged in from lately.
const FAMILIAR: Rate = Rate {
    per_second: 1.0,
    burst: 3.0,
};
/// Checks from one range of strangers' passwords, whatever the account.
const RANGE: Rate = Rate {
    per_second: 2.0,
    burst: 10.0,
};

/// How long a successful login makes its (range, account) familiar.
pub const FAMILIAR_FOR: Duration = Duration::from_secs(30 * 86_400);
/// Entries kept at most in each table; buckets that are full again carry nothing and go
/// first, then the oldest.
pub const MOST_ENTRIES: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Lane {
    Strangers(String),
    Familiar(IpAddr, String),
    Range(IpAddr),
}

impl Lane {
    fn rate(&self) -> Rate {
        match self {
            Lane::Strangers(_) => STRANGERS,
            Lane::Familiar(..) => FAMILIAR,
            Lane::Range(_) => RANGE,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What a check may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Start now; `familiar`: the pair logged in lately (its check goes first in the pool).
    Now { familiar: bool },
    /// Ask again at this time.
    Later(Instant),
}

#[derive(Debug, Default)]
pub struct Budget {
    buckets: HashMap<Lane, Bucket>,
    familiar: HashMap<(IpAddr, String), Instant>,
    /// The last login from each range, bounded as `familiar`.
    known: HashMap<IpAddr, Instant>,
}

impl Budget {
    fn tokens(&self, lane: &Lane, now: Instant) -> f64 {
        let rate = lane.rate();
        self.buckets.get(lane).map_or(rate.burst, |b| {
            let refilled = now.saturating_duration_since(b.at).as_secs_f64() * rate.per_second;
            (b.tokens + refilled).min(rate.burst)
        })
    }

    /// When `lane` has a whole token, from `now`.
    fn ready_at(&self, lane: &Lane, now: Instant) -> Instant {
        let missing = 1.0 - self.tokens(lane, now);
        if missing <= 0.0 {
            return now;
        }
        now + Duration::from_secs_f64(missing / lane.rate().per_second)
    }

    fn spend(&mut self, lane: Lane, now: Instant) {
        let tokens = self.tokens(&lane, now) - 1.0;
        self.buckets.insert(lane, Bucket { tokens, at: now });
        if self.buckets.len() > MOST_ENTRIES {
            let full: Vec<Lane> = self
                .buckets
                .keys()
                .filter(|l| self.tokens(l, now) >= l.rate().burst)
                .cloned()
                .collect();
            for l in full {
                self.buckets.remove(&l);
            }
            while self.buckets.len() > MOST_ENTRIES {
                let oldest = self
                    .buckets
                    .iter()
                    .min_by_key(|(_, b)| b.at)
                    .map(|(l, _)| l.clone());
                match oldest {
                    Some(l) => self.buckets.remove(&l),
                    None => break,
                };
            }
        }
    }

    pub fn is_familiar(&self, range: IpAddr, user: &str, now: Instant) -> bool {
        self.familiar
            .get(&(range, user.to_string()))
            .is_some_and(|at| now.saturating_duration_since(*at) < FAMILIAR_FOR)
    }

    /// Whether someone logged in from `range` lately: its new connections are pushed out after
    /// strangers' (see `startups`).
    pub fn is_known(&self, range: IpAddr, now: Instant) -> bool {
        self.known
            .get(&range)
            .is_some_and(|at| now.saturating_duration_since(*at) < FAMILIAR_FOR)
    }

    /// Takes a check of `user`'s password from `range` out of the budget, or says when to ask
    /// again.
    pub fn take(&mut self, range: IpAddr, user: &str, now: Instant) -> Turn {
        let familiar = self.is_familiar(range, user, now);
        let lanes = if familiar {
            vec![Lane::Familiar(range, user.to_string())]
        } else {
            vec![Lane::Strangers(user.to_string()), Lane::Range(range)]
        };
        let ready = lanes
            .iter()
            .map(|l| self.ready_at(l, now))
            .max()
            .unwrap_or(now);
        if ready > now {
            return Turn::Later(ready);
        }
        for l in lanes {
            self.spend(l, now);
        }
        Turn::Now { familiar }
    }

    /// `user` logged in from `range`: the pair is familiar from now on.
    pub fn succeeded(&mut self, range: IpAddr, user: &str, now: Instant) {
        self.familiar.insert((range, user.to_string()), now);
        self.known.insert(range, now);
        bound(&mut self.familiar, now);
        bound(&mut self.known, now);
    }
}

/// Keeps at most [`MOST_ENTRIES`] times of success: the expired go first, then the oldest.
fn bound<K: Clone + Eq + std::hash::Hash>(table: &mut HashMap<K, Instant>, now: Instant) {
    if table.len() <= MOST_ENTRIES {
        return;
    }
    table.retain(|_, at| now.saturating_duration_since(*at) < FAMILIAR_FOR);
    while table.len() > MOST_ENTRIES {
        let oldest = table
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => table.remove(&k),
            None => break,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(i: u32) -> IpAddr {
        IpAddr::from((0xc612_0000u32 + (i << 8)).to_be_bytes())
    }

    /// Guesses as fast as the budget allows from a fresh range each time, for `seconds`:
    /// how many checks of the account started.
    fn guess(b: &mut Budget, t0: Instant, seconds: u64, user: &str) -> u32 {
        let mut now = t0;
        let mut checks = 0;
        let mut i = 1000;
        while now < t0 + Duration::from_secs(seconds) {
            i += 1;
            match b.take(range(i), user, now) {
                Turn::Now { familiar } => {
                    assert!(!familiar);
                    checks += 1;
                }
                Turn::Later(at) => now = at,
            }
        }
        checks
    }

    #[test]
    fn any_number_of_ranges_get_one_check_a_second_of_an_account() {
        let t0 = Instant::now();
        let mut b = Budget::default();
        let checks = guess(&mut b, t0, 60, "alice");
        // The burst, then one a second: the 150th guess is far away.
        assert!((60..=63).contains(&checks), "{checks} checks in 60 s");
    }

    #[test]
    fn the_owner_from_a_familiar_range_keeps_a_budget_of_their_own() {
        let t0 = Instant::now();
        let mut b = Budget::default();
        let home = range(1);
        b.succeeded(home, "alice", t0);
        guess(&mut b, t0, 10, "alice");
        let t = t0 + Duration::from_secs(10);
        // Whatever the strangers left is spent now.
        while b.take(range(5000), "alice", t) == (Turn::Now { familiar: false }) {}
        assert!(matches!(b.take(range(5001), "alice", t), Turn::Later(_)));
        assert_eq!(b.take(home, "alice", t), Turn::Now { familiar: true });
        // A stranger's account from the owner's range is on the strangers' budget.
        assert_eq!(b.take(home, "bob", t), Turn::Now { familiar: false });
        // Familiarity fades.
        let later = t0 + FAMILIAR_FOR + Duration::from_secs(1);
        assert!(!b.is_familiar(home, "alice", later));
        assert!(b.is_known(home, t) && !b.is_known(range(5000), t) && !b.is_known(home, later));
    }

    #[test]
    fn one_range_spraying_accounts_gets_two_checks_a_second() {
        let t0 = Instant::now();
        let mut b = Budget::default();
        let mut now = t0;
        let mut checks = 0;
        for i in 0..1000 {
            loop {
                match b.take(range(7), &format!("user{i}"), now) {
                    Turn::Now { .. } => break,
                    Turn::Later(at) => now = at,
                }
            }
            checks += 1;
            if now >= t0 + Duration::from_secs(30) {
                break;
            }
        }
        assert!((70..=72).contains(&checks), "{checks} checks in 30 s");
    }

    #[test]
    fn the_tables_stay_bounded() {
        let t0 = Instant::now();
        let mut b = Budget::default();
        for i in 0..(MOST_ENTRIES as u32 + 300) {
            let now = t0 + Duration::from_millis(i.into());
            b.take(range(i), &format!("u{i}"), now);
            b.succeeded(range(i), "u", now);
        }
        assert!(b.buckets.len() <= MOST_ENTRIES);
        assert!(b.familiar.len() <= MOST_ENTRIES && b.known.len() <= MOST_ENTRIES);
    }
}
