//! `braid serve`'s settings: one definition read both from the command line and from a TOML
//! file (`--config`), so every option has the same name in both (`--max-per-ip 4` is
//! `max-per-ip = 4`). The command line wins over the file; SIGHUP reads the file again.

use super::{Config, Striping, tls};
use crate::users::Users;
use anyhow::{Context, bail};
use braid_proto::session::Perm;
use clap::Args;
use serde::Deserialize;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where the server listens unless told (the --listen help says it too).
const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 2121);

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// `time LEVEL message key=value ...`, for people.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Args, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeArgs {
    /// TOML file with any of these options, spelt as here without the leading dashes
    /// (`max-per-ip = 4`).
    ///
    /// The command line wins over it. SIGHUP reads it again, and the users file, without
    /// dropping sessions. Relative paths in it are from its own directory.
    #[arg(help_heading = "Where and what", long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Directory to serve to anonymous users [default: .].
    #[arg(help_heading = "Where and what", long)]
    pub root: Option<PathBuf>,
    /// Address and port to listen on; port 0 picks a free one [default: 127.0.0.1:2121].
    #[arg(help_heading = "Where and what", long)]
    pub listen: Option<SocketAddr>,
    /// Serve one session on standard input and output, then exit: the far side of a
    /// transfer over ssh, which has already authenticated the client.
    ///
    /// The session logs in as anonymous with the rights of the user running this (ssh's),
    /// serves --root [default: /] and starts in the current directory (where ssh starts a
    /// command: the home directory), so relative paths mean what they mean to scp. Data
    /// connections listen on the address ssh was reached at (SSH_CONNECTION) and come from
    /// the client's address or, through ssh's forward, from this host; each is TLS bound to
    /// the session. It ends when its input closes. Logs only warnings unless -v.
    #[arg(help_heading = "Where and what", long, conflicts_with_all = ["listen", "users", "metrics", "config"])]
    #[serde(skip)]
    pub stdio: bool,
    /// Accounts file (see `braid passwd`). With it, anonymous login is off unless --anonymous.
    #[arg(help_heading = "Who may log in", long)]
    pub users: Option<PathBuf>,
    /// Allow anonymous login (on by default when there is no --users file).
    #[arg(help_heading = "Who may log in", long)]
    #[serde(default)]
    pub anonymous: bool,
    /// Let anonymous users upload, delete, rename and create directories (with --users, only
    /// together with --anonymous).
    #[arg(help_heading = "Who may log in", long)]
    #[serde(default)]
    pub anonymous_write: bool,
    /// Passive ports to choose from at random, e.g. 50000-50100 [default: any free port].
    #[arg(help_heading = "Data connections", long, value_parser = parse_range)]
    #[serde(default, deserialize_with = "range")]
    pub passive_ports: Option<(u16, u16)>,
    /// IPv4 address to put in PASV and SPAS replies instead of the one the server listens
    /// on.
    ///
    /// The address clients reach it at when it sits behind NAT. Forward --passive-ports
    /// too. EPSV replies carry no address and need nothing.
    #[arg(help_heading = "Data connections", long, value_name = "IPV4")]
    pub public_address: Option<Ipv4Addr>,
    /// PEM certificate chain: offers AUTH TLS (RFC 4217, explicit FTPS), so clients can
    /// encrypt the control connection (passwords) and, with PROT P, stream-mode data.
    #[arg(help_heading = "TLS", long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(help_heading = "TLS", long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Whether a PROT P data connection must resume its control connection's TLS session
    /// [default: required].
    ///
    /// Required is what ties the data connection to its session: anyone else who reaches
    /// the passive port first is refused instead of being handed the file or having their
    /// bytes stored. curl, lftp, rclone, wget and braid resume; Python's ftplib never does,
    /// and C-Kermit only on its first data connection under TLS 1.3: they need `optional`.
    #[arg(help_heading = "TLS", long, value_enum, value_name = "WHEN")]
    pub tls_session_reuse: Option<Need>,
    /// Whether data connections must be private (PROT P) once the control connection uses
    /// TLS [default: required].
    ///
    /// A client that logged in over TLS and asks for clear data gets 522, so files do not
    /// cross the network in clear by mistake. `optional` lets it choose.
    #[arg(help_heading = "TLS", long, value_enum, value_name = "WHEN")]
    pub tls_data: Option<Need>,
    /// PEM host certificate: offers GSI logins (AUTH GSSAPI, `gsiftp://`), as Globus
    /// GridFTP servers take them.
    ///
    /// A user logs in with an X.509 credential (a proxy from grid-proxy-init, or the
    /// certificate itself) issued by a CA in --gsi-ca-dir, and is the account the
    /// --grid-mapfile maps its name to: that account's root and rights from --users, or
    /// --root read-write for a name not in --users. The client delegates a proxy, with which
    /// this server authenticates data connections (DCAU A), also to another GridFTP server
    /// in a copy between two (`globus-url-copy gsiftp://A/f gsiftp://B/f`, `braid cp`).
    #[arg(help_heading = "GSI", long, value_name = "PEM", requires_all = ["gsi_key", "grid_mapfile"])]
    pub gsi_cert: Option<PathBuf>,
    /// PEM private key for --gsi-cert (not encrypted, as hostkey.pem).
    #[arg(help_heading = "GSI", long, value_name = "PEM", requires = "gsi_cert")]
    pub gsi_key: Option<PathBuf>,
    /// The grid-mapfile: lines `"/O=Grid/CN=Alice Smith" alice`, read at each login.
    #[arg(help_heading = "GSI", long, value_name = "FILE", requires = "gsi_cert")]
    pub grid_mapfile: Option<PathBuf>,
    /// Directory of the CAs whose users may log in: hash-named PEM files (`1a2b3c4d.0`)
    /// [default: $X509_CERT_DIR, else /etc/grid-security/certificates].
    #[arg(help_heading = "GSI", long, value_name = "DIR", requires = "gsi_cert")]
    pub gsi_ca_dir: Option<PathBuf>,
    /// Seconds a partial upload (the hidden `.NAME.braid-part` a failed or interrupted
    /// upload leaves for a resume) is kept after its last write.
    ///
    /// Older ones are removed. 0 keeps them forever [default: 604800, a week].
    #[arg(help_heading = "Limits", long, value_name = "SECONDS")]
    pub partial_max_age: Option<u64>,
    /// Most control connections from one client address [default: 16].
    #[arg(help_heading = "Limits", long)]
    pub max_per_ip: Option<usize>,
    /// Most entries one MLSR lists: a tree's whole listing is held in memory until sent
    /// (about 150 bytes an entry); a larger tree is refused (451) and clients list it a
    /// directory at a time (MLSD) [default: 500000].
    #[arg(help_heading = "Limits", long, value_name = "N")]
    pub max_tree_entries: Option<usize>,
    /// Most control connections in all [default: 256].
    #[arg(help_heading = "Limits", long)]
    pub max_connections: Option<usize>,
    /// Most connections that have not logged in yet, all told [default: a quarter of
    /// --max-connections, 64].
    ///
    /// Past it a newcomer gets in and one of the oldest connections of the address range
    /// holding most of them is closed, so idle attackers push out only their own; one range
    /// holds a quarter at most. As OpenSSH's MaxStartups.
    #[arg(help_heading = "Limits", long, value_name = "N")]
    pub max_startups: Option<usize>,
    /// Prefix length that groups IPv4 addresses into one range for the limits on logins
    /// (pre-login places, password-check budgets, failed-login penalties) [default: 24].
    #[arg(help_heading = "Limits", long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(8..=32))]
    pub ipv4_prefix: Option<u8>,
    /// Prefix length that groups IPv6 addresses into one range [default: 48: a site; one
    /// host is often given a /64 or more, and must not count as thousands of sources].
    #[arg(help_heading = "Limits", long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(16..=128))]
    pub ipv6_prefix: Option<u8>,
    /// Seconds a client has to log in [default: 60].
    #[arg(help_heading = "Limits", long, value_name = "SECONDS")]
    pub login_timeout: Option<u64>,
    /// Seconds of silence after which an idle session is closed [default: 300].
    #[arg(help_heading = "Limits", long, value_name = "SECONDS")]
    pub idle_timeout: Option<u64>,
    /// Seconds running transfers get to finish after Ctrl-C or SIGTERM before they are cut
    /// [default: 30].
    #[arg(help_heading = "Limits", long, value_name = "SECONDS")]
    pub shutdown_grace: Option<u64>,
    /// Append a line per transfer to FILE in the xferlog format of wu-ftpd and vsftpd, for
    /// the tools that read it.
    ///
    /// SIGHUP reopens it (log rotation).
    #[arg(help_heading = "Logs and metrics", long, value_name = "FILE")]
    pub xferlog: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (sessions, transfers, bytes, logins,
    /// data connections, bytes per user).
    #[arg(help_heading = "Logs and metrics", long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Log line format [default: text].
    ///
    /// RUST_LOG sets the level (e.g. RUST_LOG=warn, or RUST_LOG=debug for every command and
    /// reply).
    #[arg(help_heading = "Logs and metrics", long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log every command and reply (RUST_LOG=debug).
    #[arg(help_heading = "Logs and metrics", short, long)]
    #[serde(default)]
    pub verbose: bool,
    /// Send every download in background mode, as `braid get --background` does.
    ///
    /// The server paces its data connections from the round trip they see, so that other
    /// traffic on its uplink keeps its latency, marks them DSCP 1 (lower effort) and uses
    /// cubic. A user can get it alone with `rw,background` in the users file.
    #[arg(help_heading = "Sharing the uplink", long)]
    #[serde(default)]
    pub background: bool,
    /// The server's uplink in bytes/s, e.g. 12MB for about 100 Mbit/s.
    ///
    /// Running downloads then share it by their users' weights (`rw,weight=4` in the users
    /// file; 1 by default), each paced to its share, so preferred customers get more when
    /// the uplink is busy.
    #[arg(help_heading = "Sharing the uplink", long, value_name = "BYTES_PER_SECOND", value_parser = crate::units::parse_size)]
    #[serde(default, deserialize_with = "size")]
    pub uplink: Option<u64>,
    /// Compress MODE E blocks (zstd) for braid clients that ask [default: auto].
    ///
    /// auto: as the client says (its default, auto, compresses a download only while that
    /// moves it faster, never over TLS); on: every block that shrinks unless the client says
    /// off, TLS included; off: never, and compressed uploads are refused.
    #[arg(long, value_name = "auto|on|off", value_parser = braid_proto::compress::Policy::parse)]
    #[serde(default, deserialize_with = "policy")]
    pub compress: Option<braid_proto::compress::Policy>,
    /// Take no part in third-party transfers (`braid cp ftp://A/f ftp://B/f`).
    ///
    /// By default a user who logged in with a password over TLS may have this server send a
    /// file to, or take one from, another braid server; its data connections are TLS and
    /// each proves it belongs to that user's session. Under GSI (--gsi-cert) the same goes
    /// for any GridFTP server, with data connections that show the user's delegated proxy
    /// (DCAU A). Anonymous users never may, and PORT to any host but the client's stays
    /// refused otherwise (FTP bounce).
    #[arg(long)]
    #[serde(default)]
    pub no_third_party: bool,
    /// Be a data node of a striped server: move stripes of files under --root for the front
    /// end (`braid serve --data-nodes`), which logs in with --node-key.
    ///
    /// A data node has no other account and no anonymous login; it takes data connections
    /// only from the client its front end names for each transfer. --root must be the same
    /// shared filesystem (Lustre, GPFS, CephFS, NFS) as the front end's.
    #[arg(help_heading = "Striping over data nodes", long, requires = "node_key",
          conflicts_with_all = ["users", "anonymous", "anonymous_write", "data_nodes", "stdio"])]
    #[serde(default)]
    pub data_node: bool,
    /// Be the front end of a striped server: HOST:PORT of each data node, comma-separated.
    ///
    /// Accounts log in here as usual. A braid client (or globus-url-copy -stripe) that sends
    /// SPAS gets one address per node and each node moves its stripes of the file (blocks dealt
    /// round-robin by offset) from and to the shared filesystem under --root; a node that
    /// fails is left out of the next SPAS. PASV and EPSV still move data through this server.
    #[arg(
        help_heading = "Striping over data nodes",
        long,
        value_name = "HOST:PORT,...",
        value_delimiter = ',',
        requires = "node_key",
        conflicts_with = "stdio"
    )]
    pub data_nodes: Option<Vec<String>>,
    /// File holding the secret a front end logs in to its data nodes with: the same file on
    /// the front end and on every node (e.g. `head -c 32 /dev/urandom | base64 > node.key`).
    #[arg(help_heading = "Striping over data nodes", long, value_name = "FILE")]
    pub node_key: Option<PathBuf>,
}

