//! Live statistics of a transfer's data connections, sampled off the data path: the connection
//! threads only bump a byte counter; the supervisor reads the counters and `TCP_INFO` every
//! tick, hands the policy and pacer a [`View`], and keeps a bounded timeline for `--json`.

use super::transfer::{LinkState, Transfer};
use braid_sockopt::TcpInfo;
use std::time::Duration;

/// One connection as the hooks see it at one tick.
#[derive(Debug, Clone)]
pub struct LinkView {
    pub id: usize,
    pub state: LinkState,
    /// Asked to close after its current block, not yet closed.
    pub retiring: bool,
    /// Payload bytes carried so far.
    pub bytes: u64,
    /// Payload rate since this connection's last timeline row (about a second), bytes/s.
    pub rate: f64,
    /// The kernel's view (None once closed).
    pub tcp: Option<TcpInfo>,
}

/// What the policy and the pacer decide from.
#[derive(Debug, Clone)]
pub struct View {
    /// Since the transfer started.
    pub elapsed: Duration,
    /// Payload bytes this run has to move, when known.
    pub total: Option<u64>,
    /// Payload bytes moved so far (all connections).
    pub done: u64,
    /// Every connection that ever joined, in order.
    pub links: Vec<LinkView>,
    /// Connections this side is still opening (asked for, not yet joined).
    pub opening: usize,
    /// Connections this side asked for that could not be opened.
    pub failed: usize,
    /// The sending peer's own report (a braid server during a download): its retransmissions
    /// and RTT, which a receiver's `TCP_INFO` does not show.
    pub sender: Option<braid_proto::markers::SenderReport>,
    /// The congestion control the sending side uses (this side's sockets or the peer's
    /// report), when known.
    pub congestion: Option<braid_proto::retr_opts::CcName>,
    /// Round trips of the control connection's probes answered since the last tick
    /// (background mode's signal).
    pub probes: Vec<Duration>,
    /// How long the probe in flight has been out.
    pub probe_out: Option<Duration>,
    /// The rate all connections together have been paced at since the last tick, bytes/s
    /// (None: unpaced): this side's sockets, or the sender's when this side receives.
    pub pacing: Option<u64>,
}

impl View {
    /// Before any data moves: nothing measured yet.
    pub fn at_start(total: Option<u64>) -> View {
        View {
            elapsed: Duration::ZERO,
            total,
            done: 0,
            links: Vec::new(),
            opening: 0,
            failed: 0,
            sender: None,
            congestion: None,
            probes: Vec::new(),
            probe_out: None,
            pacing: None,
        }
    }

    /// The sender has handed out its last block: every byte has moved, or a connection ended
    /// that nobody retired (a sender ends connections only when it has nothing left to send).
    pub fn ending(&self) -> bool {
        self.total.is_some_and(|t| self.done >= t)
            || self
                .links
                .iter()
                .any(|l| l.state == LinkState::Finished && !l.retiring)
    }

    /// Open connections that are not being retired: what the transfer will keep using.
    pub fn active(&self) -> impl Iterator<Item = &LinkView> {
        self.links
            .iter()
            .filter(|l| l.state == LinkState::Open && !l.retiring)
    }
}

/// One row of the `--json` timeline: one connection at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds since the transfer started.
    pub t: f64,
    pub conn: usize,
    /// Payload bytes carried so far.
    pub bytes: u64,
    /// Payload rate since this connection's previous row, bytes/s.
    pub rate: f64,
    /// The kernel's count of bytes moved: acknowledged where this side sends, received where
    /// it receives. Finer than `bytes`, which advances a piece (256 KiB) at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtt_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rttvar_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_rtt_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwnd: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<u32>,
    /// bytes/s; absent when unpaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing_rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rwnd_limited_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sndbuf_limited_ms: Option<f64>,
    /// Socket buffers (SO_SNDBUF, SO_RCVBUF) at this moment, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sndbuf: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rcvbuf: Option<usize>,
}

/// The life of one connection, for `--json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkRecord {
    pub conn: usize,
    /// Seconds since the transfer started.
    pub joined: f64,
    pub ended: Option<f64>,
    pub bytes: u64,
    pub end: LinkState,
}

/// Open connections at one moment: `(seconds, count)`.
pub type Count = (f64, usize);

/// The timeline of a transfer, bounded: past `MAX_ROWS` rows, every other row of each
/// connection is dropped and the interval doubles, so a transfer of any length fits.
#[derive(Debug)]
pub struct Sampler {
    every: Duration,
    next_row: Duration,
    /// Per connection id: (seconds, bytes) at its last row.
    last_row: Vec<(f64, u64)>,
    rows: Vec<Sample>,
    counts: Vec<Count>,
}

const MAX_ROWS: usize = 20_000;

