//! The link emulator, measured with real programs: ping for delay, iperf3 for rate, window and
//! loss, Python sockets for corruption, braid itself for the end-to-end check. These tests
//! need root and /dev/net/tun; each lab has its own name, so they run in parallel, and each
//! checks that nothing of its lab is left afterwards.
use crate::util::{BRAID, random_bytes, require, tempdir};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn require_lab() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the lab tests create network namespaces and TUN devices: run them as root"
    );
    assert!(
        std::path::Path::new("/dev/net/tun").exists(),
        "the lab tests need /dev/net/tun (modprobe tun)"
    );
    require("ip");
}

/// A lab name no other test (or test run) uses.
pub fn lab_name(tag: &str) -> String {
    format!("bt{}{tag}", std::process::id() % 100_000)
}

/// Nothing of lab `name` remains: namespaces (NAME-HOST), their /etc/netns, the record.
fn assert_gone(name: &str) {
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let prefix = format!("{name}-");
    assert!(
        !list.lines().any(|l| l.starts_with(&prefix)),
        "a namespace of lab {name} was left behind: {list}"
    );
    assert!(
        !std::path::Path::new("/run/braid-lab").join(name).exists(),
        "the lab's record was left behind"
    );
    for entry in std::fs::read_dir("/etc/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        assert!(
            !entry.file_name().to_string_lossy().starts_with(&prefix),
            "{} was left behind",
            entry.path().display()
        );
    }
}

/// `braid lab link` running in the background; Ctrl-C'd (and waited for) when dropped.
struct Link {
    name: String,
    child: Option<Child>,
}

impl Link {
    fn up(name: &str, args: &[&str]) -> Link {
        Link::up_with(std::path::Path::new(BRAID), name, args)
    }

    /// `braid lab link` from this binary (a copy under another name, say).
    fn up_with(braid: &std::path::Path, name: &str, args: &[&str]) -> Link {
        let mut child = Command::new(braid)
            .args(["lab", "link", "--name", name, "--json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("are up") => break,
                Some(Ok(line)) => seen.push_str(&(line + "\n")),
                _ => {
                    let _ = child.kill();
                    panic!("braid lab link did not come up:\n{seen}");
                }
            }
        }
        // Keep draining stderr so the lab never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Link {
            name: name.to_string(),
            child: Some(child),
        }
    }

    fn exec(&self, host: &str, cmd: &[&str]) -> std::process::Output {
        Command::new(BRAID)
            .args(["lab", "exec", "--name", &self.name, host, "--"])
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Stops the lab and returns its report.
    fn stop(mut self) -> serde_json::Value {
        let child = self.child.take().unwrap();
        crate::util::signal_process(child.id(), rustix::process::Signal::INT);
        let out = wait_output(child, Duration::from_secs(20));
        assert_gone(&self.name);
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::util::signal_process(child.id(), rustix::process::Signal::INT);
            let _ = wait_output(child, Duration::from_secs(20));
        }
    }
}

fn wait_output(mut child: Child, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
    }
    out
}

/// `braid lab run` with `--json`: (exit code, client exit code, server stdout, link report).
fn run_once(
    name: &str,
    link: &[&str],
    server: &str,
    client: &str,
) -> (i32, i64, String, serde_json::Value) {
    let (code, v) = run_json(name, link, server, client);
    (
        code,
        v["client"]["exit"].as_i64().unwrap_or(-1),
        v["server"]["stdout"].as_str().unwrap_or("").to_string(),
        v["link"].clone(),
    )
}

/// `braid lab run` with `--json`: its exit code and its report.
fn run_json(name: &str, link: &[&str], server: &str, client: &str) -> (i32, serde_json::Value) {
    let out = Command::new(BRAID)
        .args(["lab", "run", "--name", name, "--json", "--timeout", "120"])
        .args(link)
        .args(["--server", server, "--client", client])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_gone(name);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), v)
}

