//! The two hooks that steer a running transfer, and the loop that applies them.
//!
//! - A [`Policy`] decides how many data connections to use, which to close, and the socket
//!   buffer size: it returns [`Decision`]s.
//! - A [`Pacer`] caps the sending rate of the transfer as a whole.
//!
//! Both are pure: they get a [`View`] (per-connection bytes, rates and `TCP_INFO`, sampled by
//! [`Sampler`]) and return what to do, so they are tested in memory with made-up views.
//! [`Steering`] calls them every tick (100 ms, 50 in background mode) on the client and carries their decisions out
//! on the [`Transfer`]. Today's policies: [`Fixed`] (the connections opened at the start, as
//! GridFTP does) and [`Schedule`] (connection counts at given points, for experiments and
//! tests); the pacers: [`Cap`] (`--rate-limit`) and background mode's
//! [`Yielding`](super::background::Yielding) (`--background`).

use super::stats::{Count, LinkRecord, Sample, Sampler, View};
use super::transfer::{Transfer, Waker};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

/// What a policy may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Open this many more data connections.
    Open(usize),
    /// Close this connection (by id) after the block it carries.
    Close(usize),
    /// Send with this congestion control from now on (every connection, open and to come).
    Congestion(braid_proto::retr_opts::CcName),
}

/// Chooses the connections of a running transfer.
pub trait Policy: Send {
    fn decide(&mut self, view: &View) -> Vec<Decision>;

    /// What it decided since it was last asked, and why (for `-v` and `--json`).
    fn notes(&mut self) -> Vec<Note> {
        Vec::new()
    }
}

/// One decision of a policy, explained: shown with `-v`, kept in `--json` as `decisions`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Note {
    /// Seconds since the transfer started.
    pub t: f64,
    /// Connections measured (or asked for, when nothing was measured).
    pub streams: usize,
    /// bytes/s over the interval measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<f64>,
    /// Share of bytes sent again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// RTT above the path's base RTT, in base RTTs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<f64>,
    pub action: String,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1}s {} connections", self.t, self.streams)?;
        if let Some(g) = self.goodput {
            write!(f, ", {:.2} MB/s", g / 1e6)?;
        }
        if let Some(l) = self.loss {
            write!(f, ", {:.2}% resent", l * 100.0)?;
        }
        if let Some(q) = self.queue {
            write!(f, ", queue {q:.2} RTT")?;
        }
        write!(f, ": {}", self.action)
    }
}

/// Chooses the sending rate of a running transfer: bytes/s for all connections together, or
/// None for no cap.
pub trait Pacer: Send {
    fn rate(&mut self, view: &View) -> Option<u64>;

    /// What background mode's controller saw and did, for the summary.
    fn report(&self) -> Option<super::yield_report::Report> {
        None
    }
}

/// Keeps the connections the transfer started with (today's behaviour, and GridFTP's).
#[derive(Debug, Default)]
pub struct Fixed;

impl Policy for Fixed {
    fn decide(&mut self, _: &View) -> Vec<Decision> {
        Vec::new()
    }
}

/// A fixed cap, or none (`--rate-limit`).
#[derive(Debug, Default)]
pub struct Cap(pub Option<u64>);

impl Pacer for Cap {
    fn rate(&mut self, _: &View) -> Option<u64> {
        self.0
    }
}

/// When a [`Schedule`] step applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// Once this fraction of the bytes has moved.
    Fraction(f64),
    /// Once this long has passed.
    After(Duration),
}

/// Connection counts over the course of a transfer: `--schedule 1,8@20%,2@60%` starts with
/// one connection, goes to eight once 20 % of the bytes have moved and to two at 60 %
/// (`8@2s` means two seconds in). For experiments, benchmarks and tests of the machinery the
/// self-tuning policy will use.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub start: usize,
    pub steps: Vec<(Trigger, usize)>,
}

/// Most connections a schedule may ask for (the server's own cap may be lower).
pub const MAX_SCHEDULED: usize = 64;

