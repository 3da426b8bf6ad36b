//! A full disk (or a file size limit) on either side: a clear error, nothing lost, and `--resume`
//! continues. The disk-full tests mount a small tmpfs in a private mount namespace (`unshare
//! --mount`), which disappears with the processes inside it, so nothing is left mounted when a
//! test fails.
use crate::util::{
    BRAID, Daemon, Server, braid, json, random_bytes, require, run, serve_files, tempdir,
};
use std::process::Command;
use std::time::Duration;

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the disk-full tests mount a small tmpfs in a private mount namespace: run them as root"
    );
    require("unshare");
}

/// A download that fills the disk keeps what arrived and its record of it; with room again,
/// `--resume` fetches only the rest.
#[test]
fn a_download_that_fills_the_disk_resumes_once_there_is_room() {
    require_root();
    let content = random_bytes(12 << 20, 71);
    let (top, root, server) = serve_files(&[("f.bin", &content)], &[]);
    let disk = top.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let dest = disk.join("f.bin");
    let url = server.url("f.bin");
    let d = dest.display();
    // Everything that needs the small disk runs inside one namespace; what the test checks
    // is printed before it goes.
    let script = format!(
        "mount -t tmpfs -o size=4m tmpfs {disk} || exit 99
         {BRAID} get {url} {d} -n 4 -q; echo \"first=$?\"
         echo \"record=$(cat {d}.part.braid)\"
         mount -o remount,size=16m {disk}
         {BRAID} get {url} {d} -n 4 --resume --json; echo \"second=$?\"
         cmp -s {d} {src} && echo same
         ls -a {disk}",
        disk = disk.display(),
        src = root.join("f.bin").display(),
    );
    let (_, out, err) = run(
        Command::new("unshare").args(["--mount", "sh", "-c", &script]),
        Duration::from_secs(120),
    );
    assert!(!out.is_empty(), "the namespace script failed: {err}");
    let line = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {out}\n{err}"))
            .to_string()
    };
    assert_eq!(line("first="), "6", "{err}");
    assert!(
        err.contains("No space left on device") && err.contains("--resume"),
        "{err}"
    );
    let record = json(&line("record="));
    let recorded = record["ranges"].as_str().unwrap();
    assert!(!recorded.is_empty(), "nothing recorded: {record}");
    let ranges = braid_proto::ranges::RangeSet::parse(recorded).unwrap();
    assert_eq!(line("second="), "0", "{err}");
    let summary = out.lines().find(|l| l.starts_with('{')).unwrap();
    assert_eq!(json(summary)["resumed_from"], ranges.len(), "{summary}");
    assert!(out.lines().any(|l| l == "same"), "the resumed file differs");
    // Only the file: no partial, record or reserved space left behind.
    let names: Vec<&str> = out.lines().skip_while(|l| *l != "same").skip(1).collect();
    assert_eq!(names, [".", "..", "f.bin"], "{out}");
}

/// An upload that fills the server's disk gets 552 and exit 7 (resumable), the server keeps
/// serving, and nothing appears under the final name.
#[test]
fn an_upload_that_fills_the_servers_disk_is_refused_cleanly() {
    require_root();
    let top = tempdir();
    let disk = top.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let local = top.path().join("up.bin");
    std::fs::write(&local, random_bytes(12 << 20, 72)).unwrap();
    let server = Daemon::start("braid serve on a 4 MiB tmpfs", |port| {
        let script = format!(
            "mount -t tmpfs -o size=4m tmpfs {disk} && exec {BRAID} serve --root {disk} \
             --listen 127.0.0.1:{port} --anonymous-write",
            disk = disk.display()
        );
        let mut c = Command::new("unshare");
        c.args(["--mount", "sh", "-c", &script]);
        c
    });
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let (code, _, err) = braid(
        &[
            "put",
            local.to_str().unwrap(),
            &format!("{base}/up.bin"),
            "-n",
            "4",
        ],
        &[],
    );
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("552") && err.contains("no space"), "{err}");
    // Still serving; the final name is not there, and the partial kept for a resume is out
    // of sight.
    let (code, out, err) = braid(&["ls", &format!("{base}/"), "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let names: Vec<String> = json(&out)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.is_empty(), "{out}");
}

/// A download tree where some files cannot be written (`ulimit -f`: no file may pass 2 MiB)
/// fails those files alone: every other file arrives whole, because a session left with a
/// transfer's replies still coming is dropped rather than reused (its next file took those
/// replies for its own: "unexpected outcome", "refused: 229 Entering Extended Passive Mode"),
/// and braid is not killed by SIGXFSZ.
#[test]
fn files_too_large_to_write_fail_alone_and_the_rest_of_the_tree_arrives() {
    let top = tempdir();
    let root = top.path().join("root");
    let d = root.join("d");
    std::fs::create_dir_all(&d).unwrap();
    for i in 1..=40u64 {
        std::fs::write(d.join(format!("s{i}")), random_bytes(i as usize * 1000, i)).unwrap();
    }
    for i in 1..=6u64 {
        std::fs::write(d.join(format!("big{i}")), random_bytes(3 << 20, 100 + i)).unwrap();
    }
    let server = Server::start(&root, &[]);
    let dest = top.path().join("got");
    let (_, out, err) = run(
        Command::new("sh")
            .args(["-c", "ulimit -f 2048 && exec \"$0\" \"$@\""])
            .arg(BRAID)
            .args(["get", "-r", "--json", &server.url("d/")])
            .arg(&dest),
        Duration::from_secs(120),
    );
    let summary = json(
        out.lines()
            .last()
            .unwrap_or_else(|| panic!("no summary: {err}")),
    );
    let failed: Vec<&str> = summary["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert!(
                f["error"].as_str().unwrap().contains("File too large"),
                "{f}"
            );
            f["path"].as_str().unwrap()
        })
        .collect();
    assert_eq!(failed.len(), 6, "{summary}");
    assert!(failed.iter().all(|p| p.starts_with("/d/big")), "{summary}");
    for i in 1..=40 {
        let name = format!("s{i}");
        assert_eq!(
            std::fs::read(dest.join("d").join(&name)).unwrap(),
            std::fs::read(d.join(&name)).unwrap(),
            "{name}"
        );
    }
}
