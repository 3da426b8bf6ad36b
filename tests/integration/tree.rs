//! `get -r` and `put -r`: whole trees against braid serve, vsftpd and a scripted server that
//! lists hostile names.
use crate::util::{Server, braid, json, random_bytes, sent_before_first_reuse, tempdir};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// 2020-01-02 03:04:05 UTC.
const KNOWN_MTIME: i64 = 1_577_934_245;

/// Every regular file and directory under `top`: a file as its length and a hash of its
/// bytes, a directory as `dir`, a symbolic link as `link`.
fn tree_of(top: &Path) -> BTreeMap<String, String> {
    use std::hash::{Hash, Hasher};
    let mut out = BTreeMap::new();
    let mut dirs = vec![top.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(top).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let what = if meta.is_symlink() {
                "link".to_string()
            } else if meta.is_dir() {
                dirs.push(p);
                "dir".to_string()
            } else {
                let bytes = std::fs::read(&p).unwrap();
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                format!("{} bytes, hash {:016x}", bytes.len(), h.finish())
            };
            out.insert(rel, what);
        }
    }
    out
}

fn set_mtime(p: &Path, unix: i64) {
    std::fs::File::open(p)
        .unwrap()
        .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(unix as u64))
        .unwrap();
}

/// A tree with nested and empty directories, an empty file, unicode names, a file of several
/// MiB (several MODE E blocks) and a symbolic link that leads out of it.
fn sample_tree(top: &Path, outside: &Path) {
    std::fs::create_dir_all(top.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(top.join("empty")).unwrap();
    std::fs::write(top.join("big.bin"), random_bytes(3 << 20, 1)).unwrap();
    std::fs::write(top.join("zero"), b"").unwrap();
    std::fs::write(top.join("sub/naïve café.txt"), "unicode\n").unwrap();
    std::fs::write(top.join("sub/deeper/leaf"), random_bytes(5000, 2)).unwrap();
    std::fs::write(outside.join("secret"), "not part of the tree").unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), top.join("sub/outside")).unwrap();
    set_mtime(&top.join("sub/deeper/leaf"), KNOWN_MTIME);
    set_mtime(&top.join("sub/deeper"), KNOWN_MTIME + 60);
}

/// What a tree should look like after the transfer: all but the link.
fn without_links(mut t: BTreeMap<String, String>) -> BTreeMap<String, String> {
    t.retain(|_, v| v != "link");
    t
}

/// Where the file named `name` was continued from, in a tree's `--json` lines: more than 0.
fn continued_from(out: &str, name: &str) -> u64 {
    let line = out
        .lines()
        .map(json)
        .find(|l| l["local"].as_str().is_some_and(|p| p.ends_with(name)))
        .unwrap_or_else(|| panic!("no line for {name} in {out}"));
    let kept = line["resumed_from"].as_u64().unwrap_or(0);
    assert!(kept > 0, "{line}");
    kept
}

/// The paths a tree's summary lists under `key` ("failed" or "skipped").
fn paths<'a>(s: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    s[key]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["path"].as_str()).collect())
        .unwrap_or_default()
}

/// The lines of `--json` output before the last: one record per file moved.
fn file_records(out: &str) -> Vec<serde_json::Value> {
    let mut lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    lines.pop();
    lines
}

/// `braid put -r -j JOBS --json` of the tree `local` to `up`, then `braid get -r` of `down`
/// (where it landed) into `into`; each must succeed. Each run's operation and per-file
/// records.
fn put_then_get(
    local: &Path,
    up: &str,
    down: &str,
    into: &Path,
    jobs: &str,
) -> [(&'static str, Vec<serde_json::Value>); 2] {
    let run = |op: &'static str, from: &str, to: &str| {
        let (code, out, err) = braid(&[op, "-r", "-j", jobs, "--json", from, to], &[]);
        assert_eq!(code, 0, "{op}: {out}{err}");
        (op, file_records(&out))
    };
    [
        run("put", local.to_str().unwrap(), up),
        run("get", down, into.to_str().unwrap()),
    ]
}

/// The last line of `--json` output: the tree's summary.
fn tree_summary(out: &str) -> serde_json::Value {
    json(out.lines().last().unwrap_or_default())
}

