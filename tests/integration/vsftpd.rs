//! `braid get`, `put` and `ls` against vsftpd, a server nobody here wrote.
use crate::util::{Daemon, braid, random_bytes, sbin, tempdir};
use std::process::Command;

/// A vsftpd serving `top/root` anonymously, with uploads into `root/pub`.
pub fn start_vsftpd(top: &std::path::Path) -> Daemon {
    start_vsftpd_with(top, "")
}

/// As [`start_vsftpd`], with more configuration lines.
pub fn start_vsftpd_with(top: &std::path::Path, extra: &str) -> Daemon {
    let program = sbin("vsftpd");
    let root = top.join("root");
    std::fs::create_dir_all(root.join("pub")).unwrap();
    std::fs::create_dir_all(top.join("empty")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(root.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    Daemon::start("vsftpd", |port| {
        let conf = top.join("vsftpd.conf");
        let empty = top.join("empty");
        let text =
            braid::bench::servers::vsftpd_conf("127.0.0.1", port, &root, &empty, true, extra);
        std::fs::write(&conf, text).unwrap();
        let mut c = Command::new(&program);
        c.arg(&conf);
        c
    })
}

#[test]
fn braid_client_against_vsftpd() {
    let top = tempdir();
    let vs = start_vsftpd(top.path());
    let root = top.path().join("root");
    let content = random_bytes(3 << 20, 61);
    std::fs::write(root.join("pub/src.bin"), &content).unwrap();
    let base = format!("ftp://127.0.0.1:{}", vs.port);
    let dest = top.path().join("got.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &format!("{base}/pub/src.bin"),
            dest.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "file content differs from what was sent"
    );
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["mode"], "stream");
    assert_eq!(summary["streams"], 1);
    // Resume against vsftpd's REST.
    std::fs::write(top.path().join("res.bin.part"), &content[..1_000_000]).unwrap();
    let res = top.path().join("res.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &format!("{base}/pub/src.bin"),
            res.to_str().unwrap(),
            "--resume",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&res).unwrap() == content,
        "file content differs from what was sent"
    );
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["resumed_from"], 1_000_000);
    let (code, _, err) = braid(
        &["put", dest.to_str().unwrap(), &format!("{base}/pub/up.bin")],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(root.join("pub/up.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    // vsftpd has no MLSD: braid falls back to LIST.
    let (code, out, err) = braid(&["ls", &format!("{base}/pub/")], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("src.bin") && out.contains("up.bin"), "{out}");
    // --json reads LIST's lines: names, kinds and sizes.
    std::fs::create_dir(root.join("pub/sub dir")).unwrap();
    let (code, out, err) = braid(&["ls", "--json", &format!("{base}/pub/")], &[]);
    assert_eq!(code, 0, "{err}");
    let entries = crate::util::json(&out);
    let find = |name: &str| {
        entries
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .clone()
    };
    assert_eq!(find("src.bin")["type"], "file");
    assert_eq!(find("src.bin")["size"], content.len());
    assert_eq!(find("sub dir")["type"], "dir");
    let (code, _, err) = braid(
        &[
            "get",
            &format!("{base}/pub/missing"),
            top.path().join("m").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 5, "{err}");
}

/// Ctrl-C in stream mode (the only mode vsftpd has): ABOR, exit 7, the partial kept, and
/// `--resume` sends only the rest. vsftpd is stopped while the client gets Ctrl-C, so the
/// transfer cannot end first; both directions are paced to 200 MB/s (vsftpd's own limit,
/// which it applies to uploads too), so neither can end between two looks at its progress.
#[test]
fn ctrl_c_in_stream_mode_sends_abor_and_resume_continues() {
    use crate::util::{json, signal_process};
    use rustix::process::Signal;
    use std::time::{Duration, Instant};
    let top = tempdir();
    let vs = start_vsftpd_with(top.path(), "anon_max_rate=200000000\n");
    let root = top.path().join("root");
    let content = random_bytes(256 << 20, 62);
    std::fs::write(root.join("pub/src.bin"), &content).unwrap();
    let base = format!("ftp://127.0.0.1:{}/pub", vs.port);
    let dest = top.path().join("got.bin");
    let part = top.path().join("got.bin.part");
    let local = top.path().join("local.bin");
    std::fs::write(&local, &content).unwrap();
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    // Starts `args`, waits until `grown` holds 16 MiB, then Ctrl-C with vsftpd stopped.
    let interrupt = |args: &[&str], grown: &std::path::Path| {
        let mut child = Command::new(crate::util::BRAID)
            .args(args)
            .arg("-v")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = crate::util::Stderr::follow(&mut child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while size(grown) < 16 << 20
            && Instant::now() < deadline
            && child.try_wait().unwrap().is_none()
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        let done_early = child.try_wait().unwrap().is_some();
        // vsftpd and its session processes, which leave its process group: with only the
        // listener stopped, the session sent the rest of the file (256 MiB in a tenth of a
        // second on loopback) before the Ctrl-C was handled.
        let freeze = |s: Signal| {
            vs.signal(s);
            for p in session_processes(vs.pid()) {
                signal_process(p as u32, s);
            }
        };
        freeze(Signal::STOP);
        signal_process(child.id(), Signal::INT);
        // vsftpd goes on only once the client has stopped its side (its ABOR is out).
        let aborted = stderr.wait_for("> ABOR", Duration::from_secs(30));
        freeze(Signal::CONT);
        let (code, err) = stderr.finish(child, Duration::from_secs(30));
        assert!(aborted, "no ABOR after Ctrl-C: {err}");
        assert!(!done_early, "the transfer ended before Ctrl-C: {err}");
        assert_eq!(code, Some(7), "{err}");
        assert!(err.contains("Ctrl-C") && err.contains("ABOR"), "{err}");
    };

    let url = format!("{base}/src.bin");
    interrupt(&["get", &url, dest.to_str().unwrap()], &part);
    let kept = size(&part) as usize;
    assert!(
        !dest.exists(),
        "an interrupted download took the final name"
    );
    assert!(kept > 0 && kept < content.len(), "{kept} bytes kept");
    assert!(std::fs::read(&part).unwrap() == content[..kept]);
    let (code, out, err) = braid(
        &["get", &url, dest.to_str().unwrap(), "--resume", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["resumed_from"], kept, "{out}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "resumed download differs"
    );

    let up = format!("{base}/up.bin");
    let stored = root.join("pub/up.bin");
    interrupt(&["put", local.to_str().unwrap(), &up], &stored);
    let held = size(&stored);
    assert!(held > 0 && held < content.len() as u64, "{held} bytes held");
    let (code, out, err) = braid(
        &["put", local.to_str().unwrap(), &up, "--resume", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["resumed_from"], held, "{out}");
    assert!(
        std::fs::read(&stored).unwrap() == content,
        "resumed upload differs"
    );
}

/// FTPS against vsftpd with TLS required for login and data, and its default
/// `require_ssl_reuse=YES`: each data connection must resume the control connection's TLS
/// session, which braid's client does. The certificate is made as admins make it (`openssl req
/// -x509 -nodes`) and given with --tls-ca.
#[test]
fn braid_client_against_vsftpd_over_tls() {
    let top = tempdir();
    let (cert, key) =
        crate::util::openssl_certificate(top.path(), "server", "IP:127.0.0.1,DNS:localhost");
    let vs = start_vsftpd_with(
        top.path(),
        &format!(
            "ssl_enable=YES\nallow_anon_ssl=YES\nforce_anon_logins_ssl=YES\nforce_anon_data_ssl=YES\n\
             require_ssl_reuse=YES\nrsa_cert_file={}\nrsa_private_key_file={}\n",
            cert, key
        ),
    );
    let root = top.path().join("root");
    let content = random_bytes(2 << 20, 62);
    std::fs::write(root.join("pub/src.bin"), &content).unwrap();
    let base = format!("ftp://127.0.0.1:{}", vs.port);
    let ca = cert.as_str();
    let dest = top.path().join("got.bin");
    // One connection, then ranges: each session its own TLS login, each data connection
    // resuming its own session.
    for (extra, mode) in [(&[][..], "stream"), (&["-n", "2"][..], "stream-segmented")] {
        let _ = std::fs::remove_file(&dest);
        let url = format!("{base}/pub/src.bin");
        let mut args = vec![
            "get",
            "--tls-ca",
            ca,
            &url,
            dest.to_str().unwrap(),
            "--json",
        ];
        args.extend(extra);
        let (code, out, err) = braid(&args, &[]);
        assert_eq!(code, 0, "{err}");
        assert!(std::fs::read(&dest).unwrap() == content);
        assert_eq!(crate::util::json(&out)["mode"], mode, "{out}");
    }
    let (code, _, err) = braid(
        &[
            "put",
            "--tls-ca",
            ca,
            dest.to_str().unwrap(),
            &format!("{base}/pub/up.bin"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(root.join("pub/up.bin")).unwrap() == content);
    let (code, out, err) = braid(&["ls", "--tls-ca", ca, &format!("{base}/pub/")], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("src.bin") && out.contains("up.bin"), "{out}");
    // Without TLS, vsftpd refuses the login: braid says so.
    let (code, _, err) = braid(&["ls", &format!("{base}/pub/")], &[]);
    assert_eq!(code, 4, "{err}");
}

/// braid's `--xferlog` lines read as vsftpd's for the same transfers (curl downloading and
/// uploading the same file from each), field for field but the time and duration.
#[test]
fn xferlog_lines_read_as_vsftpds() {
    crate::util::require("curl");
    let top = tempdir();
    let vs_log = top.path().join("vsftpd.xferlog");
    let vs = start_vsftpd_with(
        top.path(),
        &format!(
            "xferlog_enable=YES\nxferlog_std_format=YES\nxferlog_file={}\n",
            vs_log.display()
        ),
    );
    let content = random_bytes(300_000, 63);
    std::fs::write(top.path().join("root/pub/x.bin"), &content).unwrap();
    // The same directory, so the paths logged are the same.
    let braid_root = top.path().join("root");
    let braid_log = top.path().join("braid.xferlog");
    let server = crate::util::Server::start(
        &braid_root,
        &[
            "--anonymous-write",
            "--xferlog",
            braid_log.to_str().unwrap(),
        ],
    );
    let local = top.path().join("local.bin");
    std::fs::write(&local, &content).unwrap();
    let mut lines = Vec::new();
    for (base, log) in [
        (format!("ftp://127.0.0.1:{}", vs.port), &vs_log),
        (format!("ftp://127.0.0.1:{}", server.port()), &braid_log),
    ] {
        for args in [
            vec!["-sSf", "-o", "/dev/null", &format!("{base}/pub/x.bin")],
            vec![
                "-sSf",
                "-T",
                local.to_str().unwrap(),
                &format!("{base}/pub/y.bin"),
            ],
        ] {
            let (ok, _, err) = crate::util::run(
                Command::new("curl").args(&args),
                std::time::Duration::from_secs(30),
            );
            assert!(ok, "curl {args:?}: {err}");
        }
        let text = std::fs::read_to_string(log).unwrap();
        lines.push(text);
    }
    let fields = |text: &str| -> Vec<Vec<String>> {
        text.lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    };
    let (theirs, ours) = (fields(&lines[0]), fields(&lines[1]));
    assert_eq!(theirs.len(), 2, "vsftpd wrote: {}", lines[0]);
    assert_eq!(ours.len(), 2, "braid wrote: {}", lines[1]);
    for (t, o) in theirs.iter().zip(&ours) {
        assert_eq!(o.len(), t.len(), "vsftpd: {t:?}\nbraid: {o:?}");
        // Date: the same weekday, month and year.
        assert_eq!((&o[0], &o[1], &o[4]), (&t[0], &t[1], &t[4]), "{t:?} {o:?}");
        assert!(o[5].parse::<u64>().unwrap() >= 1, "{o:?}");
        // The user: an anonymous one's password, which vsftpd (no_anon_password) does not
        // ask for and curl gives.
        assert_eq!(t[13], "<no_password>");
        assert_eq!(o[13], "ftp@example.com");
        assert_eq!(
            (&o[6..13], &o[14..]),
            (&t[6..13], &t[14..]),
            "vsftpd: {t:?}\nbraid: {o:?}"
        );
    }
}

/// A segmented download (`get URL DEST` and `args`) from vsftpd holding each session to
/// 1 MB/s, of a 24 MiB file, once the client's record names a stored range: every range is
/// then under way (several seconds each: vsftpd lets a session go faster than its limit for
/// a while, and the record is saved once a second; at 4 MB/s a fast machine finished a
/// four-way download in 1.1 s, before a record with a range was seen). Returns vsftpd, the
/// file, the URL and the client.
fn slow_segmented_get(
    top: &std::path::Path,
    seed: u64,
    args: &[&str],
) -> (Daemon, Vec<u8>, String, std::process::Child) {
    let vs = start_vsftpd_with(top, "anon_max_rate=1000000\n");
    let content = random_bytes(24 << 20, seed);
    std::fs::write(top.join("root/pub/src.bin"), &content).unwrap();
    let url = format!("ftp://127.0.0.1:{}/pub/src.bin", vs.port);
    let dest = top.join("got.bin");
    let child = crate::util::braid_command(top)
        .args(["get", &url, dest.to_str().unwrap()])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::util::wait_for_recorded_range(&top.join("got.bin.part.braid"));
    (vs, content, url, child)
}

/// A daemon's descendants: vsftpd's session processes (they leave its process group).
fn session_processes(leader: u32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command's closing parenthesis: state, then the parent's pid.
            let ppid = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![leader as i32];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    found.remove(0);
    found
}

/// `-n 4` against a server without MODE E: four ranges, each on its own session with REST,
/// byte-identical; one session killed mid-way leaves the rest of its range to a new one.
#[test]
fn segmented_download_from_vsftpd_survives_a_killed_session() {
    use crate::util::{json, wait_timeout};
    use std::time::Duration;
    let top = tempdir();
    let (vs, content, _, mut child) = slow_segmented_get(top.path(), 63, &["-n", "4", "--json"]);
    let sessions = session_processes(vs.pid());
    assert!(!sessions.is_empty(), "no vsftpd session to kill");
    let victim = *sessions.iter().max().unwrap();
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(victim).unwrap(),
        rustix::process::Signal::KILL,
    );
    let status = wait_timeout(&mut child, Duration::from_secs(60)).expect("the download hung");
    let out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    let err = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert!(status.success(), "{err}");
    let s = json(&out);
    assert_eq!(s["mode"], "stream-segmented", "{out}");
    assert_eq!(s["streams"], 4, "{out}");
    // Four ranges, and the killed session's rest on a fifth connection.
    assert!(s["new_data_connections"].as_u64() > Some(4), "{out}");
    let dest = top.path().join("got.bin");
    assert!(std::fs::read(&dest).unwrap() == content, "the file differs");
    assert!(
        !top.path().join("got.bin.part.braid").exists(),
        "the record outlived the download"
    );
}

/// A segmented download stopped by Ctrl-C leaves a partial with holes and its record;
/// `--resume` (with any -n) fetches exactly the holes.
#[test]
fn an_interrupted_segmented_download_resumes_only_its_holes() {
    use crate::util::{finish_child, resume_get, signal_process};
    use rustix::process::Signal;
    use std::time::Duration;
    let top = tempdir();
    let (_vs, content, url, child) = slow_segmented_get(top.path(), 64, &["-n", "3", "-q"]);
    signal_process(child.id(), Signal::INT);
    let (code, err) = finish_child(child, Duration::from_secs(30));
    assert_eq!(code, Some(7), "{err}");
    let record = std::fs::read_to_string(top.path().join("got.bin.part.braid")).unwrap();
    assert!(record.contains(','), "three ranges leave holes: {record}");
    let dest = top.path().join("got.bin");
    let kept = resume_get(&url, &dest, content.len());
    assert!(kept > 0, "nothing was kept");
    assert!(std::fs::read(&dest).unwrap() == content, "the file differs");
}

/// A server that allows two sessions per client refuses the other two of `-n 4` (421): the
/// ranges go to the two it allows, and the download completes.
#[test]
fn segmented_download_backs_off_to_the_sessions_the_server_allows() {
    let top = tempdir();
    let vs = start_vsftpd_with(top.path(), "max_per_ip=2\n");
    let content = random_bytes(8 << 20, 65);
    std::fs::write(top.path().join("root/pub/src.bin"), &content).unwrap();
    let url = format!("ftp://127.0.0.1:{}/pub/src.bin", vs.port);
    let dest = top.path().join("got.bin");
    let (code, out, err) = braid(
        &["get", &url, dest.to_str().unwrap(), "-n", "4", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let s = crate::util::json(&out);
    assert_eq!(s["mode"], "stream-segmented", "{out}");
    assert_eq!(s["streams"], 2, "{out}");
    assert!(std::fs::read(&dest).unwrap() == content, "the file differs");
}

/// Background mode against a server that is not braid steers the one stream-mode connection
/// itself: a download by the window it advertises, an upload by pacing its own socket, both
/// fed by the round trips the kernel measures on the data connection. Both files arrive
/// whole and the summaries carry what the controller saw; the upload stays under the rate
/// limit background mode takes as its ceiling. Ranged downloads (-n 4) are refused: one
/// connection is what it steers.
#[test]
fn background_mode_steers_one_stream_connection_to_another_server() {
    let top = tempdir();
    // vsftpd sends at 4 MB/s, so the download lasts long enough for the controller to see it.
    let vs = start_vsftpd_with(top.path(), "anon_max_rate=4000000\n");
    let content = random_bytes(6 << 20, 88);
    std::fs::write(top.path().join("root/pub/src.bin"), &content).unwrap();
    let url = format!("ftp://127.0.0.1:{}/pub/src.bin", vs.port);
    let dest = top.path().join("got.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &url,
            dest.to_str().unwrap(),
            "--background",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "the download differs"
    );
    let s = crate::util::json(&out);
    assert_eq!(s["mode"], "stream", "{out}");
    assert!(s["background"]["probes"].as_u64() > Some(0), "{out}");

    let src = top.path().join("up.bin");
    std::fs::write(&src, &content).unwrap();
    let up = format!("ftp://127.0.0.1:{}/pub/up.bin", vs.port);
    let limit = 3_000_000.0;
    let (code, out, err) = braid(
        &[
            "put",
            src.to_str().unwrap(),
            &up,
            "--background",
            "--rate-limit",
            "3MB",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(top.path().join("root/pub/up.bin")).unwrap() == content,
        "the upload differs"
    );
    let s = crate::util::json(&out);
    assert!(s["background"]["probes"].as_u64() > Some(0), "{out}");
    let rate = s["bytes_per_second"].as_f64().unwrap();
    assert!(rate < 1.2 * limit, "{rate} B/s past a limit of {limit}");

    let (code, _, err) = braid(
        &[
            "get",
            &url,
            dest.to_str().unwrap(),
            "--background",
            "-n",
            "4",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("drop -n"), "{err}");
}

/// vsftpd reads pipelined commands in order, so braid sends it the login with FEAT, TYPE and
/// SIZE in one flight, and EPSV, REST and RETR in another: a session set up in two round
/// trips, not seven (each range of a segmented download starts with one).
#[test]
fn commands_to_vsftpd_go_in_flights_and_the_file_arrives_whole() {
    let top = tempdir();
    let vs = start_vsftpd(top.path());
    let content = random_bytes(3 << 20, 65);
    std::fs::write(top.path().join("root/pub/f.bin"), &content).unwrap();
    let dest = top.path().join("got.bin");
    // Half of it already here: the rest is fetched from REST 1572864.
    std::fs::write(top.path().join("got.bin.part"), &content[..3 << 19]).unwrap();
    let url = format!("ftp://127.0.0.1:{}/pub/f.bin", vs.port);
    let (code, _, err) = braid(
        &["get", "-v", "--resume", &url, dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&dest).unwrap() == content, "the file differs");
    let lines: Vec<&str> = err.lines().collect();
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in:\n{err}"))
    };
    // Sent before the first answer came.
    assert!(at("> SIZE ") < at("< 230"), "{err}");
    assert!(at("> REST 1572864") < at("< 229"), "{err}");
    assert!(at("> RETR ") < at("< 229"), "{err}");
}
