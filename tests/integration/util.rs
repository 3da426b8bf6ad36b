//! Helpers: a `braid serve` child process on a free loopback port that dies with the test,
//! a raw control connection for byte-exact dialogues, and checks for external programs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BRAID: &str = env!("CARGO_BIN_EXE_braid");

/// Fails the test with a plain message when a program it needs is missing.
pub fn require(program: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "this test needs `{program}`, which is not installed: run ./scripts/test, which installs it"
    );
}

/// A `braid serve` process, killed when dropped (also when the test panics).
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    pub root: PathBuf,
    /// Where `--metrics` serves, when it was given.
    pub metrics: Option<SocketAddr>,
    stderr_log: PathBuf,
}

impl Server {
    pub fn start(root: &Path, extra: &[&str]) -> Server {
        Server::start_at("127.0.0.1:0", root, extra)
    }

    /// A server on another loopback address (127.0.0.2, ...): its data connections then come
    /// from an address that is not the client's.
    pub fn start_at(listen: &str, root: &Path, extra: &[&str]) -> Server {
        Server::start_in(Command::new(BRAID), listen, root, extra)
    }

    /// A server in a lab's host (`ip netns exec`, which becomes the server: killing it kills
    /// the server), listening on that host's address.
    pub fn start_in_lab(
        lab: &str,
        host: &str,
        listen: &str,
        root: &Path,
        extra: &[&str],
    ) -> Server {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &braid::lab::hosts::namespace(lab, host),
            BRAID,
        ]);
        Server::start_in(cmd, listen, root, extra)
    }

    fn start_in(mut cmd: Command, listen: &str, root: &Path, extra: &[&str]) -> Server {
        let log_dir = tempfile::tempdir().expect("temp dir").keep();
        let stderr_log = log_dir.join("serve.log");
        let mut child = cmd
            .args(["serve", "--listen", listen, "--root"])
            .arg(root)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log).expect("log file"))
            .spawn()
            .expect("start braid serve");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        let mut stdout = BufReader::new(stdout);
        stdout.read_line(&mut line).expect("read startup line");
        // The metrics address comes on a line of its own, after the FTP one.
        let metrics = extra.contains(&"--metrics").then(|| {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("read the metrics line");
            line.split("http://")
                .nth(1)
                .and_then(|r| r.trim().trim_end_matches("/metrics").parse().ok())
                .unwrap_or_else(|| panic!("no metrics address in {line:?}"))
        });
        let addr = line
            .split("ftp://")
            .nth(1)
            .and_then(|r| r.trim().trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!(
                    "braid serve did not print its address; stdout: {line:?}, log: {}",
                    std::fs::read_to_string(&stderr_log).unwrap_or_default()
                )
            });
        Server {
            child,
            addr,
            root: root.to_path_buf(),
            metrics,
            stderr_log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("ftp://{}/{}", self.addr, path)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the process, returning its exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal_process(self.child.id(), rustix::process::Signal::TERM);
        let status = wait_timeout(&mut self.child, Duration::from_secs(20));
        status.unwrap_or_else(|| {
            let _ = self.child.kill();
            panic!("braid serve did not exit after SIGTERM");
        })
    }
}

/// Signals one process by pid. A direct syscall, not the `kill` program: an argument it
/// misreads can turn into kill(-1), which takes down everything the user owns.
pub fn signal_process(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Signals every process in the group led by `leader` (a child spawned with `process_group(0)`).
pub fn signal_group(leader: u32, signal: rustix::process::Signal) {
    // Group 1 would mean kill(-1): every process we may signal.
    if leader <= 1 {
        return;
    }
    if let Some(pid) = i32::try_from(leader)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// A program from sbin (not always on PATH) or bin; the test fails plainly when it is missing.
pub fn sbin(program: &str) -> PathBuf {
    let found = ["/usr/sbin", "/sbin", "/usr/bin"]
        .iter()
        .map(|d| Path::new(d).join(program))
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        require(program);
        unreachable!("require panics when the program is missing")
    })
}

/// A server program nobody here wrote, on a free loopback port, in its own process group so
/// that its per-session children die with it when this is dropped.
pub struct Daemon {
    child: Child,
    pub port: u16,
}

impl Daemon {
    /// Starts `command(port)` and waits until it listens. Another test may take the port
    /// first, so up to five ports are tried.
    pub fn start(name: &str, mut command: impl FnMut(u16) -> Command) -> Daemon {
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("free port")
                .port();
            let mut child = command(port)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Daemon { child, port };
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break; // port taken meanwhile: try another
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            signal_group(child.id(), rustix::process::Signal::KILL);
            let _ = child.wait();
        }
        panic!("{name} did not start");
    }
}

