//! What one measured interval shows: goodput, the share of bytes sent again, the standing
//! queue, and the utility that weighs them (see the module above), read from [`View`]s.

use super::Auto;
use crate::engine::stats::View;
use std::time::Duration;

/// Queueing delay that does not count.
const QUIET_QUEUE: Duration = Duration::from_millis(2);

/// One measured interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Score {
    pub(super) n: usize,
    /// bytes/s
    pub(super) goodput: f64,
    /// Share of bytes sent again (0 when this side does not send).
    pub(super) loss: f64,
    /// RTT above the base RTT, in base RTTs.
    pub(super) queue: f64,
    /// Share of the time the connections had data to send that their windows held them back
    /// (the receiver's window or the sender's buffer), where the sending side says.
    pub(super) held: f64,
    pub(super) utility: f64,
}

/// Counters at the start of a measured interval.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    pub(super) at: Duration,
    pub(super) done: u64,
    pub(super) sending: Sending,
    /// [`Auto::rtt_sum`] and [`Auto::rtt_samples`] then.
    pub(super) rtt_sum: f64,
    pub(super) rtt_samples: u64,
}

impl Auto {
    pub(super) fn score(&self, view: &View, mark: &Mark) -> Score {
        let secs = (view.elapsed.saturating_sub(mark.at))
            .as_secs_f64()
            .max(1e-6);
        let goodput = moved(view).saturating_sub(mark.done) as f64 / secs;
        let now = sending(view);
        let sent = now.sent.saturating_sub(mark.sending.sent);
        let loss = if sent > 0 {
            now.retrans.saturating_sub(mark.sending.retrans) as f64 / sent as f64
        } else {
            0.0
        };
        // Queueing under 2 ms harms nobody (and on loopback or a LAN, scheduling alone is
        // many times the base RTT).
        let queue = match (self.base_rtt, self.mean_rtt_since(mark)) {
            (Some(base), Some(rtt)) if !base.is_zero() && rtt > base + QUIET_QUEUE => {
                (rtt.as_secs_f64() / base.as_secs_f64() - 1.0).clamp(0.0, 4.0)
            }
            _ => 0.0,
        };
        let held = match now.busy_us.saturating_sub(mark.sending.busy_us) {
            0 => 0.0,
            busy => now.held_us.saturating_sub(mark.sending.held_us) as f64 / busy as f64,
        };
        let n = view.active().count().max(1);
        let c = &self.cfg;
        let utility = goodput
            * (1.0 / c.k.powi(n as i32) - c.loss_weight * loss - c.delay_weight * queue).max(0.0);
        Score {
            n,
            goodput,
            loss,
            queue,
            held: held.min(1.0),
            utility,
        }
    }

    /// Where an interval starts: the counters now.
    pub(super) fn mark_now(&self, view: &View) -> Mark {
        Mark {
            at: view.elapsed,
            done: moved(view),
            sending: sending(view),
            rtt_sum: self.rtt_sum,
            rtt_samples: self.rtt_samples,
        }
    }

    /// The mean of the RTTs seen since `mark`.
    pub(super) fn mean_rtt_since(&self, mark: &Mark) -> Option<Duration> {
        let n = self.rtt_samples.saturating_sub(mark.rtt_samples);
        (n > 0).then(|| Duration::from_secs_f64((self.rtt_sum - mark.rtt_sum) / n as f64))
    }
}

/// Whether the bottleneck is full at this count: a standing queue of a quarter of the base
/// RTT, which senders below the link's rate do not build. More connections can then add only
/// queue and loss (on `lfn-200m`, 4 BBR connections stood 0.4-0.6 RTTs of queue; a step to 6
/// added 3 % of goodput and thousands of drops).
pub(super) fn full(s: &Score) -> bool {
    s.queue > 0.25
}

/// Whether the path shows congestion at this count: more than 1 % of bytes sent again, or
/// a standing queue of half the base RTT.
pub(super) fn congested(s: &Score) -> bool {
    s.loss > 0.01 || s.queue > 0.5
}

