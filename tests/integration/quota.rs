//! Per-user quotas (`quota=SIZE`, `quota-files=N` in the users file): uploads by any route stop
//! at the quota with 552, keep what arrived as a partial within it, and deleting gives room
//! back.
use crate::util::{Server, add_account, braid, random_bytes, require, run, tempdir};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A server whose account `bob` (password `pw`, read-write) may hold `options` (e.g.
/// `quota=3MB`), with its root `root/`.
fn server_with_quota(top: &Path, options: &str) -> Server {
    let root = top.join("root");
    std::fs::create_dir(&root).unwrap();
    let users = top.join("users");
    add_account(&users, "bob", "root".as_ref(), "pw", true);
    let text = std::fs::read_to_string(&users).unwrap();
    std::fs::write(&users, text.replace(":rw:", &format!(":rw,{options}:"))).unwrap();
    Server::start(&root, &["--users", users.to_str().unwrap()])
}

/// Bytes and files under `dir`, partials included in the bytes.
fn used(dir: &Path) -> (u64, usize) {
    let mut bytes = 0;
    let mut files = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        bytes += e.metadata().unwrap().len();
        files += usize::from(!e.file_name().to_string_lossy().ends_with(".braid-part"));
    }
    (bytes, files)
}

/// A MODE E upload (`put -n 4`) and a stream upload (curl) past the quota both end with 552
/// naming the quota; what arrived stays as a partial, and nothing passes the quota. Deleting a
/// file makes room: the upload then goes through.
#[test]
fn uploads_by_mode_e_and_stream_stop_at_the_quota_and_a_delete_makes_room() {
    require("curl");
    let top = tempdir();
    let server = server_with_quota(top.path(), "quota=3MB");
    let root = top.path().join("root");
    let (a, b) = (top.path().join("a.bin"), top.path().join("b.bin"));
    std::fs::write(&a, random_bytes(2_000_000, 1)).unwrap();
    std::fs::write(&b, random_bytes(2_000_000, 2)).unwrap();
    let url = |name: &str| format!("ftp://bob@{}/{name}", server.addr);
    let env = [("BRAID_PASSWORD", "pw")];
    let (code, _, err) = braid(&["put", a.to_str().unwrap(), &url("a.bin")], &env);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = braid(
        &["put", "-n", "4", b.to_str().unwrap(), &url("b.bin")],
        &env,
    );
    assert_ne!(code, 0);
    assert!(err.contains("552") && err.contains("quota"), "{err}");
    assert!(used(&root).0 <= 3_000_000, "{:?}", used(&root));
    assert!(!root.join("b.bin").exists());
    // Stream mode, by a client no one here wrote.
    let (ok, _, err) = run(
        Command::new("curl")
            .args(["-sS", "-T"])
            .arg(&b)
            .arg(format!("ftp://bob:pw@{}/c.bin", server.addr)),
        Duration::from_secs(60),
    );
    // curl reports 552 as its error 70.
    assert!(
        !ok && err.contains("Exceeded storage allocation"),
        "curl: {err}"
    );
    assert!(used(&root).0 <= 3_000_000, "{:?}", used(&root));
    assert!(!root.join("c.bin").exists());
    // Room again: a.bin goes, and b.bin fits (its partial resumed or sent afresh).
    let (ok, _, err) = run(
        Command::new("curl").args([
            "-sS",
            &format!("ftp://bob:pw@{}/", server.addr),
            "-Q",
            "DELE a.bin",
            "-Q",
            "DELE c.bin",
        ]),
        Duration::from_secs(30),
    );
    let _ = (ok, err); // c.bin has no final name: its DELE fails, which curl reports
    let (code, _, err) = braid(
        &["put", "-n", "4", b.to_str().unwrap(), &url("b.bin")],
        &env,
    );
    assert_eq!(code, 0, "after a delete there is room: {err}");
    assert_eq!(
        std::fs::read(root.join("b.bin")).unwrap(),
        std::fs::read(&b).unwrap()
    );
}

/// A tree put over the file count: the files that fit arrive whole, the rest are refused
/// (552), and the put says so in its exit code.
#[test]
fn a_tree_put_past_the_file_count_keeps_what_fits() {
    let top = tempdir();
    let server = server_with_quota(top.path(), "quota-files=3");
    let tree = top.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..6 {
        std::fs::write(tree.join(format!("f{i}")), random_bytes(1000, i)).unwrap();
    }
    let (code, _, err) = braid(
        &[
            "put",
            "-r",
            tree.to_str().unwrap(),
            &format!("ftp://bob@{}/t/", server.addr),
        ],
        &[("BRAID_PASSWORD", "pw")],
    );
    assert_ne!(code, 0, "six files went into a quota of three");
    assert!(err.contains("quota"), "{err}");
    let got = top.path().join("root").join("t").join("tree");
    let (_, files) = used(&got);
    assert_eq!(files, 3, "{err}");
    for e in std::fs::read_dir(&got).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.ends_with(".braid-part") {
            continue; // refused as it took its name: kept for a resume
        }
        assert_eq!(
            std::fs::read(e.path()).unwrap(),
            std::fs::read(tree.join(&name)).unwrap(),
            "{name}"
        );
    }
}

/// ALLO (RFC 959) gives the upload's size: one that cannot fit is refused before a byte moves,
/// and leaves nothing behind; one that fits goes.
#[test]
fn allo_refuses_an_upload_that_cannot_fit_before_it_starts() {
    require("python3");
    let top = tempdir();
    let server = server_with_quota(top.path(), "quota=1MB");
    let script = r#"
import ftplib, io, sys
f = ftplib.FTP()
f.connect("127.0.0.1", int(sys.argv[1]), timeout=20)
f.login("bob", "pw")
f.voidcmd("TYPE I")
f.sendcmd("ALLO 2000000")
try:
    f.storbinary("STOR big.bin", io.BytesIO(b"x" * 10))
    raise SystemExit("an upload announced at 2 MB went into a quota of 1 MB")
except ftplib.error_perm as e:
    assert str(e).startswith("552") and "quota" in str(e), e
f.sendcmd("ALLO 500000")
f.storbinary("STOR small.bin", io.BytesIO(b"y" * 500000))
print("ok")
"#;
    let (ok, out, err) = run(
        Command::new("/usr/bin/python3")
            .args(["-c", script])
            .arg(server.addr.port().to_string()),
        Duration::from_secs(60),
    );
    assert!(ok && out.trim() == "ok", "{out}{err}");
    let root = top.path().join("root");
    let names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["small.bin"], "the refused upload left something");
}
