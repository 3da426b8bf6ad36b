//! Per-connection, per-direction TCP statistics from a stream of segments. Pure: segments and
//! their capture times in, summaries out; memory grows with connections and with holes in a
//! sequence space, not with the capture's length.
//!
//! Definitions follow tcptrace where it has one, so the numbers can be checked against it:
//! a segment is a retransmission when any byte of its sequence range (SYN and FIN count one
//! each) was seen before; segments sent into a zero window are probes, not retransmissions;
//! RTT samples come from ACKs that acknowledge exactly the end of a segment that was never
//! retransmitted (Karn's rule).

use super::decode::Segment;
use braid_proto::ranges::RangeSet;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

/// Nanoseconds since the capture's first packet.
pub type Nanos = u64;

#[derive(Default)]
struct Direction {
    packets: u64,
    data_packets: u64,
    data_bytes: u64,
    unique_bytes: u64,
    wire_bytes: u64,
    first: Option<Nanos>,
    last: Nanos,
    rexmt_packets: u64,
    rexmt_bytes: u64,
    out_of_order: u64,
    zero_window_events: u64,
    zero_window_probes: u64,
    truncated: u64,
    window_scale: Option<u8>,
    window_min: Option<u64>,
    window_max: u64,
    last_window: Option<u64>,
    /// Sequence numbers unwrapped to 64 bits: the first one seen, plus 2^32 of headroom.
    base: Option<u64>,
    last_abs: u64,
    seen: RangeSet,
    max_end: u64,
    /// Segments sent and not yet acknowledged: (end, send time, retransmitted).
    outstanding: VecDeque<(u64, Nanos, bool)>,
    /// Sequence space acknowledged by the other side, from the first byte seen.
    highest_ack: u64,
    rtt: Rtt,
    fit: Fit,
}

#[derive(Default)]
struct Rtt {
    count: u64,
    sum: u64,
    min: Option<u64>,
    max: u64,
}

/// Least-squares fit of cumulative data bytes against time (seconds), as bps.awk did.
#[derive(Default)]
struct Fit {
    n: f64,
    t: f64,
    y: f64,
    tt: f64,
    ty: f64,
}

impl Fit {
    fn add(&mut self, t: f64, y: f64) {
        self.n += 1.0;
        self.t += t;
        self.y += y;
        self.tt += t * t;
        self.ty += t * y;
    }

    /// Bytes per second, or None with fewer than two distinct times.
    fn slope(&self) -> Option<f64> {
        let d = self.n * self.tt - self.t * self.t;
        (self.n >= 2.0 && d > 0.0).then(|| (self.n * self.ty - self.t * self.y) / d)
    }
}

const WRAP: u64 = 1 << 32;

impl Direction {
    /// The 64-bit position of `seq`: the one closest to the last position seen.
    fn unwrap(&mut self, seq: u32) -> u64 {
        if self.base.is_none() {
            let abs = WRAP + u64::from(seq);
            self.base = Some(abs);
            self.last_abs = abs;
            return abs;
        }
        closest(self.last_abs, seq)
    }

    /// Like `unwrap`, for an ACK of this direction's data: None before any was seen.
    fn position(&self, seq: u32) -> Option<u64> {
        self.base.map(|_| closest(self.last_abs, seq))
    }
}

/// The 64-bit number with low half `seq` nearest to `last`.
fn closest(last: u64, seq: u32) -> u64 {
    let high = last & !(WRAP - 1);
    [high.saturating_sub(WRAP), high, high + WRAP]
        .into_iter()
        .map(|h| h | u64::from(seq))
        .min_by_key(|c| c.abs_diff(last))
        .unwrap_or(high | u64::from(seq))
}

struct Connection {
    /// `a` sent the first packet seen (the SYN, when the capture has it).
    a: SocketAddr,
    b: SocketAddr,
    index: usize,
    first: Nanos,
    last: Nanos,
    dirs: [Direction; 2],
}

/// The whole analysis.
#[derive(Default)]
pub struct Analysis {
    connections: HashMap<(SocketAddr, SocketAddr), Connection>,
    last_time: Option<Nanos>,
    pub backwards: u64,
}

/// What one segment was, for the series output.
pub struct Seen {
    pub connection: usize,
    /// 0: a → b, 1: b → a.
    pub direction: usize,
    pub data_len: u32,
    pub retransmission: bool,
    /// Bytes of the other direction acknowledged so far, as of this segment.
    pub acked: u64,
    /// Where this segment's data starts, from the direction's first sequence number.
    pub offset: u64,
    /// An RTT sample this segment's ACK gave for the other direction.
    pub rtt: Option<Nanos>,
}

