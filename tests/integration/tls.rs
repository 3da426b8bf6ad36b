//! Explicit FTPS (RFC 4217) on `braid serve`: curl, lftp and Python's ftplib, each checking
//! the server's certificate, log in over TLS and move files over TLS data connections.
use crate::util::{Raw, Server, certificate, random_bytes, require, run, tempdir};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A TLS server over `root` with an account `alice` (password `s3cret`) and anonymous uploads.
fn start(top: &Path, root: &Path) -> (Server, String) {
    start_with(top, root, &[])
}

fn start_with(top: &Path, root: &Path, extra: &[&str]) -> (Server, String) {
    let (cert, key) = certificate(top);
    let users = top.join("users");
    crate::util::add_account(&users, "alice", root, "s3cret", true);
    let users = users.display().to_string();
    let args = [
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--users",
        &users,
        "--anonymous",
        "--anonymous-write",
    ];
    (Server::start(root, &[&args[..], extra].concat()), cert)
}

#[test]
fn curl_logs_in_and_transfers_over_tls() {
    require("curl");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let content = random_bytes(3 << 20, 81);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    let (server, cert) = start(top.path(), &root);
    let base = format!("ftp://alice:s3cret@{}", server.addr);
    let curl = |args: &[&str]| {
        run(
            Command::new("curl")
                .args(["-sS", "--max-time", "30", "--ssl-reqd", "--cacert", &cert])
                .args(args),
            Duration::from_secs(40),
        )
    };
    let dest = top.path().join("dl.bin");
    for extra in [&[][..], &["--disable-epsv"][..]] {
        let mut args = extra.to_vec();
        let (url, d) = (format!("{base}/f.bin"), dest.display().to_string());
        args.extend(["-v", url.as_str(), "-o", d.as_str()]);
        let (ok, _, err) = curl(&args);
        assert!(ok, "{err}");
        assert!(err.contains("< 234 ") && err.contains("PROT P"), "{err}");
        assert!(std::fs::read(&dest).unwrap() == content, "download differs");
    }
    let (ok, _, err) = curl(&["-T", dest.to_str().unwrap(), &format!("{base}/up.bin")]);
    assert!(ok, "{err}");
    assert!(std::fs::read(root.join("up.bin")).unwrap() == content);
    let (ok, out, err) = curl(&[&format!("{base}/")]);
    assert!(ok && out.contains("up.bin"), "{out}{err}");
    // A password in clear is refused before it is sent.
    let (ok, _, err) = run(
        Command::new("curl").args(["-sS", "--max-time", "30", &format!("{base}/f.bin")]),
        Duration::from_secs(40),
    );
    assert!(!ok, "a clear-text login succeeded");
    assert!(err.contains("530"), "{err}");
}

