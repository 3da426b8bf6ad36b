//! `braid bench --attack`: attacks a braid server started with the admin's own configuration
//! on loopback, the way an attacker holding many address ranges would, while an honest user
//! logs in every half second, and reports what each side got. 127.x.y.z addresses stand in
//! for separate ranges (loopback answers all of 127/8); the IPv6 scenario needs addresses of
//! 2001:2::/48 (the benchmarking range) on loopback, which a network namespace gives
//! (`sysctl net.ipv6.ip_nonlocal_bind=1`, `ip -6 route add local 2001:2::/48 dev lo`).
//!
//! The numbers: how many guesses of the attacked account were checked per second and whether
//! a password planted as guess 150 was found; the honest user's logins that succeeded within
//! 2 s; the server's peak memory and its threads before and after; the log lines it wrote.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The scenarios, as `--attack` names them.
pub const SCENARIOS: [&str; 5] = ["guessing", "queue", "startups", "startups-v6", "neighbour"];

/// Where the planted password sits among the guesses.
pub const PLANTED_AT: usize = 150;
/// An honest login counts as good when it is answered 230 within this long.
pub const HONEST_WITHIN: Duration = Duration::from_secs(2);
const HONEST_EVERY: Duration = Duration::from_millis(500);

/// What one scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub scenario: String,
    pub seconds: f64,
    /// Guesses of the attacked account the server checked and answered 530.
    pub guesses_checked: u64,
    pub guesses_per_second: f64,
    /// Seconds into the attack when the planted password was answered 230, if it was.
    pub planted_found_after: Option<f64>,
    /// Attempts told to try later (421) or closed before an answer.
    pub attacker_refused: u64,
    /// Attacker connections opened.
    pub attacker_connections: u64,
    pub honest_tries: u64,
    /// Honest logins answered 230, however late.
    pub honest_logged_in: u64,
    /// Honest logins answered 230 within 2 s.
    pub honest_ok: u64,
    pub honest_ok_share: f64,
    pub honest_slowest_ms: Option<f64>,
    /// What the first honest logins that failed got.
    pub honest_failures: Vec<String>,
    pub server_peak_mib: f64,
    pub server_threads_before: u64,
    pub server_threads_after: u64,
    pub log_lines: u64,
    /// Of which warnings: what an attacker can make the log say loudly.
    pub log_warnings: u64,
}

impl Outcome {
    /// The targets of the attack bench, each as a failure message when missed.
    pub fn misses(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.honest_ok_share < 0.95 {
            out.push(format!(
                "honest logins within 2 s: {:.0}% (target 95%)",
                self.honest_ok_share * 100.0
            ));
        }
        if self.server_peak_mib > 100.0 {
            out.push(format!(
                "server peak {:.0} MiB (target 100)",
                self.server_peak_mib
            ));
        }
        if self.scenario == "guessing" && self.planted_found_after.is_some() {
            out.push("the planted password was found".into());
        }
        if self.server_threads_after > self.server_threads_before {
            out.push(format!(
                "threads {} before, {} after",
                self.server_threads_before, self.server_threads_after
            ));
        }
        out
    }
}