impl Schedule {
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let count = |s: &str| match s.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_SCHEDULED).contains(&n) => Ok(n),
            _ => Err(format!(
                "{s:?} is not a connection count from 1 to {MAX_SCHEDULED}"
            )),
        };
        let mut parts = spec.split(',');
        let start = count(parts.next().unwrap_or(""))?;
        let mut steps = Vec::new();
        for part in parts {
            let Some((n, at)) = part.split_once('@') else {
                return Err(format!(
                    "{part:?}: a step is COUNT@PERCENT% or COUNT@SECONDSs, e.g. 8@20% or 8@2s"
                ));
            };
            let at = at.trim();
            let trigger = if let Some(p) = at.strip_suffix('%') {
                match p.parse::<f64>() {
                    Ok(p) if (0.0..=100.0).contains(&p) => Trigger::Fraction(p / 100.0),
                    _ => return Err(format!("{at:?} is not a percentage from 0 to 100")),
                }
            } else if let Some(s) = at.strip_suffix('s') {
                match s.parse::<f64>() {
                    Ok(s) if s.is_finite() && s >= 0.0 => {
                        Trigger::After(Duration::from_secs_f64(s))
                    }
                    _ => return Err(format!("{at:?} is not a number of seconds")),
                }
            } else {
                return Err(format!("{at:?}: say % (of the bytes) or s (seconds)"));
            };
            steps.push((trigger, count(n)?));
        }
        Ok(Schedule { start, steps })
    }

    /// The count the schedule asks for now: that of the last step reached.
    pub fn target(&self, view: &View) -> usize {
        let mut target = self.start;
        for (trigger, n) in &self.steps {
            let reached = match trigger {
                Trigger::Fraction(f) => view
                    .total
                    .is_some_and(|t| t > 0 && view.done as f64 >= f * t as f64),
                Trigger::After(d) => view.elapsed >= *d,
            };
            if reached {
                target = *n;
            }
        }
        target
    }
}

impl Policy for Schedule {
    fn decide(&mut self, view: &View) -> Vec<Decision> {
        toward(self.target(view), view)
    }
}

/// The decisions that bring the active connections (and those on their way) to `target`:
/// open the difference, or close the newest once none is still opening (the oldest have the
/// widest congestion windows).
pub fn toward(target: usize, view: &View) -> Vec<Decision> {
    let active: Vec<usize> = view.active().map(|l| l.id).collect();
    let have = active.len() + view.opening;
    if target > have {
        vec![Decision::Open(target - have)]
    } else if target < active.len() && view.opening == 0 {
        active
            .iter()
            .rev()
            .take(active.len() - target)
            .map(|&id| Decision::Close(id))
            .collect()
    } else {
        Vec::new()
    }
}

/// What a receiving side's tick changed that the sending peer must be told.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tell {
    /// The pacer's new rate (bytes/s; None inside: no cap).
    pub rate: Option<Option<u64>>,
    /// The policy's choice of congestion control.
    pub congestion: Option<braid_proto::retr_opts::CcName>,
}

/// Runs the policy and the pacer on a transfer: [`Steering::tick`] every 100 ms from the
/// supervising thread.
pub struct Steering {
    policy: Box<dyn Policy>,
    pacer: Box<dyn Pacer>,
    sampler: Sampler,
    /// Starts opening one data connection, which joins the transfer when connected; None
    /// where this side cannot open connections (the peer connects to it).
    opener: Option<Box<dyn FnMut() + Send>>,
    /// Connections this side opened before the transfer started, and asked for since.
    initial: usize,
    asked: usize,
    /// Of those asked for, how many could not be opened (counted by the opener).
    failed: Arc<AtomicUsize>,
    /// This side sends: retiring stops taking blocks (else: half-close, the peer stops).
    sending: bool,
    total: Option<u64>,
    rate: Option<u64>,
    /// The policy's decisions, for the summary.
    notes: Vec<Note>,
    /// The sending peer's latest report (downloads from a braid server).
    sender: Option<braid_proto::markers::SenderReport>,
    /// Probe round trips since the last tick.
    probes: Vec<Duration>,
    /// How long the probe in flight has been out.
    probe_out: Option<Duration>,
}

impl Steering {
    pub fn new(
        policy: Box<dyn Policy>,
        pacer: Box<dyn Pacer>,
        sending: bool,
        total: Option<u64>,
    ) -> Steering {
        Steering {
            policy,
            pacer,
            sampler: Sampler::new(Duration::from_secs(1)),
            opener: None,
            initial: 0,
            asked: 0,
            failed: Default::default(),
            sending,
            total,
            rate: None,
            notes: Vec::new(),
            sender: None,
            probes: Vec::new(),
            probe_out: None,
        }
    }

    /// A control-connection probe came back after `rtt`, for the next tick's view.
    pub fn probed(&mut self, rtt: Duration) {
        self.probes.push(rtt);
    }

    /// The probe in flight has been out this long, for the next tick's view.
    pub fn probe_out(&mut self, out: Option<Duration>) {
        self.probe_out = out;
    }

    /// Lets the policy open connections: `open` starts connecting one on another thread,
    /// which joins the transfer when connected, and counts it in the counter it is given if
    /// it cannot be opened. `initial`: connections this side opened before the start.
    pub fn set_opener(
        &mut self,
        initial: usize,
        mut open: impl FnMut(Arc<AtomicUsize>) + Send + 'static,
    ) {
        let failed = self.failed.clone();
        self.initial = initial;
        self.opener = Some(Box::new(move || open(failed.clone())));
    }

