//! The connection plan of one MODE E transfer, decided before it starts from the options,
//! the server and what this host knows of the path: how many data connections to start with,
//! how many at most, who moves the count between them, and the block size.

use super::Options;
use super::control::{ASSUMED_RTT, Control, connect_data};
use super::detour::DataAddr;
use super::peer::{Peer, STALL};
use crate::engine;
use crate::engine::hooks::{Fixed, Policy, Schedule, Steering};
use crate::engine::transfer::{Joins, Waker};
use crate::engine::tune::{self, Tuning};
use crate::engine::widen::Widen;
use braid_proto::client::Direction;
use braid_proto::retr_opts::CcName;
use std::net::TcpStream;
use std::time::Duration;

pub struct Plan {
    pub start: u32,
    pub max: u32,
    policy: Choice,
    pub elastic: bool,
    pub block: u64,
}

/// What the control connection and this host say of the path.
#[derive(Debug, Clone, Copy, Default)]
pub struct PathHint {
    /// The control connection's lowest RTT.
    pub rtt: Option<Duration>,
    /// The most a data connection's window reaches here in this direction: half the kernel's
    /// buffer cap (the other half is overhead), or half of twice `--buffer`.
    pub window: Option<u64>,
    /// The smaller of this host's receive and send buffer caps (either end's may bind, and the
    /// other end's is not known).
    pub least_cap: Option<u64>,
}

impl PathHint {
    pub fn of(c: &Control, direction: Direction, buffer: Option<u64>) -> PathHint {
        let (rmem, wmem) = *CAPS;
        let cap = match direction {
            Direction::Download => rmem,
            Direction::Upload => wmem,
        };
        PathHint {
            rtt: c.min_rtt(),
            window: buffer.or(cap.map(|c| c / 2)),
            least_cap: rmem.into_iter().chain(wmem).min(),
        }
    }
}

/// This host's buffer caps (the most of `tcp_rmem` and of `tcp_wmem`), read once: every file
/// of a tree plans with them, and they do not change while a transfer runs.
static CAPS: std::sync::LazyLock<(Option<u64>, Option<u64>)> =
    std::sync::LazyLock::new(|| (kernel_cap(RMEM), kernel_cap(WMEM)));

const RMEM: &str = "/proc/sys/net/ipv4/tcp_rmem";
const WMEM: &str = "/proc/sys/net/ipv4/tcp_wmem";

/// The most the kernel lets a socket's buffer grow to, from `tcp_rmem` or `tcp_wmem`.
fn kernel_cap(file: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.split_whitespace().nth(2)?.parse::<u64>().ok()
}

/// Who chooses the connection count during the transfer.
enum Choice {
    /// `-n N`, or a server whose count is fixed per transfer.
    Fixed,
    /// `--schedule`.
    Schedule(Schedule),
    /// `-n auto` (the default) against a braid server.
    Auto(Tuning),
    /// `-n auto` with `--background` against a braid server: what one connection carries
    /// at most (its window over the round trip).
    Widen { window: u64, rtt: Duration },
}

/// The most connections background mode opens by itself.
const BACKGROUND_MOST: usize = 8;

/// A connection's window where the kernel's caps are unknown: Linux's default `tcp_wmem` cap
/// (4 MiB), half of it for data.
const DEFAULT_WINDOW: u64 = 2 << 20;

