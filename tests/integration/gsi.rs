//! `gsiftp://` against a globus-gridftp-server that takes only GSI logins: a CA, a host
//! certificate, a user certificate and an RFC 3820 proxy made by openssl, the server's
//! grid-mapfile mapping the user to the account it runs as; all in the test's directory and
//! named to both programs by the X509_* variables, nothing of the system's touched. The
//! server runs with its defaults, so every data connection is authenticated (DCAU A): the
//! transfers pass only if braid's side of GSI's handshake does, both as the end that connects
//! (uploads, listings) and as the one connected to (downloads).
use crate::util::{Daemon, Server, braid, random_bytes, require, run, sbin, tempdir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Credentials made for one test.
struct Grid {
    dir: PathBuf,
}

impl Grid {
    fn openssl(&self, args: &[&str]) {
        let (ok, _, err) = run(
            Command::new("openssl").args(args).current_dir(&self.dir),
            Duration::from_secs(60),
        );
        assert!(ok, "openssl {args:?}: {err}");
    }

    /// The CA (hash-named, with its signing policy) in `certs/`, a host certificate for
    /// 127.0.0.1, alice's certificate and a proxy of it, bob's (same CA, not in the
    /// grid-mapfile) and eve's (self-signed).
    fn new(top: &Path) -> Grid {
        require("openssl");
        let g = Grid {
            dir: top.join("grid"),
        };
        std::fs::create_dir_all(g.dir.join("certs")).unwrap();
        g.self_signed("ca", "/O=braid test/CN=braid test CA");
        let (ok, hash, err) = run(
            Command::new("openssl")
                .args(["x509", "-noout", "-hash", "-in", "ca.pem"])
                .current_dir(&g.dir),
            Duration::from_secs(60),
        );
        assert!(ok, "{err}");
        let hash = hash.trim();
        std::fs::copy(g.dir.join("ca.pem"), g.dir.join(format!("certs/{hash}.0"))).unwrap();
        std::fs::write(
            g.dir.join(format!("certs/{hash}.signing_policy")),
            "access_id_CA X509 '/O=braid test/CN=braid test CA'\n\
             pos_rights globus CA:sign\n\
             cond_subjects globus '\"/O=braid test/*\"'\n",
        )
        .unwrap();
        std::fs::write(
            g.dir.join("leaf.ext"),
            "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost\n\
             basicConstraints=critical,CA:false\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n",
        )
        .unwrap();
        for (stem, cn) in [
            ("host", "host\\/localhost"),
            ("alice", "alice"),
            ("bob", "bob"),
        ] {
            g.signed(
                stem,
                &format!("/O=braid test/CN={cn}"),
                "ca",
                "leaf.ext",
                "",
            );
        }
        // alice's proxy: her subject and one CN more, signed by her, its key unencrypted
        // in the traditional form grid-proxy-init writes, then her certificate.
        std::fs::write(
            g.dir.join("proxy.ext"),
            "proxyCertInfo=critical,language:id-ppl-inheritAll\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n",
        )
        .unwrap();
        g.signed(
            "px",
            "/O=braid test/CN=alice/CN=1234567",
            "alice",
            "proxy.ext",
            "1234567",
        );
        g.openssl(&["rsa", "-in", "px.key", "-traditional", "-out", "px.rsa"]);
        let mut proxy = std::fs::read(g.dir.join("px.pem")).unwrap();
        proxy.extend(std::fs::read(g.dir.join("px.rsa")).unwrap());
        proxy.extend(std::fs::read(g.dir.join("alice.pem")).unwrap());
        std::fs::write(g.dir.join("proxy.pem"), proxy).unwrap();
        g.self_signed("eve", "/O=braid test/CN=eve");
        let user = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "root".into());
        std::fs::write(
            g.dir.join("grid-mapfile"),
            format!("\"/O=braid test/CN=alice\" {user}\n"),
        )
        .unwrap();
        g
    }

    /// `stem`.pem and .key, subject `subj`, signed by its own key.
    fn self_signed(&self, stem: &str, subj: &str) {
        let (key, pem) = (format!("{stem}.key"), format!("{stem}.pem"));
        self.openssl(&[
            "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "2", "-subj", subj,
            "-keyout", &key, "-out", &pem,
        ]);
    }

    /// `stem`.pem and .key, subject `subj`, signed by `by` with the extensions in `ext`.
    fn signed(&self, stem: &str, subj: &str, by: &str, ext: &str, serial: &str) {
        let (csr, key, pem) = (
            format!("{stem}.csr"),
            format!("{stem}.key"),
            format!("{stem}.pem"),
        );
        self.openssl(&[
            "req", "-new", "-nodes", "-newkey", "rsa:2048", "-subj", subj, "-keyout", &key, "-out",
            &csr,
        ]);
        let (ca, ca_key) = (format!("{by}.pem"), format!("{by}.key"));
        let mut args = vec![
            "x509", "-req", "-days", "2", "-in", &csr, "-CA", &ca, "-CAkey", &ca_key, "-extfile",
            ext, "-out", &pem,
        ];
        match serial {
            "" => args.push("-CAcreateserial"),
            s => args.extend(["-set_serial", s]),
        }
        self.openssl(&args);
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// globus-gridftp-server on `port`, taking GSI logins only with the host certificate,
    /// serving the filesystem from `home`.
    fn gridftp(&self, port: u16, home: &Path) -> Command {
        let mut c = Command::new(sbin("globus-gridftp-server"));
        c.args(["-p", &port.to_string()])
            .args(["-control-interface", "127.0.0.1"])
            .args(["-data-interface", "127.0.0.1"])
            .arg("-home-dir")
            .arg(home)
            .args(["-allow-root", "-log-level", "ERROR"])
            .env("X509_CERT_DIR", self.path("certs"))
            .env("X509_USER_CERT", self.path("host.pem"))
            .env("X509_USER_KEY", self.path("host.key"))
            .env("GRIDMAP", self.path("grid-mapfile"));
        c
    }

    fn server(&self, home: &Path) -> Daemon {
        Daemon::start("globus-gridftp-server", |port| self.gridftp(port, home))
    }

    /// A striped one over two data nodes, between which and its front end there is no
    /// authentication (`-ipc-auth-mode none`, as on one host).
    fn striped_server(&self, home: &Path) -> Vec<Daemon> {
        crate::globus::striped_gridftp(|port, _| {
            let mut c = self.gridftp(port, home);
            c.args(["-ipc-auth-mode", "none"]);
            c
        })
    }

    /// `braid serve` at `listen` taking GSI logins with the same host certificate, CAs and
    /// grid-mapfile, serving `root`.
    fn braid_server(&self, listen: &str, root: &Path, extra: &[&str]) -> Server {
        let (cert, key, map, cas) = (
            self.path("host.pem"),
            self.path("host.key"),
            self.path("grid-mapfile"),
            self.path("certs"),
        );
        let mut args = vec![
            "--gsi-cert",
            &cert,
            "--gsi-key",
            &key,
            "--grid-mapfile",
            &map,
            "--gsi-ca-dir",
            &cas,
            "-v",
        ];
        args.extend(extra);
        Server::start_at(listen, root, &args)
    }

    /// The variables naming a user's credential (a proxy, else a certificate and key) and the
    /// CAs trusted, all in this test's directory.
    fn env(&self, proxy: Option<&str>, user: &str, cas: &str) -> Vec<(String, String)> {
        vec![
            (
                "X509_USER_PROXY".into(),
                proxy.map_or_else(|| self.path("no-proxy"), |p| self.path(p)),
            ),
            ("X509_USER_CERT".into(), self.path(&format!("{user}.pem"))),
            ("X509_USER_KEY".into(), self.path(&format!("{user}.key"))),
            ("X509_CERT_DIR".into(), self.path(cas)),
        ]
    }
}

fn braid_with(args: &[&str], env: &[(String, String)]) -> (i32, String, String) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    braid(args, &env)
}

