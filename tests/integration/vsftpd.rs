//! `braid get`, `put` and `ls` against vsftpd, a server nobody here wrote.
use crate::util::{braid, random_bytes, require, signal_group, tempdir, wait_timeout};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A vsftpd serving `root` anonymously (with uploads into `root/pub`), in its own process group
/// so that its per-connection children die with it.
struct Vsftpd {
    child: Child,
    port: u16,
}

impl Vsftpd {
    fn start(program: &std::path::Path, top: &std::path::Path) -> Vsftpd {
        let root = top.join("root");
        std::fs::create_dir_all(root.join("pub")).unwrap();
        std::fs::create_dir_all(top.join("empty")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(root.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let conf = top.join("vsftpd.conf");
            std::fs::write(
                &conf,
                format!(
                    "listen=YES\nlisten_ipv6=NO\nlisten_address=127.0.0.1\nlisten_port={port}\nbackground=NO\n\
                     anonymous_enable=YES\nlocal_enable=NO\nanon_root={}\nno_anon_password=YES\nwrite_enable=YES\n\
                     anon_upload_enable=YES\nanon_mkdir_write_enable=YES\nanon_other_write_enable=YES\nanon_umask=022\n\
                     seccomp_sandbox=NO\nrun_as_launching_user=YES\npasv_enable=YES\npasv_address=127.0.0.1\n\
                     secure_chroot_dir={}\nxferlog_enable=NO\n",
                    root.display(),
                    top.join("empty").display()
                ),
            )
            .unwrap();
            let mut child = Command::new(program)
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("start vsftpd");
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while std::time::Instant::now() < deadline {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Vsftpd { child, port };
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break; // port taken meanwhile: try another
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("vsftpd did not start");
    }
}

impl Drop for Vsftpd {
    fn drop(&mut self) {
        signal_group(self.child.id(), rustix::process::Signal::KILL);
        let _ = wait_timeout(&mut self.child, Duration::from_secs(5));
    }
}

#[test]
fn braid_client_against_vsftpd() {
    // vsftpd lives in sbin, which is not always on PATH.
    let program = ["/usr/sbin", "/sbin", "/usr/bin"]
        .iter()
        .map(|d| std::path::Path::new(d).join("vsftpd"))
        .find(|p| p.exists());
    let Some(program) = program else {
        require("vsftpd");
        unreachable!("require panics when the program is missing");
    };
    let top = tempdir();
    let vs = Vsftpd::start(&program, top.path());
    let root = top.path().join("root");
    let content = random_bytes(3 << 20, 61);
    std::fs::write(root.join("pub/src.bin"), &content).unwrap();
    let base = format!("ftp://127.0.0.1:{}", vs.port);
    let dest = top.path().join("got.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &format!("{base}/pub/src.bin"),
            dest.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&dest).unwrap() == content,
        "file content differs from what was sent"
    );
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["mode"], "stream");
    assert_eq!(summary["streams"], 1);
    // Resume against vsftpd's REST.
    std::fs::write(top.path().join("res.bin.part"), &content[..1_000_000]).unwrap();
    let res = top.path().join("res.bin");
    let (code, out, err) = braid(
        &[
            "get",
            &format!("{base}/pub/src.bin"),
            res.to_str().unwrap(),
            "--resume",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&res).unwrap() == content,
        "file content differs from what was sent"
    );
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["resumed_from"], 1_000_000);
    let (code, _, err) = braid(
        &["put", dest.to_str().unwrap(), &format!("{base}/pub/up.bin")],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(root.join("pub/up.bin")).unwrap() == content,
        "file content differs from what was sent"
    );
    // vsftpd has no MLSD: braid falls back to LIST.
    let (code, out, err) = braid(&["ls", &format!("{base}/pub/")], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("src.bin") && out.contains("up.bin"), "{out}");
    let (code, _, err) = braid(
        &[
            "get",
            &format!("{base}/pub/missing"),
            top.path().join("m").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 5, "{err}");
}
