//! MODE E interoperability with the Globus programs: `globus-url-copy -p 4` against
//! `braid serve`, and `braid get/put -n 4` against `globus-gridftp-server`, both directions,
//! contents compared byte for byte and checksums compared by the client (ADLER32 through
//! CKSM, which that server lists in FEAT).
use crate::util::{Daemon, Server, braid, random_bytes, require, run, sbin, serve_files, tempdir};
use std::process::Command;
use std::time::Duration;

#[test]
fn globus_url_copy_against_braid_serve() {
    require("globus-url-copy");
    let content = random_bytes(20_000_003, 41);
    let (top, root, server) = serve_files(&[("src.bin", &content)], &["--anonymous-write"]);
    let base = format!("ftp://127.0.0.1:{}", server.port());
    let local = top.path().join("got.bin");
    let (ok, _, err) = run(
        Command::new("globus-url-copy").args([
            "-p",
            "4",
            &format!("{base}/src.bin"),
            &format!("file://{}", local.display()),
        ]),
        Duration::from_secs(120),
    );
    assert!(
        ok,
        "globus-url-copy download: {err}\nserver log:\n{}",
        server.log()
    );
    assert!(
        std::fs::read(&local).unwrap() == content,
        "download differs"
    );
    assert!(
        server.log().contains("mode=\"E\""),
        "not MODE E: {}",
        server.log()
    );
    let (ok, _, err) = run(
        Command::new("globus-url-copy").args([
            "-p",
            "4",
            &format!("file://{}", local.display()),
            &format!("{base}/up.bin"),
        ]),
        Duration::from_secs(120),
    );
    assert!(
        ok,
        "globus-url-copy upload: {err}\nserver log:\n{}",
        server.log()
    );
    assert!(
        std::fs::read(root.join("up.bin")).unwrap() == content,
        "upload differs"
    );
    std::fs::create_dir(root.join("sub")).unwrap();
    let (ok, out, err) = run(
        Command::new("globus-url-copy").args(["-list", &format!("{base}/")]),
        Duration::from_secs(60),
    );
    assert!(ok, "globus-url-copy -list: {err}");
    let names: Vec<&str> = out.lines().skip(1).map(str::trim).collect();
    for name in ["src.bin", "up.bin", "sub/"] {
        assert!(
            names.contains(&name),
            "{name} missing from the listing:\n{out}"
        );
    }
}

#[test]
fn globus_url_copy_reuses_data_connections_across_files() {
    // With a file list, globus-url-copy sends the next RETR/STOR without PORT/PASV and expects
    // the data connections of the previous transfer in the same direction to carry it (125).
    require("globus-url-copy");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let local = top.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let a = random_bytes(3_000_001, 51);
    let b = random_bytes(5_000_000, 52);
    std::fs::write(root.join("a.bin"), &a).unwrap();
    std::fs::write(root.join("b.bin"), &b).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let base = format!("ftp://127.0.0.1:{}", server.port());
    let l = |name: &str| format!("file://{}", local.join(name).display());
    let list = top.path().join("list");
    let lines = [
        format!("{base}/a.bin {}", l("a.bin")),
        format!("{base}/b.bin {}", l("b.bin")),
        format!("{} {base}/up-a.bin", l("a.bin")),
        format!("{} {base}/up-b.bin", l("b.bin")),
    ];
    std::fs::write(&list, lines.join("\n") + "\n").unwrap();
    let (ok, out, err) = run(
        Command::new("globus-url-copy")
            .args(["-dbg", "-p", "4", "-f"])
            .arg(&list),
        Duration::from_secs(120),
    );
    assert!(
        ok,
        "globus-url-copy -f: {err}\nserver log:\n{}",
        server.log()
    );
    let debug = format!("{out}{err}");
    let reused = debug.matches("125 Beginning transfer").count();
    let fresh = debug.matches("150 ").count();
    assert_eq!(
        (fresh, reused),
        (2, 2),
        "expected a fresh and a reused transfer per direction:\n{debug}"
    );
    assert!(
        std::fs::read(local.join("a.bin")).unwrap() == a,
        "a differs"
    );
    assert!(
        std::fs::read(local.join("b.bin")).unwrap() == b,
        "b differs"
    );
    assert!(
        std::fs::read(root.join("up-a.bin")).unwrap() == a,
        "up-a differs"
    );
    assert!(
        std::fs::read(root.join("up-b.bin")).unwrap() == b,
        "up-b differs"
    );
}

