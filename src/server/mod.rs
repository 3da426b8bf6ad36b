//! `braid serve`: the tokio control plane (accept, limits, sessions, shutdown). Each transfer's
//! data moves on a blocking thread (see [`data`]), except a tree's small files, which the
//! control task moves itself when nothing can make it wait (see [`inline`]).

mod conn;
pub mod connect_back;
mod connections;
mod control;
mod data;
mod files;
pub mod gsi;
mod guard;
mod inline;
mod io;
mod login;
pub mod metrics;
mod pacing;
mod partials;
mod quota;
pub mod settings;
mod stdio;
mod stripes;
mod supervise;
pub mod tls;
mod tuning;
mod xferlog;

use crate::users::Users;
use braid_proto::session::Perm;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Everything a server needs to know, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Root for anonymous users.
    pub root: PathBuf,
    /// `None`: no anonymous login.
    pub anonymous: Option<Perm>,
    pub users: Users,
    pub login_timeout: Duration,
    /// How long a session may be silent, and a transfer go without a byte moving or a data
    /// connection hear nothing: as vsftpd's `data_connection_timeout`, minutes, not seconds. Near
    /// the end of an elastic upload, connections with nothing left to carry wait on one in TCP
    /// back-off behind a full queue (16 connections in `dsl-1m-bloat`'s 1 s queue waited
    /// over 30 s); a client that quits or dies closes its connections, which ends a transfer
    /// at once.
    pub idle_timeout: Duration,
    /// How long a data connection may take to arrive or connect.
    pub data_timeout: Duration,
    pub max_per_ip: usize,
    /// Most entries one MLSR lists (held until sent).
    pub max_tree_entries: usize,
    pub max_connections: usize,
    /// Passive ports to choose from at random; `None`: any free port.
    pub passive_ports: Option<(u16, u16)>,
    /// The address PASV and SPAS replies give (NAT); `None`: the control connection's local one.
    pub public_address: Option<std::net::Ipv4Addr>,
    /// Most connections not logged in yet, all told (as OpenSSH's `MaxStartups`): past it, a
    /// newcomer pushes out one of the oldest of the range holding most of them.
    pub max_startups: usize,
    /// How addresses are grouped into ranges for the limits on logins.
    pub ranges: braid_proto::addr::Ranges,
    /// Delay before answering a first failed login; it doubles with each further failure of
    /// the same (address range, account) (slows down guessing).
    pub login_fail_delay: Duration,
    /// Password checks, failures, budgets and pre-login places, shared by all sessions.
    pub guard: Arc<guard::Guard>,
    /// Most data connections for one MODE E transfer.
    pub max_streams: u32,
    /// `--compress`: whether MODE E blocks are compressed between braid peers.
    pub compress: braid_proto::compress::Policy,
    /// Third-party transfers with other braid servers (off: `--no-third-party`).
    pub third_party: bool,
    /// A data node, the front end of data nodes, or neither.
    pub striping: Striping,
    /// XXH3 checksums already computed, shared by all sessions.
    pub checksums: ChecksumCache,
    /// Bytes and files under the roots of accounts with a quota, counted afresh per
    /// configuration (a reload counts again).
    pub usages: Arc<quota::Usages>,
    /// How old a partial upload nobody resumes may get before it is removed; `None`: kept.
    pub partial_max_age: Option<Duration>,
    /// Certificate and key for AUTH TLS (RFC 4217); `None`: no TLS.
    pub tls: Option<Arc<tls::Tls>>,
    /// `--gsi-cert`: GSI logins (AUTH GSSAPI) and DCAU A; `None`: no GSI.
    pub gsi: Option<Arc<gsi::GsiHost>>,
    /// Where a line per transfer goes in the xferlog format (`--xferlog`).
    pub xferlog: Option<Arc<xferlog::XferLog>>,
    /// Counts for `--metrics`, kept whether or not they are served.
    pub metrics: Arc<metrics::Metrics>,
    /// `--background`: every download yields to other traffic.
    pub background: bool,
    /// `--uplink`: bytes/s that running downloads share by weight.
    pub uplink: Option<u64>,
    /// The running downloads' weights, shared by all sessions.
    pub shares: Arc<pacing::Shares>,
    /// Root directories open now, shared by the sessions logged in to them: one descriptor
    /// per directory instead of one per session (10,000 idle sessions hit the usual limit of
    /// 20,000 open files at two each). A reload starts afresh, so a replaced directory is
    /// opened again.
    roots: Arc<Mutex<HashMap<PathBuf, std::sync::Weak<crate::fsroot::Root>>>>,
}

/// This server's part in a striped endpoint.
#[derive(Debug, Clone)]
pub enum Striping {
    Off,
    /// `--data-node`: moves stripes for its front end.
    Node,
    /// `--data-nodes`: has its nodes move the data after SPAS.
    FrontEnd(Arc<stripes::FrontEnd>),
}

/// How long a partial upload nobody resumes is kept: a week, time enough to resume after a
/// weekend.
pub const DEFAULT_PARTIAL_MAX_AGE: Duration = Duration::from_secs(7 * 86_400);

