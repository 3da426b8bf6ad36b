//! Self-tuning: how many data connections a transfer uses, chosen while it runs (`-n auto`).
//!
//! **Why connections, not buffers.** Linux grows each socket's buffers by itself up to
//! `tcp_rmem`/`tcp_wmem`'s maximum; setting `SO_RCVBUF`/`SO_SNDBUF` turns that off and cannot
//! pass `rmem_max`/`wmem_max` anyway. Where one connection's window is capped below the path's
//! bandwidth-delay product (a 1998 host's 24 KB on a satellite hop, the 4 MiB default on a
//! long fat path) or loss keeps its window small, the lever left is more connections: the
//! XFTP paper's answer (seed 002), which also warns that too many overflow router queues. So
//! buffers stay with the kernel (or `--buffer`) and the controller chooses the count.
//!
//! **What it optimises.** A utility in the manner of Falcon (Arifuzzaman and Arslan, TPDS
//! 2023), measured over an interval with `n` connections:
//! `U = goodput · (1/K^n − B·loss − D·queue)`, where loss is the share of bytes sent again
//! (the sending side reads it from `TCP_INFO`), queue is the rise of the interval's mean RTT
//! over the path's base RTT in base RTTs (capped), K = 1.01 makes every connection cost a little, so a count that
//! adds nothing loses to a smaller one; B = 10 and D = 0.1 make loss and queueing cost more
//! than they bring, which is "stop before the router queue overflows".
//!
//! **How it moves.** It starts at `start` connections (4, the count GridFTP and FDT use, never more
//! than there are blocks), lets them warm up for 3 RTTs and measures intervals of 4 RTTs (0.3-4 s;
//! the base RTT, or the RTT now when a standing queue lengthens it) until the goodput stops rising
//! (at most 4), and judges the count by its best interval, so that slow start and the losses of a
//! change itself are not held against it (a probe down, which opens nothing, by its first). A first
//! measure that already shows loss or a standing queue tries half, unless the connections'
//! windows hold them back and half could not carry their goodput (the queue is then the
//! congestion control's own; see `measure::fewer_carry`). Otherwise it raises the count by
//! half while that pays (U up by more than `gain`) and bisects between the last count that paid and
//! the first that added goodput but not enough; a step up that does not pay goes back, and the
//! first probe after it goes down, after twice the usual wait (halving outright cost a
//! window-limited path seconds at half rate; a probe down costs it a quarter for as long). Steps of
//! a half, not doublings: a doubling past a full link overflows its queue for a whole interval (4
//! to 8 connections with 24 KB windows on the satellite hop lost 5 % of their bytes), and a path
//! that needs many connections gets there one step later. A count that stands a queue of a
//! quarter of the base RTT (its last interval's, when longer than its best's) already fills the
//! link: it is not raised, since more connections could add only queue and loss. Once settled it
//! probes a quarter of the count (at least one) up or down, alternately, every `hold` intervals
//! (longer after each probe that lost) and keeps a probe only if it pays, so it follows a path
//! whose capacity or competition changes; with the link full it probes only down, not to a
//! count that windows would keep from carrying the goodput, and not again below a count whose
//! probe down lost until an interval shows congestion. A connection the
//! server refuses lowers the ceiling for the rest of the transfer. Near the end, when less than
//! two intervals' worth of data is left, it starts nothing new, and a
//! step it cannot judge in time goes back to the count last judged best; a probe needs four.
//!
//! **Which congestion control.** Neither of the two Linux ships widely wins everywhere (measured in
//! the lab): BBR keeps a bloated DSL queue empty where CUBIC fills it and drops, but on the
//! satellite hop BBR's drain to 4 packets every 10 s costs window-limited connections a tenth of
//! their rate, and with several flows in a 96 kB queue it loses more than CUBIC (-n 6 with 24 KB
//! windows: 0.90 of the link with BBR, 0.955 with CUBIC). So on a path whose RTT alone makes BBR's
//! drain cost more than twice `gain` (400 ms and more), the transfer is set up with CUBIC (from the
//! control connection's RTT), or a BBR sender switches to it as soon as the data connections show
//! that RTT. Once the first count has warmed up, unless the user chose a control or the other
//! cannot pay (a BBR sender that lost little on a short path, a CUBIC sender that lost nothing and
//! stood no queue, or stands less than an RTT of queue on a path long enough to have chosen it),
//! it measures the sender's control for one long interval (4 intervals, 10-16 s:
//! one of BBR's cycles), then the other for as long, and keeps the other only if its utility is
//! higher by `gain`; the count's climb starts from the better of the two. An ordinary interval that
//! leaves no doubt ends either half early (the sender's control with a nil utility; the other under
//! [`TRIAL_GIVE_UP`] of it), which spares the path most of the losses or queueing the worse control
//! causes. On a download the server is told mid-transfer (`OPTS RETR Congestion=`).
//!
//! Pure: it sees only [`View`]s and returns [`Decision`]s and [`Note`]s, so it is tested with
//! made-up views (below) and runs the same on the client for downloads and uploads.