/// Whether the server insists on a protection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Need {
    #[default]
    Required,
    Optional,
}

/// The options SIGHUP cannot change in a running server.
const FIXED: &str = "listen, metrics, log-format and verbose";

impl ServeArgs {
    /// The command line's options over those of the `--config` file, if there is one.
    pub fn resolve(&self) -> anyhow::Result<ServeArgs> {
        match &self.config {
            Some(path) => Ok(self.over(load(path)?)),
            None => Ok(self.clone()),
        }
    }

    /// These options where given, `file`'s elsewhere. A flag set in either is set.
    fn over(&self, file: ServeArgs) -> ServeArgs {
        ServeArgs {
            config: self.config.clone(),
            root: self.root.clone().or(file.root),
            listen: self.listen.or(file.listen),
            stdio: self.stdio,
            users: self.users.clone().or(file.users),
            anonymous: self.anonymous || file.anonymous,
            anonymous_write: self.anonymous_write || file.anonymous_write,
            passive_ports: self.passive_ports.or(file.passive_ports),
            public_address: self.public_address.or(file.public_address),
            tls_cert: self.tls_cert.clone().or(file.tls_cert),
            tls_key: self.tls_key.clone().or(file.tls_key),
            tls_session_reuse: self.tls_session_reuse.or(file.tls_session_reuse),
            tls_data: self.tls_data.or(file.tls_data),
            gsi_cert: self.gsi_cert.clone().or(file.gsi_cert),
            gsi_key: self.gsi_key.clone().or(file.gsi_key),
            grid_mapfile: self.grid_mapfile.clone().or(file.grid_mapfile),
            gsi_ca_dir: self.gsi_ca_dir.clone().or(file.gsi_ca_dir),
            partial_max_age: self.partial_max_age.or(file.partial_max_age),
            max_per_ip: self.max_per_ip.or(file.max_per_ip),
            max_tree_entries: self.max_tree_entries.or(file.max_tree_entries),
            max_connections: self.max_connections.or(file.max_connections),
            max_startups: self.max_startups.or(file.max_startups),
            ipv4_prefix: self.ipv4_prefix.or(file.ipv4_prefix),
            ipv6_prefix: self.ipv6_prefix.or(file.ipv6_prefix),
            login_timeout: self.login_timeout.or(file.login_timeout),
            idle_timeout: self.idle_timeout.or(file.idle_timeout),
            shutdown_grace: self.shutdown_grace.or(file.shutdown_grace),
            xferlog: self.xferlog.clone().or(file.xferlog),
            metrics: self.metrics.or(file.metrics),
            log_format: self.log_format.or(file.log_format),
            verbose: self.verbose || file.verbose,
            background: self.background || file.background,
            uplink: self.uplink.or(file.uplink),
            compress: self.compress.or(file.compress),
            no_third_party: self.no_third_party || file.no_third_party,
            data_node: self.data_node || file.data_node,
            data_nodes: self.data_nodes.clone().or(file.data_nodes),
            node_key: self.node_key.clone().or(file.node_key),
        }
    }

