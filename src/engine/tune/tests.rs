//! The self-tuning against made-up paths: views in, decisions out.

use super::*;
use crate::engine::stats::LinkView;
use braid_sockopt::TcpInfo;

/// A path in numbers: each connection's window allows `window` bytes in flight; the
/// bottleneck carries `capacity` bytes/s behind a drop-tail queue of `queue` bytes.
/// Zero ramp, start-up and swing, unknown congestion controls unless a test says.
#[derive(Clone, Copy, Default)]
struct Path {
    capacity: f64,
    window: f64,
    base: Duration,
    queue: f64,
    /// Goodput grows linearly to its full level over this long (windows opening), with
    /// any count.
    ramp: Duration,
    /// For this long from the start, the connections are in start-up: half the goodput,
    /// no queue and no loss yet (what the first interval of several BBR connections shows).
    startup: Duration,
    /// How the congestion controls differ here; None: the sender's is unknown.
    ccs: Option<Ccs>,
    /// Every other tick the RTT reads this much higher, and the others this much lower
    /// (BBR draining the queue now and then, a report taken at a bad moment).
    swing: Duration,
    /// BDPs BBR keeps in flight where the windows allow (0: 1.1).
    bbr_flight: f64,
    /// Where the windows keep BBR below that, the share of the time they hold the
    /// connections back (what the sender reports as limited by its buffer).
    held: f64,
}

/// The path starts with BBR; CUBIC gets all the goodput BBR gets `bbr_short` of, BBR
/// sends `bbr_loss` of its bytes again, and CUBIC stands `cubic_queue` bytes in the queue.
#[derive(Clone, Copy, Default)]
struct Ccs {
    bbr_short: f64,
    bbr_loss: f64,
    cubic_queue: f64,
}

impl Path {
    fn bbr_in_flight(&self) -> f64 {
        if self.bbr_flight > 0.0 {
            self.bbr_flight
        } else {
            1.1
        }
    }

    /// The share of the time `n` connections' windows hold them back.
    fn held(&self, n: usize) -> f64 {
        let bbr_wants = self.capacity * self.base.as_secs_f64() * self.bbr_in_flight();
        if self.ccs.is_some() && (n as f64) * self.window < bbr_wants {
            self.held
        } else {
            0.0
        }
    }

    /// Goodput (bytes/s), RTT and the share of bytes lost with `n` connections.
    fn with(&self, n: usize) -> (f64, Duration, f64) {
        self.with_cc(n, false)
    }

    /// As [`Path::with`], with CUBIC or BBR.
    fn with_cc(&self, n: usize, cubic: bool) -> (f64, Duration, f64) {
        let base = self.base.as_secs_f64();
        let bdp = self.capacity * base;
        let mut flight = n as f64 * self.window;
        let mut share = 1.0;
        if let Some(c) = self.ccs.filter(|_| !cubic) {
            // BBR keeps about a BDP in flight, whatever the windows allow.
            flight = flight.min(bdp * self.bbr_in_flight());
            share = 1.0 - c.bbr_short;
        }
        let mut standing = (flight - bdp).clamp(0.0, self.queue);
        if let Some(c) = self.ccs.filter(|_| cubic) {
            standing = standing.max(c.cubic_queue.min(self.queue));
        }
        let rtt = base + standing / self.capacity;
        let over = (flight - bdp - self.queue).max(0.0);
        let mut loss = (over / flight * 0.2).min(0.2);
        if let Some(c) = self.ccs.filter(|_| !cubic) {
            loss = loss.max(c.bbr_loss);
        }
        let goodput = (flight / rtt).min(self.capacity) * (1.0 - loss) * share;
        (goodput, Duration::from_secs_f64(rtt), loss)
    }
}

/// One connection of the simulated transfer.
struct Conn {
    id: usize,
    bytes: f64,
    sent: f64,
    retrans: f64,
    /// Microseconds with data to send, and of them held back by windows.
    busy_us: u64,
    held_us: u64,
    closed: bool,
}

/// Runs `auto` against `path` in 100 ms ticks for `secs` (or until `total` bytes moved);
/// returns the connection count after each tick. Opened connections join a tick later;
/// `limit` is the server's cap (further ones are refused: they end without a byte).
fn simulate(auto: &mut Auto, path: Path, total: u64, secs: f64, limit: usize) -> Vec<usize> {
    run_sim(auto, path, total, secs, limit, false).0
}

