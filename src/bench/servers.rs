//! The servers a benchmark measures against, in the lab's `right` host or on loopback, and
//! where clients reach them.

use super::grid::{Server, Tool};
use crate::lab::Running;
use serde::Serialize;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The lab's server host.
pub const SERVER: &str = "198.18.0.2";

/// The servers' ports.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ports {
    pub ftp: u16,
    pub vsftpd: u16,
    pub gridftp: u16,
    pub iperf: u16,
    pub kermit: u16,
    pub ssh: u16,
}

impl Ports {
    /// Where `server` listens.
    pub fn of(self, server: Server) -> u16 {
        match server {
            Server::Braid => self.ftp,
            Server::Vsftpd => self.vsftpd,
            Server::Gridftp => self.gridftp,
            Server::Iperf3 => self.iperf,
            Server::Kermit => self.kermit,
            Server::Sshd => self.ssh,
        }
    }

    /// In the lab's own host nothing else listens: the usual ports (Kermit's is 1649).
    pub const LAB: Ports = Ports {
        ftp: 2121,
        vsftpd: 2122,
        gridftp: 2811,
        iperf: 5201,
        kermit: 1649,
        ssh: 2222,
    };

    /// Ports free on loopback now, chosen at random below the kernel's ephemeral range:
    /// a port bound to 0 and closed again comes from that range, where any test's or
    /// program's outgoing connection may take it before the server binds it.
    pub fn free() -> std::io::Result<Ports> {
        use rand::Rng;
        let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let range = 10_000..first_ephemeral.max(10_100);
        let mut rng = rand::rng();
        let mut picked: Vec<u16> = Vec::new();
        for _ in 0..1000 {
            if picked.len() == 6 {
                break;
            }
            let port = rng.random_range(range.clone());
            if !picked.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                picked.push(port);
            }
        }
        let [ftp, vsftpd, gridftp, iperf, kermit, ssh] = picked[..] else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("no six free loopback ports in {range:?}"),
            ));
        };
        Ok(Ports {
            ftp,
            vsftpd,
            gridftp,
            iperf,
            kermit,
            ssh,
        })
    }
}

/// A certificate braid serve offers TLS with (`braid bench --tls`), and its key.
pub struct Tls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl Tls {
    /// What `braid serve` needs to offer TLS with this certificate.
    pub fn serve_args(&self) -> Vec<String> {
        let (cert, key) = (self.cert.display(), self.key.display());
        vec![
            "--tls-cert".into(),
            cert.to_string(),
            "--tls-key".into(),
            key.to_string(),
        ]
    }

    /// A self-signed certificate for `addr` (an IP subjectAltName), written into `dir`.
    pub fn make(dir: &std::path::Path, addr: &str) -> anyhow::Result<Tls> {
        Tls::make_for(dir, &[addr])
    }

    /// One self-signed certificate for several addresses (servers that share it).
    pub fn make_for(dir: &std::path::Path, addrs: &[&str]) -> anyhow::Result<Tls> {
        let names = addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let made = rcgen::generate_simple_self_signed(names)?;
        let tls = Tls {
            cert: dir.join("bench-cert.pem"),
            key: dir.join("bench-key.pem"),
        };
        std::fs::write(&tls.cert, made.cert.pem())?;
        std::fs::write(&tls.key, made.signing_key.serialize_pem())?;
        Ok(tls)
    }
}

/// Servers running in `right` for a scenario (or in hosts of a lab of more); stopped when
/// dropped.
#[derive(Default)]
pub struct Servers {
    children: Vec<Child>,
}

impl Servers {
    /// The servers' process ids (each leads its own group).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Starts a server, silent and leading its own process group, and waits until it listens
    /// on `port`.
    pub fn start(&mut self, place: &Place, cmd: Command, port: u16) -> anyhow::Result<()> {
        self.start_at(cmd, Listening::servers(place, port))
    }

    /// Starts a server in host `host` of a lab of more hosts, listening on `port` there.
    pub fn start_in(
        &mut self,
        lab: &Running,
        host: &str,
        cmd: Command,
        port: u16,
    ) -> anyhow::Result<()> {
        let at = Listening {
            ss: Box::new(move || lab.command(host, "ss")),
            host,
            port,
        };
        self.start_at(cmd, at)
    }

    fn start_at(&mut self, mut cmd: Command, at: Listening) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let shown = format!("{cmd:?}");
        self.children.push(cmd.spawn()?);
        let child = self.children.last_mut();
        wait_listening_for(&at, child).map_err(|e| e.context(shown))
    }
}

/// Where a server is to listen: `ss` run on its host, the host's name or address, the port.
struct Listening<'a> {
    ss: Box<dyn Fn() -> Command + 'a>,
    host: &'a str,
    port: u16,
}

