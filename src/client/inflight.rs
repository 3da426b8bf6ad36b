//! How many small files a session keeps asked for ahead: twice what the path delivers in a
//! round trip, as BBR sizes its flight. Too few and a long path idles between answers (64
//! files of 4 KiB over 20 ms are 13 Mbit/s at best); too many and they only queue at the far
//! side. Pure: fed the times files were asked for and arrived.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Sizes the flight from what the files' answers show: the shortest time from asking to
/// arriving (the round trip, with the far side's work) and how many arrived per such time.
#[derive(Debug, Clone)]
pub struct Flight {
    depth: usize,
    start: usize,
    max: usize,
    round_trip: Option<Duration>,
    /// Arrivals since `since`: a window of at least a round trip.
    arrived: usize,
    since: Option<Instant>,
    /// Arrivals a round trip in the last windows, newest last: the flight follows their
    /// most, as one window can fall short by chance (a slow disk, a late top-up).
    recent: VecDeque<f64>,
}

/// Windows whose most sizes the flight.
const WINDOWS: usize = 8;

impl Flight {
    /// Starts at `start` files, never below it, never above `max`.
    pub fn new(start: usize, max: usize) -> Flight {
        let start = start.max(1);
        Flight {
            depth: start,
            start,
            max: max.max(start),
            round_trip: None,
            arrived: 0,
            since: None,
            recent: VecDeque::new(),
        }
    }

    /// Files to keep asked for now.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// A file asked for at `asked` arrived at `now`. Once a window of a round trip has
    /// passed, the flight becomes twice the most arrivals of a round trip in the last
    /// windows: while the flight is what limits, that doubles it each round trip; once the
    /// link or a CPU is, it stays at twice what they carry (never below where it started).
    pub fn arrived(&mut self, asked: Instant, now: Instant) {
        let took = now.saturating_duration_since(asked);
        let round_trip = self.round_trip.map_or(took, |r| r.min(took));
        self.round_trip = Some(round_trip);
        let since = *self.since.get_or_insert(asked);
        self.arrived += 1;
        let window = now.saturating_duration_since(since);
        if window < round_trip || window.is_zero() {
            return;
        }
        let per_round_trip = self.arrived as f64 * round_trip.as_secs_f64() / window.as_secs_f64();
        if self.recent.len() == WINDOWS {
            self.recent.pop_front();
        }
        self.recent.push_back(per_round_trip);
        let most = self.recent.iter().copied().fold(0.0, f64::max);
        self.depth = ((2.0 * most).ceil() as usize).clamp(self.start, self.max);
        tracing::debug!(
            "files in flight: {} ({per_round_trip:.0} a round trip of {round_trip:?})",
            self.depth
        );
        self.arrived = 0;
        self.since = Some(now);
    }
}

/// Where every session's flight starts: what served short paths well before flights grew.
pub const START: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// A path of `rtt` that carries at most `per_second` files, kept full: a file asked for
    /// arrives a round trip later, or after the one before it at the path's rate; after each
    /// arrival the flight is topped up to its depth. Returns the depth after each round trip.
    fn run(flight: &mut Flight, rtt: Duration, per_second: f64, rounds: u32) -> Vec<usize> {
        let spacing = Duration::from_secs_f64(1.0 / per_second);
        let t0 = Instant::now();
        let (mut now, mut last) = (t0, t0);
        let mut out: VecDeque<(Instant, Instant)> = VecDeque::new();
        let mut depths = Vec::new();
        while now < t0 + rtt * rounds {
            while out.len() < flight.depth() {
                last = (now + rtt).max(last + spacing);
                out.push_back((now, last));
            }
            let Some((asked, at)) = out.pop_front() else {
                break;
            };
            now = at;
            flight.arrived(asked, now);
            if depths.len() < ((now - t0).as_secs_f64() / rtt.as_secs_f64()) as usize {
                depths.push(flight.depth());
            }
        }
        depths
    }

    #[test]
    fn a_flight_grows_while_it_limits_and_settles_at_twice_what_the_path_carries() {
        let rtt = Duration::from_millis(20);
        // 20,000 files/s over 20 ms: 400 files a round trip, so a flight of 800.
        let mut f = Flight::new(START, 4096);
        let depths = run(&mut f, rtt, 20_000.0, 30);
        assert!(depths[3] > START, "{depths:?}");
        let last = *depths.last().unwrap();
        assert!((700..=900).contains(&last), "{depths:?}");
    }

    #[test]
    fn a_flight_stays_at_its_start_on_a_short_path_and_at_its_cap_on_a_long_one() {
        // 0.2 ms and 5,000 files/s: one file a round trip.
        let mut short = Flight::new(START, 4096);
        let depths = run(&mut short, Duration::from_micros(200), 5_000.0, 6);
        assert!(depths.iter().all(|&d| d == START), "{depths:?}");
        // 600 ms and 100,000 files/s: 60,000 a round trip, more than the cap.
        let mut long = Flight::new(START, 1024);
        let depths = run(&mut long, Duration::from_millis(600), 100_000.0, 10);
        assert_eq!(*depths.last().unwrap(), 1024, "{depths:?}");
    }

    #[test]
    fn the_round_trip_is_the_shortest_answer_not_the_queued_ones() {
        let mut f = Flight::new(START, 4096);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // One answer in 10 ms, then a window where answers queue for 100 ms at 1 file/ms.
        f.arrived(t0, t0 + ms(10));
        for i in 0..100u64 {
            f.arrived(t0 + ms(10), t0 + ms(110 + i));
        }
        // 1 file/ms over a 10 ms round trip: 10 a round trip, under the start.
        assert_eq!(f.depth(), START);
        assert_eq!(f.round_trip, Some(ms(10)));
    }
}
