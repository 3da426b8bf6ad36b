//! MODE E between braid peers: sizes around block boundaries, 1 to 32 connections, standard
//! output, protocol violations and checksum mismatches.
use crate::util::{
    BRAID, Raw, Server, braid, json, random_bytes, resume_get, serve_files, tempdir, upload_record,
};
use braid_proto::block::Header;
use std::io::{Read, Write};

/// 64 KiB, the smallest block: keeps the edge sizes small.
const BLOCK: usize = 64 << 10;

#[test]
fn get_and_put_round_trip_at_block_edges_with_1_to_32_connections() {
    let (top, root, server) = serve_files(&[], &["--anonymous-write"]);
    let sizes = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7];
    for (i, &size) in sizes.iter().enumerate() {
        let content = random_bytes(size, 100 + i as u64);
        let name = format!("f{size}.bin");
        std::fs::write(root.join(&name), &content).unwrap();
        for streams in ["1", "2", "8", "32"] {
            let dest = top.path().join(format!("got-{size}-{streams}"));
            let args = ["-n", streams, "--block-size", "64KiB", "--json"];
            let (code, out, err) = braid(
                &[
                    &["get", &server.url(&name), dest.to_str().unwrap()],
                    &args[..],
                ]
                .concat(),
                &[],
            );
            assert_eq!(code, 0, "get {size} bytes over {streams}: {err}");
            assert!(
                std::fs::read(&dest).unwrap() == content,
                "get {size}/{streams}: content differs"
            );
            let s = json(&out);
            assert_eq!(s["mode"], "extended-block");
            // Elastic: the server starts on the first connection, and one that arrives after
            // a small file has been sent is not needed.
            let used = s["streams"].as_u64().unwrap();
            assert!(
                (1..=streams.parse::<u64>().unwrap()).contains(&used),
                "{used} streams of {streams}: {s}"
            );
            let per: u64 = s["per_connection_bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .sum();
            assert_eq!(per, size as u64, "{s}");
            let up = format!("up-{size}-{streams}.bin");
            let (code, out, err) = braid(
                &[
                    &["put", dest.to_str().unwrap(), &server.url(&up)],
                    &args[..],
                ]
                .concat(),
                &[],
            );
            assert_eq!(code, 0, "put {size} bytes over {streams}: {err}");
            assert!(
                std::fs::read(root.join(&up)).unwrap() == content,
                "put {size}/{streams}: content differs"
            );
            assert!(
                json(&out)["checksum"]
                    .as_str()
                    .unwrap()
                    .starts_with("XXH3 ")
            );
        }
    }
}

