//! Background mode's controller (`--background`): the sending rate of a whole transfer, from
//! the queueing delay it sees, so that interactive traffic sharing the bottleneck keeps its
//! latency while an idle link is still filled.
//!
//! The signal is the round trip of small probes on the control connection, which wait in the
//! same queue as everybody's pings; their minimum over ten minutes is the base delay, and the
//! excess is the queue. The law follows LEDBAT++ (draft-irtf-iccrg-ledbat-plus-plus) on a rate
//! instead of a window, because the actuator is `SO_MAX_PACING_RATE`:
//! - **slow start** from four segments per RTT, doubling per RTT until the queue reaches ¾
//!   of the target;
//! - **increase** below the target: a step in proportion to the room left, a share of the
//!   best rate seen (the same for every transfer, so two converge to equal shares, as
//!   additive increase does);
//! - **refill**: while the queue stays empty, back to 90 % of the link's rate (the best
//!   delivery seen while a queue stood) within a round trip or so, so that a slowdown, a cut
//!   or a competitor that has left costs round trips, not the seconds the increase would take
//!   on a long path;
//! - **decrease** above it: down to the rate that drains the excess within one round trip
//!   (what was delivered, less the excess over the round trip), at most by half, then a hold
//!   of one round trip so the next reading shows the cut; no further cut while the queue
//!   falls from its crest fast enough to be gone within a round trip (the probes are a round
//!   trip late); slow start's overshoot is cut by half at once;
//! - **periodic slowdowns** to the floor for two base round trips, so that the base delay is
//!   measured on an empty queue (another background transfer's standing queue would otherwise
//!   pass for base delay: LEDBAT's latecomer problem), skipped while the queue is seen empty
//!   most of the time;
//! - a **floor** of two segments per round trip, so a transfer never stalls, and four while
//!   someone else holds a long queue: with fewer in flight a lost segment is not followed by
//!   the three that would signal its loss, and TCP waits for its retransmission timer, which
//!   doubles at each miss (seconds of nothing after a competitor has overflowed the queue).
//!
//! It is pure: probe samples and delivered bytes in, a rate out, with time given by the
//! caller. The tests run it against a simulated bottleneck.

use super::hooks::Pacer;
use super::stats::{View, kernel_moved};
pub use super::yield_report::{Point, Report};
use braid_proto::retr_opts::CcName;
use std::collections::VecDeque;
use std::time::Duration;

/// DSCP 1: lower effort (RFC 8622), for a yielding transfer's data packets.
pub const LOWER_EFFORT: u8 = 1;

/// A yielding transfer's congestion control under the pacing rate braid sets, from the
/// path's round trip. On a short path bbr: below 1.2 Mbit/s it sends one segment at a time
/// where cubic sends two (`tcp_min_tso_segs`), 24 ms in a burst on a 1 Mbit/s link that every
/// ping behind it waits for, and above the link's rate it keeps about a round trip of queue
/// where cubic fills the buffer. On dsl-1m-bloat (`braid bench --experiment background`) a
/// download with cubic added 15.0/36.6 ms (ping p50/p95) at 86 % of the payload rate, with
/// bbr 8.3/22.6 ms at 93 %. On a long path cubic: bbr paces at its own estimate of the rate
/// whatever braid allows, and raises it by a quarter every eight round trips (4.7 s on
/// satellite-t1, where a download stood at half its allowed rate for 3 s).
pub fn congestion(rtt: Duration) -> Option<CcName> {
    CcName::parse(if rtt < BBR_UNDER { "bbr" } else { "cubic" }).ok()
}

/// The congestion control of a yielding transfer whose controller reads the data's own round
/// trip (a yielding server; an upload to a server that is not braid): cubic. With bbr's
/// single segments on a slow link that round trip waits for the receiver's delayed
/// acknowledgement (curl from `serve --background` on dsl-1m-bloat got 0.62-0.65 Mbit/s with
/// bbr, 0.78 with cubic).
pub fn congestion_by_data_rtt() -> Option<CcName> {
    CcName::parse("cubic").ok()
}

/// Segments a congestion control sends at once however slowly it is paced, which a probe
/// may find in the queue before it: cubic's two (`tcp_min_tso_segs`; 16 ms at 1.5 Mbit/s, over
/// the default target, so that one probe behind them ended slow start on satellite-t1); bbr's
/// one below 1.2 Mbit/s, which the default target covers from 1 Mbit/s up.
pub fn burst_segments(cc: Option<CcName>) -> u32 {
    match cc {
        Some(cc) if cc.as_str() == "bbr" => 0,
        _ => 2,
    }
}

/// The round trip up to which a yielding transfer uses bbr: eight of them, bbr's cycle, in
/// under a second.
const BBR_UNDER: Duration = Duration::from_millis(100);

/// What the user chose.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// The queueing delay the transfer may add, as the probes see it.
    pub target: Duration,
    /// A hard cap (`--rate-limit`), bytes/s.
    pub limit: Option<u64>,
    /// Segment size, bytes: the unit of the floor, of the first rate and of the constant step.
    pub mss: u64,
    /// The target is at least this many segments' time at the link's rate, and an empty
    /// queue reads as up to half of that: where the signal is the data's own round trip (a
    /// server), each sample carries a segment's serialization and the receiver's delayed
    /// acknowledgement, and a probe may wait behind the smallest burst the sender makes
    /// ([`burst_segments`]); on a slow link either alone exceeds a few milliseconds.
    pub segments: u32,
}

/// The default target. An ideal fixed pacer at 90 % of a 1 Mbit/s link adds about 12 ms
/// (two segments in a burst take 24 ms there); less than that leaves the link idle.
pub const TARGET: Duration = Duration::from_millis(10);

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            target: TARGET,
            limit: None,
            mss: 1448,
            segments: 0,
        }
    }
}