    pub fn listen(&self) -> SocketAddr {
        self.listen.unwrap_or(DEFAULT_LISTEN)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace.unwrap_or(30))
    }

    /// What a reload would change that only a restart can, named for the warning.
    pub fn fixed_changes(&self, new: &ServeArgs) -> Option<&'static str> {
        let same = self.listen == new.listen
            && self.metrics == new.metrics
            && self.log_format == new.log_format
            && self.verbose == new.verbose;
        (!same).then_some(FIXED)
    }

    /// Who may log in, for the startup line.
    pub fn who(&self, config: &Config) -> &'static str {
        match (config.anonymous, self.users.is_some()) {
            (Some(Perm::ReadWrite), false) => "anonymous read-write",
            (Some(Perm::ReadWrite), true) => "accounts, plus anonymous read-write",
            (Some(Perm::ReadOnly), false) => "anonymous read-only",
            (Some(Perm::ReadOnly), true) => "accounts, plus anonymous read-only",
            (None, _) => "accounts only",
        }
    }

    /// The server's configuration. What lives across reloads (failed logins, the checksum
    /// cache, the metrics) comes from `running`, if the server already runs.
    pub fn config(&self, running: Option<&Config>) -> anyhow::Result<Config> {
        let default_root = if self.stdio { "/" } else { "." };
        let root = self
            .root
            .clone()
            .unwrap_or_else(|| PathBuf::from(default_root));
        let root = root
            .canonicalize()
            .with_context(|| format!("cannot serve {}: no such directory", root.display()))?;
        if !root.is_dir() {
            bail!("cannot serve {}: not a directory", root.display());
        }
        let mut config = Config::new(root);
        if let Some(old) = running {
            config.guard = old.guard.clone();
            config.checksums = old.checksums.clone();
            config.metrics = old.metrics.clone();
            config.shares = old.shares.clone();
        }
        config.background = self.background;
        config.uplink = self.uplink;
        config.compress = self.compress.unwrap_or_default();
        config.third_party = !self.no_third_party;
        config.striping = self.striping(&config.root)?;
        if let Striping::Node = config.striping {
            // The front end's one account, read-write on the shared root.
            let key = self.read_node_key()?;
            let line = format!(
                "{}:{}:rw:{}",
                super::stripes::NODE_USER,
                crate::users::hash_password(&key)?,
                config.root.display()
            );
            config.users = Users::parse(&line, &config.root)?;
            config.anonymous = None;
            return self.finish_config(config);
        }
        if let Some(path) = &self.users {
            config.users = Users::load(path)?;
            if config.users.is_empty() {
                bail!(
                    "{} has no accounts; add one with braid passwd",
                    path.display()
                );
            }
        }
        if self.users.is_some() && self.anonymous_write && !self.anonymous {
            bail!(
                "--anonymous-write with --users would also let anyone log in anonymously and \
                 write; add --anonymous (anonymous = true in a config file) to mean that, or \
                 drop --anonymous-write"
            );
        }
        let anonymous = self.users.is_none() || self.anonymous || self.anonymous_write;
        // Over ssh the client is the user running this, with its rights.
        let write = self.anonymous_write || self.stdio;
        config.anonymous = match (anonymous, write) {
            (false, _) => None,
            (true, false) => Some(Perm::ReadOnly),
            (true, true) => Some(Perm::ReadWrite),
        };
        self.finish_config(config)
    }

    /// What `--data-node`, `--data-nodes` and `--node-key` make of this server.
    fn striping(&self, root: &Path) -> anyhow::Result<Striping> {
        if self.data_node {
            if self.data_nodes.is_some() {
                bail!(
                    "--data-node and --data-nodes: a server is a data node or a front end, not both"
                );
            }
            return Ok(Striping::Node);
        }
        let Some(nodes) = &self.data_nodes else {
            if self.node_key.is_some() {
                bail!(
                    "--node-key without --data-node or --data-nodes: add one, or drop --node-key"
                );
            }
            return Ok(Striping::Off);
        };
        let nodes: Vec<String> = nodes
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if nodes.is_empty() || nodes.len() > super::stripes::MOST_NODES {
            bail!(
                "--data-nodes takes 1 to {} HOST:PORT, comma-separated",
                super::stripes::MOST_NODES
            );
        }
        for n in &nodes {
            let ok = n
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                bail!("--data-nodes: {n:?} is not HOST:PORT");
            }
        }
        let tls = match &self.tls_cert {
            Some(cert) => Some(crate::client::wire::pinned_config(
                super::tls::fingerprint_of(cert)?,
            )?),
            None => None,
        };
        Ok(Striping::FrontEnd(Arc::new(super::stripes::FrontEnd {
            nodes,
            key: self.read_node_key()?,
            root: root.to_path_buf(),
            tls,
        })))
    }

    fn read_node_key(&self) -> anyhow::Result<String> {
        let path = self
            .node_key
            .as_ref()
            .context("--data-node and --data-nodes need --node-key FILE")?;
        let key = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the node key {}", path.display()))?;
        let key = key.trim().to_string();
        if key.len() < 16 || key.contains([':', '\n', '\r']) {
            bail!(
                "the node key in {} must be one line of at least 16 characters without ':' \
                 (e.g. head -c 32 /dev/urandom | base64 > {})",
                path.display(),
                path.display()
            );
        }
        Ok(key)
    }

    /// The settings every server has, whatever its accounts.
    fn finish_config(&self, mut config: Config) -> anyhow::Result<Config> {
        config.passive_ports = self.passive_ports;
        config.public_address = self.public_address;
        config.tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(tls::Tls::load(
                cert,
                key,
                self.tls_session_reuse.unwrap_or_default() == Need::Required,
                self.tls_data.unwrap_or_default() == Need::Required,
            )?)),
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together: give both, or neither"),
        };
        config.gsi = match (&self.gsi_cert, &self.gsi_key, &self.grid_mapfile) {
            (Some(cert), Some(key), Some(map)) => {
                let ca_dir = self.gsi_ca_dir.clone().unwrap_or_else(|| {
                    std::env::var_os("X509_CERT_DIR")
                        .map_or_else(|| "/etc/grid-security/certificates".into(), PathBuf::from)
                });
                Some(Arc::new(super::gsi::GsiHost::load(
                    cert, key, &ca_dir, map,
                )?))
            }
            (None, None, None) => None,
            _ => bail!("--gsi-cert, --gsi-key and --grid-mapfile go together: give all three"),
        };
        if let Some(s) = self.partial_max_age {
            config.partial_max_age = (s > 0).then(|| Duration::from_secs(s));
        }
        if let Some(n) = self.max_per_ip {
            config.max_per_ip = n.max(1);
        }
        if let Some(n) = self.max_tree_entries {
            config.max_tree_entries = n.max(1);
        }
        if let Some(n) = self.max_connections {
            config.max_connections = n.max(1);
        }
        config.max_startups = match self.max_startups {
            Some(n) if n > config.max_connections => bail!(
                "--max-startups {n} is more than --max-connections {}: connections that have \
                 not logged in are counted among all connections; lower it",
                config.max_connections
            ),
            Some(n) => n.max(1),
            None => (config.max_connections / 4).max(1),
        };
        if let Some(bits) = self.ipv4_prefix {
            config.ranges.v4 = bits;
        }
        if let Some(bits) = self.ipv6_prefix {
            config.ranges.v6 = bits;
        }
        if !(8..=32).contains(&config.ranges.v4) || !(16..=128).contains(&config.ranges.v6) {
            bail!("ipv4-prefix must be 8 to 32 and ipv6-prefix 16 to 128 bits");
        }
        if let Some(s) = self.login_timeout {
            config.login_timeout = Duration::from_secs(s);
        }
        if let Some(s) = self.idle_timeout {
            config.idle_timeout = Duration::from_secs(s);
        }
        config.xferlog = match &self.xferlog {
            Some(path) => Some(Arc::new(super::xferlog::XferLog::open(path)?)),
            None => None,
        };
        Ok(config)
    }
}

