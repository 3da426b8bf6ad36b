//! A striped server: a front end (`--data-nodes`) and its data nodes (`--data-node`), each on
//! its own loopback address (127.0.0.11, .12, ...), all serving one shared directory; the
//! client on 127.0.0.1. The nodes move the data; the front end only gives orders.
use crate::util::{
    Raw, Server, Stderr, add_account, braid_command, json, random_bytes, run, tempdir,
    wait_for_recorded_range,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use std::time::{Duration, Instant};

const KEY: &str = "striped-test-key-0123456789";

struct Striped {
    front: Server,
    nodes: Vec<Server>,
    shared: PathBuf,
}

fn striped(top: &Path, n: usize) -> Striped {
    striped_with(top, n, &[])
}

/// The same, every server started with `extra` too (TLS's certificate, say).
fn striped_with(top: &Path, n: usize, extra: &[&str]) -> Striped {
    let shared = top.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let key = top.join("node.key");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    let key = key.to_str().unwrap();
    let nodes: Vec<Server> = (0..n)
        .map(|i| {
            let at = format!("127.0.0.{}:0", 11 + i);
            let mut args = vec!["--data-node", "--node-key", key];
            args.extend(extra);
            Server::start_at(&at, &shared, &args)
        })
        .collect();
    let list: Vec<String> = nodes.iter().map(|s| s.addr.to_string()).collect();
    let users = top.join("users");
    add_account(&users, "alice", &shared, "secret", true);
    let list = list.join(",");
    let mut args = vec![
        "--users",
        users.to_str().unwrap(),
        "--data-nodes",
        &list,
        "--node-key",
        key,
    ];
    args.extend(extra);
    let front = Server::start_at("127.0.0.1:0", &shared, &args);
    Striped {
        front,
        nodes,
        shared,
    }
}

impl Striped {
    fn url(&self, path: &str) -> String {
        format!("ftp://alice:secret@{}/{path}", self.front.addr)
    }

    /// `braid get|put` with `args` around the URL, running in the background.
    fn spawn(&self, home: &Path, op: &str, args: &[&str]) -> Child {
        braid_command(home)
            .arg(op)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Whether each node's log shows a complete transfer of its stripe that way.
    fn each_node_moved(&self, direction: &str) {
        for (i, n) in self.nodes.iter().enumerate() {
            let log = n.log();
            assert!(
                log.lines().any(|l| l.contains("user=\"braid-node\"")
                    && l.contains(&format!("direction=\"{direction}\""))
                    && l.contains("outcome=\"complete\"")),
                "node {i} moved no stripe ({direction}): {log}"
            );
        }
    }
}

/// Waits (bounded) until `path` is at least `len` bytes long.
fn wait_for_len(path: &Path, len: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(path).map_or(0, |m| m.len()) < len {
        assert!(
            Instant::now() < deadline,
            "{} never reached {len} bytes",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn one_two_and_four_data_nodes_each_move_their_stripes_both_ways() {
    for n in [1, 2, 4] {
        let top = tempdir();
        let s = striped(top.path(), n);
        // Six stripe blocks of 4 MiB and a tail: every node has one at least.
        let data = random_bytes((24 << 20) + 12_345, 70 + n as u64);
        std::fs::write(s.shared.join("src.bin"), &data).unwrap();
        let home = tempdir();
        let dest = home.path().join("got.bin");
        let (ok, out, err) = run(
            braid_command(home.path())
                .args(["get", &s.url("src.bin")])
                .arg(&dest)
                .arg("--json"),
            Duration::from_secs(120),
        );
        assert!(ok, "{n} nodes, get: {err}");
        assert!(
            std::fs::read(&dest).unwrap() == data,
            "{n} nodes: the download differs"
        );
        let v = json(&out);
        assert_eq!(v["data_nodes"], n, "{v}");
        assert_eq!(v["mode"], "extended-block", "{v}");
        assert!(
            v["checksum"]
                .as_str()
                .is_some_and(|c| c.starts_with("XXH3 ")),
            "{v}"
        );
        s.each_node_moved("download");
        // The front end moved no data itself: its transfer line names no data connection.
        assert!(
            s.front.log().contains("direction=\"download\" mode=\"E\"")
                && s.front.log().contains("data_connections=0"),
            "{}",
            s.front.log()
        );

        let (ok, out, err) = run(
            braid_command(home.path())
                .arg("put")
                .arg(&dest)
                .arg(s.url("up.bin"))
                .arg("--json"),
            Duration::from_secs(120),
        );
        assert!(ok, "{n} nodes, put: {err}");
        assert!(
            std::fs::read(s.shared.join("up.bin")).unwrap() == data,
            "{n} nodes: the upload differs"
        );
        assert_eq!(json(&out)["data_nodes"], n, "{out}");
        s.each_node_moved("upload");
        let left: Vec<_> = std::fs::read_dir(&s.shared)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains("braid-part"))
            .collect();
        assert!(left.is_empty(), "partials left behind: {left:?}");
    }
}

/// Under TLS (PROT P) the nodes still move the stripes: each shows the front end's
/// certificate, the front end orders them over TLS, and every data connection is TLS bound to
/// the client's session with the front end.
#[test]
fn under_tls_the_data_nodes_move_private_stripes_bound_to_the_clients_session() {
    let top = tempdir();
    let (cert, key) = crate::util::openssl_certificate(
        top.path(),
        "site",
        "IP:127.0.0.1,IP:127.0.0.11,IP:127.0.0.12",
    );
    let s = striped_with(top.path(), 2, &["--tls-cert", &cert, "--tls-key", &key]);
    let data = random_bytes((12 << 20) + 777, 81);
    std::fs::write(s.shared.join("src.bin"), &data).unwrap();
    let home = tempdir();
    let dest = home.path().join("got.bin");
    let tls = ["--tls", "--tls-ca", cert.as_str(), "--json"];
    let (ok, out, err) = run(
        braid_command(home.path())
            .args(["get", &s.url("src.bin")])
            .arg(&dest)
            .args(tls),
        Duration::from_secs(120),
    );
    assert!(ok, "get: {err}");
    assert!(
        std::fs::read(&dest).unwrap() == data,
        "the download differs"
    );
    let v = json(&out);
    assert_eq!(v["data_nodes"], 2, "{v}");
    let shaken = |v: &serde_json::Value| {
        v["tls_handshakes"]["full"].as_u64().unwrap_or(0)
            + v["tls_handshakes"]["resumed"].as_u64().unwrap_or(0)
    };
    assert!(shaken(&v) >= 2, "no TLS on the nodes' connections: {v}");
    s.each_node_moved("download");
    let (ok, out, err) = run(
        braid_command(home.path())
            .arg("put")
            .arg(&dest)
            .arg(s.url("up.bin"))
            .args(tls),
        Duration::from_secs(120),
    );
    assert!(ok, "put: {err}");
    assert!(
        std::fs::read(s.shared.join("up.bin")).unwrap() == data,
        "the upload differs"
    );
    let v = json(&out);
    assert_eq!(v["data_nodes"], 2, "{v}");
    assert!(shaken(&v) >= 2, "no TLS on the nodes' connections: {v}");
    s.each_node_moved("upload");
    // The front end's orders went over TLS: each node's session was private.
    for n in &s.nodes {
        assert!(
            n.log().contains("control connection now uses TLS"),
            "{}",
            n.log()
        );
    }
}

/// Paced to 8 MB/s, a 32 MiB file takes four seconds: a node killed once 12 MiB are at
/// their places dies with most of the file still to come.
const PACED: [&str; 3] = ["--rate-limit", "8MB", "--json"];

#[test]
fn a_data_node_killed_mid_download_leaves_its_stripes_to_the_other() {
    let top = tempdir();
    let mut s = striped(top.path(), 2);
    let data = random_bytes(32 << 20, 77);
    std::fs::write(s.shared.join("big.bin"), &data).unwrap();
    let home = tempdir();
    let dest = home.path().join("big.bin");
    let url = s.url("big.bin");
    let mut child = s.spawn(
        home.path(),
        "get",
        &[&[url.as_str(), dest.to_str().unwrap()], &PACED[..]].concat(),
    );
    let err = Stderr::follow(&mut child);
    // Blocks land at their offsets: past 12 MiB, both nodes are into their stripes.
    wait_for_len(&home.path().join("big.bin.part"), 12 << 20);
    drop(s.nodes.pop());
    let (code, text) = err.finish(child, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{text}");
    assert!(
        std::fs::read(&dest).unwrap() == data,
        "the download differs"
    );
    assert!(
        text.contains("Stripes failed: 1") && text.contains("still missing"),
        "the node's death went unnoticed: {text}"
    );
}

/// A striped upload whose client is killed outright: the front end passed on what its nodes'
/// markers said they stored, the client recorded it, and `--resume` sends only the rest.
#[test]
fn a_striped_upload_whose_client_is_killed_resumes_with_what_the_nodes_stored() {
    use crate::util::{signal_process, upload_record};
    let top = tempdir();
    let s = striped(top.path(), 2);
    let home = tempdir();
    let src = home.path().join("up.bin");
    let data = random_bytes(32 << 20, 79);
    std::fs::write(&src, &data).unwrap();
    let url = s.url("up.bin");
    // At 4 MB/s, 8 s: the nodes' first markers come after 5 s.
    let mut child = s.spawn(
        home.path(),
        "put",
        &[src.to_str().unwrap(), url.as_str(), "--rate-limit", "4MB"],
    );
    let state = home.path().join(".local/state");
    let deadline = Instant::now() + Duration::from_secs(60);
    while upload_record(&state).is_none_or(|r| r.is_empty()) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the upload ended first"
        );
        assert!(
            Instant::now() < deadline,
            "no stored range was ever recorded"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    signal_process(child.id(), rustix::process::Signal::KILL);
    let _ = child.wait();
    let recorded = upload_record(&state).unwrap();
    assert!(
        !s.shared.join("up.bin").exists(),
        "a killed upload took its name"
    );
    // The front end has seen its client go once its transfer is logged.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.front.log().contains("direction=\"upload\"") {
        assert!(Instant::now() < deadline, "{}", s.front.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (ok, out, err) = run(
        braid_command(home.path()).args(["put", src.to_str().unwrap(), &url, "--resume", "--json"]),
        Duration::from_secs(120),
    );
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["resumed_from"], recorded.len(), "{v}");
    assert_eq!(v["data_nodes"], 2, "{v}");
    assert!(
        std::fs::read(s.shared.join("up.bin")).unwrap() == data,
        "the resumed upload differs"
    );
    assert_eq!(
        upload_record(&state),
        None,
        "the record outlived the upload"
    );
}

#[test]
fn a_data_node_killed_mid_upload_leaves_its_stripes_to_the_other() {
    let top = tempdir();
    let mut s = striped(top.path(), 2);
    let home = tempdir();
    let src = home.path().join("up.bin");
    let data = random_bytes(32 << 20, 78);
    std::fs::write(&src, &data).unwrap();
    let url = s.url("up.bin");
    let mut child = s.spawn(
        home.path(),
        "put",
        &[&[src.to_str().unwrap(), url.as_str()], &PACED[..]].concat(),
    );
    let err = Stderr::follow(&mut child);
    // The nodes write into the front end's partial, at the blocks' offsets.
    wait_for_len(&s.shared.join(".up.bin.braid-part"), 12 << 20);
    drop(s.nodes.pop());
    let (code, text) = err.finish(child, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{text}");
    assert!(
        std::fs::read(s.shared.join("up.bin")).unwrap() == data,
        "the upload differs"
    );
    assert!(
        text.contains("Stripes failed: 1") && text.contains("failed stripes"),
        "the node's death went unnoticed: {text}"
    );
}

#[test]
fn a_striped_download_cut_off_resumes_with_what_arrived() {
    let top = tempdir();
    let s = striped(top.path(), 2);
    let data = random_bytes(16 << 20, 79);
    std::fs::write(s.shared.join("f.bin"), &data).unwrap();
    let home = tempdir();
    let dest = home.path().join("f.bin");
    let url = s.url("f.bin");
    let mut child = s.spawn(
        home.path(),
        "get",
        &[&url, dest.to_str().unwrap(), "--rate-limit", "2MB"],
    );
    wait_for_recorded_range(&home.path().join("f.bin.part.braid"));
    let _ = child.kill();
    let _ = child.wait();
    let (ok, out, err) = run(
        braid_command(home.path())
            .args(["get", &s.url("f.bin")])
            .arg(&dest)
            .args(["--resume", "--json"]),
        Duration::from_secs(120),
    );
    assert!(ok, "{err}");
    assert!(
        std::fs::read(&dest).unwrap() == data,
        "the resumed download differs"
    );
    let v = json(&out);
    assert!(
        v["resumed_from"].as_u64().unwrap() > 0,
        "nothing was kept: {v}"
    );
    assert_eq!(
        v["resumed_from"].as_u64().unwrap() + v["bytes"].as_u64().unwrap(),
        data.len() as u64,
        "{v}"
    );
}

#[test]
fn a_data_node_takes_orders_only_from_its_front_end_and_data_only_from_the_client_named() {
    let top = tempdir();
    let s = striped(top.path(), 1);
    let node = &s.nodes[0];
    // No anonymous login, no other password.
    let mut r = Raw::connect(node.addr);
    r.send("USER anonymous");
    let refused = r.reply();
    assert!(
        refused.starts_with("530"),
        "anonymous may log in to a data node: {refused}"
    );
    let mut r = Raw::connect(node.addr);
    r.send("USER braid-node");
    let _ = r.reply();
    r.send("PASS not-the-key-at-all");
    assert!(r.reply().starts_with("530"), "a wrong key logged in");
    // A server that is no data node takes no orders.
    let mut f = Raw::login(s.front.addr, "alice", "secret");
    f.send("OPTS BRAID NODE Client=127.0.0.1;Stripe=0/1;Block=4194304");
    assert!(
        f.reply().starts_with("504"),
        "the front end took a node's order"
    );
    // The node's data connections come from the client named in the order, no one else.
    let mut n = Raw::login(node.addr, "braid-node", KEY);
    for cmd in [
        "TYPE I",
        "MODE E",
        "OPTS BRAID NODE Client=127.0.0.99;Stripe=0/1;Block=4194304",
    ] {
        n.send(cmd);
        let r = n.reply();
        assert!(r.starts_with("200"), "{cmd}: {r}");
    }
    std::fs::write(s.shared.join("x.bin"), random_bytes(1 << 20, 80)).unwrap();
    let _stranger = n.epsv();
    n.send("RETR x.bin");
    let _ = n.reply();
    node.wait_for_log("refused data connection from 127.0.0.1", 1);
}

#[test]
fn globus_url_copy_with_stripe_sends_into_the_nodes_and_fetches_through_the_front_end() {
    crate::util::require("globus-url-copy");
    let top = tempdir();
    let s = striped(top.path(), 2);
    let data = random_bytes(20_000_003, 81);
    let local = top.path().join("local.bin");
    std::fs::write(&local, &data).unwrap();
    let url = s.url("g.bin");
    let (ok, _, err) = run(
        std::process::Command::new("globus-url-copy").args([
            "-stripe",
            "-p",
            "2",
            &format!("file://{}", local.display()),
            &url,
        ]),
        Duration::from_secs(120),
    );
    assert!(
        ok,
        "globus-url-copy -stripe upload: {err}\n{}",
        s.front.log()
    );
    assert!(
        std::fs::read(s.shared.join("g.bin")).unwrap() == data,
        "the upload differs"
    );
    // SPAS listed the nodes: globus-url-copy connected to each and sent each its EOF.
    s.each_node_moved("upload");
    // A download with -stripe gives SPOR one address: the front end sends it itself.
    let back = top.path().join("back.bin");
    let (ok, _, err) = run(
        std::process::Command::new("globus-url-copy").args([
            "-stripe",
            "-p",
            "2",
            &url,
            &format!("file://{}", back.display()),
        ]),
        Duration::from_secs(120),
    );
    assert!(
        ok,
        "globus-url-copy -stripe download: {err}\n{}",
        s.front.log()
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the download differs"
    );
}