mod count;
mod measure;
mod trial;

use crate::engine::hooks::{Decision, Note, Policy, toward};
use crate::engine::stats::View;
use crate::engine::transfer::LinkState;
use braid_proto::retr_opts::CcName;
use measure::{Mark, Score, mean_rtt, min_rtt};
use std::time::Duration;
use trial::bbr_drain;

/// The controller's constants; [`Tuning::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Connections to start with.
    pub start: usize,
    /// Most connections (the server's own limit may be lower; a refusal is noticed).
    pub max: usize,
    /// Block size: never more connections than blocks left to send.
    pub block: u64,
    /// Cost of each connection: utility is divided by `k^n`.
    pub k: f64,
    /// Weight of the retransmitted share of bytes.
    pub loss_weight: f64,
    /// Weight of queueing delay, per base RTT of it (counted up to 4).
    pub delay_weight: f64,
    /// How much a step must raise the utility to be kept (0.03: 3 %).
    pub gain: f64,
    /// Intervals between probes once settled.
    pub hold: u32,
    /// Try the other congestion control once the count has settled (off when the user chose
    /// one).
    pub try_congestion: bool,
    /// The congestion control the transfer was set up with, chosen before it from the control
    /// connection's RTT ([`Tuning::start_on`]); None: the sender's own.
    pub start_congestion: Option<(CcName, Duration)>,
}

impl Tuning {
    pub fn new(block: u64) -> Tuning {
        Tuning {
            start: 4,
            max: 32,
            block: block.max(1),
            k: 1.01,
            loss_weight: 10.0,
            delay_weight: 0.1,
            gain: 0.03,
            hold: 3,
            try_congestion: true,
            start_congestion: None,
        }
    }

    /// Chooses the congestion control to set the transfer up with on a path of `rtt` (the
    /// control connection's): CUBIC where BBR's drain alone would cost more than twice `gain`
    /// (400 ms and more), so that a download's server starts with it rather than switching once
    /// its first report has come. Nothing if the user chose one.
    pub fn start_on(&mut self, rtt: Option<Duration>) {
        let long = rtt.filter(|&r| self.too_long_for_bbr(r));
        if let (true, Some(rtt), Ok(cubic)) = (self.try_congestion, long, CcName::parse("cubic")) {
            self.start_congestion = Some((cubic, rtt));
        }
    }

    /// Whether BBR's drain alone costs more than twice `gain` on a path of `rtt` (400 ms and
    /// more): the paths that start with CUBIC and keep it.
    fn too_long_for_bbr(&self, rtt: Duration) -> bool {
        bbr_drain(rtt) >= 2.0 * self.gain
    }
}

/// A trial of the other congestion control ends at once when one of its ordinary intervals
/// scores under this share of the sender's own control's utility.
const TRIAL_GIVE_UP: f64 = 0.7;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Doubling while it pays; `before`: the count measured before this one.
    Up { before: Option<Score> },
    /// Halving while fewer does as well as `before`, the count above.
    Down { before: Score },
    /// Between a count that paid and a larger one that added goodput but not enough to pay
    /// for itself (loss, queueing, the cost of connections): the best lies between.
    Bisect { lo: Score, hi: Score },
    /// Settled; probe after `left` more intervals, up or down.
    Hold { left: u32, up_next: bool },
    /// Trying one step away from `from`; keep it only if it pays.
    Probe { from: Score, up: bool },
    /// Comparing congestion controls at the same count.
    Trial(Trial),
}