/// As [`simulate`], and returns the congestion control at the end too; `receiving`: this
/// side receives (a download), so its own TCP_INFO shows neither loss nor the sender's
/// RTT, and the sender reports them (`113 Sender`).
fn run_sim(
    auto: &mut Auto,
    path: Path,
    total: u64,
    secs: f64,
    limit: usize,
    receiving: bool,
) -> (Vec<usize>, Option<CcName>) {
    let tick = Duration::from_millis(100);
    // The control the transfer was set up with, else the host's (BBR).
    let set_up = auto.cfg.start_congestion.map(|(cc, _)| cc);
    let mut cc = path.ccs.and_then(|_| set_up.or(name("bbr")));
    let mut conns: Vec<Conn> = Vec::new();
    let mut retiring: Vec<usize> = Vec::new();
    let mut refused: Vec<usize> = Vec::new();
    let mut opening = auto.first_count(Some(total));
    let mut elapsed = Duration::ZERO;
    let mut counts = Vec::new();
    let mut done = 0.0;
    while elapsed.as_secs_f64() < secs && (done as u64) < total {
        // Those asked for join (or are turned away).
        for _ in 0..opening {
            let id = conns.len();
            let open = conns.iter().filter(|c| !c.closed).count();
            conns.push(Conn {
                id,
                bytes: 0.0,
                sent: 0.0,
                retrans: 0.0,
                busy_us: 0,
                held_us: 0,
                closed: open >= limit,
            });
            if open >= limit {
                refused.push(id);
            }
        }
        opening = 0;
        for id in retiring.drain(..) {
            conns[id].closed = true;
        }
        let open: Vec<usize> = conns.iter().filter(|c| !c.closed).map(|c| c.id).collect();
        let (mut goodput, mut rtt, mut loss) = path.with_cc(open.len(), cc == name("cubic"));
        if elapsed < path.startup {
            (goodput, rtt, loss) = (goodput / 2.0, path.base, 0.0);
        }
        let ramped = if path.ramp.is_zero() {
            1.0
        } else {
            (elapsed.as_secs_f64() / path.ramp.as_secs_f64()).min(1.0)
        };
        let each = goodput * ramped * tick.as_secs_f64() / open.len().max(1) as f64;
        for &id in &open {
            let c = &mut conns[id];
            c.bytes += each;
            c.sent += each / (1.0 - loss);
            c.retrans += each / (1.0 - loss) * loss;
            c.busy_us += tick.as_micros() as u64;
            c.held_us += (tick.as_secs_f64() * 1e6 * path.held(open.len())) as u64;
        }
        done += each * open.len() as f64;
        elapsed += tick;
        let rtt = if counts.len() % 2 == 0 {
            rtt + path.swing
        } else {
            rtt.saturating_sub(path.swing)
        };
        let rtt_us = rtt.as_micros() as u32;
        let view = View {
            elapsed,
            total: Some(total),
            done: done as u64,
            links: conns
                .iter()
                .map(|c| LinkView {
                    id: c.id,
                    state: if c.closed {
                        if c.bytes > 0.0 {
                            LinkState::Finished
                        } else {
                            LinkState::Unused
                        }
                    } else {
                        LinkState::Open
                    },
                    retiring: c.closed && !refused.contains(&c.id),
                    bytes: c.bytes as u64,
                    rate: 0.0,
                    tcp: (!c.closed).then(|| match receiving {
                        // A receiver's RTT estimate is coarse: a quarter off here.
                        true => TcpInfo {
                            rcv_rtt_us: rtt_us * 5 / 4,
                            min_rtt_us: path.base.as_micros() as u32,
                            bytes_received: c.bytes as u64,
                            ..TcpInfo::default()
                        },
                        false => TcpInfo {
                            rtt_us,
                            rcv_rtt_us: rtt_us,
                            min_rtt_us: path.base.as_micros() as u32,
                            bytes_sent: c.sent as u64,
                            bytes_acked: c.bytes as u64,
                            bytes_retrans: c.retrans as u64,
                            busy_us: c.busy_us,
                            sndbuf_limited_us: c.held_us,
                            ..TcpInfo::default()
                        },
                    }),
                })
                .collect(),
            opening: 0,
            failed: 0,
            sender: receiving.then(|| braid_proto::markers::SenderReport {
                sent: conns.iter().map(|c| c.sent as u64).sum(),
                resent: conns.iter().map(|c| c.retrans as u64).sum(),
                rtt_us,
                min_rtt_us: path.base.as_micros() as u32,
                cc: None,
                busy_ms: conns.iter().map(|c| c.busy_us / 1000).sum(),
                sndbuf_limited_ms: conns.iter().map(|c| c.held_us / 1000).sum(),
                ..Default::default()
            }),
            congestion: cc,
            probes: Vec::new(),
            probe_out: None,
            pacing: None,
        };
        for d in auto.decide(&view) {
            match d {
                Decision::Open(n) => opening += n,
                Decision::Close(id) => retiring.push(id),
                Decision::Congestion(to) => cc = Some(to),
            }
        }
        counts.push(conns.iter().filter(|c| !c.closed).count());
    }
    (counts, cc)
}

