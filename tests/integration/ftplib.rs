//! Python's ftplib as a client of `braid serve`, including ABOR mid-transfer.
use crate::util::{Server, random_bytes, require, run, tempdir};
use std::process::Command;
use std::time::Duration;

const SCRIPT: &str = r#"
import ftplib, io, sys
host, port, expected_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ftp = ftplib.FTP()
ftp.connect(host, port, timeout=20)
ftp.login()
assert ftp.sendcmd("TYPE I").startswith("200")
assert ftp.size("big.bin") == expected_len
assert ftp.sendcmd("MDTM big.bin").startswith("213 ")
facts = dict(ftp.mlsd())
assert facts["big.bin"]["type"] == "file" and int(facts["big.bin"]["size"]) == expected_len, facts
assert "big.bin" in ftp.nlst()
buf = io.BytesIO()
ftp.retrbinary("RETR big.bin", buf.write)
assert len(buf.getvalue()) == expected_len
# REST: the tail only.
tail = io.BytesIO()
ftp.retrbinary("RETR big.bin", tail.write, rest=expected_len - 1000)
assert tail.getvalue() == buf.getvalue()[-1000:]
ftp.storbinary("STOR copy.bin", io.BytesIO(buf.getvalue()))
assert ftp.size("copy.bin") == expected_len
ftp.mkd("d")
ftp.rename("copy.bin", "d/moved.bin")
ftp.delete("d/moved.bin")
ftp.rmd("d")
try:
    ftp.size("nope")
    raise SystemExit("SIZE of a missing file succeeded")
except ftplib.error_perm as e:
    assert str(e).startswith("550"), e
# ABOR in the middle of a download, as ftplib sends it (urgent data).
conn = ftp.transfercmd("RETR big.bin")
conn.recv(65536)
reply = ftp.abort()
conn.close()
# RFC 959: 426 closes the aborted transfer, then 226 answers ABOR. ftplib returns the first.
assert reply.startswith("426"), reply
reply = ftp.getresp()
assert reply.startswith("226"), reply
assert ftp.voidcmd("NOOP").startswith("200")
ftp.quit()
print("OK")
"#;

#[test]
fn python_ftplib_session() {
    require("python3");
    let top = tempdir();
    let len = 32 << 20;
    std::fs::write(top.path().join("big.bin"), random_bytes(len, 51)).unwrap();
    let server = Server::start(top.path(), &["--anonymous-write"]);
    let (ok, out, err) = run(
        Command::new("python3").args([
            "-c",
            SCRIPT,
            "127.0.0.1",
            &server.port().to_string(),
            &len.to_string(),
        ]),
        Duration::from_secs(60),
    );
    assert!(
        ok && out.trim() == "OK",
        "stdout: {out}\nstderr: {err}\nserver log:\n{}",
        server.log()
    );
    assert!(
        server.log().contains("outcome=\"aborted\""),
        "the ABOR did not abort: {}",
        server.log()
    );
}