#[test]
fn a_tree_goes_down_and_up_again_through_braid_serve() {
    let dir = tempdir();
    let (served, outside) = (dir.path().join("served"), dir.path().join("outside"));
    std::fs::create_dir_all(served.join("data")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    sample_tree(&served.join("data"), &outside);
    // A link to a directory of the tree itself: followed, it would be a loop.
    std::os::unix::fs::symlink("..", served.join("data/sub/loop")).unwrap();
    let server = Server::start(&served, &["--anonymous"]);
    let got = dir.path().join("got");
    std::fs::create_dir(&got).unwrap();

    // The tree lands in DEST/data, listed at once (MLSR).
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            "-v",
            &server.url("data/"),
            got.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let expected = without_links(tree_of(&served.join("data")));
    assert_eq!(tree_of(&got.join("data")), expected);
    let s = tree_summary(&out);
    assert_eq!(s["files"], 4, "{s}");
    assert_eq!(s["directories"], 4, "{s}");
    assert_eq!(
        paths(&s, "skipped"),
        ["/data/sub/loop", "/data/sub/outside"],
        "{s}"
    );
    assert!(s["failed"].as_array().unwrap().is_empty(), "{s}");
    let listings: Vec<&str> = err.lines().filter(|l| l.starts_with("> MLS")).collect();
    assert_eq!(listings, ["> MLSR data/"], "{err}");
    // One JSON line per file before the summary.
    assert_eq!(out.lines().count(), 5, "{out}");
    // Modification times come along, for files and directories.
    let mtime = |p: &str| std::fs::metadata(got.join(p)).unwrap().mtime();
    assert_eq!(mtime("data/sub/deeper/leaf"), KNOWN_MTIME);
    assert_eq!(mtime("data/sub/deeper"), KNOWN_MTIME + 60);

    // Several sources, a file among them, into a directory that does not exist yet.
    std::fs::write(served.join("single.txt"), b"one file").unwrap();
    let both = dir.path().join("new/both");
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            &server.url("data/sub/deeper/"),
            &server.url("single.txt"),
            both.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(tree_summary(&out)["files"], 2, "{out}");
    assert_eq!(std::fs::read(both.join("single.txt")).unwrap(), b"one file");
    assert_eq!(
        std::fs::read(both.join("deeper/leaf")).unwrap(),
        std::fs::read(served.join("data/sub/deeper/leaf")).unwrap()
    );

    // And up again, into a directory that does not exist yet.
    let upload_root = dir.path().join("upload");
    std::fs::create_dir(&upload_root).unwrap();
    let writable = Server::start(&upload_root, &["--anonymous-write"]);
    let (code, out, err) = braid(
        &[
            "put",
            "-r",
            got.join("data").to_str().unwrap(),
            &writable.url("a/b"),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(tree_of(&upload_root.join("a/b/data")), expected);
    assert_eq!(tree_summary(&out)["files"], 4);
}

#[test]
fn after_ctrl_c_update_moves_only_what_is_missing() {
    let dir = tempdir();
    let served = dir.path().join("served");
    std::fs::create_dir_all(served.join("t/d")).unwrap();
    let big = random_bytes(4 << 20, 3);
    std::fs::write(served.join("t/big.bin"), &big).unwrap();
    for i in 0..6 {
        std::fs::write(
            served.join(format!("t/d/f{i}")),
            random_bytes(1000 + i, i as u64),
        )
        .unwrap();
    }
    let server = Server::start(&served, &["--anonymous"]);
    let into = dir.path().join("copy");
    let args = |extra: &[&'static str]| {
        let mut a: Vec<String> = ["get", "-r", "--json", "-n", "2"]
            .map(String::from)
            .to_vec();
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend([server.url("t/"), into.display().to_string()]);
        a
    };
    let run = |extra: &[&'static str]| {
        let a = args(extra);
        braid(&a.iter().map(String::as_str).collect::<Vec<_>>(), &[])
    };
    // A run with --update that must succeed: its summary and its output.
    let update = || {
        let (code, out, err) = run(&["--update"]);
        assert_eq!(code, 0, "{err}");
        (tree_summary(&out), out)
    };
    let (code, _, err) = run(&[]);
    assert_eq!(code, 0, "{err}");
    let got = into.join("t");
    assert_eq!(tree_of(&got), tree_of(&served.join("t")));

    // Two files gone; the big one comes first (one session, paced by the server at 1 MB/s)
    // and Ctrl-C stops it once part of it is stored.
    std::fs::remove_file(got.join("d/f4")).unwrap();
    std::fs::remove_file(got.join("big.bin")).unwrap();
    let child = crate::util::braid_command(dir.path())
        .args(args(&["--update", "-j", "1", "--max-rate", "1MB"]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::util::wait_for_recorded_range(&got.join("big.bin.part.braid"));
    crate::util::signal_process(child.id(), rustix::process::Signal::INT);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}");
    let s = tree_summary(&stdout);
    assert_eq!(
        (s["interrupted"].as_bool(), s["files"].as_u64()),
        (Some(true), Some(0)),
        "{s}"
    );
    assert_eq!(s["stopped_by"], "Ctrl-C", "{s}");

    // The re-run fetches the rest of the big file and the missing small one, nothing else.
    let (s, out) = update();
    assert_eq!(
        (s["files"].as_u64(), s["up_to_date"].as_u64()),
        (Some(2), Some(5)),
        "{s}"
    );
    let kept = continued_from(&out, "big.bin");
    assert_eq!(
        s["bytes"].as_u64(),
        Some(big.len() as u64 - kept + 1004),
        "{s}"
    );
    assert_eq!(tree_of(&got), tree_of(&served.join("t")));

    // A file changed on the server (another size) is fetched again; nothing else is.
    std::fs::write(served.join("t/d/f0"), b"changed").unwrap();
    let (s, _) = update();
    assert_eq!(
        (s["files"].as_u64(), s["bytes"].as_u64()),
        (Some(1), Some(7)),
        "{s}"
    );
    assert_eq!(std::fs::read(got.join("d/f0")).unwrap(), b"changed");
}

#[test]
fn a_symlink_planted_in_the_destination_is_not_followed() {
    let dir = tempdir();
    let served = dir.path().join("served");
    std::fs::create_dir_all(served.join("t/sub")).unwrap();
    std::fs::write(served.join("t/sub/f"), b"data").unwrap();
    std::fs::write(served.join("t/ok"), b"fine").unwrap();
    let server = Server::start(&served, &["--anonymous"]);
    let (got, elsewhere) = (dir.path().join("got"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(got.join("t")).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, got.join("t/sub")).unwrap();
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            &server.url("t/"),
            got.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 11, "{out}{err}");
    let s = tree_summary(&out);
    assert_eq!(s["files"], 1, "{s}");
    let error = s["failed"][0]["error"].as_str().unwrap();
    assert!(error.contains("symbolic link (not followed)"), "{error}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert_eq!(std::fs::read(got.join("t/ok")).unwrap(), b"fine");
}

/// A server that speaks just enough FTP for `get -r` (no MLSD: LIST) and lists `listings`
/// (directory path → LIST lines; a key `MLSR path` holds MLSR lines, and then FEAT offers
/// MLSR); RETR sends `files` (path → bytes) and refuses the rest with 550. Every command it
/// receives is kept in `seen`.
struct Scripted {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    fn start(
        listings: BTreeMap<&'static str, String>,
        files: BTreeMap<&'static str, Vec<u8>>,
    ) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (l, f, s) = (Arc::new(listings), Arc::new(files), seen.clone());
        // Ends with the test process; each session ends when the client closes it.
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (l, f, s) = (l.clone(), f.clone(), s.clone());
                std::thread::spawn(move || Scripted::session(conn, &l, &f, &s));
            }
        });
        Scripted { port, seen }
    }

    fn session(
        conn: TcpStream,
        listings: &BTreeMap<&str, String>,
        files: &BTreeMap<&str, Vec<u8>>,
        seen: &Mutex<Vec<String>>,
    ) {
        let mut out = conn.try_clone().unwrap();
        let mut reply = |text: &str| {
            let _ = out.write_all(text.as_bytes());
        };
        reply("220 scripted\r\n");
        let mut passive: Option<TcpListener> = None;
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { return };
            seen.lock().unwrap().push(line.clone());
            let (verb, arg) = line.split_once(' ').unwrap_or((&line, ""));
            let data = |passive: &mut Option<TcpListener>| {
                let (d, _) = passive.take().unwrap().accept().unwrap();
                d.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                d
            };
            match verb {
                "USER" => reply("331 go on\r\n"),
                "PASS" => reply("230 in\r\n"),
                "FEAT" => {
                    let mlsr = listings.keys().any(|k| k.starts_with("MLSR "));
                    reply(&format!(
                        "211-Features:\r\n SIZE\r\n EPSV\r\n REST STREAM\r\n{}211 End\r\n",
                        if mlsr { " MLSR\r\n" } else { "" }
                    ))
                }
                "TYPE" => reply("200 ok\r\n"),
                "EPSV" => {
                    let l = TcpListener::bind("127.0.0.1:0").unwrap();
                    reply(&format!(
                        "229 ok (|||{}|)\r\n",
                        l.local_addr().unwrap().port()
                    ));
                    passive = Some(l);
                }
                "SIZE" => match files.get(arg) {
                    Some(b) => reply(&format!("213 {}\r\n", b.len())),
                    None => reply("550 no\r\n"),
                },
                "LIST" | "MLSR" => match listings.get(if verb == "LIST" { arg } else { &line }) {
                    Some(text) => {
                        reply("150 here\r\n");
                        let mut d = data(&mut passive);
                        let _ = d.write_all(text.as_bytes());
                        drop(d);
                        reply("226 done\r\n");
                    }
                    None => reply("550 no such directory\r\n"),
                },
                "RETR" => match files.get(arg) {
                    Some(b) => {
                        reply("150 here\r\n");
                        let mut d = data(&mut passive);
                        let _ = d.write_all(b);
                        let _ = d.shutdown(std::net::Shutdown::Write);
                        let _ = d.read(&mut [0u8; 16]);
                        reply("226 done\r\n");
                    }
                    None => reply("550 gone\r\n"),
                },
                "QUIT" => {
                    reply("221 bye\r\n");
                    return;
                }
                _ => reply("502 not here\r\n"),
            }
        }
    }
}