/// A file version: device, inode, size, modification and change times (s, ns).
pub type FileVersion = (u64, u64, u64, i64, i64, i64, i64);

/// Checksums by file version: a file served again unchanged is not read again for CKSM.
/// Bounded; cleared when full.
#[derive(Debug, Clone, Default)]
pub struct ChecksumCache {
    map: Arc<Mutex<HashMap<FileVersion, u128>>>,
}

impl ChecksumCache {
    const MAX: usize = 4096;

    pub fn xxh3(&self, file: &std::fs::File, len: u64) -> std::io::Result<u128> {
        let key = Self::version(file)?;
        if let Some(sum) = self.known(key, len) {
            return Ok(sum);
        }
        let sum = crate::sums::xxh3(file, len)?;
        self.insert(key, sum);
        Ok(sum)
    }

    /// The checksum of the first `len` bytes of the file at version `key`, if known: `len` must
    /// be the whole file.
    pub fn known(&self, key: FileVersion, len: u64) -> Option<u128> {
        self.lock().get(&key).copied().filter(|_| key.2 == len)
    }

    /// The file's version now: taken before it is read, and compared after.
    pub fn version(file: &std::fs::File) -> std::io::Result<FileVersion> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok((
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        ))
    }

    /// Keeps a checksum computed while the whole file was sent (`before`: its version then),
    /// if the file is still that version: CKSM after the transfer then reads nothing.
    pub fn remember(&self, file: &std::fs::File, before: FileVersion, sum: u128) {
        if Self::version(file).is_ok_and(|now| now == before) {
            self.insert(before, sum);
        }
    }

    fn insert(&self, key: FileVersion, sum: u128) {
        let mut map = self.lock();
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(key, sum);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileVersion, u128>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Config {
    pub fn new(root: PathBuf) -> Config {
        Config {
            root,
            anonymous: Some(Perm::ReadOnly),
            users: Users::default(),
            login_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(300),
            data_timeout: Duration::from_secs(30),
            max_per_ip: 16,
            max_tree_entries: 500_000,
            max_connections: 256,
            max_startups: 64,
            ranges: braid_proto::addr::Ranges::default(),
            passive_ports: None,
            public_address: None,
            login_fail_delay: Duration::from_millis(500),
            guard: Arc::default(),
            max_streams: 64,
            compress: braid_proto::compress::Policy::Auto,
            third_party: true,
            striping: Striping::Off,
            checksums: ChecksumCache::default(),
            usages: Arc::default(),
            tls: None,
            gsi: None,
            partial_max_age: Some(DEFAULT_PARTIAL_MAX_AGE),
            xferlog: None,
            metrics: Arc::default(),
            background: false,
            uplink: None,
            shares: Arc::default(),
            roots: Arc::default(),
        }
    }

    /// `path` opened as a session's root, or the one already open for other sessions.
    pub(crate) fn open_root(&self, path: &Path) -> std::io::Result<Arc<crate::fsroot::Root>> {
        let mut roots = self.roots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(root) = roots.get(path).and_then(std::sync::Weak::upgrade) {
            return Ok(root);
        }
        roots.retain(|_, r| r.strong_count() > 0);
        let root = Arc::new(crate::fsroot::Root::open(path)?);
        roots.insert(path.to_path_buf(), Arc::downgrade(&root));
        Ok(root)
    }
}

/// One session on this process's standard input and output (`braid serve --stdio`): the
/// client at the far end of ssh's channel, data connections listening on the address ssh was
/// reached at, the session starting in the current directory. TLS with a certificate made
/// now, which the greeting names (the client pins it, having read it over ssh): every data
/// connection is TLS bound to the session. Returns when the session ends.
pub async fn serve_stdio(mut config: Config) -> anyhow::Result<()> {
    more_open_files();
    let (tls, digest) = tls::Tls::made_now()?;
    config.tls = Some(Arc::new(tls));
    let config = Arc::new(config);
    // Loopback for a session started some other way than by ssh.
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let (peer, local) =
        ssh_ends(std::env::var("SSH_CONNECTION").ok().as_deref()).unwrap_or((loopback, loopback));
    let greeting = braid_proto::session::Session::greeting_with_certificate(&digest, local.ip());
    let start = std::env::current_dir()
        .ok()
        .and_then(|cwd| start_dir(&config.root, &cwd))
        .unwrap_or_else(braid_proto::path::VPath::root);
    let (rd, wr) = stdio::halves();
    let conn = conn::Conn::piped(rd, wr, peer);
    // Nothing stops a one-shot session but its end.
    let (_running, shutdown) = watch::channel(Shutdown::Running);
    control::serve_piped(conn, local, start, greeting, config, shutdown).await;
    Ok(())
}

/// The client's and this side's addresses from ssh's `SSH_CONNECTION` ("client-ip
/// client-port server-ip server-port"), this side's with port 0 (passive ports listen on the
/// server's address, each on a port of its own); None outside ssh.
pub(crate) fn ssh_ends(var: Option<&str>) -> Option<(SocketAddr, SocketAddr)> {
    let fields: Vec<&str> = var?.split_whitespace().collect();
    let addr = |ip: Option<&&str>, port: Option<&&str>| -> Option<SocketAddr> {
        let ip: IpAddr = ip?.parse().ok()?;
        Some(SocketAddr::new(ip, port?.parse().ok()?))
    };
    let peer = addr(fields.first(), fields.get(1))?;
    let local = addr(fields.get(2), fields.get(3))?;
    Some((peer, SocketAddr::new(local.ip(), 0)))
}

/// `cwd` as a path inside `root`, if it is inside.
fn start_dir(root: &std::path::Path, cwd: &std::path::Path) -> Option<braid_proto::path::VPath> {
    let inside = cwd.strip_prefix(root).ok()?;
    braid_proto::path::VPath::root().join(inside.to_str()?).ok()
}

/// How far a shutdown has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shutdown {
    Running,
    /// Refuse new work; let running transfers finish.
    Graceful,
    /// Abort running transfers now.
    Abort,
}