/// Runs the scenarios, prints a table, writes `attack.json` into `out`; exit code 0 when
/// every target was met, 1 otherwise.
pub fn main(scenarios: &[String], config: Option<&Path>, seconds: f64, out: &Path) -> Result<u8> {
    // Another build's server may be attacked for comparison (BRAID_ATTACK_SERVER=path).
    let braid = match std::env::var_os("BRAID_ATTACK_SERVER") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe().context("cannot find the braid binary")?,
    };
    let mut outcomes = Vec::new();
    for name in scenarios {
        eprintln!("attack {name}: {seconds} s");
        let o = run(&braid, name, config, Duration::from_secs_f64(seconds))?;
        print_outcome(&o);
        outcomes.push(o);
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("attack.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&outcomes)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("results: {}", path.display());
    Ok(u8::from(outcomes.iter().any(|o| !o.misses().is_empty())))
}

fn print_outcome(o: &Outcome) {
    println!(
        "{:<12} checked {:>4} guesses ({:.2}/s), planted {}; attacker refused {} of {} \
         connections; honest {}/{} within 2 s (slowest {}); server peak {:.0} MiB, threads \
         {}→{}, {} log lines ({} warnings)",
        o.scenario,
        o.guesses_checked,
        o.guesses_per_second,
        o.planted_found_after
            .map_or("not found".into(), |s| format!("found after {s:.1} s")),
        o.attacker_refused,
        o.attacker_connections,
        o.honest_ok,
        o.honest_tries,
        o.honest_slowest_ms
            .map_or("-".into(), |ms| format!("{ms:.0} ms")),
        o.server_peak_mib,
        o.server_threads_before,
        o.server_threads_after,
        o.log_lines,
        o.log_warnings,
    );
    for m in o.misses() {
        println!("{:<12} MISSED: {m}", "");
    }
    for f in &o.honest_failures {
        println!("{:<12} an honest login got: {f}", "");
    }
}

/// A braid server for one scenario, stopped when dropped.
struct Target {
    child: Child,
    /// Kept open: the server prints a line per listener, and one written to a closed pipe
    /// would fail it.
    _stdout: Option<std::io::BufReader<std::process::ChildStdout>>,
    addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Target {
    fn start(
        braid: &Path,
        config: Option<&Path>,
        listen: &str,
        accounts: &[(&str, &str)],
    ) -> Result<Target> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("root");
        std::fs::create_dir(&root)?;
        let users = dir.path().join("users");
        for (name, password) in accounts {
            crate::users::write_entry(
                &users,
                name,
                password,
                braid_proto::session::Perm::ReadOnly,
                &root,
            )?;
        }
        let log = dir.path().join("server.log");
        let mut cmd = Command::new(braid);
        cmd.arg("serve");
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        // Beside a production server on the same host: its own metrics port, not the config's.
        cmd.args(["--listen", listen, "--metrics", "127.0.0.1:0", "--users"])
            .arg(&users)
            .arg("--root")
            .arg(&root)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?);
        let mut child = cmd.spawn().context("cannot start braid serve")?;
        let mut line = String::new();
        let mut stdout = child.stdout.take().map(std::io::BufReader::new);
        if let Some(out) = &mut stdout {
            out.read_line(&mut line)?;
        }
        let addr = line
            .split("ftp://")
            .nth(1)
            .and_then(|r| r.trim().trim_end_matches('/').parse().ok());
        let mut target = Target {
            child,
            _stdout: stdout,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            _dir: dir,
        };
        match addr {
            Some(a) => target.addr = a,
            None => bail!(
                "braid serve did not start: {}",
                std::fs::read_to_string(&target.log)
                    .unwrap_or_default()
                    .trim()
            ),
        }
        Ok(target)
    }

    fn status(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// The log's lines and warnings.
    fn log_lines(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let warnings = text.lines().filter(|l| l.contains(" WARN ")).count();
        (text.lines().count() as u64, warnings as u64)
    }
}

/// What a login attempt got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Got {
    LoggedIn,
    Wrong,
    /// 421, or the connection closed before an answer.
    Refused,
}

/// One connection from `from`: USER and PASS, then QUIT; what came back, when, and the last
/// line or error (to say why a login did not succeed).
pub fn try_login(
    server: SocketAddr,
    from: IpAddr,
    user: &str,
    pass: &str,
    wait: Duration,
) -> (Got, Duration, String) {
    let started = Instant::now();
    let got = (|| -> std::io::Result<(Got, String)> {
        let mut s = connect_from(server, from, wait)?;
        s.write_all(format!("USER {user}\r\nPASS {pass}\r\n").as_bytes())?;
        let mut lines = std::io::BufReader::new(s.try_clone()?).lines();
        loop {
            let Some(line) = lines.next().transpose()? else {
                return Ok((Got::Refused, "closed before an answer".into()));
            };
            let got = match line.get(..4) {
                Some("230 ") => {
                    let _ = s.write_all(b"QUIT\r\n");
                    Got::LoggedIn
                }
                Some("530 ") => Got::Wrong,
                Some("421 ") => Got::Refused,
                _ => continue,
            };
            return Ok((got, line));
        }
    })();
    let (got, why) = got.unwrap_or_else(|e| (Got::Refused, e.to_string()));
    (got, started.elapsed(), why)
}

fn connect_from(server: SocketAddr, from: IpAddr, wait: Duration) -> std::io::Result<TcpStream> {
    let domain = if server.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    sock.bind(&SocketAddr::new(from, 0).into())?;
    // Closed with a reset: a hundred thousand attack connections leave no TIME_WAIT holding
    // ephemeral ports that other programs on the machine are about to listen on.
    sock.set_linger(Some(Duration::ZERO))?;
    sock.connect_timeout(&server.into(), wait)?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(wait))?;
    Ok(s)
}

/// The i-th attacker range's address `host` (IPv4: 127.a.b.host, never 127.0.0.x, the honest
/// user's range).
fn attacker_v4(i: u32, host: u8) -> IpAddr {
    let i = i % (254 * 256);
    IpAddr::V4(Ipv4Addr::new(
        127,
        (1 + i / 256) as u8,
        (i % 256) as u8,
        host.max(1),
    ))
}

/// Counts the honest user's logins while `running`.
#[derive(Debug, Default)]
struct Honest {
    why_not: Mutex<Vec<String>>,
    tries: AtomicU64,
    logged_in: AtomicU64,
    ok: AtomicU64,
    slowest_us: AtomicU64,
}