/// A long interval with congestion control `from` (`base` None), then one with `to`, at the
/// same count; `to` is kept only if it pays. `first`: made at the start, before the count's
/// climb (on a long path the control matters more than the count).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Trial {
    base: Option<Score>,
    from: CcName,
    to: CcName,
    first: bool,
}

/// The self-tuning policy. See the module documentation.
#[derive(Debug)]
pub struct Auto {
    cfg: Tuning,
    /// The count asked for now.
    target: usize,
    /// Lowered when the server refuses a connection.
    ceiling: usize,
    phase: Phase,
    /// Measuring starts here (after the warm-up of a new count).
    warm_until: Option<Duration>,
    mark: Option<Mark>,
    /// Smallest RTT seen on any connection.
    base_rtt: Option<Duration>,
    /// The RTT at the last tick.
    rtt_now: Option<Duration>,
    /// The RTT at every tick so far, summed (seconds) and counted: an interval's queueing is
    /// its mean RTT, not one reading (BBR's drain, or the sender's report coming just after
    /// it, made single readings on a DSL line swing from 0.4 to 4 base RTTs).
    rtt_sum: f64,
    rtt_samples: u64,
    refused: usize,
    /// The best interval so far at this count, and how many were measured at it. A count is
    /// judged once its goodput stops rising (new connections leave slow start, old ones stop
    /// growing their windows), or after four intervals.
    settling: Option<Score>,
    stint: u32,
    /// Probes in a row that were not kept: each doubles the wait before the next (up to 8
    /// times `hold`), so a settled transfer spends little time on probes that lose.
    failed_probes: u32,
    /// The count a probe down from it lost by: settled probes stay above it until the path
    /// changes (an interval shows congestion). Probing 2 down to 1 on `lfn-200m` cost a third
    /// of the rate for 2 s each time, four times in a minute.
    floor: usize,
    /// The congestion control trial has been made (or is not wanted).
    tried: bool,
    /// The congestion control to start with has been chosen (a long path starts with CUBIC).
    chose_start: bool,
    /// The choice made before the transfer ([`Tuning::start_on`]) has been explained.
    told_start: bool,
    /// Within a trial: the start of its current ordinary interval.
    trial_check: Option<Mark>,
    notes: Vec<Note>,
}

impl Auto {
    pub fn new(cfg: Tuning) -> Auto {
        let ceiling = cfg.max.max(1);
        Auto {
            target: cfg.start.clamp(1, ceiling),
            ceiling,
            phase: Phase::Up { before: None },
            warm_until: None,
            mark: None,
            base_rtt: None,
            rtt_now: None,
            rtt_sum: 0.0,
            rtt_samples: 0,
            refused: 0,
            settling: None,
            stint: 0,
            failed_probes: 0,
            floor: 1,
            tried: !cfg.try_congestion,
            chose_start: !cfg.try_congestion,
            told_start: cfg.start_congestion.is_none(),
            trial_check: None,
            notes: Vec::new(),
            cfg,
        }
    }

    /// Connections to open before the transfer starts: `start`, but no more than `total`
    /// bytes make blocks.
    pub fn first_count(&mut self, total: Option<u64>) -> usize {
        if let Some(t) = total {
            self.target = self.target.min(blocks(t, self.cfg.block).max(1));
        }
        self.target
    }

    /// Length of one measured interval; in a congestion control trial, long enough to take
    /// in one of BBR's 10 s cycles (whose drain to 4 packets costs a window-limited connection
    /// on a long path a tenth of its rate).
    fn interval(&self) -> Duration {
        if matches!(self.phase, Phase::Trial(_)) {
            self.trial_interval()
        } else {
            self.count_interval()
        }
    }

    fn count_interval(&self) -> Duration {
        (self.rtt() * 4).clamp(Duration::from_millis(300), Duration::from_secs(4))
    }

    fn trial_interval(&self) -> Duration {
        (self.count_interval() * 4).clamp(Duration::from_secs(10), Duration::from_secs(16))
    }

    /// The RTT intervals are counted in: the base RTT, or the RTT last seen when a standing
    /// queue makes it longer (windows then take longer to settle).
    fn rtt(&self) -> Duration {
        let base = self.base_rtt.unwrap_or(Duration::from_millis(250));
        self.rtt_now.map_or(base, |r| r.max(base))
    }