const T1: f64 = 1_536_000.0 / 8.0;
const BIG: u64 = 1 << 40;

/// XFTP's satellite T1: 590 ms, each connection's 24 KB window moves 1/5 of the link.
fn satellite() -> Path {
    Path {
        capacity: T1,
        window: 24_000.0,
        base: Duration::from_millis(590),
        queue: 64_000.0,
        ..Path::default()
    }
}

fn auto() -> Auto {
    Auto::new(Tuning::new(1 << 20))
}

/// The count it spent most of the second half of its time at.
fn settles(counts: &[usize]) -> usize {
    let late = &counts[counts.len() / 2..];
    let most = late.iter().max().copied().unwrap_or(0);
    (0..=most)
        .max_by_key(|n| late.iter().filter(|&&c| c == *n).count())
        .unwrap_or(0)
}

#[test]
fn window_limited_connections_are_added_until_the_link_is_full() {
    let path = satellite();
    let counts = simulate(&mut auto(), path, BIG, 120.0, 64);
    let n = settles(&counts);
    // One connection moves 40 KB/s of 192: five fill the link.
    assert!(
        path.with(n).0 > 0.95 * T1,
        "settled at {n}: {:?}",
        path.with(n)
    );
    assert!(
        n <= 8,
        "settled at {n}, more than the link needs: {counts:?}"
    );
    // Full once 4 are measured (a warm-up, then intervals until the rate stops rising)
    // and 8 asked for: about 12 RTTs.
    let full = counts
        .iter()
        .position(|&c| path.with(c).0 > 0.95 * T1)
        .unwrap();
    assert!(full <= 70, "full only after {} ticks: {counts:?}", full);
    // And it stays full, but for short probes below five that are not kept.
    let below = counts[full..].iter().filter(|&&c| c < 5).count();
    assert!(below * 10 < counts.len() - full, "{counts:?}");
}

#[test]
fn a_link_one_connection_fills_ends_with_few() {
    // Plenty of window: one connection fills it; more only queue.
    let path = Path {
        capacity: 100e6 / 8.0,
        window: 4e6,
        base: Duration::from_millis(20),
        queue: 250_000.0,
        ..Path::default()
    };
    let counts = simulate(&mut auto(), path, BIG, 60.0, 64);
    let n = settles(&counts);
    assert!(n <= 2, "settled at {n}: {counts:?}");
    assert!(counts.iter().all(|&c| c <= 8), "{counts:?}");
}

#[test]
fn a_rate_still_rising_by_itself_is_not_credited_to_more_connections() {
    // One connection fills the link, but windows take 3 s (10 RTTs) to open: goodput
    // rises over the first intervals whatever the count.
    let path = Path {
        capacity: 10e6 / 8.0,
        window: 4e6,
        base: Duration::from_millis(300),
        queue: 400_000.0,
        ramp: Duration::from_secs(3),
        ..Path::default()
    };
    let counts = simulate(&mut auto(), path, BIG, 120.0, 64);
    assert!(counts.iter().all(|&c| c <= 8), "{counts:?}");
    assert!(settles(&counts) <= 2, "{counts:?}");
}