#[test]
fn one_gib_of_random_data_both_ways_and_to_stdout() {
    let content = random_bytes(1 << 30, 7);
    let (top, root, server) = serve_files(&[("big.bin", &content)], &["--anonymous-write"]);
    let dest = top.path().join("big.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &server.url("big.bin"),
            dest.to_str().unwrap(),
            "-n",
            "8",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "1 GiB get: content differs"
    );
    let s = json(&out);
    // Dynamic striping: every connection carried some of it.
    assert!(
        s["per_connection_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v.as_u64().unwrap() > 0),
        "{s}"
    );
    let (code, _, err) = braid(
        &[
            "put",
            dest.to_str().unwrap(),
            &server.url("back.bin"),
            "-n",
            "4",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(root.join("back.bin")).unwrap() == content,
        "1 GiB put: content differs"
    );
    std::fs::remove_file(root.join("back.bin")).unwrap();
    // Standard output needs the bytes in order: the reorder buffer puts them back.
    let out = std::process::Command::new(BRAID)
        .args([
            "get",
            &server.url("big.bin"),
            "-",
            "-n",
            "8",
            "--block-size",
            "256KiB",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout == content,
        "1 GiB to stdout: bytes differ or are out of order"
    );
}

/// A raw MODE E upload: MODE E, SCKS, EPSV, STOR, then `blocks` on one data connection.
/// Returns the final reply, after the 1xx markers (all of them in the last string).
fn raw_upload(
    server: &Server,
    name: &str,
    scks: Option<&str>,
    blocks: &[u8],
) -> (Raw, String, String) {
    let mut c = Raw::login(server.addr, "anonymous", "x");
    c.expect("TYPE I", "200 Switching to Binary mode.\r\n");
    c.expect("MODE E", "200 Mode set to E.\r\n");
    if let Some(v) = scks {
        c.expect(
            &format!("SCKS XXH3 {v}"),
            "200 SCKS Command Successful.\r\n",
        );
    }
    let mut data = c.epsv();
    c.send(&format!("STOR {name}"));
    assert!(c.reply().starts_with("150 "));
    data.write_all(blocks).unwrap();
    drop(data);
    let mut marks = String::new();
    loop {
        let r = c.reply();
        if !r.starts_with('1') {
            return (c, r, marks);
        }
        marks.push_str(&r);
    }
}

#[test]
fn checksum_mismatch_and_protocol_violations_fail_clearly_and_keep_nothing() {
    let (top, root, server) = serve_files(&[], &["--anonymous-write"]);
    let data = random_bytes(100_000, 3);
    let mut good = Header::data(0, data.len() as u64).encode().to_vec();
    good.extend_from_slice(&data);
    good.extend_from_slice(&Header::eof(1).encode());
    let right = braid_proto::checksum::hex(braid_proto::checksum::of(&data));

    // The right checksum: stored under its name.
    let (_, r, marks) = raw_upload(&server, "ok.bin", Some(&right), &good);
    assert!(r.starts_with("226 "), "{r}");
    // GridFTP's markers before the end: progress, and the ranges stored (for restarts).
    assert!(
        marks.contains("112-Perf Marker\r\n")
            && marks.contains(" Stripe Bytes Transferred: 100000\r\n"),
        "{marks}"
    );
    assert!(marks.ends_with("111 Range Marker 0-100000\r\n"), "{marks}");
    assert!(std::fs::read(root.join("ok.bin")).unwrap() == data);

    // One flipped bit in flight: the checksum the client announced does not match.
    let mut flipped = good.clone();
    flipped[17 + 5000] ^= 0x01;
    let (mut c, r, _) = raw_upload(&server, "bad.bin", Some(&right), &flipped);
    assert!(
        r.starts_with("535 ") && r.contains("checksum mismatch"),
        "{r}"
    );
    assert!(
        !root.join("bad.bin").exists(),
        "a corrupt upload took its final name"
    );
    assert!(
        root.join(".bad.bin.braid-part").exists(),
        "the received data must stay for resume"
    );
    c.expect("NOOP", "200 NOOP ok.\r\n");

    // Unknown descriptor bits.
    let mut odd = good.clone();
    odd[0] = 0x10;
    let (_, r, _) = raw_upload(&server, "odd.bin", None, &odd);
    assert!(r.starts_with("426 ") && r.contains("0x10"), "{r}");
    assert!(!root.join("odd.bin").exists());

    // The sender closes in the middle of a block.
    let (_, r, _) = raw_upload(&server, "short.bin", None, &good[..17 + 50_000]);
    assert!(r.starts_with("426 ") && r.contains("closed"), "{r}");
    assert!(!root.join("short.bin").exists());

    // EOF claims data in its count field.
    let mut lying = Header::eof(1);
    lying.count = 9;
    let (_, r, _) = raw_upload(&server, "lie.bin", None, &lying.encode());
    assert!(r.starts_with("426 ") && r.contains("EOF"), "{r}");

    // The server still serves.
    let (code, _, err) = braid(
        &[
            "get",
            &server.url("ok.bin"),
            top.path().join("again").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
}

/// What a hostile MODE E client tried: blocks that overlap with other bytes (committed as a
/// mix), a block 8 TiB out (a huge sparse partial), and thousands of one-byte blocks (range
/// markers and memory that grow without bound). Each ends the upload clearly; a block sent
/// twice with the same bytes (as after a broken connection) is still fine.
#[test]
fn hostile_mode_e_uploads_are_refused_and_bounded() {
    let (_top, root, server) = serve_files(&[], &["--anonymous-write"]);
    let data = random_bytes(2000, 7);
    let block = |offset: u64, bytes: &[u8]| {
        let mut b = Header::data(offset, bytes.len() as u64).encode().to_vec();
        b.extend_from_slice(bytes);
        b
    };
    let eof = Header::eof(1).encode().to_vec();

    // The same bytes twice, overlapping: stored once, committed whole.
    let twice = [
        block(0, &data[..1500]),
        block(1000, &data[1000..]),
        eof.clone(),
    ]
    .concat();
    let (_, r, _) = raw_upload(&server, "twice.bin", None, &twice);
    assert!(r.starts_with("226 "), "{r}");
    assert!(std::fs::read(root.join("twice.bin")).unwrap() == data);

    // Other bytes where some already arrived.
    let other = random_bytes(1000, 8);
    let mix = [block(0, &data[..1500]), block(1000, &other), eof.clone()].concat();
    let (_, r, _) = raw_upload(&server, "mix.bin", None, &mix);
    assert!(
        r.starts_with("426 ") && r.contains("different bytes"),
        "{r}"
    );
    assert!(
        !root.join("mix.bin").exists(),
        "a mix of two files was committed"
    );

    // One byte 8 TiB out.
    let far = [block(1 << 43, b"x"), eof.clone()].concat();
    let (_, r, _) = raw_upload(&server, "far.bin", None, &far);
    assert!(r.starts_with("552 "), "{r}");
    let part = std::fs::metadata(root.join(".far.bin.braid-part")).map_or(0, |m| m.len());
    assert!(
        part < 1 << 20,
        "a {part}-byte sparse partial was left behind"
    );

    // Thousands of one-byte blocks with gaps between them.
    let mut crumbs: Vec<u8> = (0..5000u64).flat_map(|i| block(2 * i, b"c")).collect();
    crumbs.extend_from_slice(&eof);
    let (mut c, r, marks) = raw_upload(&server, "crumbs.bin", None, &crumbs);
    assert!(r.starts_with("426 ") && r.contains("too fragmented"), "{r}");
    assert!(marks.len() < 100_000, "{} bytes of markers", marks.len());
    c.expect("NOOP", "200 NOOP ok.\r\n");
}

/// Starts a MODE E RETR by hand over `n` connections the client opens (braid's extension);
/// returns the control connection (150 read) and the data connections.
fn retr_by_hand(
    server: &Server,
    path: &str,
    n: usize,
    block: usize,
) -> (Raw, Vec<std::net::TcpStream>) {
    let mut c = Raw::login(server.addr, "anonymous", "x");
    c.expect("TYPE I", "200 Switching to Binary mode.\r\n");
    c.expect("MODE E", "200 Mode set to E.\r\n");
    c.expect(
        &format!("OPTS RETR Parallelism={n},{n},{n};blocksize={block};"),
        "200 OPTS Command Successful.\r\n",
    );
    let first = c.epsv();
    let addr = first.peer_addr().unwrap();
    c.send(&format!("RETR {path}"));
    assert!(c.reply().starts_with("150 "));
    let mut conns = vec![first];
    for _ in 1..n {
        conns.push(std::net::TcpStream::connect(addr).unwrap());
    }
    (c, conns)
}

/// Reads MODE E blocks from each connection into `file` until that connection's EOD, and
/// returns the EOD counts of the EOF blocks seen. Like globus-gridftp-server, braid keeps the
/// connections open (no CLOSE bit) so that the next transfer can reuse them.
fn read_blocks_until_eod(conns: &mut [std::net::TcpStream], file: &mut [u8]) -> Vec<u64> {
    let mut eofs = Vec::new();
    for s in conns {
        loop {
            let mut raw = [0u8; 17];
            s.read_exact(&mut raw).unwrap();
            let h = Header::decode(&raw).unwrap();
            assert_eq!(
                h.descriptor & braid_proto::block::desc::CLOSE,
                0,
                "CLOSE on a reusable connection"
            );
            if h.is_eof() {
                eofs.push(h.offset);
            }
            let n = h.payload() as usize;
            s.read_exact(&mut file[h.offset as usize..][..n]).unwrap();
            if h.is_eod() {
                break;
            }
        }
    }
    eofs
}

#[test]
fn mode_e_download_by_hand_matches_the_gridftp_wire_format() {
    // RETR in MODE E over connections the client opens (braid's extension), read by hand:
    // blocks with offsets, EOD on every connection, one EOF carrying the connection count.
    let data = random_bytes(300_000, 4);
    let (_top, _root, server) = serve_files(&[("f.bin", &data)], &[]);
    let (mut c, mut conns) = retr_by_hand(&server, "f.bin", 3, 65536);
    let mut got = vec![0u8; data.len()];
    let eofs = read_blocks_until_eod(&mut conns, &mut got);
    assert_eq!(eofs, [3], "one EOF carrying the connection count");
    assert!(got == data, "reassembled blocks differ from the file");
    assert!(c.reply().starts_with("226 "));
    // Nothing follows EOD, and the connections stay open.
    for s in &mut conns {
        s.set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let err = s.read(&mut [0u8; 1]).expect_err("bytes after EOD");
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    }
    // A second RETR without PASV reuses them: 125, not 150.
    c.send("RETR f.bin");
    assert!(c.reply().starts_with("125 "));
    let mut again = vec![0u8; data.len()];
    for s in &mut conns {
        s.set_read_timeout(None).unwrap();
    }
    assert_eq!(read_blocks_until_eod(&mut conns, &mut again), [3]);
    assert!(
        again == data,
        "second transfer over reused connections differs"
    );
    assert!(c.reply().starts_with("226 "));
    let r = {
        c.send("CKSM XXH3 0 -1 f.bin");
        c.reply()
    };
    assert_eq!(
        r,
        format!(
            "213 {}\r\n",
            braid_proto::checksum::hex(braid_proto::checksum::of(&data))
        )
    );
    c.send("CKSM MD5 0 -1 f.bin");
    assert!(c.reply().starts_with("213 "));
}

#[test]
fn ctrl_c_sends_abor_keeps_the_partial_and_resume_sends_nothing_twice() {
    use crate::util::{Stderr, signal_process};
    use rustix::process::Signal;
    use std::time::{Duration, Instant};
    let content = random_bytes(256 << 20, 8);
    let (top, _root, server) = serve_files(&[("big.bin", &content)], &[]);
    let dest = top.path().join("big.bin");
    let sidecar = top.path().join("big.bin.part.braid");
    let mut child = std::process::Command::new(BRAID)
        .args([
            "get",
            &server.url("big.bin"),
            dest.to_str().unwrap(),
            "-n",
            "4",
            "--block-size",
            "1MiB",
            "--rate-limit",
            "200MB",
            "-v",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Stderr::follow(&mut child);
    // Freeze the server once data has landed, so the Ctrl-C certainly arrives while the
    // transfer runs (paced to 200 MB/s, it cannot end between two looks at the partial).
    let part = top.path().join("big.bin.part");
    // Past 8 blocks of 1 MiB, some connection has begun its second block, so it finished its
    // first: at least one whole block is stored when the Ctrl-C comes.
    let landed = || {
        std::fs::metadata(&part)
            .map(|m| m.len() > 8 << 20)
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !landed() && Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(2));
    }
    signal_process(server.pid(), Signal::STOP);
    let done_early = child.try_wait().unwrap().is_some();
    signal_process(child.id(), Signal::INT);
    // The server goes on only once the client has stopped its side (its ABOR is out).
    let aborted = stderr.wait_for("> ABOR", Duration::from_secs(30));
    signal_process(server.pid(), Signal::CONT);
    let (code, err) = stderr.finish(child, Duration::from_secs(30));
    assert!(aborted, "no ABOR after Ctrl-C: {err}");
    assert!(
        !done_early,
        "the download finished before it could be interrupted: {err}"
    );
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("Ctrl-C") && err.contains("--resume"), "{err}");
    assert!(sidecar.exists() && !dest.exists());
    // The server noticed, logged it, and serves on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("outcome=\"aborted\"")
        && !server.log().contains("outcome=\"connection_lost\"")
    {
        assert!(
            Instant::now() < deadline,
            "server did not log the stopped transfer: {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The 426 that ends an aborted transfer is its outcome, not a refused command.
    assert!(!server.log().contains("code=426"), "{}", server.log());
    let kept = resume_get(&server.url("big.bin"), &dest, content.len());
    assert!(kept > 0, "the interrupted run stored no whole block");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "resumed file differs"
    );
}

/// A scripted MODE E server with a braid greeting (so the client pipelines): it sends the file
/// in one block, with a bit flipped if `flip` (the corruption happens in flight, where only the
/// end-to-end check sees it), and reports the file's true checksum. It holds its 226 until
/// CKSM arrives or 5 s pass; the thread returns whether CKSM came first, pipelined behind the
/// transfer's end.
fn scripted_server(
    data: Vec<u8>,
    flip: bool,
) -> (std::net::SocketAddr, std::thread::JoinHandle<bool>) {
    use std::io::{BufRead, BufReader};
    let control = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = control.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (sock, _) = control.accept().unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let mut out = sock.try_clone().unwrap();
        let mut lines = BufReader::new(sock);
        let data_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let data_port = data_listener.local_addr().unwrap().port();
        let mut streams = 1;
        let mut early = false;
        let sum = braid_proto::checksum::hex(braid_proto::checksum::of(&data));
        out.write_all(b"220 braid (scripted) ready\r\n").unwrap();
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            let cmd = line.trim_end().to_string();
            line.clear();
            let verb = cmd.split(' ').next().unwrap_or("").to_ascii_uppercase();
            let reply = match verb.as_str() {
                "USER" => "331 ok".to_string(),
                "PASS" => "230 ok".to_string(),
                "FEAT" => "211-Features:\r\n PARALLEL\r\n BRAID 1\r\n211 End".to_string(),
                "SIZE" => format!("213 {}", data.len()),
                "OPTS" => {
                    if let Some(n) = cmd.split("Parallelism=").nth(1) {
                        streams = n.split(',').next().unwrap().parse().unwrap();
                    }
                    "200 ok".to_string()
                }
                "EPSV" => format!("229 Entering Extended Passive Mode (|||{data_port}|)"),
                "RETR" => {
                    out.write_all(b"150 here it comes\r\n").unwrap();
                    let mut socks: Vec<_> = (0..streams)
                        .map(|_| data_listener.accept().unwrap().0)
                        .collect();
                    let mut sent = data.clone();
                    if flip {
                        sent[data.len() / 2] ^= 0x04;
                    }
                    let mut first = Header::data(0, sent.len() as u64).encode().to_vec();
                    first.extend_from_slice(&sent);
                    first.extend_from_slice(&Header::eof(streams).encode());
                    socks[0].write_all(&first).unwrap();
                    for s in socks.iter_mut().skip(1) {
                        s.write_all(&Header::eod().encode()).unwrap();
                    }
                    drop(socks);
                    let secs = std::time::Duration::from_secs;
                    out.set_read_timeout(Some(secs(5))).unwrap();
                    let mut next = String::new();
                    early = lines.read_line(&mut next).is_ok()
                        && next.to_ascii_uppercase().starts_with("CKSM");
                    out.set_read_timeout(Some(secs(30))).unwrap();
                    if early {
                        format!("226 done\r\n213 {sum}")
                    } else {
                        "226 done".to_string()
                    }
                }
                "CKSM" => format!("213 {sum}"),
                "QUIT" => {
                    out.write_all(b"221 bye\r\n").unwrap();
                    return early;
                }
                _ => "200 ok".to_string(),
            };
            out.write_all(format!("{reply}\r\n").as_bytes()).unwrap();
        }
        early
    });
    (addr, handle)
}

#[test]
fn a_block_corrupted_in_flight_is_caught_and_the_file_keeps_its_partial_name() {
    let top = tempdir();
    let data = random_bytes(300_000, 12);
    let (addr, server) = scripted_server(data, true);
    let dest = top.path().join("f.bin");
    let (code, _, err) = braid(
        &[
            "get",
            &format!("ftp://{addr}/f.bin"),
            dest.to_str().unwrap(),
            "-n",
            "2",
        ],
        &[],
    );
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(!dest.exists(), "corrupt data took the final name");
    assert!(
        top.path().join("f.bin.part").exists(),
        "the received data must be kept"
    );
    server.join().unwrap();
}

/// Against a braid server the client asks for the checksum behind the transfer's end, not a
/// round trip after its 226 (0.6 s on a satellite hop): this server holds its 226 until CKSM.
#[test]
fn the_checksum_is_asked_for_before_the_transfer_ends() {
    let top = tempdir();
    let data = random_bytes(300_000, 13);
    let (addr, server) = scripted_server(data.clone(), false);
    let dest = top.path().join("f.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &format!("ftp://{addr}/f.bin"),
            dest.to_str().unwrap(),
            "-n",
            "2",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(server.join().unwrap(), "CKSM came only after the 226");
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    let checksum = json(&out)["checksum"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(checksum.starts_with("XXH3 "), "{out}");
}

#[test]
fn a_broken_upload_resumes_in_mode_e_without_resending_what_the_server_stored() {
    use crate::util::{Stderr, finish_child, signal_process};
    use rustix::process::Signal;
    use std::time::{Duration, Instant};
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let state = top.path().join("state");
    let content = random_bytes(384 << 20, 12);
    let local = top.path().join("up.bin");
    std::fs::write(&local, &content).unwrap();
    // Paced to 200 MB/s (about 2 s for the file), so that neither interrupted run can reach
    // the end between two looks at its progress, however the machine schedules this test.
    let put = |url: &str, resume: bool| {
        let mut cmd = std::process::Command::new(BRAID);
        cmd.args(["put", local.to_str().unwrap(), url, "-n", "4", "-v"])
            .args(["--rate-limit", "200MB"])
            .env("XDG_STATE_HOME", &state)
            .stderr(std::process::Stdio::piped());
        if resume {
            cmd.arg("--resume");
        }
        cmd.spawn().unwrap()
    };
    let wait_for = |child: &mut std::process::Child, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok() && Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        child.try_wait().unwrap().is_some()
    };
    let finish = |child| finish_child(child, Duration::from_secs(30));

    // 1. The server is killed once it has reported stored ranges.
    let server = Server::start(&root, &["--anonymous-write"]);
    let mut child = put(&server.url("up.bin"), false);
    let reported = || upload_record(&state).is_some_and(|r| !r.is_empty());
    let done_early = wait_for(&mut child, &reported);
    signal_process(child.id(), Signal::STOP);
    drop(server);
    signal_process(child.id(), Signal::CONT);
    let (code, err) = finish(child);
    assert!(
        !done_early,
        "the upload ended before the server was killed: {err}"
    );
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert!(
        !root.join("up.bin").exists(),
        "a broken upload took the final name"
    );
    let first = upload_record(&state).expect("no upload record");
    assert!(!first.is_empty());

    // 2. A resumed run, stopped with Ctrl-C once the server has written 32 MiB more. The
    // partial's allocated blocks show that at once (the client learns it up to 100 ms
    // later), and the stopped server keeps the client from finishing meanwhile.
    let written = || {
        use std::os::unix::fs::MetadataExt;
        let part = root.join(".up.bin.braid-part");
        std::fs::metadata(part).map_or(0, |m| m.blocks() * 512)
    };
    // The killed server wrote more than it had reported.
    let before = written();
    let server = Server::start(&root, &["--anonymous-write"]);
    let mut child = put(&server.url("up.bin"), true);
    let stderr = Stderr::follow(&mut child);
    let more = || written() > before + (32 << 20);
    let done_early = wait_for(&mut child, &more);
    signal_process(server.pid(), Signal::STOP);
    signal_process(child.id(), Signal::INT);
    let aborted = stderr.wait_for("> ABOR", Duration::from_secs(30));
    signal_process(server.pid(), Signal::CONT);
    let (code, err) = stderr.finish(child, Duration::from_secs(30));
    assert!(aborted, "no ABOR after Ctrl-C: {err}");
    assert!(!done_early, "the resumed upload ended before Ctrl-C: {err}");
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("Ctrl-C") && err.contains("--resume"), "{err}");
    let second = upload_record(&state).expect("no upload record");
    assert!(
        first.iter().all(|(a, b)| second.covers(a, b)),
        "{first} then {second}"
    );
    assert!(second.len() > first.len(), "{first} then {second}");

    // 3. The last run sends exactly what the server does not hold.
    let (code, out, err) = braid(
        &[
            "put",
            local.to_str().unwrap(),
            &server.url("up.bin"),
            "--resume",
            "--json",
        ],
        &[("XDG_STATE_HOME", state.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    let s = json(&out);
    assert_eq!(s["resumed_from"], second.len(), "{s}");
    assert_eq!(s["bytes"], content.len() as u64 - second.len(), "{s}");
    assert_eq!(s["mode"], "extended-block", "{s}");
    assert!(
        std::fs::read(root.join("up.bin")).unwrap() == content,
        "uploaded file differs"
    );
    assert_eq!(
        upload_record(&state),
        None,
        "the record outlived the upload"
    );
}

#[test]
fn a_slow_connection_carries_only_what_it_can_take() {
    // Four connections, one of them read slowly (about 3 MB/s): blocks go to whichever
    // connection is ready, so the slow one ends up with far less than a static quarter, and
    // the end waits only for what was already queued on it, never for a share of the file.
    use std::time::Duration;
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let size = 128 << 20;
    let data = random_bytes(size, 13);
    std::fs::write(root.join("f.bin"), &data).unwrap();
    let server = Server::start(&root, &[]);
    let (mut c, conns) = retr_by_hand(&server, "f.bin", 4, 256 << 10);
    // Each reader returns the blocks it got, as (offset, payload).
    let readers: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            std::thread::spawn(move || {
                let slow = i == 0;
                let mut blocks = Vec::new();
                loop {
                    let mut raw = [0u8; 17];
                    s.read_exact(&mut raw).unwrap();
                    let h = Header::decode(&raw).unwrap();
                    let mut payload = vec![0u8; h.payload() as usize];
                    if slow {
                        for piece in payload.chunks_mut(16 << 10) {
                            s.read_exact(piece).unwrap();
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    } else {
                        s.read_exact(&mut payload).unwrap();
                    }
                    blocks.push((h.offset, payload));
                    if h.is_eod() {
                        return blocks;
                    }
                }
            })
        })
        .collect();
    let per_conn: Vec<Vec<(u64, Vec<u8>)>> =
        readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert!(c.reply().starts_with("226 "));
    let mut got = vec![0u8; size];
    for (offset, payload) in per_conn.iter().flatten() {
        got[*offset as usize..][..payload.len()].copy_from_slice(payload);
    }
    assert!(got == data, "reassembled blocks differ from the file");
    let bytes: Vec<usize> = per_conn
        .iter()
        .map(|blocks| blocks.iter().map(|(_, p)| p.len()).sum())
        .collect();
    // A static split would give each connection 32 MiB; the slow one gets what it reads
    // while the others finish, plus what the socket buffers held.
    assert!(
        bytes[0] < size / 8,
        "the slow connection carried {} of {size} bytes: {bytes:?}",
        bytes[0]
    );
    eprintln!("bytes per connection (the first read slowly): {bytes:?}");
}

#[test]
fn xftp_mult_and_mprt_download_over_the_ports_the_client_names() {
    // The XFTP paper's commands: MULT n, then MPRT with n ports the client listens on; the
    // server connects to each and sends MODE E blocks over all of them.
    let data = random_bytes(5_000_000, 14);
    let (_top, _root, server) = serve_files(&[("f.bin", &data)], &[]);
    let mut c = Raw::login(server.addr, "anonymous", "x");
    c.expect("TYPE I", "200 Switching to Binary mode.\r\n");
    c.expect("MODE E", "200 Mode set to E.\r\n");
    c.send("MULT 3");
    assert!(c.reply().starts_with("200 MULT 3 ok"));
    let listeners: Vec<_> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port().to_string())
        .collect();
    c.expect(
        &format!("MPRT {}", ports.join(",")),
        "200 MPRT command successful.\r\n",
    );
    c.send("RETR f.bin");
    assert!(c.reply().starts_with("150 "));
    let mut conns: Vec<_> = listeners.iter().map(|l| l.accept().unwrap().0).collect();
    let mut got = vec![0u8; data.len()];
    assert_eq!(read_blocks_until_eod(&mut conns, &mut got), [3]);
    assert!(got == data, "reassembled blocks differ from the file");
    assert!(c.reply().starts_with("226 "));
}

#[test]
fn a_partial_damaged_on_disk_between_runs_fails_the_resumed_check() {
    // The record says the first MiB is stored, but the partial's bytes were changed since:
    // the resumed download must not trust them.
    let data = random_bytes(3 << 20, 15);
    let (top, _root, server) = serve_files(&[("f.bin", &data)], &[]);
    let dest = top.path().join("f.bin");
    let mut damaged = data[..1 << 20].to_vec();
    damaged[4096] ^= 1;
    std::fs::write(top.path().join("f.bin.part"), &damaged).unwrap();
    let record = serde_json::json!({"path": "f.bin", "size": data.len(), "ranges": "0-1048576"});
    std::fs::write(top.path().join("f.bin.part.braid"), record.to_string()).unwrap();
    let (code, _, err) = braid(
        &[
            "get",
            &server.url("f.bin"),
            dest.to_str().unwrap(),
            "--resume",
        ],
        &[],
    );
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(!dest.exists(), "a damaged file took the final name");
    // Without --resume it starts over and succeeds.
    let (code, _, err) = braid(&["get", &server.url("f.bin"), dest.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&dest).unwrap() == data);
}

/// `--congestion` reaches the sending side's data connections, the braid server's for a
/// download (told with OPTS RETR), the client's own for an upload, and `--json` says which
/// was used; without it, the system's default is used and reported.
#[test]
fn the_sender_uses_the_congestion_control_asked_for_and_says_which() {
    let (default, other) = crate::util::congestion_controls();
    let other = other.as_str();
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.bin"), random_bytes(1 << 20, 61)).unwrap();
    std::fs::write(top.path().join("up.bin"), random_bytes(1 << 20, 62)).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let state = top.path().join("state");
    let env = [("XDG_STATE_HOME", state.to_str().unwrap())];
    let dest = top.path().join("got.bin");
    let up = top.path().join("up.bin");
    let (get_url, put_url) = (server.url("f.bin"), server.url("up.bin"));
    for (asked, want) in [(Some(other), other), (None, default.as_str())] {
        let cc: Vec<&str> = asked.map_or(vec![], |c| vec!["--congestion", c]);
        let get = [
            &["get", &get_url, dest.to_str().unwrap(), "--json"],
            &cc[..],
        ]
        .concat();
        let (code, out, err) = braid(&get, &env);
        assert_eq!(code, 0, "{err}");
        assert_eq!(json(&out)["congestion"], want, "get with {asked:?}");
        let put = [&["put", up.to_str().unwrap(), &put_url, "--json"], &cc[..]].concat();
        let (code, out, err) = braid(&put, &env);
        assert_eq!(code, 0, "{err}");
        assert_eq!(json(&out)["congestion"], want, "put with {asked:?}");
    }
    // A name that cannot be one is refused before anything is sent.
    let (code, _, err) = braid(&["get", &server.url("f.bin"), "--congestion", "BBR"], &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("congestion control name"), "{err}");
}