impl Daemon {
    /// The daemon's process, which leads its process group.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops or continues the daemon with every session process it forked.
    pub fn signal(&self, signal: rustix::process::Signal) {
        signal_group(self.child.id(), signal);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        signal_group(self.child.id(), rustix::process::Signal::KILL);
        let _ = wait_timeout(&mut self.child, Duration::from_secs(5));
    }
}

/// The one-line `--json` summary braid printed.
pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {s:?}"))
}

/// `braid get URL DEST --resume --json`, which must complete without sending anything twice:
/// this run's bytes are exactly the ones the earlier run had not stored. Returns the bytes kept.
pub fn resume_get(url: &str, dest: &Path, size: usize) -> u64 {
    let (code, out, err) = braid(
        &["get", url, dest.to_str().unwrap(), "--resume", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let s = json(&out);
    let (kept, fetched) = (
        s["resumed_from"].as_u64().unwrap(),
        s["bytes"].as_u64().unwrap(),
    );
    assert_eq!(kept + fetched, size as u64, "{s}");
    kept
}

/// Waits (bounded) for a child whose stderr is piped; returns its exit code and stderr.
pub fn finish_child(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let status = wait_timeout(&mut child, limit).expect("the child did not exit in time");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (status.code(), err)
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw control connection: write lines, read replies as raw bytes.
pub struct Raw {
    pub stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut r = Raw { stream, reader };
        let greeting = r.reply();
        assert!(greeting.starts_with("220 "), "greeting: {greeting:?}");
        r
    }

    pub fn login(addr: SocketAddr, user: &str, pass: &str) -> Raw {
        let mut r = Raw::connect(addr);
        r.send(&format!("USER {user}"));
        assert!(r.reply().starts_with("331 "));
        r.send(&format!("PASS {pass}"));
        let rep = r.reply();
        assert!(rep.starts_with("230 "), "login: {rep:?}");
        r
    }

    pub fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\r\n").as_bytes());
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// One whole reply (all lines of a multi-line one), bytes exactly as sent.
    pub fn reply(&mut self) -> String {
        let mut all = String::new();
        let mut first_code: Option<String> = None;
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).expect("read reply");
            assert!(n > 0, "connection closed; got so far: {all:?}");
            all.push_str(&line);
            let code = line.get(..3).map(str::to_string);
            match &first_code {
                None if line.as_bytes().get(3) == Some(&b'-') => first_code = code,
                None => return all,
                Some(c) if line.starts_with(&format!("{c} ")) => return all,
                Some(_) => {}
            }
        }
    }

    /// Sends a command and checks the reply's exact bytes.
    pub fn expect(&mut self, cmd: &str, reply: &str) {
        self.send(cmd);
        assert_eq!(self.reply(), reply, "reply to {cmd:?}");
    }

    /// True once the server has closed the connection.
    pub fn is_closed(&mut self) -> bool {
        let mut buf = [0u8; 64];
        matches!(self.reader.read(&mut buf), Ok(0) | Err(_))
    }

    /// True if the server closes the connection (whatever it sends first) within the read
    /// timeout.
    pub fn closes(&mut self) -> bool {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => true,
            // A reset (the server closed with our bytes unread) is a close too.
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }

    /// EPSV, then connect to the port it names.
    pub fn epsv(&mut self) -> TcpStream {
        self.send("EPSV");
        let r = self.reply();
        assert!(r.starts_with("229 "), "EPSV: {r:?}");
        let port: u16 = r
            .split("|||")
            .nth(1)
            .and_then(|p| p.split('|').next())
            .and_then(|p| p.parse().ok())
            .expect("port");
        let addr = SocketAddr::new(self.stream.peer_addr().expect("peer").ip(), port);
        TcpStream::connect(addr).expect("data connect")
    }
}

/// A fresh directory for one test.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("braid-test-")
        .tempdir()
        .expect("temp dir")
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Deterministic web-server log lines: text that compresses about fourfold, as real logs do.
pub fn log_lines(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 128);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let line = format!(
            "10.0.{}.{} - - [28/Nov/2026:10:{:02}:{:02}] \"GET /items/{} HTTP/1.1\" {} {}\n",
            x % 256,
            (x >> 8) % 256,
            (x >> 16) % 60,
            (x >> 22) % 60,
            (x >> 28) % 10_000,
            [200, 200, 304, 404][((x >> 42) % 4) as usize],
            (x >> 44) % 50_000
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
}