#[test]
fn braid_gets_and_puts_with_a_gsi_credential_against_a_gsi_globus_server() {
    let top = tempdir();
    let grid = Grid::new(top.path());
    let home = top.path().join("home");
    std::fs::create_dir_all(home.join("tree/a/b")).unwrap();
    let content = random_bytes(12_000_017, 61);
    std::fs::write(home.join("src.bin"), &content).unwrap();
    for (i, name) in ["tree/a/one", "tree/a/b/two", "tree/three"]
        .iter()
        .enumerate()
    {
        std::fs::write(home.join(name), random_bytes(10_000 * (i + 1), i as u64)).unwrap();
    }
    let server = grid.server(&home);
    // gsiftp:// paths are absolute, as globus-url-copy reads them.
    let base = format!("gsiftp://127.0.0.1:{}{}", server.port, home.display());
    let proxy = grid.env(Some("proxy.pem"), "alice", "certs");
    let got = top.path().join("got.bin");
    let (code, out, err) = braid_with(
        &[
            "get",
            &format!("{base}/src.bin"),
            got.to_str().unwrap(),
            "-n",
            "4",
            "--json",
        ],
        &proxy,
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&got).unwrap() == content, "download differs");
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["mode"], "extended-block", "{s}");
    assert!(
        s["checksum"].as_str().unwrap().starts_with("ADLER32 "),
        "{s}"
    );
    // The certificate itself, no proxy.
    let own = grid.env(None, "alice", "certs");
    let (code, _, err) = braid_with(
        &["put", got.to_str().unwrap(), &format!("{base}/up.bin")],
        &own,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(home.join("up.bin")).unwrap() == content,
        "upload differs"
    );
    let into = top.path().join("trees");
    let (code, _, err) = braid_with(
        &["get", "-r", &format!("{base}/tree"), into.to_str().unwrap()],
        &proxy,
    );
    assert_eq!(code, 0, "{err}");
    for name in ["a/one", "a/b/two", "three"] {
        assert!(
            std::fs::read(into.join("tree").join(name)).unwrap()
                == std::fs::read(home.join("tree").join(name)).unwrap(),
            "{name} differs"
        );
    }
}