#[test]
fn loss_and_queueing_stop_the_climb() {
    // Small windows but a small queue: past the link's BDP, extra connections only lose.
    let path = Path {
        capacity: 10e6 / 8.0,
        window: 64_000.0,
        base: Duration::from_millis(100),
        queue: 30_000.0,
        ..Path::default()
    };
    let counts = simulate(&mut auto(), path, BIG, 120.0, 64);
    let n = settles(&counts);
    let (_, _, loss) = path.with(n);
    assert!(loss < 0.01, "settled at {n} with {loss} loss: {counts:?}");
    assert!(
        path.with(n).0 > 0.9 * path.capacity,
        "settled at {n}: {counts:?}"
    );
}

#[test]
fn a_full_link_gets_no_more_connections() {
    // lfn-200m's shape: 4 connections already fill the link and stand a third of an RTT
    // of queue, with nothing lost yet; 6 would overflow it.
    let path = Path {
        capacity: 25e6,
        window: 1.25e6,
        base: Duration::from_millis(150),
        queue: 3.75e6,
        ..Path::default()
    };
    assert!(path.with(6).1 > path.with(4).1, "the model: 6 queue more");
    let counts = simulate(&mut auto(), path, BIG, 120.0, 64);
    assert!(counts.iter().all(|&c| c <= 4), "{counts:?}");
    let n = settles(&counts);
    assert!(
        path.with(n).0 > 0.99 * path.capacity,
        "settled at {n}: {counts:?}"
    );
}

#[test]
fn a_queue_built_after_the_first_interval_still_counts() {
    // The first interval, in start-up, shows no queue and no loss; once settled, 4
    // connections overflow the queue and lose 5 % of their bytes, so that first interval
    // scores best. Fullness is still judged by the queue they keep.
    let path = Path {
        capacity: 25e6,
        window: 2.5e6,
        base: Duration::from_millis(150),
        queue: 3.75e6,
        startup: Duration::from_millis(1300),
        ..Path::default()
    };
    assert!(path.with(4).2 > 0.04, "the model: 4 lose");
    let counts = simulate(&mut auto(), path, BIG, 60.0, 64);
    assert!(counts.iter().all(|&c| c <= 4), "{counts:?}");
}

#[test]
fn a_probe_down_that_lost_is_not_repeated() {
    // Two connections fill the link with a third of an RTT of standing queue; one moves
    // two thirds of it.
    let path = Path {
        capacity: 25e6,
        window: 2.5e6,
        base: Duration::from_millis(150),
        queue: 3.75e6,
        ..Path::default()
    };
    let counts = simulate(&mut auto(), path, BIG, 120.0, 64);
    let n = settles(&counts);
    assert_eq!(n, 2, "{counts:?}");
    let settled = counts.iter().position(|&c| c == 2).unwrap_or(0);
    let dips = counts[settled..]
        .windows(2)
        .filter(|w| w[0] == 2 && w[1] == 1)
        .count();
    // Once in the search down from 4, once as a probe; then never again.
    assert!(dips <= 2, "probed down to 1 {dips} times: {counts:?}");
}

/// lfn-500m at 400 Mbit/s with 4 MiB send buffers: four BBR connections stand 0.6 RTTs of
/// queue while their buffers hold them half the time; three carry it all with less queue,
/// two move a fifth less. The count is not halved for that queue, and settles at 3.
#[test]
fn connections_their_windows_hold_back_are_not_cut_for_a_queue() {
    let bdp = 50e6 * 0.15;
    let path = Path {
        capacity: 50e6,
        window: 0.4 * bdp,
        base: Duration::from_millis(150),
        queue: bdp,
        ccs: Some(Ccs::default()),
        bbr_flight: 2.0,
        held: 0.5,
        ..Path::default()
    };
    assert!(
        path.with(4).1 > Duration::from_millis(230),
        "{:?}",
        path.with(4)
    );
    for receiving in [false, true] {
        let mut tuned = auto();
        tuned.cfg.try_congestion = false;
        let (counts, _) = run_sim(&mut tuned, path, BIG, 60.0, 64, receiving);
        assert!(
            counts.iter().all(|&n| n >= 3),
            "receiving {receiving}: went below 3: {counts:?}"
        );
        assert_eq!(settles(&counts), 3, "receiving {receiving}: {counts:?}");
    }
    // Without the windows holding them, the same queue halves the count at once.
    let mut tuned = auto();
    tuned.cfg.try_congestion = false;
    let free = Path { held: 0.0, ..path };
    let counts = simulate(&mut tuned, free, BIG, 10.0, 64);
    assert!(counts.contains(&2), "{counts:?}");
}

