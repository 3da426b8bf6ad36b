//! The relay: the lab's hosts hang off one switch, each through its own access link (a link
//! model per direction). One thread per host reads packets from the host's TUN device and
//! passes them through its uplink; when one reaches the switch it goes to the host its
//! destination address names, through that host's downlink, and is written to that host's
//! device when due. A two-host lab is the same switch with open downlinks: each host's uplink
//! is then the whole path, and the thread writes straight to the other device.

use super::firewall::Accepts;
use super::model::{Counters, Fate, Link, Nanos, Params};
use super::packet::corrupt_payload;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::VecDeque;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
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
/// Packets a downlink's inbox holds before the switch drops more (the downlink's own queue
/// limit applies as they are taken in; this only bounds memory while its thread is held up).
const INBOX: usize = 20_000;

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
    /// Packets for an address no host of the lab has, dropped at the switch.
    #[serde(skip_serializing_if = "is_zero")]
    pub unroutable: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One host as the relay sees it.
pub struct Port {
    pub device: Arc<SyncDevice>,
    pub address: Ipv4Addr,
    /// Names for the packet log: (uplink, downlink).
    pub labels: (String, String),
    /// Host → switch.
    pub up: Params,
    /// Switch → host; None: open (no rate, delay or loss), packets go straight to the device.
    pub down: Option<Params>,
    /// What the host takes new connections on (None: everything).
    pub accepts: Option<Accepts>,
}

/// What a host's two directions did.
#[derive(Debug, Clone, Default)]
pub struct PortReport {
    pub up: DirectionReport,
    pub down: DirectionReport,
}

/// What every thread may reach of a host: its device, and its downlink's inbox.
struct Reach {
    device: Arc<SyncDevice>,
    address: Ipv4Addr,
    open_down: bool,
    accepts: Option<Accepts>,
    inbox: Mutex<Vec<Vec<u8>>>,
    /// Written to when the inbox gets a packet, so a sleeping thread wakes for it.
    bell: OwnedFd,
}

pub struct Relay {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<PortReport>>,
}

impl Relay {
    /// Starts one thread per host.
    pub fn start(ports: Vec<Port>, seed: u64, log: Option<PacketLog>) -> std::io::Result<Relay> {
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let mut reach = Vec::new();
        for p in &ports {
            let bell = rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
            )?;
            reach.push(Reach {
                device: p.device.clone(),
                address: p.address,
                open_down: p.down.is_none(),
                accepts: p.accepts.clone(),
                inbox: Mutex::new(Vec::new()),
                bell,
            });
        }
        let reach = Arc::new(reach);
        let threads = ports
            .into_iter()
            .enumerate()
            .map(|(me, p)| {
                let stop = stop.clone();
                let log = log.clone();
                let reach = reach.clone();
                std::thread::spawn(move || {
                    let mut h = Host {
                        me,
                        reach,
                        labels: p.labels,
                        up: Link::new(p.up),
                        down: p.down.map(Link::new),
                        report: PortReport::default(),
                        rng: StdRng::seed_from_u64(seed.wrapping_add(me as u64)),
                        epoch,
                        log,
                    };
                    h.run(&stop);
                    h.report.up.counters = h.up.counters.clone();
                    if let Some(d) = &h.down {
                        h.report.down.counters = d.counters.clone();
                    }
                    h.report
                })
            })
            .collect();
        Ok(Relay { stop, threads })
    }

    /// Stops every thread; returns each host's report, in the order the ports were given.
    pub fn stop(self) -> Vec<PortReport> {
        self.stop.store(true, Ordering::SeqCst);
        self.threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect()
    }
}

/// One host's thread: its uplink, and its downlink when that is not open.
struct Host {
    me: usize,
    reach: Arc<Vec<Reach>>,
    labels: (String, String),
    up: Link,
    down: Option<Link>,
    report: PortReport,
    rng: StdRng,
    epoch: Instant,
    log: Option<PacketLog>,
}

