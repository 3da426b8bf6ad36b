//! The count search: up by half while a step pays, back or bisect when it does not, then
//! settled with a probe a quarter up or down now and then. One method per phase.

use super::measure::{Score, congested, fewer_carry, full, percent};
use super::{Auto, Phase};
use crate::engine::hooks::Decision;
use crate::engine::stats::View;

impl Auto {
    /// The next move of the count search once an interval at `s.n` connections has been
    /// judged; `useful`: no more connections than blocks left.
    pub(super) fn step_count(&mut self, view: &View, s: Score, useful: usize) -> Vec<Decision> {
        if congested(&s) {
            // The path changed: what a probe down lost before says nothing now.
            self.floor = 1;
        }
        match self.phase {
            Phase::Trial(trial) => self.trial(view, s, trial, useful),
            Phase::Up { before: None }
                if s.n > 1 && congested(&s) && fewer_carry(&s, (s.n / 2).max(1)) =>
            {
                self.fewer_first(view, s)
            }
            Phase::Up {
                before: Some(before),
            } if !self.pays(&s, &before) => self.step_up_lost(view, s, before),
            Phase::Up { before } => self.up_again(view, s, before, useful),
            Phase::Down { before } => self.down(view, s, before),
            Phase::Bisect { lo, hi } => self.bisect(view, s, lo, hi),
            Phase::Hold { left, up_next } if left > 1 => {
                self.phase = Phase::Hold {
                    left: left - 1,
                    up_next,
                };
                Vec::new()
            }
            Phase::Hold { up_next, .. } => self.probe(view, s, up_next, useful),
            Phase::Probe { from, up } => self.probe_ended(view, s, from, up),
        }
    }

    /// Whether `now` pays for itself against `before`: utility up by more than `gain`.
    fn pays(&self, now: &Score, before: &Score) -> bool {
        now.utility > before.utility * (1.0 + self.cfg.gain)
    }

    /// The first measure shows loss or a standing queue already: fewer first.
    fn fewer_first(&mut self, view: &View, s: Score) -> Vec<Decision> {
        self.phase = Phase::Down { before: s };
        let to = (s.n / 2).max(1);
        let why = format!("first measure, congested; trying {to}");
        self.move_to(to, view, &s, why)
    }

    /// A step up from `before` that did not pay: bisect if it added goodput but at a cost,
    /// else back (a probe that lost: the next waits twice as long).
    fn step_up_lost(&mut self, view: &View, s: Score, before: Score) -> Vec<Decision> {
        let gained = percent(s.goodput, before.goodput);
        let mid = (before.n + s.n) / 2;
        if s.goodput > before.goodput * (1.0 + self.cfg.gain) && mid > before.n {
            self.phase = Phase::Bisect { lo: before, hi: s };
            let why = format!("{gained} over {}, but at a cost; trying {mid}", before.n);
            return self.move_to(mid, view, &s, why);
        }
        self.failed_probes += 1;
        self.phase = self.hold(false);
        let why = format!(
            "{gained} over {}: not worth it; back to {}",
            before.n, before.n
        );
        self.move_to(before.n, view, &s, why)
    }

    /// The first measure, or a step up that paid: up again by half, unless the link is full
    /// or there is no room.
    fn up_again(
        &mut self,
        view: &View,
        s: Score,
        before: Option<Score>,
        useful: usize,
    ) -> Vec<Decision> {
        let up = (s.n + s.n.div_ceil(2)).min(useful);
        let why = match before {
            Some(b) => format!("{} over {}", percent(s.goodput, b.goodput), b.n),
            None => "first measure".into(),
        };
        if full(&s) {
            self.phase = self.hold(false);
            let why = format!(
                "{why}; the link is full ({:.2} RTTs of standing queue): staying at {}",
                s.queue, s.n
            );
            self.note(view, Some(&s), why);
            Vec::new()
        } else if up > s.n {
            self.phase = Phase::Up { before: Some(s) };
            self.move_to(up, view, &s, format!("{why}; trying {up}"))
        } else {
            self.phase = self.hold(false);
            self.note(view, Some(&s), format!("{why}; no room to add"));
            Vec::new()
        }
    }

    /// Halving while fewer do as well as `before`, the count above.
    fn down(&mut self, view: &View, s: Score, before: Score) -> Vec<Decision> {
        let gained = percent(s.goodput, before.goodput);
        let down = s.n / 2;
        if s.utility < before.utility {
            self.phase = self.hold(true);
            let why = format!("{gained} against {}: back to {}", before.n, before.n);
            self.move_to(before.n, view, &s, why)
        } else if down >= 1 {
            self.phase = Phase::Down { before: s };
            let why = format!(
                "{gained} against {}: fewer do as well; trying {down}",
                before.n
            );
            self.move_to(down, view, &s, why)
        } else {
            self.phase = self.hold(true);
            let why = format!("{gained} against {}: settled", before.n);
            self.note(view, Some(&s), why);
            Vec::new()
        }
    }

    /// Between a count that paid (`lo`) and a larger one that did not (`hi`): halves the gap
    /// until it closes, then settles at the better end.
    fn bisect(&mut self, view: &View, s: Score, mut lo: Score, mut hi: Score) -> Vec<Decision> {
        if s.utility >= lo.utility {
            lo = s;
        } else {
            hi = s;
        }
        let mid = (lo.n + hi.n) / 2;
        if mid != lo.n && mid != hi.n {
            self.phase = Phase::Bisect { lo, hi };
            let why = format!("between {} and {}: trying {mid}", lo.n, hi.n);
            return self.move_to(mid, view, &s, why);
        }
        let best = if hi.utility > lo.utility { hi } else { lo };
        self.phase = self.hold(true);
        self.move_to(best.n, view, &s, format!("settled at {}", best.n))
    }

    /// Settled long enough: a quarter of the count (at least one) up or down, where the floor,
    /// the blocks left and the time left allow; with the link full, only down.
    fn probe(&mut self, view: &View, s: Score, up_next: bool, useful: usize) -> Vec<Decision> {
        let up_next = up_next && !full(&s);
        let by = (s.n / 4).max(1);
        let to = if up_next {
            s.n + by
        } else {
            s.n.saturating_sub(by)
        };
        // Connections their windows hold back may carry less when fewer: no probe down then.
        let held = !up_next && !fewer_carry(&s, to);
        if held || to < self.floor || to > useful || !self.room_for_probe(view, &s) {
            self.phase = self.hold(!up_next);
            return Vec::new();
        }
        self.phase = Phase::Probe {
            from: s,
            up: up_next,
        };
        self.move_to(to, view, &s, format!("probing {to}"))
    }

    /// A probe away from `from` measured: kept if it pays (up) or does as well (down), else
    /// back; a probe down that lost sets the floor.
    fn probe_ended(&mut self, view: &View, s: Score, from: Score, up: bool) -> Vec<Decision> {
        let gained = percent(s.goodput, from.goodput);
        let keep = if up {
            self.pays(&s, &from)
        } else {
            s.utility >= from.utility
        };
        if keep {
            self.failed_probes = 0;
            self.phase = self.hold(!up);
            let why = format!("{gained} against {}: keeping {}", from.n, s.n);
            self.note(view, Some(&s), why);
            return Vec::new();
        }
        self.failed_probes += 1;
        if !up {
            self.floor = from.n;
        }
        self.phase = self.hold(!up);
        let why = format!("{gained} against {}: back to {}", from.n, from.n);
        self.move_to(from.n, view, &s, why)
    }
}
