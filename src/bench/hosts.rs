//! Experiments on labs of more than two hosts (`braid bench --experiment striping` and
//! `third-party`): the layouts of data transfer nodes the striping and server-to-server copies
//! are for, each set up, measured and torn down by one command, with each run's rate set
//! against what the lab's links can carry.

use super::BenchArgs;
use super::servers::{Servers, Tls};
use crate::lab::{Running, Topology, parse_host};
use anyhow::{Context, Result, bail};
use braid_proto::session::Perm;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

pub const THIRD_PARTY: &str = "third-party";
pub const NAMES: [&str; 2] = ["striping", THIRD_PARTY];

/// Where the servers listen, in their own hosts.
const PORT: u16 = 2121;
/// The data nodes of the striping experiment, each behind its own link.
const NODES: usize = 4;
/// Bytes each run moves.
const STRIPED_SIZE: u64 = 512 << 20;
const COPY_SIZE: u64 = 256 << 20;
const PASSWORD: &str = "bench";

/// One measured run.
#[derive(Debug, serde::Serialize)]
struct Run {
    what: String,
    round: u32,
    seconds: f64,
    bytes: u64,
    /// Payload bit/s over the links' rate (what a target names: "0.9 of 400 Mbit/s").
    of_links: f64,
    /// Payload bit/s over the most TCP payload those links carry (headers take the rest).
    of_payload: f64,
    /// What braid's `--json` said of it.
    summary: serde_json::Value,
}

pub fn run(name: &str, args: &BenchArgs) -> Result<u8> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let tmp = super::work_dir()?;
    let braid = super::runnable_copy(tmp.path())?;
    let (runs, notes, counted) = match name {
        "striping" => striping(args, tmp.path(), &braid)?,
        _ => third_party(args, tmp.path(), &braid)?,
    };
    let json = serde_json::json!({
        "experiment": name,
        "runs": runs,
        "notes": notes,
        "lab": counted,
    });
    super::results(&args.out, &markdown(name, &runs, &notes), &json)?;
    Ok(0)
}

/// A lab of `hosts` (`NAME:LINK` as `braid lab link --host` takes them).
fn lab(args: &BenchArgs, scenario: &str, hosts: &[String]) -> Result<Running> {
    let topology = Topology {
        scenario: Some(scenario.into()),
        mtu: 1500,
        hosts: hosts.iter().map(|h| parse_host(h)).collect::<Result<_>>()?,
        pair: false,
    };
    Running::with_hosts(&args.name, topology, args.seed, None)
}

/// TCP payload bit/s of a link of `bits` per second at MTU 1500.
fn payload(bits: f64) -> f64 {
    8.0 * crate::model::limits::payload_rate(bits, 1500.0)
}

/// Four data nodes behind 100 Mbit/s links (20 ms from the client) and a front end on a fast
/// one, all on one shared directory: `braid get` and `put` of one file through the front end.
/// What an experiment measured: its runs, what to say of them, and the lab's own counts.
type Measured = (Vec<Run>, Vec<String>, serde_json::Value);