#[test]
fn a_gsi_login_refused_says_why_and_what_to_do() {
    let top = tempdir();
    let grid = Grid::new(top.path());
    let home = top.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(home.join("f"), b"data").unwrap();
    let server = grid.server(&home);
    let url = format!("gsiftp://127.0.0.1:{}{}/f", server.port, home.display());
    let dest = top.path().join("f");
    let get = |env: &[(String, String)]| braid_with(&["get", &url, dest.to_str().unwrap()], env);
    // Trusted, but not in the grid-mapfile: the login is refused with the server's reason.
    let (code, _, err) = get(&grid.env(None, "bob", "certs"));
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("Could not map"), "{err}");
    // A certificate from a CA the server does not trust: the handshake is refused.
    let (code, _, err) = get(&grid.env(None, "eve", "certs"));
    assert_eq!(code, 10, "{err}");
    assert!(err.contains("refused the GSI handshake"), "{err}");
    // The server's CA not trusted here: the fix names X509_CERT_DIR.
    std::fs::create_dir(top.path().join("other-cas")).unwrap();
    std::fs::copy(
        grid.dir.join("eve.pem"),
        top.path().join("other-cas/0a0b0c0d.0"),
    )
    .unwrap();
    let elsewhere = top.path().join("other-cas").display().to_string();
    let mut env = grid.env(None, "alice", "certs");
    env[3].1 = elsewhere;
    let (code, _, err) = get(&env);
    assert_eq!(code, 10, "{err}");
    assert!(
        err.contains("UnknownIssuer") && err.contains("X509_CERT_DIR"),
        "{err}"
    );
    // A STOR or MLSD the server refuses fails with its reason at once: the data
    // connection's GSI handshake, which the server never answers then, is cut short (it used
    // to wait out the two-minute reply timeout, past this test's limit).
    let env = grid.env(Some("proxy.pem"), "alice", "certs");
    for (args, refused) in [
        (
            vec![
                "put".to_string(),
                grid.path("grid-mapfile"),
                format!("{}/missing/dir/f", url.trim_end_matches("/f")),
            ],
            "refused STOR",
        ),
        (
            vec![
                "ls".to_string(),
                format!("{}/missing/", url.trim_end_matches("/f")),
            ],
            "refused MLSD",
        ),
    ] {
        let home = tempdir();
        let mut cmd = crate::util::braid_command(home.path());
        cmd.args(&args).envs(env.iter().map(|(k, v)| (k, v)));
        let (ok, _, err) = run(&mut cmd, Duration::from_secs(60));
        assert!(!ok && err.contains(refused), "{args:?}: {err}");
    }
    // No credential anywhere: where braid looked, and how to make one.
    let mut env = grid.env(None, "nobody", "certs");
    env[1].1 = grid.path("missing.pem");
    let (code, _, err) = get(&env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("grid-proxy-init"), "{err}");
    assert!(!dest.exists(), "a file appeared");
}

