//! Connections that have not logged in yet ("startups", as OpenSSH calls them). They are
//! capped in total, well below the cap on all connections, and per address range; when the
//! total is reached a newcomer is let in and one of the oldest connections of the range
//! holding the most places is closed instead, preferring one that is not in the middle of a
//! password check. An attacker holding every place from a few ranges so only ever pushes out its own
//! connections, and an honest user's newer one from a quieter range stays (before, 256 idle
//! connections from 8 ranges locked everyone out for the login timeout).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The login timeout once more than half the places are taken.
pub const SHORT_LOGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Most places one range may hold, of `max` in all: a quarter, so that it takes four ranges
/// to fill them and a newcomer always pushes out one of theirs.
pub fn per_range(max: usize) -> usize {
    (max / 4).max(2)
}

#[derive(Debug, Clone, Copy)]
struct Place {
    range: IpAddr,
    since: Instant,
    checking: bool,
    /// From a range someone logged in from lately.
    known: bool,
    /// Logging in to an account that logged in from this range lately.
    familiar: bool,
}

/// A place taken: the connection's id, and the one to close to make room, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entered {
    pub id: u64,
    pub evict: Option<u64>,
}

#[derive(Debug, Default)]
pub struct Startups {
    places: HashMap<u64, Place>,
    by_range: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Startups {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.places.len()
    }