    /// Lets the policy open connections with `connect` (blocking; run on a thread of its
    /// own for each), which join the transfer through the receiver returned (`Joins::incoming`),
    /// waking its join loop. `initial`: connections this side opened before the start.
    pub fn open_with<E: std::fmt::Display>(
        &mut self,
        initial: usize,
        connect: impl Fn() -> Result<TcpStream, E> + Clone + Send + 'static,
        buffer: Option<u64>,
        waker: Option<Waker>,
    ) -> Receiver<TcpStream> {
        let (tx, rx) = channel();
        self.set_opener(initial, move |failed: Arc<AtomicUsize>| {
            let (tx, waker, connect) = (tx.clone(), waker.clone(), connect.clone());
            std::thread::spawn(move || {
                match connect() {
                    Ok(s) => {
                        super::set_buffer(&s, buffer);
                        if tx.send(s).is_err() {
                            // The transfer ended meanwhile.
                            failed.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    Err(e) => {
                        tracing::warn!("could not open another data connection: {e}");
                        failed.fetch_add(1, Ordering::AcqRel);
                    }
                }
                if let Some(w) = waker {
                    w.wake();
                }
            });
        });
        rx
    }

    /// The sending peer's latest report, for the next ticks' views.
    pub fn sender_reported(&mut self, report: braid_proto::markers::SenderReport) {
        self.sender = Some(report);
    }

    /// Applies the pacer's rate before any data moves (a first tick only comes 100 ms in).
    /// On the receiving side nothing is applied here: the rate is the one the sender is told
    /// at the start (a download's `OPTS RETR MaxRate=`), returned for that.
    pub fn prime(&mut self, transfer: &Transfer) -> Option<u64> {
        let view = View::at_start(self.total);
        self.rate = self.pacer.rate(&view);
        if self.sending {
            transfer.set_pacing(self.rate);
        }
        self.rate
    }

    /// Samples the transfer and applies the policy and the pacer. The sending side paces its
    /// own sockets; on the receiving side a new rate is returned, for the sender to be told.
    pub fn tick(&mut self, transfer: &Transfer) -> Tell {
        // Asked for but neither joined nor failed: counted from what joined, so that a
        // connection is never both "opening" and open (or neither) at a tick.
        let failed = self.failed.load(Ordering::Acquire);
        let opening = (self.initial + self.asked).saturating_sub(failed + transfer.links().len());
        let mut view = self.sampler.sample(transfer, self.total, opening);
        view.failed = failed;
        view.sender = self.sender;
        view.congestion = self.congestion(transfer);
        view.probes = std::mem::take(&mut self.probes);
        view.probe_out = self.probe_out.take();
        view.pacing = self.rate;
        let rate = self.pacer.rate(&view);
        let mut told = Tell::default();
        if rate != self.rate {
            if self.sending {
                transfer.set_pacing(rate);
            } else {
                told.rate = Some(rate);
            }
            self.rate = rate;
        }
        // Once the sender has run out of blocks, connections only finish: nothing to decide.
        if !transfer.elastic() || view.ending() {
            return told;
        }
        let decisions = self.policy.decide(&view);
        for note in self.policy.notes() {
            tracing::info!("{note}");
            self.notes.push(note);
        }
        for d in decisions {
            match d {
                Decision::Open(n) => {
                    if let Some(open) = &mut self.opener {
                        for _ in 0..n {
                            self.asked += 1;
                            open();
                        }
                    }
                }
                Decision::Close(id) => transfer.retire(id, self.sending),
                Decision::Congestion(cc) if self.sending => transfer.set_congestion(Some(cc)),
                Decision::Congestion(cc) => told.congestion = Some(cc),
            }
        }
        told
    }

    /// The timeline, connection counts, connection lives, the policy's decisions and the
    /// sender's congestion control, for the summary.
    pub fn finish(self, transfer: &Transfer) -> Record {
        let congestion = self.congestion(transfer);
        let (timeline, counts, links) = self.sampler.finish(transfer);
        Record {
            timeline,
            counts,
            links,
            decisions: self.notes,
            congestion,
            sender: self.sender,
            background: self.pacer.report(),
        }
    }

    /// The sending side's congestion control: this side's sockets', or the sending peer's
    /// last report.
    fn congestion(&self, transfer: &Transfer) -> Option<braid_proto::retr_opts::CcName> {
        if self.sending {
            transfer.congestion()
        } else {
            self.sender.and_then(|r| r.cc)
        }
    }
}

/// What a finished transfer's steering saw and did.
pub struct Record {
    pub timeline: Vec<Sample>,
    pub counts: Vec<Count>,
    pub links: Vec<LinkRecord>,
    pub decisions: Vec<Note>,
    /// The sending side's congestion control: this side's sockets', or the sending peer's
    /// last report.
    pub congestion: Option<braid_proto::retr_opts::CcName>,
    /// The sending peer's last report (downloads from a braid server).
    pub sender: Option<braid_proto::markers::SenderReport>,
    /// Background mode's controller, when it paced the transfer.
    pub background: Option<super::yield_report::Report>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::stats::LinkView;
    use crate::engine::transfer::LinkState;

    fn view(done: u64, open: &[usize], retiring: &[usize], opening: usize) -> View {
        View {
            elapsed: Duration::from_millis(done),
            total: Some(100),
            done,
            links: (0..10)
                .map(|id| LinkView {
                    id,
                    state: if open.contains(&id) {
                        LinkState::Open
                    } else {
                        LinkState::Finished
                    },
                    retiring: retiring.contains(&id),
                    bytes: 0,
                    rate: 0.0,
                    tcp: None,
                })
                .collect(),
            opening,
            failed: 0,
            sender: None,
            congestion: None,
            probes: Vec::new(),
            probe_out: None,
            pacing: None,
        }
    }

    #[test]
    fn a_schedule_opens_up_to_its_target_and_closes_the_newest() {
        let mut s = Schedule::parse("1,8@20%,2@60%").unwrap();
        assert_eq!(s.decide(&view(5, &[0], &[], 0)), vec![]);
        assert_eq!(s.decide(&view(20, &[0], &[], 0)), vec![Decision::Open(7)]);
        // Connections on their way count: no second round of opens.
        assert_eq!(s.decide(&view(30, &[0, 1], &[], 6)), vec![]);
        let eight = [0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(s.decide(&view(50, &eight, &[], 0)), vec![]);
        assert_eq!(
            s.decide(&view(60, &eight, &[], 0)),
            (2..8).rev().map(Decision::Close).collect::<Vec<_>>()
        );
        // Those being retired are not asked again, and none is closed twice.
        assert_eq!(s.decide(&view(70, &eight, &[2, 3, 4, 5, 6, 7], 0)), vec![]);
        assert_eq!(s.decide(&view(80, &[0, 1], &[], 0)), vec![]);
    }

    #[test]
    fn the_end_of_a_transfer_is_no_time_to_open_connections() {
        // Links 0 and 2..9 finished without being retired: the sender has nothing left.
        assert!(view(90, &[1], &[], 0).ending());
        // Finished links that were all retired say nothing about the sender.
        let retired: Vec<usize> = (0..10).filter(|&i| i != 1).collect();
        assert!(!view(90, &[1], &retired, 0).ending());
        // Every byte moved.
        assert!(view(100, &(0..10).collect::<Vec<_>>(), &[], 0).ending());
        let mut s = Schedule::parse("1,4@10%").unwrap();
        assert_eq!(
            s.decide(&view(50, &[1], &retired, 0)),
            vec![Decision::Open(3)]
        );
    }

    #[test]
    fn a_schedule_by_time_and_bad_specs() {
        let s = Schedule::parse("2, 4@1.5s").unwrap();
        assert_eq!(s.target(&view(1499, &[0], &[], 0)), 2);
        assert_eq!(s.target(&view(1500, &[0], &[], 0)), 4);
        for bad in [
            "", "0", "65", "1,8", "1,8@", "1,8@120%", "1,8@x%", "1,8@2m", "1,0@1s",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// A pacer that goes through a list of rates, one per call.
    struct Steps(Vec<Option<u64>>);
    impl Pacer for Steps {
        fn rate(&mut self, _: &View) -> Option<u64> {
            if self.0.len() > 1 {
                self.0.remove(0)
            } else {
                self.0[0]
            }
        }
    }

    #[test]
    fn a_receiving_side_hands_a_changed_rate_on_for_the_sender() {
        let transfer = Transfer::new(true);
        let pacer = Steps(vec![Some(100), Some(100), Some(50), None, None]);
        let mut s = Steering::new(Box::new(Fixed), Box::new(pacer), false, Some(1000));
        assert_eq!(
            s.prime(&transfer),
            Some(100),
            "told with the first OPTS RETR"
        );
        let rate = |r| Tell {
            rate: Some(r),
            congestion: None,
        };
        assert_eq!(s.tick(&transfer), Tell::default(), "unchanged");
        assert_eq!(s.tick(&transfer), rate(Some(50)));
        assert_eq!(s.tick(&transfer), rate(None), "the cap lifted");
        assert_eq!(s.tick(&transfer), Tell::default());
        // The sending side paces its own sockets and has no one to tell.
        let pacer = Steps(vec![Some(100), Some(50)]);
        let mut s = Steering::new(Box::new(Fixed), Box::new(pacer), true, Some(1000));
        s.prime(&transfer);
        assert_eq!(transfer.pacing(), Some(100));
        assert_eq!(s.tick(&transfer), Tell::default());
        assert_eq!(transfer.pacing(), Some(50));
    }
}