/// `braid cp gsiftp://A/… gsiftp://B/…`: each server gets a proxy of alice's credential
/// (delegation) and they authenticate the data connections between them with it (DCAU A);
/// the file and a tree arrive whole, both ends' ADLER32 compared; `--update` moves only what
/// changed; a copy between a GSI server and a braid server is refused with the way round it.
#[test]
fn a_copy_between_two_gsi_globus_servers_goes_straight_from_one_to_the_other() {
    let top = tempdir();
    let grid = Grid::new(top.path());
    let (ha, hb) = (top.path().join("a"), top.path().join("b"));
    std::fs::create_dir_all(ha.join("tree/d")).unwrap();
    std::fs::create_dir_all(&hb).unwrap();
    let content = random_bytes(9_000_011, 71);
    std::fs::write(ha.join("big.bin"), &content).unwrap();
    for i in 0..20u64 {
        let name = format!("tree/{}f{i}", if i % 2 == 0 { "d/" } else { "" });
        std::fs::write(ha.join(name), random_bytes(1000 * i as usize + 1, i)).unwrap();
    }
    let (a, b) = (grid.server(&ha), grid.server(&hb));
    let on = |port: u16, home: &Path, path: &str| {
        format!("gsiftp://127.0.0.1:{port}{}/{path}", home.display())
    };
    let proxy = grid.env(Some("proxy.pem"), "alice", "certs");
    let (code, out, err) = braid_with(
        &[
            "cp",
            "--json",
            &on(a.port, &ha, "big.bin"),
            &on(b.port, &hb, "copy.bin"),
        ],
        &proxy,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(hb.join("copy.bin")).unwrap() == content,
        "the copy differs"
    );
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["route"], "third-party", "{s}");
    assert_eq!(s["checksum"]["algorithm"], "ADLER32", "{s}");

    let (code, _, err) = braid_with(
        &["cp", "-r", &on(a.port, &ha, "tree"), &on(b.port, &hb, "")],
        &proxy,
    );
    assert_eq!(code, 0, "{err}");
    let same = |name: &str| {
        std::fs::read(ha.join("tree").join(name)).unwrap()
            == std::fs::read(hb.join("tree").join(name)).unwrap()
    };
    for i in 0..20u64 {
        let name = format!("{}f{i}", if i % 2 == 0 { "d/" } else { "" });
        assert!(same(&name), "{name} differs");
    }
    std::fs::write(ha.join("tree/f1"), b"changed, and longer than before").unwrap();
    let (code, out, err) = braid_with(
        &[
            "cp",
            "-r",
            "--update",
            "--json",
            &on(a.port, &ha, "tree"),
            &on(b.port, &hb, ""),
        ],
        &proxy,
    );
    assert_eq!(code, 0, "{err}");
    assert!(same("f1"), "the changed file was not copied");
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["files"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(s["skipped"].as_array().unwrap().len(), 19, "{s}");

    let (code, _, err) = braid_with(
        &["cp", &on(a.port, &ha, "big.bin"), "ftp://127.0.0.1:9/x"],
        &proxy,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not from one kind to the other"), "{err}");
}

/// globus-url-copy with `args` and `env`, from `src` to `dst`: whether it succeeded, and what
/// it said.
fn globus_url_copy(
    args: &[&str],
    src: &str,
    dst: &str,
    env: &[(String, String)],
) -> (bool, String) {
    let mut cmd = Command::new("globus-url-copy");
    cmd.args(args)
        .args([src, dst])
        .envs(env.iter().map(|(k, v)| (k, v)));
    let (ok, out, err) = run(&mut cmd, Duration::from_secs(60));
    (ok, format!("{out}{err}"))
}

/// `braid serve --gsi-cert`: globus-url-copy and braid log in with alice's proxy (mapped by
/// the grid-mapfile), and every data connection runs GSI's handshake with the proxy she
/// delegated (DCAU A, the default): a download in stream mode, an upload and a download in
/// MODE E on four connections, a tree down and up on connections kept from file to file,
/// braid's own get with both ends' ADLER32. bob, trusted but not mapped, is refused with the
/// reason; eve, from a CA the server does not trust, fails the handshake.
#[test]
fn braid_serve_takes_gsi_logins_and_authenticates_every_data_connection() {
    require("globus-url-copy");
    let top = tempdir();
    let grid = Grid::new(top.path());
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let content = random_bytes(6_000_007, 81);
    std::fs::write(root.join("f.bin"), &content).unwrap();
    let server = grid.braid_server("127.0.0.1:0", &root, &[]);
    let url = |path: &str| format!("gsiftp://{}/{path}", server.addr);
    let proxy = grid.env(Some("proxy.pem"), "alice", "certs");
    let here = |name: &str| format!("file://{}", top.path().join(name).display());
    let (ok, said) = globus_url_copy(&[], &url("f.bin"), &here("s.bin"), &proxy);
    assert!(ok, "{said}");
    assert!(
        std::fs::read(top.path().join("s.bin")).unwrap() == content,
        "stream download differs"
    );
    let (ok, said) = globus_url_copy(&["-p", "4"], &here("s.bin"), &url("up.bin"), &proxy);
    assert!(ok, "{said}");
    assert!(
        std::fs::read(root.join("up.bin")).unwrap() == content,
        "MODE E upload differs"
    );
    let (ok, said) = globus_url_copy(&["-p", "4"], &url("up.bin"), &here("e.bin"), &proxy);
    assert!(ok, "{said}");
    assert!(
        std::fs::read(top.path().join("e.bin")).unwrap() == content,
        "MODE E download differs"
    );
    // A tree on four connections kept from file to file (125): they were authenticated when
    // they opened, and carry the next files as they are.
    std::fs::create_dir_all(root.join("tree/d")).unwrap();
    for i in 1..=4usize {
        std::fs::write(
            root.join(format!("tree/f{i}")),
            random_bytes(i * 100_000, i as u64),
        )
        .unwrap();
        std::fs::write(
            root.join(format!("tree/d/g{i}")),
            random_bytes(i * 1_000, i as u64),
        )
        .unwrap();
    }
    let (ok, said) = globus_url_copy(
        &["-r", "-cd", "-p", "4"],
        &url("tree/"),
        &format!("{}/", here("tree")),
        &proxy,
    );
    assert!(ok, "{said}");
    let (ok, said) = globus_url_copy(
        &["-r", "-cd", "-p", "4"],
        &format!("{}/", here("tree")),
        &url("back/"),
        &proxy,
    );
    assert!(ok, "{said}");
    for name in ["f1", "f4", "d/g1", "d/g4"] {
        let original = std::fs::read(root.join("tree").join(name)).unwrap();
        assert!(
            std::fs::read(top.path().join("tree").join(name)).unwrap() == original,
            "{name} down"
        );
        assert!(
            std::fs::read(root.join("back").join(name)).unwrap() == original,
            "{name} up"
        );
    }
    let log = server.log();
    assert!(
        log.contains("reused=true"),
        "no data connection was kept: {log}"
    );
    assert!(
        log.contains("logged in by GSI") && log.contains("subject=\"/O=braid test/CN=alice\""),
        "{log}"
    );
    assert!(log.contains("mode=\"E\" data_connections=4"), "{log}");
    let got = top.path().join("b.bin");
    let (code, out, err) = braid_with(
        &[
            "get",
            "--json",
            "-n",
            "4",
            &url("f.bin"),
            got.to_str().unwrap(),
        ],
        &proxy,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&got).unwrap() == content,
        "braid's download differs"
    );
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(
        s["checksum"].as_str().unwrap().starts_with("ADLER32 "),
        "{s}"
    );
    // bob's certificate is from the same CA, but the grid-mapfile does not name him.
    let (code, _, err) = braid_with(
        &[
            "get",
            &url("f.bin"),
            top.path().join("bob.bin").to_str().unwrap(),
        ],
        &grid.env(None, "bob", "certs"),
    );
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("not in the grid-mapfile"), "{err}");
    assert!(!top.path().join("bob.bin").exists());
    // eve's comes from a CA the server does not trust: the handshake itself fails.
    let (code, _, err) = braid_with(
        &[
            "get",
            &url("f.bin"),
            top.path().join("eve.bin").to_str().unwrap(),
        ],
        &grid.env(None, "eve", "certs"),
    );
    assert_ne!(code, 0, "{err}");
    assert!(
        server.log().contains("GSI login refused"),
        "{}",
        server.log()
    );
    // An ADAT line longer than a command may be (a VOMS proxy's chain) is read whole: this one
    // is no TLS record, and the handshake says so, where a line limit would have cut it.
    let mut raw = crate::util::Raw::connect(server.addr);
    raw.send("AUTH GSSAPI");
    assert!(raw.reply().starts_with("334 "));
    raw.send(&format!("ADAT {}", "QUFB".repeat(5_000)));
    let r = raw.reply();
    assert!(r.starts_with("535 ") && r.contains("GSI"), "{r}");
}

