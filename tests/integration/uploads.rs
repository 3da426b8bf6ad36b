//! What a server keeps of uploads: one writer per name, partials out of sight and out of the
//! way of names users can create, and partials nobody resumes removed in time.
use crate::util::{Server, random_bytes, require, run, serve_files, tempdir};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// A second upload of a name while the first still sends is refused with 450 (it would have
/// written into the same partial, and the file committed would have been a mix of both); the
/// first completes whole, and the second succeeds when tried again. Nobody sees, creates or
/// removes the partial through FTP.
#[test]
fn two_uploads_of_one_name_never_mix_and_partials_stay_out_of_sight() {
    require("python3");
    let top = tempdir();
    let server = Server::start(top.path(), &["--anonymous-write"]);
    let script = r#"
import ftplib, io, sys
port = int(sys.argv[1])
def login():
    f = ftplib.FTP()
    f.connect("127.0.0.1", port, timeout=20)
    f.login()
    f.voidcmd("TYPE I")
    return f
a, b = login(), login()
first = bytes([1]) * 3_000_000
second = bytes([2]) * 2_000_000
conn = a.transfercmd("STOR same.bin")
conn.sendall(first[:1_000_000])
# The first upload's partial is there now (its first megabyte was written or is on its way:
# wait until the server has opened it, which a second STOR shows by being refused).
try:
    b.storbinary("STOR same.bin", io.BytesIO(second))
    raise SystemExit("a second upload of the same name was accepted while the first ran")
except ftplib.error_temp as e:
    assert str(e).startswith("450"), e
listing = []
b.retrlines("LIST -a", listing.append)
assert not any("braid-part" in l for l in listing), listing
assert not any("braid-part" in n for n in b.nlst()), b.nlst()
assert not any("braid-part" in n for n, _ in b.mlsd()), "MLSD shows the partial"
for cmd in ["MKD .same.bin.braid-part", "DELE .same.bin.braid-part", "RNFR .same.bin.braid-part",
            "RETR .same.bin.braid-part", "SIZE .same.bin.braid-part"]:
    try:
        r = b.sendcmd(cmd)
        raise SystemExit(f"{cmd}: {r}")
    except ftplib.error_perm as e:
        assert str(e).startswith("553") and "reserved" in str(e), (cmd, e)
conn.sendall(first[1_000_000:])
conn.close()
assert a.voidresp().startswith("226")
got = io.BytesIO()
b.retrbinary("RETR same.bin", got.write)
assert got.getvalue() == first, "the committed file is not the first upload"
b.storbinary("STOR same.bin", io.BytesIO(second))
got = io.BytesIO()
b.retrbinary("RETR same.bin", got.write)
assert got.getvalue() == second, "the second upload, tried again, did not replace it"
print("ok")
"#;
    let (ok, out, err) = run(
        Command::new("python3").args(["-c", script, &server.port().to_string()]),
        Duration::from_secs(60),
    );
    assert!(ok && out.trim() == "ok", "{out}{err}\n{}", server.log());
}

/// Two `braid put -n 4` of different files to one name at once: whatever the timing, the
/// name ends up holding one of the two files whole, never a mix.
#[test]
fn two_parallel_puts_to_one_name_leave_one_whole_file() {
    let (top, root, server) = serve_files(&[], &["--anonymous-write"]);
    let (a, b) = (top.path().join("a.bin"), top.path().join("b.bin"));
    let (ca, cb) = (random_bytes(24 << 20, 91), random_bytes(24 << 20, 92));
    std::fs::write(&a, &ca).unwrap();
    std::fs::write(&b, &cb).unwrap();
    let url = server.url("same.bin");
    let put = |f: &std::path::Path| {
        crate::util::braid_command(top.path())
            .args(["put", "-n", "4", "-q"])
            .arg(f)
            .arg(&url)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (pa, pb) = (put(&a), put(&b));
    let (code_a, err_a) = crate::util::finish_child(pa, Duration::from_secs(60));
    let (code_b, err_b) = crate::util::finish_child(pb, Duration::from_secs(60));
    assert!(
        code_a == Some(0) || code_b == Some(0),
        "neither put succeeded: {err_a}\n{err_b}"
    );
    let got = std::fs::read(root.join("same.bin")).unwrap();
    assert!(
        got == ca || got == cb,
        "the file is a mix of both uploads (a: exit {code_a:?} {err_a}; b: exit {code_b:?} {err_b})"
    );
}

/// A partial upload older than `--partial-max-age` is removed (the server looks when it
/// starts and then now and then); a young one stays for its resume.
#[test]
fn old_partial_uploads_expire_and_young_ones_stay() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("d")).unwrap();
    let old = root.join("d/.big.iso.braid-part");
    let young = root.join(".fresh.bin.braid-part");
    for p in [&old, &young] {
        std::fs::write(p, vec![0u8; 4096]).unwrap();
    }
    let f = std::fs::File::options().write(true).open(&old).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(7200))
        .unwrap();
    drop(f);
    let server = Server::start(&root, &["--partial-max-age", "3600"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!old.exists(), "the old partial stayed: {}", server.log());
    assert!(young.exists(), "the young partial was removed");
    // The server logs the sweep after removing the file: wait for the line, not a race.
    server.wait_for_log("expired partial uploads", 1);
}

