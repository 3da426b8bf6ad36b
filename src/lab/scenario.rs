//! Named links from the documents braid grew from. `up` is left → right, `down` right → left;
//! a client in `left` that sends data sends it "up".

use super::model::{Loss, Nanos, Params, QueueLimit};

pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub mtu: u16,
    pub up: Params,
    pub down: Params,
}

const MS: Nanos = 1_000_000;

fn both(rate: u64, delay: Nanos, queue: QueueLimit, loss: Loss) -> Params {
    Params {
        rate: Some(rate),
        delay,
        queue,
        loss,
        corrupt: 0.0,
    }
}

pub fn all() -> Vec<Scenario> {
    let t1 = both(1_536_000, 295 * MS, QueueLimit::Bytes(96_000), Loss::None);
    vec![
        Scenario {
            name: "satellite-t1",
            about: "NASA ACTS satellite T1 (XFTP paper): 1.536 Mbit/s, 590 ms RTT, a 96 kB router \
                    queue: 8 connections with 24 KiB windows fit, more overflow it",
            mtu: 1500,
            up: t1.clone(),
            down: t1.clone(),
        },
        Scenario {
            name: "satellite-t1-ber",
            about: "satellite-t1 with bit errors, as in the XFTP paper's lossy runs: BER 1e-5 \
                    forward (up), 1e-7 back",
            mtu: 1500,
            up: Params {
                loss: Loss::Ber(1e-5),
                ..t1.clone()
            },
            down: Params {
                loss: Loss::Ber(1e-7),
                ..t1
            },
        },
        Scenario {
            name: "dialup-14k4",
            about: "14.4 kbit/s modem (seed 000): ~210 ms base RTT for a ping, MTU 576 and a deep \
                    16 kB modem queue, about 9 s of waiting when full",
            mtu: 576,
            up: both(14_400, 60 * MS, QueueLimit::Bytes(16_000), Loss::None),
            down: both(14_400, 60 * MS, QueueLimit::Bytes(16_000), Loss::None),
        },
        Scenario {
            name: "dsl-1m-bloat",
            about: "1 Mbit/s DSL with a bloated 1 s drop-tail queue (125 kB), 20 ms RTT",
            mtu: 1500,
            up: both(1_000_000, 10 * MS, QueueLimit::Bytes(125_000), Loss::None),
            down: both(1_000_000, 10 * MS, QueueLimit::Bytes(125_000), Loss::None),
        },
        Scenario {
            name: "lfn-500m",
            about: "long fat network: 500 Mbit/s, 150 ms RTT, random loss 1e-5, a 1-BDP queue \
                    (9.4 MB)",
            mtu: 1500,
            up: both(
                500_000_000,
                75 * MS,
                QueueLimit::Bytes(9_375_000),
                Loss::Random(1e-5),
            ),
            down: both(
                500_000_000,
                75 * MS,
                QueueLimit::Bytes(9_375_000),
                Loss::Random(1e-5),
            ),
        },
        Scenario {
            name: "lan-100m",
            about: "100 Mbit/s LAN: 0.2 ms RTT, 1000-packet queue",
            mtu: 1500,
            up: both(100_000_000, MS / 10, QueueLimit::Packets(1000), Loss::None),
            down: both(100_000_000, MS / 10, QueueLimit::Packets(1000), Loss::None),
        },
    ]
}

pub fn find(name: &str) -> Result<Scenario, String> {
    all().into_iter().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<_> = all().iter().map(|s| s.name).collect();
        format!("no scenario {name:?}; known: {}", names.join(", "))
    })
}

/// A parameter line for `braid lab scenarios`.
pub fn describe(p: &Params) -> String {
    let rate = p.rate.map_or("unlimited".to_string(), |r| {
        if r >= 1_000_000 {
            format!("{} Mbit/s", r as f64 / 1e6)
        } else {
            format!("{} kbit/s", r as f64 / 1e3)
        }
    });
    let queue = match p.queue {
        QueueLimit::Packets(n) => format!("{n} packets"),
        QueueLimit::Bytes(b) => format!("{b} bytes"),
    };
    let loss = match p.loss {
        Loss::None => "no loss".to_string(),
        Loss::Random(x) => format!("loss {x:e}"),
        Loss::Ber(x) => format!("BER {x:e}"),
    };
    let corrupt = if p.corrupt > 0.0 {
        format!(", corrupt {:e}/bit", p.corrupt)
    } else {
        String::new()
    };
    format!(
        "{rate}, delay {} ms, queue {queue}, {loss}{corrupt}",
        p.delay as f64 / 1e6
    )
}