/// globus-url-copy drives a copy between two braid servers at different addresses: each got a
/// proxy of alice's credential, A connects to B (a PORT to a host other than the client's),
/// and the data connections between them authenticate as alice (DCAU A), in stream mode and
/// on four MODE E connections. Without DCAU (`-nodcau`) the same PORT is the FTP bounce and
/// stays refused, as it is on a server told `--no-third-party`.
#[test]
fn globus_url_copy_drives_a_copy_between_two_braid_servers_under_dcau() {
    require("globus-url-copy");
    let top = tempdir();
    let grid = Grid::new(top.path());
    let (ra, rb) = (top.path().join("a"), top.path().join("b"));
    std::fs::create_dir(&ra).unwrap();
    std::fs::create_dir(&rb).unwrap();
    let content = random_bytes(7_000_003, 82);
    std::fs::write(ra.join("f.bin"), &content).unwrap();
    let a = grid.braid_server("127.0.0.2:0", &ra, &[]);
    let b = grid.braid_server("127.0.0.3:0", &rb, &[]);
    let proxy = grid.env(Some("proxy.pem"), "alice", "certs");
    for (args, name) in [(vec![], "s.bin"), (vec!["-p", "4"], "e.bin")] {
        let (ok, said) = globus_url_copy(
            &args,
            &format!("gsiftp://{}/f.bin", a.addr),
            &format!("gsiftp://{}/{name}", b.addr),
            &proxy,
        );
        assert!(ok, "{args:?}: {said}");
        assert!(
            std::fs::read(rb.join(name)).unwrap() == content,
            "{name} differs"
        );
    }
    assert!(
        a.log().contains("mode=\"E\" data_connections=4"),
        "{}",
        a.log()
    );
    let (ok, said) = globus_url_copy(
        &["-nodcau"],
        &format!("gsiftp://{}/f.bin", a.addr),
        &format!("gsiftp://{}/n.bin", b.addr),
        &proxy,
    );
    assert!(!ok, "copied without data channel authentication: {said}");
    assert!(said.contains("504 Refused"), "{said}");
    // An admin who said --no-third-party: A sends to no one but the client, DCAU or not.
    let closed = grid.braid_server("127.0.0.2:0", &ra, &["--no-third-party"]);
    let (ok, said) = globus_url_copy(
        &[],
        &format!("gsiftp://{}/f.bin", closed.addr),
        &format!("gsiftp://{}/c.bin", b.addr),
        &proxy,
    );
    assert!(
        !ok,
        "a server told --no-third-party sent to another: {said}"
    );
    assert!(said.contains("504 Refused"), "{said}");
}