/// MFMT sets a file's modification time (FEAT lists it), only for users who may write, and
/// `braid put -r` uses it, so an upload keeps its files' times as a download does.
#[test]
fn uploads_keep_their_modification_times() {
    use crate::util::Raw;
    let top = tempdir();
    let root = top.path().join("root");
    let local = top.path().join("local");
    std::fs::create_dir_all(local.join("sub")).unwrap();
    std::fs::create_dir(&root).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_934_245);
    for (name, len) in [("a.txt", 10), ("sub/big.bin", 3 << 20), ("empty", 0)] {
        let p = local.join(name);
        std::fs::write(&p, random_bytes(len, 93)).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    let server = Server::start(&root, &["--anonymous-write"]);
    let (code, _, err) = crate::util::braid(
        &[
            "put",
            "-r",
            "-q",
            local.to_str().unwrap(),
            &server.url("up/"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    for name in ["a.txt", "sub/big.bin", "empty"] {
        let m = std::fs::metadata(root.join("up/local").join(name)).unwrap();
        assert_eq!(m.modified().unwrap(), when, "{name} lost its time");
    }
    let mut raw = Raw::login(server.addr, "anonymous", "x");
    raw.send("FEAT");
    assert!(raw.reply().contains("\r\n MFMT\r\n"));
    raw.expect(
        "MFMT 20000229120000 up/local/a.txt",
        "213 Modify=20000229120000; /up/local/a.txt\r\n",
    );
    let m = std::fs::metadata(root.join("up/local/a.txt")).unwrap();
    assert_eq!(
        m.modified().unwrap(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(951_825_600)
    );
    raw.send("MFMT 2000 up/local/a.txt");
    assert!(raw.reply().starts_with("501"));
    raw.send("MFMT 20000229120000 nothing-here");
    assert!(raw.reply().starts_with("550"));
    // Read-only users may not.
    let ro = Server::start(&root, &[]);
    let mut raw = Raw::login(ro.addr, "anonymous", "x");
    raw.send("MFMT 20100101000000 up/local/a.txt");
    assert!(raw.reply().starts_with("550"));
}

/// A bundle being stored (SBND) leaves nothing when it does not end well: its client gone
/// part-way through the data, its checksum other than what arrived, or a block past its end.
/// Its partials are there while it runs and gone after; no file takes its name; the server
/// goes on serving, and a bundle sent right is stored with its times.
#[test]
fn a_stored_bundle_that_does_not_end_well_leaves_no_file_and_no_partial() {
    use crate::util::Raw;
    use braid_proto::block::Header;
    use std::io::Write;
    let dir = tempdir();
    let root = dir.path().join("served");
    std::fs::create_dir_all(&root).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let (a, b) = (random_bytes(3000, 1), random_bytes(5000, 2));
    let all = [a.clone(), b.clone()].concat();
    let partials = || {
        std::fs::read_dir(&root)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy()
                    .ends_with(braid_proto::path::PART_SUFFIX)
            })
            .count()
    };
    let ok = |raw: &mut Raw, cmd: &str, code: &str| {
        raw.send(cmd);
        let r = raw.reply();
        assert!(r.starts_with(code), "{cmd}: {r}");
    };
    // Logged in, MODE E, a data connection, and SBND of a (with a time) and b under way.
    let start = || {
        let mut raw = Raw::login(server.addr, "anonymous", "x");
        ok(&mut raw, "TYPE I", "200");
        ok(&mut raw, "MODE E", "200");
        let data = raw.epsv();
        ok(&mut raw, "BNDL 3000@1600000000:a 5000:b", "200");
        ok(&mut raw, "SCKS XXH3 *", "200");
        ok(&mut raw, "SBND", "150");
        assert_eq!(
            partials(),
            2,
            "each file's partial exists once SBND is under way"
        );
        (raw, data)
    };
    let gone = || {
        let until = Instant::now() + Duration::from_secs(10);
        while partials() > 0 {
            assert!(Instant::now() < until, "partials left behind");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!root.join("a").exists() && !root.join("b").exists());
    };
    let block = |data: &mut std::net::TcpStream, h: Header, bytes: &[u8]| {
        data.write_all(&h.encode()).unwrap();
        data.write_all(bytes).unwrap();
    };
    let sum = |bytes: &[u8]| braid_proto::checksum::hex(braid_proto::checksum::of(bytes));
    // The next reply past the markers (111, 112) an upload's end brings.
    let last = |raw: &mut Raw| loop {
        let r = raw.reply();
        if !r.starts_with('1') {
            return r;
        }
    };

    // The client vanishes with part of the data sent.
    let (raw, mut data) = start();
    block(&mut data, Header::data(0, 2000), &a[..2000]);
    drop((raw, data));
    gone();

    // Everything arrives, but the client's checksum is another's.
    let (mut raw, mut data) = start();
    block(&mut data, Header::data(0, all.len() as u64), &all);
    block(&mut data, Header::eof(1), &[]);
    raw.send(&format!("SCKS XXH3 {}", sum(b"something else")));
    let scks = last(&mut raw);
    let end = last(&mut raw);
    assert!(scks.starts_with("200"), "{scks}");
    assert!(
        end.starts_with("535 SBND of 2 files") && end.contains("none of them stored"),
        "{end}"
    );
    gone();

    // A block reaching past the bundle's end.
    drop((raw, data));
    let (mut raw, mut data) = start();
    block(
        &mut data,
        Header::data(all.len() as u64 - 10, 20),
        &[0u8; 20],
    );
    let end = last(&mut raw);
    assert!(end.starts_with('4') || end.starts_with('5'), "{end}");
    gone();

    // And one sent right is stored, each file whole, with its time where BNDL gave one.
    drop(data);
    ok(&mut raw, "NOOP", "200");
    let mut raw = {
        let (mut raw, mut data) = start();
        block(&mut data, Header::data(0, all.len() as u64), &all);
        block(&mut data, Header::eof(1), &[]);
        raw.send(&format!("SCKS XXH3 {}", sum(&all)));
        assert!(last(&mut raw).starts_with("200"));
        let end = last(&mut raw);
        assert!(end.starts_with("226"), "{end}");
        raw
    };
    ok(&mut raw, "NOOP", "200");
    assert_eq!(std::fs::read(root.join("a")).unwrap(), a);
    assert_eq!(std::fs::read(root.join("b")).unwrap(), b);
    let mtime = std::fs::metadata(root.join("a"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(
        mtime,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000)
    );
    assert_eq!(partials(), 0);
}

/// A client that starts a MODE E upload and vanishes before any data connection joins leaves
/// nothing to read: the server stops that upload at once, so its name is free again for the
/// next (before, the server held the name's lock until its idle timeout, and a retry right
/// after a Ctrl-C was refused with 450 for minutes).
#[test]
fn an_upload_whose_client_vanishes_before_connecting_frees_its_name_at_once() {
    use std::io::Write;
    let top = tempdir();
    let server = Server::start(top.path(), &["--anonymous-write"]);
    let mut a = crate::util::Raw::login(server.addr, "anonymous", "x");
    for (cmd, code) in [("TYPE I", "200"), ("MODE E", "200"), ("EPSV", "229")] {
        a.send(cmd);
        let r = a.reply();
        assert!(r.starts_with(code), "{cmd}: {r}");
    }
    a.send("STOR held.bin");
    let r = a.reply();
    assert!(r.starts_with("150"), "STOR: {r}");
    let mut b = crate::util::Raw::login(server.addr, "anonymous", "x");
    b.send("TYPE I");
    assert!(b.reply().starts_with("200"));
    // Tries a stream-mode STOR of the name: true when stored, false when the name is still
    // another upload's.
    let mut store = |data: &[u8]| -> bool {
        let mut data_conn = b.epsv();
        b.send("STOR held.bin");
        let r = b.reply();
        if r.starts_with("450") {
            return false;
        }
        assert!(r.starts_with("150") || r.starts_with("125"), "STOR: {r}");
        data_conn.write_all(data).unwrap();
        drop(data_conn);
        let r = b.reply();
        assert!(r.starts_with("226"), "end of STOR: {r}");
        true
    };
    assert!(
        !store(b"early"),
        "a second upload of the name went in while the first ran"
    );
    drop(a);
    let data = random_bytes(10_000, 7);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !store(&data) {
        assert!(
            Instant::now() < deadline,
            "the name stayed locked 20 s after its uploader vanished\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(std::fs::read(top.path().join("held.bin")).unwrap(), data);
    let left: Vec<_> = std::fs::read_dir(top.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "a partial was left: {left:?}");
}