#[test]
fn the_congestion_control_that_pays_is_kept() {
    // The satellite, where BBR's drain every 10 s costs window-limited connections 8 %:
    // at 590 ms that is known before measuring, so CUBIC from the start; it loses nothing
    // and stands no queue there, so BBR gets no trial.
    let path = Path {
        ccs: Some(Ccs {
            bbr_short: 0.08,
            ..Ccs::default()
        }),
        ..satellite()
    };
    let (counts, cc, notes) = run_trial(path, true);
    assert_eq!(cc, name("cubic"), "{notes:?}");
    assert!(notes[0].action.contains("starting with cubic") && notes[0].t < 1.0);
    assert!(
        !notes.iter().any(|n| n.action.contains("trying bbr")),
        "{notes:?}"
    );
    assert!(path.with_cc(settles(&counts), true).0 > 0.95 * T1);
    // DSL with a bloated queue (a second of it) on a 20 ms path: BBR loses nothing and
    // its drain costs 2 %, so CUBIC cannot pay: not tried.
    let dsl = Path {
        capacity: 1e6 / 8.0,
        window: 4e6,
        base: Duration::from_millis(20),
        queue: 125_000.0,
        ccs: Some(Ccs {
            cubic_queue: 125_000.0,
            ..Ccs::default()
        }),
        ..Path::default()
    };
    let (_, cc, notes) = run_trial(dsl, false);
    assert_eq!(cc, name("bbr"));
    assert!(
        notes.iter().any(|n| n.action.contains("keeping it"))
            && !notes.iter().any(|n| n.action.contains("cubic")),
        "{notes:?}"
    );
    // The satellite with a bloated queue (1 MB) that CUBIC fills: CUBIC from the start,
    // then BBR tried and kept.
    let bloated = Path {
        queue: 1e6,
        ccs: Some(Ccs {
            bbr_short: 0.08,
            cubic_queue: 1e6,
            ..Ccs::default()
        }),
        ..satellite()
    };
    let (_, cc, notes) = run_trial(bloated, false);
    assert_eq!(cc, name("bbr"), "{notes:?}");
    assert!(
        notes
            .iter()
            .any(|n| n.action.starts_with("bbr:") && n.action.contains("keeping it")),
        "{notes:?}"
    );
    // A 150 ms path where BBR loses 5 % and CUBIC fills a bloated queue: CUBIC is tried
    // and given up after a warm-up and an ordinary interval (4 RTTs of the queued path, at
    // most 4 s), not the trial's long one.
    let short = Path {
        base: Duration::from_millis(150),
        ..bloated
    };
    let short = Path {
        ccs: Some(Ccs {
            bbr_loss: 0.05,
            cubic_queue: 1e6,
            ..Ccs::default()
        }),
        ..short
    };
    let (_, cc, notes) = run_trial(short, false);
    assert_eq!(cc, name("bbr"));
    let trial: Vec<_> = notes
        .iter()
        .filter(|n| n.action.contains("cubic"))
        .collect();
    assert_eq!(trial.len(), 2, "tried once, and went back: {notes:?}");
    assert!(trial[1].action.contains("back to bbr"), "{trial:?}");
    assert!(
        trial[1].action.contains("utility"),
        "the deciding measure: {trial:?}"
    );
    assert!(trial[1].t - trial[0].t < 8.0, "{trial:?}");
    // BBR losing a sixth of what it sends there: its half of the trial is cut short.
    let lossy = Path {
        ccs: Some(Ccs {
            bbr_loss: 0.16,
            ..Ccs::default()
        }),
        ..short
    };
    let (_, cc, notes) = run_trial(lossy, true);
    assert_eq!(cc, name("cubic"));
    let started = notes.iter().find(|n| n.action.contains("trying cubic"));
    assert!(started.is_some_and(|n| n.t < 5.0), "{notes:?}");
    // A congestion control the user chose is never changed.
    let mut pinned = Tuning::new(1 << 20);
    pinned.try_congestion = false;
    let (_, cc) = run_sim(&mut Auto::new(pinned), path, BIG, 120.0, 64, true);
    assert_eq!(cc, name("bbr"));
}