/// The lowest rate behind someone else's long queue, in segments per round trip (see the
/// module's comment).
const FLOOR: f64 = 4.0;
/// The first rate, in segments per round trip: TCP's first window is ten, which on a slow
/// link fills a queue for the round trips it takes the first answers to come back; slow
/// start doubles from four soon enough on a fast one.
const FIRST_SEGMENTS: f64 = 4.0;
/// Probes whose median is the current delay (a lost or retransmitted probe's long round trip
/// does not count on its own, and the median, unlike RFC 6817's minimum, is what a user's
/// ping sees half the time).
const FILTER: usize = 3;
/// Base delay: the minimum over this many one-minute buckets (RFC 6817's BASE_HISTORY).
const BASE_BUCKETS: usize = 10;
const BUCKET: Duration = Duration::from_secs(60);
/// The deepest cut at once (LEDBAT++: W/2).
const MAX_CUT: f64 = 0.5;
/// Slowdowns come after at least this long, and after nine times the last one's length
/// (LEDBAT++: ≤ 10 % of the time).
const SLOWDOWN_EVERY: Duration = Duration::from_secs(20);
/// The shortest round trip the law assumes: below it, ticks (100 ms) are the limit anyway.
const MIN_RTT: Duration = Duration::from_millis(10);
/// Delivered bytes are counted over at least this long.
const DELIVERY_WINDOW: Duration = Duration::from_millis(300);
/// The recent peak delivery rate forgets this fast (a competitor may have taken the link).
/// Slowly: it sets the step of the increase, which must refill a link soon after a
/// competitor has left.
const PEAK_HALF_LIFE: Duration = Duration::from_secs(20);
/// With the queue empty, the rate comes back to this share of the link's rate within a round
/// trip or so.
const REFILL: f64 = 0.9;
/// The link's rate, as measured, forgets this fast (the path may have changed).
const FULL_HALF_LIFE: Duration = Duration::from_secs(120);
/// Segments a new connection sends unpaced (net/ipv4/tcp_output.c: "Original sch_fq does
/// not pace first 10 MSS").
const UNPACED_SEGMENTS: u64 = 10;
/// One trace point per this long.
const TRACE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    SlowStart,
    Steady,
    /// At the floor until `until`, then back to `saved`.
    Slowdown {
        until: Duration,
        saved: f64,
        began: Duration,
    },
}

/// The controller of one transfer.
#[derive(Debug)]
pub struct Background {
    s: Settings,
    /// bytes/s.
    rate: f64,
    phase: Phase,
    /// Latest probe round trips (at most FILTER).
    recent: VecDeque<Duration>,
    /// How long the probe in flight has been out: the round trip is at least that.
    waiting: Option<Duration>,
    /// Since when the queue has been nearly empty (for the refill).
    empty_since: Option<Duration>,
    /// Ticks with the queue nearly empty, and all ticks, since the last slowdown was due.
    quiet: (u32, u32),
    /// (bucket number, lowest round trip in it).
    base: VecDeque<(u64, Duration)>,
    /// No decrease before this.
    hold_until: Duration,
    /// Cuts in a row, without the queue coming back under the target.
    cuts: u32,
    /// Since the last of them, the highest queue seen and when.
    crest: Option<(Duration, Duration)>,
    /// Probes answered since the last cut.
    answers_since_cut: u32,
    next_slowdown: Option<Duration>,
    last_slowdown: Duration,
    /// (time, bytes delivered so far).
    delivered: VecDeque<(Duration, u64)>,
    /// The best delivery rate seen lately, bytes/s (decaying by half every PEAK_HALF_LIFE).
    peak: f64,
    /// The link's rate: the best delivery rate seen while a queue stood (so the link was
    /// busy), bytes/s, decaying by half every FULL_HALF_LIFE.
    full: f64,
    /// (time, rate paced) over the delivery window and the round trip before it.
    paced_lately: VecDeque<(Duration, f64)>,
    last_tick: Option<Duration>,
    /// Every probe's queueing delay, ms (for the report's percentiles; 10 a second).
    queue_seen: Vec<f64>,
    yielded: Duration,
    slowdowns: u32,
    timeline: Vec<Point>,
    next_point: Duration,
}

impl Background {
    /// `rtt`: the path's round trip before the transfer (the control connection's lowest),
    /// for the first rate and as the first base.
    pub fn new(s: Settings, rtt: Duration) -> Background {
        let rtt = rtt.max(MIN_RTT);
        let mut b = Background {
            s,
            rate: FIRST_SEGMENTS * s.mss as f64 / rtt.as_secs_f64(),
            phase: Phase::SlowStart,
            recent: VecDeque::new(),
            waiting: None,
            empty_since: None,
            quiet: (0, 0),
            base: VecDeque::from([(0, rtt)]),
            hold_until: Duration::ZERO,
            cuts: 0,
            crest: None,
            answers_since_cut: 0,
            next_slowdown: None,
            last_slowdown: Duration::ZERO,
            delivered: VecDeque::new(),
            peak: 0.0,
            full: 0.0,
            paced_lately: VecDeque::new(),
            last_tick: None,
            queue_seen: Vec::new(),
            yielded: Duration::ZERO,
            slowdowns: 0,
            timeline: Vec::new(),
            next_point: Duration::ZERO,
        };
        b.rate = b.rate.max(b.floor(rtt, Duration::ZERO));
        b
    }

    /// A probe's round trip, measured at `now`.
    pub fn on_probe(&mut self, now: Duration, rtt: Duration) {
        if rtt.is_zero() {
            return;
        }
        if self.recent.len() == FILTER {
            self.recent.pop_front();
        }
        self.recent.push_back(rtt);
        self.answers_since_cut = self.answers_since_cut.saturating_add(1);
        // The base is the lowest of the filtered round trips: one probe read short (its
        // sample comes from the kernel's smoothed RTT, to a few milliseconds) would otherwise
        // show a queue that is not there for ten minutes (3.7 ms on lfn-500m, which held the
        // rate under a third of the link's for ten seconds).
        let Some(rtt) = self.filtered() else {
            return;
        };
        let bucket = now.as_secs() / BUCKET.as_secs();
        match self.base.back_mut() {
            Some((b, min)) if *b == bucket => *min = (*min).min(rtt),
            _ => {
                self.base.push_back((bucket, rtt));
                if self.base.len() > BASE_BUCKETS {
                    self.base.pop_front();
                }
            }
        }
        if let Some(q) = self.queue() {
            self.queue_seen.push(q.as_secs_f64() * 1e3);
        }
    }