/// Reads a `--config` file; relative paths in it are taken from the file's directory.
pub fn load(path: &Path) -> anyhow::Result<ServeArgs> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let mut args = parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    for p in [
        &mut args.root,
        &mut args.users,
        &mut args.tls_cert,
        &mut args.tls_key,
        &mut args.gsi_cert,
        &mut args.gsi_key,
        &mut args.grid_mapfile,
        &mut args.gsi_ca_dir,
        &mut args.xferlog,
        &mut args.node_key,
    ]
    .into_iter()
    .flatten()
    {
        if p.is_relative() {
            *p = dir.join(&*p);
        }
    }
    Ok(args)
}

/// The options in a config file's text; errors name the line and the key.
pub fn parse(text: &str) -> Result<ServeArgs, String> {
    toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!("line {line}: ")
            })
            .unwrap_or_default();
        format!("{at}{}", e.message())
    })
}

pub fn parse_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or("expected LOW-HIGH, e.g. 50000-50100")?;
    let lo: u16 = a.trim().parse().map_err(|_| format!("bad port {a:?}"))?;
    let hi: u16 = b.trim().parse().map_err(|_| format!("bad port {b:?}"))?;
    if lo == 0 || lo > hi {
        return Err(format!("{s}: need 1 <= LOW <= HIGH"));
    }
    Ok((lo, hi))
}