#[test]
fn a_long_path_with_a_short_queue_keeps_cubic_despite_its_losses() {
    // satellite-t1 with default windows: 4 CUBIC connections overflow its short queue now
    // and then (a few % sent again); BBR would lose more there. No trial.
    let path = Path {
        window: 200_000.0,
        ccs: Some(Ccs {
            bbr_short: 0.08,
            bbr_loss: 0.25,
            ..Ccs::default()
        }),
        ..satellite()
    };
    assert!(path.with_cc(4, true).2 > 0.0, "the model: CUBIC loses at 4");
    let mut t = Tuning::new(1 << 20);
    t.start_on(Some(Duration::from_millis(590)));
    let mut a = Auto::new(t);
    let (_, cc) = run_sim(&mut a, path, BIG, 120.0, 64, true);
    let notes = a.notes();
    assert_eq!(cc, name("cubic"), "{notes:?}");
    assert!(
        !notes.iter().any(|n| n.action.contains("trying bbr")),
        "{notes:?}"
    );
}

#[test]
fn a_long_path_is_set_up_with_cubic() {
    let ms = Duration::from_millis;
    let mut t = Tuning::new(1 << 20);
    t.start_on(Some(ms(150)));
    assert_eq!(t.start_congestion, None);
    t.start_on(None);
    assert_eq!(t.start_congestion, None);
    t.start_on(Some(ms(590)));
    assert_eq!(t.start_congestion.map(|(cc, _)| cc), name("cubic"));
    let mut pinned = Tuning::new(1 << 20);
    pinned.try_congestion = false;
    pinned.start_on(Some(ms(590)));
    assert_eq!(pinned.start_congestion, None);
    // Set up so, the controller says why and switches nothing at the start.
    let path = Path {
        ccs: Some(Ccs {
            bbr_short: 0.08,
            ..Ccs::default()
        }),
        ..satellite()
    };
    let mut a = Auto::new(t);
    let (_, cc) = run_sim(&mut a, path, BIG, 60.0, 64, true);
    let notes = a.notes();
    assert_eq!(cc, name("cubic"), "{notes:?}");
    assert!(notes[0].action.contains("started with cubic"), "{notes:?}");
    assert!(
        !notes
            .iter()
            .any(|n| n.action.contains("starting with") || n.action.contains("trying bbr")),
        "{notes:?}"
    );
}

fn name(cc: &str) -> Option<CcName> {
    CcName::parse(cc).ok()
}

/// `auto()` for two minutes on `path`: the counts, the congestion control at the end and
/// the decisions.
fn run_trial(path: Path, receiving: bool) -> (Vec<usize>, Option<CcName>, Vec<Note>) {
    let mut a = auto();
    let (counts, cc) = run_sim(&mut a, path, BIG, 120.0, 64, receiving);
    (counts, cc, a.notes())
}

#[test]
fn a_refused_connection_caps_the_count() {
    let counts = simulate(&mut auto(), satellite(), BIG, 60.0, 3);
    assert!(counts.iter().all(|&c| c <= 3), "{counts:?}");
    assert_eq!(settles(&counts), 3);
}

#[test]
fn never_more_connections_than_blocks() {
    // 6 blocks of 64 KiB: the satellite would like more, the file has no more to give.
    let mut a = Auto::new(Tuning::new(64 << 10));
    assert_eq!(a.first_count(Some(3 << 16)), 3);
    let counts = simulate(&mut a, satellite(), 6 << 16, 60.0, 64);
    assert!(counts.iter().all(|&c| c <= 6), "{counts:?}");
}