/// A globus-gridftp-server serving `home` anonymously.
pub fn start_gridftp(home: &std::path::Path) -> Daemon {
    Daemon::start("globus-gridftp-server", |port| {
        let mut c = gridftp_command(home, "ERROR");
        c.args(["-p", &port.to_string()]);
        c
    })
}

/// globus-gridftp-server serving `home` anonymously on loopback, logging at `level`.
fn gridftp_command(home: &std::path::Path, level: &str) -> Command {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".into());
    let mut c = Command::new(sbin("globus-gridftp-server"));
    c.args(["-aa", "-anonymous-user", &user, "-auth-level", "0"])
        .args([
            "-control-interface",
            "127.0.0.1",
            "-data-interface",
            "127.0.0.1",
        ])
        .arg("-home-dir")
        .arg(home)
        .args(["-allow-root", "-log-level", level]);
    c
}

#[test]
fn braid_get_and_put_against_globus_gridftp_server() {
    let top = tempdir();
    let home = top.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let content = random_bytes(20_000_003, 43);
    std::fs::write(home.join("src.bin"), &content).unwrap();
    let server = start_gridftp(&home);
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let got = top.path().join("got.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &format!("{base}/src.bin"),
            got.to_str().unwrap(),
            "-n",
            "4",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&got).unwrap() == content, "download differs");
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["mode"], "extended-block", "{s}");
    // braid compared its own ADLER32 of the file with the server's CKSM.
    assert!(
        s["checksum"].as_str().unwrap().starts_with("ADLER32 "),
        "{s}"
    );
    let (code, out, err) = braid(
        &[
            "put",
            got.to_str().unwrap(),
            &format!("{base}/up.bin"),
            "-n",
            "4",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(home.join("up.bin")).unwrap() == content,
        "upload differs"
    );
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["streams"], 4, "{s}");
    assert!(
        s["checksum"].as_str().unwrap().starts_with("ADLER32 "),
        "{s}"
    );
    // Errors from a GridFTP server map to the same exit codes.
    let (code, _, err) = braid(
        &[
            "get",
            &format!("{base}/missing"),
            top.path().join("m").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 5, "{err}");
}

/// A striped globus-gridftp-server: two data nodes (`-dn`) and a front end (`-r`) over them,
/// all serving `home` anonymously; each node logs into its own file.
fn start_striped_gridftp(home: &std::path::Path, logs: &std::path::Path) -> Vec<Daemon> {
    let level = "ERROR,WARN,INFO";
    striped_gridftp(|port, node| {
        let mut c = gridftp_command(home, level);
        c.args(["-p", &port.to_string()]);
        if let Some(i) = node {
            c.arg("-logfile").arg(logs.join(format!("dn{i}.log")));
        }
        c
    })
}

/// Two data nodes (`-dn`) and a front end (`-r`) over them, each as `server(port, node)`
/// starts it (`node`: the node's index, None for the front end): the front end first.
pub fn striped_gridftp(server: impl Fn(u16, Option<usize>) -> Command) -> Vec<Daemon> {
    let mut daemons: Vec<Daemon> = (0..2)
        .map(|i| {
            Daemon::start("globus-gridftp-server -dn", |port| {
                let mut c = server(port, Some(i));
                c.arg("-dn");
                c
            })
        })
        .collect();
    let nodes: Vec<String> = daemons
        .iter()
        .map(|d| format!("127.0.0.1:{}", d.port))
        .collect();
    let front = Daemon::start("globus-gridftp-server -r", |port| {
        let mut c = server(port, None);
        c.args(["-r", &nodes.join(",")]);
        c
    });
    daemons.insert(0, front);
    daemons
}