impl Plan {
    /// `size`: the bytes to move, when known (they bound the useful connections and the
    /// block size). `elastic`: connections may join and leave mid-transfer (a braid server).
    /// `path`: what is known of the path, asked only where the plan needs it.
    pub fn new(
        opts: &Options,
        peer: Peer,
        elastic: bool,
        size: Option<u64>,
        path: impl FnOnce() -> PathHint,
    ) -> Plan {
        // Without a block size given, a small file still makes a few blocks per connection
        // (a braid server takes the size it is told; GridFTP peers keep the default).
        let block = |n: u32| match (opts.block_size, peer) {
            (Some(b), _) => b,
            (None, Peer::Braid) => tune::block_for(size, n as usize),
            (None, Peer::GridFtp) => engine::DEFAULT_BLOCK,
        };
        if opts.schedule.is_some() && !elastic {
            eprintln!(
                "braid: --schedule needs a braid server that lets connections join mid-transfer (FEAT BRAID 2); the count stays fixed"
            );
        }
        let (start, max, policy) = match (&opts.schedule, opts.streams, elastic) {
            // Background mode's limit is its rate: one connection, more only where a window
            // holds them back (`engine::widen`).
            (None, None, true) if opts.background.is_some() => {
                let path = path();
                let window = opts.buffer.or(path.least_cap.map(|c| c / 2));
                let widen = Choice::Widen {
                    window: window.unwrap_or(DEFAULT_WINDOW),
                    rtt: path.rtt.unwrap_or(ASSUMED_RTT),
                };
                (1, BACKGROUND_MOST as u32, widen)
            }
            (Some(s), _, true) => {
                let max = s.steps.iter().map(|&(_, n)| n).chain([s.start]).max();
                let max = max.unwrap_or(s.start) as u32;
                (s.start as u32, max, Choice::Schedule(s.clone()))
            }
            (None, None, true) => return Plan::auto(opts, size, path().rtt),
            (_, n, _) => {
                let n = match n.or(opts.background.map(|_| 1)) {
                    Some(n) => n.max(1),
                    None => {
                        let path = path();
                        let (n, why) = tune::fixed_count(path.rtt, path.window);
                        tracing::info!("the server fixes the connection count per transfer: {why}");
                        n as u32
                    }
                };
                (n, n, Choice::Fixed)
            }
        };
        Plan {
            start,
            max,
            policy,
            elastic,
            block: block(max),
        }
    }

    /// `-n auto` against a braid server: the self-tuning's first count, and its search.
    fn auto(opts: &Options, size: Option<u64>, rtt: Option<Duration>) -> Plan {
        let mut tuning = Tuning::new(engine::DEFAULT_BLOCK);
        // A congestion control the user chose stays.
        tuning.try_congestion = opts.congestion.is_none();
        tuning.start_on(rtt);
        let block = opts
            .block_size
            .unwrap_or_else(|| tune::block_for(size, tuning.max.min(2 * tuning.start)));
        tuning.block = block;
        let start = tune::Auto::new(tuning.clone()).first_count(size) as u32;
        Plan {
            start,
            max: tuning.max as u32,
            policy: Choice::Auto(tuning),
            elastic: true,
            block,
        }
    }

    /// The congestion control the self-tuning starts with, if it chose one before the transfer.
    pub fn start_congestion(&self) -> Option<CcName> {
        match &self.policy {
            Choice::Auto(t) => t.start_congestion.map(|(cc, _)| cc),
            _ => None,
        }
    }

    pub fn policy(&self) -> Box<dyn Policy> {
        match &self.policy {
            Choice::Fixed => Box::new(Fixed),
            Choice::Schedule(s) => Box::new(s.clone()),
            Choice::Auto(t) => Box::new(tune::Auto::new(t.clone())),
            Choice::Widen { window, rtt } => Box::new(Widen::new(BACKGROUND_MOST, *window, *rtt)),
        }
    }

