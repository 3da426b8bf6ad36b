//! Background mode on one stream-mode data connection, where the server is not braid and can
//! neither be told a rate nor answer probes while data moves (vsftpd reads no command until
//! the transfer ends).
//!
//! The signal is the round trip the kernel measures on the data connection itself, which
//! carries the queue this transfer adds: when braid sends, its smoothed RTT; when it receives,
//! the receiver's estimate from TCP timestamps (the time from an acknowledgement leaving to
//! the data that echoes its timestamp arriving), which is what rLEDBAT (RFC 9840) uses. The
//! controller is the same as with a braid server ([`super::background`]). The actuator is the
//! pacing cap when braid sends, and when it receives the window it advertises: the rate over
//! the base round trip plus the target, so the sender cannot have more in flight whatever
//! its congestion control.
//!
//! Pure: `TCP_INFO` readings and time in, what to set on the socket out.

use super::background::{Report, Settings, Yielding};
use super::hooks::Pacer;
use super::stats::{LinkView, View, kernel_moved};
use super::transfer::LinkState;
use braid_sockopt::TcpInfo;
use std::time::Duration;

/// What to set on the data connection after a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apply {
    /// Sending: the pacing cap, bytes/s (under cubic, which follows a raised cap at once).
    Pace(u64),
    /// Receiving: the receive window's cap, bytes.
    Clamp(u32),
}

/// Background mode's controller on one connection.
pub struct StreamYield {
    pacer: Yielding,
    sending: bool,
    mss: u64,
    /// The kernel's round trip at the last sample, µs, and when it was taken: a reading that
    /// has not moved since is no new sample until a round trip has passed.
    last_rtt_us: u32,
    last_sample: Duration,
    /// The first base delay (the control connection's round trip).
    assumed: Duration,
    target: Duration,
    paced: Option<u64>,
}

impl StreamYield {
    /// `rtt`: the control connection's round trip, the first base delay.
    pub fn new(settings: Settings, rtt: Duration, sending: bool) -> StreamYield {
        StreamYield {
            pacer: Yielding::new(settings, rtt),
            sending,
            mss: settings.mss,
            last_rtt_us: 0,
            last_sample: Duration::ZERO,
            assumed: rtt,
            target: settings.target,
            paced: None,
        }
    }

    /// One tick at `elapsed` since the data connection opened, with its `TCP_INFO`.
    pub fn tick(&mut self, elapsed: Duration, info: TcpInfo) -> Apply {
        let rtt_us = if self.sending {
            info.rtt_us
        } else {
            info.rcv_rtt_us
        };
        let mut view = View::at_start(None);
        view.elapsed = elapsed;
        view.done = kernel_moved(&info);
        let rtt = Duration::from_micros(rtt_us.into());
        // A probe answer stands for a round trip: a reading that moved, or one that stayed
        // put for a round trip (a queue that holds still).
        let fresh = rtt_us != self.last_rtt_us || elapsed >= self.last_sample + rtt;
        if rtt_us > 0 && fresh {
            self.last_rtt_us = rtt_us;
            self.last_sample = elapsed;
            view.probes.push(rtt);
        }
        view.pacing = self.paced;
        view.links.push(LinkView {
            id: 0,
            state: LinkState::Open,
            retiring: false,
            bytes: view.done,
            rate: 0.0,
            tcp: Some(info),
        });
        // The controller always names a rate; the cap only stands in for "none".
        let rate = self.pacer.rate(&view).unwrap_or(u64::MAX);
        if self.sending {
            self.paced = Some(rate);
            Apply::Pace(rate)
        } else {
            // Sized by the base round trip and the target, not by the round trip measured:
            // a window of rate × measured RTT grows with the queue it makes, which then grows
            // with it, so the queue would run away whenever the rate is over the link's. This
            // way a window at the link's rate keeps exactly the target in the queue, and one
            // above it more, which the controller sees and cuts.
            let rtt = self.pacer.base().unwrap_or(self.assumed) + self.target;
            Apply::Clamp(receive_window(rate, rtt, self.mss))
        }
    }

    pub fn report(&self) -> Option<Report> {
        self.pacer.report()
    }
}

