//! Compressed MODE E blocks between braid peers (`--compress`): text moves compressed both
//! ways and comes out byte for byte (the whole-file checksum over the original bytes agrees),
//! random data moves as it is, TLS compresses only when asked with `on`, a server run with
//! `--compress off` is not asked, and an interrupted compressed download resumes.
use crate::util::{
    Server, braid, certificate, finish_child, json, log_lines, random_bytes, signal_process,
    tempdir, wait_for_recorded_range,
};
use std::path::Path;
use std::time::Duration;

/// Runs braid, which must succeed, and gives its JSON summary.
fn summary(args: &[&str]) -> serde_json::Value {
    let (code, out, err) = braid(args, &[]);
    assert_eq!(code, 0, "braid {args:?}: {err}");
    json(&out)
}

fn same(a: &Path, b: &Path) {
    assert!(
        std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
        "{} differs from {}",
        a.display(),
        b.display()
    );
}

#[test]
fn text_goes_compressed_both_ways_and_random_data_as_it_is() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("log.txt"), log_lines(8 << 20, 1)).unwrap();
    std::fs::write(root.join("rand.bin"), random_bytes(4 << 20, 2)).unwrap();
    let server = Server::start(&root, &["--anonymous-write"]);
    let got = top.path().join("got.txt");
    let g = got.to_str().unwrap();
    let s = summary(&[
        "get",
        &server.url("log.txt"),
        g,
        "--compress",
        "on",
        "--json",
    ]);
    same(&got, &root.join("log.txt"));
    let c = &s["compression"];
    assert!(c["compressed_blocks"].as_u64().unwrap() > 0, "{s}");
    assert!(c["wire_bytes"].as_u64().unwrap() < 4 << 20, "{s}");
    assert!(!c["levels"].as_array().unwrap().is_empty(), "{s}");
    let s = summary(&[
        "put",
        g,
        &server.url("up.txt"),
        "--compress",
        "on",
        "--json",
    ]);
    same(&root.join("up.txt"), &got);
    assert!(
        s["compression"]["wire_bytes"].as_u64().unwrap() < 4 << 20,
        "{s}"
    );
    // Random blocks do not shrink: they go as they are, every byte of them.
    let rand = top.path().join("rand.bin");
    let r = rand.to_str().unwrap();
    let s = summary(&[
        "get",
        &server.url("rand.bin"),
        r,
        "--compress",
        "on",
        "--json",
    ]);
    same(&rand, &root.join("rand.bin"));
    assert_eq!(s["compression"]["compressed_blocks"], 0, "{s}");
    assert_eq!(s["compression"]["wire_bytes"], 4 << 20, "{s}");
    // Off: not even asked for.
    let s = summary(&[
        "get",
        &server.url("log.txt"),
        g,
        "--compress",
        "off",
        "--json",
    ]);
    assert!(s.get("compression").is_none(), "{s}");
    same(&got, &root.join("log.txt"));
}

#[test]
fn over_tls_auto_compresses_nothing_and_on_does() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("log.txt"), log_lines(4 << 20, 3)).unwrap();
    let (cert, key) = certificate(top.path());
    let server = Server::start(&root, &["--tls-cert", &cert, "--tls-key", &key]);
    let url = format!("ftp://localhost:{}/log.txt", server.port());
    let got = top.path().join("got.txt");
    let g = got.to_str().unwrap();
    for (policy, compressed) in [("auto", false), ("on", true)] {
        let s = summary(&[
            "get",
            &url,
            g,
            "--tls-ca",
            &cert,
            "--compress",
            policy,
            "--json",
        ]);
        same(&got, &root.join("log.txt"));
        assert!(s.get("tls_handshakes").is_some(), "not over TLS: {s}");
        let blocks = s["compression"]["compressed_blocks"].as_u64().unwrap();
        assert_eq!(blocks > 0, compressed, "--compress {policy}: {s}");
    }
}

#[test]
fn a_server_with_compress_off_is_not_asked_and_the_transfer_goes_plain() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("log.txt"), log_lines(2 << 20, 4)).unwrap();
    let server = Server::start(&root, &["--compress", "off"]);
    let got = top.path().join("got.txt");
    let s = summary(&[
        "get",
        &server.url("log.txt"),
        got.to_str().unwrap(),
        "--compress",
        "on",
        "--json",
    ]);
    same(&got, &root.join("log.txt"));
    assert!(s.get("compression").is_none(), "{s}");
}

#[test]
fn an_interrupted_compressed_download_resumes() {
    use rustix::process::Signal;
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let text = log_lines(24 << 20, 5);
    std::fs::write(root.join("log.txt"), &text).unwrap();
    let server = Server::start(&root, &[]);
    let url = server.url("log.txt");
    let dest = top.path().join("got.txt");
    let d = dest.to_str().unwrap();
    // Paced at 1 MB/s on the wire (several seconds even compressed): Ctrl-C comes mid-way.
    let child = crate::util::braid_command(top.path())
        .args([
            "get",
            &url,
            d,
            "-n",
            "2",
            "--max-rate",
            "1MB",
            "--compress",
            "on",
            "-q",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_recorded_range(&top.path().join("got.txt.part.braid"));
    signal_process(child.id(), Signal::INT);
    let (code, first) = finish_child(child, Duration::from_secs(30));
    assert_eq!(code, Some(7), "{first}");
    let s = summary(&["get", &url, d, "--resume", "--compress", "on", "--json"]);
    let (kept, fetched) = (
        s["resumed_from"].as_u64().unwrap(),
        s["bytes"].as_u64().unwrap(),
    );
    assert!(kept > 0, "nothing was kept: {s}\nfirst run: {first}");
    assert_eq!(kept + fetched, text.len() as u64, "{s}");
    assert!(
        s["compression"]["compressed_blocks"].as_u64().unwrap() > 0,
        "{s}"
    );
    assert!(
        std::fs::read(&dest).unwrap() == text,
        "the resumed file differs"
    );
}
