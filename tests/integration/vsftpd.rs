//! `braid get`, `put` and `ls` against vsftpd, a server nobody here wrote.
use crate::util::{Daemon, braid, random_bytes, sbin, tempdir};
use std::process::Command;

/// A vsftpd serving `top/root` anonymously, with uploads into `root/pub`.
fn start_vsftpd(top: &std::path::Path) -> Daemon {
    let program = sbin("vsftpd");
    let root = top.join("root");
    std::fs::create_dir_all(root.join("pub")).unwrap();
    std::fs::create_dir_all(top.join("empty")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(root.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    Daemon::start("vsftpd", |port| {
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
        let mut c = Command::new(&program);
        c.arg(&conf);
        c
    })
}

#[test]
fn braid_client_against_vsftpd() {
    let top = tempdir();
    let vs = start_vsftpd(top.path());
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