fn striping(args: &BenchArgs, tmp: &Path, braid: &Path) -> Result<Measured> {
    let shared = tmp.join("shared");
    std::fs::create_dir(&shared)?;
    super::make_file(&shared.join("big.bin"), STRIPED_SIZE)?;
    let key = tmp.join("node.key");
    std::fs::write(&key, "bench node key, not secret\n")?;
    let users = tmp.join("users");
    crate::users::write_entry(&users, "bench", PASSWORD, Perm::ReadWrite, &shared)?;
    let mut hosts = vec![
        "client:rate=1gbit,delay=5ms".to_string(),
        "fe:rate=1gbit".into(),
    ];
    hosts.extend((1..=NODES).map(|i| format!("dn{i}:rate=100mbit,delay=5ms")));
    let lab = lab(args, "striping", &hosts)?;
    let addr = |host: usize| crate::lab::hosts::address(host);
    let mut servers = Servers::default();
    for i in 1..=NODES {
        let mut c = lab.command(&format!("dn{i}"), &braid.to_string_lossy());
        c.args(["serve", "--data-node", "--node-key"])
            .arg(&key)
            .arg("--root")
            .arg(&shared)
            .arg("--listen")
            .arg(format!("{}:{PORT}", addr(i + 1)));
        servers.start_in(&lab, &format!("dn{i}"), c, PORT)?;
    }
    let nodes: Vec<String> = (1..=NODES)
        .map(|i| format!("{}:{PORT}", addr(i + 1)))
        .collect();
    let mut c = lab.command("fe", &braid.to_string_lossy());
    c.args(["serve", "--data-nodes", &nodes.join(","), "--node-key"])
        .arg(&key)
        .arg("--users")
        .arg(&users)
        .arg("--root")
        .arg(&shared)
        .arg("--listen")
        .arg(format!("{}:{PORT}", addr(1)));
    servers.start_in(&lab, "fe", c, PORT)?;
    let front = format!("ftp://bench:{PASSWORD}@{}:{PORT}", addr(1));
    let aggregate = NODES as f64 * 100e6;
    let landed = tmp.join("got.bin");
    let mut runs = Vec::new();
    for round in 1..=args.repeat {
        for direction in &args.direction {
            let (what, from, to) = match direction {
                super::grid::Direction::Get => (
                    "get",
                    format!("{front}/big.bin"),
                    landed.display().to_string(),
                ),
                super::grid::Direction::Put => (
                    "put",
                    shared.join("big.bin").display().to_string(),
                    format!("{front}/up.bin"),
                ),
            };
            eprintln!("round {round} of {}: braid {what}, striped", args.repeat);
            let mut c = client(&lab, "client", braid, tmp);
            c.args([what, "--json", &from, &to]);
            let summary = braid_json(c, &format!("braid {what}"))?;
            runs.push(measured(
                format!("braid {what}"),
                round,
                summary,
                aggregate,
            )?);
            let _ = std::fs::remove_file(&landed);
            let _ = std::fs::remove_file(shared.join("up.bin"));
        }
    }
    drop(servers);
    let report = lab.stop();
    let notes = vec![
        format!(
            "{NODES} data nodes, each behind a 100 Mbit/s link, 20 ms from the client; the front \
             end and the client on 1 Gbit/s; {} MiB of random data; against the {NODES} links \
             together: {:.0} Mbit/s, {:.1} Mbit/s of TCP payload",
            STRIPED_SIZE >> 20,
            aggregate / 1e6,
            payload(aggregate) / 1e6
        ),
        device_drops(&report),
    ];
    let counted = serde_json::json!({ "device_drops": report.device_drops() });
    Ok((runs, notes, counted))
}

/// Two servers on a 200 Mbit/s path, the client behind 1 Mbit/s: `braid cp` from one to the
/// other (`--files`: `braid cp -r` of a tree), and what of it crossed the client's link.
fn third_party(args: &BenchArgs, tmp: &Path, braid: &Path) -> Result<Measured> {
    let (a, b) = (tmp.join("a"), tmp.join("b"));
    std::fs::create_dir(&a)?;
    std::fs::create_dir(&b)?;
    let (from, to, what, moved) = match args.files {
        Some(n) => {
            super::make_tree(&a.join("tree"), n, args.size, args.data)?;
            let what = format!("braid cp -r A → B ({n} files of {} bytes)", args.size);
            let data = match args.data {
                super::Data::Random => "random data",
                super::Data::Text => "text",
            };
            let moved = format!("a tree of {n} files of {} bytes of {data}", args.size);
            ("tree", "tree", what, moved)
        }
        None => {
            super::make_file(&a.join("big.bin"), COPY_SIZE)?;
            let moved = format!("{} MiB of random data", COPY_SIZE >> 20);
            ("big.bin", "copy.bin", "braid cp A → B".into(), moved)
        }
    };
    let hosts = [
        "srva:rate=200mbit,delay=5ms".to_string(),
        "srvb".into(),
        "client:rate=1mbit,delay=10ms".into(),
    ];
    let lab = lab(args, "third-party", &hosts)?;
    let (addr_a, addr_b) = (
        crate::lab::hosts::address(0).to_string(),
        crate::lab::hosts::address(1).to_string(),
    );
    let tls = Tls::make_for(tmp, &[&addr_a, &addr_b])?;
    let mut servers = Servers::default();
    for (host, root, addr) in [("srva", &a, &addr_a), ("srvb", &b, &addr_b)] {
        let users = tmp.join(format!("users-{host}"));
        crate::users::write_entry(&users, "bench", PASSWORD, Perm::ReadWrite, root)?;
        let mut c = lab.command(host, &braid.to_string_lossy());
        c.arg("serve")
            .args(tls.serve_args())
            .arg("--users")
            .arg(&users)
            .arg("--listen")
            .arg(format!("{addr}:{PORT}"));
        servers.start_in(&lab, host, c, PORT)?;
    }
    let path = 200e6;
    let mut runs = Vec::new();
    for round in 1..=args.repeat {
        eprintln!("round {round} of {}: braid cp between servers", args.repeat);
        let mut c = client(&lab, "client", braid, tmp);
        c.arg("cp");
        if args.files.is_some() {
            c.arg("-r");
        }
        c.args(["--json", "--tls", "--tls-ca"])
            .arg(&tls.cert)
            .arg(format!("ftp://bench:{PASSWORD}@{addr_a}:{PORT}/{from}"))
            .arg(format!("ftp://bench:{PASSWORD}@{addr_b}:{PORT}/{to}"));
        let summary = braid_json(c, "braid cp")?;
        if let Some(n) = args.files {
            let copied = summary["files"].as_array().map_or(0, Vec::len) as u64;
            if copied != n {
                bail!("braid cp -r copied {copied} of {n} files: {summary}");
            }
        }
        runs.push(measured(what.clone(), round, summary, path)?);
        let _ = match args.files {
            Some(_) => std::fs::remove_dir_all(b.join(to)),
            None => std::fs::remove_file(b.join(to)),
        };
    }
    drop(servers);
    let report = lab.stop();
    let copied: u64 = runs.iter().map(|r| r.bytes).sum();
    let client_link = match &report.links {
        crate::lab::Links::Star { hosts } => hosts
            .iter()
            .find(|h| h.name == "client")
            .map(|h| h.up.relay.counters.delivered_bytes + h.down.relay.counters.delivered_bytes),
        crate::lab::Links::Pair { .. } => None,
    }
    .unwrap_or(0);
    let notes = vec![
        format!(
            "servers A and B on a 200 Mbit/s path (A's link, 5 ms), the client behind 1 Mbit/s \
             (10 ms); {moved}, TLS; against the path: {:.0} Mbit/s, {:.1} Mbit/s \
             of TCP payload",
            path / 1e6,
            payload(path) / 1e6
        ),
        format!(
            "the client's link carried {client_link} bytes in all for {copied} bytes copied \
             ({:.4} %), logins and checks included",
            100.0 * client_link as f64 / copied.max(1) as f64
        ),
        device_drops(&report),
    ];
    let counted = serde_json::json!({
        "device_drops": report.device_drops(),
        "client_link_bytes": client_link,
        "copied_bytes": copied,
    });
    Ok((runs, notes, counted))
}

