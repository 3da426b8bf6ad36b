//! braid's client against ProFTPD, which scripts/test unpacks under target/interop/ (Debian's
//! package would replace vsftpd as the system's FTP server). ProFTPD sends a transfer's 226
//! only once the client has closed its side of the data connection, or after its lingering
//! timeout: a client that waits for the 226 first stalls for that timeout on every file.

use crate::util::{Daemon, braid_command, log_lines, random_bytes, run, tempdir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Longer than any test here may take, so that a client that waits for it fails the test
/// by its deadline rather than passing slowly.
const LINGER_SECONDS: u64 = 300;

fn proftpd() -> PathBuf {
    let program =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop/proftpd/usr/sbin/proftpd");
    assert!(
        program.exists(),
        "this test needs ProFTPD unpacked at {}: run ./scripts/test, which does it",
        program.display()
    );
    program
}

/// ProFTPD on a free port, serving `top/root` to anonymous users, `pub/` writable; with `tls`
/// (certificate and key), FTPS required, with its default of data connections that must
/// resume the control connection's TLS session.
fn start(top: &Path, tls: Option<(&str, &str)>) -> Daemon {
    start_with(top, tls, "")
}

/// [`start`] with more configuration (a module and its directives).
fn start_with(top: &Path, tls: Option<(&str, &str)>, extra: &str) -> Daemon {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root: ProFTPD starts as root and drops to nobody"
    );
    let program = proftpd();
    let modules = program.parent().unwrap().join("../lib/proftpd");
    let root = top.join("root");
    std::fs::create_dir_all(root.join("pub")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(root.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    Daemon::start("proftpd", |port| {
        let conf = top.join("proftpd.conf");
        let t = top.display();
        let tls = tls.map_or(String::new(), |(cert, key)| {
            format!(
                "LoadModule mod_tls.c\nTLSEngine on\nTLSRequired on\n\
                 TLSProtocol TLSv1.2 TLSv1.3\nTLSRSACertificateFile {cert}\n\
                 TLSRSACertificateKeyFile {key}\nTLSLog {t}/tls.log\n"
            )
        });
        std::fs::write(
            &conf,
            format!(
                "ServerName test\nServerType standalone\nDefaultServer on\nPort {port}\n\
                 DefaultAddress 127.0.0.1\nUseIPv6 off\nUser nobody\nGroup nogroup\n\
                 PidFile {t}/proftpd.pid\nScoreboardFile {t}/proftpd.scoreboard\n\
                 DelayTable none\nWtmpLog off\nUseFtpUsers off\nUseReverseDNS off\nTimeoutLinger {LINGER_SECONDS}\n\
                 ModulePath {}\n{tls}{extra}\
                 <Anonymous {}>\n  User nobody\n  Group nogroup\n  UserAlias anonymous nobody\n\
                 RequireValidShell off\n  Umask 022\n  <Directory pub>\n    <Limit WRITE>\n\
                 AllowAll\n    </Limit>\n  </Directory>\n</Anonymous>\n",
                modules.display(),
                root.display()
            ),
        )
        .unwrap();
        let mut c = Command::new(&program);
        c.args(["-n", "-q", "-c"]).arg(&conf);
        c
    })
}

/// Runs braid with `args`; it must succeed well before ProFTPD's lingering timeout.
fn braid_ok(home: &Path, args: &[&str]) -> String {
    let (ok, out, err) = run(braid_command(home).args(args), Duration::from_secs(60));
    assert!(
        ok,
        "braid {args:?} failed or waited for the lingering close: {err}"
    );
    out
}

#[test]
fn braid_client_against_proftpd_does_not_wait_for_the_lingering_close() {
    let top = tempdir();
    let server = start(top.path(), None);
    let root = top.path().join("root");
    let content = random_bytes(5 << 20, 91);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let got = top.path().join("got.bin");
    let home = top.path();
    braid_ok(
        home,
        &["get", &format!("{base}/f.bin"), got.to_str().unwrap(), "-q"],
    );
    assert!(std::fs::read(&got).unwrap() == content, "download differs");
    let listing = braid_ok(home, &["ls", &format!("{base}/")]);
    assert!(listing.contains("f.bin"), "{listing}");
    braid_ok(
        home,
        &[
            "put",
            got.to_str().unwrap(),
            &format!("{base}/pub/up.bin"),
            "-q",
        ],
    );
    assert!(
        std::fs::read(root.join("pub/up.bin")).unwrap() == content,
        "upload differs"
    );
    // Four ranges on four sessions, each stopped with ABOR at its end but the last.
    let out = braid_ok(
        home,
        &[
            "get",
            &format!("{base}/f.bin"),
            got.to_str().unwrap(),
            "-n",
            "4",
            "--json",
        ],
    );
    assert!(out.contains("\"mode\":\"stream-segmented\""), "{out}");
    assert!(
        std::fs::read(&got).unwrap() == content,
        "segmented download differs"
    );
    // A partial download resumes from where it stopped.
    std::fs::remove_file(&got).unwrap();
    std::fs::write(top.path().join("got.bin.part"), &content[..1_000_000]).unwrap();
    let out = braid_ok(
        home,
        &[
            "get",
            &format!("{base}/f.bin"),
            got.to_str().unwrap(),
            "--resume",
            "--json",
        ],
    );
    assert!(out.contains("\"resumed_from\":1000000"), "{out}");
    assert!(
        std::fs::read(&got).unwrap() == content,
        "resumed download differs"
    );
    // A partial longer than the file is no partial of it, in ranges as in one stream.
    let longer = top.path().join("long.bin");
    std::fs::write(
        top.path().join("long.bin.part"),
        vec![0u8; content.len() + 1],
    )
    .unwrap();
    let (_, _, err) = run(
        braid_command(home).args([
            "get",
            &format!("{base}/f.bin"),
            longer.to_str().unwrap(),
            "-n",
            "4",
            "--resume",
        ]),
        Duration::from_secs(60),
    );
    assert!(err.contains("not a partial copy"), "{err}");
    assert!(!longer.exists());
}

/// braid's client over TLS against ProFTPD with `TLSRequired on` and its default session-reuse
/// requirement: a download, a listing and an upload, each data connection resuming the
/// control connection's session.
#[test]
fn braid_client_against_proftpd_over_tls() {
    let top = tempdir();
    let (c, k) = crate::util::certificate(top.path());
    let server = start(top.path(), Some((&c, &k)));
    let root = top.path().join("root");
    let content = random_bytes(5 << 20, 92);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    let base = format!("ftp://localhost:{}", server.port);
    let got = top.path().join("got.bin");
    let home = top.path();
    let tls = ["--tls-ca", c.as_str(), "-q"];
    let (file_url, up_url) = (format!("{base}/f.bin"), format!("{base}/pub/up.bin"));
    let get = [&["get", &file_url, got.to_str().unwrap()][..], &tls].concat();
    braid_ok(home, &get);
    assert!(std::fs::read(&got).unwrap() == content, "download differs");
    let listing = braid_ok(home, &[&["ls", &format!("{base}/")][..], &tls].concat());
    assert!(listing.contains("f.bin"), "{listing}");
    let put = [&["put", got.to_str().unwrap(), &up_url][..], &tls].concat();
    braid_ok(home, &put);
    assert!(
        std::fs::read(root.join("pub/up.bin")).unwrap() == content,
        "upload differs"
    );
    // In clear, ProFTPD refuses the login, and braid says why.
    let (ok, _, err) = run(
        braid_command(home).args(["ls", &format!("{base}/")]),
        Duration::from_secs(60),
    );
    assert!(!ok && (err.contains("550") || err.contains("530")), "{err}");
}

/// MODE Z with ProFTPD's mod_deflate: `--compress on` downloads, resumes and uploads through
/// zlib, byte for byte, and says so in -v; the default (auto) leaves MODE Z alone.
#[test]
fn braid_client_uses_mode_z_with_proftpd_mod_deflate() {
    let top = tempdir();
    let deflate = format!(
        "LoadModule mod_deflate.c\nDeflateEngine on\nDeflateLog {}/deflate.log\n",
        top.path().display()
    );
    let server = start_with(top.path(), None, &deflate);
    let root = top.path().join("root");
    let text = log_lines(4 << 20, 93);
    std::fs::write(root.join("log.txt"), &text).unwrap();
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let home = top.path();
    let got = top.path().join("got.txt");
    let (ok, _, err) = run(
        braid_command(home).args([
            "get",
            &format!("{base}/log.txt"),
            got.to_str().unwrap(),
            "--compress",
            "on",
            "-v",
        ]),
        Duration::from_secs(60),
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("> MODE Z\n< 200"),
        "MODE Z was not used: {err}"
    );
    assert!(std::fs::read(&got).unwrap() == text, "download differs");
    // Resumed: REST counts bytes of the file, not of the deflated stream.
    std::fs::remove_file(&got).unwrap();
    std::fs::write(top.path().join("got.txt.part"), &text[..1_500_000]).unwrap();
    let out = braid_ok(
        home,
        &[
            "get",
            &format!("{base}/log.txt"),
            got.to_str().unwrap(),
            "--compress",
            "on",
            "--resume",
            "--json",
        ],
    );
    assert!(out.contains("\"resumed_from\":1500000"), "{out}");
    assert!(
        std::fs::read(&got).unwrap() == text,
        "resumed download differs"
    );
    let (ok, _, err) = run(
        braid_command(home).args([
            "put",
            got.to_str().unwrap(),
            &format!("{base}/pub/up.txt"),
            "--compress",
            "on",
            "-v",
        ]),
        Duration::from_secs(60),
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("> MODE Z\n< 200"),
        "MODE Z was not used: {err}"
    );
    assert!(
        std::fs::read(root.join("pub/up.txt")).unwrap() == text,
        "upload differs"
    );
    // A tree: its listings (MLSD) and its files, each in MODE Z and back to MODE S.
    std::fs::create_dir_all(root.join("tree/sub")).unwrap();
    std::fs::write(root.join("tree/a.txt"), &text[..100_000]).unwrap();
    std::fs::write(root.join("tree/sub/b.txt"), &text[..200_000]).unwrap();
    let back = top.path().join("back");
    let (ok, _, err) = run(
        braid_command(home).args([
            "get",
            "-r",
            "-j",
            "1",
            &format!("{base}/tree/"),
            back.to_str().unwrap(),
            "--compress",
            "on",
            "-v",
        ]),
        Duration::from_secs(60),
    );
    assert!(ok, "{err}");
    let listed = err.matches("> MODE Z\n< 200").count();
    assert!(listed >= 4, "two listings and two files in MODE Z: {err}");
    assert!(std::fs::read(back.join("tree/a.txt")).unwrap() == text[..100_000]);
    assert!(std::fs::read(back.join("tree/sub/b.txt")).unwrap() == text[..200_000]);
    let (ok, _, err) = run(
        braid_command(home).args(["get", &format!("{base}/log.txt"), "-", "-v"]),
        Duration::from_secs(60),
    );
    assert!(ok, "{err}");
    assert!(!err.contains("> MODE Z"), "auto used MODE Z: {err}");
}