    /// How long a new count runs before it is measured: connections finish slow start.
    fn warmup(&self) -> Duration {
        (self.rtt() * 3).clamp(Duration::from_millis(200), Duration::from_secs(3))
    }

    fn note(&mut self, view: &View, score: Option<&Score>, action: String) {
        self.notes.push(Note {
            t: view.elapsed.as_secs_f64(),
            streams: score.map_or(self.target, |s| s.n),
            goodput: score.map(|s| s.goodput),
            loss: score.map(|s| s.loss),
            queue: score.map(|s| s.queue),
            action,
        });
    }

    /// Goes to `n` connections (bounded), restarting the measurement; the decisions that get
    /// there from the connections in `view`.
    fn go_to(&mut self, n: usize, view: &View) -> Vec<Decision> {
        self.target = n.clamp(1, self.ceiling);
        self.restart();
        toward(self.target, view)
    }

    /// Measures afresh, after a warm-up: the count or the congestion control changed.
    fn restart(&mut self) {
        self.warm_until = None;
        self.mark = None;
        self.trial_check = None;
        self.settling = None;
        self.stint = 0;
    }

    /// Settled: the next probe goes up or down after `hold` intervals, longer after each
    /// probe in a row that lost.
    fn hold(&self, up_next: bool) -> Phase {
        Phase::Hold {
            left: self.cfg.hold << self.failed_probes.min(3),
            up_next,
        }
    }

    /// Near the end, a step under way that cannot be judged in time goes back to the count
    /// last judged best: a probe left below a window-limited count cost the satellite hop a
    /// quarter of its rate for the last 12 s.
    fn wind_up(&mut self, view: &View, s: &Score) -> Vec<Decision> {
        let back = match self.phase {
            Phase::Probe { from: best, .. }
            | Phase::Down { before: best }
            | Phase::Up { before: Some(best) } => best.n,
            Phase::Bisect { lo, hi } if hi.utility > lo.utility => hi.n,
            Phase::Bisect { lo, .. } => lo.n,
            _ => return Vec::new(),
        };
        self.phase = self.hold(false);
        if back == s.n {
            return Vec::new();
        }
        self.move_to(back, view, s, format!("near the end: back to {back}"))
    }

    /// Whether a probe has time to pay back: four intervals' worth left at goodput `s`, twice
    /// what any change needs (a probe down to 3 with 10 s left cost the satellite hop with 24 KB
    /// windows a quarter of its rate for 5 s, and could have saved at most 1 %).
    fn room_for_probe(&self, view: &View, s: &Score) -> bool {
        let span = 4.0 * (self.warmup() + self.interval()).as_secs_f64();
        view.total
            .is_none_or(|t| t.saturating_sub(view.done) as f64 > s.goodput * span)
    }

    /// Explains a move to `n` connections and makes it.
    fn move_to(&mut self, n: usize, view: &View, s: &Score, why: String) -> Vec<Decision> {
        self.note(view, Some(s), why);
        self.go_to(n, view)
    }

    /// The next move once an interval has been measured. If the congestion control was not
    /// known at the start, it gets its trial once the count settles.
    fn step(&mut self, view: &View, s: Score, useful: usize) -> Vec<Decision> {
        let decisions = self.step_count(view, s, useful);
        if matches!(self.phase, Phase::Hold { .. }) {
            self.begin_trial(view, &s, false);
        }
        decisions
    }
}

impl Policy for Auto {
    /// Each tick: what the connections show is taken in; on the way to a new count, or while
    /// it warms up or an interval runs, nothing else happens; once an interval ends, it is
    /// judged.
    fn decide(&mut self, view: &View) -> Vec<Decision> {
        self.observe(view);
        if let Some(d) = self.start_congestion(view) {
            return vec![d];
        }
        let left = view.total.map(|t| t.saturating_sub(view.done));
        let useful = left
            .map_or(self.ceiling, |l| blocks(l, self.cfg.block))
            .clamp(1, self.ceiling);
        if let Some(moves) = self.on_the_way(view, useful) {
            return moves;
        }
        let Some(mark) = self.measuring(view) else {
            return Vec::new();
        };
        if let Some(moves) = self.trial_decided_early(view, mark, useful) {
            return moves;
        }
        if view.elapsed.saturating_sub(mark.at) < self.interval() {
            return Vec::new();
        }
        let score = self.score(view, &mark);
        self.mark = Some(self.mark_now(view));
        self.judge(view, score, left, useful)
    }

