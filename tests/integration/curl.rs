//! curl as a client of `braid serve`.
use crate::util::{Server, random_bytes, require, run, serve_files, tempdir};
use std::process::Command;
use std::time::Duration;

fn curl(args: &[&str]) -> (bool, String, String) {
    run(
        Command::new("curl")
            .args(["-sS", "--max-time", "30"])
            .args(args),
        Duration::from_secs(40),
    )
}

#[test]
fn curl_lists_gets_puts_resumes_renames_deletes() {
    require("curl");
    let content = random_bytes(3 << 20, 31);
    let (top, root, server) = serve_files(&[("f.bin", &content)], &["--anonymous-write"]);
    let base = format!("ftp://{}", server.addr);
    let (ok, out, err) = curl(&[&format!("{base}/")]);
    assert!(ok, "{err}");
    assert!(
        out.contains("f.bin") && out.contains(&content.len().to_string()),
        "LIST: {out}"
    );
    let (ok, out, err) = curl(&["-l", &format!("{base}/")]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["f.bin"], "NLST");
    // SIZE and MDTM show up as headers.
    let (ok, out, err) = curl(&["-I", &format!("{base}/f.bin")]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("Content-Length: {}", content.len())),
        "SIZE: {out}"
    );
    assert!(out.contains("Last-Modified: "), "MDTM: {out}");
    // MLSD as a custom list command.
    let (ok, out, err) = curl(&["-X", "MLSD", &format!("{base}/")]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("type=file;size={};", content.len())) && out.contains(" f.bin"),
        "MLSD: {out}"
    );
    // Downloads: EPSV (default), PASV, and active mode (EPRT/PORT).
    for extra in [
        &[][..],
        &["--disable-epsv"][..],
        &["-P", "127.0.0.1"][..],
        &["-P", "127.0.0.1", "--disable-eprt"][..],
    ] {
        let dest = top.path().join("dl.bin");
        let mut args: Vec<&str> = extra.to_vec();
        let url = format!("{base}/f.bin");
        let d = dest.to_str().unwrap().to_string();
        args.extend([url.as_str(), "-o", d.as_str()]);
        let (ok, _, err) = curl(&args);
        assert!(ok, "{extra:?}: {err}");
        assert!(
            std::fs::read(&dest).unwrap() == content,
            "file content differs from what was sent"
        );
    }
    // Resumed download: curl sends REST.
    let dest = top.path().join("resumed.bin");
    std::fs::write(&dest, &content[..1_000_000]).unwrap();
    let (ok, _, err) = curl(&[
        "-C",
        "-",
        &format!("{base}/f.bin"),
        "-o",
        dest.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "file content differs from what was sent"
    );
    // Upload, into a directory curl creates (MKD).
    let local = top.path().join("local.bin");
    std::fs::write(&local, &content).unwrap();
    let (ok, _, err) = curl(&[
        "--ftp-create-dirs",
        "-T",
        local.to_str().unwrap(),
        &format!("{base}/new/dir/up.bin"),
    ]);
    assert!(ok, "{err}");
    assert!(
        std::fs::read(root.join("new/dir/up.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    // Resumed upload: curl asks SIZE (braid reports the partial), then APPE.
    let half = top.path().join("half.bin");
    std::fs::write(&half, &content[..1_500_000]).unwrap();
    let (ok, _, err) = curl(&["-T", half.to_str().unwrap(), &format!("{base}/res.bin")]);
    assert!(ok, "{err}");
    let (ok, _, err) = curl(&[
        "-C",
        "-",
        "-T",
        local.to_str().unwrap(),
        &format!("{base}/res.bin"),
    ]);
    assert!(ok, "{err}");
    assert!(
        std::fs::read(root.join("res.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    // Rename and delete with quote commands.
    let (ok, _, err) = curl(&[
        "-Q",
        "RNFR res.bin",
        "-Q",
        "RNTO renamed.bin",
        &format!("{base}/"),
    ]);
    assert!(ok, "{err}");
    assert!(root.join("renamed.bin").exists() && !root.join("res.bin").exists());
    let (ok, _, err) = curl(&["-Q", "DELE renamed.bin", &format!("{base}/")]);
    assert!(ok, "{err}");
    assert!(!root.join("renamed.bin").exists());
    // A missing file is curl's "file not found" (exit 78).
    let out = Command::new("curl")
        .args(["-sS", &format!("{base}/nope"), "-o", "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("does not exist"), "{said}");
}

/// Behind NAT: `--public-address` goes into the 227 reply, and curl, which connects to the
/// control connection's address instead (as NAT-aware clients do), still downloads.
#[test]
fn curl_downloads_from_a_server_that_advertises_a_public_address() {
    require("curl");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let content = random_bytes(1 << 20, 32);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    // 198.51.100.0/24 is TEST-NET-2: nothing here ever connects to it.
    let server = Server::start(&root, &["--public-address", "198.51.100.7"]);
    let dest = top.path().join("dl.bin");
    let (ok, _, err) = curl(&[
        "-v",
        "--disable-epsv",
        "--ftp-skip-pasv-ip",
        &format!("ftp://{}/f.bin", server.addr),
        "-o",
        dest.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("227 Entering Passive Mode (198,51,100,7,"),
        "PASV did not give the public address: {err}"
    );
    assert!(std::fs::read(&dest).unwrap() == content, "download differs");
}
