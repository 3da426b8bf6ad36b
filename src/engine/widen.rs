//! Background mode's connection count. Its limit is its rate, so it starts on one
//! connection (its probes and slowdowns stay clean, and a slow link gets one flow's bursts).
//! A connection carries at most its window per round trip, though: on a long fast path
//! (lfn-500m: about 150 Mbit/s for one at 150 ms) the controller allows more than it can
//! carry. As many connections again open whenever the ones open moved clearly less than even
//! the lowest rate they were paced at over a measurement (which takes eight round trips: one
//! more at a time took five seconds to reach the five lfn-500m needs). A queue would not let
//! that last: the controller cuts to what is delivered when one builds, so what holds them
//! back is not the network (a window, the sender's buffer, or a slow end, where more cost
//! little). A long thin path shows the same shortfall for a while after each change of rate
//! (what is delivered is a round trip late): only rates that each connection could not carry
//! in a window, near the most one carries, count.
//!
//! Pure: it reads the [`View`] and gives decisions.

use super::hooks::{Decision, Note, Policy};
use super::stats::View;
use std::time::Duration;

/// How long each measurement runs, at least: a second, and eight round trips (a new
/// connection's slow start to the share of a fast path before the next is judged; on a long
/// path, the doubling of slow start over more than a round trip of delivery's lag, which
/// alone shows a shortfall over one or two).
const EVERY: Duration = Duration::from_secs(1);
const EVERY_RTTS: u32 = 8;

/// Delivered under the paced rate by more than this factor asks for one more connection.
const SHORT_BY: f64 = 1.25;

/// The share of what one connection carries at most (its window per round trip) that each
/// must be paced at for a shortfall to count.
const NEAR_WINDOW: f64 = 0.5;

#[derive(Debug)]
pub struct Widen {
    max: usize,
    /// The most one connection carries, bytes/s: its window over the round trip.
    window_rate: f64,
    every: Duration,
    /// When the measurement began, the bytes moved by then, and the lowest rate paced since
    /// (None once a tick was unpaced).
    from: Option<(Duration, u64, Option<u64>)>,
    notes: Vec<Note>,
}

impl Widen {
    /// `max`: the most connections it opens; `window` (bytes) over `rtt`: the most one
    /// connection carries.
    pub fn new(max: usize, window: u64, rtt: Duration) -> Widen {
        Widen {
            max: max.max(1),
            window_rate: window as f64 / rtt.as_secs_f64().max(1e-3),
            every: EVERY.max(rtt * EVERY_RTTS),
            from: None,
            notes: Vec::new(),
        }
    }
}

impl Policy for Widen {
    fn decide(&mut self, view: &View) -> Vec<Decision> {
        // Measured from the first byte: before it, a round trip or two of nothing carried
        // says nothing of the connections.
        if view.done == 0 {
            return Vec::new();
        }
        let Some((since, done_then, lowest)) = self.from else {
            self.from = Some((view.elapsed, view.done, view.pacing));
            return Vec::new();
        };
        let lowest = lowest.zip(view.pacing).map(|(a, b)| a.min(b));
        if view.elapsed < since + self.every {
            self.from = Some((since, done_then, lowest));
            return Vec::new();
        }
        self.from = Some((view.elapsed, view.done, view.pacing));
        let Some(paced) = lowest else {
            return Vec::new();
        };
        let secs = (view.elapsed - since).as_secs_f64();
        let delivered = view.done.saturating_sub(done_then) as f64 / secs;
        let open = view.active().count();
        // Too little left for another connection to carry a share of.
        let left = view.total.map(|t| t.saturating_sub(view.done) as f64);
        let ending = left.is_some_and(|l| l < paced as f64 * self.every.as_secs_f64());
        let each = paced as f64 / open.max(1) as f64;
        if delivered * SHORT_BY >= paced as f64
            || each < NEAR_WINDOW * self.window_rate
            || view.opening > 0
            || open >= self.max
            || ending
        {
            return Vec::new();
        }
        let more = open.min(self.max - open);
        self.notes.push(Note {
            t: view.elapsed.as_secs_f64(),
            streams: open,
            goodput: Some(delivered),
            loss: None,
            queue: None,
            action: format!(
                "paced at {:.2} MB/s, carried {:.0}%: {} more connections",
                paced as f64 / 1e6,
                100.0 * delivered / paced as f64,
                more
            ),
        });
        vec![Decision::Open(more)]
    }

    fn notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::stats::LinkView;
    use crate::engine::transfer::LinkState;

    const MB: u64 = 1_000_000;
    /// lfn-500m's: one connection carries 20 MB/s at most.
    const WINDOW: u64 = 3 * MB;
    const RTT: Duration = Duration::from_millis(150);

