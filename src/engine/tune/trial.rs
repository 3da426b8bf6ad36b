//! The congestion control trial: on a path where BBR's drain costs more than the self-tuning's
//! gain, CUBIC from the start; otherwise, once the first count has warmed up, the sender's
//! control against the other for one long interval each, the other kept only if it pays.

use super::measure::{Score, percent};
use super::{Auto, Phase, Trial};
use crate::engine::hooks::Decision;
use crate::engine::stats::View;
use braid_proto::retr_opts::CcName;
use std::time::Duration;

impl Auto {
    /// The congestion control to start with, once the sender's and the base RTT are known: on
    /// a path where BBR's drain alone costs more than twice `gain` (RTT 400 ms and more),
    /// CUBIC; its trial of BBR may still follow.
    pub(super) fn start_congestion(&mut self, view: &View) -> Option<Decision> {
        if let (false, Some((cc, rtt))) = (self.told_start, self.cfg.start_congestion) {
            self.told_start = true;
            self.chose_start = true;
            let why = format!(
                "{:.0} ms RTT on the control connection: bbr would drain {:.1}% of the time; started with {cc}",
                rtt.as_secs_f64() * 1e3,
                bbr_drain(rtt) * 100.0
            );
            self.note(view, None, why);
        }
        if self.chose_start {
            return None;
        }
        let (Some(cc), Some(base)) = (view.congestion, self.base_rtt) else {
            return None;
        };
        self.chose_start = true;
        if cc.as_str() != "bbr" || !self.cfg.too_long_for_bbr(base) {
            return None;
        }
        let to = other_congestion(cc);
        let why = format!(
            "{:.0} ms RTT: bbr would drain {:.1}% of the time; starting with {to}",
            base.as_secs_f64() * 1e3,
            bbr_drain(base) * 100.0
        );
        self.note(view, None, why);
        self.restart();
        Some(Decision::Congestion(to))
    }

    /// Starts the congestion control trial if it is due, the sender's control is known, there
    /// is time for both halves of it at the goodput `s` measured, and the other control could
    /// pay. BBR gives up at most what it sent again plus its drain every 10 s (200 ms and an
    /// RTT at 4 packets), so a BBR sender that lost little on a short path keeps it (on a
    /// 20 ms DSL line the drain is 2 %, and trying CUBIC only filled the queue). CUBIC gives
    /// up rate only to losses (each cuts its window) and costs only the queue it fills, so a
    /// CUBIC sender that resent nothing and stands little queue keeps it (window-limited
    /// connections on the satellite hop, where BBR's half of a trial cost 0.23 of the link for
    /// 12 s). Returns whether the trial started.
    pub(super) fn begin_trial(&mut self, view: &View, s: &Score, first: bool) -> bool {
        let (false, Some(from)) = (self.tried, view.congestion) else {
            return false;
        };
        let room = view.total.is_none_or(|t| {
            let trial = 2.0 * (self.warmup() + self.trial_interval()).as_secs_f64();
            t.saturating_sub(view.done) as f64 > s.goodput * trial
        });
        if !room {
            return false;
        }
        self.tried = true;
        let keep = if from.as_str() == "bbr" {
            let drain = bbr_drain(self.base_rtt.unwrap_or_default());
            // Twice `gain`: a switch must be expected to beat it clearly, not by a packet of
            // BBR's start-up overshoot (which is what tipped a 20 ms DSL line over `gain`).
            (s.loss + drain < 2.0 * self.cfg.gain).then(|| {
                format!(
                    "bbr sent {:.2}% again and drains {:.1}% of the time: keeping it",
                    s.loss * 100.0,
                    drain * 100.0
                )
            })
        } else if self.cfg.too_long_for_bbr(self.base_rtt.unwrap_or_default()) && s.queue < 1.0 {
            // A path this long is why CUBIC was chosen; BBR could pay only by keeping a long
            // queue shorter. In a queue shorter than the RTT, several BBR connections lose more
            // than CUBIC does (20-30 % of their bytes on satellite-t1, where every trial went
            // back to CUBIC after costing 7-19 s).
            Some(format!(
                "{from} queues {:.2} RTTs, too little for bbr to win back its drain: keeping it",
                s.queue
            ))
        } else {
            (s.loss == 0.0 && self.cfg.delay_weight * s.queue < self.cfg.gain).then(|| {
                format!(
                    "{from} sent nothing again and queues {:.2} RTTs: keeping it",
                    s.queue
                )
            })
        };
        if let Some(why) = keep {
            self.note(view, Some(s), why);
            return false;
        }
        self.phase = Phase::Trial(Trial {
            base: None,
            from,
            to: other_congestion(from),
            first,
        });
        true
    }

    /// A congestion control trial: `s` measured `from` (no `base` yet) or `to`. A trial made
    /// `first`, before any count was judged, hands the better score to the count's climb.
    pub(super) fn trial(
        &mut self,
        view: &View,
        s: Score,
        trial: Trial,
        useful: usize,
    ) -> Vec<Decision> {
        let Trial {
            base,
            from,
            to,
            first,
        } = trial;
        let Some(base) = base else {
            self.phase = Phase::Trial(Trial {
                base: Some(s),
                ..trial
            });
            self.note(view, Some(&s), format!("{from}; trying {to}"));
            self.restart();
            return vec![Decision::Congestion(to)];
        };
        let gained = percent(s.goodput, base.goodput);
        let (best, mut decisions) = if view.congestion != Some(to) {
            self.note(view, Some(&s), format!("the sender kept {from}"));
            (s, Vec::new())
        } else if s.utility > base.utility * (1.0 + self.cfg.gain) {
            let why = format!("{to}: {gained} against {from}; keeping it");
            self.note(view, Some(&s), why);
            (s, Vec::new())
        } else {
            // Goodput alone can rise while the loss and queue it costs outweigh it.
            let utility = if base.utility > 0.0 {
                format!("utility {:+.0}%", (s.utility / base.utility - 1.0) * 100.0)
            } else {
                "no utility to gain".to_string()
            };
            let why = format!("{to}: {gained}, {utility} against {from}; back to {from}");
            self.note(view, Some(&s), why);
            self.restart();
            (base, vec![Decision::Congestion(from)])
        };
        if first {
            self.phase = Phase::Up { before: None };
            decisions.extend(self.step_count(view, best, useful));
        } else {
            self.phase = self.hold(false);
        }
        decisions
    }
}

/// The congestion control a trial compares with `cc`. BBR ignores random loss (where CUBIC
/// needs many connections) and keeps queues short, but drains to 4 packets every 10 s and
/// loses more with many flows in a shallow queue; CUBIC is the other widely available one.
fn other_congestion(cc: CcName) -> CcName {
    let name = if cc.as_str() == "bbr" { "cubic" } else { "bbr" };
    CcName::parse(name).unwrap_or(cc)
}

/// The share of the time BBR spends in its drain (ProbeRTT: 4 packets in flight for 200 ms and
/// an RTT, every 10 s) on a path of `base` RTT: 2 % at 20 ms, 8 % at 590 ms.
pub(super) fn bbr_drain(base: Duration) -> f64 {
    (0.2 + base.as_secs_f64()) / 10.0
}