impl Host {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    fn run(&mut self, stop: &AtomicBool) {
        // Packets on the uplink, due at the switch; packets on the downlink, due at the device.
        let mut at_switch: VecDeque<(Nanos, Vec<u8>)> = VecDeque::new();
        let mut at_device: VecDeque<(Nanos, Vec<u8>)> = VecDeque::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut taken: Vec<Vec<u8>> = Vec::new();
        let mut buf = vec![0u8; 65536];
        let reach = self.reach.clone();
        let mine = &reach[self.me];
        while !stop.load(Ordering::Relaxed) {
            let now = self.now();
            let next = [at_switch.front(), at_device.front()]
                .into_iter()
                .flatten()
                .map(|(at, _)| *at)
                .min();
            let wait = next.map_or(MAX_WAIT, |at| at.saturating_sub(now).min(MAX_WAIT));
            if wait > 0 {
                let timeout = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: wait as _,
                };
                let mut fds = [
                    rustix::event::PollFd::new(&*mine.device, rustix::event::PollFlags::IN),
                    rustix::event::PollFd::new(&mine.bell, rustix::event::PollFlags::IN),
                ];
                let _ = rustix::event::poll(&mut fds, Some(&timeout));
            }
            for _ in 0..BATCH {
                let n = match mine.device.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // WouldBlock, or a device that went away as the lab stops.
                    Err(_) => break,
                };
                let arrival = self.now();
                let fate = self.up.arrive(arrival, n, &mut self.rng);
                self.record(true, arrival, n, &fate);
                if let Fate::Deliver { at, corrupt, .. } = fate {
                    let mut packet = spare.pop().unwrap_or_default();
                    packet.clear();
                    packet.extend_from_slice(&buf[..n]);
                    if let Some(choice) = corrupt
                        && corrupt_payload(&mut packet, choice)
                    {
                        self.up.counters.corrupted += 1;
                    }
                    at_switch.push_back((at, packet));
                }
            }
            // Packets that reached the switch go on to their host.
            let now = self.now();
            while at_switch.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, packet)) = at_switch.pop_front()
                    && let Some(p) = self.switch(packet)
                {
                    spare.push(p);
                }
            }
            // Packets the switch handed to this host's downlink.
            if let Some(down) = &mut self.down {
                let mut bell = [0u8; 8];
                let _ = rustix::io::read(&mine.bell, &mut bell);
                std::mem::swap(
                    &mut taken,
                    &mut mine.inbox.lock().unwrap_or_else(|p| p.into_inner()),
                );
                for mut packet in taken.drain(..) {
                    let arrival = self.epoch.elapsed().as_nanos() as Nanos;
                    let fate = down.arrive(arrival, packet.len(), &mut self.rng);
                    record(&self.log, &self.labels.1, arrival, packet.len(), &fate);
                    match fate {
                        Fate::Deliver { at, corrupt, .. } => {
                            if let Some(choice) = corrupt
                                && corrupt_payload(&mut packet, choice)
                            {
                                down.counters.corrupted += 1;
                            }
                            at_device.push_back((at, packet));
                        }
                        _ => spare.push(packet),
                    }
                }
                let now = self.now();
                while at_device.front().is_some_and(|(at, _)| *at <= now) {
                    if let Some((_, packet)) = at_device.pop_front() {
                        if mine.device.send(&packet).is_err() {
                            self.report.down.write_errors += 1;
                        }
                        spare.push(packet);
                    }
                }
            }
        }
    }

    /// A packet at the switch: to the device of the host it is for, or into that host's
    /// downlink. Gives the buffer back when it is done with it.
    fn switch(&mut self, packet: Vec<u8>) -> Option<Vec<u8>> {
        let to = destination(&packet).and_then(|a| {
            self.reach
                .iter()
                .position(|r| r.address == a)
                .filter(|&i| i != self.me)
        });
        let Some(to) = to else {
            self.report.up.unroutable += 1;
            return Some(packet);
        };
        let there = &self.reach[to];
        if let Some(a) = &there.accepts
            && !a.passes(&packet)
        {
            self.report.up.firewall_drops += 1;
            return Some(packet);
        }
        if there.open_down {
            if there.device.send(&packet).is_err() {
                self.report.up.write_errors += 1;
            }
            return Some(packet);
        }
        {
            let mut inbox = there.inbox.lock().unwrap_or_else(|p| p.into_inner());
            if inbox.len() >= INBOX {
                self.report.up.write_errors += 1;
                return Some(packet);
            }
            inbox.push(packet);
        }
        let _ = rustix::io::write(&there.bell, &1u64.to_ne_bytes());
        None
    }

    fn record(&self, up: bool, arrival: Nanos, len: usize, fate: &Fate) {
        let label = if up { &self.labels.0 } else { &self.labels.1 };
        record(&self.log, label, arrival, len, fate);
    }
}

/// An IPv4 packet's destination address.
fn destination(packet: &[u8]) -> Option<Ipv4Addr> {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    Some(Ipv4Addr::new(
        packet[16], packet[17], packet[18], packet[19],
    ))
}

fn record(log: &Option<PacketLog>, label: &str, arrival: Nanos, len: usize, fate: &Fate) {
    let Some(log) = log else { return };
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
            "{label},{},{len},{what},{},{}",
            arrival / 1000,
            us(sent),
            us(at)
        );
    }
}
