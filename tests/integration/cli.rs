//! `braid get`, `put`, `ls`, `demo` and `serve` as a user runs them: results on disk, JSON
//! summaries, exit codes, resume, credentials and shutdown.

use crate::util::{
    BRAID, Raw, Server, add_account, braid, json, random_bytes, resume_get, serve_files, tempdir,
};
use std::io::{Read, Write};
use std::time::Duration;

#[test]
fn get_put_ls_round_trip_with_json_summaries() {
    let content = random_bytes(5 << 20, 11);
    let (top, root, server) = serve_files(&[("data.bin", &content)], &["--anonymous-write"]);
    let dest = top.path().join("copy.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &server.url("data.bin"),
            dest.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let s = json(&out);
    assert_eq!(s["bytes"], content.len() as u64);
    // braid to braid: MODE E over up to the default 4 connections (a small file is sent
    // before all have joined), checked with XXH3.
    assert_eq!(s["mode"], "extended-block");
    assert!((1..=4).contains(&s["streams"].as_u64().unwrap()), "{s}");
    assert!(s["checksum"].as_str().unwrap().starts_with("XXH3 "), "{s}");
    assert!(s["seconds"].as_f64().unwrap() > 0.0);
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "file content differs from what was sent"
    );
    assert!(!top.path().join("copy.bin.part").exists());
    // Into a directory, keeping the name; and to stdout.
    let (code, _, err) = braid(
        &[
            "get",
            &server.url("data.bin"),
            top.path().to_str().unwrap(),
            "-q",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(top.path().join("data.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    let out = std::process::Command::new(BRAID)
        .args(["get", &server.url("data.bin"), "-"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout == content, "stdout differs from the file");
    // Upload into a directory URL.
    std::fs::create_dir(root.join("in")).unwrap();
    let (code, out, err) = braid(
        &["put", dest.to_str().unwrap(), &server.url("in/"), "--json"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["bytes"], content.len() as u64);
    assert!(
        std::fs::read(root.join("in/copy.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    let (code, out, err) = braid(&["ls", &server.url("in/"), "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let entries = json(&out);
    assert_eq!(entries[0]["name"], "copy.bin");
    assert_eq!(entries[0]["size"], content.len() as u64);
    assert_eq!(entries[0]["type"], "file");
    let (code, out, _) = braid(&["ls", &server.url("")], &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("data.bin") && out.contains(&content.len().to_string()),
        "{out}"
    );
}

#[test]
fn exit_codes_say_what_failed() {
    let top = tempdir();
    let server = Server::start(top.path(), &[]);
    let dest = top.path().join("never.bin");
    let (code, _, err) = braid(
        &["get", &server.url("missing.bin"), dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("550"), "{err}");
    assert!(
        !dest.exists() && !top.path().join("never.bin.part").exists(),
        "a failed get left files behind"
    );
    let (code, _, err) = braid(&["get", "ftp://127.0.0.1:1/x", dest.to_str().unwrap()], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("cannot connect to 127.0.0.1:1"), "{err}");
    let (code, _, err) = braid(&["get", "http://127.0.0.1/x"], &[]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = braid(&["get", &format!("ftp://nobody:pw@{}/x", server.addr)], &[]);
    assert_eq!(code, 4, "{err}");
    let (code, _, err) = braid(&["put", "/nonexistent/file", &server.url("x")], &[]);
    assert_eq!(code, 6, "{err}");
    let (code, _, err) = braid(
        &[
            "put",
            top.path().join("x").to_str().unwrap(),
            &server.url("x"),
        ],
        &[],
    );
    assert_eq!(code, 6, "{err}");
    std::fs::write(top.path().join("x"), "x").unwrap();
    let (code, _, err) = braid(
        &[
            "put",
            top.path().join("x").to_str().unwrap(),
            &server.url("x"),
        ],
        &[],
    );
    assert_eq!(code, 5, "read-only server must refuse: {err}");
    let (code, _, err) = braid(&["get"], &[]);
    assert_eq!(code, 2, "{err}");
}

/// An upload the server refuses leaves no record behind (they used to pile up in the state
/// directory), and braid never creates a home directory that does not exist.
#[test]
fn a_refused_upload_leaves_no_record_and_no_home_is_made() {
    let top = tempdir();
    let server = Server::start(top.path(), &[]);
    let src = top.path().join("src.bin");
    std::fs::write(&src, random_bytes(1 << 20, 5)).unwrap();
    let state = top.path().join("state");
    let (code, _, err) = braid(
        &["put", src.to_str().unwrap(), &server.url("up.bin")],
        &[("XDG_STATE_HOME", state.to_str().unwrap())],
    );
    assert_eq!(code, 5, "read-only server must refuse: {err}");
    let left: Vec<_> = std::fs::read_dir(state.join("braid/uploads"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "records left: {left:?}");
    let nowhere = top.path().join("no-such-home");
    let (code, _, err) = braid(
        &["put", src.to_str().unwrap(), &server.url("up.bin")],
        &[("HOME", nowhere.to_str().unwrap())],
    );
    assert_eq!(code, 5, "{err}");
    assert!(!nowhere.exists(), "braid created a home directory");
}

/// `get` replaces a writable DEST once the new file is complete (as curl -o and cp do), but
/// not a write-protected one.
#[test]
fn get_replaces_a_writable_file_but_not_a_read_only_one() {
    use std::os::unix::fs::PermissionsExt;
    let top = tempdir();
    std::fs::write(top.path().join("new.txt"), "new\n").unwrap();
    let server = Server::start(top.path(), &[]);
    let local = tempdir();
    let dest = local.path().join("old.txt");
    std::fs::write(&dest, "old\n").unwrap();
    let (code, _, err) = braid(
        &["get", &server.url("new.txt"), dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "new\n");
    std::fs::write(&dest, "protected\n").unwrap();
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o444)).unwrap();
    let (code, _, err) = braid(
        &["get", &server.url("new.txt"), dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("read-only"), "{err}");
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "protected\n");
}

/// `braid --version` names the commit it was built from, so a bug report says exactly which
/// code ran.
#[test]
fn version_names_the_commit() {
    let (code, out, _) = braid(&["--version"], &[]);
    assert_eq!(code, 0);
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("this test reads the commit with git");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert!(
        out.starts_with(&format!(
            "braid {} (commit {head}",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );
}

/// Shell completions and manual pages come from the command-line definition itself, so they
/// name every subcommand and option there is.
#[test]
fn completions_and_manual_pages_cover_the_commands() {
    let (code, bash, err) = braid(&["completions", "bash"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(bash.contains("_braid()") && bash.contains("--resume") && bash.contains("passwd"));
    let (code, zsh, _) = braid(&["completions", "zsh"], &[]);
    assert!(code == 0 && zsh.starts_with("#compdef braid"), "{zsh}");
    let (code, page, _) = braid(&["man"], &[]);
    assert!(
        code == 0 && page.contains(".TH braid 1") && page.contains("passwd"),
        "{page}"
    );
    let dir = tempdir();
    let (code, _, err) = braid(&["man", dir.path().to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    let get = std::fs::read_to_string(dir.path().join("braid-get.1")).unwrap();
    assert!(get.contains("\\-\\-resume"), "{get}");
}

/// The systemd unit in contrib/ is one systemd accepts as it is: no unknown key, no typo in a
/// sandboxing option, the program it starts exists and runs.
#[test]
fn the_systemd_unit_is_valid() {
    crate::util::require("systemd-analyze");
    let dir = tempdir();
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/braid.service"
    ))
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/braid serve "));
    let here = dir.path().join("braid.service");
    std::fs::write(
        &here,
        unit.replace("/usr/local/bin/braid", crate::util::BRAID),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&here)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

/// A port that is not an FTP server's: closed at once, or another protocol's greeting. Exit
/// code 9, not "interrupted" (7), which would send a script to retry with --resume.
#[test]
fn a_port_that_is_not_ftp_is_a_protocol_error() {
    for (said, expect) in [
        (&b""[..], "closed the connection before greeting"),
        (
            &b"SSH-2.0-OpenSSH_9.2\r\n"[..],
            "did not greet as FTP servers do",
        ),
    ] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(said).unwrap();
        });
        let top = tempdir();
        let dest = top.path().join("x");
        let (code, _, err) = braid(
            &["get", &format!("ftp://{addr}/x"), dest.to_str().unwrap()],
            &[],
        );
        fake.join().unwrap();
        assert_eq!(code, 9, "{err}");
        assert!(
            err.contains(expect) && err.contains("is it an FTP server"),
            "{err}"
        );
    }
}

/// `put --resume` without a record continues in stream mode from the server's partial, which
/// may not be a prefix of this file. The server is told what the whole file hashes to, so a
/// wrong file never takes the final name (it used to, with the client exiting 8 after).
#[test]
fn put_resume_onto_a_wrong_partial_never_commits_it() {
    let (top, root, server) = serve_files(&[], &["--anonymous-write"]);
    let content = random_bytes(3 << 20, 9);
    let src = top.path().join("f.bin");
    std::fs::write(&src, &content).unwrap();
    // Another file's first megabyte where this upload's partial would be.
    std::fs::write(root.join(".f.bin.braid-part"), random_bytes(1 << 20, 10)).unwrap();
    let state = top.path().join("state");
    let env = [("XDG_STATE_HOME", state.to_str().unwrap())];
    let put = |resume: bool| {
        let mut args = vec!["put", src.to_str().unwrap()];
        let url = server.url("f.bin");
        args.push(&url);
        if resume {
            args.push("--resume");
        }
        let (code, _, err) = braid(&args, &env);
        (code, err)
    };
    let (code, err) = put(true);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("send it again without --resume"), "{err}");
    assert!(
        !root.join("f.bin").exists(),
        "a wrong file took the final name"
    );
    let (code, err) = put(false);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(root.join("f.bin")).unwrap() == content);
}

#[test]
fn get_resume_without_a_record_of_the_ranges_starts_over() {
    // MODE E writes blocks at their offsets, so a `.part` may have holes; without its sidecar
    // its length proves nothing. (Prefix resume in stream mode is tested against vsftpd.)
    let content = random_bytes(4 << 20, 5);
    let (top, _root, server) = serve_files(&[("f.bin", &content)], &[]);
    let dest = top.path().join("f.bin");
    let part = top.path().join("f.bin.part");
    for bogus in [vec![7u8; 1_234_567], vec![0u8; content.len() + 10]] {
        std::fs::write(&part, &bogus).unwrap();
        let (code, out, err) = braid(
            &[
                "get",
                &server.url("f.bin"),
                dest.to_str().unwrap(),
                "--resume",
                "--json",
            ],
            &[],
        );
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("downloading again"), "{err}");
        let s = json(&out);
        assert_eq!(s["resumed_from"], 0);
        assert_eq!(s["bytes"], content.len() as u64);
        assert!(
            std::fs::read(&dest).unwrap() == content,
            "file content differs from what was sent"
        );
        assert!(!part.exists());
    }
}

#[test]
fn interrupted_download_keeps_its_part_and_resumes_after_a_server_restart() {
    let content = random_bytes(64 << 20, 9);
    let (top, root, server) = serve_files(&[("big.bin", &content)], &[]);
    let dest = top.path().join("big.bin");
    // The server sends at most 16 MB/s (MaxRate), so the 64 MiB take at least 4 s: the kill
    // below lands mid-transfer however the machine schedules this test.
    let child = std::process::Command::new(BRAID)
        .args(["get", &server.url("big.bin"), dest.to_str().unwrap(), "-q"])
        .args(["--max-rate", "16MB"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until some data has landed, then kill the server.
    let part = top.path().join("big.bin.part");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0) == 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(server);
    let (code, err) = crate::util::finish_child(child, Duration::from_secs(60));
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("--resume"), "{err}");
    // MODE E writes blocks at their offsets: the sidecar says which ranges are stored.
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(top.path().join("big.bin.part.braid")).unwrap())
            .unwrap();
    assert_eq!(sidecar["size"], content.len() as u64, "{sidecar}");
    assert!(!dest.exists());
    let server = Server::start(&root, &[]);
    // Nothing already stored is sent again.
    resume_get(&server.url("big.bin"), &dest, content.len());
    assert!(!top.path().join("big.bin.part.braid").exists());
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "file content differs from what was sent"
    );
}

#[test]
fn put_resume_continues_a_broken_upload() {
    let (top, root, server) = serve_files(&[], &["--anonymous-write"]);
    let content = random_bytes(2 << 20, 21);
    let local = top.path().join("up.bin");
    std::fs::write(&local, &content).unwrap();
    {
        let mut c = Raw::login(server.addr, "anonymous", "x");
        c.expect("TYPE I", "200 Switching to Binary mode.\r\n");
        let mut data = c.epsv();
        c.send("STOR up.bin");
        assert!(c.reply().starts_with("150 "));
        data.write_all(&content[..700_000]).unwrap();
        // The control connection first: a data connection that ended first, with the session
        // still open, would be an upload that ended there.
        drop(c);
        drop(data);
    }
    // The session has ended, and with it what the server does with a broken upload.
    server.wait_for_log("disconnected", 1);
    assert!(!root.join("up.bin").exists());
    let (code, out, err) = braid(
        &[
            "put",
            local.to_str().unwrap(),
            &server.url("up.bin"),
            "--resume",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["resumed_from"], 700_000);
    assert!(
        std::fs::read(root.join("up.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
}

#[test]
fn credentials_from_env_and_netrc_never_only_the_command_line() {
    let top = tempdir();
    let root = top.path().join("home-of-carol");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("c.txt"), "carol's").unwrap();
    let users = top.path().join("users");
    add_account(&users, "carol", "home-of-carol".as_ref(), "pa ss", false);
    let server = Server::start(top.path(), &["--users", users.to_str().unwrap()]);
    let dest = top.path().join("c.txt");
    let url = format!("ftp://carol@{}/c.txt", server.addr);
    let (code, _, err) = braid(
        &["get", &url, dest.to_str().unwrap()],
        &[("BRAID_PASSWORD", "pa ss")],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "carol's");
    let (code, _, _) = braid(
        &["get", &url, dest.to_str().unwrap()],
        &[("BRAID_PASSWORD", "wrong")],
    );
    assert_eq!(code, 4);
    let home = top.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        home.join(".netrc"),
        "machine 127.0.0.1 login carol password pa\\ ss\n",
    )
    .unwrap();
    // netrc tokens are white-space separated, so use a password without a space there.
    let users2 = top.path().join("users2");
    add_account(&users2, "dave", "home-of-carol".as_ref(), "n3trc", false);
    std::fs::write(
        home.join(".netrc"),
        "machine 127.0.0.1 login dave password n3trc\n",
    )
    .unwrap();
    let server2 = Server::start(top.path(), &["--users", users2.to_str().unwrap()]);
    let (code, _, err) = braid(
        &[
            "get",
            &server2.url("c.txt"),
            top.path().join("d.txt").to_str().unwrap(),
        ],
        &[("HOME", home.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    drop(server);
}

/// The users file holds password hashes: `braid passwd` makes it readable by its owner only,
/// takes others' access away from one an admin had left 0644 (its group keeps its own),
/// writes it through a temporary file no one can plant a link at, and warns when the root it
/// names is missing.
#[test]
fn passwd_writes_a_private_file_without_following_a_planted_link() {
    use std::os::unix::fs::PermissionsExt;
    let top = tempdir();
    let users = top.path().join("users");
    let victim = top.path().join("victim");
    std::fs::write(&victim, "keep me\n").unwrap();
    std::os::unix::fs::symlink(&victim, top.path().join("users.tmp")).unwrap();
    let add = |name: &str| add_account(&users, name, "not-made-yet".as_ref(), "pw", false);
    let said = add("erin");
    assert!(
        said.contains("not-made-yet is not a directory"),
        "no warning about the missing root: {said}"
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&users), 0o600);
    std::fs::set_permissions(&users, std::fs::Permissions::from_mode(0o644)).unwrap();
    add("frank");
    assert_eq!(mode(&users), 0o640, "others can still read the hashes");
    let text = std::fs::read_to_string(&users).unwrap();
    assert!(
        text.starts_with("erin:") && text.contains("\nfrank:"),
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
    let names: Vec<_> = std::fs::read_dir(top.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "temporary files left behind: {names:?}");
    // With accounts, anonymous writing must be asked for with --anonymous too, not implied.
    let (ok, _, err) = crate::util::run(
        std::process::Command::new(BRAID)
            .args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(top.path())
            .arg("--users")
            .arg(&users)
            .arg("--anonymous-write"),
        Duration::from_secs(20),
    );
    assert!(!ok && err.contains("add --anonymous"), "{err}");
}

/// Eight `braid passwd` runs at once on one file: every account is kept (each run waits for
/// the others' lock, and reads what they wrote).
#[test]
fn passwd_runs_at_once_keep_every_account() {
    let top = tempdir();
    let users = top.path().join("users");
    crate::util::add_account(&users, "first", ".".as_ref(), "pw", false);
    let runs: Vec<_> = (0..8)
        .map(|i| {
            let users = users.clone();
            std::thread::spawn(move || {
                crate::util::add_account(&users, &format!("u{i}"), ".".as_ref(), "pw", false)
            })
        })
        .collect();
    for r in runs {
        r.join().unwrap();
    }
    let text = std::fs::read_to_string(&users).unwrap();
    let mut names: Vec<_> = text.lines().filter_map(|l| l.split(':').next()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["first", "u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"],
        "{text}"
    );
}

/// Root adding an account to a users file the service account reads (root:nogroup 0640, a
/// server running as nobody, as contrib/braid.service suggests) keeps its owner, group and
/// mode, so the next reload and restart still read it; a symlinked users file is written at
/// its target and stays a link.
#[test]
fn passwd_keeps_the_files_owner_group_mode_and_link() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert!(
        rustix::process::geteuid().is_root(),
        "this test gives the users file to another group, which needs root"
    );
    let top = tempdir();
    let real = top.path().join("accounts");
    crate::util::add_account(&real, "first", ".".as_ref(), "pw", false);
    let nogroup = 65534;
    std::os::unix::fs::chown(&real, Some(0), Some(nogroup)).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = top.path().join("users");
    std::os::unix::fs::symlink("accounts", &link).unwrap();
    crate::util::add_account(&link, "second", ".".as_ref(), "pw", false);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced by a file"
    );
    let m = std::fs::metadata(&real).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (0, nogroup, 0o640));
    let text = std::fs::read_to_string(&real).unwrap();
    assert!(
        text.contains("first:") && text.contains("\nsecond:"),
        "{text}"
    );
}

#[test]
fn sigterm_lets_a_running_transfer_finish_then_exits() {
    let top = tempdir();
    let content = random_bytes(16 << 20, 4);
    std::fs::write(top.path().join("f.bin"), &content).unwrap();
    let server = Server::start(top.path(), &[]);
    let addr = server.addr;
    let mut c = Raw::login(addr, "anonymous", "x");
    c.expect("TYPE I", "200 Switching to Binary mode.\r\n");
    let mut idle = Raw::login(addr, "anonymous", "x");
    let mut data = c.epsv();
    c.send("RETR f.bin");
    assert!(c.reply().starts_with("150 "));
    let mut first = vec![0u8; 1 << 16];
    data.read_exact(&mut first).unwrap();
    let log = server.log_file();
    // terminate() waits; signal first, then read the rest while the server drains, once it
    // has stopped listening.
    let pid = std::thread::spawn(move || server.terminate());
    crate::util::wait_for_text(&log, "shutting down: waiting for", 1);
    // The idle session is told the server is going away.
    assert_eq!(
        idle.reply(),
        "421 Server is shutting down; closing control connection.\r\n"
    );
    // New connections are refused.
    assert!(
        std::net::TcpStream::connect(addr).is_err() || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut b = [0u8; 3];
            !matches!(s.read(&mut b), Ok(3))
        }
    );
    let mut rest = Vec::new();
    data.read_to_end(&mut rest).unwrap();
    first.extend(rest);
    assert!(first == content, "download differs from the file");
    assert_eq!(c.reply(), "226 Transfer complete.\r\n");
    let status = pid.join().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn demo_verifies_and_reports_a_rate() {
    let (code, out, err) = braid(&["demo", "--size", "8MiB"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("verified: 8388608 bytes identical"), "{out}");
    assert!(out.contains("MiB/s") || out.contains("GiB/s"), "{out}");
}

/// `braid put -` uploads standard input: a braid server's checksum of what it stored is
/// checked against what was read; without a file name in the URL, or with --resume, it is
/// refused before connecting.
#[test]
fn put_dash_uploads_standard_input() {
    let (top, root, server) = serve_files(&[], &["--anonymous-write"]);
    // Not a whole number of the checksum's 64 KiB chunks, and more than one buffer.
    let content = random_bytes((3 << 20) + 12345, 77);
    let mut child = crate::util::braid_command(top.path())
        .args(["put", "-", &server.url("in.bin"), "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feed = {
        let content = content.clone();
        std::thread::spawn(move || stdin.write_all(&content))
    };
    let out = child.wait_with_output().unwrap();
    feed.join().unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let s = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(s["bytes"], content.len(), "{s}");
    assert!(
        s["checksum"]
            .as_str()
            .is_some_and(|c| c.starts_with("XXH3 ")),
        "{s}"
    );
    assert!(std::fs::read(root.join("in.bin")).unwrap() == content);
    for (args, why) in [
        (vec!["put", "-", &server.url("")], "no name"),
        (
            vec!["put", "-", &server.url("x.bin"), "--resume"],
            "--resume",
        ),
    ] {
        let (code, _, err) = braid(&args, &[]);
        assert_eq!(code, 2, "{why}: {err}");
    }
}

/// `braid model` from a scenario, from options, and with what is missing named.
#[test]
fn model_predicts_and_names_the_binding_limit() {
    // XFTP's satellite T1 with 24 KiB buffers: one stream is window-bound, 16 overflow the
    // scenario's 96 kB queue.
    let model = |args: &[&str]| {
        let mut all = vec!["model", "--json", "--congestion", "cubic"];
        all.extend_from_slice(args);
        let (code, out, err) = braid(&all, &[]);
        assert_eq!(code, 0, "{err}");
        json(out.trim())
    };
    let one = model(&[
        "--scenario",
        "satellite-t1",
        "--buffer",
        "24KiB",
        "-n",
        "1",
        "--size",
        "4MB",
    ]);
    assert_eq!(one["prediction"]["binding"], "window", "{one}");
    assert_eq!(one["path"]["rtt"], 0.59);
    let many = model(&[
        "--scenario",
        "satellite-t1",
        "--buffer",
        "24KiB",
        "-n",
        "16",
        "--size",
        "4MB",
    ]);
    assert_eq!(many["prediction"]["binding"], "sharing", "{many}");
    let rate = |v: &serde_json::Value| v["prediction"]["bytes_per_second"].as_f64().unwrap();
    assert!(rate(&many) > 3.0 * rate(&one));
    // Loss binds one cubic flow on a long fat path with big buffers.
    let lossy = model(&[
        "--rate", "1gbit", "--rtt", "100ms", "--loss", "1e-4", "--window", "64MB", "--size", "10GB",
    ]);
    assert_eq!(lossy["prediction"]["binding"], "loss", "{lossy}");
    let (code, _, err) = braid(&["model", "--rtt", "10ms"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--rate"), "{err}");
}

/// `braid bench --url` measures a server that is not in a lab (here one on loopback), with
/// no root and no model, and leaves its upload beside the file it downloads.
#[test]
fn bench_measures_a_remote_server() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("src.bin"), random_bytes(300_000, 5)).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let out_dir = top.path().join("results");
    let url = format!("ftp://{}/src.bin", server.addr);
    let (report, _) = crate::util::bench(
        top.path(),
        &[
            "--url",
            &url,
            "--tool",
            "braid,curl",
            "-n",
            "1",
            "--repeat",
            "2",
            "--size",
            "200KB",
            "--idle-ping",
            "0.2",
        ],
        Duration::from_secs(60),
    );
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "{report}");
    for c in cells {
        assert_eq!(c["failures"], 0, "{c}");
        assert_eq!(c["mbit_s"]["count"], 2, "{c}");
        assert!(c["model"].is_null(), "no model without a known path: {c}");
        assert_eq!(c["cell"]["scenario"], "remote 127.0.0.1");
    }
    // Downloads moved the served file, uploads the generated one.
    let rows = std::fs::read_to_string(out_dir.join("results.csv")).unwrap();
    for row in rows.lines().skip(1) {
        let bytes = row.split(',').nth(8).unwrap();
        let expected = if row.contains(",get,") {
            "300000"
        } else {
            "200000"
        };
        assert_eq!(bytes, expected, "{row}");
    }
    assert_eq!(
        std::fs::metadata(root.join("braid-bench-upload.bin"))
            .unwrap()
            .len(),
        200_000
    );
    assert!(out_dir.join("throughput-remote-127.0.0.1-get.svg").exists());
}

/// `braid bench --loopback` starts each tool's server on free loopback ports, measures, and
/// stops them all (a forking server's children too).
#[test]
fn bench_on_loopback_runs_each_tool_and_stops_its_servers() {
    for p in ["curl", "kermit"] {
        crate::util::require(p);
    }
    let top = tempdir();
    let report = one_quick_run(
        top.path(),
        &["--tool", "braid,curl,kermit", "--kermit-streaming", "on"],
    );
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 6, "{report}");
    let mut cpu = 0.0;
    for c in cells {
        assert_eq!(c["failures"], 0, "{c}");
        assert_eq!(c["cell"]["scenario"], "loopback");
        // CPU time, client and servers, for every cell (clock ticks of 10 ms may round a
        // short run's to 0, so only the sum must be positive).
        cpu += c["cpu_s_per_gib"]
            .as_f64()
            .unwrap_or_else(|| panic!("no CPU time: {c}"));
    }
    assert!(cpu > 0.0, "{report}");
    // Nothing the benchmark started still listens: every server's port is free again.
    let ports = report["loopback_ports"].as_object().unwrap();
    assert_eq!(ports.len(), 6, "{report}");
    for (name, port) in ports {
        let port = port.as_u64().unwrap() as u16;
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the {name} server (port {port}) is still listening"
        );
    }
}

/// A column of the bench's results.csv in `top`/results, one value per run.
fn csv_column(top: &std::path::Path, name: &str) -> Vec<String> {
    let csv = std::fs::read_to_string(top.join("results/results.csv")).unwrap();
    let mut rows = csv.lines();
    let header: Vec<&str> = rows.next().unwrap().split(',').collect();
    let at = header.iter().position(|h| *h == name).unwrap();
    rows.map(|r| r.split(',').nth(at).unwrap_or_default().to_string())
        .collect()
}

/// One run of each cell on loopback, of 2 MB over one stream, with `args`; the report.
fn one_quick_run(top: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec![
        "--loopback",
        "-n",
        "1",
        "--repeat",
        "1",
        "--size",
        "2MB",
        "--idle-ping",
        "0.2",
    ];
    all.extend_from_slice(args);
    crate::util::bench(top, &all, Duration::from_secs(120)).0
}

/// `braid bench` over ssh: braid cp, scp and rsync against the private OpenSSH server the
/// bench starts on loopback, each direction moving the whole file, and the server gone after.
#[test]
fn bench_over_ssh_runs_braid_cp_scp_and_rsync() {
    for p in ["ssh", "scp", "rsync", "ssh-keygen"] {
        crate::util::require(p);
    }
    assert!(
        std::path::Path::new("/usr/sbin/sshd").is_file(),
        "this test needs OpenSSH's server: run ./scripts/test, which installs it"
    );
    let top = tempdir();
    let report = one_quick_run(top.path(), &["--tool", "braid-cp,scp,rsync"]);
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 6, "{report}");
    for c in cells {
        assert_eq!(c["failures"], 0, "{c}");
    }
    let bytes = csv_column(top.path(), "bytes");
    assert!(bytes.iter().all(|b| b == "2000000"), "{bytes:?}");
    let ssh = report["loopback_ports"]["ssh"].as_u64().unwrap() as u16;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", ssh)).is_err(),
        "the bench's sshd (port {ssh}) is still listening"
    );
}

/// `braid bench --tls`: braid's client reaches braid serve over TLS (its summary counts the
/// data connections' handshakes), the certificate made for the server's address.
#[test]
fn bench_with_tls_encrypts_braids_transfers() {
    let top = tempdir();
    crate::util::bench(
        top.path(),
        &[
            "--loopback",
            "--tls",
            "-n",
            "2",
            "--repeat",
            "1",
            "--size",
            "1MB",
            "--idle-ping",
            "0.2",
        ],
        Duration::from_secs(120),
    );
    let runs = std::fs::read_to_string(top.path().join("results/results.jsonl")).unwrap();
    let runs: Vec<serde_json::Value> = runs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "a get and a put: {runs:?}");
    for r in &runs {
        assert!(r["measured"]["error"].is_null(), "{r}");
        assert_eq!(r["measured"]["tls"], true, "{r}");
    }
}

/// Options that cannot work are refused before anything is sent (exit code 2, saying why),
/// by get and put alike: a congestion control the kernel lacks (get used to ignore it and put
/// to warn four times), a socket buffer that would wrap (4 GiB became 0) or crawl (8 KiB),
/// --quiet with --verbose, --schedule with -n. A buffer above the kernel's cap is taken with a
/// warning that says so.
#[test]
fn options_that_cannot_work_are_refused_up_front() {
    let top = tempdir();
    let file = top.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let f = file.to_str().unwrap();
    // Nothing listens there: a refused option never gets as far as connecting.
    let url = "ftp://127.0.0.1:9/x";
    for (args, says) in [
        (
            vec!["get", url, "--congestion", "foo"],
            "no such congestion control",
        ),
        (
            vec!["put", f, url, "--congestion", "foo"],
            "no such congestion control",
        ),
        (vec!["get", url, "--buffer", "4GiB"], "from 16KiB to 1GiB"),
        (
            vec!["put", f, url, "--buffer", "8KiB"],
            "from 16KiB to 1GiB",
        ),
        (vec!["get", url, "-q", "-v"], "cannot be used with"),
        (
            vec!["get", url, "-n", "4", "--schedule", "1,8@20%"],
            "cannot be used with",
        ),
    ] {
        let (code, _, err) = braid(&args, &[]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !err.contains("cannot connect"),
            "{args:?} got as far as connecting: {err}"
        );
    }
    let (_, _, err) = braid(
        &["get", url, "--congestion", "cubic", "--buffer", "16MiB"],
        &[],
    );
    assert!(err.contains("cannot connect"), "{err}");
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        err.contains("above net.core.rmem_max"),
        rmem_max < 16 << 20,
        "rmem_max {rmem_max}: {err}"
    );
}

/// Every relative link in README.md and docs/ leads to a file that exists, and every `#anchor`
/// to one of its headings (as GitHub and mdBook make them: lower case, spaces as dashes).
#[test]
fn the_docs_links_resolve() {
    let top = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![top.join("README.md")];
    for e in std::fs::read_dir(top.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    let anchors = |page: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(page)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .map(|h| {
                h.trim_start_matches('#')
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect()
            })
            .collect()
    };
    let mut broken = Vec::new();
    let mut links = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            links += 1;
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let dest = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !dest.exists() {
                broken.push(format!("{}: {target}", page.display()));
            } else if !anchor.is_empty() && !anchors(&dest).iter().any(|a| a == anchor) {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(
        links > 0,
        "no relative links found: the check reads nothing"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The edges a new user meets first: a directory where a file was expected gets `-r`
/// suggested, a missing URL is named as such, several URLs into a new directory create it, and
/// `-h` is the short help while `--help` explains.
#[test]
fn directories_need_r_a_missing_url_is_named_and_a_batch_makes_its_directory() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("dir")).unwrap();
    std::fs::write(root.join("a.bin"), random_bytes(3000, 1)).unwrap();
    std::fs::write(root.join("b.bin"), random_bytes(5000, 2)).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let here = top.path().to_str().unwrap();
    for args in [
        vec!["get".to_string(), server.url("dir/"), here.to_string()],
        vec!["get".to_string(), server.url("")],
        vec!["put".to_string(), here.to_string(), server.url("dir/")],
    ] {
        let (code, _, err) = braid(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("-r"), "{args:?} does not suggest -r: {err}");
    }
    let file = top.path().join("a.bin");
    std::fs::write(&file, b"x").unwrap();
    let (code, _, err) = braid(&["put", file.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the URL is missing"), "{err}");
    // A URL without its final / that names a directory on the server: the server refuses,
    // and braid says why and what to do.
    let (code, _, err) = braid(&["put", file.to_str().unwrap(), &server.url("dir")], &[]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("is a directory on the server: end the URL with /"),
        "{err}"
    );
    let (code, _, err) = braid(&["get", &server.url("dir"), here], &[]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("is a directory on the server: add -r to fetch it"),
        "{err}"
    );
    // Several URLs into a directory that does not exist yet: made, as get -r makes its own.
    let new = top.path().join("new/deeper/");
    let (code, _, err) = braid(
        &[
            "get",
            &server.url("a.bin"),
            &server.url("b.bin"),
            &format!("{}/", new.display()),
            "-q",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read(new.join("a.bin")).unwrap(),
        random_bytes(3000, 1)
    );
    assert_eq!(
        std::fs::read(new.join("b.bin")).unwrap(),
        random_bytes(5000, 2)
    );
    // One URL into a directory named with its final /: made; a path through a directory that
    // does not exist is an error, and makes nothing.
    let one = top.path().join("one/");
    let (code, _, err) = braid(
        &[
            "get",
            &server.url("a.bin"),
            &format!("{}/", one.display()),
            "-q",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read(one.join("a.bin")).unwrap(),
        random_bytes(3000, 1)
    );
    let typo = top.path().join("no-such-dir/a.bin");
    let (code, _, err) = braid(
        &["get", &server.url("a.bin"), typo.to_str().unwrap(), "-q"],
        &[],
    );
    assert_eq!(code, 6, "{err}");
    assert!(!top.path().join("no-such-dir").exists());
    // A tree the server refuses to list leaves no empty directory behind.
    let nothing = top.path().join("nothing");
    let (code, _, err) = braid(
        &[
            "get",
            "-r",
            &server.url("nosuchdir/"),
            nothing.to_str().unwrap(),
            "-q",
        ],
        &[],
    );
    assert_eq!(code, 11, "{err}");
    assert!(
        !nothing.exists(),
        "an empty directory after a failed get -r"
    );
    // A failed download leaves no empty partial behind.
    let (code, _, _) = braid(&["get", &server.url("gone.bin"), here, "-q"], &[]);
    assert_eq!(code, 5);
    assert!(!top.path().join("gone.bin.part").exists());
    let short = braid(&["get", "-h"], &[]).1;
    let long = braid(&["get", "--help"], &[]).1;
    assert!(
        short.lines().count() * 2 < long.lines().count(),
        "-h is not a summary"
    );
    assert!(short.contains("Network:") && short.contains("Whole directories:"));
    assert!(long.contains("Exit codes:") && !short.contains("Exit codes:"));
}

/// `braid bench --files`: a tree per run, moved whole by each tool that moves trees (the bench
/// counts what landed), set against braid's time, and the tools that move single files left
/// out with a note.
#[test]
fn bench_moves_a_tree_with_each_tool_that_can() {
    crate::util::require("lftp");
    let top = tempdir();
    let (report, out) = crate::util::bench(
        top.path(),
        &[
            "--loopback",
            "--files",
            "30",
            "--size",
            "2000",
            "--tool",
            "braid,lftp,lftp-braid,curl",
            "-n",
            "1",
            "--repeat",
            "1",
            "--idle-ping",
            "0.2",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(report["files"], 30, "{report}");
    let cells = report["cells"].as_array().unwrap();
    let tools: Vec<&str> = cells
        .iter()
        .map(|c| c["cell"]["tool"].as_str().unwrap())
        .collect();
    assert!(
        !tools.contains(&"curl"),
        "curl moves single files: {tools:?}"
    );
    assert_eq!(
        cells.len(),
        6,
        "braid, lftp, lftp-braid, get and put: {report}"
    );
    for c in cells {
        assert_eq!(c["failures"], 0, "{c}");
    }
    // Every run moved the whole tree.
    let bytes = csv_column(top.path(), "bytes");
    assert_eq!(bytes.len(), 6);
    assert!(bytes.iter().all(|b| b == "60000"), "{bytes:?}");
    assert!(out.contains("A tree of 30 files of 2000 bytes"), "{out}");
    assert!(
        out.contains("put against braid's fastest in the same run"),
        "{out}"
    );
    assert!(out.contains("| lftp-braid | 1 |"), "{out}");
}