    fn notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }
}

impl Auto {
    /// Takes in the RTTs the connections show, and lowers the ceiling when a connection was
    /// turned away by the server (or could not be opened).
    fn observe(&mut self, view: &View) {
        if let Some(rtt) = min_rtt(view) {
            self.base_rtt = Some(self.base_rtt.map_or(rtt, |b| b.min(rtt)));
        }
        if let Some(rtt) = mean_rtt(view) {
            self.rtt_now = Some(rtt);
            self.rtt_sum += rtt.as_secs_f64();
            self.rtt_samples += 1;
        }
        let refused = view.failed
            + view
                .links
                .iter()
                .filter(|l| l.bytes == 0 && !l.retiring && l.state != LinkState::Open)
                .count();
        if refused > self.refused {
            self.refused = refused;
            let have = view.active().count().max(1);
            if have < self.ceiling {
                self.ceiling = have;
                self.target = self.target.min(have);
                let why = format!("a connection was refused; at most {have} from now on");
                self.note(view, None, why);
            }
        }
    }

    /// On the way to the target count (or a connection broke, or one asked to close still
    /// carries its last block): the moves toward it, measuring once there. None once there.
    fn on_the_way(&mut self, view: &View, useful: usize) -> Option<Vec<Decision>> {
        let have = view.active().count() + view.opening;
        let draining = view
            .links
            .iter()
            .any(|l| l.retiring && l.state == LinkState::Open);
        if self.target > useful {
            // No more connections than blocks left; those open may finish their blocks.
            self.target = useful.max(have.min(self.target));
        }
        if have == self.target && view.opening == 0 && !draining {
            return None;
        }
        self.warm_until = None;
        self.mark = None;
        Some(if view.opening == 0 {
            toward(self.target, view)
        } else {
            Vec::new()
        })
    }

    /// Where the running interval started, once the count has warmed up; None while it warms
    /// up, or at the tick that starts the interval.
    fn measuring(&mut self, view: &View) -> Option<Mark> {
        let now = view.elapsed;
        let Some(warm_until) = self.warm_until else {
            self.warm_until = Some(now + self.warmup());
            return None;
        };
        if now < warm_until {
            return None;
        }
        if self.mark.is_none() {
            self.mark = Some(self.mark_now(view));
            return None;
        }
        self.mark
    }

    /// Either half of a trial ends early on an ordinary interval that leaves no doubt: the
    /// sender's own control losing so much that its utility is nil (BBR with four flows in the
    /// satellite's 96 kB queue: 16 % of bytes sent again), or the other scoring far below it
    /// (CUBIC filling a bloated queue gets there in seconds, long before the queue overflows).
    fn trial_decided_early(
        &mut self,
        view: &View,
        mark: Mark,
        useful: usize,
    ) -> Option<Vec<Decision>> {
        let Phase::Trial(trial) = self.phase else {
            return None;
        };
        let check = *self.trial_check.get_or_insert(mark);
        if view.elapsed.saturating_sub(check.at) < self.count_interval() {
            return None;
        }
        let s = self.score(view, &check);
        self.trial_check = Some(self.mark_now(view));
        let clear = match trial.base {
            None => s.utility <= 0.0,
            Some(base) => s.utility < base.utility * TRIAL_GIVE_UP,
        };
        clear.then(|| self.trial(view, s, trial, useful))
    }