#[test]
fn ftplib_and_lftp_verify_the_certificate_and_protect_data() {
    require("python3");
    require("lftp");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let content = random_bytes(2 << 20, 82);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    // Python's ftplib does not resume the control connection's TLS session on data
    // connections: by default the server refuses them, and says what to change.
    let (server, cert) = start(top.path(), &root);
    let refused = r#"
import ftplib, io, ssl, sys
port, cafile = int(sys.argv[1]), sys.argv[2]
ftp = ftplib.FTP_TLS(context=ssl.create_default_context(cafile=cafile))
ftp.connect("127.0.0.1", port, timeout=20)
ftp.login("alice", "s3cret")
try:
    ftp.retrbinary("RETR f.bin", io.BytesIO().write)
    raise SystemExit("a clear data connection after AUTH TLS was allowed")
except ftplib.error_perm as e:
    assert str(e).startswith("522") and "PROT P" in str(e), e
ftp.prot_p()
try:
    ftp.retrbinary("RETR f.bin", io.BytesIO().write)
    raise SystemExit("a data connection without session reuse was allowed")
except ftplib.error_perm as e:
    assert str(e).startswith("522") and "--tls-session-reuse optional" in str(e), e
print("ok")
"#;
    let port = server.port().to_string();
    let (ok, out, err) = run(
        Command::new("python3").args(["-c", refused, &port, &cert]),
        Duration::from_secs(60),
    );
    assert!(ok && out.trim() == "ok", "{out}{err}");
    drop(server);
    let (server, cert) = start_with(top.path(), &root, &["--tls-session-reuse", "optional"]);
    let script = r#"
import ftplib, io, ssl, sys
port, cafile = int(sys.argv[1]), sys.argv[2]
ftp = ftplib.FTP_TLS(context=ssl.create_default_context(cafile=cafile))
ftp.connect("127.0.0.1", port, timeout=20)
ftp.login("alice", "s3cret")
ftp.prot_p()
buf = io.BytesIO()
ftp.retrbinary("RETR f.bin", buf.write)
ftp.storbinary("STOR py.bin", io.BytesIO(buf.getvalue()))
assert ftp.size("py.bin") == len(buf.getvalue())
# MODE E under PROT P is for braid clients, whose data connections prove their session:
# refused to others (not left to hang, never sent in clear).
assert ftp.sendcmd("MODE E").startswith("200")
try:
    ftp.retrbinary("RETR f.bin", buf.write)
    raise SystemExit("MODE E under PROT P was not refused")
except ftplib.error_perm as e:
    assert str(e).startswith("536"), e
ftp.quit()
print("ok")
"#;
    let port = server.port().to_string();
    let (ok, out, err) = run(
        Command::new("python3").args(["-c", script, &port, &cert]),
        Duration::from_secs(60),
    );
    assert!(ok && out.trim() == "ok", "{out}{err}");
    assert!(std::fs::read(root.join("py.bin")).unwrap() == content);

    let local = top.path().join("lftp.bin");
    let lftp = format!(
        "set net:max-retries 1; set net:timeout 10; set cmd:fail-exit yes; \
         set ssl:ca-file {cert}; set ftp:ssl-force yes; set ftp:ssl-protect-data yes; \
         user alice s3cret; get f.bin -o {l}; put {l} -o lftp-up.bin; bye",
        l = local.display()
    );
    let (ok, out, err) = run(
        Command::new("lftp").args(["-p", &port, "-e", &lftp, "127.0.0.1"]),
        Duration::from_secs(60),
    );
    assert!(ok, "{out}{err}");
    assert!(std::fs::read(&local).unwrap() == content);
    assert!(std::fs::read(root.join("lftp-up.bin")).unwrap() == content);
}

/// A client that asks for TLS and then speaks clear text loses its connection; the server
/// keeps serving.
#[test]
fn a_failed_tls_handshake_ends_only_that_session() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let (server, _) = start(top.path(), &root);
    let ask = |raw: &mut Raw, cmd: &str, code: &str| {
        raw.send(cmd);
        let reply = raw.reply();
        assert!(reply.starts_with(code), "{cmd}: {reply}");
    };
    let mut raw = Raw::connect(server.addr);
    ask(&mut raw, "AUTH TLS", "234 ");
    raw.send("USER anonymous");
    assert!(
        raw.closes(),
        "the server kept a session whose handshake failed"
    );
    let mut raw = Raw::connect(server.addr);
    ask(&mut raw, "USER alice", "530 ");
    ask(&mut raw, "USER anonymous", "331 ");
}