/// Connection counts per client address, for the per-address cap.
#[derive(Debug, Default)]
struct Counts {
    per_ip: HashMap<IpAddr, usize>,
    total: usize,
}

/// Releases a connection's slot when the session ends, however it ends.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut c) = self.counts.lock() {
            c.total = c.total.saturating_sub(1);
            if let Some(n) = c.per_ip.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    c.per_ip.remove(&self.ip);
                }
            }
        }
    }
}

/// Serves until `shutdown` leaves [`Shutdown::Running`], then waits for sessions to end: all of
/// them when the state reaches [`Shutdown::Abort`] (running transfers are cut).
/// Raises the soft limit on open files to the hard one: a bundle being stored holds each of
/// its files open until it is checked (thousands a session), where the usual soft limit is
/// 1024. Where it cannot be raised, a bundle that meets it is refused and its files come one
/// by one.
fn more_open_files() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!("cannot raise the limit on open files: {e}");
        }
    }
}

/// Each new session takes the configuration `configs` holds then (a reload replaces it);
/// sessions already running keep theirs.
pub async fn run(
    listener: TcpListener,
    configs: watch::Receiver<Arc<Config>>,
    mut shutdown: watch::Receiver<Shutdown>,
) -> std::io::Result<()> {
    more_open_files();
    let counts = Arc::new(Mutex::new(Counts::default()));
    let mut sessions = tokio::task::JoinSet::new();
    let expiring = tokio::spawn(partials::expire(configs.clone()));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors and the like: pause instead of spinning.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let ip = braid_proto::session::canonical_ip(peer.ip());
                let config = configs.borrow().clone();
                let refusal = {
                    let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
                    let here = c.per_ip.get(&ip).copied().unwrap_or(0);
                    // Full: a connection that has not logged in makes way, as past
                    // --max-startups (the one pushed out closes at once).
                    if c.total >= config.max_connections && !config.guard.push_out_one() {
                        Some(format!("421 Too many connections ({}); try again later.\r\n", config.max_connections))
                    } else if here >= config.max_per_ip {
                        Some(format!("421 Too many connections from your address (limit {}).\r\n", config.max_per_ip))
                    } else {
                        c.total += 1;
                        *c.per_ip.entry(ip).or_insert(0) += 1;
                        None
                    }
                };
                if let Some(msg) = refusal {
                    crate::warnings::warn("connection-limit", ip, format_args!("refused {peer}: {}", msg.trim_end()));
                    tokio::spawn(async move {
                        use tokio::io::AsyncWriteExt;
                        let mut stream = stream;
                        let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(msg.as_bytes())).await;
                    });
                    continue;
                }
                let slot = Slot { counts: counts.clone(), ip };
                let shutdown = shutdown.clone();
                sessions.spawn(async move {
                    let _slot = slot;
                    control::serve(stream, peer, config, shutdown).await;
                });
            }
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
            _ = shutdown.changed() => {
                if *shutdown.borrow() != Shutdown::Running {
                    break;
                }
            }
        }
    }
    drop(listener);
    expiring.abort();
    tracing::info!("shutting down: waiting for {} session(s)", sessions.len());
    while sessions.join_next().await.is_some() {}
    Ok(())
}

/// Resolves once the server's shutdown has reached `level` (never, if the sender is gone).
pub(crate) async fn reached(rx: &mut watch::Receiver<Shutdown>, level: Shutdown) {
    if rx.wait_for(|s| *s >= level).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Describes where the server listens, for the startup line.
pub fn url_for(addr: SocketAddr) -> String {
    format!("ftp://{addr}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ends_come_from_ssh_connection() {
        let ends = ssh_ends(Some("198.18.0.1 40000 198.18.0.2 22"));
        assert_eq!(
            ends,
            Some((
                "198.18.0.1:40000".parse().unwrap(),
                "198.18.0.2:0".parse().unwrap()
            ))
        );
        assert_eq!(ssh_ends(None), None);
        assert_eq!(ssh_ends(Some("garbage")), None);
    }
}
