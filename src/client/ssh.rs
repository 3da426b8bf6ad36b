//! Sessions over ssh (`braid cp`): the user's own ssh starts `braid serve --stdio` on the far
//! side, whose control dialogue then runs over ssh's channel, already authenticated and
//! encrypted; data connections go to the machine ssh reached.

use super::control::Control;
use super::error::{ClientError, Result};
use std::net::{IpAddr, ToSocketAddrs};
use std::process::Command;
use std::time::Duration;

/// How to reach the far side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ssh {
    /// The remote shell and its options (`-e`), split on spaces: `ssh` by default.
    pub program: Vec<String>,
    /// ssh's destination as typed: `host` or `user@host`.
    pub destination: String,
    /// The braid to run there (`--remote-braid`).
    pub remote_braid: String,
    /// A private directory for OpenSSH's connection sharing: a transfer's further sessions (a
    /// tree's workers, segments) ride the first one's connection instead of each logging in
    /// again. None for a remote shell that is not OpenSSH's.
    pub shared_connection: Option<std::path::PathBuf>,
    /// Where data connections go: the machine ssh reaches (see [`Ssh::data_host`]), found once
    /// for all of a transfer's sessions.
    pub data_host: IpAddr,
    /// The way through ssh's shared connection for data connections that cannot reach
    /// `data_host`, one for all of a transfer's sessions; None without connection sharing.
    pub detour: Option<std::sync::Arc<super::detour::Detour>>,
}

impl Ssh {
    /// The command line that starts the far side.
    pub fn command(&self) -> Command {
        let mut c = Command::new(self.shell());
        c.args(self.program.iter().skip(1));
        if let Some(dir) = &self.shared_connection {
            // After the user's own options, which win. The master lingers a second after its
            // last session, so a session that ends early cannot take the others with it.
            c.args(["-o", "ControlMaster=auto", "-o"])
                .arg(format!("ControlPath={}", control_path(dir)))
                .args(["-o", "ControlPersist=1"]);
        }
        c.arg(&self.destination)
            .args([self.remote_braid.as_str(), "serve", "--stdio"]);
        c
    }

    /// The remote shell's program: ssh unless told.
    fn shell(&self) -> &str {
        self.program.first().map_or("ssh", String::as_str)
    }

    /// What starts the far side, as the user would type it (for errors).
    fn shown(&self) -> String {
        format!(
            "{} {} {} serve --stdio",
            self.program.join(" "),
            self.destination,
            self.remote_braid
        )
    }

    /// A session with the far side.
    pub fn session(&self) -> Result<Control> {
        let said = super::channel::Said::default();
        let mut c = Control::over_child(self.command(), self.data_host, &self.shown(), &said)
            .map_err(|e| self.explain(e, &said))?;
        c.set_detour(self.detour.clone());
        // The greeting came over ssh's authenticated channel: the certificate it names is the
        // far side's, and TLS with it protects every data connection, bound to this session.
        let Some(digest) = c.pinned_certificate() else {
            return Err(ClientError::Protocol(format!(
                "the braid on {} names no certificate in its greeting: it is older than this \
                 one and cannot encrypt braid cp's data; install the same version there",
                self.destination
            )));
        };
        let config = super::wire::pinned_config(digest)
            .map_err(|e| ClientError::Tls(format!("TLS setup: {e:#}")))?;
        c.start_tls(&config, crate::engine::tls::ONE_SHOT_NAME)?;
        Ok(c)
    }

    /// Where data connections go: the host's address, or, for a name only ssh's
    /// configuration knows (a `Host` alias), the `HostName` that `ssh -G` gives for it, with the
    /// options of `-e` (an `-F FILE` names the configuration that knows the alias).
    pub fn data_host(program: &[String], host: &str) -> Result<IpAddr> {
        if let Some(ip) = resolve(host) {
            return Ok(ip);
        }
        let (shell, options) = program
            .split_first()
            .map_or(("ssh", &[][..]), |(s, o)| (s.as_str(), o));
        let configured = Command::new(shell)
            .args(options)
            .arg("-G")
            .arg(host)
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .find_map(|l| l.strip_prefix("hostname ").map(str::to_string))
            });
        configured.as_deref().and_then(resolve).ok_or_else(|| {
            ClientError::Usage(format!(
                "cannot find the address of {host} for the data connections (neither DNS nor \
                 `ssh -G {host}` gives one)"
            ))
        })
    }

    /// A far side that did not greet: most often braid is not installed there, or one too
    /// old to serve over ssh; what it said tells which.
    fn explain(&self, e: ClientError, said: &super::channel::Said) -> ClientError {
        let ClientError::Protocol(_) = e else {
            return e;
        };
        let words = said.last(Duration::from_secs(2));
        let why = match words.as_str() {
            w if w.contains("--stdio") => format!(
                "the braid there is older than this one ({}) and cannot serve over ssh \
                 (it has no `serve --stdio`): install this version there, or name a newer \
                 one with --remote-braid PATH",
                env!("CARGO_PKG_VERSION")
            ),
            w if w.contains("not found") || w.contains("No such file") => format!(
                "{} is not there, or not on the PATH ssh gives commands: install braid \
                 there, or name it with --remote-braid PATH",
                self.remote_braid
            ),
            _ => "can ssh reach it, and is braid installed there, on the PATH ssh gives \
                  commands? Install it, or name it with --remote-braid PATH"
                .to_string(),
        };
        ClientError::Protocol(format!(
            "`{}` did not start a braid session on {} (its own words, if any, are above): {why}",
            self.shown(),
            self.destination
        ))
    }
}

