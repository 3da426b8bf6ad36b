//! TLS for `braid serve` (RFC 4217, explicit FTPS): the certificate and key a server presents,
//! and how a stream-mode data connection is tied to its control connection.

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ProducesTickets;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// The server's TLS: its certificate, and what it demands of data connections.
#[derive(Debug)]
pub struct Tls {
    base: Arc<rustls::ServerConfig>,
    /// `--tls-session-reuse`: a stream-mode data connection must resume a TLS session of its
    /// own control connection (or of another one of the same account from the same address),
    /// or it gets nothing, as vsftpd's `require_ssl_reuse`.
    pub reuse_required: bool,
    /// `--tls-data`: after AUTH TLS, data connections must be private (PROT P).
    pub data_required: bool,
}

impl Tls {
    pub fn load(cert: &Path, key: &Path, reuse_required: bool, data_required: bool) -> Result<Tls> {
        let mut base = (*server_config(cert, key)?).clone();
        // Resumption by ticket only, so that every resumed session says whose it was (TLS 1.2
        // session ids would not).
        base.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(Tls {
            base: Arc::new(base),
            reuse_required,
            data_required,
        })
    }

    /// The TLS of a new control connection from `ip`.
    pub fn session(&self, ip: IpAddr) -> SessionTls {
        let holder = Holder::new(ip);
        let mut control = (*self.base).clone();
        control.ticketer = Arc::new(MarkedTickets::new(self.base.ticketer.clone(), holder.mark));
        SessionTls {
            control: Arc::new(control),
            base: self.base.clone(),
            holder: Arc::new(holder),
            reuse_required: self.reuse_required,
        }
    }
}

/// One control connection's TLS.
#[derive(Debug, Clone)]
pub struct SessionTls {
    /// The control connection, and MODE E data connections between braid peers (which prove
    /// their binding and ask for as many tickets as they open connections).
    pub control: Arc<rustls::ServerConfig>,
    base: Arc<rustls::ServerConfig>,
    holder: Arc<Holder>,
    reuse_required: bool,
}

impl SessionTls {
    /// After login: whose session this is, for data connections that resume it. Anonymous
    /// sessions count as one account: anyone who can log in anonymously from the same address
    /// could as well transfer that file themselves.
    pub fn logged_in(&self, account: &str) {
        holders().insert(self.holder.mark, (self.holder.ip, Some(account.to_owned())));
    }

    /// A stream-mode (PROT P) data connection's TLS: no session tickets after the handshake.
    /// An uploader never reads its data connection, and bytes it leaves unread when it closes
    /// make its kernel answer with RST, which throws away the tail of the upload still in
    /// flight (rclone's Go TLS and C-Kermit's OpenSSL both lost files so).
    pub fn stream_data(&self) -> StreamDataTls {
        let tickets = Arc::new(MarkedTickets::new(
            self.base.ticketer.clone(),
            self.holder.mark,
        ));
        let mut config = (*self.base).clone();
        config.ticketer = tickets.clone();
        config.send_tls13_tickets = 0;
        config.max_tls13_tickets = 0;
        StreamDataTls {
            config: Arc::new(config),
            tickets,
            session: self.clone(),
        }
    }
}

/// The TLS of one stream-mode data connection, and what its handshake resumed.
pub struct StreamDataTls {
    pub config: Arc<rustls::ServerConfig>,
    tickets: Arc<MarkedTickets>,
    session: SessionTls,
}

impl StreamDataTls {
    /// Whether the data connection, its handshake done, may carry this session's data: it
    /// resumed a session of this control connection, or of another control connection of the
    /// same account from the same address (clients such as rclone keep one ticket cache for
    /// all their connections). A stranger has no such ticket, whatever address it comes from.
    /// The error says what the connection did instead.
    pub fn admits(&self, data: &rustls::ServerConnection) -> Result<(), &'static str> {
        let own = &self.session.holder;
        if !self.session.reuse_required {
            return Ok(());
        }
        if data.handshake_kind() != Some(rustls::HandshakeKind::Resumed) {
            return Err(
                "the data connection made a new TLS session instead of resuming the \
                        control connection's",
            );
        }
        let Some(mark) = *lock(&self.tickets.opened) else {
            return Err("the data connection resumed a TLS session without a ticket");
        };
        if mark == own.mark {
            return Ok(());
        }
        let holders = holders();
        match (holders.get(&own.mark), holders.get(&mark)) {
            (Some((ip, Some(user))), Some((their_ip, Some(theirs))))
                if ip == their_ip && user == theirs =>
            {
                Ok(())
            }
            _ => Err("the data connection resumed the TLS session of another login"),
        }
    }
}

/// A control connection's TLS session, known by a mark unique in this process.
#[derive(Debug)]
struct Holder {
    mark: u64,
    ip: IpAddr,
}

impl Holder {
    fn new(ip: IpAddr) -> Holder {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mark = NEXT.fetch_add(1, Ordering::Relaxed);
        holders().insert(mark, (ip, None));
        Holder { mark, ip }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        holders().remove(&self.mark);
    }
}

/// The live control connections under TLS: mark, address and account (once logged in).
type Holders = HashMap<u64, (IpAddr, Option<String>)>;

fn holders() -> MutexGuard<'static, Holders> {
    static HOLDERS: LazyLock<Mutex<Holders>> = LazyLock::new(Default::default);
    lock(&HOLDERS)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The server's ticket keys, with the issuing control connection's mark sealed inside each
/// ticket; a ticket opened records the mark it carried.
#[derive(Debug)]
struct MarkedTickets {
    inner: Arc<dyn ProducesTickets>,
    mark: u64,
    opened: Mutex<Option<u64>>,
}

impl MarkedTickets {
    fn new(inner: Arc<dyn ProducesTickets>, mark: u64) -> MarkedTickets {
        MarkedTickets {
            inner,
            mark,
            opened: Mutex::new(None),
        }
    }
}

impl ProducesTickets for MarkedTickets {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }

    fn lifetime(&self) -> u32 {
        self.inner.lifetime()
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut marked = Vec::with_capacity(8 + plain.len());
        marked.extend_from_slice(&self.mark.to_be_bytes());
        marked.extend_from_slice(plain);
        self.inner.encrypt(&marked)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let plain = self.inner.decrypt(cipher)?;
        let (mark, rest) = plain.split_first_chunk::<8>()?;
        *lock(&self.opened) = Some(u64::from_be_bytes(*mark));
        Some(rest.to_vec())
    }
}

/// A rustls server configuration from a PEM certificate chain and a PEM private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| {
            format!(
                "cannot read a PEM certificate chain from {}",
                cert.display()
            )
        })?;
    if chain.is_empty() {
        anyhow::bail!("{} holds no PEM certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a PEM private key from {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS setup")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and the private key do not go together")?;
    // Data connections resume the control connection's session instead of each running a
    // full handshake. Stateless tickets cost the server no memory per session, and a client
    // may ask for one per data connection it means to open (RFC 9149; braid asks for
    // `engine::tls::TICKETS`).
    config.ticketer = rustls::crypto::ring::Ticketer::new().context("TLS session tickets")?;
    config.max_tls13_tickets = 64;
    Ok(Arc::new(config))
}