    /// `secs` in, `done` bytes moved, paced at `pacing` bytes/s, over `links` open connections.
    fn view(secs: f64, done: u64, pacing: Option<u64>, links: usize) -> View {
        View {
            elapsed: Duration::from_secs_f64(secs),
            total: Some(1000 * MB),
            done,
            pacing,
            links: (0..links)
                .map(|id| LinkView {
                    id,
                    state: LinkState::Open,
                    retiring: false,
                    bytes: done / links as u64,
                    rate: 0.0,
                    tcp: None,
                })
                .collect(),
            ..View::at_start(None)
        }
    }

    #[test]
    fn connections_that_carry_less_than_their_pacing_double_up_to_the_most() {
        let mut w = Widen::new(3, WINDOW, RTT);
        assert!(w.decide(&view(0.0, MB, Some(30 * MB), 1)).is_empty());
        assert!(
            w.decide(&view(1.0, 18 * MB, Some(30 * MB), 1)).is_empty(),
            "too soon"
        );
        assert_eq!(
            w.decide(&view(2.0, 36 * MB, Some(30 * MB), 1)),
            vec![Decision::Open(1)],
            "18 MB/s of 30"
        );
        assert_eq!(w.notes().len(), 1);
        let mut v = view(4.0, 70 * MB, Some(40 * MB), 1);
        v.opening = 1;
        assert!(w.decide(&v).is_empty(), "one is on its way");
        assert_eq!(
            w.decide(&view(6.0, 130 * MB, Some(60 * MB), 2)),
            vec![Decision::Open(1)],
            "30 MB/s of 60 on two: as many again, but three is the most"
        );
        assert!(
            w.decide(&view(8.0, 190 * MB, Some(60 * MB), 3)).is_empty(),
            "three is the most"
        );
    }

    #[test]
    fn the_count_doubles() {
        let mut w = Widen::new(8, WINDOW, RTT);
        w.decide(&view(0.0, MB, Some(60 * MB), 2));
        assert_eq!(
            w.decide(&view(2.0, 41 * MB, Some(60 * MB), 2)),
            vec![Decision::Open(2)],
            "20 MB/s of 60 on two"
        );
    }

    #[test]
    fn a_rate_that_gets_through_or_a_tick_unpaced_asks_for_none() {
        let mut w = Widen::new(8, WINDOW, RTT);
        w.decide(&view(0.0, 0, Some(30 * MB), 1));
        assert!(
            w.decide(&view(2.0, 0, Some(30 * MB), 1)).is_empty(),
            "nothing arrived yet on a long path"
        );
        w.decide(&view(2.1, 10 * MB, Some(30 * MB), 1));
        assert!(
            w.decide(&view(4.1, 60 * MB, Some(30 * MB), 1)).is_empty(),
            "25 MB/s of 30 is the pacing's doing"
        );
        // A cut in the middle of the measurement: judged against the lowest rate.
        w.decide(&view(5.1, 70 * MB, Some(10 * MB), 1));
        assert!(w.decide(&view(6.1, 80 * MB, Some(30 * MB), 1)).is_empty());
        w.decide(&view(7.1, 82 * MB, None, 1));
        assert!(
            w.decide(&view(8.1, 84 * MB, Some(30 * MB), 1)).is_empty(),
            "unpaced for a tick"
        );
    }

    #[test]
    fn none_far_below_what_a_window_carries() {
        // satellite-t1: paced at 0.22 MB/s, 0.16 delivered while slow start's overshoot
        // stands in the queue; one connection would carry 5 MB/s there.
        let mut w = Widen::new(8, WINDOW, Duration::from_millis(590));
        w.decide(&view(6.0, MB, Some(220_000), 1));
        assert!(
            w.decide(&view(11.0, MB + 800_000, Some(220_000), 1))
                .is_empty()
        );
        // On lfn-500m two connections paced at 16 MB/s (8 each) that carry 10 are far
        // from their windows too: the network's doing.
        let mut w = Widen::new(8, WINDOW, RTT);
        w.decide(&view(6.0, MB, Some(16 * MB), 2));
        assert!(w.decide(&view(8.0, 21 * MB, Some(16 * MB), 2)).is_empty());
    }

    #[test]
    fn none_near_the_end() {
        let mut w = Widen::new(8, WINDOW, RTT);
        // 10 MB/s of 30, but 30 MB left: less than a measurement at the paced rate.
        w.decide(&view(0.0, 950 * MB, Some(30 * MB), 1));
        assert!(w.decide(&view(2.0, 970 * MB, Some(30 * MB), 1)).is_empty());
    }
}