/// The receive window that holds a sender to `rate` (bytes/s) over a round trip of `rtt`:
/// what it may have in flight. Never under two segments, with which the
/// transfer keeps moving and every segment pair is acknowledged at once.
pub fn receive_window(rate: u64, rtt: Duration, mss: u64) -> u32 {
    let window = (rate as f64 * rtt.as_secs_f64()).ceil() as u64;
    window.max(2 * mss).min(u64::from(u32::MAX / 2)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            mss: 1448,
            ..Settings::default()
        }
    }

    /// A reading of a receiving connection: `bytes` in so far, the receiver's RTT.
    fn received(bytes: u64, rcv_rtt_ms: u32) -> TcpInfo {
        TcpInfo {
            bytes_received: bytes,
            snd_mss: 1448,
            rcv_rtt_us: rcv_rtt_ms * 1000,
            ..TcpInfo::default()
        }
    }

    fn sent(bytes: u64, rtt_ms: u32) -> TcpInfo {
        TcpInfo {
            bytes_sent: bytes,
            bytes_acked: bytes,
            snd_mss: 1448,
            rtt_us: rtt_ms * 1000,
            min_rtt_us: 20_000,
            ..TcpInfo::default()
        }
    }

    #[test]
    fn the_window_carries_the_rate_over_the_round_trip_and_never_less_than_two_segments() {
        let w = receive_window(125_000, Duration::from_millis(40), 1448);
        assert_eq!(w, 5000);
        assert_eq!(receive_window(1000, Duration::from_millis(40), 1448), 2896);
        assert_eq!(
            receive_window(u64::MAX, Duration::from_secs(1), 1448),
            i32::MAX as u32
        );
    }

    /// A 1 Mbit/s link with a 20 ms round trip and a drop-tail queue, fed by a sender that
    /// may have `window` bytes in flight: what arrives in `dt`, and the round trip data sees.
    struct WindowedLink {
        queue: f64,
        received: f64,
    }

    impl WindowedLink {
        const RATE: f64 = 125_000.0;
        const BASE: f64 = 0.020;

        fn step(&mut self, window: f64, dt: f64) -> f64 {
            // What the window keeps in flight beyond the path's own bytes stands in the queue.
            let target = (window - Self::RATE * Self::BASE).max(0.0);
            // The queue moves toward it at the link's rate at most.
            let room = Self::RATE * dt;
            self.queue += (target - self.queue).clamp(-room, room);
            let moved = (window / (Self::BASE + self.queue / Self::RATE)).min(Self::RATE) * dt;
            self.received += moved;
            Self::BASE + self.queue / Self::RATE
        }
    }

    #[test]
    fn a_receiver_fills_an_idle_link_through_its_window_and_keeps_the_queue_near_the_target() {
        let mut y = StreamYield::new(settings(), Duration::from_millis(20), false);
        let mut link = WindowedLink {
            queue: 0.0,
            received: 0.0,
        };
        let dt = 0.05;
        let mut rtt = WindowedLink::BASE;
        let mut late = Vec::new();
        for i in 0..1200 {
            let t = Duration::from_secs_f64(i as f64 * dt);
            let info = received(link.received as u64, (rtt * 1000.0).round() as u32);
            let Apply::Clamp(window) = y.tick(t, info) else {
                panic!("a receiver clamps its window")
            };
            assert!(window >= 2896, "below two segments: {window}");
            rtt = link.step(f64::from(window), dt);
            if i >= 600 {
                late.push((rtt - WindowedLink::BASE, link.received));
            }
        }
        let (first, last) = (late[0].1, late[late.len() - 1].1);
        let rate = (last - first) / (late.len() as f64 * dt);
        assert!(
            rate > 0.8 * WindowedLink::RATE,
            "{rate:.0} B/s of a 125000 B/s link"
        );
        let mut queues: Vec<f64> = late.iter().map(|&(q, _)| q).collect();
        queues.sort_by(f64::total_cmp);
        let median = queues[queues.len() / 2];
        assert!(median < 0.030, "median queue {:.1} ms", median * 1e3);
        assert!(y.report().is_some_and(|r| r.probes > 0));
    }

    #[test]
    fn a_sender_paces_from_its_own_round_trip() {
        let mut y = StreamYield::new(settings(), Duration::from_millis(20), true);
        let mut rates: Vec<u64> = Vec::new();
        let mut bytes = 0;
        for i in 0..40 {
            let t = Duration::from_millis(50 * i);
            bytes += 20_000;
            let Apply::Pace(rate) = y.tick(t, sent(bytes, 20)) else {
                panic!("a sender paces")
            };
            rates.push(rate);
        }
        assert!(
            rates.last() > rates.first(),
            "slow start on an empty queue raises the rate: {rates:?}"
        );
        // A queue of five targets: the rate is cut within a few ticks.
        let before = *rates.last().unwrap();
        let mut after = before;
        for i in 40..50 {
            bytes += 20_000;
            if let Apply::Pace(rate) = y.tick(Duration::from_millis(50 * i), sent(bytes, 70)) {
                after = rate;
            }
        }
        assert!(
            after < before / 2,
            "{before} then {after} behind 50 ms of queue"
        );
    }

    #[test]
    fn an_unchanged_reading_is_a_new_sample_only_once_a_round_trip_has_passed() {
        let mut y = StreamYield::new(settings(), Duration::from_millis(20), false);
        // Past the first ten segments, so that samples count; ticks 10 ms apart.
        for i in 0..10 {
            y.tick(Duration::from_millis(10 * i), received(100_000 + i, 45));
        }
        // At 0 and 50 ms, not at the ticks between.
        assert_eq!(y.report().map(|r| r.probes), Some(2));
        y.tick(Duration::from_millis(100), received(200_000, 46));
        assert_eq!(y.report().map(|r| r.probes), Some(3));
    }
}