/// A `braid` command that keeps away from the user's files: its HOME (netrc, upload records
/// under `.local/state`) is `home`, a directory the test owns, and no password comes from the
/// environment.
pub fn braid_command(home: &Path) -> Command {
    let mut cmd = Command::new(BRAID);
    cmd.stdin(Stdio::null())
        .env_remove("BRAID_PASSWORD")
        .env_remove("XDG_STATE_HOME")
        .env("HOME", home);
    cmd
}

/// Runs `braid` with arguments, in an empty HOME of its own that goes when it ends; returns
/// (exit code, stdout, stderr). A test that needs upload records to outlast one run passes
/// `XDG_STATE_HOME` in `env`.
pub fn braid(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let home = tempdir();
    let mut cmd = braid_command(home.path());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run braid");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a command with a time limit; returns (success, stdout, stderr).
pub fn run(cmd: &mut Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = wait_timeout(&mut child, limit);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let out = t_out.join().unwrap_or_default();
    let err = t_err.join().unwrap_or_default();
    (status.is_some_and(|s| s.success()), out, err)
}

/// The host's default congestion control and another one it has (reno is always built in).
pub fn congestion_controls() -> (String, String) {
    let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .expect("this test reads the system's default congestion control")
        .trim()
        .to_string();
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    let other = ["cubic", "reno", "bbr"]
        .into_iter()
        .find(|c| *c != default && available.split_whitespace().any(|a| a == *c))
        .expect("this test needs a second congestion control besides the default")
        .to_string();
    (default, other)
}

/// `braid passwd NAME --file USERS --root ROOT [--rw]` with `password` on its stdin, which
/// must succeed; returns what it said on stderr.
pub fn add_account(users: &Path, name: &str, root: &Path, password: &str, rw: bool) -> String {
    let mut cmd = Command::new(BRAID);
    cmd.args(["passwd", name, "--file"])
        .arg(users)
        .arg("--root")
        .arg(root);
    if rw {
        cmd.arg("--rw");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run braid passwd");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{password}\n").as_bytes())
        .expect("write the password");
    let out = child.wait_with_output().expect("braid passwd");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "braid passwd {name}: {said}");
    said
}

/// A certificate for 127.0.0.1 and localhost, written as `cert.pem` and `key.pem` in `dir`;
/// returns (cert, key) paths.
pub fn certificate(dir: &Path) -> (String, String) {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let cert = rcgen::generate_simple_self_signed(names).unwrap();
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert.cert.pem()).unwrap();
    std::fs::write(&k, cert.signing_key.serialize_pem()).unwrap();
    (c.display().to_string(), k.display().to_string())
}

/// Makes a self-signed certificate the way admins do, `openssl req -x509 -nodes`, which marks
/// it `CA:TRUE`; returns (cert, key) paths.
pub fn openssl_certificate(dir: &Path, stem: &str, names: &str) -> (String, String) {
    require("openssl");
    let (c, k) = (
        dir.join(format!("{stem}.pem")),
        dir.join(format!("{stem}.key")),
    );
    let (ok, _, err) = run(
        Command::new("openssl")
            .args([
                "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "2",
            ])
            .args(["-subj", "/CN=braid test"])
            .arg("-addext")
            .arg(format!("subjectAltName={names}"))
            .arg("-keyout")
            .arg(&k)
            .arg("-out")
            .arg(&c),
        Duration::from_secs(60),
    );
    assert!(ok, "openssl req: {err}");
    (c.display().to_string(), k.display().to_string())
}

/// Waits (30 s at most) until a download's record (`DEST.part.braid`, saved every second)
/// names a stored range: from then on, an interrupted download certainly leaves something
/// to resume from.
pub fn wait_for_recorded_range(sidecar: &Path) {
    let holds = || {
        std::fs::read(sidecar)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["ranges"].as_str().is_some_and(|r| !r.is_empty()))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !holds() {
        assert!(std::time::Instant::now() < deadline, "nothing arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `braid bench ARGS` with its own HOME (`home`) and its results in `home/results`, stopped
/// after `limit`; its report.json and its stdout. Fails the test when bench fails.
pub fn bench(home: &Path, args: &[&str], limit: Duration) -> (serde_json::Value, String) {
    let out_dir = home.join("results");
    let mut cmd = braid_command(home);
    cmd.arg("bench").args(args).arg("--out").arg(&out_dir);
    let (ok, stdout, stderr) = run(&mut cmd, limit);
    assert!(ok, "braid bench {args:?} failed:\n{stdout}\n{stderr}");
    let report = std::fs::read_to_string(out_dir.join("report.json")).expect("report.json");
    (json(&report), stdout)
}

/// The ranges the client's upload record says the server holds (None: no record).
pub fn upload_record(state: &std::path::Path) -> Option<braid_proto::ranges::RangeSet> {
    let dir = state.join("braid").join("uploads");
    let entry = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))?;
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(entry.path()).ok()?).ok()?;
    let ranges = record["ranges"].as_str()?;
    if ranges.is_empty() {
        return Some(braid_proto::ranges::RangeSet::new());
    }
    braid_proto::ranges::RangeSet::parse(ranges).ok()
}