/// braid's own client over TLS: the password and the data are encrypted, the certificate is
/// checked, and without `--tls` the server's refusal says what to do.
#[test]
fn braid_gets_puts_and_lists_over_tls() {
    use crate::util::{braid, json};
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let content = random_bytes(3 << 20, 83);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    let (server, cert) = start(top.path(), &root);
    let env = [("BRAID_PASSWORD", "s3cret")];
    let url = |p: &str| format!("ftp://alice@{}/{p}", server.addr);
    let dest = top.path().join("got.bin");
    let d = dest.to_str().unwrap();
    // Braid to braid: MODE E, every data connection TLS, resumed from the control
    // connection's session, and the whole-file checksum compared.
    let (code, out, err) = braid(
        &[
            "get",
            &url("f.bin"),
            d,
            "--tls-ca",
            &cert,
            "-n",
            "4",
            "--json",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&dest).unwrap() == content, "download differs");
    let s = json(&out);
    assert_eq!(s["mode"], "extended-block", "{out}");
    assert!(
        s["checksum"]
            .as_str()
            .is_some_and(|c| c.starts_with("XXH3")),
        "{out}"
    );
    // Every connection that carried data resumed the session; one the server had no more
    // data for may have been closed during its handshake (a loaded machine), and ended unused.
    let conns = s["connections"].as_array().unwrap();
    let used = conns.iter().filter(|c| c["end"] != "unused").count() as u64;
    let resumed = s["tls_handshakes"]["resumed"].as_u64().unwrap();
    assert!((used..=conns.len() as u64).contains(&resumed), "{out}");
    assert_eq!(s["tls_handshakes"]["full"], 0, "{out}");
    let (code, out, err) = braid(
        &[
            "put",
            d,
            &url("up.bin"),
            "--tls-ca",
            &cert,
            "-n",
            "4",
            "--json",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(root.join("up.bin")).unwrap() == content);
    let s = json(&out);
    assert_eq!(s["mode"], "extended-block", "{out}");
    assert!(s["checksum"].is_string(), "{out}");
    assert!(s["tls_handshakes"]["resumed"].as_u64() > Some(0), "{out}");
    let (code, out, err) = braid(&["ls", &url(""), "--tls-ca", &cert, "-v"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("up.bin"), "{out}");
    assert!(err.contains("234 ") && err.contains("PROT P"), "{err}");
    // In clear the account is refused, and the reply says why.
    let (code, _, err) = braid(&["get", &url("f.bin"), d], &env);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("AUTH TLS"), "{err}");
    // A certificate nobody vouches for is refused: here the system's roots do not know it.
    let (code, _, err) = braid(&["get", &url("f.bin"), d, "--tls"], &env);
    assert_ne!(code, 0, "an unknown certificate was accepted");
    assert!(err.contains("certificate"), "{err}");
}

/// A certificate this host does not trust ends `braid get --tls` with exit code 10 and a
/// message that names the fix.
#[test]
fn an_untrusted_certificate_is_its_own_exit_code_with_the_fix() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.bin"), "x").unwrap();
    let (server, _cert) = start(top.path(), &root);
    let dest = top.path().join("f.bin");
    let url = format!("ftp://alice:s3cret@{}/f.bin", server.addr);
    let (code, _, err) = crate::util::braid(&["get", "--tls", &url, dest.to_str().unwrap()], &[]);
    assert_eq!(code, 10, "{err}");
    assert!(
        err.contains("not trusted") && err.contains("--tls-ca"),
        "{err}"
    );
    assert!(!dest.exists());
}

/// curl and lftp accept the certificate `openssl req -x509 -nodes` makes when it is given
/// with --cacert; braid accepts it with --tls-ca as the server's own (rustls alone refuses a CA
/// certificate there), and still refuses it for another name or when another one is given.
#[test]
fn a_self_signed_openssl_certificate_given_with_tls_ca_is_accepted() {
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let content = random_bytes(1 << 20, 82);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    let (cert, key) =
        crate::util::openssl_certificate(top.path(), "server", "IP:127.0.0.1,DNS:localhost");
    let server = Server::start(&root, &["--tls-cert", &cert, "--tls-key", &key]);
    let dest = top.path().join("got.bin");
    let get = |host: &str, ca: &str| {
        let url = format!("ftp://{host}:{}/f.bin", server.addr.port());
        crate::util::braid(&["get", "--tls-ca", ca, &url, dest.to_str().unwrap()], &[])
    };
    let (code, _, err) = get("127.0.0.1", &cert);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&dest).unwrap(), content);
    std::fs::remove_file(&dest).unwrap();
    // The name is still checked: the certificate is for 127.0.0.1 and localhost only.
    let (other, _) = crate::util::openssl_certificate(top.path(), "other", "DNS:elsewhere.example");
    let (code, _, err) = get("127.0.0.1", &other);
    assert_eq!(code, 10, "another certificate was accepted: {err}");
    let (wrong_name, wrong_key) =
        crate::util::openssl_certificate(top.path(), "named", "DNS:elsewhere.example");
    let misnamed = Server::start(&root, &["--tls-cert", &wrong_name, "--tls-key", &wrong_key]);
    let url = format!("ftp://127.0.0.1:{}/f.bin", misnamed.addr.port());
    let (code, _, err) = crate::util::braid(
        &["get", "--tls-ca", &wrong_name, &url, dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(
        code, 10,
        "a certificate for another name was accepted: {err}"
    );
    assert!(!dest.exists());
}

/// A TLS download in MODE E stopped with Ctrl-C resumes over TLS and fetches only what is
/// missing.
#[test]
fn a_tls_parallel_download_resumes() {
    use crate::util::{braid, finish_child, json, signal_process};
    use rustix::process::Signal;
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let content = random_bytes(16 << 20, 84);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    let (server, cert) = start(top.path(), &root);
    let url = format!("ftp://alice@{}/f.bin", server.addr);
    let dest = top.path().join("got.bin");
    let d = dest.to_str().unwrap();
    // Paced by the server at 2 MB/s (8 s), so the Ctrl-C comes while the data moves.
    let args = [
        "get",
        &url,
        d,
        "--tls-ca",
        &cert,
        "-n",
        "2",
        "--max-rate",
        "2MB",
        "-q",
    ];
    let child = crate::util::braid_command(top.path())
        .args(args)
        .env("BRAID_PASSWORD", "s3cret")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::util::wait_for_recorded_range(&top.path().join("got.bin.part.braid"));
    signal_process(child.id(), Signal::INT);
    let (code, first) = finish_child(child, Duration::from_secs(30));
    assert_eq!(code, Some(7), "{first}");
    let (code, out, err) = braid(
        &["get", &url, d, "--tls-ca", &cert, "--resume", "--json"],
        &[("BRAID_PASSWORD", "s3cret")],
    );
    assert_eq!(code, 0, "{err}");
    let s = json(&out);
    let (kept, fetched) = (
        s["resumed_from"].as_u64().unwrap(),
        s["bytes"].as_u64().unwrap(),
    );
    assert!(
        kept > 0,
        "nothing was kept: {out}\nfirst run: {first}\nresumed run: {err}"
    );
    assert_eq!(kept + fetched, content.len() as u64, "{out}");
    assert_eq!(s["mode"], "extended-block", "{out}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "the resumed file differs"
    );
}

/// Starts a TLS server over `root` with `alice` and `bob`, plus `extra` options.
fn start_two_accounts(top: &Path, root: &Path, extra: &[&str]) -> (Server, String) {
    let (cert, key) = certificate(top);
    let users = top.join("users");
    crate::util::add_account(&users, "alice", root, "s3cret", true);
    crate::util::add_account(&users, "bob", root, "hunter2", true);
    let users = users.display().to_string();
    let mut args = vec!["--tls-cert", &cert, "--tls-key", &key, "--users", &users];
    args.extend(extra);
    (Server::start(root, &args), cert)
}

/// A stranger who reaches the passive port first (from the client's own address, as anyone on
/// the same host or behind the same NAT can) and completes a TLS handshake gets neither the
/// download nor has its bytes stored: a PROT P data connection must resume a TLS session of
/// the same login. Another control connection of the same account may lend its session
/// (rclone keeps one ticket cache for all its connections); another account's may not.
#[test]
fn a_stranger_on_the_passive_port_gets_nothing_and_stores_nothing() {
    require("python3");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("secret.bin"), random_bytes(200_000, 85)).unwrap();
    let (server, cert) = start_two_accounts(top.path(), &root, &[]);
    let script = r#"
import ftplib, socket, ssl, sys
port, cafile = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=cafile)
def login(user, password):
    f = ftplib.FTP_TLS(context=ctx)
    f.connect("127.0.0.1", port, timeout=20)
    f.login(user, password)
    f.prot_p()
    f.voidcmd("TYPE I")
    return f
