//! Background mode on loopback: what it does to the connections (probes answered, bbr,
//! DSCP lower effort, the rate limit as its ceiling) and that files still arrive whole. What
//! it does to other traffic is measured in the lab (`lab::background_keeps_ping_low`).

use crate::util::{Server, braid_command, json, random_bytes, serve_files, tempdir, wait_timeout};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIZE: usize = 8 << 20;
/// 8 MiB at 4 MB/s: two seconds, long enough to see the sockets.
const LIMIT: u64 = 4_000_000;

/// Established TCP connections of process `pid` other than those to or from `port` (the
/// control connection), with their TOS byte, from `ss`.
fn data_tos(pid: u32, port: u16) -> Vec<String> {
    let out = Command::new("ss")
        .args(["-tnpH", "--tos", "state", "established"])
        .output()
        .expect("run ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = format!(":{port}");
            f.len() > 3 && !f[2].ends_with(&port) && !f[3].ends_with(&port)
        })
        .filter_map(|l| {
            l.split_whitespace()
                .find(|f| f.starts_with("tos:"))
                .map(str::to_string)
        })
        .collect()
}

/// Runs a background transfer with `args`, watching the data connections of `sender` (a
/// pid; None: the client itself) until one shows DSCP 1 (TOS 0x4) or the client ends.
/// Returns the summary and whether the marking was seen.
fn run_watching(args: &[&str], sender: Option<u32>, port: u16) -> (serde_json::Value, bool) {
    let home = tempdir();
    let mut child = braid_command(home.path())
        .args(args)
        .args(["--background", "--rate-limit", &LIMIT.to_string(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = sender.unwrap_or(child.id());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut marked = false;
    while !marked && Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        marked = data_tos(pid, port).iter().any(|t| t == "tos:0x4");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = wait_timeout(&mut child, Duration::from_secs(60));
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {err}");
    (json(&String::from_utf8_lossy(&out.stdout)), marked)
}

/// What every background summary must show: probes answered, a base delay, bbr, and a
/// rate that never went above the limit.
fn check_report(s: &serde_json::Value, what: &str) {
    let b = &s["background"];
    assert!(b["probes"].as_u64() >= Some(5), "{what}: few probes: {b}");
    assert!(b["base_ms"].as_f64() > Some(0.0), "{what}: no base: {b}");
    assert_eq!(b["target_ms"], 10.0, "{what}");
    assert_eq!(
        s["congestion"], "bbr",
        "{what}: background mode asks for bbr (is it in /proc/sys/net/ipv4/tcp_available_congestion_control?)"
    );
    assert_eq!(s["streams"], 1, "{what}: -n auto is one connection");
    let timeline = b["timeline"].as_array().unwrap();
    assert!(timeline.len() >= 2, "{what}: {b}");
    for p in timeline {
        assert!(
            p["rate"].as_u64() <= Some(LIMIT),
            "{what}: over the limit: {p}"
        );
    }
    let rate = s["bytes_per_second"].as_f64().unwrap();
    assert!(rate < 1.2 * LIMIT as f64, "{what}: {rate} bytes/s");
}

#[test]
fn a_background_transfer_probes_is_marked_lower_effort_and_ends_whole() {
    let content = random_bytes(SIZE, 151);
    let (top, root, server) = serve_files(&[("f.bin", &content)], &["--anonymous-write"]);

    let dest = top.path().join("got.bin");
    let get = ["get", &server.url("f.bin"), dest.to_str().unwrap()];
    // A download: the server sends, so its data connection carries the marking.
    let (s, marked) = run_watching(&get, Some(server.pid()), server.port());
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "get: content differs"
    );
    assert!(marked, "the server's data connection never had DSCP 1");
    check_report(&s, "get");

    let put = ["put", dest.to_str().unwrap(), &server.url("up.bin")];
    let (s, marked) = run_watching(&put, None, server.port());
    assert!(
        std::fs::read(root.join("up.bin")).unwrap() == content,
        "put: content differs"
    );
    assert!(marked, "the client's data connection never had DSCP 1");
    check_report(&s, "put");
}

/// Downloads by `user` (password `pw`) of `name`, as a running child with `--json`.
fn spawn_get(
    server: &Server,
    user: &str,
    name: &str,
    dest: &std::path::Path,
    home: &std::path::Path,
) -> std::process::Child {
    let url = format!("ftp://{user}@{}/{name}", server.addr);
    braid_command(home)
        .args(["get", &url, dest.to_str().unwrap(), "--json", "-n", "2"])
        .env("BRAID_PASSWORD", "pw")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn summary_of(child: std::process::Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&String::from_utf8_lossy(&out.stdout))
}

/// The users file's classes: a user's cap holds whatever the client asks, and with
/// `--uplink` two users' downloads at once get it by their weights (1 and 3), not half each.
#[test]
fn users_get_their_cap_and_their_weighted_share_of_the_uplink() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let small = random_bytes(4 << 20, 152);
    let big = random_bytes(12 << 20, 153);
    std::fs::write(root.join("small.bin"), &small).unwrap();
    std::fs::write(root.join("big.bin"), &big).unwrap();
    let users = top.path().join("users");
    for (name, class) in [
        ("capped", ",rate=2MB"),
        ("light", ""),
        ("heavy", ",weight=3"),
    ] {
        crate::util::add_account(&users, name, &root, "pw", false);
        let text = std::fs::read_to_string(&users).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap();
        let classed = line.replacen(":ro:", &format!(":ro{class}:"), 1);
        std::fs::write(&users, text.replace(line, &classed)).unwrap();
    }
    let users_arg = users.to_str().unwrap();
    let server = Server::start(&root, &["--users", users_arg, "--uplink", "8MB"]);
    let home = tempdir();

    // Alone, with the whole uplink to itself: the user's cap of 2 MB/s still holds (each
    // connection's first burst goes before the pacing does: on loopback, 128 KiB).
    let got = top.path().join("capped.bin");
    let s = summary_of(spawn_get(&server, "capped", "small.bin", &got, home.path()));
    assert!(std::fs::read(&got).unwrap() == small);
    let rate = s["bytes_per_second"].as_f64().unwrap();
    assert!(rate < 2.6e6, "capped at 2 MB/s, got {rate:.0} bytes/s");

    // Together: 8 MB/s as 2 and 6, so both take about two seconds. Were the uplink split
    // evenly, the light one would get 4 MB/s. The heavy one goes first and the light one joins
    // once its data flows: started the other way round, on a busy machine the light one could
    // be half done alone, at the whole 8 MB/s, before the heavy one had logged in.
    let (light_dest, heavy_dest) = (top.path().join("light.bin"), top.path().join("heavy.bin"));
    let heavy = spawn_get(&server, "heavy", "big.bin", &heavy_dest, home.path());
    let heavy_part = top.path().join("heavy.bin.part");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&heavy_part).map_or(true, |m| m.len() == 0) {
        assert!(
            Instant::now() < deadline,
            "the heavy download never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let light = spawn_get(&server, "light", "small.bin", &light_dest, home.path());
    let (light, heavy) = (summary_of(light), summary_of(heavy));
    assert!(std::fs::read(&light_dest).unwrap() == small);
    assert!(std::fs::read(&heavy_dest).unwrap() == big);
    let (l, h) = (
        light["bytes_per_second"].as_f64().unwrap(),
        heavy["bytes_per_second"].as_f64().unwrap(),
    );
    assert!(
        l < 3.0e6,
        "weight 1 of 4 of 8 MB/s, got {l:.0} bytes/s (heavy {h:.0})"
    );
    assert!(h > 1.5 * l, "weight 3 got {h:.0} bytes/s, weight 1 {l:.0}");
}