#[test]
fn ping_rtt_is_twice_the_delay_plus_serialization() {
    require_lab();
    require("ping");
    let name = lab_name("p");
    let top = tempdir();
    let log = top.path().join("packets.csv");
    let link = Link::up(
        &name,
        &[
            "--rate",
            "1.536mbit",
            "--delay",
            "100ms",
            "--log",
            log.to_str().unwrap(),
        ],
    );
    // A second lab of the same name is refused and leaves the first alone.
    let second = Command::new(BRAID)
        .args(["lab", "link", "--name", &name, "--duration", "1"])
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("exists already"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let median = ping_median(&link, "left", "198.18.0.2");
    // 84-byte echo and reply, each serialized at 1.536 Mbit/s: 0.4375 ms per direction.
    let expected = 200.0 + 2.0 * 84.0 * 8.0 / 1536.0;
    assert!(
        (median - expected).abs() <= 1.0,
        "median RTT {median} ms, expected {expected} ms"
    );
    let report = link.stop();
    assert_eq!(report["up"]["delivered_packets"], 10, "{report}");
    assert_eq!(report["down"]["delivered_packets"], 10, "{report}");
    // The packet log: one line per packet, 84 bytes each, delivered 100 ms (plus 0.44 ms on
    // the wire) after the end of its transmission.
    let log = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Vec<&str>> = log.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(lines.len(), 20, "{log}");
    for f in &lines {
        assert_eq!((f[2], f[3]), ("84", "deliver"), "{log}");
        let (arrival, sent, delivered): (u64, u64, u64) = (
            f[1].parse().unwrap(),
            f[4].parse().unwrap(),
            f[5].parse().unwrap(),
        );
        assert_eq!(delivered - sent, 100_000, "{log}");
        assert!((437..=438).contains(&(sent - arrival)), "{log}");
    }
}

/// Median RTT in ms of ten pings from `host` to `to`.
fn ping_median(link: &Link, host: &str, to: &str) -> f64 {
    let out = link.exec(host, &["ping", "-c", "10", "-i", "0.2", to]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{host} → {to}: {text}");
    let mut rtts: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(rtts.len(), 10, "{text}");
    rtts.sort_by(f64::total_cmp);
    rtts[5]
}

/// An iperf3 server for one test in `host` of a star lab, listening on `port` once this
/// returns. The caller waits for it; the lab's teardown stops it if the test fails first.
#[allow(clippy::zombie_processes)]
fn iperf3_server(link: &Link, host: &str, port: u16) -> Child {
    let mut child = Command::new(BRAID)
        .args(["lab", "exec", "--name", &link.name, host, "--"])
        .args(["iperf3", "-s", "-1", "-J", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let filter = format!("sport = :{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = link.exec(host, &["ss", "-Hltn", &filter]);
        if !out.stdout.is_empty() {
            return child;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("iperf3 -s did not listen on {host} port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A lab of four hosts, each behind its own access link to one switch: a packet crosses its
/// sender's link up and its receiver's link down, so delays add along the path, the slower
/// link sets the rate, and two senders into one host share its downlink.
#[test]
fn a_lab_of_more_hosts_gives_each_its_own_link_to_a_switch() {
    require_lab();
    require("ping");
    require("iperf3");
    require("ss");
    let name = lab_name("m");
    let link = Link::up(
        &name,
        &[
            "--host",
            "a:rate=20mbit,delay=10ms,queue=100pkt",
            "--host",
            "b:rate=50mbit,delay=5ms",
            "--host",
            "c",
            "--host",
            "d:down-delay=1ms",
        ],
    );
    // Names resolve in every host; an unknown host is named as such.
    let out = link.exec("a", &["getent", "hosts", "d"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("198.18.0.4 "),
        "{out:?}"
    );
    let out = link.exec("e", &["true"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("hosts are a, b, c, d"),
        "{out:?}"
    );
    // RTT: twice each link's delay, plus an 84-byte ping's serialization on each rated hop.
    let ser = |mbit: f64| 2.0 * 84.0 * 8.0 / (mbit * 1000.0);
    for (from, to, expected) in [
        ("a", "198.18.0.2", 30.0 + ser(20.0) + ser(50.0)),
        ("a", "198.18.0.3", 20.0 + ser(20.0)),
        ("b", "198.18.0.3", 10.0 + ser(50.0)),
        ("c", "198.18.0.4", 1.0),
    ] {
        let median = ping_median(&link, from, to);
        assert!(
            (median - expected).abs() <= 1.0,
            "{from} → {to}: median RTT {median} ms, expected {expected:.2} ms"
        );
    }
    // Rate: c → a is held to a's 20 Mbit/s; b and c sending to a at once share it.
    let payload = 20e6 * 1448.0 / 1500.0;
    let server = iperf3_server(&link, "a", 5201);
    let out = link.exec(
        "c",
        &["iperf3", "-c", "198.18.0.1", "-t", "5", "-C", "cubic"],
    );
    assert!(out.status.success(), "{out:?}");
    let alone = steady_goodput(&wait_output(server, Duration::from_secs(20)));
    assert!(
        (alone - payload).abs() <= 0.03 * payload,
        "c → a alone: {alone:.0} bit/s against a payload rate of {payload:.0}"
    );
    let servers = [
        iperf3_server(&link, "a", 5202),
        iperf3_server(&link, "a", 5203),
    ];
    let senders: Vec<Child> = [("b", "5202"), ("c", "5203")]
        .iter()
        .map(|(host, port)| {
            Command::new(BRAID)
                .args(["lab", "exec", "--name", &name, host, "--"])
                .args([
                    "iperf3",
                    "-c",
                    "198.18.0.1",
                    "-p",
                    port,
                    "-t",
                    "6",
                    "-C",
                    "cubic",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut s in senders {
        assert!(s.wait().unwrap().success());
    }
    let shared: f64 = servers
        .into_iter()
        .map(|s| steady_goodput(&wait_output(s, Duration::from_secs(20))))
        .sum();
    assert!(
        (shared - payload).abs() <= 0.05 * payload,
        "b and c → a together: {shared:.0} bit/s against a's payload rate of {payload:.0}"
    );
    let report = link.stop();
    let hosts = report["hosts"].as_array().unwrap();
    let names: Vec<&str> = hosts.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b", "c", "d"], "{report}");
    assert_eq!(hosts[0]["address"], "198.18.0.1", "{report}");
    // a's downlink carried both senders and queued (its 100 packets filled and dropped);
    // nothing was lost outside the model.
    assert!(
        hosts[0]["down"]["queue_drops"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(
        hosts[0]["down"]["delivered_bytes"].as_u64().unwrap() > 20_000_000 / 8 * 10,
        "{report}"
    );
    for h in hosts {
        assert_eq!(h["up"]["device_drops"], 0, "{report}");
        assert_eq!(h["up"]["write_errors"], 0, "{report}");
    }
}

/// Mean goodput of an iperf3 server's intervals after the first two seconds, in bit/s.
fn steady_goodput(server_json: &str) -> f64 {
    let v: serde_json::Value = serde_json::from_str(server_json).unwrap();
    let intervals = v["intervals"].as_array().unwrap();
    let (bytes, secs) = intervals
        .iter()
        .skip(2)
        .map(|i| {
            (
                i["sum"]["bytes"].as_f64().unwrap(),
                i["sum"]["seconds"].as_f64().unwrap(),
            )
        })
        .fold((0.0, 0.0), |(b, s), (x, y)| (b + x, s + y));
    bytes * 8.0 / secs
}

#[test]
fn iperf3_gets_the_payload_rate_at_1536_kbit_and_50_mbit() {
    require_lab();
    require("iperf3");
    for (tag, rate, bps, link, secs) in [
        (
            "t",
            "1.536mbit",
            1_536_000.0,
            ["--delay", "20ms", "--queue", "60kB"],
            "8",
        ),
        (
            "f",
            "50mbit",
            50e6,
            ["--delay", "10ms", "--queue", "200pkt"],
            "6",
        ),
    ] {
        let name = lab_name(tag);
        let mut args = vec!["--rate", rate];
        args.extend(link);
        let client = format!("iperf3 -c 198.18.0.2 -t {secs} -C cubic -J");
        let (code, _, server, report) = run_once(&name, &args, "iperf3 -s -1 -J", &client);
        assert_eq!(code, 0, "{report}");
        // TCP payload per 1500-byte packet with timestamps: 1448 bytes.
        let ceiling = bps * 1448.0 / 1500.0;
        let got = steady_goodput(&server);
        assert!(
            (got - ceiling).abs() <= 0.03 * ceiling,
            "{rate}: {got:.0} bit/s against a payload rate of {ceiling:.0}: {report}"
        );
        assert_eq!(report["up"]["device_drops"], 0, "{report}");
    }
}

#[test]
fn a_window_limited_flow_gets_window_over_rtt() {
    require_lab();
    require("iperf3");
    let name = lab_name("w");
    // No rate limit, 100 ms RTT: only the window limits. For `-w 24K` Linux advertises 20
    // segments of 1448 bytes (28960), as captures show; the flow moves that much per RTT.
    let (code, _, server, report) = run_once(
        &name,
        &["--delay", "50ms"],
        "iperf3 -s -1 -J",
        "iperf3 -c 198.18.0.2 -t 6 -w 24K -C cubic -J",
    );
    assert_eq!(code, 0, "{report}");
    let expected = 28960.0 * 8.0 / 0.1;
    let got = steady_goodput(&server);
    assert!(
        (got - expected).abs() <= 0.1 * expected,
        "{got:.0} bit/s against window/RTT = {expected:.0}"
    );
}

#[test]
fn loss_matches_the_configured_rate_and_nothing_else_is_lost() {
    require_lab();
    require("iperf3");
    let name = lab_name("l");
    let p = 0.02;
    let (code, _, server, report) = run_once(
        &name,
        &["--up-loss", &p.to_string(), "--rate", "100mbit"],
        "iperf3 -s -1 -J",
        "iperf3 -c 198.18.0.2 -u -b 20M -l 1400 -t 3 -J",
    );
    assert_eq!(code, 0, "{report}");
    let up = &report["up"];
    let arrived = up["arrived_packets"].as_f64().unwrap();
    let lost = up["lost"].as_f64().unwrap();
    let sd = (arrived * p * (1.0 - p)).sqrt();
    assert!(
        (lost - arrived * p).abs() < 5.0 * sd,
        "{lost} of {arrived} lost, expected {} ± {sd:.1}",
        arrived * p
    );
    assert_eq!(report["down"]["lost"], 0);
    // The receiver misses exactly the packets the model lost: no drops outside it.
    let v: serde_json::Value = serde_json::from_str(&server).unwrap();
    let missed = v["end"]["sum"]["lost_packets"].as_f64().unwrap();
    assert!(
        (missed - lost).abs() <= 1.0,
        "iperf3 missed {missed}, the model lost {lost}"
    );
}

#[test]
fn corrupted_payload_arrives_with_valid_checksums_and_only_braids_check_sees_it() {
    require_lab();
    require("python3");
    let name = lab_name("c");
    // Every UDP datagram gets one flipped bit; the kernel delivers it, so its checksum was fixed.
    let receive = "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
                   s.bind(('0.0.0.0', 7000)); print(s.recv(4096).hex())\"";
    let send = "python3 -c \"import socket,time; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
                [s.sendto(b'A'*1000, ('198.18.0.2', 7000)) or time.sleep(0.05) for _ in range(20)]\"";
    let (code, _, server, report) = run_once(&name, &["--up-corrupt", "1"], receive, send);
    assert_eq!(code, 0, "{report}");
    let got = (0..server.trim().len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&server.trim()[i..i + 2], 16).unwrap())
        .collect::<Vec<u8>>();
    assert_eq!(got.len(), 1000, "{server}");
    let flipped: u32 = got.iter().map(|b| (b ^ b'A').count_ones()).sum();
    assert_eq!(flipped, 1, "expected exactly one flipped bit");
    assert!(report["up"]["corrupted"].as_u64().unwrap() >= 1, "{report}");

    // TCP accepts damaged segments with fixed checksums too: braid's whole-file check is what
    // catches them (exit 8), and nothing takes the final name. 1e-6 per bit damages about 35
    // of the 4 MiB's ~2900 full segments (none: e^-35), but a small control packet only once
    // in ~1500 (at 1e-5, once in ~150 each: a damaged command or reply fails the run before
    // the checksum can).
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.bin"), random_bytes(4 << 20, 16)).unwrap();
    let dest = top.path().join("f.bin");
    let name = lab_name("d");
    let serve = format!(
        "{BRAID} serve --root {} --listen 198.18.0.2:2121",
        root.display()
    );
    let get = format!(
        "{BRAID} get ftp://198.18.0.2:2121/f.bin {} -n 2 -q",
        dest.display()
    );
    let (_, client_code, _, report) = run_once(
        &name,
        &["--down-corrupt", "1e-6", "--mtu", "1500"],
        &serve,
        &get,
    );
    assert!(
        report["down"]["corrupted"].as_u64().unwrap() > 0,
        "{report}"
    );
    // The client's own code: on a loaded machine the TUN devices may drop a few packets too,
    // which fails the lab run but only costs TCP a retransmission.
    assert_eq!(client_code, 8, "braid did not report the damage: {report}");
    assert!(!dest.exists(), "a damaged download took its final name");

    // The same on the way up: the server finds the checksum wrong and answers 535, which the
    // client maps to exit 8 by its code; the upload stays a hidden partial.
    let up = top.path().join("up.bin");
    std::fs::write(&up, random_bytes(4 << 20, 17)).unwrap();
    let serve = format!(
        "{BRAID} serve --root {} --listen 198.18.0.2:2121 --anonymous-write",
        root.display()
    );
    // Upload records go to the test's directory, not the user's.
    let put = format!(
        "XDG_STATE_HOME={} {BRAID} put {} ftp://198.18.0.2:2121/up.bin -n 2 -q",
        top.path().join("state").display(),
        up.display()
    );
    let (_, client_code, _, report) = run_once(
        &lab_name("u"),
        &["--up-corrupt", "1e-6", "--mtu", "1500"],
        &serve,
        &put,
    );
    assert!(report["up"]["corrupted"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(client_code, 8, "braid did not report the damage: {report}");
    assert!(
        !root.join("up.bin").exists(),
        "a damaged upload took its final name"
    );
}

/// Self-tuning on a path where each connection is window-limited (24 KiB buffers, 100 ms):
/// four connections carry under half of the 20 Mbit/s, so `-n auto` must add connections,
/// and the file must arrive whole, in both directions.
#[test]
fn auto_adds_connections_where_each_is_window_limited() {
    require_lab();
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let data = random_bytes(8 << 20, 21);
    std::fs::write(root.join("f.bin"), &data).unwrap();
    std::fs::write(top.path().join("up.bin"), &data).unwrap();
    let serve = format!(
        "{BRAID} serve --root {} --listen 198.18.0.2:2121 --anonymous-write",
        root.display()
    );
    let get = format!(
        "{BRAID} get ftp://198.18.0.2:2121/f.bin {} --buffer 24KiB --json",
        top.path().join("got.bin").display()
    );
    let put = format!(
        "XDG_STATE_HOME={} {BRAID} put {} ftp://198.18.0.2:2121/up.bin --buffer 24KiB --json",
        top.path().join("state").display(),
        top.path().join("up.bin").display()
    );
    let link = ["--delay", "50ms", "--rate", "20mbit"];
    for (tag, cmd, landed) in [
        ("ag", &get, top.path().join("got.bin")),
        ("ap", &put, root.join("up.bin")),
    ] {
        let (_, v) = run_json(&lab_name(tag), &link, &serve, cmd);
        let client = &v["client"];
        assert_eq!(client["exit"], 0, "{v}");
        let summary = crate::util::json(client["stdout"].as_str().unwrap());
        assert_eq!(summary["tuning"], "auto", "{summary}");
        let most = summary["connection_count"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c[1].as_u64().unwrap())
            .max()
            .unwrap();
        assert!(
            most > 4,
            "{tag}: never more than {most} connections: {summary}"
        );
        let decisions = summary["decisions"].as_array().unwrap();
        // The climb's step up from 4, explained.
        let tried_more = decisions.iter().any(|d| {
            let action = d["action"].as_str().unwrap_or_default();
            action
                .rsplit_once("trying ")
                .and_then(|(_, n)| n.parse::<u64>().ok())
                .is_some_and(|n| n > 4)
        });
        assert!(tried_more, "{tag}: {decisions:?}");
        assert!(
            std::fs::read(&landed).unwrap() == data,
            "{tag}: the file differs"
        );
    }
}

/// A copy between servers with `-n auto` (the default): only the sending server sees the
/// path to the other, so it tunes its own connections; where each is held to a small window
/// it opens more, and the client's summary says how many.
#[test]
fn a_copy_between_servers_has_the_sending_server_tune_its_connections() {
    use crate::util::{Server, add_account, openssl_certificate};
    require_lab();
    let top = tempdir();
    let (cert, key) = openssl_certificate(top.path(), "peers", "IP:198.18.0.1,IP:198.18.0.2");
    let (a_dir, b_dir) = (top.path().join("a"), top.path().join("b"));
    std::fs::create_dir(&a_dir).unwrap();
    std::fs::create_dir(&b_dir).unwrap();
    let (users_a, users_b) = (top.path().join("users-a"), top.path().join("users-b"));
    add_account(&users_a, "alice", &a_dir, "secret-a", false);
    add_account(&users_b, "bob", &b_dir, "secret-b", true);
    let data = random_bytes(40 << 20, 71);
    std::fs::write(a_dir.join("big.bin"), &data).unwrap();
    let name = lab_name("tt");
    let link = Link::up(
        &name,
        &[
            "--host",
            "srva:rate=100mbit,delay=20ms",
            "--host",
            "srvb",
            "--host",
            "client",
        ],
    );
    let tls = ["--tls-cert", cert.as_str(), "--tls-key", key.as_str()];
    let serve = |host, listen, users: &std::path::Path, root| {
        let mut args = vec!["--users", users.to_str().unwrap()];
        args.extend(tls);
        Server::start_in_lab(&name, host, listen, root, &args)
    };
    let a = serve("srva", "198.18.0.1:0", &users_a, &a_dir);
    let b = serve("srvb", "198.18.0.2:0", &users_b, &b_dir);
    let out = link.exec(
        "client",
        &[
            "env",
            &format!("HOME={}", top.path().display()),
            BRAID,
            "cp",
            &format!("ftp://alice:secret-a@{}/big.bin", a.addr),
            &format!("ftp://bob:secret-b@{}/big.bin", b.addr),
            "--tls",
            "--tls-ca",
            &cert,
            "--buffer",
            "32KiB",
            "--json",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let summary = crate::util::json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(summary["tuning"], "auto", "{summary}");
    assert!(summary["streams"].as_u64().unwrap() > 4, "{summary}");
    assert!(
        std::fs::read(b_dir.join("big.bin")).unwrap() == data,
        "the copy differs"
    );
    // A's tuning climbed from 4, and said why.
    let la = a.log();
    let tried_more = la.lines().any(|l| {
        l.rsplit_once("trying ")
            .and_then(|(_, n)| n.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 4)
    });
    assert!(tried_more, "{la}");
}

#[test]
fn clean_removes_a_lab_whose_process_was_killed() {
    require_lab();
    let name = lab_name("k");
    let mut link = Link::up(&name, &["--delay", "1ms"]);
    let mut child = link.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        std::path::Path::new("/run/netns")
            .join(format!("{name}-left"))
            .exists(),
        "SIGKILL should leave the namespaces for clean to find"
    );
    let out = Command::new(BRAID).args(["lab", "clean"]).output().unwrap();
    assert!(out.status.success());
    assert_gone(&name);
}

/// A running lab is left alone by `clean`, whatever its braid binary is called (a bench run
/// from a copy of braid lost its lab to a test's `clean` that way).
#[test]
fn clean_leaves_a_running_lab_of_a_renamed_binary_alone() {
    require_lab();
    let top = tempdir();
    let copy = top.path().join("braid-copy");
    std::fs::copy(BRAID, &copy).unwrap();
    let name = lab_name("r");
    let link = Link::up_with(&copy, &name, &["--delay", "1ms"]);
    let out = Command::new(BRAID).args(["lab", "clean"]).output().unwrap();
    assert!(out.status.success());
    assert!(
        std::path::Path::new("/run/netns")
            .join(format!("{name}-left"))
            .exists(),
        "clean removed a running lab: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    link.stop();
}

/// A tiny sweep end to end: 2 cells × 2 repeats on a LAN link, with every output written and
/// consistent with the runs made.
/// The experiments on labs of more hosts set up their topology, servers and clients
/// themselves: a striped download reaches all four data nodes, a copy between servers crosses
/// the client's slow link with next to nothing, and nothing of either lab is left.
#[test]
fn bench_experiments_on_more_hosts_stripe_over_four_nodes_and_copy_past_the_client() {
    require_lab();
    for (tag, experiment, direction) in [("bs", "striping", "get"), ("bt", "third-party", "get")] {
        let name = lab_name(tag);
        let top = tempdir();
        let (report, stdout) = crate::util::bench(
            top.path(),
            &[
                "--experiment",
                experiment,
                "--direction",
                direction,
                "--repeat",
                "1",
                "--name",
                &name,
            ],
            Duration::from_secs(240),
        );
        assert_gone(&name);
        assert!(stdout.contains("| run | round |"), "{stdout}");
        let runs = report["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{report}");
        let summary = &runs[0]["summary"];
        // Counted (whether the relay kept up depends on what else this machine runs).
        assert!(report["lab"]["device_drops"].is_u64(), "{report}");
        match experiment {
            "striping" => {
                assert_eq!(summary["data_nodes"], 4, "{summary}");
                assert_eq!(summary["bytes"], 512u64 << 20, "{summary}");
            }
            _ => {
                assert_eq!(summary["route"], "third-party", "{summary}");
                let (client, copied) = (
                    report["lab"]["client_link_bytes"].as_u64().unwrap(),
                    report["lab"]["copied_bytes"].as_u64().unwrap(),
                );
                assert_eq!(copied, 256 << 20, "{report}");
                assert!(client > 0 && client < copied / 100, "{report}");
            }
        }
    }
}

#[test]
fn bench_sweep_writes_json_csv_markdown_and_plots() {
    require_lab();
    let name = lab_name("bench");
    let top = tempdir();
    let out_dir = top.path().join("results");
    let (report, stdout) = crate::util::bench(
        top.path(),
        &[
            "--scenario",
            "lan-100m",
            "-n",
            "1,2",
            "--direction",
            "get",
            "--repeat",
            "2",
            "--size",
            "1MB",
            "--idle-ping",
            "1",
            "--name",
            &name,
        ],
        Duration::from_secs(120),
    );
    assert_gone(&name);
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2, "{report}");
    for (cell, streams) in cells.iter().zip([1, 2]) {
        assert_eq!(cell["cell"]["streams"], streams);
        assert_eq!(cell["mbit_s"]["count"], 2, "{cell}");
        assert_eq!(cell["failures"], 0);
        // Payload cannot beat the 100 Mbit/s link, and a working transfer moves something.
        let median = cell["mbit_s"]["median"].as_f64().unwrap();
        assert!(median > 0.0 && median < 100.0, "{cell}");
        let model = &cell["model"];
        assert_eq!(model["binding"], "link", "{cell}");
        assert!(model["error_percent"].as_f64().is_some());
        assert!(cell["ping"]["samples"].as_u64().unwrap() > 0, "{cell}");
    }
    assert!(report["idle"]["lan-100m"]["p50_ms"].as_f64().unwrap() > 0.0);
    // The link carried the runs: four downloads of 1 MB went down.
    let down = report["links"]["lan-100m"]["down"]["delivered_bytes"]
        .as_u64()
        .unwrap();
    assert!(down > 4_000_000, "{report}");
    // One CSV row and one JSON line per run, in the order they ran.
    let csv = std::fs::read_to_string(out_dir.join("results.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 5, "{csv}");
    assert!(rows[0].starts_with("scenario,tool,direction,streams"));
    assert!(
        rows[1..]
            .iter()
            .all(|r| r.starts_with("lan-100m,braid,get,"))
    );
    let jsonl = std::fs::read_to_string(out_dir.join("results.jsonl")).unwrap();
    let repeats: Vec<u64> = jsonl
        .lines()
        .map(|l| crate::util::json(l)["run"]["repeat"].as_u64().unwrap())
        .collect();
    assert_eq!(repeats, [0, 0, 1, 1], "each round runs every cell once");
    for svg in ["throughput-lan-100m-get.svg", "latency-lan-100m.svg"] {
        let text = std::fs::read_to_string(out_dir.join(svg)).unwrap();
        assert!(text.starts_with("<svg"), "{svg}");
        assert!(text.contains("Mbit/s") || text.contains("RTT"), "{svg}");
    }
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(
        md.contains("| braid | get | 2 | default | default | 2 |"),
        "{md}"
    );
    assert!(stdout.contains("## lan-100m"), "{stdout}");
}

/// Every tool `braid bench` knows runs in the lab against its server, both directions, and
/// gets a number; the clock-timed ones have their setup measured.
#[test]
fn bench_runs_every_tool_against_its_server() {
    require_lab();
    for p in ["iperf3", "globus-url-copy", "lftp", "curl", "kermit"] {
        require(p);
    }
    let name = lab_name("tools");
    let top = tempdir();
    let (report, _) = crate::util::bench(
        top.path(),
        &[
            "--scenario",
            "lan-100m",
            "-n",
            "1",
            "--repeat",
            "1",
            "--size",
            "10MB",
            "--idle-ping",
            "0.5",
            "--tool",
            "braid,iperf3,globus-url-copy,lftp,curl,kermit",
            "--kermit-streaming",
            "on",
            "--name",
            &name,
        ],
        Duration::from_secs(180),
    );
    assert_gone(&name);
    let cells = report["cells"].as_array().unwrap();
    let mut seen: Vec<String> = cells
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c["cell"]["tool"].as_str().unwrap(),
                c["cell"]["direction"].as_str().unwrap()
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "braid get",
            "braid put",
            "curl get",
            "curl put",
            "globus-url-copy get",
            "globus-url-copy put",
            "iperf3 get",
            "iperf3 put",
            "kermit get",
            "kermit put",
            "lftp get",
            "lftp put"
        ]
    );
    for c in cells {
        assert_eq!(c["failures"], 0, "{c}");
        let median = c["mbit_s"]["median"].as_f64().unwrap();
        assert!(median > 0.0, "{c}");
    }
    for key in [
        "lftp get",
        "lftp put",
        "globus-url-copy get",
        "globus-url-copy put",
    ] {
        let s = report["setup_seconds"][format!("lan-100m {key}")].as_f64();
        assert!(
            s.is_some_and(|s| s > 0.0),
            "no setup time for {key}: {report}"
        );
    }
}

/// Seed 000's problem and braid's answer, in one run: on a 1 Mbit/s link with a second of
/// drop-tail queue, ping during a plain single-connection download with cubic (the seed's
/// ftp), during a `get --background` one, during curl's download from `serve --background`
/// (the server yielding by itself, in stream mode), and during a `get --background` from
/// vsftpd sending with reno (braid holding it back by its receive window alone). Every
/// background one keeps the median inflation of ping far below the plain one's, and every
/// file arrives whole.
#[test]
fn background_keeps_ping_low_where_a_plain_transfer_fills_the_queue() {
    require_lab();
    require("ping");
    require("curl");
    let vsftpd = crate::util::sbin("vsftpd");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let data = random_bytes(1 << 20, 22);
    std::fs::write(root.join("f.bin"), &data).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let empty = top.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let conf = top.path().join("vsftpd.conf");
    let text = braid::bench::servers::vsftpd_conf("198.18.0.2", 2123, &root, &empty, false, "");
    std::fs::write(&conf, text).unwrap();
    // The server's namespace sends with reno (a namespace may only default to a control in
    // tcp_allowed_congestion_control), which alone would fill the queue as the plain download
    // does; braid serve sets each connection's own.
    let serve = format!(
        "sysctl -qw net.ipv4.tcp_congestion_control=reno || exit 1; \
         {BRAID} serve --root {r} --listen 198.18.0.2:2121 & \
         {BRAID} serve --root {r} --listen 198.18.0.2:2122 --background & \
         {v} {c}",
        r = root.display(),
        v = vsftpd.display(),
        c = conf.display()
    );
    let dir = top.path().display();
    let run = |tag: &str, cmd: String| {
        format!(
            "ping -n -i 0.2 -c 150 198.18.0.2 > {dir}/ping-{tag}.txt & p=$!; \
             {cmd}; r=$?; kill -INT $p; wait $p; [ $r = 0 ] || exit $r"
        )
    };
    let get = |tag: &str, args: &str| {
        let cmd = format!(
            "{BRAID} get ftp://198.18.0.2:2121/f.bin {dir}/got-{tag}.bin {args} --json > {dir}/{tag}.json"
        );
        run(tag, cmd)
    };
    let curl = run(
        "curl",
        format!("curl -sS -o {dir}/got-curl.bin ftp://198.18.0.2:2122/f.bin"),
    );
    // Each transfer's queue drains before the next one starts.
    let from_vsftpd = run(
        "vs",
        format!(
            "{BRAID} get ftp://198.18.0.2:2123/f.bin {dir}/got-vs.bin --background --json > {dir}/vs.json"
        ),
    );
    let client = format!(
        "sleep 0.5; {}; sleep 2; {}; sleep 2; {curl}; sleep 2; {from_vsftpd}",
        get("plain", "-n 1 --congestion cubic"),
        get("bg", "--background"),
    );
    let (_, v) = run_json(
        &lab_name("bg"),
        &["--scenario", "dsl-1m-bloat"],
        &serve,
        &client,
    );
    assert_eq!(v["client"]["exit"], 0, "{v}");
    let pings = |tag: &str| -> Vec<f64> {
        let text = std::fs::read_to_string(top.path().join(format!("ping-{tag}.txt"))).unwrap();
        text.split_whitespace()
            .filter_map(|w| w.strip_prefix("time="))
            .map(|t| t.parse().unwrap())
            .collect()
    };
    let all: Vec<Vec<f64>> = ["plain", "bg", "curl", "vs"]
        .iter()
        .map(|t| pings(t))
        .collect();
    let idle = all.iter().flatten().cloned().fold(f64::MAX, f64::min);
    let rise = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] - idle
    };
    let plain = rise(&all[0]);
    for (what, up) in [
        ("get --background", rise(&all[1])),
        ("serve --background", rise(&all[2])),
        ("get --background from vsftpd", rise(&all[3])),
    ] {
        assert!(
            up < 0.25 * plain,
            "ping's median rose {up:.1} ms over {idle:.1} during {what}, {plain:.1} ms during the plain transfer"
        );
    }
    for tag in ["plain", "bg", "curl", "vs"] {
        let got = std::fs::read(top.path().join(format!("got-{tag}.bin"))).unwrap();
        assert!(got == data, "{tag}: the file differs");
    }
    for tag in ["bg", "vs"] {
        let json = std::fs::read_to_string(top.path().join(format!("{tag}.json"))).unwrap();
        let summary = crate::util::json(&json);
        assert!(
            summary["background"]["probes"].as_u64() > Some(10),
            "{summary}"
        );
    }
}

/// braid cp to a host behind a firewall that lets in nothing but ssh (the lab drops every
/// other connection opening to right without an answer): after 5 s without an answer on the
/// data port, the far side connects back; with a firewall in front of left as well, the data
/// goes through ssh's channel. Each way the file arrives identical, and the summary says
/// which way the data went.
#[test]
fn cp_through_firewalls_has_the_far_side_connect_back_or_goes_through_ssh() {
    require_lab();
    require("ssh");
    let sshd = braid::bench::servers::find_program("sshd")
        .expect("this test needs OpenSSH's server: run ./scripts/test, which installs it");
    let top = tempdir();
    let conf = braid::bench::servers::sshd_setup(top.path(), "198.18.0.2", 2222).unwrap();
    let ssh = format!(
        "ssh {} -p 2222",
        braid::bench::servers::ssh_options(top.path()).join(" ")
    );
    let big = top.path().join("big.bin");
    std::fs::write(&big, random_bytes(4 << 20, 61)).unwrap();
    let server = format!(
        "{} -D -f {} -E {}",
        sshd.display(),
        conf.display(),
        top.path().join("sshd.log").display()
    );
    for (tag, firewall, route, said) in [
        (
            "fb",
            &["--right-accepts", "2222"][..],
            "connect-back",
            "the far side connects back",
        ),
        (
            "fc",
            &["--right-accepts", "2222", "--left-accepts", "none"][..],
            "ssh-channel",
            "through ssh's channel",
        ),
    ] {
        let got = top.path().join(format!("got-{tag}.bin"));
        // sshd gets up to 5 s to listen; the copy's own state stays in the test's directory,
        // one for each firewall (kept between runs, the way the first found would spare the
        // second its straight connections).
        let client = format!(
            "for i in $(seq 50); do {ssh} 198.18.0.2 true 2>/dev/null && break; sleep 0.1; done; \
             XDG_STATE_HOME={state} {BRAID} cp -v --json -n 2 -e '{ssh}' --remote-braid {BRAID} \
             198.18.0.2:{big} {got}",
            state = top.path().join(format!("state-{tag}")).display(),
            big = big.display(),
            got = got.display(),
        );
        let mut link = vec!["--delay", "2ms"];
        link.extend(firewall);
        let (_, v) = run_json(&lab_name(tag), &link, &server, &client);
        let (out, err) = (
            v["client"]["stdout"].as_str().unwrap_or_default(),
            v["client"]["stderr"].as_str().unwrap_or_default(),
        );
        assert_eq!(v["client"]["exit"], 0, "{err}");
        assert_eq!(std::fs::read(&got).unwrap(), std::fs::read(&big).unwrap());
        assert!(err.contains(said), "{err}");
        let summary: serde_json::Value =
            serde_json::from_str(out.lines().last().unwrap_or_default()).unwrap();
        assert_eq!(summary["data_route"], route, "{summary}");
        // The firewalls dropped openings, and only what they were told to.
        assert!(
            v["link"]["up"]["firewall_drops"].as_u64().unwrap() > 0,
            "{v}"
        );
        let down_drops = v["link"]["down"]["firewall_drops"].as_u64().unwrap();
        assert_eq!(down_drops > 0, route == "ssh-channel", "{v}");
    }
}
