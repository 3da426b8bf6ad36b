//! braid's client against a hostile or broken server: what it announces bounds what the
//! client takes.
use crate::util::{Daemon, braid, require, tempdir};
use std::process::Command;

/// A server that answers SIZE 10 but never ends RETR, and whose listings never end.
const SERVER: &str = r#"
import socket, sys, threading
port = int(sys.argv[1])
ctl = socket.socket()
ctl.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ctl.bind(("127.0.0.1", port))
ctl.listen(8)
retr = b"x" * 65536
listing = b"".join(b"type=file;size=10;modify=20200101000000; f%07d\r\n" % i for i in range(1000))
def serve(c):
    f = c.makefile("rb")
    c.sendall(b"220 hostile test server\r\n")
    data = None
    while True:
        line = f.readline()
        if not line:
            return
        verb, _, arg = line.decode("utf-8", "replace").strip().partition(" ")
        verb = verb.upper()
        if verb == "USER":
            c.sendall(b"331 send a password\r\n")
        elif verb == "PASS":
            c.sendall(b"230 welcome\r\n")
        elif verb == "FEAT":
            c.sendall(b"211-Features:\r\n MLST type*;size*;modify*;\r\n SIZE\r\n EPSV\r\n211 End\r\n")
        elif verb == "SIZE":
            c.sendall(b"213 10\r\n")
        elif verb == "EPSV":
            data = socket.socket()
            data.bind(("127.0.0.1", 0))
            data.listen(1)
            c.sendall(b"229 Entering Extended Passive Mode (|||%d|)\r\n" % data.getsockname()[1])
        elif verb in ("RETR", "MLSD", "LIST", "NLST"):
            c.sendall(b"150 here it comes\r\n")
            d, _ = data.accept()
            chunk = retr if verb == "RETR" else listing
            try:
                if arg.endswith("grows.bin"):
                    d.sendall(b"y" * 1010)  # 10 announced, 1000 written since
                else:
                    for _ in range(200000):  # bounded: about 13 GB at most
                        d.sendall(chunk)
            except OSError:
                pass
            d.close()
            try:
                c.sendall(b"226 done\r\n")
            except OSError:
                return
        elif verb == "QUIT":
            c.sendall(b"221 bye\r\n")
            return
        else:
            c.sendall(b"200 ok\r\n")
while True:
    c, _ = ctl.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A download that goes past the size the server announced stops there with an integrity
/// error (exit 8), keeping no more than was announced, unless `--growing` says the file grows;
/// a listing that never ends stops at the client's bound with a protocol error (exit 9).
/// Before, the first wrote 57.7 GB in a minute and the second grew the client to 1.3 GB.
#[test]
fn a_server_that_sends_without_end_cannot_fill_the_clients_disk_or_memory() {
    require("python3");
    let top = tempdir();
    let server = Daemon::start("a hostile FTP server", |port| {
        let mut c = Command::new("python3");
        c.args(["-c", SERVER, &port.to_string()]);
        c
    });
    let base = format!("ftp://127.0.0.1:{}", server.port);
    let dest = top.path().join("f.bin");
    let (code, _, err) = braid(
        &["get", &format!("{base}/f.bin"), dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("more than the 10 bytes"), "{err}");
    assert!(!dest.exists(), "an overlong download took the final name");
    let kept: u64 = std::fs::read_dir(top.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(kept <= 10, "{kept} bytes kept");

    let (code, _, err) = braid(&["ls", &format!("{base}/")], &[]);
    assert_eq!(code, 9, "{err}");
    assert!(err.contains("MLSD") && err.contains("MiB"), "{err}");

    // A file that grows while it is fetched: an error, unless the user says it grows.
    let grows = format!("{base}/grows.bin");
    let dest = top.path().join("grows.bin");
    let (code, _, err) = braid(&["get", &grows, dest.to_str().unwrap()], &[]);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("--growing"), "{err}");
    let (code, _, err) = braid(&["get", "--growing", &grows, dest.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&dest).unwrap(), vec![b'y'; 1010]);
}

/// A server that says why it refuses a login and closes at once (vsftpd requiring TLS does)
/// while the client's pipelined commands are still on their way.
const REFUSES_AND_CLOSES: &str = r#"
import socket, sys
port = int(sys.argv[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(8)
for _ in range(1000):
    c, _ = l.accept()
    # A client gone already (the readiness probe that only connects) ends its own turn, not
    # the server.
    try:
        c.sendall(b"220 (vsFTPd 3.0.3)\r\n")
        if c.recv(4096):
            c.sendall(b"530 Non-anonymous sessions must use encryption.\r\n")
    except OSError:
        pass
    c.close()
"#;

/// The server's own reason (530, exit 4) is what the user sees, every time, not the broken
/// pipe of a command sent after the server closed (exit 7), which won the race 3 times in 5.
#[test]
fn a_login_refused_before_a_close_reports_the_refusal_not_the_broken_pipe() {
    require("python3");
    let server = Daemon::start("a server that refuses and closes", |port| {
        let mut c = Command::new("python3");
        c.args(["-c", REFUSES_AND_CLOSES, &port.to_string()]);
        c
    });
    let url = format!("ftp://bob:pw@127.0.0.1:{}/", server.port);
    for _ in 0..20 {
        let (code, _, err) = braid(&["ls", &url], &[]);
        assert_eq!(code, 4, "{err}");
        assert!(err.contains("530 Non-anonymous"), "{err}");
    }
}
