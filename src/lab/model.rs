//! The link model for one direction, in virtual time: no clocks, no devices. The relay tells
//! it when a packet of some length arrived; it answers what becomes of the packet and when.
//!
//! Per packet: a drop-tail queue (on the packets waiting, not the one being sent), then
//! serialization at the link rate, then random loss or loss from a bit error rate (a lost
//! packet still used its slot on the wire), optional corruption, then the propagation delay.

use rand::Rng;
use std::collections::VecDeque;

/// Nanoseconds since the relay started.
pub type Nanos = u64;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueueLimit {
    Packets(u64),
    Bytes(u64),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    None,
    /// Each packet is lost with this probability.
    Random(f64),
    /// Each bit is damaged with this probability; a damaged packet is lost (its checksum would
    /// fail), so long packets are lost more often than short ones.
    Ber(f64),
}

/// The parameters of one direction.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Bits per second; None is "as fast as the relay goes".
    pub rate: Option<u64>,
    pub delay: Nanos,
    pub queue: QueueLimit,
    pub loss: Loss,
    /// Per-bit probability of a flipped payload bit that still reaches the receiver, with its
    /// checksums fixed (0: off).
    pub corrupt: f64,
}

/// What becomes of one packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fate {
    /// The queue was full.
    QueueDrop,
    /// Sent, but lost on the wire; its transmission ended at `sent`.
    Lost { sent: Nanos },
    /// Delivered at `at`. `corrupt`: a random number choosing the bit to flip.
    Deliver {
        sent: Nanos,
        at: Nanos,
        corrupt: Option<u64>,
    },
}

/// Counters, for the report at the end.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counters {
    pub arrived_packets: u64,
    pub arrived_bytes: u64,
    pub queue_drops: u64,
    pub queue_drop_bytes: u64,
    pub lost: u64,
    pub corrupted: u64,
    pub delivered_packets: u64,
    pub delivered_bytes: u64,
    /// The longest a packet waited in the queue before its transmission started.
    pub max_queue_delay_us: u64,
}

/// One direction of the link.
pub struct Link {
    params: Params,
    /// When the packet now being sent (if any) leaves the wire.
    wire_free: Nanos,
    /// Packets whose transmission has not started: (start, length).
    waiting: VecDeque<(Nanos, u64)>,
    waiting_bytes: u64,
    pub counters: Counters,
}