/// The socket of the connection ssh shares, in the private directory `dir`: one per
/// destination (`%C` hashes the host, port and user).
pub fn control_path(dir: &std::path::Path) -> String {
    format!("{}/%C", dir.display())
}

fn resolve(host: &str) -> Option<IpAddr> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    (bare, 0).to_socket_addrs().ok()?.next().map(|a| a.ip())
}

/// A `[user@]host:path` argument in scp's syntax: (ssh's destination, the host, the path);
/// None for a local path (no `:` before the first `/`, or an ftp:// URL).
pub fn parse_remote(arg: &str) -> Option<(String, String, String)> {
    if super::url::is_url(arg) {
        return None;
    }
    let (user, rest) = match arg.split_once('@') {
        Some((u, r)) if !u.is_empty() && !u.contains(['/', ':']) => (Some(u), r),
        _ => (None, arg),
    };
    let (host, shown, path) = match rest.strip_prefix('[') {
        Some(r) => {
            let (h, after) = r.split_once(']')?;
            (h, format!("[{h}]"), after.strip_prefix(':')?)
        }
        None => {
            let colon = rest.find(':')?;
            let h = &rest[..colon];
            if h.contains('/') {
                return None;
            }
            (h, h.to_string(), &rest[colon + 1..])
        }
    };
    if host.is_empty() {
        return None;
    }
    let destination = user.map_or(shown.clone(), |u| format!("{u}@{shown}"));
    // The far side starts in the home directory: `~/f` is `f` there, as scp takes it.
    let path = match path {
        "~" => "",
        p => p.strip_prefix("~/").unwrap_or(p),
    };
    Some((destination, host.to_string(), path.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scp_arguments_are_told_from_local_paths() {
        let remote = |a: &str| parse_remote(a);
        assert_eq!(
            remote("ann@box:data/f.bin"),
            Some(("ann@box".into(), "box".into(), "data/f.bin".into()))
        );
        assert_eq!(
            remote("box:/srv/f"),
            Some(("box".into(), "box".into(), "/srv/f".into()))
        );
        // The home directory itself, and paths from it.
        assert_eq!(
            remote("box:"),
            Some(("box".into(), "box".into(), "".into()))
        );
        assert_eq!(
            remote("box:~"),
            Some(("box".into(), "box".into(), "".into()))
        );
        assert_eq!(
            remote("box:~/d/f"),
            Some(("box".into(), "box".into(), "d/f".into()))
        );
        assert_eq!(
            remote("[::1]:f"),
            Some(("[::1]".into(), "::1".into(), "f".into()))
        );
        assert_eq!(
            remote("ann@[::1]:f"),
            Some(("ann@[::1]".into(), "::1".into(), "f".into()))
        );
        // A colon after a slash is part of a local name; so is one with nothing before it.
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("dir/a:b"), None);
        assert_eq!(remote("dir/a@b:c"), None);
        assert_eq!(remote(":f"), None);
        assert_eq!(remote("plain.txt"), None);
        assert_eq!(remote("ftp://host/f"), None);
    }

    #[test]
    fn the_far_side_is_started_with_the_users_ssh_and_options() {
        let ssh = Ssh {
            program: vec!["ssh".into(), "-p".into(), "2222".into()],
            destination: "ann@box".into(),
            remote_braid: "/opt/braid".into(),
            shared_connection: None,
            data_host: IpAddr::from([192, 0, 2, 1]),
            detour: None,
        };
        let args = |c: Command| -> Vec<String> {
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(ssh.command().get_program(), "ssh");
        assert_eq!(
            args(ssh.command()),
            ["-p", "2222", "ann@box", "/opt/braid", "serve", "--stdio"]
        );
        // Sessions sharing one connection: OpenSSH's options after the user's.
        let shared = Ssh {
            shared_connection: Some("/tmp/x".into()),
            ..ssh
        };
        let args = args(shared.command());
        assert_eq!(
            args[..9],
            [
                "-p",
                "2222",
                "-o",
                "ControlMaster=auto",
                "-o",
                "ControlPath=/tmp/x/%C",
                "-o",
                "ControlPersist=1",
                "ann@box"
            ]
        );
    }
}