impl<'a> Listening<'a> {
    /// On the servers' host of `place`.
    fn servers(place: &'a Place<'a>, port: u16) -> Listening<'a> {
        Listening {
            ss: Box::new(move || place.server_command("ss")),
            host: place.server_addr(),
            port,
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        // Each server leads its own process group: its children (a forking server, the
        // Kermit server's restart loop) go with it.
        for c in &mut self.children {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (at most 10 s) until something on the servers' host listens on `port`.
pub fn wait_listening(place: &Place, port: u16) -> anyhow::Result<()> {
    wait_listening_for(&Listening::servers(place, port), None)
}

/// The same, for a server this side started: one that exits first (not installed in the
/// namespace's `ip netns exec`, say) is reported at once, with its status.
fn wait_listening_for(
    at: &Listening,
    mut server: Option<&mut std::process::Child>,
) -> anyhow::Result<()> {
    let port = at.port;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(status) = server.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            anyhow::bail!(
                "the server exited ({status}) before listening on {}:{port}: is it installed? \
                 (the test command installs what the benchmarks use)",
                at.host
            );
        }
        let out = (at.ss)()
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()?;
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!(
        "nothing listens on {}:{port} after 10 s: the server did not start",
        at.host
    )
}

/// The one vsftpd configuration braid's bench, tests and lab tests run it with: anonymous, on
/// `addr:port`, serving `root`, uploads and directories too when `writable`, with `extra`
/// lines last (rate limits, TLS). Run by its launching user, vsftpd does not chroot: paths in
/// commands start at `root`; `empty` is the directory it insists on for a chroot it does not
/// make. No client or per-address limit, no transfer log.
pub fn vsftpd_conf(
    addr: &str,
    port: u16,
    root: &std::path::Path,
    empty: &std::path::Path,
    writable: bool,
    extra: &str,
) -> String {
    let write = if writable {
        "write_enable=YES\nanon_upload_enable=YES\nanon_mkdir_write_enable=YES\n\
         anon_other_write_enable=YES\nanon_umask=022\n"
    } else {
        ""
    };
    format!(
        "listen=YES\nlisten_ipv6=NO\nlisten_address={addr}\nlisten_port={port}\nbackground=NO\n\
         anonymous_enable=YES\nlocal_enable=NO\nanon_root={}\nno_anon_password=YES\n\
         seccomp_sandbox=NO\nrun_as_launching_user=YES\n{write}max_clients=0\nmax_per_ip=0\n\
         pasv_enable=YES\npasv_address={addr}\nsecure_chroot_dir={}\nxferlog_enable=NO\n{extra}",
        root.display(),
        empty.display()
    )
}

/// A private OpenSSH server's keys and configuration in `work`/ssh: its own host key, one
/// client key authorised (the user running the bench logs in as themselves), listening on
/// `addr:port`, SFTP for scp. sshd insists on its privilege separation directory, /run/sshd,
/// which is made if missing. Returns the configuration's path.
pub fn sshd_setup(
    work: &std::path::Path,
    addr: &str,
    port: u16,
) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    let dir = work.join("ssh");
    std::fs::create_dir_all(&dir)?;
    std::fs::create_dir_all("/run/sshd").context("cannot make /run/sshd, which sshd needs")?;
    for key in ["host-key", "id"] {
        if dir.join(key).exists() {
            continue;
        }
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(key))
            .output()
            .context("cannot run ssh-keygen")?;
        anyhow::ensure!(out.status.success(), "ssh-keygen failed: {out:?}");
    }
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys"))?;
    let sftp = ["/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .unwrap_or("internal-sftp");
    let conf = dir.join("sshd_config");
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListenAddress {addr}\nHostKey {}\nAuthorizedKeysFile {}\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
             StrictModes no\nPidFile {}\nPermitRootLogin prohibit-password\n\
             Subsystem sftp {sftp}\n",
            dir.join("host-key").display(),
            dir.join("authorized_keys").display(),
            dir.join("sshd.pid").display()
        ),
    )?;
    Ok(conf)
}

/// ssh's options to reach the bench's sshd (`sshd_setup`) with its key, as a command line
/// without the program and the port option (scp spells it -P, ssh -p).
pub fn ssh_options(work: &std::path::Path) -> Vec<String> {
    let id = work.join("ssh").join("id").display().to_string();
    [
        "-F",
        "/dev/null",
        "-i",
        &id,
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
    ]
    .map(str::to_string)
    .to_vec()
}