    /// The base round trip: the lowest probe over the last ten minutes.
    pub fn base(&self) -> Option<Duration> {
        self.base.iter().map(|&(_, d)| d).min()
    }

    /// The probe in flight has been out this long (None: none is, or it just left). A queue
    /// that a competitor fills at once delays the next answer by as much: this says so
    /// before the answer comes.
    pub fn on_waiting(&mut self, out: Option<Duration>) {
        self.waiting = out;
    }

    /// The queueing delay now: the filtered probe round trip above the base, or more while
    /// a probe is overdue.
    pub fn queue(&self) -> Option<Duration> {
        let current = match (self.filtered(), self.waiting) {
            (Some(m), Some(w)) => m.max(w),
            (m, w) => m.or(w)?,
        };
        Some(current.saturating_sub(self.base()?))
    }

    /// The median of the latest probes.
    fn filtered(&self) -> Option<Duration> {
        let mut recent: Vec<Duration> = self.recent.iter().copied().collect();
        recent.sort();
        recent.len().checked_sub(1).map(|last| recent[last / 2])
    }

    /// The rate to pace at (bytes/s), given the bytes delivered so far at `now`. Called every
    /// tick.
    pub fn on_tick(&mut self, now: Duration, delivered: u64) -> u64 {
        let dt = self
            .last_tick
            .map_or(Duration::ZERO, |t| now.saturating_sub(t));
        self.last_tick = Some(now);
        self.delivered.push_back((now, delivered));
        let window = self.delivery_window();
        while self.delivered.len() > 2 && now.saturating_sub(self.delivered[1].0) >= window {
            self.delivered.pop_front();
        }
        self.peak *= 0.5f64.powf(dt.as_secs_f64() / PEAK_HALF_LIFE.as_secs_f64());
        self.full *= 0.5f64.powf(dt.as_secs_f64() / FULL_HALF_LIFE.as_secs_f64());
        // Data held up by a loss arrives all at once when the hole is filled (the kernel counts
        // bytes in order): a rate well above any paced over the window and the round trip
        // before it is that, not the link's.
        let span = self.base().unwrap_or(MIN_RTT) + window;
        while self
            .paced_lately
            .front()
            .is_some_and(|&(t, _)| now.saturating_sub(t) > span)
        {
            self.paced_lately.pop_front();
        }
        let then = self
            .paced_lately
            .iter()
            .map(|&(_, r)| r)
            .fold(self.rate, f64::max);
        if let Some(d) = self.delivery_rate()
            && d <= 1.25 * then
        {
            self.peak = self.peak.max(d);
            if self.queue().is_some_and(|q| q > self.target() / 2) {
                self.full = self.full.max(d);
            }
        }
        let yielding = self.step(now, dt.as_secs_f64());
        if yielding {
            self.yielded += dt;
        }
        let rate = self.paced();
        self.paced_lately.push_back((now, rate as f64));
        tracing::trace!(
            t = now.as_secs_f64(),
            phase = ?self.phase,
            queue_ms = self.queue().map(|q| q.as_secs_f64() * 1e3),
            rate,
            delivered = self.delivery_rate(),
            peak = self.peak,
            full = self.full,
            yielding,
            "background tick"
        );
        if now >= self.next_point {
            self.next_point = now + TRACE_EVERY;
            self.timeline.push(Point {
                t: now.as_secs_f64(),
                queue_ms: self.queue().map(|q| q.as_secs_f64() * 1e3),
                base_ms: self.base().map(|b| b.as_secs_f64() * 1e3),
                rate,
                delivered: self.delivery_rate().unwrap_or(0.0) as u64,
            });
        }
        rate
    }

    /// The rate in force, with the hard cap.
    pub fn paced(&self) -> u64 {
        let r = self.rate.round() as u64;
        self.s.limit.map_or(r, |l| r.min(l))
    }

    /// What it saw and did, for the summary.
    pub fn report(&self) -> Report {
        let mut q = self.queue_seen.clone();
        q.sort_by(f64::total_cmp);
        let pct = |p: f64| (!q.is_empty()).then(|| q[((q.len() - 1) as f64 * p).round() as usize]);
        Report {
            target_ms: self.target().as_secs_f64() * 1e3,
            probes: self.queue_seen.len() as u64,
            base_ms: self.base().map(|b| b.as_secs_f64() * 1e3),
            queue_p50_ms: pct(0.5),
            queue_p95_ms: pct(0.95),
            yielded_s: self.yielded.as_secs_f64(),
            slowdowns: self.slowdowns,
            timeline: self.timeline.clone(),
        }
    }

    /// Delivered bytes are counted over this long: DELIVERY_WINDOW, or a round trip on a
    /// longer path (where a slow transfer's segments come one window per round trip).
    fn delivery_window(&self) -> Duration {
        DELIVERY_WINDOW.max(self.base().unwrap_or(Duration::ZERO))
    }

    /// Bytes/s delivered over the last window, once there is one.
    fn delivery_rate(&self) -> Option<f64> {
        let (t0, b0) = *self.delivered.front()?;
        let (t1, b1) = *self.delivered.back()?;
        let span = t1.saturating_sub(t0).as_secs_f64();
        (span > 0.0).then(|| b1.saturating_sub(b0) as f64 / span)
    }

    /// The time of `segments` at the recent peak rate: a probe finds from none to all of
    /// them ahead of it.
    fn burst(&self) -> Duration {
        let per_segment = if self.peak > 0.0 {
            self.s.mss as f64 / self.peak
        } else {
            0.0
        };
        Duration::from_secs_f64((f64::from(self.s.segments) * per_segment).min(1.0))
    }

