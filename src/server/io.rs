//! What the I/O side of a session keeps next to the protocol session: the root, the passive
//! listener, the data connections a transfer left open, TLS, the quota; and the file
//! operations it does for the session.

use super::Config;
use crate::engine;
use crate::engine::tls::Binding;
use crate::fsroot::Root;
use braid_proto::session::{AdatOutcome, FsError, FsOp, FsOutcome, canonical_ip};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpListener;

/// State the I/O side keeps next to the protocol session.
pub(super) struct Io {
    pub(super) config: Arc<Config>,
    pub(super) peer: SocketAddr,
    pub(super) local: SocketAddr,
    /// A one-shot session over ssh: ssh may forward data connections from this host.
    pub(super) forwarded: bool,
    pub(super) root: Option<Arc<Root>>,
    pub(super) passive: Option<TcpListener>,
    /// MODE E data connections the last transfer left open. The session records which way
    /// they carry data and when they must go (PASV, PORT, MODE); this holds only the sockets.
    pub(super) cached: Option<engine::receive::Kept>,
    /// What an anonymous user gave as password (by custom an e-mail address), which the
    /// xferlog records as the user.
    pub(super) anonymous_id: Option<String>,
    /// After AUTH TLS: what this session's TLS data connections must prove.
    pub(super) binding: Option<Binding>,
    /// After AUTH TLS: this session's TLS, for its data connections.
    pub(super) tls: Option<super::tls::SessionTls>,
    /// The account's quota, if it has one.
    pub(super) quota: Option<super::quota::Quota>,
    /// A striped front end: this session's links to the data nodes, from its first SPAS.
    pub(super) nodes: Option<Arc<std::sync::Mutex<super::stripes::Links>>>,
    /// AUTH GSSAPI's context while its ADAT tokens come.
    pub(super) gsi_context: Option<super::gsi::Accepting>,
    /// After a GSI login: who the user is.
    pub(super) gsi_user: Option<GsiUser>,
}

/// The user a GSI context proved.
pub(super) struct GsiUser {
    /// The user's name, as the grid-mapfile has it.
    pub(super) subject: String,
    /// Data connections authenticated with the delegated proxy (DCAU A); None when the
    /// client delegated none.
    pub(super) data: Option<Arc<engine::gsi_data::GsiData>>,
}

impl Io {
    pub(super) fn root(&self) -> Result<Arc<Root>, FsError> {
        self.root.clone().ok_or(FsError::PermissionDenied)
    }

    pub(super) async fn open_passive(&mut self) -> Result<SocketAddr, String> {
        self.passive = None;
        let ip = self.local.ip();
        // Random ports, so the next one cannot be guessed (RFC 2577), bound with SO_REUSEADDR
        // (tokio's default), which a port whose earlier connections linger in TIME_WAIT
        // accepts. Without a range, from all unprivileged ports as vsftpd does: the kernel's
        // own choice (port 0) searches an ephemeral range that thousands of small transfers
        // fill with TIME_WAIT, and grew slower with every file (10,000 files from lftp: 7 s,
        // then 14 s, then 25 s, then failures).
        let (lo, hi) = self.config.passive_ports.unwrap_or((1024, u16::MAX));
        let mut found = None;
        for _ in 0..64 {
            let port = rand::random_range(lo..=hi);
            if let Ok(l) = TcpListener::bind(SocketAddr::new(ip, port)).await {
                found = Some(l);
                break;
            }
        }
        let listener = match (found, self.config.passive_ports) {
            (Some(l), _) => l,
            (None, None) => TcpListener::bind(SocketAddr::new(ip, 0))
                .await
                .map_err(|e| e.to_string())?,
            (None, Some(_)) => return Err(format!("no free port in {lo}-{hi}")),
        };
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        self.passive = Some(listener);
        // A v4-mapped local address is reported as plain IPv4 for the 227 reply.
        let ip = match (canonical_ip(addr.ip()), self.config.public_address) {
            (IpAddr::V4(_), Some(public)) => IpAddr::V4(public),
            (ip, _) => ip,
        };
        Ok(SocketAddr::new(ip, addr.port()))
    }