    /// An interval has ended with `score`; `left`: the bytes still to move, if known.
    fn judge(
        &mut self,
        view: &View,
        score: Score,
        left: Option<u64>,
        useful: usize,
    ) -> Vec<Decision> {
        // The congestion control's trial comes first, once the first interval at the starting
        // count tells whether there is time for it (and, on a download, the sender's first
        // report has said which control it uses).
        if self.phase == (Phase::Up { before: None })
            && self.stint == 0
            && self.begin_trial(view, &score, true)
        {
            self.restart();
            return Vec::new();
        }
        // With less than two intervals' worth left, a change would not pay back; but a
        // trial ends (going back costs nothing).
        let soon = left.is_some_and(|l| {
            (l as f64) < score.goodput * 2.0 * (self.warmup() + self.interval()).as_secs_f64()
        });
        if let Phase::Trial(trial) = self.phase {
            // A trial's long intervals are judged one by one.
            if soon && trial.base.is_none() {
                return Vec::new();
            }
            return self.step_count(view, score, useful);
        }
        if soon {
            return self.wind_up(view, &score);
        }
        match self.settled(score) {
            Some(judged) => self.step(view, judged, useful),
            None => Vec::new(),
        }
    }

    /// A count is measured until its goodput stops rising (at most four intervals), and
    /// judged by its best interval: losses and queueing from the change itself (new
    /// connections leaving slow start, old ones making room) are not held against the count.
    /// A probe down is judged on its first interval: no connection is new, so there is no slow
    /// start to wait out, and where windows limit the connections it costs a quarter of the
    /// rate for as long as it runs. None while the count is still settling.
    fn settled(&mut self, score: Score) -> Option<Score> {
        let rising = self
            .settling
            .is_none_or(|before| score.goodput > before.goodput * (1.0 + self.cfg.gain));
        self.stint += 1;
        let best = match self.settling {
            Some(before) if before.utility > score.utility => before,
            _ => score,
        };
        let probing_down = matches!(self.phase, Phase::Probe { up: false, .. });
        if rising && self.stint < 4 && !probing_down {
            self.settling = Some(best);
            return None;
        }
        // Judged: the next verdict at this count starts from fresh intervals. Whether the
        // link is full is what the count does once settled, so the queue is the last
        // interval's when that is longer (the best one can be the first, before several BBR
        // connections' start-up had built the queue they then keep).
        self.settling = None;
        self.stint = 0;
        Some(Score {
            queue: best.queue.max(score.queue),
            ..best
        })
    }
}

/// The connection count for a transfer whose count is fixed at the start (a GridFTP server,
/// or a braid server without elastic transfers), from what the control connection shows: its
/// RTT, and `window`, the most a connection's window can reach on this host (or `--buffer`).
/// One connection carries at most `window / rtt`; the count is what a 1 Gbit/s path would
/// need at that rate, 1 to 8 (the XFTP paper's 8 on its satellite hop, GridFTP's usual
/// presets 4-8). Returns the count and the reason, for `-v`.
pub fn fixed_count(rtt: Option<Duration>, window: Option<u64>) -> (usize, String) {
    const PATH: f64 = 1e9 / 8.0;
    const MOST: usize = 8;
    match (rtt, window) {
        (Some(rtt), Some(w)) if !rtt.is_zero() && w > 0 => {
            let one = w as f64 / rtt.as_secs_f64();
            let n = ((PATH / one).ceil() as usize).clamp(1, MOST);
            (
                n,
                format!(
                    "RTT {:.1} ms and a {} KiB window: one connection carries at most {:.1} MB/s; \
                     {n} fill 1 Gbit/s or are the most used",
                    rtt.as_secs_f64() * 1e3,
                    w >> 10,
                    one / 1e6
                ),
            )
        }
        _ => (4, "no RTT or window known: 4, GridFTP's usual count".into()),
    }
}

/// The block size when none is given: a few blocks for each of `streams` connections, so a
/// small file does not leave connections idle (a 2 MB file in 1 MiB blocks feeds only two of
/// four), from 64 KiB (the checksum's chunk: blocks must be multiples of it) up to the default.
pub fn block_for(size: Option<u64>, streams: usize) -> u64 {
    let chunk = braid_proto::checksum::CHUNK;
    let Some(size) = size else {
        return crate::engine::DEFAULT_BLOCK;
    };
    let share = size / (4 * streams.max(1) as u64);
    // The largest power of two not above the share, within bounds.
    let pow2 = if share == 0 { 0 } else { 1u64 << share.ilog2() };
    pow2.clamp(chunk, crate::engine::DEFAULT_BLOCK.max(chunk))
}

fn blocks(bytes: u64, block: u64) -> usize {
    usize::try_from(bytes.div_ceil(block.max(1))).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests;
