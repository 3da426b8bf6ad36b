//! Running `braid serve` as an admin does: a config file, SIGHUP reloads, log lines a program
//! reads, Prometheus metrics.
use crate::util::{
    BRAID, Raw, Server, add_account, braid, random_bytes, require, run, serve_files,
    signal_process, tempdir,
};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Waits (at most 20 s) until the server's log has a line with `what`.
fn wait_for_log(server: &Server, what: &str) {
    wait_for_logged(server, what, 1);
}

/// Waits until `what` is in the server's log `times` times.
fn wait_for_logged(server: &Server, what: &str, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.log().matches(what).count() < times {
        assert!(
            Instant::now() < deadline,
            "no {what:?} in the log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `braid ls` as `user`, the password from the environment; true if it listed.
fn lists_as(server: &Server, user: &str, password: &str) -> bool {
    let url = format!("ftp://{user}@{}/", server.addr);
    braid(&["ls", &url], &[("BRAID_PASSWORD", password)]).0 == 0
}

#[test]
fn a_config_file_sets_the_server_up_and_a_mistake_names_its_line() {
    let top = tempdir();
    let files = top.path().join("files");
    std::fs::create_dir(&files).unwrap();
    std::fs::write(files.join("a.txt"), "hello\n").unwrap();
    let config = top.path().join("braid.toml");
    // A relative root is taken from the file's directory; the command line's --listen and
    // --root (from Server::start) win, so the root is given again there.
    std::fs::write(
        &config,
        "root = \"files\"\nanonymous-write = true\nmax-per-ip = 1\n",
    )
    .unwrap();
    let server = Server::start(&files, &["--config", config.to_str().unwrap()]);
    // anonymous-write from the file: an upload works.
    let local = top.path().join("up.txt");
    std::fs::write(&local, "up\n").unwrap();
    let (code, _, err) = braid(
        &["put", local.to_str().unwrap(), &server.url("up.txt")],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(files.join("up.txt")).unwrap(), b"up\n");
    // max-per-ip = 1 from the file: a second connection from this address is turned away.
    // The first may have to wait until the server has seen the upload's session end.
    let greeting = || {
        let mut reply = String::new();
        use std::io::BufRead;
        let stream = std::net::TcpStream::connect(server.addr).unwrap();
        std::io::BufReader::new(stream.try_clone().unwrap())
            .read_line(&mut reply)
            .unwrap();
        (stream, reply)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let _first = loop {
        let (stream, reply) = greeting();
        if reply.starts_with("220 ") {
            break stream;
        }
        assert!(Instant::now() < deadline, "never admitted: {reply}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (_, reply) = greeting();
    assert!(
        reply.starts_with("421 ") && reply.contains("limit 1"),
        "{reply}"
    );

    // Mistakes stop the server from starting, naming the file, the line and the key.
    for (text, expect) in [
        (
            "anonymous = true\nmax-per-ip = 4\nlisten-on = \"0.0.0.0:21\"\n",
            "line 3",
        ),
        ("idle-timeout = \"long\"\n", "line 1"),
        ("passive-ports = \"60000-50000\"\n", "LOW <= HIGH"),
        ("tls-cert = \"cert.pem\"\n", "tls-key"),
    ] {
        std::fs::write(&config, text).unwrap();
        let (ok, _, err) = run(
            Command::new(BRAID)
                .args(["serve", "--listen", "127.0.0.1:0", "--config"])
                .arg(&config),
            Duration::from_secs(20),
        );
        assert!(!ok, "started with {text:?}");
        assert!(err.contains(expect), "{text:?}: {err}");
        if expect.starts_with("line") {
            assert!(err.contains("braid.toml"), "{err}");
        }
    }
    let (ok, _, err) = run(
        Command::new(BRAID)
            .args(["serve", "--config"])
            .arg(top.path().join("none.toml")),
        Duration::from_secs(20),
    );
    assert!(!ok && err.contains("none.toml"), "{err}");
}

#[test]
fn sighup_reloads_accounts_and_settings_without_dropping_sessions() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let users = top.path().join("users");
    add_account(&users, "alice", &root, "alice-pw", false);
    let config = top.path().join("braid.toml");
    std::fs::write(&config, "users = \"users\"\n").unwrap();
    let server = Server::start(&root, &["--config", config.to_str().unwrap()]);
    let mut alice = Raw::login(server.addr, "alice", "alice-pw");
    assert!(!lists_as(&server, "bob", "bob-pw"));
    assert!(
        !lists_as(&server, "anonymous", "x"),
        "no anonymous login with users"
    );

    // Bob is added and anonymous login allowed; SIGHUP takes both in.
    add_account(&users, "bob", &root, "bob-pw", false);
    std::fs::write(&config, "users = \"users\"\nanonymous = true\n").unwrap();
    signal_process(server.pid(), rustix::process::Signal::HUP);
    wait_for_log(&server, "configuration reloaded");
    assert!(lists_as(&server, "bob", "bob-pw"));
    assert!(lists_as(&server, "anonymous", "x"));
    // Alice's session, opened before, goes on.
    alice.expect("NOOP", "200 NOOP ok.\r\n");

    // A broken file changes nothing: the error is logged and the server keeps serving.
    std::fs::write(&config, "users = \"users\"\nanonymous = maybe\n").unwrap();
    signal_process(server.pid(), rustix::process::Signal::HUP);
    wait_for_log(&server, "reload failed");
    assert!(server.log().contains("line 2"), "{}", server.log());
    assert!(lists_as(&server, "bob", "bob-pw"));
    assert!(lists_as(&server, "anonymous", "x"));
    alice.expect("NOOP", "200 NOOP ok.\r\n");
}

/// The JSON lines of a log, each parsed; a line that is not JSON fails the test.
fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn json_log_lines_describe_transfers_and_refusals() {
    let content = random_bytes(3 << 20, 81);
    let (top, _root, server) = serve_files(&[("f.bin", &content)], &["--log-format", "json"]);
    let dest = top.path().join("got.bin");
    let (code, _, err) = braid(
        &[
            "get",
            &server.url("f.bin"),
            dest.to_str().unwrap(),
            "-n",
            "3",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = braid(
        &["get", &server.url("missing.bin"), dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 5);
    wait_for_log(&server, "\"refused\"");
    // The client leaves without waiting for QUIT's answer: the server logs the session's end
    // when it sees the connection close, which can come after the client has exited.
    wait_for_logged(&server, "\"disconnected\"", 2);
    let lines = json_lines(&server.log());
    let transfer = lines
        .iter()
        .find(|l| l["message"] == "transfer")
        .unwrap_or_else(|| panic!("no transfer line: {lines:?}"));
    assert_eq!(transfer["bytes"], content.len(), "{transfer}");
    assert_eq!(transfer["path"], "/f.bin");
    assert_eq!(transfer["direction"], "download");
    assert_eq!(transfer["mode"], "E");
    // The connections the transfer used: on a busy machine the first of the three can carry
    // all 3 MiB before the server takes the others from its backlog.
    let used = transfer["data_connections"].as_u64().unwrap();
    assert!((1..=3).contains(&used), "{transfer}");
    assert_eq!(transfer["outcome"], "complete");
    assert_eq!(transfer["user"], "anonymous");
    assert!(transfer["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    let secs = transfer["seconds"].as_f64().unwrap();
    let rate = transfer["megabytes_per_second"].as_f64().unwrap();
    assert!(secs > 0.0 && rate > 0.0, "{transfer}");
    let refused = lines
        .iter()
        .find(|l| l["message"] == "refused" && l["command"] == "RETR")
        .unwrap_or_else(|| panic!("no refused RETR: {lines:?}"));
    assert_eq!(refused["code"], 550, "{refused}");
    assert!(refused["reply"].as_str().unwrap().contains("missing.bin"));
    // Each session's end says whose it was and how long it lasted.
    let ends: Vec<_> = lines
        .iter()
        .filter(|l| l["message"] == "disconnected")
        .collect();
    assert_eq!(ends.len(), 2, "{lines:?}");
    for end in ends {
        assert_eq!(end["user"], "anonymous", "{end}");
        let secs = end["seconds"].as_f64().unwrap();
        assert!(secs > 0.0 && secs < 60.0, "{end}");
    }
}

#[test]
fn rust_log_sets_the_level() {
    let top = tempdir();
    // Info lines by default: a login shows, commands do not.
    let err = run_server_briefly(top.path(), None);
    assert!(
        err.contains("logged in") && !err.contains("< USER"),
        "{err}"
    );
    let err = run_server_briefly(top.path(), Some("warn"));
    assert!(
        !err.contains("logged in"),
        "RUST_LOG=warn kept an info line: {err}"
    );
    let err = run_server_briefly(top.path(), Some("debug"));
    assert!(
        err.contains("< USER anonymous"),
        "RUST_LOG=debug shows commands: {err}"
    );
}

/// Starts a server with RUST_LOG set to `level` (or unset), logs in once with `braid ls`,
/// stops it with SIGTERM; what it logged.
fn run_server_briefly(root: &Path, level: Option<&str>) -> String {
    let log = tempdir();
    let err_path = log.path().join("err");
    let mut serve = Command::new(BRAID);
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap());
    if let Some(level) = level {
        serve.env("RUST_LOG", level);
    }
    let mut child = serve.spawn().unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("ftp://")
        .nth(1)
        .map(|a| a.trim().trim_end_matches('/').to_string());
    let listed = addr.map(|a| braid(&["ls", &format!("ftp://{a}/")], &[]));
    signal_process(child.id(), rustix::process::Signal::TERM);
    if crate::util::wait_timeout(&mut child, Duration::from_secs(20)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    let (code, _, e) = listed.unwrap_or_else(|| panic!("no address in {line:?}: {err}"));
    assert_eq!(code, 0, "{e}");
    err
}

/// One series' value in a scrape.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn scrape(server: &Server) -> String {
    let url = format!("http://{}/metrics", server.metrics.unwrap());
    let (ok, out, err) = run(
        Command::new("curl").args(["-sSf", &url]),
        Duration::from_secs(20),
    );
    assert!(ok, "curl {url}: {err}");
    out
}

#[test]
fn metrics_are_scraped_during_and_after_a_transfer() {
    require("curl");
    let (top, _root, server) = serve_files(&[], &["--metrics", "127.0.0.1:0", "--anonymous-write"]);
    let before = scrape(&server);
    assert_eq!(metric(&before, "braid_sessions"), Some(0.0), "{before}");
    // curl uploads what the test writes to its stdin: the transfer runs until stdin closes.
    let mut upload = Command::new("curl")
        .args(["-sS", "-T", "-", &server.url("up.bin")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = upload.stdin.take().unwrap();
    use std::io::Write;
    let half = random_bytes(1 << 20, 82);
    stdin.write_all(&half).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let during = loop {
        let text = scrape(&server);
        if metric(&text, "braid_transferred_bytes_total{direction=\"upload\"}").unwrap_or(0.0) > 0.0
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the upload never counted: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(metric(&during, "braid_sessions"), Some(1.0), "{during}");
    let running = "braid_transfers_in_progress{direction=\"upload\"}";
    assert_eq!(metric(&during, running), Some(1.0), "{during}");
    assert_eq!(
        metric(&during, "braid_data_connections"),
        Some(1.0),
        "{during}"
    );
    stdin.write_all(&half).unwrap();
    drop(stdin);
    let (code, err) = crate::util::finish_child(upload, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    let size = 2.0 * half.len() as f64;
    // A download in MODE E, and a wrong password.
    let dest = top.path().join("got.bin");
    let (code, _, err) = braid(
        &[
            "get",
            &server.url("up.bin"),
            dest.to_str().unwrap(),
            "-n",
            "2",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let url = format!("ftp://nobody@{}/", server.addr);
    assert_eq!(braid(&["ls", &url], &[("BRAID_PASSWORD", "x")]).0, 4);
    let after = scrape(&server);
    for way in ["upload", "download"] {
        let moved = format!("braid_transferred_bytes_total{{direction=\"{way}\"}}");
        assert_eq!(metric(&after, &moved), Some(size), "{after}");
        let user =
            format!("braid_user_transferred_bytes_total{{user=\"anonymous\",direction=\"{way}\"}}");
        assert_eq!(metric(&after, &user), Some(size), "{after}");
        let done = format!("braid_transfers_total{{direction=\"{way}\",outcome=\"complete\"}}");
        assert_eq!(metric(&after, &done), Some(1.0), "{after}");
        let running = format!("braid_transfers_in_progress{{direction=\"{way}\"}}");
        assert_eq!(metric(&after, &running), Some(0.0), "{after}");
    }
    assert_eq!(
        metric(&after, "braid_data_connections"),
        Some(0.0),
        "{after}"
    );
    assert_eq!(
        metric(&after, "braid_login_failures_total"),
        Some(1.0),
        "{after}"
    );
    // Anything but /metrics is not found.
    let url = format!("http://{}/other", server.metrics.unwrap());
    let (ok, _, err) = run(
        Command::new("curl").args(["-sSf", &url]),
        Duration::from_secs(20),
    );
    assert!(!ok && err.contains("404"), "{err}");
}

/// contrib/braid.toml, the sample the systemd unit reads, starts a server as it is (with the
/// address, root and metrics port moved for the test).
#[test]
fn the_sample_config_starts_a_server() {
    require("curl");
    let top = tempdir();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/braid.toml");
    let server = Server::start(
        top.path(),
        &["--config", sample, "--metrics", "127.0.0.1:0"],
    );
    assert!(lists_as(&server, "anonymous", "x"));
    assert_eq!(metric(&scrape(&server), "braid_sessions"), Some(0.0));
}

/// Sessions logged in to the same root share its descriptor: a session costs the server one
/// descriptor (its control connection), so 10,000 idle sessions fit under the usual limit of
/// 20,000 open files (bench/idle_sessions.py). They took two each.
#[test]
fn sessions_share_their_root_directory() {
    let top = tempdir();
    let server = Server::start(top.path(), &["--max-per-ip", "32"]);
    let open = || {
        std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
            .unwrap()
            .count()
    };
    let before = open();
    let sessions: Vec<Raw> = (0..20)
        .map(|_| Raw::login(server.addr, "anonymous", "x"))
        .collect();
    let grown = open() - before;
    assert!(
        (20..30).contains(&grown),
        "{grown} descriptors for 20 sessions"
    );
    drop(sessions);
}