fn range<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<(u16, u16)>, D::Error> {
    let s = String::deserialize(d)?;
    parse_range(&s).map(Some).map_err(serde::de::Error::custom)
}

/// A size in the file: bytes as a number, or with a unit as on the command line ("12MB").
fn size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(n) => Ok(Some(n)),
        Size::Text(t) => crate::units::parse_size(&t)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

fn policy<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<braid_proto::compress::Policy>, D::Error> {
    let text = String::deserialize(d)?;
    braid_proto::compress::Policy::parse(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_reads_from_the_file() {
        let args = parse(
            r#"
            root = "/srv/ftp"
            listen = "0.0.0.0:21"
            users = "users.toml"
            anonymous = true
            anonymous-write = true
            passive-ports = "50000-50100"
            public-address = "198.18.0.1"
            tls-cert = "cert.pem"
            tls-key = "key.pem"
            max-per-ip = 4
            max-connections = 500
            max-startups = 100
            ipv4-prefix = 22
            ipv6-prefix = 56
            login-timeout = 20
            idle-timeout = 600
            shutdown-grace = 5
            xferlog = "/var/log/xferlog"
            metrics = "127.0.0.1:9898"
            log-format = "json"
            verbose = true
            background = true
            uplink = "12MB"
            compress = "off"
            "#,
        )
        .unwrap();
        assert_eq!(args.root, Some(PathBuf::from("/srv/ftp")));
        assert_eq!(args.listen(), "0.0.0.0:21".parse().unwrap());
        assert_eq!(args.users, Some(PathBuf::from("users.toml")));
        assert!(args.anonymous && args.anonymous_write && args.verbose);
        assert_eq!(args.passive_ports, Some((50000, 50100)));
        assert_eq!(args.public_address, Some(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(args.tls_cert, Some(PathBuf::from("cert.pem")));
        assert_eq!(args.tls_key, Some(PathBuf::from("key.pem")));
        assert_eq!(args.max_per_ip, Some(4));
        assert_eq!(args.max_connections, Some(500));
        assert_eq!(
            (args.max_startups, args.ipv4_prefix, args.ipv6_prefix),
            (Some(100), Some(22), Some(56))
        );
        assert_eq!(args.login_timeout, Some(20));
        assert_eq!(args.idle_timeout, Some(600));
        assert_eq!(args.shutdown_grace(), Duration::from_secs(5));
        assert_eq!(args.xferlog, Some(PathBuf::from("/var/log/xferlog")));
        assert_eq!(args.metrics, Some("127.0.0.1:9898".parse().unwrap()));
        assert_eq!(args.log_format, Some(LogFormat::Json));
        assert!(args.background);
        assert_eq!(args.uplink, Some(12_000_000));
        assert_eq!(parse("uplink = 1000\n").unwrap().uplink, Some(1000));
        assert_eq!(args.compress, Some(braid_proto::compress::Policy::Off));
        assert!(parse("compress = \"zstd\"\n").is_err());
    }

    #[test]
    fn login_limits_default_from_the_connection_cap_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let with = |text: &str| {
            let mut args = parse(text).unwrap();
            args.root = Some(dir.path().to_path_buf());
            args.config(None)
        };
        let c = with("max-connections = 1000\n").unwrap();
        assert_eq!(c.max_startups, 250);
        assert_eq!(
            (c.ranges.v4, c.ranges.v6),
            (24, 48),
            "IPv6 by site, not by /64"
        );
        let e = with("max-connections = 10\nmax-startups = 11\n").unwrap_err();
        assert!(e.to_string().contains("--max-startups 11"), "{e}");
        let e = with("ipv6-prefix = 8\n").unwrap_err();
        assert!(e.to_string().contains("ipv6-prefix"), "{e}");
    }

    #[test]
    fn errors_name_the_line_and_the_key() {
        let e = parse("root = \"/srv\"\n\nlisten-on = \"0.0.0.0:21\"\n").unwrap_err();
        assert!(e.starts_with("line 3: ") && e.contains("listen-on"), "{e}");
        let e = parse("max-per-ip = \"four\"\n").unwrap_err();
        assert!(e.starts_with("line 1: "), "{e}");
        let e = parse("anonymous = true\npassive-ports = \"9-1\"\n").unwrap_err();
        assert!(
            e.starts_with("line 2: ") && e.contains("LOW <= HIGH"),
            "{e}"
        );
        // The command line's own option has no place in the file.
        let e = parse("config = \"other.toml\"\n").unwrap_err();
        assert!(e.starts_with("line 1: ") && e.contains("config"), "{e}");
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        let file = parse("max-per-ip = 4\nidle-timeout = 60\nanonymous = true\n").unwrap();
        let cli = ServeArgs {
            max_per_ip: Some(8),
            ..ServeArgs::default()
        };
        let both = cli.over(file);
        assert_eq!(both.max_per_ip, Some(8));
        assert_eq!(both.idle_timeout, Some(60));
        assert!(both.anonymous);
        assert_eq!(both.listen(), "127.0.0.1:2121".parse().unwrap());
    }

    #[test]
    fn relative_paths_in_the_file_are_from_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("braid.toml");
        std::fs::write(&path, "root = \"files\"\nusers = \"/etc/braid/users\"\n").unwrap();
        let args = load(&path).unwrap();
        assert_eq!(args.root, Some(dir.path().join("files")));
        assert_eq!(args.users, Some(PathBuf::from("/etc/braid/users")));
        let e = load(&dir.path().join("missing.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("missing.toml"), "{e:#}");
    }
}