    /// Takes a place for a connection from `range` (`known`: someone logged in from there
    /// lately), of `max` in all, or says why not; `pick` is a random number (see `victim`).
    pub fn enter(
        &mut self,
        range: IpAddr,
        known: bool,
        max: usize,
        now: Instant,
        pick: u64,
    ) -> Result<Entered, String> {
        let max = max.max(1);
        // Only connections that are not logging in count here: a neighbour's guesses waiting
        // for their checks must not keep an honest user of the same network out (the places
        // they hold are still capped in total, and the range's are pushed out first).
        let here = self
            .places
            .values()
            .filter(|p| p.range == range && !p.checking)
            .count();
        let cap = per_range(max).min(max);
        if here >= cap {
            return Err(format!(
                "Too many connections from your network waiting to log in (limit {cap}); try again later."
            ));
        }
        let evict = if self.places.len() >= max {
            let victim = self.victim(pick);
            if let Some(v) = victim {
                self.leave(v);
            }
            victim
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        self.places.insert(
            id,
            Place {
                range,
                since: now,
                checking: false,
                known,
                familiar: false,
            },
        );
        *self.by_range.entry(range).or_insert(0) += 1;
        Ok(Entered { id, evict })
    }

    /// The place to free: in the range holding most places, a stranger before a connection
    /// from a range someone logged in from lately or an owner logging in from where they did
    /// before, one not being checked before one that is; then one of the four oldest of those,
    /// at random (`pick`), as OpenSSH's random early drop, so that an attacker cannot tell which
    /// of its connections will go.
    fn victim(&self, pick: u64) -> Option<u64> {
        let class = |p: &Place| {
            let held = self.by_range.get(&p.range).copied().unwrap_or(0);
            (held, !(p.known || p.familiar), !p.checking)
        };
        let worst = self.places.values().map(class).max()?;
        let mut oldest: Vec<(Instant, u64)> = self
            .places
            .iter()
            .filter(|(_, p)| class(p) == worst)
            .map(|(id, p)| (p.since, *id))
            .collect();
        oldest.sort_unstable();
        oldest.truncate(4);
        let i = usize::try_from(pick % oldest.len() as u64).unwrap_or(0);
        oldest.get(i).map(|(_, id)| *id)
    }

    /// Frees a place for a connection that would pass the cap on all connections: the one
    /// `victim` picks goes, if any connection has not logged in yet.
    pub fn push_out(&mut self, pick: u64) -> Option<u64> {
        let victim = self.victim(pick)?;
        self.leave(victim);
        Some(victim)
    }

    /// Marks a connection as waiting for its password check (or done with it), and whether
    /// the account logged in from its range lately.
    pub fn checking(&mut self, id: u64, checking: bool, familiar: bool) {
        if let Some(p) = self.places.get_mut(&id) {
            p.checking = checking;
            p.familiar = familiar && checking;
        }
    }

    /// Gives a place back (logged in, gone, or pushed out); nothing if it was already.
    pub fn leave(&mut self, id: u64) {
        let Some(p) = self.places.remove(&id) else {
            return;
        };
        if let Some(n) = self.by_range.get_mut(&p.range) {
            *n -= 1;
            if *n == 0 {
                self.by_range.remove(&p.range);
            }
        }
    }

    /// The login timeout for a new connection: the configured one, or a short one when more
    /// than half of the `max` places are taken.
    pub fn login_timeout(&self, configured: Duration, max: usize) -> Duration {
        if self.places.len() * 2 > max {
            configured.min(SHORT_LOGIN_TIMEOUT)
        } else {
            configured
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(i: u8) -> IpAddr {
        IpAddr::from([198, 18, i, 0])
    }

    #[test]
    fn eight_ranges_filling_every_place_only_push_out_their_own() {
        let t0 = Instant::now();
        let max = 64;
        let mut s = Startups::default();
        let mut ids = HashMap::new();
        let mut t = t0;
        // 256 attempts from 8 ranges, round robin.
        for i in 0..256u32 {
            t += Duration::from_millis(1);
            let r = range((i % 8) as u8);
            if let Ok(e) = s.enter(r, false, max, t, 0) {
                ids.insert(e.id, r);
            }
        }
        assert_eq!(s.len(), max);
        // The honest newcomer gets in and pushes out an attacker's oldest connection.
        let honest = s.enter(range(200), false, max, t, 0).unwrap();
        let victim = honest.evict.expect("full: someone makes room");
        assert_ne!(ids[&victim], range(200));
        // The attacker keeps reconnecting; whatever the random picks, the honest connection
        // stays.
        for i in 0..1000u32 {
            t += Duration::from_millis(1);
            if let Ok(e) = s.enter(range((i % 8) as u8), false, max, t, u64::from(i) * 7919) {
                assert_ne!(e.evict, Some(honest.id));
            }
        }
        assert!(s.places.contains_key(&honest.id));
    }

    #[test]
    fn one_range_holds_a_quarter_and_checks_are_pushed_out_last() {
        let t0 = Instant::now();
        let max = 8;
        let mut s = Startups::default();
        let a: Vec<Entered> = (0..2)
            .map(|_| s.enter(range(1), false, max, t0, 0).unwrap())
            .collect();
        assert!(
            s.enter(range(1), false, max, t0, 0).is_err(),
            "a quarter of 8"
        );
        for i in 2..8 {
            s.enter(range(i), false, max, t0 + Duration::from_secs(1), 0)
                .unwrap();
        }
        s.checking(a[0].id, true, false);
        let e = s
            .enter(range(9), false, max, t0 + Duration::from_secs(2), 0)
            .unwrap();
        assert_eq!(
            e.evict,
            Some(a[1].id),
            "the fattest range, not the one being checked"
        );
        s.leave(a[1].id); // already gone: nothing happens
        assert_eq!(s.len(), max);
    }

    #[test]
    fn an_owner_from_a_familiar_range_is_pushed_out_after_every_stranger() {
        let t0 = Instant::now();
        let max = 8;
        let mut s = Startups::default();
        // Every place from its own range (a botnet), all being checked; the owner's oldest.
        let owner = s.enter(range(0), false, max, t0, 0).unwrap();
        s.checking(owner.id, true, true);
        for i in 1..max as u8 {
            let e = s
                .enter(range(i), false, max, t0 + Duration::from_secs(1), 0)
                .unwrap();
            s.checking(e.id, true, false);
        }
        for i in 0..100u8 {
            let e = s
                .enter(range(100 + i), false, max, t0 + Duration::from_secs(2), 0)
                .unwrap();
            assert_ne!(e.evict, Some(owner.id));
            s.checking(e.id, true, false);
        }
        // Done checking (logged in or not), it is an ordinary place again.
        s.checking(owner.id, false, true);
        let e = s
            .enter(range(250), false, max, t0 + Duration::from_secs(3), 0)
            .unwrap();
        assert_eq!(e.evict, Some(owner.id));
    }

    #[test]
    fn the_place_pushed_out_is_one_of_the_four_oldest_at_random() {
        let t0 = Instant::now();
        let max = 16;
        let mut s = Startups::default();
        let ids: Vec<u64> = (0..max as u64)
            .map(|i| {
                let at = t0 + Duration::from_secs(i);
                s.enter(range(1 + (i % 4) as u8), false, max, at, 0)
                    .unwrap()
                    .id
            })
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for pick in 0..8 {
            let mut trial = Startups {
                places: s.places.clone(),
                by_range: s.by_range.clone(),
                next_id: s.next_id,
            };
            let e = trial.enter(range(100), false, max, t0 + Duration::from_secs(99), pick);
            seen.insert(e.unwrap().evict.unwrap());
        }
        // Four ranges of four: every place is in a fattest range, and the four oldest are the
        // first four to arrive.
        assert_eq!(seen, ids[..4].iter().copied().collect());
    }

    #[test]
    fn a_connection_over_the_total_cap_pushes_out_one_not_logged_in() {
        let t0 = Instant::now();
        let mut s = Startups::default();
        assert_eq!(s.push_out(0), None, "nobody to push out");
        let a = s.enter(range(1), false, 8, t0, 0).unwrap();
        let b = s.enter(range(2), true, 8, t0, 0).unwrap();
        assert_eq!(s.push_out(0), Some(a.id), "the stranger first");
        assert_eq!(s.push_out(0), Some(b.id));
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn connections_logging_in_do_not_fill_their_networks_share() {
        let t0 = Instant::now();
        let max = 64;
        let mut s = Startups::default();
        // 16 guessers from one NAT, each waiting for its check.
        for _ in 0..16 {
            let e = s.enter(range(1), true, max, t0, 0).unwrap();
            s.checking(e.id, true, false);
        }
        let honest = s.enter(range(1), true, max, t0, 0);
        assert!(honest.is_ok(), "a neighbour is let in");
        // Idle ones still count: 15 more fill the share.
        for _ in 0..15 {
            s.enter(range(1), true, max, t0, 0).unwrap();
        }
        assert!(s.enter(range(1), true, max, t0, 0).is_err());
    }

    #[test]
    fn the_login_timeout_shortens_past_half() {
        let t0 = Instant::now();
        let mut s = Startups::default();
        let configured = Duration::from_secs(60);
        for i in 0..4 {
            s.enter(range(i), false, 8, t0, 0).unwrap();
        }
        assert_eq!(s.login_timeout(configured, 8), configured);
        s.enter(range(9), false, 8, t0, 0).unwrap();
        assert_eq!(s.login_timeout(configured, 8), SHORT_LOGIN_TIMEOUT);
    }
}