    /// The target, with room for a burst.
    fn target(&self) -> Duration {
        self.s.target.max(self.burst())
    }

    /// Two segments per round trip, or FLOOR behind a queue of more than four targets (where
    /// that many in flight add nothing to it); never above the refill's aim, since where a
    /// round trip carries under two segments (1 Mbit/s at 20 ms) two are more than the link
    /// takes, and a floor there would stand a queue whenever the controller means to yield.
    fn floor(&self, rtt: Duration, queue: Duration) -> f64 {
        let segments = if queue > 4 * self.s.target {
            FLOOR
        } else {
            2.0
        };
        let alive = segments * self.s.mss as f64 / rtt.max(MIN_RTT).as_secs_f64();
        if self.full > 0.0 {
            alive.min(REFILL * self.full)
        } else {
            alive
        }
    }

    /// LEDBAT++: the first slowdown comes two round trips after slow start.
    fn end_slow_start(&mut self, now: Duration, rtt: Duration) {
        self.phase = Phase::Steady;
        self.next_slowdown = Some(now + 2 * rtt);
    }

    /// One tick of the law; whether it is yielding.
    fn step(&mut self, now: Duration, dt: f64) -> bool {
        let Some(base) = self.base() else {
            return false;
        };
        // No probe answered yet: slow start goes on from the control connection's round trip
        // (as far as the data gets through); otherwise the rate stays.
        let Some(queue) = self
            .queue()
            .or((self.phase == Phase::SlowStart).then_some(Duration::ZERO))
        else {
            return false;
        };
        let rtt = (base + queue).max(MIN_RTT);
        let t = Tick {
            now,
            dt,
            base,
            queue,
            rtt,
            h: rtt.as_secs_f64(),
            floor: self.floor(rtt, queue),
            target: self.target(),
            delivered: self.delivery_rate(),
        };
        if let Phase::Slowdown {
            until,
            saved,
            began,
        } = self.phase
        {
            return self.slowing_down(&t, until, saved, began);
        }
        if let Some((_, highest)) = self.crest
            && queue >= highest
        {
            self.crest = Some((now, queue));
        }
        if queue > t.target {
            return self.over_target(&t);
        }
        if now < self.hold_until {
            return true;
        }
        self.cuts = 0;
        self.crest = None;
        if let Some(at) = self.next_slowdown
            && now >= at
            && self.phase == Phase::Steady
        {
            return self.slow_down(&t);
        }
        self.increase(&t);
        false
    }

    /// During a slowdown: the floor until it ends, then the saved rate back.
    fn slowing_down(&mut self, t: &Tick, until: Duration, saved: f64, began: Duration) -> bool {
        if t.now < until {
            self.rate = t.floor;
            return true;
        }
        self.rate = saved;
        self.phase = Phase::Steady;
        self.last_slowdown = t.now.saturating_sub(began);
        self.next_slowdown = Some(t.now + (self.last_slowdown * 9).max(SLOWDOWN_EVERY));
        // Back at the saved rate: no decrease before the probes show its effect.
        self.hold_until = t.now + t.rtt;
        false
    }

    /// A queue above the target: a cut, unless one is already taking effect or the queue is
    /// draining fast enough by itself. Always yielding.
    fn over_target(&mut self, t: &Tick) -> bool {
        let (now, queue, target) = (t.now, t.queue, t.target);
        let overshoot = self.phase == Phase::SlowStart;
        if overshoot {
            self.end_slow_start(now, t.rtt);
        }
        // A probe answers about once a round trip, and the reading stays until the next:
        // the one in flight at a cut left before it, so a further cut waits for the probe
        // after that (on satellite-t1 a queue of 45 ms, read once, was cut for twice, to
        // half the link's rate; on lfn-500m 12 ms to a third). Not behind someone else's
        // long queue, whose answers come seconds apart while the competitor waits.
        let stale = self.answers_since_cut < 2;
        if now < self.hold_until || (stale && queue <= 4 * self.s.target) {
            return true;
        }
        // A queue that has been falling since its crest after the last cut, fast enough to
        // be gone within a round trip, needs no further cut: the probes are late, not the
        // drain.
        if let Some((at, was)) = self.crest
            && was > queue
        {
            let falling = (was - queue).as_secs_f64() / (now - at).as_secs_f64().max(t.dt);
            if (queue - target).as_secs_f64() <= falling * t.h {
                return true;
            }
        }
        // Until a probe that left after the cut took effect is back: the base round trip
        // and two ticks, not the queue's delay too (a competitor's full queue would slow
        // each next cut by as much, while the competitor waits).
        let hold = t.base.max(MIN_RTT) + Duration::from_secs_f64(2.0 * t.dt);
        // The rate that drains the excess within the hold, at most half off, from what
        // the link carries (the recent peak: with a queue it is the link's rate, while an
        // average over the last moments may include idle ones and cut too deep).
        // A queue still above the target after a cut is someone else's: each further cut in
        // a row doubles (a competitor gets the link in a few round trips, not seconds).
        // Slow start's overshoot is larger than the probes show yet: it doubled the rate
        // for the round trip they took.
        let drain = (queue - target).as_secs_f64() / hold.as_secs_f64();
        let cut = if overshoot {
            MAX_CUT
        } else {
            (drain * f64::from(1u32 << self.cuts.min(8))).min(MAX_CUT)
        };
        self.crest = Some((now, queue));
        self.cuts += 1;
        self.answers_since_cut = 0;
        let carried = t.delivered.map_or(self.peak, |d| d.max(self.peak));
        let anchor = if carried > 0.0 {
            carried.min(self.rate)
        } else {
            self.rate
        };
        self.rate = (anchor * (1.0 - cut)).max(t.floor);
        self.hold_until = now + hold;
        true
    }

