//! Elastic MODE E between braid peers: connections that join, leave and break while the data
//! flows, shown through `--json`'s connection records and timeline.
use crate::util::{
    Server, braid, braid_command, json, random_bytes, serve_files, tempdir, wait_timeout,
};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIZE: usize = 48 << 20;

/// The open-connection counts of a summary, in order.
fn counts(s: &Value) -> Vec<u64> {
    s["connection_count"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[1].as_u64().unwrap())
        .collect()
}

/// `want` appears in `seq` in this order (not necessarily next to each other).
fn in_order(seq: &[u64], want: &[u64]) -> bool {
    let mut it = seq.iter();
    want.iter().all(|w| it.any(|x| x == w))
}

fn ends(s: &Value) -> Vec<(String, f64)> {
    s["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["end"].as_str().unwrap().to_string(),
                c["ended"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Checks a summary of a transfer that went 1 → 8 → 2 connections.
fn check_one_eight_two(s: &Value, what: &str) {
    assert_eq!(s["mode"], "extended-block", "{what}: {s}");
    assert!(s["checksum"].as_str().unwrap().starts_with("XXH3 "), "{s}");
    let c = counts(s);
    assert!(
        in_order(&c, &[1, 8, 2, 0]),
        "{what}: counts over time {c:?}"
    );
    assert_eq!(c.iter().max(), Some(&8), "{what}: {c:?}");
    assert_eq!(s["streams"], 8);
    let ends = ends(s);
    assert_eq!(ends.len(), 8, "{what}: {ends:?}");
    assert!(
        ends.iter().all(|(e, _)| e == "finished"),
        "{what}: {ends:?}"
    );
    // Six were retired while two carried on to the end.
    let last = ends.iter().map(|e| e.1).fold(0.0, f64::max);
    let early = ends.iter().filter(|e| e.1 < last - 0.2).count();
    assert!(early >= 6, "{what}: only {early} ended early: {ends:?}");
    let per: u64 = s["per_connection_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert_eq!(
        per, SIZE as u64,
        "{what}: nothing is sent twice when nothing breaks"
    );
    let timeline = s["timeline"].as_array().unwrap();
    assert!(
        timeline
            .iter()
            .any(|r| r["conn"] == 7 && r["rtt_ms"].is_number()),
        "{what}: the timeline has TCP_INFO rows for a connection that joined later: {timeline:?}"
    );
    assert!(
        timeline
            .iter()
            .all(|r| r["sndbuf"].as_u64() > Some(0) && r["rcvbuf"].as_u64() > Some(0)),
        "{what}: every row has the socket buffers: {timeline:?}"
    );
}

#[test]
fn the_number_of_connections_changes_mid_transfer_both_ways() {
    let content = random_bytes(SIZE, 41);
    let (top, root, server) = serve_files(&[("f.bin", &content)], &["--anonymous-write"]);
    // Paced at 16 MB/s, 48 MiB take 3 s: the steps at 15% and 50% of the bytes are more than
    // a second apart, ten policy ticks, and two connections carry the last 1.5 s. Small socket
    // buffers: a retired connection's queue drains in a fraction of a second.
    let args = [
        "--schedule",
        "1,8@15%,2@50%",
        "--max-rate",
        "16MB",
        "--block-size",
        "256KiB",
        "--buffer",
        "256KiB",
        "--json",
    ];
    let dest = top.path().join("got.bin");
    let get = ["get", &server.url("f.bin"), dest.to_str().unwrap()];
    let (code, out, err) = braid(&[&get[..], &args].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "get: content differs"
    );
    check_one_eight_two(&json(&out), "get");

    let put = ["put", dest.to_str().unwrap(), &server.url("up.bin")];
    let (code, out, err) = braid(&[&put[..], &args].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(root.join("up.bin")).unwrap() == content,
        "put: content differs"
    );
    check_one_eight_two(&json(&out), "put");
    // The server logs each transfer once: the joining connections were part of one.
    assert_eq!(
        server.log().matches("transfer peer=").count(),
        2,
        "{}",
        server.log()
    );
}

/// The data connections of process `pid` that are not its control connection to `port`, as
/// (local, peer) address pairs, from `ss`.
fn data_connections(pid: u32, control_port: u16) -> Vec<(String, String)> {
    let out = Command::new("ss")
        .args(["-tnpH", "state", "established"])
        .output()
        .expect("run ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, peer) = (f.get(2)?.to_string(), f.get(3)?.to_string());
            (!peer.ends_with(&format!(":{control_port}"))).then_some((local, peer))
        })
        .collect()
}

/// The payload bytes the connection from `local` to `peer` has moved so far, either way (the
/// kernel's `bytes_received` or `bytes_acked`, from `ss -ti`).
fn bytes_moved(local: &str, peer: &str) -> u64 {
    let out = Command::new("ss")
        .args(["-tinH", "state", "established", "src", local, "dst", peer])
        .output()
        .expect("run ss");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|f| {
            let (k, v) = f.split_once(':')?;
            matches!(k, "bytes_received" | "bytes_acked").then(|| v.parse::<u64>().ok())?
        })
        .max()
        .unwrap_or(0)
}

/// Runs `args` with `--json`, and once the client has its four data connections and one of
/// them has carried more than half a block (so that the receiver has counted some of it and
/// it has something to send again), destroys that one with `ss -K` (as a reset from the
/// network would). Returns the summary, and what came out on stdout when the destination is
/// `-`.
fn run_and_break_one(args: &[&str], control_port: u16, home: &std::path::Path) -> (Value, Vec<u8>) {
    let mut child = braid_command(home)
        .args(args)
        .args(["-n", "4", "--max-rate", "16MB", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained as it comes: a full pipe would stop a download to stdout.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut out).map(|_| out)
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let victim = loop {
        let conns = data_connections(child.id(), control_port);
        if conns.len() >= 4 {
            break conns[1].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the client never had 4 data connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    while bytes_moved(&victim.0, &victim.1) < 600 << 10 {
        assert!(
            Instant::now() < deadline,
            "the data connection {victim:?} carried nothing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Both ends named: only this one connection matches, whatever else runs on the machine.
    let (ip, port) = victim.0.rsplit_once(':').unwrap();
    let (peer_ip, peer_port) = victim.1.rsplit_once(':').unwrap();
    let killed = Command::new("ss")
        .args(["-K", "src", ip, "dst", peer_ip])
        .args([
            "sport",
            "=",
            &format!(":{port}"),
            "dport",
            "=",
            &format!(":{peer_port}"),
        ])
        .output()
        .unwrap();
    assert!(killed.status.success(), "ss -K failed: {killed:?}");
    let status = wait_timeout(&mut child, Duration::from_secs(120));
    let out = reader.join().unwrap().unwrap();
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
    // With the data on stdout, the summary goes to stderr.
    if args.last() == Some(&"-") {
        let line = err.lines().rfind(|l| l.starts_with('{')).unwrap_or("");
        (json(line), out)
    } else {
        (json(&String::from_utf8_lossy(&out)), Vec::new())
    }
}

#[test]
fn a_connection_that_breaks_mid_transfer_is_made_up_for_by_the_others() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test destroys a socket with `ss -K`, which needs root"
    );
    crate::util::require("ss");
    let content = random_bytes(SIZE, 42);
    let (top, root, server) = serve_files(&[("f.bin", &content)], &["--anonymous-write"]);
    let dest = top.path().join("got.bin");
    // 16 MB/s: the 48 MiB take 3 s, and a connection breaks once it has carried 600 KiB.
    let get = ["get", &server.url("f.bin"), dest.to_str().unwrap()];
    let up = top.path().join("up.bin");
    std::fs::write(&up, &content).unwrap();
    let put = ["put", up.to_str().unwrap(), &server.url("stored.bin")];
    // To stdout, blocks must come out in order although the lost ones come again late.
    let piped = ["get", &server.url("f.bin"), "-"];
    for (what, args, result) in [
        ("get", &get[..], Some(dest.clone())),
        ("put", &put[..], Some(root.join("stored.bin"))),
        ("get to stdout", &piped[..], None),
    ] {
        let (s, stdout) = run_and_break_one(args, server.port(), top.path());
        let got = match result {
            Some(path) => std::fs::read(&path).unwrap(),
            None => stdout,
        };
        assert!(got == content, "{what}: content differs");
        assert!(s["checksum"].as_str().unwrap().starts_with("XXH3 "), "{s}");
        let ends: Vec<String> = ends(&s).into_iter().map(|e| e.0).collect();
        assert_eq!(
            ends.iter().filter(|e| *e == "lost").count(),
            1,
            "{what}: {ends:?}"
        );
        assert_eq!(
            ends.iter().filter(|e| *e == "finished").count(),
            3,
            "{ends:?}"
        );
        // What the broken connection carried went out again on the others.
        assert!(s["bytes"].as_u64().unwrap() > SIZE as u64, "{what}: {s}");
        assert_eq!(*counts(&s).last().unwrap(), 0);
    }
    assert!(
        server.log().contains("data connection lost"),
        "{}",
        server.log()
    );
}

#[test]
fn a_thousand_files_each_way_take_one_login_and_one_set_of_data_connections() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("many")).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let mut list = String::from("# one URL per line\n\n");
    let mut contents = Vec::new();
    for i in 0..1000 {
        // Sizes from empty to a few blocks of 64 KiB, so some files need several connections.
        let data = random_bytes((i * 337) % 200_000, 1000 + i as u64);
        std::fs::write(root.join(format!("many/f{i}")), &data).unwrap();
        list.push_str(&server.url(&format!("many/f{i}")));
        list.push('\n');
        contents.push(data);
    }
    let list_file = top.path().join("urls.txt");
    std::fs::write(&list_file, list).unwrap();
    let dest = top.path().join("got");
    std::fs::create_dir(&dest).unwrap();
    let (code, out, err) = braid(
        &[
            "get",
            "-i",
            list_file.to_str().unwrap(),
            dest.to_str().unwrap(),
            "-n",
            "4",
            "--block-size",
            "64KiB",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    for (i, data) in contents.iter().enumerate() {
        let got = std::fs::read(dest.join(format!("f{i}"))).unwrap();
        assert!(got == *data, "f{i} differs");
    }
    let lines: Vec<Value> = out.lines().map(json).collect();
    assert_eq!(
        lines.len(),
        1001,
        "a summary per file and one for the batch"
    );
    let batch = &lines[1000];
    assert_eq!(batch["op"], "get-batch");
    assert_eq!(batch["files"], 1000);
    assert_eq!(batch["logins"], 1);
    assert!(
        (1..=4).contains(&batch["data_connections"].as_u64().unwrap()),
        "{batch}"
    );
    assert!(
        lines[1..1000]
            .iter()
            .all(|s| s["new_data_connections"] == 0)
    );
    // The server saw the same: one login, and every transfer after the first on the data
    // connections the one before left open.
    let log = server.log();
    assert_eq!(log.matches("logged in").count(), 1, "{log}");
    assert_eq!(log.matches(" transfer").count(), 1000);
    assert_eq!(log.matches("reused=true").count(), 999, "{log}");

    // And back up, in one session too.
    std::fs::create_dir(root.join("up")).unwrap();
    let files: Vec<String> = (0..1000)
        .map(|i| dest.join(format!("f{i}")).display().to_string())
        .collect();
    let mut args: Vec<&str> = vec!["put", "-n", "4", "--block-size", "64KiB", "--json"];
    args.extend(files.iter().map(String::as_str));
    let url = server.url("up/");
    args.push(&url);
    let (code, out, err) = braid(&args, &[]);
    assert_eq!(code, 0, "{err}");
    let batch = json(out.lines().last().unwrap());
    assert_eq!(
        (batch["op"].as_str(), batch["files"].as_u64()),
        (Some("put-batch"), Some(1000))
    );
    for (i, data) in contents.iter().enumerate() {
        let got = std::fs::read(root.join(format!("up/f{i}"))).unwrap();
        assert!(got == *data, "up/f{i} differs");
    }
    let log = server.log();
    assert_eq!(log.matches("logged in").count(), 2, "{log}");
    assert_eq!(log.matches("reused=true").count(), 2 * 999, "{log}");
}

#[test]
fn a_running_download_can_be_told_a_new_rate_and_a_half_closed_connection_is_let_go() {
    use crate::util::Raw;
    use braid_proto::block::Header;
    use std::io::Read;
    let top = tempdir();
    // More than the socket buffers hold, so the server is still sending when told the new rate.
    let content = random_bytes(32 << 20, 43);
    std::fs::write(top.path().join("f.bin"), &content).unwrap();
    let server = Server::start(top.path(), &[]);
    let mut c = Raw::login(server.addr, "anonymous", "x");
    c.expect("TYPE I", "200 Switching to Binary mode.\r\n");
    c.expect("MODE E", "200 Mode set to E.\r\n");
    c.send("OPTS BRAID ELASTIC");
    assert!(c.reply().starts_with("200 "));
    // 100 kB/s: the 32 MiB would take over five minutes at this rate.
    c.expect(
        "OPTS RETR Parallelism=2,1,2;blocksize=65536;MaxRate=100000;",
        "200 OPTS Command Successful.\r\n",
    );
    let first = c.epsv();
    let addr = first.peer_addr().unwrap();
    // Asking the sender to stop using a connection: the half-close braid's client sends. Sent
    // before RETR, so the sender sees it before its first block whatever the scheduling.
    let second = std::net::TcpStream::connect(addr).unwrap();
    second.shutdown(std::net::Shutdown::Write).unwrap();
    c.send("RETR f.bin");
    assert!(c.reply().starts_with("150 "));
    // The cap holds: a second of reading gets the first window (at most 10 segments of 64 KiB
    // on loopback, sent before pacing has anything to space) and then nothing, not the tens of
    // MiB loopback would carry.
    let mut first = first;
    let mut early = Vec::new();
    first
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 65536];
    while start.elapsed() < Duration::from_secs(1) {
        match first.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => early.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    assert!(
        early.len() < 4 << 20,
        "{} bytes in the first second",
        early.len()
    );
    // Replies to a braid client's download may be preceded by the server's 113 Sender
    // reports (what its kernel says of the sending, for the client's tuning).
    let mut reports = Vec::new();
    let mut reply = |c: &mut Raw| loop {
        let r = c.reply();
        if !r.starts_with("113 Sender sent=") {
            return r;
        }
        reports.push(r);
    };
    // Switch the congestion control while the data flows (the tuning's trial does this).
    let (_, cc) = crate::util::congestion_controls();
    c.send(&format!("OPTS RETR Congestion={cc};"));
    assert_eq!(reply(&mut c), "200 OPTS Command Successful.\r\n");
    // Lift the cap while the data flows: only possible mid-transfer on an elastic session.
    // The kernel keeps the gap it already scheduled (up to a 64 KiB segment at 50 kB/s per
    // connection), then sends at full speed.
    c.send("OPTS RETR MaxRate=0;");
    assert_eq!(reply(&mut c), "200 OPTS Command Successful.\r\n");
    first
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut file = vec![0u8; content.len()];
    let (mut eods, mut eof) = (0, None);
    let mut carried = [0u64; 2];
    for (i, mut s) in [
        Box::new(std::io::Cursor::new(early).chain(first)) as Box<dyn Read>,
        Box::new(second),
    ]
    .into_iter()
    .enumerate()
    {
        loop {
            let mut raw = [0u8; 17];
            s.read_exact(&mut raw).unwrap();
            let h = Header::decode(&raw).unwrap();
            s.read_exact(&mut file[h.offset as usize..][..h.payload() as usize])
                .unwrap();
            carried[i] += h.payload();
            if h.is_eof() {
                eof = Some(h.offset);
            }
            if h.is_eod() {
                eods += 1;
                break;
            }
        }
    }
    // Let go after the block or so it had taken before it saw the half-close (a connection
    // that kept going would carry about half the file).
    assert!(
        carried[1] <= 4 * 65536,
        "the half-closed connection carried {carried:?}"
    );
    assert!(Instant::now() < deadline, "the rate was not lifted");
    assert!(file == content, "data differs");
    assert_eq!(eof, Some(eods), "EOF counts the EODs sent");
    let r = reply(&mut c);
    assert!(r.starts_with("226 "), "{r}");
    // The transfer ran over a second with more than 64 KiB sent: a report then, and the last
    // one, sent before 226, names the congestion control switched to.
    assert!(reports.len() >= 2, "{reports:?}");
    let last = reports.last().map_or("", |r| r.trim_end());
    assert!(last.ends_with(&format!(" cc={cc}")), "{reports:?}");
}