impl Analysis {
    pub fn new() -> Analysis {
        Analysis::default()
    }

    pub fn add(&mut self, t: Nanos, s: &Segment) -> Seen {
        if let Some(last) = self.last_time
            && t < last
        {
            self.backwards += 1;
        }
        self.last_time = Some(self.last_time.map_or(t, |l| l.max(t)));
        let key = if s.src <= s.dst {
            (s.src, s.dst)
        } else {
            (s.dst, s.src)
        };
        let next_index = self.connections.len();
        let c = self.connections.entry(key).or_insert_with(|| Connection {
            a: s.src,
            b: s.dst,
            index: next_index,
            first: t,
            last: t,
            dirs: [Direction::default(), Direction::default()],
        });
        c.first = c.first.min(t);
        c.last = c.last.max(t);
        let d = usize::from(s.src != c.a);
        let [first, second] = &mut c.dirs;
        let (this, other) = if d == 0 {
            (first, second)
        } else {
            (second, first)
        };
        let retransmission = on_segment(this, other, t, s);
        let offset = match this.base {
            Some(base) if s.data_len > 0 => {
                this.position(s.seq).map_or(0, |p| p.saturating_sub(base))
            }
            _ => 0,
        };
        let (acked, rtt) = if s.has_ack {
            on_ack(other, t, s.ack)
        } else {
            (0, None)
        };
        Seen {
            connection: c.index,
            direction: d,
            data_len: s.data_len,
            retransmission,
            acked,
            offset,
            rtt,
        }
    }

    /// Connections in the order they first appeared.
    pub fn report(&self) -> Vec<ConnectionReport> {
        let mut list: Vec<&Connection> = self.connections.values().collect();
        list.sort_by_key(|c| c.index);
        list.into_iter()
            .map(|c| ConnectionReport {
                a: c.a.to_string(),
                b: c.b.to_string(),
                first_s: secs(c.first),
                last_s: secs(c.last),
                duration_s: secs(c.last - c.first),
                packets: c.dirs[0].packets + c.dirs[1].packets,
                a2b: direction_report(&c.dirs[0]),
                b2a: direction_report(&c.dirs[1]),
            })
            .collect()
    }
}

/// Counts a segment in its direction; returns whether it retransmitted anything.
fn on_segment(this: &mut Direction, other: &Direction, t: Nanos, s: &Segment) -> bool {
    this.packets += 1;
    this.wire_bytes += u64::from(s.wire_len);
    // Capture times may go backwards (clock steps, interfaces merged out of order).
    this.first = Some(this.first.map_or(t, |f| f.min(t)));
    this.last = this.last.max(t);
    if s.truncated {
        this.truncated += 1;
    }
    if s.syn
        && let Some(ws) = s.window_scale
    {
        this.window_scale = Some(ws.min(14));
    }
    // Windows are scaled only outside SYNs, and only when both sides offered scaling.
    let scale = match (s.syn, this.window_scale, other.window_scale) {
        (false, Some(ws), Some(_)) => ws,
        _ => 0,
    };
    let window = u64::from(s.window) << scale;
    // As in tcptrace, SYNs (whose window is never scaled) and resets do not count.
    if !s.rst && !s.syn {
        this.window_min = Some(this.window_min.map_or(window, |m| m.min(window)));
        this.window_max = this.window_max.max(window);
        if window == 0 && this.last_window != Some(0) {
            this.zero_window_events += 1;
        }
        this.last_window = Some(window);
    }
    let len = u64::from(s.data_len) + u64::from(s.syn) + u64::from(s.fin);
    if s.data_len > 0 {
        this.data_packets += 1;
        this.data_bytes += u64::from(s.data_len);
        let t0 = this.first.unwrap_or(t);
        this.fit
            .add(secs(t.saturating_sub(t0)), this.data_bytes as f64);
    }
    if len == 0 {
        return false;
    }
    let start = this.unwrap(s.seq);
    this.last_abs = this.last_abs.max(start);
    let end = start + len;
    if other.last_window == Some(0) && other.packets > 0 {
        this.zero_window_probes += 1;
        return false;
    }
    let again = this.seen.overlap(start, end);
    if end < this.max_end && again < len {
        this.out_of_order += 1;
    }
    this.seen.insert(start, end);
    this.max_end = this.max_end.max(end);
    this.last_abs = this.last_abs.max(end);
    this.unique_bytes += (len - again).saturating_sub(u64::from(s.syn) + u64::from(s.fin));
    if again > 0 {
        this.rexmt_packets += 1;
        this.rexmt_bytes += again;
        for o in this.outstanding.iter_mut() {
            if o.0 > start {
                o.2 = true;
            }
        }
        if end > this.outstanding.back().map_or(0, |o| o.0) {
            this.outstanding.push_back((end, t, true));
        }
        true
    } else {
        this.outstanding.push_back((end, t, false));
        false
    }
}

