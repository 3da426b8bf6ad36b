//! lftp as a client of `braid serve`.
use crate::util::{Server, log_lines, random_bytes, require, run, tempdir};
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

/// MODE Z (draft-preston-ftpext-deflate), lftp's `ftp:use-mode-z`: deflated downloads (a
/// resumed one too), uploads and listings against `braid serve --compress on` come out byte
/// for byte, each in MODE Z by the server's log. The default server (auto) does not list it,
/// so lftp, which uses it wherever it is listed, goes plain there, as with `--compress off`.
#[test]
fn lftp_mode_z_downloads_uploads_and_lists_byte_for_byte() {
    require("lftp");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let text = log_lines(3 << 20, 7);
    std::fs::write(root.join("log.txt"), &text).unwrap();
    let local = top.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let l = local.to_str().unwrap();
    std::fs::write(local.join("part.txt"), &text[..1_234_567]).unwrap();
    let server = Server::start(&root, &["--anonymous-write", "--compress", "on"]);
    let script = format!(
        "set ftp:use-mode-z true; get log.txt -o {l}/got.txt; \
         get -c log.txt -o {l}/part.txt; put {l}/got.txt -o up.txt; cls -l"
    );
    let (ok, out, err) = lftp(&server, &script);
    assert!(ok, "{err}");
    // The server's log line for each transfer names the mode it ran in: the three files and
    // the listing (MLSD) went deflated.
    let log = server.log();
    let deflated: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" transfer ") && l.contains("mode=\"Z\""))
        .collect();
    assert_eq!(
        deflated.len(),
        4,
        "not four transfers in MODE Z: {log}\n{err}"
    );
    assert!(deflated[3].contains("path=/ "), "the listing: {log}");
    assert!(out.contains("log.txt") && out.contains("up.txt"), "{out}");
    for (what, path) in [
        ("download", local.join("got.txt")),
        ("resumed download", local.join("part.txt")),
        ("upload", root.join("up.txt")),
    ] {
        assert!(std::fs::read(path).unwrap() == text, "the {what} differs");
    }
    server.terminate();
    for setting in ["auto", "off"] {
        let plain = Server::start(&root, &["--compress", setting]);
        let (ok, _, err) = lftp(
            &plain,
            &format!("set ftp:use-mode-z true; get log.txt -o {l}/plain-{setting}.txt"),
        );
        assert!(ok, "{err}");
        assert!(plain.log().contains("mode=\"S\""), "{}", plain.log());
        assert!(std::fs::read(local.join(format!("plain-{setting}.txt"))).unwrap() == text);
    }
}
