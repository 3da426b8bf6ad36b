//! lftp as a client of `braid serve`.
use crate::util::{Server, random_bytes, require, run, tempdir};
use std::process::Command;
use std::time::Duration;

fn lftp(server: &Server, script: &str) -> (bool, String, String) {
    let script =
        format!("set net:max-retries 1; set net:timeout 10; set cmd:fail-exit yes; {script}; bye");
    run(
        Command::new("lftp").args(["-p", &server.port().to_string(), "-e", &script, "127.0.0.1"]),
        Duration::from_secs(60),
    )
}

#[test]
fn lftp_mirror_get_put_resume_and_file_operations() {
    require("lftp");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("tree/deeper")).unwrap();
    let content = random_bytes(2 << 20, 41);
    std::fs::write(root.join("tree/a.bin"), &content).unwrap();
    std::fs::write(root.join("tree/deeper/b.txt"), "bee\n").unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let local = top.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let l = local.to_str().unwrap();
    // ls uses LIST; cls uses MLSD; mirror walks the tree.
    let (ok, out, err) = lftp(&server, "ls tree; cls -l tree/deeper");
    assert!(ok, "{err}");
    assert!(
        out.contains("a.bin") && out.contains("deeper") && out.contains("b.txt"),
        "{out}"
    );
    let (ok, _, err) = lftp(&server, &format!("mirror tree {l}/tree"));
    assert!(ok, "{err}");
    assert!(
        std::fs::read(local.join("tree/a.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    assert_eq!(
        std::fs::read_to_string(local.join("tree/deeper/b.txt")).unwrap(),
        "bee\n"
    );
    // get -c resumes a partial file.
    std::fs::write(local.join("part.bin"), &content[..777_777]).unwrap();
    let (ok, _, err) = lftp(&server, &format!("get -c tree/a.bin -o {l}/part.bin"));
    assert!(ok, "{err}");
    assert!(
        std::fs::read(local.join("part.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    // put, put -c (resume), mkdir, mv, rm, rmdir.
    std::fs::write(local.join("half.bin"), &content[..900_000]).unwrap();
    let (ok, _, err) = lftp(&server, &format!("mkdir up; put {l}/half.bin -o up/r.bin"));
    assert!(ok, "{err}");
    std::fs::write(local.join("full.bin"), &content).unwrap();
    let (ok, _, err) = lftp(&server, &format!("put -c {l}/full.bin -o up/r.bin"));
    assert!(ok, "{err}");
    assert!(
        std::fs::read(root.join("up/r.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    let (ok, _, err) = lftp(&server, "mv up/r.bin up/s.bin; rm up/s.bin; rmdir up");
    assert!(ok, "{err}");
    assert!(!root.join("up").exists());
    // Errors reach lftp as errors.
    let (ok, _, _) = lftp(&server, "get nope.bin -o /dev/null");
    assert!(!ok, "a missing file must fail");
}