/// `braid cp` between a braid server and a Globus one, both under GSI, both ways: each side
/// gets a proxy of alice's, the data goes straight between them (DCAU A), and both ends'
/// ADLER32 are compared.
#[test]
fn braid_cp_between_a_braid_server_and_a_globus_server_goes_straight_both_ways() {
    let top = tempdir();
    let grid = Grid::new(top.path());
    let (rb, hg) = (top.path().join("braid"), top.path().join("globus"));
    std::fs::create_dir(&rb).unwrap();
    std::fs::create_dir(&hg).unwrap();
    let content = random_bytes(9_000_001, 83);
    std::fs::write(rb.join("f.bin"), &content).unwrap();
    let ours = grid.braid_server("127.0.0.1:0", &rb, &[]);
    let globus = grid.server(&hg);
    let proxy = grid.env(Some("proxy.pem"), "alice", "certs");
    let at_globus =
        |name: &str| format!("gsiftp://127.0.0.1:{}{}/{name}", globus.port, hg.display());
    let at_braid = |name: &str| format!("gsiftp://{}/{name}", ours.addr);
    for (from, to, arrived) in [
        (at_braid("f.bin"), at_globus("g.bin"), hg.join("g.bin")),
        (
            at_globus("g.bin"),
            at_braid("back.bin"),
            rb.join("back.bin"),
        ),
    ] {
        let (code, out, err) = braid_with(&["cp", "--json", &from, &to], &proxy);
        assert_eq!(code, 0, "{from} -> {to}: {err}");
        assert!(
            std::fs::read(&arrived).unwrap() == content,
            "{} differs",
            arrived.display()
        );
        let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(s["route"], "third-party", "{s}");
        assert_eq!(s["checksum"]["algorithm"], "ADLER32", "{s}");
    }
}