    /// Time for a slowdown (to find the base again), unless the queue was seen empty most
    /// of the time since the last one: that shows the base is the base, and each slowdown
    /// costs a few round trips of rate (seconds on a long path). Behind another transfer's
    /// standing queue it is not empty, and the slowdowns go on. Whether it is yielding.
    fn slow_down(&mut self, t: &Tick) -> bool {
        let (empty, all) = std::mem::take(&mut self.quiet);
        if all > 0 && 2 * empty >= all {
            self.next_slowdown = Some(t.now + SLOWDOWN_EVERY);
            return false;
        }
        self.slowdowns += 1;
        self.phase = Phase::Slowdown {
            until: t.now + 2 * t.base.max(MIN_RTT) + Duration::from_secs_f64(t.dt),
            saved: self.rate,
            began: t.now,
        };
        self.rate = t.floor;
        true
    }

    /// Below the target: the rate grows, doubling per round trip in slow start, else by a
    /// step that shrinks as the queue nears the target (faster while it stays empty).
    fn increase(&mut self, t: &Tick) {
        let (now, queue, target, dt, h) = (t.now, t.queue, t.target, t.dt, t.h);
        let room = 1.0 - queue.as_secs_f64() / target.as_secs_f64();
        // An empty queue means room that nobody takes (a competitor has left, or a cut or a
        // slowdown went deeper than needed): the refill below. A probe finds half a burst
        // ahead of it on average even then (cubic's two segments on satellite-t1: 7.8 ms, which
        // without this kept both the refill and the skipping of slowdowns away).
        let empty = queue < target / 4 + self.burst() / 2;
        if empty {
            self.empty_since.get_or_insert(now);
        } else {
            self.empty_since = None;
        }
        self.quiet.1 += 1;
        self.quiet.0 += u32::from(empty);
        // While the queue stays empty the increase speeds up by one for every second of it,
        // but only below the link's rate, or where no queue has ever shown it (a
        // window-limited connection): above it the probes show the queue a round trip and
        // a median late, and the speed-up overshot (on satellite-t1; on lfn-500m to 1.2 times
        // the link, whose queue then overflowed every few seconds).
        let hurry = if self.full == 0.0 || self.rate < self.full {
            1.0 + self.empty_since.map_or(0.0, |t| (now - t).as_secs_f64())
        } else {
            1.0
        };
        match self.phase {
            Phase::SlowStart if queue.as_secs_f64() > 0.75 * target.as_secs_f64() => {
                self.end_slow_start(now, t.rtt);
            }
            Phase::SlowStart => {
                // Doubling per round trip, but never more than twice what gets through, which
                // left a round trip and half a window ago: where the window is a round trip that
                // lets the rate grow by about 1.6 per round trip, and on lfn-500m (150 ms) ten
                // times a second (1.5 times gave four, and six seconds to reach the window).
                let grown = self.rate * (1.0 + dt / h);
                let ceiling = t.delivered.map_or(self.rate, |d| (2.0 * d).max(self.rate));
                self.rate = grown.min(ceiling);
            }
            _ => {
                // The step is a share of the best rate seen, the same for every transfer on
                // the path (so they converge to equal shares, as with additive increase),
                // and small enough that what it adds before the probes can show it (a round
                // trip and a tick) stays within half the target.
                let lag = h + 2.0 * dt;
                let per_second = 0.5 * target.as_secs_f64() / (lag * lag);
                let mut step = self.peak.max(t.floor) * per_second;
                // A path longer than the delivery window: what it counts left a round trip or
                // two earlier, and a second is under two round trips. On it the step above is
                // slower than TCP's own congestion avoidance (a segment per round trip): at
                // least that.
                if t.base > DELIVERY_WINDOW {
                    step = step.max(self.s.mss as f64 / (h * h));
                }
                let mut grown = self.rate + hurry * room * step * dt;
                let aim = REFILL * self.full;
                let refill = self.empty_since.is_some() && self.rate < aim;
                if refill {
                    grown = grown.max(self.rate + (aim - self.rate) * (dt / h).min(1.0));
                }
                // What does not get through (a slow disk, a slow peer) is no reason to go on;
                // but the link's rate, seen delivered while a queue stood, is what a refill
                // aims at whatever got through since a deep cut (twice that a window would
                // take seconds to climb back on a long path).
                let ceiling = t.delivered.map_or(grown, |d| {
                    (2.0 * d).max(self.rate).max(if refill { aim } else { 0.0 })
                });
                self.rate = grown.min(ceiling);
            }
        }
        self.rate = self.rate.max(t.floor);
    }
}

/// What one tick of the law works from.
struct Tick {
    now: Duration,
    /// Seconds since the last tick.
    dt: f64,
    base: Duration,
    queue: Duration,
    /// The round trip now: base and queue.
    rtt: Duration,
    /// `rtt` in seconds.
    h: f64,
    /// The least rate it keeps.
    floor: f64,
    target: Duration,
    /// What the kernel counted as delivered lately, bytes/s.
    delivered: Option<f64>,
}

/// Background mode as a transfer's pacer: the probes and the bytes the kernel counts as
/// delivered (acknowledged where this side sends, received where it receives) go to the
/// controller every tick.
pub struct Yielding {
    ctl: Background,
    /// Per connection id: the kernel's count at the last tick.
    moved: Vec<u64>,
    /// When every connection had moved its first ten segments. The kernel does not pace
    /// those (as sch_fq does not), so on a slow link they stand in the queue for a while
    /// (75 ms at 1.5 Mbit/s) and a probe that met them would end slow start at once: probes
    /// sent before count only once this is known.
    warm: Option<Duration>,
    delivered: u64,
    /// Trace points already shown with -v.
    shown: usize,
}

impl Yielding {
    pub fn new(s: Settings, rtt: Duration) -> Yielding {
        Yielding {
            ctl: Background::new(s, rtt),
            moved: Vec::new(),
            warm: None,
            delivered: 0,
            shown: 0,
        }
    }
}

impl Yielding {
    /// The base round trip the controller keeps.
    pub fn base(&self) -> Option<Duration> {
        self.ctl.base()
    }
}

