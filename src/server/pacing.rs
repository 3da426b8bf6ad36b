//! How fast the server sends a download: the least of what the client asked for
//! (`OPTS RETR MaxRate`), the user's cap (`rate=` in the users file), the user's weighted share
//! of `--uplink` against the other running downloads, and, in background mode (`--background`
//! or the user's `background`), the background controller's rate.
//!
//! The controller is the client's ([`crate::engine::background`]), fed here by the round trip
//! the data connections see (`TCP_INFO`), since a server cannot probe through its client's
//! control connection; that round trip includes each data packet's own serialization, which
//! the lowest one, the base, includes too.

use crate::engine::background::{self, Settings, Yielding};
use crate::engine::hooks::Pacer;
use crate::engine::stats::Sampler;
use crate::engine::transfer::Transfer;
use crate::users::Class;
use braid_proto::retr_opts::CcName;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The running downloads' weights, for splitting `--uplink`.
#[derive(Debug, Default)]
pub struct Shares {
    /// (id, weight) of each running download; the next id.
    running: Mutex<(Vec<(u64, u32)>, u64)>,
}

/// One download's place among the [`Shares`], given up when dropped.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    id: u64,
    weight: u32,
}

impl Shares {
    pub fn join(self: &Arc<Self>, weight: u32) -> Share {
        let mut r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let id = r.1;
        r.1 += 1;
        r.0.push((id, weight));
        Share {
            shares: self.clone(),
            id,
            weight,
        }
    }

    fn total(&self) -> u64 {
        let r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        r.0.iter().map(|&(_, w)| u64::from(w)).sum()
    }
}

impl Share {
    /// Its part of `uplink` bytes/s now.
    pub fn of(&self, uplink: u64) -> u64 {
        let total = self.shares.total().max(1);
        (uplink as u128 * u128::from(self.weight) / u128::from(total)) as u64
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut r = self
            .shares
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        r.0.retain(|&(id, _)| id != self.id);
    }
}

/// The least of the caps that are set.
pub fn least(caps: &[Option<u64>]) -> Option<u64> {
    caps.iter().flatten().copied().min()
}

/// How often a download's rate is worked out again (the background controller's tick).
pub const EVERY: Duration = Duration::from_millis(50);

/// The pacing of one download the server sends.
pub struct Sending {
    /// What the client asked for (`MaxRate`).
    client: Option<u64>,
    class: Class,
    uplink: Option<u64>,
    share: Option<Share>,
    background: Option<(Sampler, Yielding)>,
    /// The rate last applied.
    applied: Option<u64>,
}

impl Sending {
    /// `rtt`: the control connection's lowest round trip, the controller's first base.
    /// Background mode, when the client asks for it (`asked`: the queueing delay it may add),
    /// or the server (`--background`) or the user's class does (the default delay).
    pub fn new(
        class: Class,
        asked: Option<Duration>,
        server_background: bool,
        uplink: Option<u64>,
        shares: &Arc<Shares>,
        rtt: Duration,
    ) -> Sending {
        let by_default = server_background || class.background;
        let target = asked.or(by_default.then_some(background::TARGET));
        let background = target.map(|target| {
            let settings = Settings {
                target,
                segments: background::burst_segments(background::congestion_by_data_rtt()),
                ..Settings::default()
            };
            (
                Sampler::new(Duration::from_secs(1)),
                Yielding::new(settings, rtt),
            )
        });
        Sending {
            client: None,
            class,
            uplink,
            share: uplink.map(|_| shares.join(class.weight)),
            background,
            applied: None,
        }
    }

    /// Whether the rate changes while the transfer runs (and [`Sending::tick`] is needed).
    pub fn steers(&self) -> bool {
        self.background.is_some() || self.share.is_some()
    }

    /// Whether the server's data connections should yield (DSCP 1).
    pub fn yields(&self) -> bool {
        self.background.is_some()
    }

    /// The congestion control of a yielding download, unless the client chose one.
    pub fn congestion(&self) -> Option<CcName> {
        self.yields()
            .then(background::congestion_by_data_rtt)
            .flatten()
    }

    /// The client's cap (`MaxRate`; None lifts it).
    pub fn client_asks(&mut self, rate: Option<u64>, moving: &Transfer) {
        self.client = rate;
        self.apply(moving);
    }

    /// Works the rate out again and applies it if it changed.
    pub fn tick(&mut self, moving: &Transfer) {
        self.apply(moving);
    }

    fn apply(&mut self, moving: &Transfer) {
        let controlled = self.background.as_mut().and_then(|(sampler, y)| {
            let mut view = sampler.sample(moving, None, 0);
            // The lowest smoothed round trip of the connections carrying data now.
            view.probes = view
                .links
                .iter()
                .filter_map(|l| l.tcp.as_ref())
                .filter(|t| t.rtt_us > 0 && t.unacked > 0)
                .map(|t| Duration::from_micros(t.rtt_us.into()))
                .min()
                .into_iter()
                .collect();
            y.rate(&view)
        });
        let share = match (&self.share, self.uplink) {
            (Some(s), Some(u)) => Some(s.of(u)),
            _ => None,
        };
        let rate = least(&[self.client, self.class.rate, share, controlled]);
        if rate != self.applied {
            moving.set_pacing(rate);
            self.applied = rate;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uplink_is_shared_by_weight_among_running_downloads() {
        let shares = Arc::new(Shares::default());
        let a = shares.join(1);
        assert_eq!(a.of(1000), 1000, "alone: all of it");
        let b = shares.join(4);
        assert_eq!((a.of(1000), b.of(1000)), (200, 800));
        let c = shares.join(5);
        assert_eq!((a.of(1000), b.of(1000), c.of(1000)), (100, 400, 500));
        drop(b);
        assert_eq!((a.of(1200), c.of(1200)), (200, 1000));
        drop(c);
        assert_eq!(a.of(1200), 1200);
    }

    #[test]
    fn the_least_cap_wins() {
        assert_eq!(least(&[None, None]), None);
        assert_eq!(least(&[Some(5), None, Some(3)]), Some(3));
    }

    #[test]
    fn a_download_is_paced_to_its_users_cap_and_share() {
        let shares = Arc::new(Shares::default());
        let other = shares.join(3);
        let class = Class {
            rate: Some(400),
            ..Class::default()
        };
        let moving = Transfer::new(true);
        let mut s = Sending::new(
            class,
            None,
            false,
            Some(1000),
            &shares,
            Duration::from_millis(20),
        );
        assert!(s.steers() && !s.yields());
        s.tick(&moving);
        assert_eq!(moving.pacing(), Some(250), "a quarter of the uplink");
        drop(other);
        s.tick(&moving);
        assert_eq!(moving.pacing(), Some(400), "alone: the user's cap");
        s.client_asks(Some(100), &moving);
        assert_eq!(moving.pacing(), Some(100), "the client asked for less");
        let moving = Transfer::new(true);
        let mut s = Sending::new(Class::default(), None, false, None, &shares, Duration::ZERO);
        assert!(!s.steers());
        s.client_asks(Some(100), &moving);
        assert_eq!(moving.pacing(), Some(100));
        s.client_asks(None, &moving);
        assert_eq!(moving.pacing(), None);
    }
}