impl Sampler {
    /// Rows every `every` (one second for `--json`).
    pub fn new(every: Duration) -> Sampler {
        Sampler {
            every,
            next_row: Duration::ZERO,
            last_row: Vec::new(),
            rows: Vec::new(),
            counts: Vec::new(),
        }
    }

    /// Reads the connections now; records a row per open connection when one is due, and the
    /// connection count whenever it changed.
    pub fn sample(&mut self, transfer: &Transfer, total: Option<u64>, opening: usize) -> View {
        let elapsed = transfer.started().elapsed();
        let t = elapsed.as_secs_f64();
        let row_due = elapsed >= self.next_row;
        if row_due {
            self.next_row = elapsed + self.every;
        }
        let mut views = Vec::new();
        for link in transfer.links() {
            let state = link.state();
            let bytes = link.bytes();
            let tcp = if state == LinkState::Open {
                link.tcp_info()
            } else {
                None
            };
            // A connection gets its first row at the first tick that sees it, however short
            // its life; then one per interval.
            let first = self.last_row.len() <= link.id;
            if first {
                self.last_row
                    .resize(link.id + 1, (link.joined.as_secs_f64(), 0));
            }
            let (t0, b0) = self.last_row[link.id];
            let rate = if t > t0 {
                bytes.saturating_sub(b0) as f64 / (t - t0)
            } else {
                0.0
            };
            if (row_due || first) && state == LinkState::Open {
                let mut r = row(t, link.id, bytes, rate, tcp.as_ref());
                (r.sndbuf, r.rcvbuf) = link.buffers().unzip();
                self.rows.push(r);
                self.last_row[link.id] = (t, bytes);
            }
            views.push(LinkView {
                id: link.id,
                state,
                retiring: link.retiring(),
                bytes,
                rate,
                tcp,
            });
        }
        let open = views.iter().filter(|l| l.state == LinkState::Open).count();
        if self.counts.last().is_none_or(|&(_, n)| n != open) {
            self.counts.push((t, open));
        }
        if self.rows.len() > MAX_ROWS {
            self.thin();
        }
        View {
            elapsed,
            done: views.iter().map(|l| l.bytes).sum(),
            links: views,
            opening,
            ..View::at_start(total)
        }
    }

    fn thin(&mut self) {
        let mut seen = vec![0usize; self.last_row.len()];
        self.rows.retain(|r| {
            let n = &mut seen[r.conn];
            *n += 1;
            *n % 2 == 1
        });
        self.every *= 2;
    }

    /// The timeline so far, and the open-connection count over time.
    pub fn finish(self, transfer: &Transfer) -> (Vec<Sample>, Vec<Count>, Vec<LinkRecord>) {
        let t = transfer.started().elapsed().as_secs_f64();
        let mut counts = self.counts;
        let open = transfer.open();
        if counts.last().is_none_or(|&(_, n)| n != open) {
            counts.push((t, open));
        }
        let links = transfer
            .links()
            .iter()
            .map(|l| LinkRecord {
                conn: l.id,
                joined: l.joined.as_secs_f64(),
                ended: l.ended().map(|d| d.as_secs_f64()),
                bytes: l.bytes(),
                end: l.state(),
            })
            .collect();
        (self.rows, counts, links)
    }
}

/// Bytes a connection has moved by the kernel's count: acknowledged by the peer where this
/// side sends, received where it receives.
pub fn kernel_moved(tcp: &TcpInfo) -> u64 {
    if tcp.bytes_sent > tcp.bytes_received {
        tcp.bytes_acked
    } else {
        tcp.bytes_received
    }
}

fn row(t: f64, conn: usize, bytes: u64, rate: f64, tcp: Option<&TcpInfo>) -> Sample {
    let ms = |us: u64| us as f64 / 1000.0;
    let capped = |r: u64| (r != u64::MAX && r != 0).then_some(r);
    Sample {
        t,
        conn,
        bytes,
        rate,
        moved: tcp.map(kernel_moved),
        rtt_ms: tcp.map(|i| ms(i.rtt_us.into())),
        rttvar_ms: tcp.map(|i| ms(i.rttvar_us.into())),
        min_rtt_ms: tcp.map(|i| ms(i.min_rtt_us.into())),
        cwnd: tcp.map(|i| i.cwnd),
        retransmits: tcp.map(|i| i.total_retrans),
        pacing_rate: tcp.and_then(|i| capped(i.pacing_rate)),
        delivery_rate: tcp.and_then(|i| capped(i.delivery_rate)),
        busy_ms: tcp.map(|i| ms(i.busy_us)),
        rwnd_limited_ms: tcp.map(|i| ms(i.rwnd_limited_us)),
        sndbuf_limited_ms: tcp.map(|i| ms(i.sndbuf_limited_us)),
        sndbuf: None,
        rcvbuf: None,
    }
}