#[test]
fn braid_put_stripes_over_the_data_nodes_of_a_striped_globus_server() {
    require("globus-gridftp-server");
    let top = tempdir();
    let home = top.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let servers = start_striped_gridftp(&home, top.path());
    let base = format!("ftp://127.0.0.1:{}", servers[0].port);
    let content = random_bytes(20_000_003, 44);
    let local = top.path().join("local.bin");
    std::fs::write(&local, &content).unwrap();
    let (code, out, err) = braid(
        &[
            "put",
            local.to_str().unwrap(),
            &format!("{base}/up.bin"),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(home.join("up.bin")).unwrap() == content,
        "upload differs"
    );
    let v = crate::util::json(&out);
    // SPAS listed both nodes (FEAT names the remote storage interface), each took a stripe,
    // and the server's checksum of the file agreed.
    assert_eq!(v["data_nodes"], 2, "{v}");
    let sum = v["checksum"].as_str().unwrap_or_default();
    assert!(
        sum.starts_with("MD5 ") || sum.starts_with("ADLER32 "),
        "{v}"
    );
    for i in 0..2 {
        let log = std::fs::read_to_string(top.path().join(format!("dn{i}.log"))).unwrap();
        assert!(
            log.contains("Finished transferring"),
            "node {i} took no stripe: {log}"
        );
    }
}

/// A download from a striped Globus server goes to SPOR: one listener per stripe, which the
/// front end deals out to its nodes, each stripe ending with its own EOF. A tree comes too:
/// its listing from the node PASV names, its top a directory although SIZE answers for it.
#[test]
fn braid_get_stripes_from_the_data_nodes_of_a_striped_globus_server() {
    require("globus-gridftp-server");
    let top = tempdir();
    let home = top.path().join("home");
    std::fs::create_dir_all(home.join("tree/sub")).unwrap();
    let content = random_bytes(20_000_003, 45);
    std::fs::write(home.join("down.bin"), &content).unwrap();
    let small = random_bytes(300_001, 46);
    std::fs::write(home.join("tree/sub/small.bin"), &small).unwrap();
    std::fs::write(home.join("tree/top.bin"), &content[..5_000_000]).unwrap();
    let servers = start_striped_gridftp(&home, top.path());
    let base = format!("ftp://127.0.0.1:{}", servers[0].port);
    let got = top.path().join("got.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &format!("{base}/down.bin"),
            got.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&got).unwrap() == content, "download differs");
    let v = crate::util::json(&out);
    // Four stripes, one connection each, dealt out to both nodes; the server's checksum
    // agreed with the file received.
    assert_eq!(v["streams"], 4, "{v}");
    assert_eq!(v["new_data_connections"], 4, "{v}");
    let sum = v["checksum"].as_str().unwrap_or_default();
    assert!(
        sum.starts_with("MD5 ") || sum.starts_with("ADLER32 "),
        "{v}"
    );
    // Each node sent a stripe (a node logs the file it moves).
    for i in 0..2 {
        crate::util::wait_for_text(&top.path().join(format!("dn{i}.log")), "down.bin", 1);
    }
    let local = top.path().join("copy");
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            &format!("{base}/tree"),
            local.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(std::fs::read(local.join("tree/sub/small.bin")).unwrap() == small);
    assert!(std::fs::read(local.join("tree/top.bin")).unwrap() == content[..5_000_000]);
}

/// A striped download from Globus stopped part way (its nodes frozen, then Ctrl-C) goes on
/// with `--resume` from what it kept, and ends whole: on one stripe, since Globus sends
/// nothing of some stripes when REST names ranges already here.
#[test]
fn a_striped_download_from_globus_stopped_part_way_resumes_whole() {
    use crate::util::{Stderr, braid_command, signal_process, wait_timeout};
    use rustix::process::Signal;
    use std::os::unix::fs::MetadataExt;
    use std::time::Instant;
    require("globus-gridftp-server");
    let top = tempdir();
    let home = top.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let content = random_bytes(192 << 20, 47);
    std::fs::write(home.join("big.bin"), &content).unwrap();
    let servers = start_striped_gridftp(&home, top.path());
    let url = format!("ftp://127.0.0.1:{}/big.bin", servers[0].port);
    let got = top.path().join("got.bin");
    let mut child = braid_command(top.path())
        .args(["get", &url, got.to_str().unwrap(), "-v"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Stderr::follow(&mut child);
    // Frozen once 8 MiB are written here: the nodes (and their children) stop sending.
    let part = top.path().join("got.bin.part");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::metadata(&part).is_ok_and(|m| m.blocks() * 512 > 8 << 20)
        && Instant::now() < deadline
        && child.try_wait().unwrap().is_none()
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    for node in &servers[1..] {
        node.signal(Signal::STOP);
    }
    let done_early = child.try_wait().unwrap().is_some();
    signal_process(child.id(), Signal::INT);
    let aborted = stderr.wait_for("> ABOR", Duration::from_secs(30));
    for node in &servers[1..] {
        node.signal(Signal::CONT);
    }
    assert!(aborted, "no ABOR after Ctrl-C");
    let status = wait_timeout(&mut child, Duration::from_secs(30)).expect("braid hung");
    assert!(!done_early, "the download ended before it could be stopped");
    assert_eq!(status.code(), Some(7));
    let (code, out, err) = braid(
        &["get", &url, got.to_str().unwrap(), "--resume", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&got).unwrap() == content, "download differs");
    let v = crate::util::json(&out);
    let resumed = v["resumed_from"].as_u64().unwrap_or_default();
    assert!(resumed > 0 && resumed < content.len() as u64, "{v}");
}