/// A program by name: on PATH, or in /usr/sbin and /sbin (servers live there and root's
/// PATH under sudo may lack them).
pub fn find_program(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The servers the `tools` need, in the lab's `right` or on loopback: braid serve always
/// (with `serve_args`: TLS's certificate, say), iperf3 -s, vsftpd (anonymous, uploads allowed, `root` as its
/// directory), a Kermit server and globus-gridftp-server.
pub fn start_servers(
    place: &Place,
    ports: Ports,
    braid: &std::path::Path,
    work: &std::path::Path,
    root: &std::path::Path,
    tools: &[Tool],
    serve_args: &[String],
) -> anyhow::Result<Servers> {
    let mut servers = Servers {
        children: Vec::new(),
    };
    let mut start = |cmd: Command, port: u16| servers.start(place, cmd, port);
    let needed = |server: Server| tools.iter().any(|t| t.server() == server);
    let addr = place.server_addr().to_string();
    let mut serve = place.server_command(&braid.to_string_lossy());
    serve
        .args(["serve", "--anonymous-write", "--root"])
        .arg(root)
        .args(["--listen", &format!("{addr}:{}", ports.ftp)])
        .args(serve_args);
    start(serve, ports.ftp)?;
    let program = |name: &str| {
        find_program(name).map_or_else(|| name.to_string(), |p| p.display().to_string())
    };
    if needed(Server::Iperf3) {
        let mut c = place.server_command(&program("iperf3"));
        // JSON every half second: an upload's rates are read from the server's report
        // (`--get-server-output`), since the sender's count what entered its socket.
        c.args([
            "-s",
            "-J",
            "-i",
            "0.5",
            "-B",
            &addr,
            "-p",
            &ports.iperf.to_string(),
        ]);
        start(c, ports.iperf)?;
    }
    if needed(Server::Vsftpd) {
        // Run as its launching user, vsftpd does not chroot: anon_root is where paths start.
        let empty = work.join("vsftpd-empty");
        std::fs::create_dir_all(&empty)?;
        let conf = work.join("vsftpd.conf");
        std::fs::write(
            &conf,
            vsftpd_conf(&addr, ports.vsftpd, root, &empty, true, ""),
        )?;
        let mut c = place.server_command(&program("vsftpd"));
        c.arg(&conf);
        start(c, ports.vsftpd)?;
    }
    if needed(Server::Kermit) {
        // A Kermit server takes one connection and ends with the client's FINISH: start it
        // again after each, accepting packets up to 9024 bytes and 32 window slots (the
        // client's settings then decide).
        let mut c = place.server_command("sh");
        c.current_dir(root).args([
            "-c",
            &format!(
                "while :; do {} -Y -q -C 'set host * {} /raw-socket, set file type binary, \
                 set window 32, set receive packet-length 9024, server' </dev/null; done",
                program("kermit"),
                ports.kermit
            ),
        ]);
        start(c, ports.kermit)?;
    }
    if needed(Server::Sshd) {
        let conf = sshd_setup(work, &addr, ports.ssh)?;
        let mut c = place.server_command(&program("sshd"));
        c.args(["-D", "-e", "-f"]).arg(conf);
        start(c, ports.ssh)?;
    }
    if needed(Server::Gridftp) {
        // Anonymous users act as the user running the benchmark.
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let mut c = place.server_command(&program("globus-gridftp-server"));
        c.args(["-aa", "-anonymous-user", &user, "-auth-level", "0"])
            .args(["-p", &ports.gridftp.to_string()])
            .args(["-control-interface", &addr, "-data-interface", &addr])
            .arg("-home-dir")
            .arg(root)
            .args(["-allow-root", "-log-level", "ERROR"]);
        start(c, ports.gridftp)?;
    }
    Ok(servers)
}

/// The servers on loopback, on free ports. Another program may still bind a port between
/// the choice and the server's start: then all are stopped and started again on others.
pub fn start_on_loopback(
    braid: &std::path::Path,
    work: &std::path::Path,
    root: &std::path::Path,
    tools: &[Tool],
    serve_args: &[String],
) -> anyhow::Result<(Ports, Servers)> {
    let mut tries = 0;
    loop {
        let ports = Ports::free()?;
        let started = start_servers(
            &Place::Loopback,
            ports,
            braid,
            work,
            root,
            tools,
            serve_args,
        );
        match started {
            Ok(servers) => return Ok((ports, servers)),
            Err(e) if tries < 2 => {
                tracing::debug!("starting the servers on {ports:?}: {e:#}; trying other ports");
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Where the clients run and what they reach.
pub enum Place<'a> {
    /// In the lab's `left`, against the servers in `right`.
    Lab(&'a Running),
    /// Clients and servers on this machine, over loopback.
    Loopback,
    /// On this machine, against a server somewhere else.
    Remote(&'a Remote),
}

/// A server outside the lab (`--url`): `get` downloads `get_url`, `put` uploads to `put_url`.
pub struct Remote {
    pub host: String,
    pub get_url: String,
    pub put_url: String,
    /// The size of the file at `get_url`, when a listing gave it.
    pub get_size: Option<u64>,
}

impl Place<'_> {
    /// A client program.
    pub fn command(&self, program: &str) -> Command {
        match self {
            Place::Lab(lab) => lab.command("left", program),
            Place::Loopback | Place::Remote(_) => Command::new(program),
        }
    }

    /// A program on the servers' host.
    pub fn server_command(&self, program: &str) -> Command {
        match self {
            Place::Lab(lab) => lab.command("right", program),
            Place::Loopback | Place::Remote(_) => Command::new(program),
        }
    }

    /// Where clients reach the servers.
    pub fn server_addr(&self) -> &str {
        match self {
            Place::Lab(_) => SERVER,
            Place::Loopback => "127.0.0.1",
            Place::Remote(r) => &r.host,
        }
    }

    pub fn ping_target(&self) -> &str {
        self.server_addr()
    }
}
