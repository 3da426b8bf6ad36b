//! The relay: one thread per direction reads packets from one host's TUN device, asks the
//! link model what becomes of each, and writes the survivors to the other host's device when
//! they are due.

use super::firewall::Accepts;
use super::model::{Counters, Fate, Link, Nanos, Params};
use super::packet::corrupt_payload;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use tun_rs::SyncDevice;

/// The longest the relay sleeps: bounds how late a delivery can be after a missed wakeup, and
/// how long a stop takes.
const MAX_WAIT: Nanos = 2_000_000;
/// Packets read in one go before due deliveries get their turn.
const BATCH: usize = 64;

/// One line per packet: `direction,arrival_us,bytes,fate,sent_us,delivered_us`.
pub type PacketLog = Arc<Mutex<std::io::BufWriter<std::fs::File>>>;

/// What one direction did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DirectionReport {
    #[serde(flatten)]
    pub counters: Counters,
    /// Writes to the receiving TUN device that failed.
    pub write_errors: u64,
    /// Connection openings the receiving host's firewall dropped (`--left-accepts`,
    /// `--right-accepts`).
    pub firewall_drops: u64,
}

pub struct Relay {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<DirectionReport>>,
}

impl Relay {
    /// Starts both directions: `up` carries left → right, `down` right → left; `firewall`
    /// says what left and right accept.
    pub fn start(
        left: Arc<SyncDevice>,
        right: Arc<SyncDevice>,
        [up, down]: [Params; 2],
        firewall: &super::Firewall,
        seed: u64,
        log: Option<PacketLog>,
    ) -> Relay {
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let spawn = |name: &'static str,
                     src: Arc<SyncDevice>,
                     dst: Arc<SyncDevice>,
                     params,
                     accepts: Option<Accepts>,
                     seed| {
            let stop = stop.clone();
            let log = log.clone();
            std::thread::spawn(move || {
                let mut d = Direction {
                    name,
                    src,
                    dst,
                    link: Link::new(params),
                    accepts,
                    firewall_drops: 0,
                    rng: StdRng::seed_from_u64(seed),
                    epoch,
                    log,
                    write_errors: 0,
                };
                d.run(&stop);
                DirectionReport {
                    counters: d.link.counters,
                    write_errors: d.write_errors,
                    firewall_drops: d.firewall_drops,
                }
            })
        };
        let threads = vec![
            spawn(
                "up",
                left.clone(),
                right.clone(),
                up,
                firewall.right.clone(),
                seed,
            ),
            spawn(
                "down",
                right,
                left,
                down,
                firewall.left.clone(),
                seed.wrapping_add(1),
            ),
        ];
        Relay { stop, threads }
    }

    /// Stops both directions; returns (up, down).
    pub fn stop(self) -> (DirectionReport, DirectionReport) {
        self.stop.store(true, Ordering::SeqCst);
        let mut reports = self
            .threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default());
        let up = reports.next().unwrap_or_default();
        let down = reports.next().unwrap_or_default();
        (up, down)
    }
}

struct Direction {
    name: &'static str,
    src: Arc<SyncDevice>,
    dst: Arc<SyncDevice>,
    link: Link,
    /// The receiving host's firewall.
    accepts: Option<Accepts>,
    firewall_drops: u64,
    rng: StdRng,
    epoch: Instant,
    log: Option<PacketLog>,
    write_errors: u64,
}

impl Direction {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    fn run(&mut self, stop: &AtomicBool) {
        let mut due: VecDeque<(Nanos, Vec<u8>)> = VecDeque::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let now = self.now();
            let wait = due
                .front()
                .map_or(MAX_WAIT, |(at, _)| at.saturating_sub(now).min(MAX_WAIT));
            if wait > 0 {
                let timeout = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: wait as _,
                };
                let mut fds = [rustix::event::PollFd::new(
                    &*self.src,
                    rustix::event::PollFlags::IN,
                )];
                let _ = rustix::event::poll(&mut fds, Some(&timeout));
            }
            for _ in 0..BATCH {
                let n = match self.src.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // WouldBlock, or a device that went away as the lab stops.
                    Err(_) => break,
                };
                if let Some(a) = &self.accepts
                    && !a.passes(&buf[..n])
                {
                    self.firewall_drops += 1;
                    continue;
                }
                let arrival = self.now();
                let fate = self.link.arrive(arrival, n, &mut self.rng);
                self.record(arrival, n, &fate);
                if let Fate::Deliver { at, corrupt, .. } = fate {
                    let mut packet = spare.pop().unwrap_or_default();
                    packet.clear();
                    packet.extend_from_slice(&buf[..n]);
                    if let Some(choice) = corrupt
                        && corrupt_payload(&mut packet, choice)
                    {
                        self.link.counters.corrupted += 1;
                    }
                    due.push_back((at, packet));
                }
            }
            let now = self.now();
            while due.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, packet)) = due.pop_front() {
                    if self.dst.send(&packet).is_err() {
                        self.write_errors += 1;
                    }
                    spare.push(packet);
                }
            }
        }
    }

    fn record(&self, arrival: Nanos, len: usize, fate: &Fate) {
        let Some(log) = &self.log else { return };
        let (what, sent, at) = match *fate {
            Fate::QueueDrop => ("queue-drop", None, None),
            Fate::Lost { sent } => ("lost", Some(sent), None),
            Fate::Deliver { sent, at, corrupt } => (
                if corrupt.is_some() {
                    "corrupt"
                } else {
                    "deliver"
                },
                Some(sent),
                Some(at),
            ),
        };
        let us = |t: Option<Nanos>| t.map_or(String::new(), |t| (t / 1000).to_string());
        if let Ok(mut w) = log.lock() {
            let _ = writeln!(
                w,
                "{},{},{len},{what},{},{}",
                self.name,
                arrival / 1000,
                us(sent),
                us(at)
            );
        }
    }
}