alice, alice2, bob = login("alice", "s3cret"), login("alice", "s3cret"), login("bob", "hunter2")
def first_on_port(victim, command, session, payload=None):
    """Connects to the passive port before the victim's command, so the server takes this
    connection; returns what it received and the victim's final reply."""
    host, p = victim.makepasv()
    sock = socket.create_connection((host, p), timeout=20)
    victim.putcmd(command)
    assert victim.getresp().startswith("150")
    got = b""
    try:
        t = ctx.wrap_socket(sock, server_hostname="127.0.0.1", session=session)
        if payload:
            t.sendall(payload)
        else:
            while chunk := t.recv(65536):
                got += chunk
        t.close()
    except (ssl.SSLError, OSError):
        pass
    try:
        return got, victim.getresp()
    except ftplib.Error as e:
        return got, str(e)
for session in [None, bob.sock.session]:
    got, reply = first_on_port(alice, "RETR secret.bin", session)
    assert got == b"", f"the stranger received {len(got)} bytes"
    assert reply.startswith("522"), reply
got, reply = first_on_port(alice, "STOR planted.bin", None, b"EVIL" * 1000)
assert reply.startswith("522"), reply
# The rightful client: its own session, or another session of the same account.
for session in [alice2.sock.session, alice.sock.session]:
    got, reply = first_on_port(alice, "RETR secret.bin", session)
    assert reply.startswith("226"), reply
    assert len(got) == 200000, len(got)
print("ok")
"#;
    let (ok, out, err) = run(
        Command::new("python3").args(["-c", script, &server.port().to_string(), &cert]),
        Duration::from_secs(60),
    );
    assert!(ok && out.trim() == "ok", "{out}{err}\n{}", server.log());
    assert!(
        !root.join("planted.bin").exists(),
        "the stranger's upload was stored"
    );
}