#[test]
fn names_a_hostile_server_lists_are_refused_and_one_failure_does_not_stop_the_rest() {
    let line = |kind: char, size: usize, name: &str| {
        format!("{kind}rw-r--r--   1 0  0  {size} Nov 24 11:33 {name}\r\n")
    };
    let mut listings = BTreeMap::new();
    listings.insert(
        "t/",
        [
            line('-', 2, "ok.txt"),
            line('-', 5, "../escape.txt"),
            line('-', 5, ".."),
            line('-', 5, "a/b.txt"),
            line('-', 5, "ctl\u{1b}[2Jname"),
            line('-', 4, "gone.txt"),
            line('l', 11, "link -> /etc/passwd"),
            line('d', 4096, "sub"),
            line('d', 4096, ".."),
        ]
        .concat(),
    );
    listings.insert("t/sub", line('-', 3, "inner"));
    let mut files = BTreeMap::new();
    files.insert("t/ok.txt", b"ok".to_vec());
    files.insert("t/sub/inner", b"in!".to_vec());
    files.insert("t/../escape.txt", b"owned".to_vec());
    let server = Scripted::start(listings, files);
    let dir = tempdir();
    let into = dir.path().join("deep");
    let got = into.join("t");
    let url = format!("ftp://127.0.0.1:{}/t/", server.port);
    let (code, out, err) = braid(&["get", "-r", &url, into.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, 11, "{out}{err}");
    let s = tree_summary(&out);
    assert_eq!(s["files"], 2, "{s}");
    let failed: BTreeMap<String, String> = s["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().into(),
                f["error"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(failed.len(), 5, "{s}");
    assert!(failed["/t/.."].contains("parent directory"), "{s}");
    assert!(failed["/t/../escape.txt"].contains("a / in it"), "{s}");
    assert!(failed["/t/a/b.txt"].contains("a / in it"), "{s}");
    assert!(
        failed["/t/ctl\u{1b}[2Jname"].contains("control character"),
        "{s}"
    );
    assert!(failed["/t/gone.txt"].contains("550 gone"), "{s}");
    assert_eq!(s["skipped"][0]["path"], "/t/link", "{s}");
    let names: Vec<String> = tree_of(&got).into_keys().collect();
    assert_eq!(names, ["ok.txt", "sub", "sub/inner"]);
    assert_eq!(std::fs::read(got.join("sub/inner")).unwrap(), b"in!");
    assert!(!into.join("escape.txt").exists());
    let seen = server.seen.lock().unwrap();
    assert!(
        !seen
            .iter()
            .any(|c| c.contains("escape") || c.contains("b.txt") || c.contains("ctl")),
        "a refused name reached the server: {seen:?}"
    );
}

/// The same from a server that lists the whole tree at once (MLSR): paths that climb out, are
/// absolute, or lie beneath no directory it listed are refused, nothing beneath a symbolic
/// link is taken, and only the two good files are asked for.
#[test]
fn paths_a_hostile_server_lists_in_one_tree_listing_are_refused() {
    let line = |facts: &str, path: &str| format!("type={facts};modify=20261124113300; {path}\r\n");
    let mut listings = BTreeMap::new();
    listings.insert(
        "MLSR t/",
        [
            line("cdir", "."),
            line("file;size=2", "ok.txt"),
            line("file;size=5", "../escape.txt"),
            line("dir", "sub"),
            line("file;size=3", "sub/inner"),
            line("file;size=5", "sub/../../up.txt"),
            line("file;size=5", "/abs.txt"),
            line("file;size=4", "nodir/x"),
            line("file;size=1", "sub/ctl\u{1b}[2J"),
            line("OS.unix=slink:/etc", "lnk"),
            line("file;size=6", "lnk/passwd"),
        ]
        .concat(),
    );
    let mut files = BTreeMap::new();
    files.insert("t/ok.txt", b"ok".to_vec());
    files.insert("t/sub/inner", b"in!".to_vec());
    let server = Scripted::start(listings, files);
    let dir = tempdir();
    let into = dir.path().join("deep");
    let url = format!("ftp://127.0.0.1:{}/t/", server.port);
    let (code, out, err) = braid(&["get", "-r", &url, into.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, 11, "{out}{err}");
    let s = tree_summary(&out);
    assert_eq!(s["files"], 2, "{s}");
    assert_eq!(
        paths(&s, "failed"),
        [
            "/t/sub/ctl\u{1b}[2J",
            "/t/..",
            "/t//abs.txt",
            "/t/nodir",
            "/t/sub/../.."
        ],
        "{s}"
    );
    assert_eq!(s["skipped"][0]["path"], "/t/lnk", "{s}");
    let names: Vec<String> = tree_of(&into.join("t")).into_keys().collect();
    assert_eq!(names, ["ok.txt", "sub", "sub/inner"]);
    let seen = server.seen.lock().unwrap();
    // In any order: two sessions may fetch the two files at once.
    let mut asked: Vec<&String> = seen
        .iter()
        .filter(|c| c.starts_with("RETR") || c.starts_with("LIST") || c.starts_with("MLS"))
        .collect();
    asked.sort();
    assert_eq!(
        asked,
        ["MLSR t/", "RETR t/ok.txt", "RETR t/sub/inner"],
        "{seen:?}"
    );
}

#[test]
fn a_tree_goes_up_to_vsftpd_and_down_again() {
    let top = tempdir();
    let vs = crate::vsftpd::start_vsftpd(top.path());
    let (local, outside) = (top.path().join("local"), top.path().join("outside"));
    std::fs::create_dir_all(&local).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    sample_tree(&local, &outside);
    let expected = without_links(tree_of(&local));
    let base = format!("ftp://127.0.0.1:{}", vs.port);
    let (code, out, err) = braid(
        &[
            "put",
            "-r",
            local.to_str().unwrap(),
            &format!("{base}/pub/"),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let s = tree_summary(&out);
    assert_eq!(
        s["skipped"][0]["why"], "a symbolic link (not followed)",
        "{s}"
    );
    assert_eq!(tree_of(&top.path().join("root/pub/local")), expected);

    // Down again (LIST, no MLSD: times from MDTM), with two sessions. A symbolic link on the
    // server that leads out of the tree is listed as one and skipped, not followed.
    std::os::unix::fs::symlink(
        outside.join("secret"),
        top.path().join("root/pub/local/sub/outside"),
    )
    .unwrap();
    let into = top.path().join("got");
    let got = into.join("local");
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            "-j",
            "2",
            &format!("{base}/pub/local/"),
            into.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(tree_of(&got), expected);
    let s = tree_summary(&out);
    assert_eq!(s["sessions"], 2, "{s}");
    assert_eq!(s["skipped"][0]["path"], "/pub/local/sub/outside", "{s}");
    let served = std::fs::metadata(top.path().join("root/pub/local/sub/deeper/leaf")).unwrap();
    assert_eq!(
        std::fs::metadata(got.join("sub/deeper/leaf"))
            .unwrap()
            .mtime(),
        served.mtime()
    );
}

/// A server that allows this client two sessions: `get -r -j 4` backs off from the refused
/// ones (421) and moves every file on the two it has.
#[test]
fn a_tree_from_a_server_that_limits_sessions_arrives_whole() {
    let top = tempdir();
    let vs = crate::vsftpd::start_vsftpd_with(top.path(), "max_per_ip=2\n");
    let served = top.path().join("root/pub/t");
    std::fs::create_dir_all(served.join("d")).unwrap();
    for i in 0..12 {
        let name = format!("{}f{i}", if i % 2 == 0 { "d/" } else { "" });
        std::fs::write(served.join(name), random_bytes(3000 + i, i as u64)).unwrap();
    }
    let into = top.path().join("got");
    let url = format!("ftp://127.0.0.1:{}/pub/t/", vs.port);
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            "-j",
            "4",
            &url,
            into.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(tree_of(&into.join("t")), tree_of(&served));
    let s = tree_summary(&out);
    assert_eq!(s["files"], 12, "{s}");
    assert!(s["sessions"].as_u64().unwrap() <= 2, "{s}");
}

/// GridFTP lists with MLSD and moves each file in MODE E, checked with CKSM ADLER32.
#[test]
fn a_tree_goes_up_to_globus_gridftp_server_and_down_again() {
    let top = tempdir();
    let home = top.path().join("home");
    let (local, outside) = (top.path().join("local"), top.path().join("outside"));
    for d in [&home, &local, &outside] {
        std::fs::create_dir_all(d).unwrap();
    }
    sample_tree(&local, &outside);
    // globus-gridftp-server 13.24 drops the bytes of non-ASCII names (MKD naïve makes
    // "nave"), whatever its FEAT says of UTF8: no such names here.
    std::fs::remove_file(local.join("sub/naïve café.txt")).unwrap();
    let expected = without_links(tree_of(&local));
    let server = crate::globus::start_gridftp(&home);
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let (code, out, err) = braid(
        &[
            "put",
            "-r",
            local.to_str().unwrap(),
            &format!("{base}/up/"),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(tree_of(&home.join("up/local")), expected);
    let into = top.path().join("got");
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            &format!("{base}/up/local/"),
            into.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(tree_of(&into.join("local")), expected);
    let s = tree_summary(&out);
    assert_eq!(s["files"], 3, "{s}");
    let leaf = |p: &Path| {
        std::fs::metadata(p.join("sub/deeper/leaf"))
            .unwrap()
            .mtime()
    };
    assert_eq!(leaf(&into.join("local")), leaf(&home.join("up/local")));
}

/// A tree to and from globus-gridftp-server on one session keeps its MODE E data connections
/// from file to file, as `globus-url-copy -fast` does: only the first file of each direction
/// opens any (the server answers the others' STOR and RETR with 125), and every file arrives
/// whole.
#[test]
fn a_tree_keeps_its_data_connections_open_from_file_to_file_with_globus_gridftp_server() {
    let top = tempdir();
    let home = top.path().join("home");
    let local = top.path().join("local");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(local.join("sub")).unwrap();
    for i in 0..6u64 {
        let dir = if i % 2 == 0 {
            local.clone()
        } else {
            local.join("sub")
        };
        std::fs::write(
            dir.join(format!("f{i}")),
            random_bytes(3000 + i as usize * 7000, i),
        )
        .unwrap();
    }
    let server = crate::globus::start_gridftp(&home);
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let into = top.path().join("got");
    let (up, down) = (format!("{base}/up/"), format!("{base}/up/local/"));
    for (op, files) in put_then_get(&local, &up, &down, &into, "1") {
        assert_eq!(files.len(), 6, "{op}: {files:?}");
        let opened: Vec<u64> = files
            .iter()
            .map(|f| f["new_data_connections"].as_u64().unwrap_or(u64::MAX))
            .collect();
        assert!(
            opened[0] >= 1,
            "{op}: the first file opens its connections: {opened:?}"
        );
        assert!(
            opened[1..].iter().all(|&n| n == 0),
            "{op}: every later file goes on the kept connections: {opened:?}"
        );
    }
    assert_eq!(tree_of(&home.join("up/local")), tree_of(&local));
    assert_eq!(tree_of(&into.join("local")), tree_of(&local));
}

/// From globus-gridftp-server too, small files go requested ahead on the kept connections:
/// each one's RETR and CKSM ADLER32 go out before the server has answered for those in front of
/// it, as `globus-url-copy -pp` pipelines. A file whose partial cannot be written here fails
/// alone; its data is read and dropped, and every other file arrives whole.
#[test]
fn files_from_globus_gridftp_server_are_requested_ahead_and_fail_alone() {
    let top = tempdir();
    let home = top.path().join("home");
    let data = home.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for i in 0..12u64 {
        std::fs::write(
            data.join(format!("f{i:02}")),
            random_bytes(2000 + 300 * i as usize, i),
        )
        .unwrap();
    }
    let server = crate::globus::start_gridftp(&home);
    let got = top.path().join("got");
    // Where f07's partial would be written, a directory: its data has nowhere to land.
    std::fs::create_dir_all(got.join("data/f07.part")).unwrap();
    let url = format!("ftp://127.0.0.1:{}/data/", server.port);
    let (code, out, err) = braid(
        &[
            "get",
            "-r",
            "-j",
            "1",
            "-v",
            "--json",
            &url,
            got.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 11, "{err}");
    let s = tree_summary(&out);
    assert_eq!(s["files"], 11, "{s}");
    let failed = s["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{s}");
    assert_eq!(failed[0]["path"], "/data/f07", "{s}");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot write"),
        "{s}"
    );
    let mut want = tree_of(&data);
    want.remove("f07");
    let mut have = tree_of(&got.join("data"));
    have.remove("f07.part");
    assert_eq!(have, want);
    // The first file opens the connections; the rest are asked for in one go, before the
    // server says it starts the second on the kept connections (125).
    let ahead = sent_before_first_reuse(&err, &["> RETR ", "> CKSM ADLER32"]);
    assert!(
        ahead >= 2 * 11,
        "{ahead} RETR and CKSM before the first 125: {err}"
    );
}

/// To globus-gridftp-server, small files go stored ahead on the kept connections: each one's
/// ALLO, STOR and CKSM ADLER32 go out before the server has answered for those in front of it,
/// and each file's data after its own `125`. A file the server refuses (a directory stands
/// where it would go) fails alone, and every other file arrives whole.
#[test]
fn files_to_globus_gridftp_server_are_stored_ahead_and_fail_alone() {
    let top = tempdir();
    let home = top.path().join("home");
    let data = top.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for i in 0..12u64 {
        std::fs::write(
            data.join(format!("f{i:02}")),
            random_bytes(2000 + 300 * i as usize, i + 50),
        )
        .unwrap();
    }
    std::fs::create_dir_all(home.join("up/data/f07")).unwrap();
    let server = crate::globus::start_gridftp(&home);
    let url = format!("ftp://127.0.0.1:{}/up/", server.port);
    let (code, out, err) = braid(
        &[
            "put",
            "-r",
            "-j",
            "1",
            "-v",
            "--json",
            data.to_str().unwrap(),
            &url,
        ],
        &[],
    );
    assert_eq!(code, 11, "{err}");
    let s = tree_summary(&out);
    assert_eq!(s["files"], 11, "{s}");
    let failed = s["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{s}");
    assert!(
        failed[0]["path"].as_str().unwrap().ends_with("/data/f07"),
        "{s}"
    );
    assert!(failed[0]["error"].as_str().unwrap().contains("STOR"), "{s}");
    let mut want = tree_of(&data);
    want.remove("f07");
    let mut have = tree_of(&home.join("up/data"));
    assert_eq!(have.remove("f07").as_deref(), Some("dir"));
    assert_eq!(have, want);
    // The first file opens the connections; the rest are asked for in one go, before the
    // server says it takes the second on the kept connections (125).
    let ahead = sent_before_first_reuse(&err, &["> STOR "]);
    assert!(ahead >= 12, "{ahead} STOR before the first 125: {err}");
}

/// Small files go requested ahead on one session: the client asks for the next ones before
/// the server has answered for the first. A file removed from the server after the walk
/// (while a large file, first in the listing, goes alone at a rate limit) and a file whose
/// partial cannot be written here fail alone; every other file arrives whole, with its time.
#[test]
fn files_requested_ahead_fail_alone_and_the_rest_arrive_whole() {
    let dir = tempdir();
    let data = dir.path().join("served/data");
    std::fs::create_dir_all(&data).unwrap();
    // Bigger than what goes requested ahead: it moves on its own, 3 s at 2 MB/s.
    std::fs::write(data.join("0first"), random_bytes(6 << 20, 1)).unwrap();
    for i in 0..40u64 {
        let f = data.join(format!("f{i:02}"));
        std::fs::write(&f, random_bytes(1000 + 37 * i as usize, i + 2)).unwrap();
        set_mtime(&f, KNOWN_MTIME + i as i64);
    }
    let server = Server::start(&dir.path().join("served"), &["--anonymous"]);
    let got = dir.path().join("got");
    // Where f07's partial would be written, a directory: its data has nowhere to land.
    std::fs::create_dir_all(got.join("data/f07.part")).unwrap();
    let first_part = got.join("data/0first.part");
    let gone = data.join("f20");
    // Once the first file is under way, the walk is over: f20 was listed and is now removed.
    let remover = std::thread::spawn(move || {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while !first_part.exists() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_file(&gone).unwrap();
    });
    let home = tempdir();
    let out = crate::util::braid_command(home.path())
        .args([
            "get",
            "-r",
            "-j",
            "1",
            "-v",
            "--json",
            "--rate-limit",
            "2MB",
        ])
        .args([&server.url("data/"), got.to_str().unwrap()])
        .output()
        .unwrap();
    remover.join().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(11), "{stderr}");
    let s = tree_summary(&stdout);
    assert_eq!(s["files"], 39, "{s}");
    let failed: BTreeMap<String, String> = s["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap().into(), f["error"].to_string()))
        .collect();
    assert_eq!(failed.len(), 2, "{s}");
    assert!(failed["/data/f07"].contains("cannot write"), "{s}");
    assert!(failed["/data/f20"].contains("550"), "{s}");
    // Everything else, byte for byte and with its time; nothing of f20 left behind.
    let mut want = tree_of(&data);
    want.remove("f07");
    let mut have = tree_of(&got.join("data"));
    have.remove("f07.part");
    assert_eq!(have, want);
    assert!(!got.join("data/f20").exists() && !got.join("data/f20.part").exists());
    let mtime = std::fs::metadata(got.join("data/f39")).unwrap().mtime();
    assert_eq!(mtime, KNOWN_MTIME + 39);
    // Requested ahead: f01 and f02 are asked for before the server starts sending f00.
    let at = |line: &str| {
        stderr
            .lines()
            .position(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line:?} in {stderr}"))
    };
    let f00_starts = at("< 125 Beginning transfer of /data/f00");
    assert!(at("> RETR data/f02") < f00_starts, "{stderr}");
    // They were asked for as one bundle first, which the server refused for f20 before a
    // byte moved, on a session that went on.
    let refused = at("< 451 RBND of 40 files: /data/f20: ");
    assert!(at("> RBND") < refused && refused < f00_starts, "{stderr}");
    assert_eq!(stderr.matches("> USER").count(), 1, "{stderr}");
}

/// Small files go up announced ahead on one session: each file's checksum and STOR go out
/// before the server has answered for the files in front of it. A file the server refuses
/// (a directory stands where it would go) and a file removed here after the walk (while a
/// large file, first, goes alone at a rate limit) fail alone; every other file arrives whole.
#[test]
fn files_announced_ahead_fail_alone_and_the_rest_arrive_whole() {
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // Bigger than what goes announced ahead: it moves on its own, 3 s at 2 MB/s.
    std::fs::write(data.join("0first"), random_bytes(6 << 20, 1)).unwrap();
    for i in 0..30u64 {
        let f = data.join(format!("f{i:02}"));
        std::fs::write(&f, random_bytes(37 * i as usize, i + 2)).unwrap();
    }
    let root = dir.path().join("served");
    std::fs::create_dir_all(root.join("up/data/f12")).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    // Once the first file is under way on the server, the walk is over: f20 was listed and
    // is now removed.
    let (first_part, gone) = (root.join("up/data/.0first.braid-part"), data.join("f20"));
    let remover = std::thread::spawn(move || {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while !first_part.exists() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_file(&gone).unwrap();
    });
    let (code, out, err) = braid(
        &[
            "put",
            "-r",
            "-j",
            "1",
            "-v",
            "--json",
            "--rate-limit",
            "2MB",
            data.to_str().unwrap(),
            &server.url("up/"),
        ],
        &[],
    );
    remover.join().unwrap();
    assert_eq!(code, 11, "{err}");
    let s = tree_summary(&out);
    assert_eq!(s["files"], 29, "{s}");
    let failed: BTreeMap<String, String> = s["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let path = f["path"].as_str().unwrap();
            (
                path.rsplit('/').next().unwrap().into(),
                f["error"].to_string(),
            )
        })
        .collect();
    assert_eq!(failed.len(), 2, "{s}");
    assert!(failed["f12"].contains("550"), "{s}");
    assert!(failed["f20"].contains("cannot read"), "{s}");
    let mut want = tree_of(&data);
    want.insert("f12".into(), "dir".into());
    assert_eq!(tree_of(&root.join("up/data")), want);
    // Announced ahead: f02's STOR goes out before the server starts taking f01.
    let at = |line: &str| {
        err.lines()
            .position(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line:?} in {err}"))
    };
    assert!(
        at("> STOR up/data/f02") < at("< 125 Beginning transfer of /up/data/f01"),
        "{err}"
    );
}

/// From a braid server a tree's small files come as bundles: after the session's first
/// file, the rest are named with BNDL and sent by one RBND, with no RETR, CKSM or transfer per
/// file. Names that need percent-encoding on the command line (spaces, `%`), an
/// empty file and files in several directories all arrive byte for byte with their times,
/// and no partial is left behind.
#[test]
fn a_trees_small_files_come_as_one_bundle_with_their_names_and_times() {
    let dir = tempdir();
    let data = dir.path().join("served/data");
    let names = small_files(&data);
    let xferlog = dir.path().join("xferlog");
    let server = Server::start(
        &dir.path().join("served"),
        &["--anonymous", "--xferlog", xferlog.to_str().unwrap()],
    );
    let got = dir.path().join("got");
    let home = tempdir();
    let url = server.url("data/");
    let args = [
        "get",
        "-r",
        "-j",
        "1",
        "-v",
        "--json",
        &url,
        got.to_str().unwrap(),
    ];
    let (stdout, stderr) = braid_ok(home.path(), &args);
    same_files_and_times(&got.join("data"), &data, &names);
    // All in one bundle, on the data connections the tree's listing came on, in MODE E: one
    // EPSV for both, and the bundle begins on connections already open (125, not 150).
    assert_eq!(stderr.matches("> RETR ").count(), 0, "{stderr}");
    assert_eq!(stderr.matches("> RBND").count(), 1, "{stderr}");
    let at = |s: &str| {
        stderr
            .find(s)
            .unwrap_or_else(|| panic!("no {s:?} in {stderr}"))
    };
    assert!(at("> MODE E") < at("> MLSR"), "{stderr}");
    assert_eq!(stderr.matches("> EPSV").count(), 1, "{stderr}");
    assert!(at("> RBND") < at("< 125 "), "{stderr}");
    assert!(
        stderr.contains("> BNDL ") && stderr.contains("z%20b%2520c.txt"),
        "{stderr}"
    );
    let records = file_records(&stdout);
    assert_eq!(records.len(), names.len());
    let bundled = records
        .iter()
        .filter(|r| r["bundle"] == names.len())
        .count();
    assert_eq!(bundled, names.len(), "{stdout}");
    // The server's transfer log has a line for each file, at its own size.
    let log = std::fs::read_to_string(&xferlog).unwrap();
    assert_eq!(log.lines().count(), names.len(), "{log}");
    let f299 = log.lines().find(|l| l.contains("/data/f299")).unwrap();
    let size = std::fs::metadata(data.join("f299")).unwrap().len();
    assert!(f299.contains(&format!(" {size} ")), "{f299}");
}

/// A tree larger than the server lists in one MLSR (`--max-tree-entries`) comes a directory at
/// a time: the session asked for MODE E for its bundles, so each MLSD comes in blocks too
/// (read as a plain listing, its block headers made no sense and the tree came out empty),
/// and the files still come as bundles.
#[test]
fn a_tree_too_large_for_one_listing_comes_a_directory_at_a_time_in_blocks() {
    let dir = tempdir();
    let data = dir.path().join("served/data");
    let names = small_files(&data);
    let server = Server::start(
        &dir.path().join("served"),
        &["--anonymous", "--max-tree-entries", "100"],
    );
    let got = dir.path().join("got");
    let home = tempdir();
    let url = server.url("data/");
    let args = ["get", "-r", "-v", &url, got.to_str().unwrap()];
    let (_, stderr) = braid_ok(home.path(), &args);
    same_files_and_times(&got.join("data"), &data, &names);
    let at = |s: &str| {
        stderr
            .find(s)
            .unwrap_or_else(|| panic!("no {s:?} in {stderr}"))
    };
    assert!(at("> MODE E") < at("> MLSR"), "{stderr}");
    assert!(at("more than 100 entries") < at("> MLSD"), "{stderr}");
    // The top and its two subdirectories, each listed on its own.
    assert_eq!(stderr.matches("> MLSD").count(), 3, "{stderr}");
    assert_eq!(stderr.matches("> RETR ").count(), 0, "{stderr}");
    assert!(stderr.contains("> RBND"), "{stderr}");
}

/// `put -r` to a braid server stores a tree's small files as one bundle (SBND): no STOR and
/// no MFMT per file, every file with its bytes and its time, the server's transfer log a
/// line per file, and no partial left beside them.
#[test]
fn a_trees_small_files_are_stored_as_one_bundle_with_their_names_and_times() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let names = small_files(&data);
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let xferlog = dir.path().join("xferlog");
    let log = xferlog.to_str().unwrap();
    let server = Server::start(&served, &["--anonymous-write", "--xferlog", log]);
    let home = tempdir();
    let url = server.url("up/");
    let args = ["put", "-r", "-v", "--json", data.to_str().unwrap(), &url];
    let (stdout, stderr) = braid_ok(home.path(), &args);
    same_files_and_times(&served.join("up/data"), &data, &names);
    assert_eq!(stderr.matches("> SBND").count(), 1, "{stderr}");
    for per_file in ["> STOR ", "> MFMT "] {
        assert_eq!(stderr.matches(per_file).count(), 0, "{per_file}: {stderr}");
    }
    assert!(
        stderr.contains("@1577934545:"),
        "times go in BNDL: {stderr}"
    );
    let records = file_records(&stdout);
    assert_eq!(records.len(), names.len());
    let bundled = records
        .iter()
        .filter(|r| r["bundle"] == names.len() && r["op"] == "put")
        .count();
    assert_eq!(bundled, names.len(), "{stdout}");
    let log = std::fs::read_to_string(&xferlog).unwrap();
    assert_eq!(log.lines().count(), names.len(), "{log}");
    assert!(
        log.lines().all(|l| l.contains(" i ")),
        "each an upload: {log}"
    );
    let partials = walk_names(&served)
        .into_iter()
        .filter(|n| n.ends_with(braid_proto::path::PART_SUFFIX))
        .count();
    assert_eq!(partials, 0);
}

/// 304 small files under `top` (names with blanks and percents, in subdirectories, an empty
/// one), file `i` with time `KNOWN_MTIME + i`: their names, in that order.
fn small_files(top: &Path) -> Vec<String> {
    std::fs::create_dir_all(top.join("sub/deeper")).unwrap();
    let mut names: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
    names.extend(["z b%20c.txt", "sub/x y", "sub/deeper/leaf", "empty"].map(String::from));
    for (i, name) in names.iter().enumerate() {
        let f = top.join(name);
        let len = if name == "empty" {
            0
        } else {
            1 + (i * 997) % 9000
        };
        std::fs::write(&f, random_bytes(len, i as u64)).unwrap();
        set_mtime(&f, KNOWN_MTIME + i as i64);
    }
    names
}

/// Runs braid with `args` (HOME at `home`), which must exit 0: its stdout and stderr.
fn braid_ok(home: &Path, args: &[&str]) -> (String, String) {
    let out = crate::util::braid_command(home)
        .args(args)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    (stdout, stderr)
}

/// `copy` holds what `data` does, and file `names[i]` has time `KNOWN_MTIME + i` there.
fn same_files_and_times(copy: &Path, data: &Path, names: &[String]) {
    assert_eq!(tree_of(copy), tree_of(data));
    for (i, name) in names.iter().enumerate() {
        let mtime = std::fs::metadata(copy.join(name)).unwrap().mtime();
        assert_eq!(mtime, KNOWN_MTIME + i as i64, "{name}");
    }
}

/// Every name under `top`, files and directories, hidden ones too.
fn walk_names(top: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(top).unwrap() {
        let e = e.unwrap();
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk_names(&e.path()));
        }
    }
    out
}

/// Ctrl-C while a bundle arrives (paced by the server at 100 kB/s, so that it would take 40 s)
/// stops it at once: exit 7, the tree interrupted, no file of the bundle named and no
/// partial left; the next `--update` brings the whole tree.
#[test]
fn ctrl_c_stops_a_bundle_part_way_and_leaves_no_partial() {
    let dir = tempdir();
    let data = dir.path().join("served/data");
    std::fs::create_dir_all(&data).unwrap();
    for i in 0..100u64 {
        std::fs::write(data.join(format!("f{i:03}")), random_bytes(80_000, i)).unwrap();
    }
    let server = Server::start(&dir.path().join("served"), &["--anonymous"]);
    let got = dir.path().join("got");
    let child = crate::util::braid_command(dir.path())
        .args([
            "get",
            "-r",
            "-j",
            "1",
            "-v",
            "--json",
            "--max-rate",
            "100kB",
        ])
        .args([&server.url("data/"), got.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first of its files has blocks written, the bundle is under way.
    let first = got.join("data/f000.part");
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !first.exists() {
        assert!(std::time::Instant::now() < until, "no bundle under way");
        std::thread::sleep(Duration::from_millis(10));
    }
    crate::util::signal_process(child.id(), rustix::process::Signal::INT);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("> RBND"), "{stderr}");
    let s = tree_summary(&stdout);
    assert_eq!(s["interrupted"], true, "{s}");
    assert_eq!(s["files"], 0, "{s}");
    let left: Vec<_> = std::fs::read_dir(got.join("data")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let (code, _, err) = braid(
        &[
            "get",
            "-r",
            "--update",
            &server.url("data/"),
            got.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(tree_of(&got.join("data")), tree_of(&data));
}

/// With `-n auto`, a tree's small files that go one by one (1.5 MiB here: too large for a
/// bundle, twelve blocks, which a file on its own would send over several connections) each
/// go on one data connection when uploaded: more would cost every file a thread per
/// connection at both ends, for nothing.
#[test]
fn small_files_of_a_tree_each_go_on_one_data_connection() {
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let size = 1536 << 10;
    for i in 0..6u64 {
        std::fs::write(data.join(format!("f{i}")), random_bytes(size, i)).unwrap();
    }
    let root = dir.path().join("served");
    std::fs::create_dir_all(root.join("up")).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let got = dir.path().join("got");
    let (up, down) = (server.url("up/"), server.url("up/data/"));
    let [(_, put), (_, get)] = put_then_get(&data, &up, &down, &got, "2");
    assert_eq!((put.len(), get.len()), (6, 6), "{put:?} {get:?}");
    for f in &put {
        assert!(f["bundle"].is_null(), "{f}");
        assert_eq!(f["streams"], 1, "{f}");
        let per_conn = f["per_connection_bytes"].as_array().unwrap();
        let carried: usize = per_conn.iter().map(|b| b.as_u64().unwrap() as usize).sum();
        assert_eq!(carried, size, "{f}");
    }
    assert_eq!(tree_of(&got.join("data")), tree_of(&data));
    assert_eq!(tree_of(&root.join("up/data")), tree_of(&data));
}

/// A tree stopped part-way through its large file, against globus-gridftp-server, both ways:
/// the re-run with `--update` moves the rest of that file and the files not reached, nothing
/// twice. The upload continues from the server's range markers, checked with CKSM first:
/// this server can leave the block it held when the upload broke at offset 0, inside a range
/// it reported (without that check this test ends in a checksum mismatch).
#[test]
fn a_tree_stopped_part_way_with_globus_gridftp_server_goes_on_with_only_the_missing_bytes() {
    use crate::util::{upload_record, wait_timeout};
    use rustix::process::Signal;
    use std::time::Instant;
    let top = tempdir();
    let (home, state) = (top.path().join("home"), top.path().join("state"));
    let local = top.path().join("local/t");
    std::fs::create_dir_all(local.join("d")).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let big = random_bytes(128 << 20, 31);
    std::fs::write(local.join("big.bin"), &big).unwrap();
    let mut small = 0;
    for i in 0..6 {
        small += 1000 + i;
        let f = local.join(format!("d/f{i}"));
        std::fs::write(&f, random_bytes(1000 + i, 40 + i as u64)).unwrap();
    }
    let server = crate::globus::start_gridftp(&home);
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let state_env = [("XDG_STATE_HOME", state.to_str().unwrap())];
    let args = |dir: &str, extra: &[&str]| -> Vec<String> {
        let (from, to) = if dir == "put" {
            (local.display().to_string(), format!("{base}/up/"))
        } else {
            (
                format!("{base}/up/t/"),
                top.path().join("got").display().to_string(),
            )
        };
        let mut a: Vec<String> = [dir, "-r", "--update", "--json", "-j", "1"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        a.extend([from, to]);
        a
    };
    // Runs `braid ARGS`, freezes the server once `far_enough` holds (the large file goes
    // first, alone), sends Ctrl-C and lets the server go on: the run must end interrupted.
    let stop_part_way = |a: Vec<String>, far_enough: &dyn Fn() -> bool| {
        let mut child = crate::util::braid_command(top.path())
            .env("XDG_STATE_HOME", &state)
            .args(&a)
            .arg("-v")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = crate::util::Stderr::follow(&mut child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !far_enough() && Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        server.signal(Signal::STOP);
        let done_early = child.try_wait().unwrap().is_some();
        crate::util::signal_process(child.id(), Signal::INT);
        // The server goes on only once the client has stopped its side (its ABOR is out).
        let aborted = stderr.wait_for("> ABOR", Duration::from_secs(30));
        server.signal(Signal::CONT);
        assert!(aborted, "{a:?}: no ABOR after Ctrl-C");
        let status = wait_timeout(&mut child, Duration::from_secs(30)).expect("braid hung");
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(!done_early, "{a:?} ended before it could be stopped: {out}");
        assert_eq!(status.code(), Some(7), "{a:?}: {out}");
    };
    // The re-run: every file there, the large one continued from `kept` > 0 bytes.
    let finish = |a: Vec<String>| {
        let (code, out, err) = braid(
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
            &state_env,
        );
        assert_eq!(code, 0, "{out}{err}");
        let kept = continued_from(&out, "big.bin");
        let s = tree_summary(&out);
        assert_eq!(s["files"], 7, "{s}");
        assert_eq!(
            s["bytes"].as_u64(),
            Some(big.len() as u64 - kept + small as u64),
            "{s}"
        );
    };

    // Up, paced so that range markers (every second) arrive before the end.
    let recorded = || upload_record(&state).is_some_and(|r| !r.is_empty());
    stop_part_way(args("put", &["--rate-limit", "32MB"]), &recorded);
    finish(args("put", &[]));
    assert_eq!(tree_of(&home.join("up/t")), tree_of(&local));

    // Down, frozen once 8 MiB are written here.
    let part = top.path().join("got/t/big.bin.part");
    let written = || std::fs::metadata(&part).is_ok_and(|m| m.blocks() * 512 > 8 << 20);
    stop_part_way(args("get", &["-n", "2"]), &written);
    finish(args("get", &[]));
    assert_eq!(tree_of(&top.path().join("got/t")), tree_of(&local));
}
