//! `braid cp ftp://A/f ftp://B/g`: server A sends straight to server B, each on its own
//! loopback address (127.0.0.2 and .3), so A's data connections reach B from an address that
//! is not the client's (127.0.0.1).
use crate::util::{
    Raw, Server, add_account, braid_command, openssl_certificate, random_bytes, run, tempdir,
};
use std::path::Path;
use std::time::Duration;

/// Two TLS servers: A serves `a/` to alice (read-only), B lets bob write to `b/`.
struct Pair {
    a: Server,
    b: Server,
    cert: String,
}

fn pair(top: &Path, b_extra: &[&str]) -> Pair {
    let (cert, key) = openssl_certificate(top, "peers", "IP:127.0.0.2,IP:127.0.0.3");
    for d in ["a", "b"] {
        std::fs::create_dir(top.join(d)).unwrap();
    }
    let (ua, ub) = (top.join("users-a"), top.join("users-b"));
    add_account(&ua, "alice", &top.join("a"), "secret-a", false);
    add_account(&ub, "bob", &top.join("b"), "secret-b", true);
    let tls = ["--tls-cert", cert.as_str(), "--tls-key", key.as_str()];
    let mut args_a = vec!["--users", ua.to_str().unwrap()];
    args_a.extend(tls);
    let mut args_b = vec!["--users", ub.to_str().unwrap()];
    args_b.extend(tls);
    args_b.extend(b_extra);
    Pair {
        a: Server::start_at("127.0.0.2:0", &top.join("a"), &args_a),
        b: Server::start_at("127.0.0.3:0", &top.join("b"), &args_b),
        cert,
    }
}

impl Pair {
    /// `braid cp [extra] ftp://A/from ftp://B/to --tls`, trusting the pair's certificate.
    fn command(&self, home: &Path, extra: &[&str], from: &str, to: &str) -> std::process::Command {
        let mut cmd = braid_command(home);
        cmd.arg("cp")
            .args(extra)
            .arg(format!("ftp://alice:secret-a@{}/{from}", self.a.addr))
            .arg(format!("ftp://bob:secret-b@{}/{to}", self.b.addr))
            .args(["--tls", "--tls-ca", &self.cert]);
        cmd
    }

    fn cp(&self, home: &Path, from: &str, to: &str) -> (bool, String, String) {
        let mut cmd = self.command(home, &["--json", "-n", "3"], from, to);
        run(&mut cmd, Duration::from_secs(120))
    }
}

#[test]
fn a_file_goes_from_one_braid_server_straight_to_another_and_both_ends_check_it() {
    let top = tempdir();
    let p = pair(top.path(), &[]);
    let data = random_bytes(20 << 20, 41);
    std::fs::write(top.path().join("a/big.bin"), &data).unwrap();
    let home = tempdir();
    let (ok, out, err) = p.cp(home.path(), "big.bin", "");
    assert!(ok, "{err}");
    assert!(
        std::fs::read(top.path().join("b/big.bin")).unwrap() == data,
        "the copy differs"
    );
    let v = crate::util::json(&out);
    assert_eq!(v["route"], "third-party", "{v}");
    assert_eq!(v["destination"], format!("{}/big.bin", p.b.addr), "{v}");
    assert_eq!(v["bytes"], data.len() as u64, "{v}");
    assert_eq!(v["streams"], 3, "{v}");
    assert_eq!(v["checksum"]["algorithm"], "XXH3", "{v}");
    // A sent on 3 connections and B took them: neither saw a data connection from the
    // client, whose address is 127.0.0.1 (A's log names the session's peer, the client).
    let (la, lb) = (p.a.log(), p.b.log());
    assert!(
        la.contains("direction=\"download\" mode=\"E\" data_connections=3")
            && la.contains("outcome=\"complete\""),
        "{la}"
    );
    assert!(
        lb.contains("direction=\"upload\" mode=\"E\"") && lb.contains("outcome=\"complete\""),
        "{lb}"
    );
    assert!(!lb.contains("refused a data connection"), "{lb}");
}