    /// SPAS on a striped front end: every data node that answers listens for this client.
    pub(super) async fn striped_passive(&mut self) -> Result<Vec<SocketAddr>, String> {
        self.passive = None;
        let super::Striping::FrontEnd(front) = &self.config.striping else {
            return Err("this server has no data nodes".into());
        };
        let links = self
            .nodes
            .get_or_insert_with(|| {
                Arc::new(std::sync::Mutex::new(super::stripes::Links::new(
                    front.clone(),
                )))
            })
            .clone();
        tokio::task::spawn_blocking(move || {
            links.lock().unwrap_or_else(|p| p.into_inner()).passive()
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// An ADAT token for the GSI context AUTH GSSAPI began: what to answer, and once the
    /// context is complete, the wrapping of the lines that follow. The handshake's signatures
    /// and the delegation's key are made on the blocking pool, not on the control tasks'
    /// threads.
    pub(super) async fn adat(
        &mut self,
        token: String,
    ) -> (AdatOutcome, Option<super::gsi::Wrapper>) {
        let failed = |why: String| (AdatOutcome::Failed(why), None);
        let Some(host) = self.config.gsi.clone() else {
            return failed("GSI is not configured".into());
        };
        let context = match self.gsi_context.take() {
            Some(c) => c,
            None => match host.accepting() {
                Ok(c) => c,
                Err(e) => return failed(e),
            },
        };
        let stepped = tokio::task::spawn_blocking(move || {
            let mut context = context;
            let step = context.step(&token);
            (context, step)
        })
        .await;
        let (context, step) = match stepped {
            Ok(s) => s,
            Err(e) => return failed(e.to_string()),
        };
        let token = match step {
            Ok(super::gsi::Step::More(t)) => {
                self.gsi_context = Some(context);
                return (AdatOutcome::More(t), None);
            }
            Ok(super::gsi::Step::Done(t)) => t,
            Err(e) => return failed(e),
        };
        let established = match context.established() {
            Ok(e) => e,
            Err(e) => return failed(e),
        };
        let data = match established.delegated {
            Some(proxy) => match engine::gsi_data::GsiData::new(proxy, host.roots.clone()) {
                Ok(d) => Some(Arc::new(d)),
                Err(e) => return failed(format!("the delegated credential: {e}")),
            },
            None => None,
        };
        let delegated = data.is_some();
        tracing::info!(peer = %self.peer, subject = established.subject, delegated, "GSI context");
        self.gsi_user = Some(GsiUser {
            subject: established.subject,
            data,
        });
        (
            AdatOutcome::Done { token, delegated },
            Some(established.lines),
        )
    }

    pub(super) async fn fs(&self, op: FsOp) -> Result<FsOutcome, FsError> {
        let root = self.root()?;
        let sums = self.config.checksums.clone();
        // A tree's file just sent (on connections it left open) was hashed on its way.
        if self.cached.is_some()
            && let Some(known) = super::inline::known_checksum(&root, &sums, &op)
        {
            return Ok(known);
        }
        // So is its MFMT: the file was just written, so opening it and setting its time wait
        // for nothing, and a thread per MFMT made a tree of 10,000 small files take 50 % longer
        // to upload (0.61 s against 0.40 s on loopback).
        if self.cached.is_some() && matches!(op, FsOp::SetMtime(..)) {
            return super::files::fs_blocking(&root, &sums, op);
        }
        let quota = self.quota.clone();
        tokio::task::spawn_blocking(move || {
            // A deleted file gives its bytes back to the account's quota.
            let size = match (&quota, &op) {
                (Some(_), FsOp::Dele(p)) => root.stat(p).ok().map(|e| e.size),
                _ => None,
            };
            let done = super::files::fs_blocking(&root, &sums, op);
            if let (Some(q), Some(size), Ok(_)) = (&quota, size, &done) {
                q.deleted(size);
            }
            done
        })
        .await
        .unwrap_or_else(|e| Err(FsError::Other(e.to_string())))
    }
}