#[test]
fn nothing_changes_near_the_end() {
    // The whole file fits in about two intervals at the starting count: no probing.
    let path = satellite();
    let total = (path.with(4).0 * 6.0) as u64;
    let mut a = Auto::new(Tuning::new(64 << 10));
    let counts = simulate(&mut a, path, total, 60.0, 64);
    assert!(counts.iter().all(|&c| c == 4), "{counts:?}");
}

#[test]
fn queueing_is_the_mean_rtt_of_an_interval_not_one_reading() {
    // One connection fills the line and stands 40 ms in its queue, but the RTT reads
    // 20 ms or 100 ms by turns: one reading would say no queue or four base RTTs.
    let dsl = Path {
        capacity: 1e6 / 8.0,
        window: 4e6,
        base: Duration::from_millis(20),
        queue: 5_000.0,
        swing: Duration::from_millis(40),
        ..Path::default()
    };
    let mut a = auto();
    simulate(&mut a, dsl, BIG, 60.0, 64);
    let notes = a.notes();
    let ones: Vec<f64> = notes
        .iter()
        .filter(|n| n.streams == 1)
        .filter_map(|n| n.queue)
        .collect();
    assert!(!ones.is_empty(), "{notes:?}");
    assert!(
        ones.iter().all(|q| (1.5..=2.5).contains(q)),
        "{ones:?}: {notes:?}"
    );
}

#[test]
fn no_probe_is_left_running_at_the_end() {
    // Files of 30 to 120 s on the satellite: wherever the end falls, no step is under way
    // there, unjudged (a probe below the settled count costs a window-limited path a
    // quarter of its rate until the end; a step up may overflow the queue).
    for secs in (30..120).step_by(2) {
        let total = (T1 * secs as f64) as u64;
        let mut a = Auto::new(Tuning::new(64 << 10));
        let end = simulate(&mut a, satellite(), total, 300.0, 64).len() as f64 / 10.0;
        let notes = a.notes();
        // Nor does one start where it could not pay back (four intervals of 3 s and
        // their warm-ups at 6 connections' RTT).
        let late = notes
            .iter()
            .find(|n| n.action.starts_with("probing") && end - n.t < 15.0);
        assert!(late.is_none(), "{secs} s, ends at {end}: {late:?}");
        let last = notes.last().map(|n| n.action.as_str()).unwrap_or_default();
        let unjudged = last.starts_with("probing") || last.contains("trying");
        assert!(!unjudged, "{secs} s: {notes:?}");
    }
}

#[test]
fn a_fixed_count_follows_rtt_and_window() {
    let ms = Duration::from_millis;
    // A LAN: one connection is plenty.
    assert_eq!(fixed_count(Some(ms(1)), Some(3 << 20)).0, 1);
    // A 150 ms path with 3 MiB windows: 21 MB/s each, 6 for 1 Gbit/s.
    assert_eq!(fixed_count(Some(ms(150)), Some(3 << 20)).0, 6);
    // XFTP's satellite with 24 KB windows: as many as allowed.
    assert_eq!(fixed_count(Some(ms(590)), Some(24 << 10)).0, 8);
    assert_eq!(fixed_count(None, Some(1 << 20)).0, 4);
    assert!(
        fixed_count(Some(ms(150)), Some(3 << 20))
            .1
            .contains("150.0 ms")
    );
}

#[test]
fn block_sizes_follow_the_file() {
    assert_eq!(block_for(Some(2_000_000), 4), 64 << 10);
    assert_eq!(block_for(Some(4 << 20), 4), 256 << 10);
    assert_eq!(block_for(Some(1 << 30), 8), 1 << 20);
    assert_eq!(block_for(Some(0), 4), 64 << 10);
    assert_eq!(block_for(None, 4), 1 << 20);
    // Every connection of four gets blocks from a 2 MB file.
    assert!(2_000_000u64.div_ceil(block_for(Some(2_000_000), 4)) >= 4 * 4);
}

#[test]
fn decisions_are_explained() {
    let mut a = auto();
    simulate(&mut a, satellite(), BIG, 30.0, 64);
    let notes = a.notes();
    assert!(!notes.is_empty());
    assert!(
        notes
            .iter()
            .all(|n| !n.action.is_empty() && n.goodput.is_some())
    );
    assert!(notes.windows(2).all(|w| w[0].t <= w[1].t));
}