impl Link {
    pub fn new(params: Params) -> Link {
        Link {
            params,
            wire_free: 0,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            counters: Counters::default(),
        }
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    /// A packet of `len` bytes (IP header included) arrived at `now`.
    pub fn arrive(&mut self, now: Nanos, len: usize, rng: &mut impl Rng) -> Fate {
        let len = len as u64;
        while let Some(&(start, l)) = self.waiting.front() {
            if start > now {
                break;
            }
            self.waiting.pop_front();
            self.waiting_bytes -= l;
        }
        self.counters.arrived_packets += 1;
        self.counters.arrived_bytes += len;
        let full = match self.params.queue {
            QueueLimit::Packets(n) => self.waiting.len() as u64 >= n,
            QueueLimit::Bytes(b) => self.waiting_bytes + len > b,
        };
        if full {
            self.counters.queue_drops += 1;
            self.counters.queue_drop_bytes += len;
            return Fate::QueueDrop;
        }
        let start = now.max(self.wire_free);
        let sent = start + self.serialization(len);
        self.wire_free = sent;
        if start > now {
            self.waiting.push_back((start, len));
            self.waiting_bytes += len;
            self.counters.max_queue_delay_us =
                self.counters.max_queue_delay_us.max((start - now) / 1000);
        }
        let p_loss = match self.params.loss {
            Loss::None => 0.0,
            Loss::Random(p) => p,
            Loss::Ber(b) => per_packet(b, len),
        };
        if p_loss > 0.0 && rng.random_bool(p_loss.min(1.0)) {
            self.counters.lost += 1;
            return Fate::Lost { sent };
        }
        let corrupt = (self.params.corrupt > 0.0
            && rng.random_bool(per_packet(self.params.corrupt, len).min(1.0)))
        .then(|| rng.random());
        self.counters.delivered_packets += 1;
        self.counters.delivered_bytes += len;
        Fate::Deliver {
            sent,
            at: sent + self.params.delay,
            corrupt,
        }
    }

    /// Time on the wire for `len` bytes.
    fn serialization(&self, len: u64) -> Nanos {
        match self.params.rate {
            Some(rate) if rate > 0 => {
                (u128::from(len) * 8 * 1_000_000_000 / u128::from(rate)) as Nanos
            }
            _ => 0,
        }
    }
}

/// The probability that at least one of a packet's bits is hit, at `per_bit`.
pub fn per_packet(per_bit: f64, len: u64) -> f64 {
    if per_bit >= 1.0 {
        return 1.0;
    }
    1.0 - ((len * 8) as f64 * (-per_bit).ln_1p()).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn link(rate: Option<u64>, delay: Nanos, queue: QueueLimit) -> Link {
        Link::new(Params {
            rate,
            delay,
            queue,
            loss: Loss::None,
            corrupt: 0.0,
        })
    }

    #[test]
    fn packets_are_serialized_back_to_back_then_delayed() {
        let mut rng = StdRng::seed_from_u64(1);
        // 1 Mbit/s: 1250 bytes take 10 ms.
        let mut l = link(Some(1_000_000), 50_000_000, QueueLimit::Packets(10));
        let a = l.arrive(0, 1250, &mut rng);
        let b = l.arrive(1_000_000, 1250, &mut rng);
        assert_eq!(
            a,
            Fate::Deliver {
                sent: 10_000_000,
                at: 60_000_000,
                corrupt: None
            }
        );
        // The second waits for the first: it starts at 10 ms, not at 1 ms.
        assert_eq!(
            b,
            Fate::Deliver {
                sent: 20_000_000,
                at: 70_000_000,
                corrupt: None
            }
        );
        assert_eq!(l.counters.max_queue_delay_us, 9_000);
        // After an idle gap the wire is free at once.
        let c = l.arrive(100_000_000, 125, &mut rng);
        assert!(matches!(
            c,
            Fate::Deliver {
                sent: 101_000_000,
                ..
            }
        ));
    }

    #[test]
    fn the_queue_counts_waiting_packets_not_the_one_on_the_wire() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut l = link(Some(1_000_000), 0, QueueLimit::Packets(2));
        // One on the wire, two waiting, the fourth is dropped.
        let fates: Vec<_> = (0..4).map(|_| l.arrive(0, 1250, &mut rng)).collect();
        assert!(matches!(fates[2], Fate::Deliver { .. }));
        assert_eq!(fates[3], Fate::QueueDrop);
        // Once the first is sent, one place is free again.
        assert!(matches!(
            l.arrive(10_000_000, 1250, &mut rng),
            Fate::Deliver { .. }
        ));
        assert_eq!(l.arrive(10_000_000, 1250, &mut rng), Fate::QueueDrop);
        let mut bytes = link(Some(1_000_000), 0, QueueLimit::Bytes(2000));
        let fates: Vec<_> = (0..3).map(|_| bytes.arrive(0, 1000, &mut rng)).collect();
        assert!(matches!(fates[2], Fate::Deliver { .. }));
        assert_eq!(bytes.arrive(0, 1000, &mut rng), Fate::QueueDrop);
        assert_eq!(bytes.counters.queue_drops, 1);
        assert_eq!(bytes.counters.queue_drop_bytes, 1000);
    }

    #[test]
    fn loss_and_ber_happen_at_their_rates() {
        let mut rng = StdRng::seed_from_u64(3);
        let n = 100_000;
        let mut l = Link::new(Params {
            rate: None,
            delay: 0,
            queue: QueueLimit::Packets(1),
            loss: Loss::Random(0.01),
            corrupt: 0.0,
        });
        for i in 0..n {
            l.arrive(i, 1500, &mut rng);
        }
        // Binomial: mean 1000, sd 31.5; 5 sd either way.
        assert!(
            (840..1160).contains(&l.counters.lost),
            "{}",
            l.counters.lost
        );
        // BER 1e-5 on 1500-byte packets: 1 - (1 - 1e-5)^12000 = 11.3 %.
        let p = per_packet(1e-5, 1500);
        assert!((p - 0.1131).abs() < 0.001, "{p}");
        let mut b = Link::new(Params {
            loss: Loss::Ber(1e-5),
            ..l.params().clone()
        });
        for i in 0..n {
            b.arrive(i, 1500, &mut rng);
        }
        let mean = p * n as f64;
        let sd = (mean * (1.0 - p)).sqrt();
        assert!(
            (b.counters.lost as f64 - mean).abs() < 5.0 * sd,
            "{} against {mean}",
            b.counters.lost
        );
    }

    #[test]
    fn lost_packets_still_use_the_wire() {
        let mut rng = StdRng::seed_from_u64(4);
        let mut l = Link::new(Params {
            rate: Some(1_000_000),
            delay: 0,
            queue: QueueLimit::Packets(10),
            loss: Loss::Random(1.0),
            corrupt: 0.0,
        });
        assert_eq!(l.arrive(0, 1250, &mut rng), Fate::Lost { sent: 10_000_000 });
        assert_eq!(l.arrive(0, 1250, &mut rng), Fate::Lost { sent: 20_000_000 });
    }
}
