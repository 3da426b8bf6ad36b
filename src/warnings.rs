//! Warnings an attacker can provoke at will (a refused data connection, a failed login, a
//! refused connection) are written once per interval for each kind and source range, with a
//! count of those held back since: a stranger hammering the passive port used to write a line
//! per attempt (4,936 lines during one upload). [`Throttle`] decides; [`warn`] is the one
//! instance the process writes through.

use braid_proto::addr::Ranges;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// At most one line per kind and range in this long.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Sources remembered at most; beyond, everything of a kind is counted under one entry.
pub const MOST_SOURCES: usize = 4096;
/// Lines of one kind at most in an interval, whatever the sources: an attacker with a fresh
/// range for every attempt is held back too.
pub const MOST_LINES: u32 = 10;

/// What to do with one more event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Say {
    /// Write it, saying how many like it were held back since the last line.
    Write { held_back: u64 },
    /// Count it and write nothing.
    Quiet,
}

#[derive(Debug, Default)]
pub struct Throttle {
    seen: HashMap<(&'static str, Option<IpAddr>), (Instant, u64)>,
    /// Per kind: when its interval began, the lines written in it, and the events held back
    /// by the cap on lines, said with its next line.
    kinds: HashMap<&'static str, (Instant, u32, u64)>,
}

impl Throttle {
    /// One more event of `kind` from `range`.
    pub fn event(&mut self, kind: &'static str, range: IpAddr, now: Instant) -> Say {
        let Say::Write { held_back } = self.per_source(kind, range, now) else {
            return Say::Quiet;
        };
        let (start, written, over) = self.kinds.entry(kind).or_insert((now, 0, 0));
        if now.saturating_duration_since(*start) >= INTERVAL {
            (*start, *written) = (now, 0);
        }
        if *written >= MOST_LINES {
            *over += held_back + 1;
            return Say::Quiet;
        }
        *written += 1;
        Say::Write {
            held_back: held_back + std::mem::take(over),
        }
    }

    fn per_source(&mut self, kind: &'static str, range: IpAddr, now: Instant) -> Say {
        if self.seen.len() >= MOST_SOURCES {
            // Sources quiet for an interval go; what they held back is said with their kind's
            // next line.
            let kinds = &mut self.kinds;
            self.seen.retain(|(k, _), (last, held)| {
                let keep = now.saturating_duration_since(*last) < INTERVAL;
                if !keep && *held > 0 {
                    kinds.entry(k).or_insert((*last, 0, 0)).2 += *held;
                }
                keep
            });
        }
        // Too many sources at once: one entry for the kind stands for all of them.
        let key =
            if self.seen.len() >= MOST_SOURCES && !self.seen.contains_key(&(kind, Some(range))) {
                (kind, None)
            } else {
                (kind, Some(range))
            };
        match self.seen.get_mut(&key) {
            Some((last, held)) if now.saturating_duration_since(*last) < INTERVAL => {
                *held += 1;
                Say::Quiet
            }
            Some((last, held)) => {
                let held_back = std::mem::take(held);
                *last = now;
                Say::Write { held_back }
            }
            None => {
                self.seen.insert(key, (now, 0));
                Say::Write { held_back: 0 }
            }
        }
    }
}

/// Writes a warning about `from` unless one of the same `kind` from its range was written in
/// the last [`INTERVAL`]; the next one written says how many were held back.
pub fn warn(kind: &'static str, from: IpAddr, message: std::fmt::Arguments<'_>) {
    static THROTTLE: LazyLock<Mutex<Throttle>> = LazyLock::new(Mutex::default);
    // Ranges as the login limits count them by default.
    let range = Ranges::default().of(from);
    let say = THROTTLE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .event(kind, range, Instant::now());
    match say {
        Say::Write { held_back: 0 } => tracing::warn!(%from, "{message}"),
        Say::Write { held_back } => tracing::warn!(
            %from,
            "{message} (and {held_back} more like it since the last such line)"
        ),
        Say::Quiet => tracing::debug!(%from, "{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_from_one_range_writes_a_line_per_interval_with_a_count() {
        let t0 = Instant::now();
        let mut t = Throttle::default();
        let a = IpAddr::from([198, 18, 0, 0]);
        let b = IpAddr::from([198, 18, 1, 0]);
        let mut lines = 0;
        for i in 0..5000u64 {
            let now = t0 + Duration::from_millis(i * 4); // 20 s
            if let Say::Write { .. } = t.event("stranger", a, now) {
                lines += 1;
            }
        }
        assert_eq!(lines, 2);
        assert_eq!(
            t.event("stranger", a, t0 + Duration::from_secs(21)),
            Say::Write { held_back: 2499 }
        );
        // Another kind and another range are not held back by it.
        assert_eq!(t.event("login", a, t0), Say::Write { held_back: 0 });
        assert_eq!(t.event("stranger", b, t0), Say::Write { held_back: 0 });
    }

    #[test]
    fn a_fresh_range_for_every_event_is_held_back_too_and_memory_stays_bounded() {
        let t0 = Instant::now();
        let mut t = Throttle::default();
        let mut lines = 0;
        let n = MOST_SOURCES as u32 * 3;
        for i in 0..n {
            let range = IpAddr::from((i << 8).to_be_bytes());
            if let Say::Write { .. } = t.event("stranger", range, t0) {
                lines += 1;
            }
        }
        assert!(t.seen.len() <= MOST_SOURCES + 1);
        assert_eq!(lines, MOST_LINES);
        // The next interval's first line counts what was held back.
        let later = t0 + INTERVAL;
        let next = t.event("stranger", IpAddr::from([198, 51, 100, 0]), later);
        assert_eq!(
            next,
            Say::Write {
                held_back: u64::from(n - MOST_LINES)
            }
        );
    }
}
