//! `braid cp` and the one-shot far side it starts (`braid serve --stdio`), with a stand-in for
//! ssh that runs the far side's command here, in a "home" of the test's own, and records its
//! process id: the dialogue over a pipe, the data over braid's own connections.

use crate::util::{BRAID, braid_command, json, random_bytes, run, tempdir};
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A test's two sides: `home` (the far side's home directory), `here` (the client's current
/// directory), and the stand-in for ssh.
struct Sides {
    _top: tempfile::TempDir,
    home: PathBuf,
    here: PathBuf,
    ssh: PathBuf,
    pids: PathBuf,
}

impl Sides {
    fn new() -> Sides {
        let top = tempdir();
        let (home, here) = (top.path().join("home"), top.path().join("here"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&here).unwrap();
        let pids = top.path().join("pids");
        // ssh's first argument is the destination; the rest is the command, run in the home
        // directory as ssh runs it, as the same process (exec), whose id is noted.
        let ssh = top.path().join("fake-ssh");
        script(
            &ssh,
            &format!(
                "shift\ncd '{}' || exit 1\necho $$ >> '{}'\nexec \"$@\"\n",
                home.display(),
                pids.display()
            ),
        );
        Sides {
            _top: top,
            home,
            here,
            ssh,
            pids,
        }
    }

    /// `braid cp` here with the stand-in for ssh, the dialogue shown (`-v`); (success, stderr).
    fn cp(&self, args: &[&str]) -> (bool, String) {
        let (ok, _, err) = run(&mut self.command("-v", args), LIMIT);
        (ok, err)
    }

    /// `braid cp -v` started, its standard error followed.
    fn spawn(&self, args: &[&str]) -> (std::process::Child, crate::util::Stderr) {
        let mut child = self
            .command("-v", args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = crate::util::Stderr::follow(&mut child);
        (child, stderr)
    }

    /// The same with a JSON summary; (success, stdout, stderr).
    fn cp_json(&self, args: &[&str]) -> (bool, String, String) {
        run(&mut self.command("--json", args), LIMIT)
    }

    fn command(&self, output: &str, args: &[&str]) -> std::process::Command {
        let mut cmd = braid_command(&self.here);
        cmd.current_dir(&self.here)
            .arg("cp")
            .arg("-e")
            .arg(&self.ssh)
            .args(["--remote-braid", BRAID, output])
            .args(args);
        cmd
    }

    /// Every far side this test started has exited.
    fn assert_far_sides_gone(&self) {
        let pids = std::fs::read_to_string(&self.pids).unwrap_or_default();
        assert!(!pids.is_empty(), "no far side was started");
        for pid in pids.lines() {
            // A zombie has exited too; only its entry remains until its parent reaps it.
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let running = state
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next())
                .is_some_and(|s| s != "Z");
            assert!(!running, "the far side {pid} still runs: {state}");
        }
    }
}

/// A shell script at `path` running `body`, executable.
fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every data connection that carried bytes was TLS resuming the session the dialogue
/// started (a full handshake would mean one that was not), from a `--json` summary. (A
/// connection opened but left unused as the file ran out may end before its handshake.)
fn assert_encrypted(summary: &serde_json::Value) {
    let tls = &summary["tls_handshakes"];
    assert_eq!(tls["full"], 0, "{summary}");
    let carried = summary["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["bytes"].as_u64() > Some(0))
        .count() as u64;
    assert!(carried >= 1, "{summary}");
    assert!(tls["resumed"].as_u64() >= Some(carried), "{summary}");
}

fn same(a: &Path, b: &Path) {
    assert!(
        std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
        "{} and {} differ",
        a.display(),
        b.display()
    );
}

/// A file down and up over 4 connections, by scp's syntax: relative to the far side's home,
/// and absolute; identical both times, every data connection that carried bytes TLS resuming
/// the session the dialogue started with the certificate the far side named, and no far side
/// left running.
#[test]
fn cp_copies_a_file_both_ways_encrypted_and_leaves_nothing_running() {
    let s = Sides::new();
    std::fs::write(s.home.join("big.bin"), random_bytes(6 << 20, 41)).unwrap();
    let absolute = format!("127.0.0.1:{}/up.bin", s.home.display());
    for (args, landed) in [
        (["127.0.0.1:big.bin", "got.bin"], s.here.join("got.bin")),
        (["got.bin", absolute.as_str()], s.home.join("up.bin")),
    ] {
        let (ok, out, err) = s.cp_json(&["-n", "4", args[0], args[1]]);
        assert!(ok, "{err}");
        same(&landed, &s.home.join("big.bin"));
        assert_encrypted(&json(out.lines().last().unwrap_or_default()));
    }
    s.assert_far_sides_gone();
}

/// -r: a tree up into a directory of the home, and back down, the same; on one session the
/// small files go as one bundle each way (BNDL, then SBND up and RBND down), no STOR or
/// RETR per file.
#[test]
fn cp_r_copies_a_tree_both_ways() {
    let s = Sides::new();
    let tree = s.here.join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    for i in 0..5u64 {
        std::fs::write(
            tree.join(format!("a/f{i}")),
            random_bytes(1000 + i as usize, i),
        )
        .unwrap();
        std::fs::write(tree.join(format!("a/b/g{i}")), random_bytes(5000, 10 + i)).unwrap();
    }
    let (ok, err) = s.cp(&["-r", "-j", "1", "tree", "127.0.0.1:up/"]);
    assert!(ok, "{err}");
    let stor = err.matches("> STOR ").count();
    assert!(err.contains("> SBND") && stor == 0, "{stor} STOR: {err}");
    let (ok, err) = s.cp(&["-r", "-j", "1", "127.0.0.1:up/tree", "back/"]);
    assert!(ok, "{err}");
    // Whether the top is a file (SIZE) is asked with the login, not a round trip after it.
    let at = |prefix: &str| err.lines().position(|l| l.starts_with(prefix));
    let (size, logged_in) = (at("> SIZE up/tree"), at("< 230"));
    assert!(size.is_some() && size < logged_in, "{err}");
    // Down, the files come as one bundle (BNDL, RBND) on the session's new data connection.
    let retr = err.matches("> RETR ").count();
    assert!(err.contains("> RBND") && retr == 0, "{retr} RETR: {err}");
    for i in 0..5u64 {
        for rel in [format!("a/f{i}"), format!("a/b/g{i}")] {
            same(&tree.join(&rel), &s.home.join("up/tree").join(&rel));
            same(&tree.join(&rel), &s.here.join("back/tree").join(&rel));
        }
    }
    s.assert_far_sides_gone();
}

/// As scp: a destination the far side holds as a directory takes the files into it, with or
/// without its final /; a name that is no directory there is the file's new name; several
/// files always go into a directory. The same through an ftp:// URL.
#[test]
fn cp_puts_files_into_a_directory_named_without_its_slash_as_scp_does() {
    let s = Sides::new();
    std::fs::create_dir(s.home.join("in")).unwrap();
    std::fs::write(s.here.join("a.txt"), b"first").unwrap();
    std::fs::write(s.here.join("b.txt"), b"second").unwrap();
    for args in [
        vec!["a.txt", "127.0.0.1:in"],
        vec!["a.txt", "127.0.0.1:in/renamed.txt"],
        vec!["a.txt", "b.txt", "127.0.0.1:in"],
    ] {
        let (ok, err) = s.cp(&args);
        assert!(ok, "{args:?}: {err}");
    }
    let read = |rel: &str| std::fs::read(s.home.join(rel)).unwrap_or_default();
    assert_eq!(read("in/a.txt"), b"first");
    assert_eq!(read("in/renamed.txt"), b"first");
    assert_eq!(read("in/b.txt"), b"second");
    assert!(s.home.join("in").is_dir(), "the directory was not replaced");
    // Where the directory does not exist the copy fails, and makes none.
    let (ok, err) = s.cp(&["a.txt", "b.txt", "127.0.0.1:none"]);
    assert!(!ok && !s.home.join("none").exists(), "{err}");
    s.assert_far_sides_gone();

    let root = s.home.join("srv");
    std::fs::create_dir_all(root.join("dir")).unwrap();
    let server = crate::util::Server::start(&root, &["--anonymous", "--anonymous-write"]);
    let mut cmd = braid_command(&s.here);
    cmd.current_dir(&s.here)
        .args(["cp", "a.txt"])
        .arg(format!("ftp://{}/dir", server.addr));
    let (ok, _, err) = run(&mut cmd, LIMIT);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(root.join("dir/a.txt")).unwrap(), b"first");
}

/// As scp: a remote wildcard fetches the names it matches there (not hidden ones; with -r
/// directories too), `~/` is the home directory, and a wildcard nothing matches fails as a
/// missing file does (exit 5).
#[test]
fn cp_fetches_what_a_remote_wildcard_matches() {
    let s = Sides::new();
    std::fs::create_dir_all(s.home.join("logs/old.gz")).unwrap();
    for name in ["a.gz", "b.gz", ".hidden.gz", "c.txt", "old.gz/x.gz"] {
        std::fs::write(s.home.join("logs").join(name), name).unwrap();
    }
    let (ok, err) = s.cp(&["127.0.0.1:~/logs/*.gz", "got/"]);
    assert!(ok, "{err}");
    let mut got: Vec<String> = std::fs::read_dir(s.here.join("got"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    assert_eq!(got, ["a.gz", "b.gz"]);
    assert_eq!(std::fs::read(s.here.join("got/b.gz")).unwrap(), b"b.gz");
    let (ok, err) = s.cp(&["-r", "127.0.0.1:logs/[o]*", "tree/"]);
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read(s.here.join("tree/old.gz/x.gz")).unwrap(),
        b"old.gz/x.gz"
    );
    let child = s
        .command("-q", &["127.0.0.1:logs/*.zip", "none/"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (code, err) = crate::util::finish_child(child, LIMIT);
    assert!(
        code == Some(5) && err.contains("no file matches"),
        "{code:?}: {err}"
    );
    s.assert_far_sides_gone();
}

/// A far side without braid: the error says what ran and how to fix it, at once (the
/// dialogue's end is seen when the far side exits, not after the reply timeout).
#[test]
fn cp_says_what_to_do_when_the_far_side_has_no_braid() {
    let s = Sides::new();
    let mut cmd = braid_command(&s.here);
    cmd.current_dir(&s.here).args([
        "cp",
        "-e",
        s.ssh.to_str().unwrap(),
        "--remote-braid",
        "/nonexistent/braid",
        "127.0.0.1:f",
        "f",
    ]);
    let started = std::time::Instant::now();
    let (ok, _, err) = run(&mut cmd, LIMIT);
    assert!(!ok);
    assert!(err.contains("did not start a braid session"), "{err}");
    assert!(
        err.contains("/nonexistent/braid is not there"),
        "the shell's words read: {err}"
    );
    assert!(err.contains("--remote-braid PATH"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it waited for a reply timeout"
    );
    assert!(!s.here.join("f").exists() && !s.here.join("f.part").exists());
}

/// A far side whose braid is too old to serve over ssh (it refuses `serve --stdio` as clap
/// does): its own words are passed on, and the error says it is older and what to do.
#[test]
fn cp_says_when_the_far_sides_braid_is_too_old() {
    let s = Sides::new();
    let old = s.home.join("old-braid");
    script(
        &old,
        "echo \"error: unexpected argument '--stdio' found\" >&2\nexit 2\n",
    );
    let mut cmd = braid_command(&s.here);
    cmd.current_dir(&s.here)
        .args(["cp", "-e", s.ssh.to_str().unwrap(), "--remote-braid"])
        .arg(&old)
        .args(["127.0.0.1:f", "f"]);
    let (ok, _, err) = run(&mut cmd, LIMIT);
    assert!(!ok);
    assert!(
        err.contains("unexpected argument '--stdio'"),
        "not passed on: {err}"
    );
    assert!(err.contains("older than this one"), "{err}");
    assert!(err.contains("install this version there"), "{err}");
}

/// The far side alone: one session on standard input and output, greeting with its
/// certificate's digest, starting in its current directory, ending when its input closes.
#[test]
fn serve_stdio_serves_one_session_and_ends_with_its_input() {
    use std::io::{BufRead, BufReader, Write};
    let s = Sides::new();
    std::fs::write(s.home.join("f.txt"), b"hello").unwrap();
    let mut child = std::process::Command::new(BRAID)
        .args(["serve", "--stdio"])
        .current_dir(&s.home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut say = |cmd: &str, line: &mut String| {
        if !cmd.is_empty() {
            input.write_all(format!("{cmd}\r\n").as_bytes()).unwrap();
        }
        line.clear();
        output.read_line(line).unwrap();
    };
    // The greeting names the certificate the session's TLS will use.
    say("", &mut line);
    assert!(line.starts_with("220-braid"), "{line}");
    say("", &mut line);
    assert!(line.starts_with("Certificate SHA-256 "), "{line}");
    assert_eq!(line.trim_end().len(), "Certificate SHA-256 ".len() + 64);
    // Where its data connections listen: loopback, started without ssh.
    say("", &mut line);
    assert_eq!(line.trim_end(), "Data address 127.0.0.1");
    // And that a ClientHello may follow AUTH TLS at once.
    say("", &mut line);
    assert_eq!(line.trim_end(), "220 TLS may follow AUTH at once");
    say("USER anonymous", &mut line);
    say("PASS x", &mut line);
    assert!(line.starts_with("230"), "{line}");
    say("PWD", &mut line);
    let home = s.home.canonicalize().unwrap();
    assert!(line.contains(&format!("\"{}\"", home.display())), "{line}");
    say("SIZE f.txt", &mut line);
    assert_eq!(line.trim_end(), "213 5");
    drop(input);
    let deadline = std::time::Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "it outlived its input"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
}

/// A private OpenSSH server on loopback for one test, set up as `braid bench` sets up its own
/// (`bench::servers::sshd_setup`): its own host key and one authorised key in the test's
/// directory, no system configuration read or changed (only the privilege separation directory
/// sshd insists on, /run/sshd, is made if missing). Stopped when dropped.
struct Sshd {
    _daemon: crate::util::Daemon,
    /// The ssh command that reaches it, for `braid cp -e`.
    ssh: String,
    log: PathBuf,
}

impl Sshd {
    fn start(dir: &Path) -> Sshd {
        let sshd = Path::new("/usr/sbin/sshd");
        assert!(
            sshd.is_file(),
            "this test needs OpenSSH's server (/usr/sbin/sshd): run ./scripts/test, which installs it"
        );
        assert!(
            rustix::process::geteuid().is_root(),
            "this test runs sshd, which needs root"
        );
        let daemon = crate::util::Daemon::start("sshd", |port| {
            // The bench's own private server: keys in `dir`/ssh, made once.
            let conf = braid::bench::servers::sshd_setup(dir, "127.0.0.1", port).unwrap();
            let mut c = std::process::Command::new(sshd);
            c.args(["-D", "-f"])
                .arg(&conf)
                .arg("-E")
                .arg(dir.join("sshd.log"));
            c
        });
        let options = braid::bench::servers::ssh_options(dir).join(" ");
        let ssh = format!("ssh {options} -p {}", daemon.port);
        Sshd {
            _daemon: daemon,
            ssh,
            log: dir.join("sshd.log"),
        }
    }

    /// Logins the server has accepted so far.
    fn logins(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("Accepted publickey")
            .count()
    }
}

/// Through a real OpenSSH server: a file down and up over 4 TLS connections bound to the
/// session, a tree up and back (its sessions sharing one ssh login), and afterwards no far
/// side left running (the far side's braid
/// is named by a link in the test's directory, so its processes are told from any other
/// test's).
#[test]
fn cp_through_openssh_moves_files_and_trees_and_leaves_nothing_running() {
    let top = tempdir();
    let sshd = Sshd::start(top.path());
    let (far, here) = (top.path().join("far"), top.path().join("here"));
    std::fs::create_dir_all(&far).unwrap();
    std::fs::create_dir_all(here.join("tree/a")).unwrap();
    let remote_braid = top.path().join("far-braid");
    std::os::unix::fs::symlink(BRAID, &remote_braid).unwrap();
    std::fs::write(far.join("big.bin"), random_bytes(6 << 20, 43)).unwrap();
    for i in 0..4u64 {
        std::fs::write(here.join(format!("tree/a/f{i}")), random_bytes(3000, i)).unwrap();
    }
    let cp = |args: &[&str]| {
        let mut cmd = braid_command(&here);
        cmd.current_dir(&here)
            .args(["cp", "-e", &sshd.ssh, "--remote-braid"])
            .arg(&remote_braid)
            .args(args);
        let (ok, out, err) = run(&mut cmd, LIMIT);
        assert!(ok, "braid cp {args:?}: {err}");
        out
    };
    // Paths on the far side are absolute: its home is the test user's own.
    let at = |p: &Path| format!("127.0.0.1:{}", p.display());
    let out = cp(&["-n", "4", "--json", &at(&far.join("big.bin")), "got.bin"]);
    same(&here.join("got.bin"), &far.join("big.bin"));
    let summary = json(out.lines().last().unwrap_or_default());
    assert_encrypted(&summary);
    assert_eq!(summary["data_route"], "direct", "{summary}");
    cp(&["-n", "4", "-q", "got.bin", &at(&far.join("up.bin"))]);
    same(&far.join("up.bin"), &far.join("big.bin"));
    cp(&["-r", "-q", "tree", &format!("{}/", at(&far))]);
    // Four sessions, one ssh login: the workers share the first session's connection.
    let before = sshd.logins();
    cp(&["-r", "-q", "-j", "4", &at(&far.join("tree")), "back/"]);
    assert_eq!(sshd.logins() - before, 1, "one login for the whole tree");
    for i in 0..4u64 {
        let rel = format!("tree/a/f{i}");
        same(&here.join(&rel), &far.join(&rel));
        same(&here.join(&rel), &here.join("back").join(&rel));
    }
    nothing_left_running(&remote_braid);
}

/// Waits (10 s at most) until no process runs `program`: the far sides end with their
/// sessions, sshd's own session process a moment later.
fn nothing_left_running(program: &Path) {
    let marker = program.display().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&marker))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running on the far side: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The far side's process ids this test has started, oldest first.
fn far_pids(s: &Sides) -> Vec<i32> {
    let pids = std::fs::read_to_string(&s.pids).unwrap_or_default();
    pids.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Interrupted either way, a download over the ssh route keeps its partial and resumes from
/// it: Ctrl-C on the client (while the far side is frozen, so the transfer cannot end
/// first) exits 7 saying how to resume; the far side killed mid-transfer fails the client
/// with the partial kept; then --resume completes the file, identical, from where the
/// partial ended, and no far side is left running.
#[test]
fn cp_keeps_the_partial_when_either_side_is_killed_and_resumes_from_it() {
    use crate::util::signal_process;
    use rustix::process::Signal;
    use std::time::Instant;
    let s = Sides::new();
    let content = random_bytes(64 << 20, 44);
    std::fs::write(s.home.join("big.bin"), &content).unwrap();
    let (dest, part) = (s.here.join("got.bin"), s.here.join("got.bin.part"));
    let args = [
        "--resume",
        "-n",
        "2",
        "--block-size",
        "1MiB",
        "--rate-limit",
        "16MB",
        "127.0.0.1:big.bin",
        "got.bin",
    ];
    for kill_far_side in [false, true] {
        let before = std::fs::metadata(&part).map_or(0, |m| m.len());
        let (mut child, stderr) = s.spawn(&args);
        // Past 4 blocks more than before: a whole block of this run is stored.
        let deadline = Instant::now() + LIMIT;
        while std::fs::metadata(&part).map_or(0, |m| m.len()) < before + (4 << 20)
            && Instant::now() < deadline
            && child.try_wait().unwrap().is_none()
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        let far = *far_pids(&s).last().expect("a far side started");
        let running = child.try_wait().unwrap().is_none();
        if kill_far_side {
            signal_process(far as u32, Signal::KILL);
        } else {
            signal_process(far as u32, Signal::STOP);
            signal_process(child.id(), Signal::INT);
            // The far side goes on once the client has stopped its side (its ABOR is out).
            let aborted = stderr.wait_for("> ABOR", LIMIT);
            signal_process(far as u32, Signal::CONT);
            assert!(aborted, "no ABOR after Ctrl-C");
        }
        let (code, err) = stderr.finish(child, LIMIT);
        assert!(
            running,
            "the copy ended before it could be interrupted: {err}"
        );
        if kill_far_side {
            assert!(code.is_some_and(|c| c != 0), "{code:?} {err}");
        } else {
            assert_eq!(code, Some(7), "{err}");
            assert!(err.contains("Ctrl-C"), "{err}");
        }
        assert!(err.contains("--resume"), "{err}");
        assert!(!dest.exists(), "{err}");
        assert!(
            std::fs::metadata(&part).map_or(0, |m| m.len()) > before,
            "{err}"
        );
    }
    let (ok, out, err) = s.cp_json(&["--resume", "-n", "2", "127.0.0.1:big.bin", "got.bin"]);
    assert!(ok, "{err}");
    let summary = json(out.lines().last().unwrap_or_default());
    assert!(summary["resumed_from"].as_u64() > Some(0), "{summary}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "the resumed file differs"
    );
    s.assert_far_sides_gone();
}

/// A stranger who connects to the far side's data port while a copy runs gets none of the
/// file (at most a TLS alert, or no connection at all), and the copy completes, identical.
#[test]
fn a_stranger_on_the_data_port_gets_nothing_and_the_copy_goes_on() {
    use std::io::{Read, Write};
    use std::time::Instant;
    let s = Sides::new();
    let content = random_bytes(32 << 20, 45);
    std::fs::write(s.home.join("big.bin"), &content).unwrap();
    let args = [
        "-n",
        "2",
        "--rate-limit",
        "16MB",
        "127.0.0.1:big.bin",
        "got.bin",
    ];
    let (child, stderr) = s.spawn(&args);
    assert!(stderr.wait_for("< 113 Sender", LIMIT), "no data flowed");
    let port = {
        let shown = stderr.so_far();
        let line = shown
            .lines()
            .rfind(|l| l.contains("Extended Passive Mode"))
            .unwrap_or_else(|| panic!("no 229 in {shown}"))
            .to_string();
        line.split("|||")
            .nth(1)
            .and_then(|r| r.split('|').next())
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("no port in {line}"))
    };
    let mut got = Vec::new();
    if let Ok(mut stranger) = std::net::TcpStream::connect(("127.0.0.1", port)) {
        stranger
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let _ = stranger.write_all(b"GET / HTTP/1.0\r\n\r\n");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = [0u8; 65536];
        while Instant::now() < deadline {
            match stranger.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }
    let (code, err) = stderr.finish(child, LIMIT);
    assert_eq!(code, Some(0), "{err}");
    same(&s.home.join("big.bin"), &s.here.join("got.bin"));
    // A TLS alert record (type 21) is all a stranger may see.
    assert!(
        got.is_empty() || (got[0] == 21 && got.len() < 64),
        "a stranger read {} bytes: {:?}",
        got.len(),
        &got[..got.len().min(32)]
    );
    s.assert_far_sides_gone();
}

/// Where the far side's data port cannot be reached (its data connections listen on an
/// address the client does not connect to, as behind a firewall), the far side opens the data
/// connections towards the client; where it cannot either, the data goes through ssh's own
/// channel. Both ways, both directions: the file arrives identical, TLS bound to the session,
/// and `-v` and `--json` say which way it went.
#[test]
fn cp_has_the_far_side_connect_back_or_goes_through_ssh_when_its_data_port_cannot_be_reached() {
    let top = tempdir();
    let sshd = Sshd::start(top.path());
    let (far, here) = (top.path().join("far"), top.path().join("here"));
    std::fs::create_dir_all(&far).unwrap();
    std::fs::create_dir_all(&here).unwrap();
    // The far side listens where ssh says it was reached: told 127.0.0.2, it listens there,
    // and the client's connections to 127.0.0.1 find no one. It can connect back to the
    // client (at 127.0.0.1, as ssh says); the second far side cannot (its connect-back fails
    // as an egress firewall would make it).
    let listens_elsewhere = "export SSH_CONNECTION='127.0.0.1 1 127.0.0.2 22'\n";
    // Named by a link of this test's own, so that its far sides are told from others'.
    let far_braid = top.path().join("braid");
    std::os::unix::fs::symlink(BRAID, &far_braid).unwrap();
    let far_braid = far_braid.display();
    let connects_back = top.path().join("far-braid");
    script(
        &connects_back,
        &format!("{listens_elsewhere}exec {far_braid} \"$@\"\n"),
    );
    let walled_in = top.path().join("walled-in-braid");
    script(
        &walled_in,
        &format!(
            "{listens_elsewhere}if [ \"$1\" = connect-back ]; then echo 'no way out' >&2; exit 1; fi\n\
             exec {far_braid} \"$@\"\n"
        ),
    );
    std::fs::write(far.join("big.bin"), random_bytes(3 << 20, 46)).unwrap();
    let at = |p: &Path| format!("127.0.0.1:{}", p.display());
    let (down, up) = (at(&far.join("big.bin")), at(&far.join("up.bin")));
    for (remote_braid, route, said) in [
        (&connects_back, "connect-back", "the far side connects back"),
        (&walled_in, "ssh-channel", "through ssh's channel"),
    ] {
        for (from, to, landed) in [
            (down.as_str(), "got.bin", here.join("got.bin")),
            ("got.bin", up.as_str(), far.join("up.bin")),
        ] {
            let later = from == "got.bin";
            let mut cmd = braid_command(&here);
            let options = [
                "cp",
                "-v",
                "--json",
                "-n",
                "2",
                "-e",
                &sshd.ssh,
                "--remote-braid",
            ];
            cmd.current_dir(&here)
                .args(options)
                .arg(remote_braid)
                .args([from, to]);
            let (ok, out, err) = run(&mut cmd, LIMIT);
            assert!(ok, "{err}");
            same(&landed, &far.join("big.bin"));
            assert!(err.contains(said), "{err}");
            if route == "ssh-channel" && !later {
                assert!(err.contains("no way out"), "the far side's words: {err}");
            }
            // The way found is kept: the next run to the host takes it at once, without
            // first waiting for the straight connection to fail (the walled-in far side's
            // first run starts from the way round the one before found, connecting back).
            let recalled = "as an earlier run found they must";
            let first = route == "connect-back" && !later;
            assert_eq!(err.contains(recalled), !first, "{err}");
            let straight_tried = err.contains("failed (Connection refused");
            assert_eq!(straight_tried, first, "{err}");
            let summary = json(out.lines().last().unwrap_or_default());
            assert_eq!(summary["data_route"], route, "{summary}");
            // The far file as scp writes it, not as an FTP URL nobody typed.
            let remote = if from.starts_with("127.") { from } else { to };
            assert_eq!(summary["url"], remote, "{summary}");
            assert_encrypted(&summary);
        }
        std::fs::remove_file(here.join("got.bin")).unwrap();
        std::fs::remove_file(far.join("up.bin")).unwrap();
        let ways = std::fs::read_to_string(here.join(".local/state/braid/ways")).unwrap();
        assert!(ways.starts_with(&format!("127.0.0.1\t{route}\t")), "{ways}");
    }
    nothing_left_running(&top.path().join("braid"));
}

/// `braid cp` with a server's URL on one side and local paths on the other is a download or
/// an upload, as get and put make them (one command for both worlds); a URL with an ssh host
/// on the other side is refused with what it takes.
#[test]
fn cp_between_here_and_an_ftp_server_downloads_and_uploads() {
    let top = tempdir();
    let root = top.path().join("srv");
    std::fs::create_dir_all(root.join("tree/d")).unwrap();
    let content = random_bytes(3_000_001, 17);
    std::fs::write(root.join("a.bin"), &content).unwrap();
    std::fs::write(root.join("tree/d/f"), b"in a tree").unwrap();
    let server = crate::util::Server::start(&root, &["--anonymous", "--anonymous-write"]);
    let url = |p: &str| format!("ftp://{}/{p}", server.addr);
    let here = top.path().join("here");
    std::fs::create_dir(&here).unwrap();
    let cp = |args: &[&str]| {
        let mut cmd = braid_command(top.path());
        cmd.current_dir(&here).arg("cp").args(args);
        run(&mut cmd, LIMIT)
    };
    let (ok, _, err) = cp(&[&url("a.bin"), "got.bin"]);
    assert!(ok, "{err}");
    assert!(
        std::fs::read(here.join("got.bin")).unwrap() == content,
        "download differs"
    );
    let (ok, _, err) = cp(&["-r", &url("tree"), "."]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(here.join("tree/d/f")).unwrap(), b"in a tree");
    let (ok, _, err) = cp(&["got.bin", &url("back/")]);
    assert!(!ok && err.contains("refused STOR"), "{err}");
    std::fs::create_dir(root.join("back")).unwrap();
    let (ok, _, err) = cp(&["got.bin", &url("back/")]);
    assert!(ok, "{err}");
    assert!(
        std::fs::read(root.join("back/got.bin")).unwrap() == content,
        "upload differs"
    );
    let (ok, _, err) = cp(&[&url("a.bin"), "somehost:/x"]);
    assert!(!ok && err.contains("between here and servers"), "{err}");
}