    pub fn tuning(&self) -> &'static str {
        match self.policy {
            Choice::Auto(_) | Choice::Widen { .. } => "auto",
            _ => "fixed",
        }
    }

    /// The connections of a transfer to a braid server's passive address: those opened at
    /// the start, and (elastic) any the policy opens later.
    pub fn joins(
        &self,
        socks: Vec<TcpStream>,
        addr: DataAddr,
        buffer: Option<u64>,
        steering: &mut Steering,
        waker: Option<Waker>,
    ) -> Joins {
        let initial = socks.len();
        let mut joins = Joins::fixed(socks, STALL);
        if self.elastic {
            let connect = move || connect_data(&addr);
            joins.incoming = Some(steering.open_with(initial, connect, buffer, waker));
        }
        joins
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::hooks::Trigger;

    const MIB: u64 = 1 << 20;

    fn path() -> PathHint {
        PathHint {
            rtt: Some(Duration::from_millis(50)),
            window: Some(4 * MIB),
            least_cap: Some(6 * MIB),
        }
    }

    fn unused() -> PathHint {
        panic!("this plan needs nothing of the path")
    }

    #[test]
    fn n_fixes_the_count_and_the_block_size_follows_it() {
        let opts = Options {
            streams: Some(4),
            ..Options::default()
        };
        let p = Plan::new(&opts, Peer::Braid, true, Some(64 * MIB), unused);
        assert_eq!((p.start, p.max, p.tuning()), (4, 4, "fixed"));
        assert_eq!(p.block, tune::block_for(Some(64 * MIB), 4));
        // A GridFTP server keeps its default block unless one is given.
        let p = Plan::new(&opts, Peer::GridFtp, false, Some(64 * MIB), unused);
        assert_eq!(p.block, engine::DEFAULT_BLOCK);
        let given = Options {
            block_size: Some(123 << 10),
            ..opts
        };
        assert_eq!(
            Plan::new(&given, Peer::GridFtp, false, None, unused).block,
            123 << 10
        );
    }

    #[test]
    fn auto_against_a_braid_server_tunes_and_against_gridftp_fixes_from_the_path() {
        let p = Plan::new(
            &Options::default(),
            Peer::Braid,
            true,
            Some(512 * MIB),
            path,
        );
        assert_eq!(p.tuning(), "auto");
        assert!(p.start >= 1 && p.start <= p.max, "{} of {}", p.start, p.max);
        // A server that fixes the count per transfer: chosen once from RTT and window.
        let p = Plan::new(
            &Options::default(),
            Peer::GridFtp,
            false,
            Some(512 * MIB),
            path,
        );
        let (n, _) = tune::fixed_count(path().rtt, path().window);
        assert_eq!((p.start, p.max, p.tuning()), (n as u32, n as u32, "fixed"));
    }

    #[test]
    fn background_starts_on_one_connection_and_widens_only_up_to_its_limit() {
        let opts = Options {
            background: Some(Duration::from_millis(5)),
            ..Options::default()
        };
        let p = Plan::new(&opts, Peer::Braid, true, Some(512 * MIB), path);
        assert_eq!(
            (p.start, p.max, p.tuning()),
            (1, BACKGROUND_MOST as u32, "auto")
        );
        // Without elastic connections, background mode stays on one.
        let p = Plan::new(&opts, Peer::Braid, false, Some(512 * MIB), unused);
        assert_eq!((p.start, p.max), (1, 1));
    }

    #[test]
    fn a_schedule_starts_at_its_first_count_and_opens_up_to_its_largest() {
        let schedule = Schedule {
            start: 2,
            steps: vec![(Trigger::Fraction(0.2), 6), (Trigger::Fraction(0.6), 3)],
        };
        let opts = Options {
            schedule: Some(schedule),
            ..Options::default()
        };
        let p = Plan::new(&opts, Peer::Braid, true, None, unused);
        assert_eq!((p.start, p.max, p.tuning()), (2, 6, "fixed"));
    }

    #[test]
    fn the_kernels_buffer_cap_is_the_third_number_of_tcp_rmem() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tcp_rmem");
        std::fs::write(&f, "4096\t131072\t6291456\n").unwrap();
        assert_eq!(kernel_cap(f.to_str().unwrap()), Some(6291456));
        std::fs::write(&f, "4096 131072\n").unwrap();
        assert_eq!(kernel_cap(f.to_str().unwrap()), None);
        assert_eq!(
            kernel_cap(dir.path().join("absent").to_str().unwrap()),
            None
        );
    }
}