/// An ACK from the other side, for `this` direction's data: RTT samples (Karn's rule).
/// Returns the bytes of this direction acknowledged so far, and the RTT sample, if any.
fn on_ack(this: &mut Direction, t: Nanos, ack: u32) -> (u64, Option<Nanos>) {
    let (Some(base), Some(ack)) = (this.base, this.position(ack)) else {
        return (0, None);
    };
    let mut got = None;
    while let Some(&(end, sent, retransmitted)) = this.outstanding.front() {
        if end > ack {
            break;
        }
        this.outstanding.pop_front();
        if end == ack && !retransmitted {
            let sample = t.saturating_sub(sent);
            this.rtt.count += 1;
            this.rtt.sum += sample;
            this.rtt.min = Some(this.rtt.min.map_or(sample, |m| m.min(sample)));
            this.rtt.max = this.rtt.max.max(sample);
            got = Some(sample);
        }
    }
    this.highest_ack = this.highest_ack.max(ack.saturating_sub(base));
    (this.highest_ack, got)
}

fn secs(ns: Nanos) -> f64 {
    ns as f64 / 1e9
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ConnectionReport {
    pub a: String,
    pub b: String,
    pub first_s: f64,
    pub last_s: f64,
    pub duration_s: f64,
    pub packets: u64,
    pub a2b: DirectionReport,
    pub b2a: DirectionReport,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DirectionReport {
    pub packets: u64,
    pub data_packets: u64,
    pub data_bytes: u64,
    pub unique_bytes: u64,
    pub wire_bytes: u64,
    pub first_s: Option<f64>,
    pub last_s: Option<f64>,
    /// Data bytes over the direction's time span, in bit/s.
    pub mean_bps: Option<f64>,
    /// Least-squares slope of cumulative data bytes against time, in bit/s.
    pub slope_bps: Option<f64>,
    pub rexmt_packets: u64,
    pub rexmt_bytes: u64,
    /// Retransmitted bytes per data byte sent.
    pub rexmt_rate: f64,
    pub out_of_order: u64,
    pub rtt_samples: u64,
    pub rtt_min_ms: Option<f64>,
    pub rtt_mean_ms: Option<f64>,
    pub rtt_max_ms: Option<f64>,
    pub window_min: Option<u64>,
    pub window_max: u64,
    pub zero_window_events: u64,
    pub zero_window_probes: u64,
    /// Packets whose payload the capture cut short (snap length).
    pub truncated_packets: u64,
}

fn direction_report(d: &Direction) -> DirectionReport {
    let span = d.first.map(|f| secs(d.last - f));
    let ms = |ns: u64| ns as f64 / 1e6;
    DirectionReport {
        packets: d.packets,
        data_packets: d.data_packets,
        data_bytes: d.data_bytes,
        unique_bytes: d.unique_bytes,
        wire_bytes: d.wire_bytes,
        first_s: d.first.map(secs),
        last_s: d.first.map(|_| secs(d.last)),
        mean_bps: span
            .filter(|s| *s > 0.0)
            .map(|s| d.data_bytes as f64 * 8.0 / s),
        slope_bps: d.fit.slope().map(|b| b * 8.0),
        rexmt_packets: d.rexmt_packets,
        rexmt_bytes: d.rexmt_bytes,
        rexmt_rate: if d.data_bytes > 0 {
            d.rexmt_bytes as f64 / d.data_bytes as f64
        } else {
            0.0
        },
        out_of_order: d.out_of_order,
        rtt_samples: d.rtt.count,
        rtt_min_ms: d.rtt.min.map(ms),
        rtt_mean_ms: (d.rtt.count > 0).then(|| ms(d.rtt.sum) / d.rtt.count as f64),
        rtt_max_ms: (d.rtt.count > 0).then(|| ms(d.rtt.max)),
        window_min: d.window_min,
        window_max: d.window_max,
        zero_window_events: d.zero_window_events,
        zero_window_probes: d.zero_window_probes,
        truncated_packets: d.truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(from: &str, to: &str, seq: u32, ack: Option<u32>, len: u32) -> Segment {
        Segment {
            src: from.parse().unwrap(),
            dst: to.parse().unwrap(),
            seq,
            ack: ack.unwrap_or(0),
            syn: false,
            fin: false,
            rst: false,
            has_ack: ack.is_some(),
            window: 1000,
            window_scale: None,
            data_len: len,
            wire_len: 40 + len,
            truncated: false,
        }
    }

    const A: &str = "10.0.0.1:5000";
    const B: &str = "10.0.0.2:21";

    /// Found by the fuzz target: a segment stamped before the first one of its direction.
    #[test]
    fn capture_times_that_go_backwards_are_taken_as_they_come() {
        let mut an = Analysis::new();
        an.add(5_000_000, &seg(A, B, 1, None, 100));
        an.add(2_000_000, &seg(A, B, 101, None, 100));
        an.add(3_000_000, &seg(B, A, 1, Some(201), 0));
        let r = an.report();
        let a2b = &r[0].a2b;
        assert_eq!(a2b.data_bytes, 200);
        assert_eq!((a2b.first_s, a2b.last_s), (Some(0.002), Some(0.005)));
    }

    #[test]
    fn retransmissions_rtt_and_windows() {
        let mut an = Analysis::new();
        let ms = 1_000_000;
        let mut syn = seg(A, B, u32::MAX - 100, None, 0);
        syn.syn = true;
        syn.window_scale = Some(7);
        an.add(0, &syn);
        let mut synack = seg(B, A, 500, Some(u32::MAX - 99), 0);
        synack.syn = true;
        synack.window_scale = Some(2);
        an.add(10 * ms, &synack);
        // Data crosses the 2^32 wrap: seq MAX-99 + 100 wraps to 0.
        an.add(20 * ms, &seg(A, B, u32::MAX - 99, Some(501), 100));
        an.add(21 * ms, &seg(A, B, 0, Some(501), 100));
        an.add(22 * ms, &seg(A, B, 100, Some(501), 100));
        // The first data segment is acknowledged exactly: a 10 ms sample.
        an.add(30 * ms, &seg(B, A, 501, Some(0), 0));
        // The third is lost and sent again; its ACK gives no sample.
        an.add(40 * ms, &seg(A, B, 100, Some(501), 100));
        let mut zero = seg(B, A, 501, Some(200), 0);
        zero.window = 0;
        an.add(55 * ms, &zero);
        let r = an.report();
        assert_eq!(r.len(), 1);
        let c = &r[0];
        assert_eq!((c.a.as_str(), c.b.as_str()), (A, B));
        assert_eq!(c.packets, 8);
        assert!((c.duration_s - 0.055).abs() < 1e-9);
        let a2b = &c.a2b;
        assert_eq!(
            (a2b.data_packets, a2b.data_bytes, a2b.unique_bytes),
            (4, 400, 300)
        );
        assert_eq!((a2b.rexmt_packets, a2b.rexmt_bytes), (1, 100));
        // The SYN (acknowledged by the SYN-ACK) and the first data segment: 10 ms each.
        assert_eq!(a2b.rtt_samples, 2);
        assert_eq!((a2b.rtt_min_ms, a2b.rtt_max_ms), (Some(10.0), Some(10.0)));
        // B's windows are scaled by B's shift (2) once both offered scaling.
        assert_eq!(c.b2a.window_max, 4000);
        assert_eq!(c.b2a.window_min, Some(0));
        assert_eq!(c.b2a.zero_window_events, 1);
        assert_eq!(a2b.window_max, 1000 << 7);
    }

    #[test]
    fn out_of_order_and_backwards_time() {
        let mut an = Analysis::new();
        an.add(100, &seg(A, B, 1000, None, 100));
        an.add(200, &seg(A, B, 1200, None, 100));
        // Fills the hole: out of order, not a retransmission.
        an.add(300, &seg(A, B, 1100, None, 100));
        an.add(250, &seg(A, B, 1300, None, 100));
        let r = an.report();
        assert_eq!(r[0].a2b.out_of_order, 1);
        assert_eq!(r[0].a2b.rexmt_packets, 0);
        assert_eq!(an.backwards, 1);
        // Cumulative bytes rising steadily: the fitted slope is the rate.
        let mut steady = Analysis::new();
        for i in 0..100u32 {
            steady.add(u64::from(i) * 1_000_000, &seg(A, B, i * 1000, None, 1000));
        }
        let slope = steady.report()[0].a2b.slope_bps.unwrap();
        assert!((slope - 8_000_000.0).abs() < 1.0, "{slope}");
    }
}