impl Pacer for Yielding {
    fn rate(&mut self, view: &View) -> Option<u64> {
        let mut warm = !view.links.is_empty();
        for link in &view.links {
            let Some(tcp) = &link.tcp else { continue };
            if self.moved.len() <= link.id {
                self.moved.resize(link.id + 1, 0);
            }
            let now = kernel_moved(tcp);
            self.delivered += now.saturating_sub(self.moved[link.id]);
            self.moved[link.id] = now;
            warm &= now >= UNPACED_SEGMENTS * u64::from(tcp.snd_mss.max(1));
        }
        if warm && self.warm.is_none() {
            self.warm = Some(view.elapsed);
        }
        if let Some(w) = self.warm {
            for &rtt in &view.probes {
                if view.elapsed.saturating_sub(rtt) >= w {
                    self.ctl.on_probe(view.elapsed, rtt);
                }
            }
            self.ctl.on_waiting(
                view.probe_out
                    .filter(|&out| view.elapsed.saturating_sub(out) >= w),
            );
        }
        let rate = self.ctl.on_tick(view.elapsed, self.delivered);
        for p in self.ctl.timeline.iter().skip(self.shown) {
            tracing::info!(
                "{:.1}s background: queue {} over a base of {}, pacing at {:.0} kB/s, {:.0} kB/s delivered",
                p.t,
                p.queue_ms.map_or("?".into(), |q| format!("{q:.1} ms")),
                p.base_ms.map_or("?".into(), |b| format!("{b:.1} ms")),
                p.rate as f64 / 1e3,
                p.delivered as f64 / 1e3,
            );
        }
        self.shown = self.ctl.timeline.len();
        Some(rate)
    }