/// A connection to `server` from the local address `from` (loopback answers all of 127/8, so
/// 127.x.y.z stand in for clients of separate ranges).
pub fn connect_from(server: SocketAddr, from: std::net::Ipv4Addr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    sock.connect(&server.into()).unwrap();
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

/// The port of the last passive reply (227 or 229) in a `-v` transcript.
pub fn passive_port(shown: &str) -> u16 {
    use braid_proto::addr::{parse_227, parse_229};
    let line = shown
        .lines()
        .rfind(|l| l.contains("< 227") || l.contains("< 229"))
        .unwrap_or_else(|| panic!("no passive reply in {shown}"));
    let (_, reply) = line.split_once("< ").unwrap();
    let (code, text) = reply.split_at(3);
    let port = match code {
        "229" => parse_229(text),
        _ => parse_227(text).map(|a| a.port()),
    };
    port.unwrap_or_else(|e| panic!("{line}: {e:?}"))
}

/// A stranger at a data port: connects to `at` from 127.0.0.9 (neither a client's address
/// nor a server's), says a TLS hello that proves nothing, and reads what it is given (at most
/// five seconds' worth).
pub fn stranger_reads(at: SocketAddr) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut stranger = connect_from(at, std::net::Ipv4Addr::new(127, 0, 0, 9));
    stranger
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stranger.write_all(b"\x16\x03\x01\x00\x05hello");
    let mut got = Vec::new();
    let _ = stranger.read_to_end(&mut got);
    got
}

/// A child's standard error read as it comes, so that a test waits for what the child says
/// (a state) rather than for a length of time.
pub struct Stderr {
    text: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Stderr {
    /// Takes over `child`'s piped standard error.
    pub fn follow(child: &mut Child) -> Stderr {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let reader = child.stderr.take().map(|mut e| {
            let text = text.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = std::io::Read::read(&mut e, &mut buf) {
                    if n == 0 {
                        break;
                    }
                    let piece = String::from_utf8_lossy(&buf[..n]);
                    text.lock().unwrap().push_str(&piece);
                }
            })
        });
        Stderr { text, reader }
    }

    /// Waits until `needle` has been written, for at most `limit`; whether it was.
    pub fn wait_for(&self, needle: &str, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if self.text.lock().unwrap().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// What the child has written so far.
    pub fn so_far(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Waits for the child to exit (at most `limit`): its exit code and all it wrote.
    pub fn finish(mut self, mut child: Child, limit: Duration) -> (Option<i32>, String) {
        let status = wait_timeout(&mut child, limit).expect("the child did not exit in time");
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let text = self.text.lock().unwrap().clone();
        (status.code(), text)
    }
}

impl Server {
    /// Waits until the server's log holds `needle` at least `times` times (at most 20 s).
    pub fn wait_for_log(&self, needle: &str, times: usize) {
        wait_for_text(&self.stderr_log, needle, times);
    }

    /// Where the server's log is written (for a test that hands the server to a thread).
    pub fn log_file(&self) -> PathBuf {
        self.stderr_log.clone()
    }
}

/// Waits until the file at `path` holds `needle` at least `times` times (at most 20 s).
pub fn wait_for_text(path: &Path, needle: &str, times: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let text = || std::fs::read_to_string(path).unwrap_or_default();
    while text().matches(needle).count() < times {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never held {needle:?} {times} time(s): {}",
            path.display(),
            text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A braid server of a fresh directory `top/root` holding `files` (name, contents), started
/// with `args`: the temporary directory, the root and the server. Bound in this order, the
/// server stops before the directory goes.
pub fn serve_files(files: &[(&str, &[u8])], args: &[&str]) -> (tempfile::TempDir, PathBuf, Server) {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for (name, contents) in files {
        std::fs::write(root.join(name), contents).unwrap();
    }
    let server = Server::start(&root, args);
    (top, root, server)
}

/// How many commands starting with one of `prefixes` the `-v` dialogue in `err` shows sent
/// before the server's first `125` (a transfer on kept connections).
pub fn sent_before_first_reuse(err: &str, prefixes: &[&str]) -> usize {
    let dialogue: Vec<&str> = err.lines().collect();
    let first_reuse = dialogue
        .iter()
        .position(|l| l.starts_with("< 125"))
        .unwrap_or_else(|| panic!("no 125 in {err}"));
    dialogue[..first_reuse]
        .iter()
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .count()
}