fn honest_loop(
    honest: &Honest,
    server: SocketAddr,
    from: IpAddr,
    password: &str,
    running: &AtomicBool,
) {
    while running.load(Ordering::Relaxed) {
        let next = Instant::now() + HONEST_EVERY;
        let (got, took, why) = try_login(server, from, "alice", password, Duration::from_secs(10));
        if got != Got::LoggedIn
            && let Ok(mut w) = honest.why_not.lock()
            && w.len() < 5
        {
            w.push(format!("{why} after {} ms", took.as_millis()));
        }
        honest.tries.fetch_add(1, Ordering::Relaxed);
        if got == Got::LoggedIn {
            honest.logged_in.fetch_add(1, Ordering::Relaxed);
        }
        if got == Got::LoggedIn && took <= HONEST_WITHIN {
            honest.ok.fetch_add(1, Ordering::Relaxed);
        }
        honest
            .slowest_us
            .fetch_max(took.as_micros() as u64, Ordering::Relaxed);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// The attacker's side of a scenario.
#[derive(Debug, Default)]
struct Attack {
    checked: AtomicU64,
    refused: AtomicU64,
    connections: AtomicU64,
    found_us: Mutex<Option<u64>>,
}

fn run(braid: &Path, name: &str, config: Option<&Path>, length: Duration) -> Result<Outcome> {
    let honest_password = format!("h-{:016x}", rand::random::<u64>());
    let v6 = name == "startups-v6";
    let (listen, honest_from) = if v6 {
        ("[::1]:0", IpAddr::V6(Ipv6Addr::LOCALHOST))
    } else {
        ("127.0.0.1:0", IpAddr::V4(Ipv4Addr::LOCALHOST))
    };
    if v6 {
        let probe = IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1));
        if std::net::UdpSocket::bind(SocketAddr::new(probe, 0)).is_err() {
            bail!(
                "startups-v6 needs the addresses of 2001:2::/48 on loopback: run it in a \
                 network namespace after `sysctl net.ipv6.ip_nonlocal_bind=1` and \
                 `ip -6 route add local 2001:2::/48 dev lo`"
            );
        }
    }
    let target = Target::start(braid, config, listen, &[("alice", &honest_password)])?;
    let server = target.addr;
    // The honest user has logged in before, from home.
    let (got, _, _) = try_login(
        server,
        honest_from,
        "alice",
        &honest_password,
        Duration::from_secs(10),
    );
    if got != Got::LoggedIn {
        bail!("the honest user's first login failed before any attack ({got:?})");
    }
    std::thread::sleep(Duration::from_millis(200));
    let threads_before = target.status("Threads:");
    let lines_before = target.log_lines();
    let running = Arc::new(AtomicBool::new(true));
    let attack = Arc::new(Attack::default());
    let honest = Arc::new(Honest::default());
    let started = Instant::now();
    let mut workers = Vec::new();
    {
        let (honest, running) = (honest.clone(), running.clone());
        let pw = honest_password.clone();
        workers.push(std::thread::spawn(move || {
            honest_loop(&honest, server, honest_from, &pw, &running)
        }));
    }
    let guesses = Arc::new(Mutex::new(
        (0..)
            .take(100_000)
            .collect::<std::collections::VecDeque<usize>>(),
    ));
    let fresh = Arc::new(AtomicU64::new(0));
    let attackers: usize = match name {
        "guessing" => 8,
        "queue" => 200,
        "startups" | "startups-v6" => 256,
        "neighbour" => 31,
        other => bail!(
            "no attack scenario {other:?} (one of {})",
            SCENARIOS.join(", ")
        ),
    };
    for k in 0..attackers {
        let (attack, running, guesses, fresh) = (
            attack.clone(),
            running.clone(),
            guesses.clone(),
            fresh.clone(),
        );
        let planted = honest_password.clone();
        let name = name.to_string();
        workers.push(std::thread::spawn(move || {
            let deadline = started + length;
            while running.load(Ordering::Relaxed) && Instant::now() < deadline {
                let n = fresh.fetch_add(1, Ordering::Relaxed) as u32;
                attack.connections.fetch_add(1, Ordering::Relaxed);
                match name.as_str() {
                    "guessing" => {
                        let Some(i) = guesses.lock().ok().and_then(|mut g| g.pop_front()) else {
                            break;
                        };
                        let pass = if i + 1 == PLANTED_AT {
                            planted.clone()
                        } else {
                            format!("wrong-{i}")
                        };
                        let (got, _, _) = try_login(
                            server,
                            attacker_v4(n, 2),
                            "alice",
                            &pass,
                            Duration::from_secs(40),
                        );
                        match got {
                            Got::LoggedIn => {
                                let at = started.elapsed().as_micros() as u64;
                                if let Ok(mut f) = attack.found_us.lock() {
                                    f.get_or_insert(at);
                                }
                            }
                            // Counted while the attack lasts: the rate is of its seconds.
                            Got::Wrong if Instant::now() <= deadline => {
                                attack.checked.fetch_add(1, Ordering::Relaxed);
                            }
                            Got::Wrong => {}
                            Got::Refused => {
                                attack.refused.fetch_add(1, Ordering::Relaxed);
                                if let Ok(mut g) = guesses.lock() {
                                    g.push_front(i);
                                }
                            }
                        }
                    }
                    "queue" => {
                        let user = format!("nobody{n}");
                        let (got, _, _) = try_login(
                            server,
                            attacker_v4(n, 2),
                            &user,
                            "wrong",
                            Duration::from_secs(40),
                        );
                        if got == Got::Refused {
                            attack.refused.fetch_add(1, Ordering::Relaxed);
                            // Back soon: hard enough to keep the queue full, without taking
                            // every CPU and ephemeral port of the machine the bench runs on.
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    "neighbour" => {
                        // 31 failures at once from the honest user's own /24, for accounts
                        // not theirs, each tried again a second after a "try later" until it
                        // is checked; then the attacker waits.
                        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + k as u8));
                        let user = format!("user{k}");
                        while running.load(Ordering::Relaxed) && Instant::now() < deadline {
                            let (got, _, _) =
                                try_login(server, from, &user, "wrong", Duration::from_secs(40));
                            if got == Got::Wrong {
                                attack.checked.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            attack.refused.fetch_add(1, Ordering::Relaxed);
                            attack.connections.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_secs(1));
                        }
                        while running.load(Ordering::Relaxed) && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    _ => {
                        // Startups: hold a connection that never logs in, from 8 ranges (or
                        // 8 /64s of one /48), and come back when it is closed.
                        let from = if v6 {
                            IpAddr::V6(Ipv6Addr::new(
                                0x2001,
                                2,
                                0,
                                (k % 8) as u16,
                                0,
                                0,
                                0,
                                (k / 8 + 1) as u16,
                            ))
                        } else {
                            attacker_v4((k % 8) as u32, (k / 8 + 1) as u8)
                        };
                        hold(server, from, &running, deadline, &attack);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }));
    }
    while started.elapsed() < length {
        std::thread::sleep(Duration::from_millis(100));
    }
    running.store(false, Ordering::Relaxed);
    let attack_seconds = started.elapsed().as_secs_f64();
    for w in workers {
        let _ = w.join();
    }
    // Whatever the attack left behind has settled.
    std::thread::sleep(Duration::from_secs(2));
    let threads_after = target.status("Threads:");
    let lines_after = target.log_lines();
    let checked = attack.checked.load(Ordering::Relaxed);
    let tries = honest.tries.load(Ordering::Relaxed);
    let ok = honest.ok.load(Ordering::Relaxed);
    let found = attack.found_us.lock().ok().and_then(|f| *f);
    Ok(Outcome {
        scenario: name.to_string(),
        seconds: attack_seconds,
        guesses_checked: checked,
        guesses_per_second: checked as f64 / attack_seconds,
        planted_found_after: found.map(|us| us as f64 / 1e6),
        attacker_refused: attack.refused.load(Ordering::Relaxed),
        attacker_connections: attack.connections.load(Ordering::Relaxed),
        honest_tries: tries,
        honest_logged_in: honest.logged_in.load(Ordering::Relaxed),
        honest_failures: honest.why_not.lock().map(|w| w.clone()).unwrap_or_default(),
        honest_ok: ok,
        honest_ok_share: if tries == 0 {
            0.0
        } else {
            ok as f64 / tries as f64
        },
        honest_slowest_ms: (tries > 0)
            .then(|| honest.slowest_us.load(Ordering::Relaxed) as f64 / 1e3),
        server_peak_mib: target.status("VmHWM:") as f64 / 1024.0,
        server_threads_before: threads_before,
        server_threads_after: threads_after,
        log_lines: lines_after.0.saturating_sub(lines_before.0),
        log_warnings: lines_after.1.saturating_sub(lines_before.1),
    })
}

/// Opens a connection from `from` and holds it without logging in, until the server closes
/// it or the attack ends.
fn hold(
    server: SocketAddr,
    from: IpAddr,
    running: &AtomicBool,
    deadline: Instant,
    attack: &Attack,
) {
    let Ok(mut s) = connect_from(server, from, Duration::from_secs(5)) else {
        attack.refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 512];
    while running.load(Ordering::Relaxed) && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => {
                attack.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                attack.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}