/// Only the sending server sees the path between the two, so with `--background` it yields
/// to other traffic by itself (OPTS RETR Background=ms); without, it does not.
#[test]
fn a_copy_in_background_has_the_sending_server_yield_by_itself() {
    let top = tempdir();
    let p = pair(top.path(), &[]);
    let data = random_bytes(6 << 20, 43);
    std::fs::write(top.path().join("a/big.bin"), &data).unwrap();
    let home = tempdir();
    let (ok, _, err) = p.cp(home.path(), "big.bin", "plain.bin");
    assert!(ok, "{err}");
    assert!(p.a.log().contains("background=false"), "{}", p.a.log());
    assert!(!p.a.log().contains("background=true"), "{}", p.a.log());
    let mut cmd = p.command(
        home.path(),
        &["--background", "--background-target", "25ms"],
        "big.bin",
        "yielded.bin",
    );
    let (ok, _, err) = run(&mut cmd, Duration::from_secs(120));
    assert!(ok, "{err}");
    assert!(
        std::fs::read(top.path().join("b/yielded.bin")).unwrap() == data,
        "the copy differs"
    );
    let la = p.a.log();
    assert!(la.contains("background=true"), "{la}");
    // Its controller ran.
    assert!(la.contains("background: queue"), "{la}");
}