/// A stranger who reaches the receiving braid server's data port during a copy between two
/// braid servers (which under DCAU A takes data connections from any address) shows no
/// credential of alice's: it is refused and warned about, reads nothing, and the copy
/// completes. A's `--uplink` stretches the copy to seconds, for the stranger to arrive in.
#[test]
fn a_stranger_at_a_gsi_servers_data_port_is_refused_and_the_copy_completes() {
    let top = tempdir();
    let grid = Grid::new(top.path());
    let (ra, rb) = (top.path().join("a"), top.path().join("b"));
    std::fs::create_dir(&ra).unwrap();
    std::fs::create_dir(&rb).unwrap();
    let content = random_bytes(12 << 20, 84);
    std::fs::write(ra.join("f.bin"), &content).unwrap();
    let a = grid.braid_server("127.0.0.2:0", &ra, &["--uplink", "4MB"]);
    let b = grid.braid_server("127.0.0.3:0", &rb, &[]);
    let home = tempdir();
    let mut cmd = crate::util::braid_command(home.path());
    cmd.args([
        "cp",
        "-v",
        "-n",
        "2",
        &format!("gsiftp://{}/f.bin", a.addr),
        &format!("gsiftp://{}/f.bin", b.addr),
    ])
    .envs(grid.env(Some("proxy.pem"), "alice", "certs"))
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stderr = crate::util::Stderr::follow(&mut child);
    let limit = Duration::from_secs(60);
    assert!(stderr.wait_for("> RETR", limit), "{}", stderr.so_far());
    assert!(stderr.wait_for("< 150", limit), "{}", stderr.so_far());
    let port = crate::util::passive_port(&stderr.so_far());
    let got = crate::util::stranger_reads(std::net::SocketAddr::new(b.addr.ip(), port));
    let (code, err) = stderr.finish(child, limit);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        std::fs::read(rb.join("f.bin")).unwrap() == content,
        "the copy differs"
    );
    assert!(
        got.is_empty() || (got[0] == 21 && got.len() < 64),
        "the stranger read {} bytes",
        got.len()
    );
    assert!(
        b.log().contains("refused a data connection from 127.0.0.9"),
        "{}",
        b.log()
    );
}

/// A striped globus-gridftp-server under GSI (a front end over two data nodes): braid's put
/// stripes over both nodes (SPAS), its get takes four stripes the nodes send (SPOR), and
/// every one of those data connections runs GSI's handshake at its turn: while STOR's answer
/// is read, and before RETR's comes.
#[test]
fn braid_stripes_over_the_nodes_of_a_gsi_globus_server() {
    let top = tempdir();
    let grid = Grid::new(top.path());
    let home = top.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let servers = grid.striped_server(&home);
    let content = random_bytes(24_000_013, 91);
    let local = top.path().join("up.bin");
    std::fs::write(&local, &content).unwrap();
    let url = format!(
        "gsiftp://127.0.0.1:{}{}/striped.bin",
        servers[0].port,
        home.display()
    );
    let proxy = grid.env(Some("proxy.pem"), "alice", "certs");
    let (code, out, err) = braid_with(&["put", "--json", local.to_str().unwrap(), &url], &proxy);
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(home.join("striped.bin")).unwrap() == content,
        "the striped upload differs"
    );
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["data_nodes"], 2, "{s}");
    let got = top.path().join("got.bin");
    let (code, out, err) = braid_with(
        &["get", "--json", "-n", "4", &url, got.to_str().unwrap()],
        &proxy,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&got).unwrap() == content,
        "the striped download differs"
    );
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        s["per_connection_bytes"].as_array().unwrap().len(),
        4,
        "{s}"
    );
    assert!(s.get("data_nodes").is_some(), "not striped: {s}");
}