/// Whether `to` connections would still carry `s`'s goodput. Where their windows (the
/// receiver's, or the sender's buffer) held the connections back a quarter of the time they
/// had data to send, and little was lost, each carries what its window holds per round trip,
/// and the standing queue is the congestion control's own: `to` of them carry `to/n · (1 +
/// queue)` of the goodput, which must leave 5 % to spare. Four BBR connections on lfn-500m
/// stood 0.6 RTTs of queue while their 4 MiB send buffers held them half the time: three
/// carry it all with less queue, two moved a fifth less. Elsewhere the path, not windows, set
/// the pace, and fewer may carry it.
pub(super) fn fewer_carry(s: &Score, to: usize) -> bool {
    let held = s.held > 0.25 && s.loss <= 0.01;
    !held || to as f64 / s.n.max(1) as f64 * (1.0 + s.queue) >= 1.05
}

/// Bytes moved so far, from the kernel's counters (bytes acknowledged where this side sends,
/// received where it receives) while a connection is open: the payload counters advance a
/// piece (256 KiB) at a time, which on a slow connection is seconds. A closed connection
/// counts its payload.
pub(super) fn moved(view: &View) -> u64 {
    view.links
        .iter()
        .map(|l| {
            l.tcp
                .as_ref()
                .map_or(l.bytes, crate::engine::stats::kernel_moved)
        })
        .sum()
}

/// The sending side's counters: bytes sent and sent again, and microseconds with data to
/// send and, of them, held back by the receiver's window or the sender's buffer.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Sending {
    sent: u64,
    retrans: u64,
    busy_us: u64,
    held_us: u64,
}

/// The sending peer's report on a download, else this side's open connections (closed ones
/// drop out of the sums, which only matters at a change of count, where measurement
/// restarts anyway).
pub(super) fn sending(view: &View) -> Sending {
    if let Some(s) = &view.sender {
        return Sending {
            sent: s.sent,
            retrans: s.resent,
            busy_us: s.busy_ms * 1000,
            held_us: (s.rwnd_limited_ms + s.sndbuf_limited_ms) * 1000,
        };
    }
    view.links
        .iter()
        .filter_map(|l| l.tcp.as_ref())
        .fold(Sending::default(), |a, t| Sending {
            sent: a.sent + t.bytes_sent,
            retrans: a.retrans + t.bytes_retrans,
            busy_us: a.busy_us + t.busy_us,
            held_us: a.held_us + t.rwnd_limited_us + t.sndbuf_limited_us,
        })
}

/// The smallest RTT the kernel has seen on an open connection (or the sending peer has).
pub(super) fn min_rtt(view: &View) -> Option<Duration> {
    view.active()
        .filter_map(|l| l.tcp.as_ref())
        .map(|t| t.min_rtt_us)
        .chain(view.sender.map(|s| s.min_rtt_us))
        .filter(|&us| us > 0)
        .min()
        .map(|us| Duration::from_micros(us.into()))
}

/// The RTT now, averaged over open connections: the smoothed RTT where this side sends, the
/// sending peer's where it reports one, else the receiver's estimate.
pub(super) fn mean_rtt(view: &View) -> Option<Duration> {
    if let Some(s) = view.sender.filter(|s| s.rtt_us > 0) {
        return Some(Duration::from_micros(s.rtt_us.into()));
    }
    let rtts: Vec<u32> = view
        .active()
        .filter_map(|l| l.tcp.as_ref())
        .map(|t| {
            if t.bytes_sent > t.bytes_received {
                t.rtt_us
            } else {
                t.rcv_rtt_us
            }
        })
        .filter(|&us| us > 0)
        .collect();
    if rtts.is_empty() {
        return None;
    }
    let mean = rtts.iter().map(|&u| u64::from(u)).sum::<u64>() / rtts.len() as u64;
    Some(Duration::from_micros(mean))
}

pub(super) fn percent(now: f64, before: f64) -> String {
    if before <= 0.0 {
        return "goodput from nothing".into();
    }
    format!("goodput {:+.0}%", (now / before - 1.0) * 100.0)
}