/// A copy cut off part-way (the client killed by Ctrl-C, its servers left to notice) keeps
/// what B received in B's partial; `--resume` has A send only the rest, from the ranges B's
/// markers reported, and the file ends whole and checked at both ends.
#[test]
fn a_copy_between_servers_cut_off_part_way_resumes_with_only_the_rest() {
    use crate::util::{finish_child, signal_process, upload_record};
    use rustix::process::Signal;
    let top = tempdir();
    let p = pair(top.path(), &[]);
    // At 4 MB/s, 7.9 s: B's first markers come after 5 s.
    let data = random_bytes(30 << 20, 47);
    std::fs::write(top.path().join("a/big.bin"), &data).unwrap();
    let (home, state) = (tempdir(), tempdir());
    let mut first = p.command(home.path(), &["--rate-limit", "4MB"], "big.bin", "big.bin");
    let mut child = first
        .env("XDG_STATE_HOME", state.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while upload_record(state.path()).is_none_or(|r| r.is_empty()) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the copy ended before it was cut off"
        );
        assert!(std::time::Instant::now() < deadline, "no range recorded");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal_process(child.id(), Signal::INT);
    let (code, err) = finish_child(child, Duration::from_secs(30));
    assert_ne!(code, Some(0), "{err}");
    let recorded = upload_record(state.path()).expect("no record of the copy");
    assert!(
        !top.path().join("b/big.bin").exists(),
        "a cut-off copy took the final name"
    );
    // B keeps its partial once it has seen the session go.
    let partial = top.path().join("b/.big.bin.braid-part");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !(partial.exists() && p.b.log().contains("outcome=")) {
        assert!(std::time::Instant::now() < deadline, "{}", p.b.log());
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut again = p.command(home.path(), &["--json", "--resume"], "big.bin", "big.bin");
    again.env("XDG_STATE_HOME", state.path());
    let (ok, out, err) = run(&mut again, Duration::from_secs(120));
    assert!(ok, "{err}");
    let v = crate::util::json(&out);
    assert_eq!(v["resumed_from"], recorded.len(), "{v}");
    assert!(
        std::fs::read(top.path().join("b/big.bin")).unwrap() == data,
        "the resumed copy differs"
    );
    assert!(!partial.exists(), "the partial outlived the copy");
    assert_eq!(
        upload_record(state.path()),
        None,
        "the record outlived the copy"
    );
    // A's second transfer sent only what B lacked.
    let rest = data.len() as u64 - recorded.len();
    let la = p.a.log();
    assert!(
        la.lines()
            .rfind(|l| l.contains("direction=\"download\""))
            .is_some_and(
                |l| l.contains(&format!(" bytes={rest} ")) && l.contains("outcome=\"complete\"")
            ),
        "A did not send just the {rest} bytes B lacked:\n{la}"
    );
}

#[test]
fn a_server_told_no_third_party_takes_no_part_and_bounces_stay_refused() {
    let top = tempdir();
    let p = pair(top.path(), &["--no-third-party"]);
    std::fs::write(top.path().join("a/f.bin"), random_bytes(1000, 3)).unwrap();
    let home = tempdir();
    let (ok, _, err) = p.cp(home.path(), "f.bin", "f.bin");
    assert!(!ok);
    assert!(err.contains("--no-third-party"), "{err}");
    assert!(!top.path().join("b/f.bin").exists());
    // Without TLS the copy is not tried at all.
    let (code, _, err) = crate::util::braid(
        &[
            "cp",
            &format!("ftp://alice:secret-a@{}/f.bin", p.a.addr),
            &format!("ftp://bob:secret-b@{}/f.bin", p.b.addr),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("needs TLS on both"), "{err}");
    // The classic FXP bounce, PORT to another host in a session in clear, is refused.
    let mut raw = Raw::connect(p.a.addr);
    raw.send("EPRT |1|127.0.0.3|5000|");
    let r = raw.reply();
    assert!(r.starts_with("530 ") || r.starts_with("504 "), "{r}");
    raw.send("OPTS BRAID PEER=*");
    assert!(raw.reply().starts_with("534 "));
}

/// A stranger who reaches the receiving server's data port during a copy (which takes data
/// connections from any address there) proves no binding: it is refused and warned about,
/// gets nothing, and the copy goes on and completes.
#[test]
fn a_stranger_at_the_receiving_servers_data_port_is_refused_and_the_copy_completes() {
    let top = tempdir();
    let p = pair(top.path(), &[]);
    let data = random_bytes(16 << 20, 5);
    std::fs::write(top.path().join("a/f.bin"), &data).unwrap();
    let home = tempdir();
    // 4 MB/s: four seconds of copy for the stranger to arrive in.
    let mut child = p
        .command(
            home.path(),
            &["-v", "--rate-limit", "4MB"],
            "f.bin",
            "f.bin",
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = crate::util::Stderr::follow(&mut child);
    let limit = Duration::from_secs(60);
    assert!(stderr.wait_for("> RETR", limit), "{}", stderr.so_far());
    assert!(stderr.wait_for("< 150", limit), "{}", stderr.so_far());
    let port = crate::util::passive_port(&stderr.so_far());
    let got = crate::util::stranger_reads(std::net::SocketAddr::new(p.b.addr.ip(), port));
    let (code, err) = stderr.finish(child, limit);
    assert_eq!(code, Some(0), "{err}");
    assert!(std::fs::read(top.path().join("b/f.bin")).unwrap() == data);
    // A TLS alert record (type 21) is all the stranger may see.
    assert!(
        got.is_empty() || (got[0] == 21 && got.len() < 64),
        "the stranger read {} bytes",
        got.len()
    );
    let lb = p.b.log();
    assert!(
        lb.contains("refused a data connection from 127.0.0.9"),
        "{lb}"
    );
}

/// `-r` copies a directory and everything in it from A to B (nested and empty directories,
/// an empty file, a file too large for a bundle, which goes alone on several connections);
/// `--update` then copies only what changed on A.
#[test]
fn a_tree_goes_from_server_to_server_and_update_moves_only_what_changed() {
    let top = tempdir();
    let p = pair(top.path(), &[]);
    let src = top.path().join("a/tree");
    std::fs::create_dir_all(src.join("sub/deep")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    std::fs::write(src.join("small.bin"), random_bytes(3000, 1)).unwrap();
    std::fs::write(src.join("zero"), b"").unwrap();
    std::fs::write(src.join("sub/big.bin"), random_bytes(65 << 20, 2)).unwrap();
    std::fs::write(src.join("sub/deep/x.txt"), b"deep\n").unwrap();
    let home = tempdir();
    let cp = |extra: &[&str]| {
        let args = [&["-r", "--json", "-n", "3"], extra].concat();
        let mut cmd = p.command(home.path(), &args, "tree", "");
        let (ok, out, err) = run(&mut cmd, Duration::from_secs(120));
        assert!(ok, "{err}");
        crate::util::json(&out)
    };
    let first = cp(&[]);
    let dst = top.path().join("b/tree");
    for f in ["small.bin", "zero", "sub/big.bin", "sub/deep/x.txt"] {
        assert!(
            std::fs::read(src.join(f)).unwrap() == std::fs::read(dst.join(f)).unwrap(),
            "{f} differs"
        );
    }
    assert!(dst.join("empty").is_dir());
    assert_eq!(first["files"].as_array().unwrap().len(), 4, "{first}");
    let big = first["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["source"] == "tree/sub/big.bin")
        .unwrap();
    assert_eq!(big["streams"], 3, "{first}");
    assert!(
        big["bundle"].is_null(),
        "a file over 64 MiB went in a bundle: {big}"
    );
    // One file changes on A: --update moves it alone.
    std::fs::write(src.join("small.bin"), random_bytes(3001, 9)).unwrap();
    let second = cp(&["--update"]);
    let moved: Vec<&str> = second["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["source"].as_str().unwrap())
        .collect();
    assert_eq!(moved, ["tree/small.bin"], "{second}");
    assert_eq!(second["skipped"].as_array().unwrap().len(), 3, "{second}");
    assert_eq!(
        std::fs::read(dst.join("small.bin")).unwrap().len(),
        3001,
        "the changed file was not copied again"
    );
}

/// A tree of many small files goes from A to B many files to a transfer (bundles: two here,
/// the first of 4 MiB), each file whole and with A's time, into a destination whose parents
/// B did not have; one JSON entry per file says which bundle it went in.
#[test]
fn a_trees_small_files_go_between_servers_in_bundles_into_parents_made_for_them() {
    use std::os::unix::fs::MetadataExt;
    let top = tempdir();
    let p = pair(top.path(), &[]);
    let src = top.path().join("a/many");
    let mut names = Vec::new();
    for d in 0..3 {
        std::fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for i in 0..200 {
            let name = format!("d{d}/f{i}");
            let len = (i * 7919 + d * 31) % 16000;
            std::fs::write(src.join(&name), random_bytes(len, (d * 1000 + i) as u64)).unwrap();
            names.push(name);
        }
    }
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    std::fs::File::options()
        .write(true)
        .open(src.join("d1/f5"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    let home = tempdir();
    let mut cmd = p.command(
        home.path(),
        &["-r", "--json", "-n", "3"],
        "many",
        "new/deep/",
    );
    let (ok, out, err) = run(&mut cmd, Duration::from_secs(120));
    assert!(ok, "{err}");
    let v = crate::util::json(&out);
    let dst = top.path().join("b/new/deep/many");
    for name in &names {
        assert!(
            std::fs::read(src.join(name)).unwrap() == std::fs::read(dst.join(name)).unwrap(),
            "{name} differs"
        );
    }
    let meta = std::fs::metadata(dst.join("d1/f5")).unwrap();
    assert_eq!(meta.mtime(), 1_600_000_000, "the time A gave was not kept");
    let files = v["files"].as_array().unwrap();
    assert_eq!(files.len(), names.len(), "{v}");
    let mut bundles: Vec<u64> = files
        .iter()
        .map(|f| {
            f["bundle"]
                .as_u64()
                .unwrap_or_else(|| panic!("not bundled: {f}"))
        })
        .collect();
    bundles.dedup();
    assert!(
        bundles.len() >= 2,
        "a tree of 4.8 MB went in one bundle: {bundles:?}"
    );
    assert_eq!(
        bundles.iter().sum::<u64>(),
        names.len() as u64,
        "{bundles:?}"
    );
    assert!(v["failed"].as_array().unwrap().is_empty(), "{v}");
}

/// A file B cannot store (a directory holds its name there) fails alone: its bundle (the
/// second, which goes on the connections the first left open, B's data allowed ahead of its
/// answer) is refused, and that bundle's files go again one by one; the first bundle's stay
/// stored. A destination B can neither find nor make fails the copy at once, with B's
/// reason, before any file is tried.
#[test]
fn a_file_b_refuses_fails_alone_and_a_destination_b_cannot_make_fails_at_once() {
    let top = tempdir();
    let p = pair(top.path(), &[]);
    let src = top.path().join("a/few");
    std::fs::create_dir_all(&src).unwrap();
    // 1 MiB each: the first bundle (4 MiB) takes f0-f3, the second f4-f7 (A lists by name).
    for i in 0..8 {
        std::fs::write(src.join(format!("f{i}")), random_bytes(1 << 20, i as u64)).unwrap();
    }
    std::fs::create_dir_all(top.path().join("b/few/f6")).unwrap();
    let home = tempdir();
    let mut cmd = p.command(home.path(), &["-r", "--json"], "few", "few");
    let (ok, out, err) = run(&mut cmd, Duration::from_secs(120));
    assert!(!ok, "a file B could not store was reported copied: {out}");
    let v = crate::util::json(&out);
    let failed: Vec<&str> = v["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["file"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["f6"], "{v}\n{err}");
    let bundled: Vec<(&str, Option<u64>)> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["source"].as_str().unwrap(), f["bundle"].as_u64()))
        .collect();
    assert_eq!(
        bundled,
        [
            ("few/f0", Some(4)),
            ("few/f1", Some(4)),
            ("few/f2", Some(4)),
            ("few/f3", Some(4)),
            ("few/f4", None),
            ("few/f5", None),
            ("few/f7", None),
        ],
        "{v}"
    );
    for i in (0..8).filter(|&i| i != 6) {
        let name = format!("f{i}");
        assert!(
            std::fs::read(src.join(&name)).unwrap()
                == std::fs::read(top.path().join("b/few").join(&name)).unwrap(),
            "{name} differs"
        );
    }
    std::fs::write(top.path().join("b/plain"), b"a file, not a directory").unwrap();
    let mut cmd = p.command(home.path(), &["-r"], "few", "plain/into");
    let (ok, _, err) = run(&mut cmd, Duration::from_secs(60));
    assert!(!ok, "copied into a directory that cannot exist");
    assert!(err.contains("making the directory plain/into"), "{err}");
    assert!(!err.contains("f0"), "files were tried: {err}");
}

/// globus-url-copy driving a third-party transfer between two braid servers (PASV at B, PORT
/// to B's address at A, without data-channel authentication) is the FTP bounce: A refuses the
/// PORT with the reason, B gets nothing, and globus-url-copy fails instead of hanging.
#[test]
fn globus_url_copy_between_braid_servers_is_refused_as_a_bounce() {
    crate::util::require("globus-url-copy");
    let top = tempdir();
    for d in ["ga", "gb"] {
        std::fs::create_dir(top.path().join(d)).unwrap();
    }
    std::fs::write(top.path().join("ga/g.bin"), random_bytes(100_000, 8)).unwrap();
    let a = Server::start_at("127.0.0.2:0", &top.path().join("ga"), &["--anonymous"]);
    let b = Server::start_at(
        "127.0.0.3:0",
        &top.path().join("gb"),
        &["--anonymous", "--anonymous-write"],
    );
    let (ok, _, err) = run(
        std::process::Command::new("globus-url-copy").args([
            "-nodcau",
            &format!("ftp://{}/g.bin", a.addr),
            &format!("ftp://{}/g.bin", b.addr),
        ]),
        Duration::from_secs(60),
    );
    assert!(!ok, "globus-url-copy copied between braid servers: {err}");
    assert!(err.contains("504 Refused"), "{err}");
    // (B may keep an empty partial of the upload it was asked for, as for any broken one.)
    assert!(!top.path().join("gb/g.bin").exists(), "B has the file");
}