    fn report(&self) -> Option<Report> {
        Some(self.ctl.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bottleneck of `capacity` bytes/s with a drop-tail queue of `queue_max` bytes and a
    /// fixed round trip `base`, fed by senders at given rates; probes see the queue as it is.
    struct Link {
        capacity: f64,
        base: Duration,
        queue: f64,
        queue_max: f64,
    }

    impl Link {
        fn delay(&self) -> Duration {
            self.base + Duration::from_secs_f64(self.queue / self.capacity)
        }
        /// Runs `dt` with these senders' rates; the bytes each got through.
        fn run(&mut self, rates: &[f64], dt: f64) -> Vec<f64> {
            let offered: f64 = rates.iter().sum();
            let arriving = offered * dt;
            let room = self.queue_max - self.queue;
            let admitted = arriving.min(room + self.capacity * dt);
            let out = (self.queue + admitted).min(self.capacity * dt);
            self.queue = (self.queue + admitted - out).max(0.0);
            // Each gets its share of what left, by what it offered.
            rates
                .iter()
                .map(|r| {
                    if offered > 0.0 {
                        out * r / offered
                    } else {
                        0.0
                    }
                })
                .collect()
        }
    }

    const TICK: Duration = Duration::from_millis(100);
    const SUB: usize = 10;

    /// Controllers sharing one link, plus an unresponsive competitor that offers `other(t)`
    /// bytes/s. Probes (10 a second) see the delay a round trip late. Returns each
    /// controller's delivered bytes per second, and the probes' queueing delays (ms).
    struct Run {
        link: Link,
        ctls: Vec<(Background, Duration)>,
        got: Vec<f64>,
        now: Duration,
        /// Queue delay at each tick, ms.
        queue_ms: Vec<f64>,
        /// Delivered bytes per controller in each second.
        per_second: Vec<Vec<f64>>,
        other_got: f64,
        /// The first controller's rate at each tick.
        paced: Vec<f64>,
        delays: VecDeque<Duration>,
        /// Ticks between the queue a probe crossed and its answer.
        lag: usize,
    }

    impl Run {
        fn new(capacity: f64, base_ms: u64, queue_s: f64) -> Run {
            Run {
                link: Link {
                    capacity,
                    base: Duration::from_millis(base_ms),
                    queue: 0.0,
                    queue_max: capacity * queue_s,
                },
                ctls: Vec::new(),
                got: Vec::new(),
                now: Duration::ZERO,
                queue_ms: Vec::new(),
                per_second: Vec::new(),
                other_got: 0.0,
                paced: Vec::new(),
                delays: VecDeque::new(),
                lag: 1,
            }
        }

        fn add(&mut self, s: Settings) -> usize {
            let c = Background::new(s, self.link.base);
            self.ctls.push((c, self.now));
            self.got.push(0.0);
            self.ctls.len() - 1
        }

        /// Runs for `secs`, with `active[i]` saying which controllers send, and `other`
        /// bytes/s from an unresponsive competitor.
        fn run(&mut self, secs: f64, active: &[bool], other: f64) {
            let ticks = (secs / TICK.as_secs_f64()).round() as usize;
            for _ in 0..ticks {
                // A probe answered now crossed the queue `lag` ticks ago.
                let delay = self.delays.front().copied().unwrap_or(self.link.base);
                let rates: Vec<f64> = self
                    .ctls
                    .iter_mut()
                    .enumerate()
                    .map(|(i, (c, start))| {
                        if !active.get(i).copied().unwrap_or(true) {
                            return 0.0;
                        }
                        let t = self.now - *start;
                        // The probe sent a round trip ago saw roughly today's queue.
                        c.on_probe(t, delay);
                        c.on_tick(t, self.got[i] as u64) as f64
                    })
                    .collect();
                self.paced.push(rates.first().copied().unwrap_or(0.0));
                let mut all = rates.clone();
                all.push(other);
                let dt = TICK.as_secs_f64() / SUB as f64;
                for _ in 0..SUB {
                    let out = self.link.run(&all, dt);
                    for (i, b) in out.iter().enumerate().take(rates.len()) {
                        self.got[i] += b;
                        let sec = self.now.as_secs() as usize;
                        if self.per_second.len() <= sec {
                            self.per_second.resize(sec + 1, vec![0.0; self.ctls.len()]);
                        }
                        let row = &mut self.per_second[sec];
                        row.resize(self.ctls.len(), 0.0);
                        row[i] += b;
                    }
                    self.other_got += out[rates.len()];
                }
                self.queue_ms
                    .push((self.link.delay() - self.link.base).as_secs_f64() * 1e3);
                self.delays.push_back(self.link.delay());
                if self.delays.len() > self.lag {
                    self.delays.pop_front();
                }
                self.now += TICK;
            }
        }

        /// Controller i's average rate over seconds [from, to).
        fn rate(&self, i: usize, from: usize, to: usize) -> f64 {
            self.per_second[from..to].iter().map(|r| r[i]).sum::<f64>() / (to - from) as f64
        }
    }

    fn median(v: &[f64]) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    const MBIT: f64 = 125_000.0;

    #[test]
    fn short_paths_yield_on_bbr_long_ones_on_cubic() {
        let cc = |ms| congestion(Duration::from_millis(ms)).map(|c| c.as_str().to_string());
        assert_eq!(cc(21).as_deref(), Some("bbr"), "dsl-1m-bloat");
        assert_eq!(cc(150).as_deref(), Some("cubic"), "lfn-500m");
        assert_eq!(cc(590).as_deref(), Some("cubic"), "satellite-t1");
    }

    /// One controller alone for 60 s on 1 Mbit/s with a second of queue and a round trip of
    /// `base_ms`: it uses more than 85 % of the link from 10 s on.
    fn alone_on_dsl(base_ms: u64) -> Run {
        let mut r = Run::new(MBIT, base_ms, 1.0);
        r.add(Settings::default());
        r.run(60.0, &[true], 0.0);
        let share = r.rate(0, 10, 60) / MBIT;
        assert!(share > 0.85, "used {share:.2} of the link");
        r
    }

    #[test]
    fn it_fills_an_idle_link_with_little_queue() {
        // The lab's dsl-1m-bloat as configured: 40 ms.
        let r = alone_on_dsl(40);
        let q = median(&r.queue_ms[100..]);
        assert!(q <= 10.0, "median queue {q:.1} ms");
        // A plain sender fills the whole second of queue; this stays near the target.
        let worst = r.queue_ms[100..].iter().cloned().fold(0.0, f64::max);
        assert!(worst < 100.0, "queue reached {worst:.0} ms");
        let rep = r.ctls[0].0.report();
        // Alone, the queue is seen empty: the base needs no slowdown to be found.
        assert_eq!(rep.slowdowns, 0);
        assert!(rep.probes > 500);
    }

    #[test]
    fn where_two_segments_are_more_than_a_round_trip_carries_it_paces_under_the_link() {
        // The lab's dsl-1m-bloat as measured: 1 Mbit/s, 21 ms. Two segments per round trip
        // would be 1.1 Mbit/s, over the link's rate.
        let r = alone_on_dsl(21);
        let most = r.paced[100..].iter().cloned().fold(0.0, f64::max) / MBIT;
        assert!(most < 1.1, "paced at up to {most:.2} of the link");
    }

    #[test]
    fn it_fills_a_fast_long_path_quickly() {
        // 500 Mbit/s, 100 ms: slow start gets there within seconds.
        let mut r = Run::new(500.0 * MBIT, 100, 0.5);
        r.add(Settings::default());
        r.run(20.0, &[true], 0.0);
        let share = r.rate(0, 5, 20) / (500.0 * MBIT);
        assert!(share > 0.85, "used {share:.2} of the link");
    }

    /// satellite-t1 (its payload rate, bytes/s, beside): 590 ms, 96 kB of queue, the probes
    /// a round trip late, one controller.
    fn satellite() -> (Run, f64) {
        let link = 1_536_000.0 / 8.0 * 1448.0 / 1500.0;
        let mut r = Run::new(link, 590, 0.5);
        r.lag = 6;
        r.add(Settings::default());
        (r, link)
    }

    #[test]
    fn it_fills_a_long_thin_path_after_slow_start_overshoots() {
        // satellite-t1: 1.536 Mbit/s of payload, 590 ms, 96 kB of queue; the probes tell of
        // the queue a round trip late. Slow start overshoots by a round trip of doubling;
        // one cut drains it, and the rate comes back to the link's as soon as it has.
        let (mut r, link) = satellite();
        r.run(60.0, &[true], 0.0);
        let first = r.rate(0, 0, 15) / link;
        assert!(first > 0.65, "used {first:.2} of the link in 15 s");
        let all = r.rate(0, 0, 60) / link;
        assert!(all > 0.8, "used {all:.2} of the link in 60 s");
        let q = median(&r.queue_ms[100..]);
        assert!(q <= 10.0, "median queue {q:.1} ms");
    }

    #[test]
    fn it_yields_to_a_competitor_and_comes_back() {
        let mut r = Run::new(MBIT, 40, 1.0);
        r.add(Settings::default());
        r.run(20.0, &[true], 0.0);
        let alone = r.rate(0, 10, 20);
        // An unresponsive sender at 95 % of the link for 20 s: the queue it builds makes the
        // controller back off to its floor.
        let before = r.other_got;
        r.run(20.0, &[true], 0.95 * MBIT);
        let competitor = (r.other_got - before) / 20.0;
        assert!(
            competitor > 0.9 * 0.95 * MBIT,
            "the competitor got {:.0} of {:.0} bytes/s",
            competitor,
            0.95 * MBIT
        );
        let during = r.rate(0, 25, 40);
        assert!(during < 0.15 * alone, "kept {during:.0} of {alone:.0}");
        // Never below the floor: four segments per round trip behind a long queue.
        assert!(r.ctls[0].0.paced() >= (FLOOR * 1448.0 / 1.1) as u64);
        r.run(10.0, &[true], 0.0);
        let after = r.rate(0, 45, 50);
        assert!(after > 0.9 * alone, "back to {after:.0} of {alone:.0}");
        assert!(r.ctls[0].0.report().yielded_s > 10.0);
    }

    #[test]
    fn it_comes_back_on_a_long_path_within_round_trips_of_a_competitor_leaving() {
        // satellite-t1 again: an unresponsive competitor fills the queue for 10 s and the
        // controller backs off to its floor. Once the queue has drained it is back near the
        // link's rate within a few round trips, not doubling from the floor (seconds).
        let (mut r, link) = satellite();
        r.run(40.0, &[true], 0.0);
        r.run(10.0, &[true], 0.95 * link);
        assert!(r.rate(0, 45, 50) < 0.2 * link, "it yielded");
        r.run(15.0, &[true], 0.0);
        let drained = r.queue_ms[500..]
            .iter()
            .position(|&q| q < 1.0)
            .expect("the queue drains once the competitor has gone");
        let back = r.paced[500 + drained..]
            .iter()
            .position(|&p| p >= 0.8 * link)
            .expect("back at 80 % of the link");
        assert!(
            back as f64 * TICK.as_secs_f64() <= 2.0,
            "{:.1} s after the queue drained",
            back as f64 * TICK.as_secs_f64()
        );
    }

    #[test]
    fn two_transfers_share_fairly_whichever_came_first() {
        let mut r = Run::new(MBIT, 40, 1.0);
        r.add(Settings::default());
        r.run(20.0, &[true, false], 0.0);
        r.add(Settings::default());
        r.run(60.0, &[true, true], 0.0);
        let (a, b) = (r.rate(0, 50, 80), r.rate(1, 50, 80));
        let jain = (a + b).powi(2) / (2.0 * (a * a + b * b));
        assert!(jain >= 0.9, "shares {a:.0} and {b:.0}: Jain {jain:.2}");
        assert!((a + b) / MBIT > 0.8, "together {:.2}", (a + b) / MBIT);
    }

    #[test]
    fn the_base_follows_a_longer_path_and_slowdowns_reach_the_floor() {
        let mut c = Background::new(Settings::default(), Duration::from_millis(40));
        for i in 0..10 {
            c.on_probe(
                Duration::from_millis(100 * i),
                Duration::from_millis(40 + i),
            );
        }
        assert_eq!(c.base(), Some(Duration::from_millis(40)));
        assert_eq!(
            c.queue(),
            Some(Duration::from_millis(8)),
            "median of the last 3"
        );
        // Ten minutes on a path 30 ms longer: the old base ages out bucket by bucket.
        for s in 60..=660 {
            c.on_probe(Duration::from_secs(s), Duration::from_millis(70));
        }
        assert_eq!(c.base(), Some(Duration::from_millis(70)));
        // Behind a queue that stands (8 ms of someone else's, under the target), slowdowns
        // come every 20 s or so and pace at the floor: two segments per round trip.
        let mut c = Background::new(Settings::default(), Duration::from_millis(40));
        let (mut t, mut delivered, mut lowest) = (Duration::ZERO, 0u64, u64::MAX);
        while t < Duration::from_secs(60) {
            c.on_probe(t, Duration::from_millis(48));
            let r = c.on_tick(t, delivered);
            delivered += r / 10;
            if t > Duration::from_secs(5) {
                lowest = lowest.min(r);
            }
            t += Duration::from_millis(100);
        }
        assert!(c.report().slowdowns >= 2, "{}", c.report().slowdowns);
        assert_eq!(lowest, (2.0 * 1448.0 / 0.048f64).round() as u64);
    }

    #[test]
    fn one_probe_read_short_does_not_lower_the_base() {
        let ms = Duration::from_millis;
        let mut b = Background::new(Settings::default(), ms(150));
        for (i, rtt) in [150, 150, 146, 150, 150, 150].into_iter().enumerate() {
            b.on_probe(ms(100 * i as u64), ms(rtt));
        }
        assert_eq!(b.base(), Some(ms(150)));
        assert_eq!(b.queue(), Some(Duration::ZERO));
    }

    #[test]
    fn an_overdue_probe_is_a_queue_before_it_answers() {
        let mut c = Background::new(Settings::default(), Duration::from_millis(20));
        let mut t = Duration::ZERO;
        let mut delivered = 0;
        for _ in 0..100 {
            c.on_probe(t, Duration::from_millis(22));
            let r = c.on_tick(t, delivered);
            delivered += r / 20;
            t += Duration::from_millis(50);
        }
        let before = c.paced();
        // A competitor's burst: the next answer is half a second late.
        c.on_waiting(Some(Duration::from_millis(300)));
        assert_eq!(c.queue(), Some(Duration::from_millis(280)));
        let after = c.on_tick(t, delivered);
        assert!(after <= before / 2 + 1, "{before} -> {after}");
        // Answered: the queue is what the probes say again.
        c.on_waiting(None);
        assert_eq!(c.queue(), Some(Duration::from_millis(2)));
        // Before any answer, the first probe's wait is all there is.
        let mut c = Background::new(Settings::default(), Duration::from_millis(20));
        assert_eq!(c.queue(), None);
        c.on_waiting(Some(Duration::from_millis(120)));
        assert_eq!(c.queue(), Some(Duration::from_millis(100)));
    }

    #[test]
    fn a_rate_limit_caps_it_and_no_probe_keeps_the_first_rate() {
        let s = Settings {
            limit: Some(50_000),
            ..Settings::default()
        };
        let mut r = Run::new(MBIT, 40, 1.0);
        r.add(s);
        r.run(20.0, &[true], 0.0);
        assert!(r.ctls[0].0.paced() <= 50_000);
        assert!(r.rate(0, 10, 20) > 45_000.0);
        let mut c = Background::new(Settings::default(), Duration::from_millis(50));
        let first = c.paced();
        assert_eq!(first, (4.0 * 1448.0 / 0.05f64).round() as u64);
        assert_eq!(c.on_tick(Duration::from_secs(1), 1_000_000), first);
    }
}