/// braid in `host`, with a home and state of its own in the bench's directory.
fn client(lab: &Running, host: &str, braid: &Path, tmp: &Path) -> Command {
    let mut c = lab.command(host, "env");
    c.arg(format!("HOME={}", tmp.display()))
        .arg(format!("XDG_STATE_HOME={}", tmp.join("state").display()))
        .arg(braid);
    c
}

/// Runs braid and reads its `--json` summary (the last line).
fn braid_json(mut c: Command, what: &str) -> Result<serde_json::Value> {
    let out = c
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .with_context(|| format!("{what} printed no summary: {text}"))
}

/// A run from braid's summary, against links of `links` bit/s.
fn measured(what: String, round: u32, summary: serde_json::Value, links: f64) -> Result<Run> {
    let (Some(seconds), Some(bytes)) = (summary["seconds"].as_f64(), summary["bytes"].as_u64())
    else {
        bail!("{what}: no seconds or bytes in {summary}");
    };
    let rate = bytes as f64 * 8.0 / seconds.max(1e-9);
    Ok(Run {
        what,
        round,
        seconds,
        bytes,
        of_links: rate / links,
        of_payload: rate / payload(links),
        summary,
    })
}

/// Drops outside the model make a run untrustworthy: say whether there were any.
fn device_drops(report: &crate::lab::Report) -> String {
    match report.device_drops() {
        0 => "no packet was dropped outside the model (TUN devices)".into(),
        n => format!("WARNING: the TUN devices dropped {n} packets: the relay fell behind"),
    }
}

fn markdown(name: &str, runs: &[Run], notes: &[String]) -> String {
    let mut s = format!("## braid bench --experiment {name}\n\n");
    for n in notes {
        let _ = writeln!(s, "- {n}");
    }
    s.push_str(
        "\n| run | round | seconds | Mbit/s | of the links | of their payload | connections |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        // Striped: how many data nodes moved it; between servers: A's connections.
        let v = &r.summary;
        let conns = match (v["data_nodes"].as_u64(), v["streams"].as_u64()) {
            (Some(n), _) => format!("{n} data nodes"),
            (None, Some(n)) => format!("{n} ({})", v["tuning"].as_str().unwrap_or("fixed")),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.1} | {:.3} | {:.3} | {conns} |",
            r.what,
            r.round,
            r.seconds,
            r.bytes as f64 * 8.0 / r.seconds.max(1e-9) / 1e6,
            r.of_links,
            r.of_payload
        );
    }
    s
}
