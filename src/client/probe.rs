//! Background mode's probes: the round trip of a small command on the control connection
//! while the data moves, which waits in the same queues as everybody's pings.
//!
//! A braid server answers `STAT` (and a change of rate) at once during a transfer, and the
//! answer carries the acknowledgement of the command. The kernel folds that one round trip
//! into the connection's smoothed RTT (`srtt = 7/8 srtt + 1/8 sample`), so with one command
//! in flight at a time the sample is exactly `8 srtt_after − 7 srtt_before`: no timestamps,
//! and no dependence on when this side gets round to reading the answer. Rate changes for
//! the server go out as the probe (one command per round trip, never two in flight).

use super::control::Control;
use super::error::Result;
use crate::engine::hooks::{Steering, Tell};
use std::time::Duration;

/// A probe on its way.
#[derive(Debug, Clone, Copy)]
struct Out {
    /// The smoothed RTT when it left, µs.
    srtt_us: u32,
    sent: std::time::Instant,
    /// Another command was unacknowledged when it left, or went out after it: the kernel may
    /// have taken two samples, and this one's round trip cannot be told apart from the
    /// smoothed RTT. It is timed from `sent` (then the last command's) to the acknowledgement
    /// of everything, which the kernel dates.
    spoilt: bool,
}

#[derive(Debug, Default)]
pub struct Prober {
    out: Option<Out>,
    /// Changes for the server not yet sent (the newest of each kind).
    pending: Tell,
    /// The rate last told.
    told: Option<u64>,
}

impl Prober {
    /// Gives the steering what the probes show before its tick: the round trip of one just
    /// answered, and how long the one in flight has been out (a queue a competitor fills at
    /// once delays the answer by as much, which counts before it comes).
    pub fn show(&mut self, c: &Control, steering: &mut Steering) {
        if let Some(rtt) = self.measure(c) {
            steering.probed(rtt);
        }
        steering.probe_out(self.out_for());
    }

    /// The round trip of the probe in flight, once its acknowledgement is in.
    fn measure(&mut self, c: &Control) -> Option<Duration> {
        let out = self.out?;
        let info = braid_sockopt::tcp_info(c.socket()?)?;
        if info.unacked > 0 {
            return None;
        }
        self.out = None;
        let rtt = if out.spoilt {
            let since_ack = Duration::from_millis(u64::from(info.last_ack_recv_ms));
            out.sent.elapsed().saturating_sub(since_ack)
        } else {
            sample(out.srtt_us, info.rtt_us)
        };
        // No round trip is shorter than the shortest the connection has seen: anything
        // else was not one sample (a retransmission, say), and is dropped.
        (rtt.as_micros() as u64 * 10 >= u64::from(info.min_rtt_us) * 9).then_some(rtt)
    }

    /// How long the probe in flight has been out (its round trip is at least that).
    fn out_for(&self) -> Option<Duration> {
        self.out.map(|o| o.sent.elapsed())
    }

    /// Sends the next probe unless one is in flight: the pending change for the server, if
    /// any, or `STAT`. `tell`: what the steering changed at this tick.
    pub fn send(&mut self, c: &mut Control, tell: Tell) -> Result<()> {
        if tell.rate.is_some() {
            self.pending.rate = tell.rate;
        }
        if tell.congestion.is_some() {
            self.pending.congestion = tell.congestion;
        }
        if let Some(out) = &mut self.out {
            // A slower rate goes at once: waiting for the probe's answer behind the queue a
            // competitor has just filled would keep the server sending for as long.
            let slower =
                matches!(self.pending.rate, Some(Some(r)) if self.told.is_none_or(|t| r < t));
            if !slower {
                return Ok(());
            }
            // The round trip now ends with this command's acknowledgement.
            out.spoilt = true;
            out.sent = std::time::Instant::now();
            let cmd = self.change(c);
            return c.send(&cmd);
        }
        let Some(info) = c.socket().and_then(braid_sockopt::tcp_info) else {
            let cmd = self.change(c);
            return c.send(&cmd);
        };
        // Commands still unacknowledged (the transfer's own, whose acknowledgement may wait
        // behind a full queue) would give their round trip to the smoothed RTT too: the probe
        // goes anyway, timed by the clock.
        let spoilt = info.unacked > 0 || info.notsent_bytes > 0;
        let cmd = if self.pending == Tell::default() {
            c.session().probe()
        } else {
            self.change(c)
        };
        c.send(&cmd)?;
        self.out = Some(Out {
            srtt_us: info.rtt_us,
            sent: std::time::Instant::now(),
            spoilt,
        });
        Ok(())
    }
}

impl Prober {
    /// The pending change as a command for the server, noting the rate told.
    fn change(&mut self, c: &mut Control) -> braid_proto::Command {
        let t = std::mem::take(&mut self.pending);
        if let Some(r) = t.rate {
            self.told = r;
        }
        c.session().change_sending(t.rate, t.congestion)
    }
}

/// The one RTT sample that moved the smoothed RTT from `before` to `after` (µs).
fn sample(before: u32, after: u32) -> Duration {
    let m = 8 * i64::from(after) - 7 * i64::from(before);
    // Rounding aside, never below zero; a probe acknowledged without a sample (sent again,
    // say) leaves the RTT as it was, which reads as a sample equal to it.
    Duration::from_micros(m.max(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sample_is_recovered_from_the_smoothed_rtt() {
        // The kernel's estimator: srtt += (m - srtt) / 8.
        let before = 40_000u32;
        for m in [40_000u32, 41_000, 250_000, 10_000] {
            let after = before + (m / 8) - before / 8;
            let got = sample(before, after).as_micros() as i64;
            assert!((got - i64::from(m)).abs() <= 8, "{m} read as {got}");
        }
        assert_eq!(sample(40_000, 40_000), Duration::from_millis(40));
        assert_eq!(sample(100_000, 10_000), Duration::from_micros(1));
    }
}
