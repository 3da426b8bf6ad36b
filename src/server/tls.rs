//! TLS for `braid serve` (RFC 4217, explicit FTPS): the certificate and key a server presents,
//! and how a stream-mode data connection is tied to its control connection.

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ProducesTickets;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    /// Each session keeps its own tickets, each good once, so that its MODE E data
    /// connections may send 0-RTT data (`serve --stdio`, whose only client is braid's).
    zero_rtt: bool,
}

impl Tls {
    pub fn load(cert: &Path, key: &Path, reuse_required: bool, data_required: bool) -> Result<Tls> {
        let config = server_config(cert, key)?;
        Ok(Tls::over(&config, reuse_required, data_required))
    }

    /// A certificate made now for this process alone (`serve --stdio`): its client learns it
    /// over ssh's channel and accepts no other. Data must be private, and resume the session.
    /// Also its SHA-256, as the client pins it.
    pub fn made_now() -> Result<(Tls, [u8; 32])> {
        use crate::engine::tls::{ONE_SHOT_NAME, fingerprint};
        let made = rcgen::generate_simple_self_signed(vec![ONE_SHOT_NAME.to_string()])
            .context("making a certificate")?;
        let der = made.cert.der().clone();
        let digest = fingerprint(&der);
        let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
            .map_err(|e| anyhow::anyhow!("the key just made: {e}"))?;
        let config = config_for(vec![der], key)?;
        let tls = Tls {
            zero_rtt: true,
            ..Tls::over(&config, true, true)
        };
        Ok((tls, digest))
    }

    fn over(config: &rustls::ServerConfig, reuse_required: bool, data_required: bool) -> Tls {
        let mut base = config.clone();
        // Resumption by ticket only, so that every resumed session says whose it was (TLS 1.2
        // session ids would not).
        base.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Tls {
            base: Arc::new(base),
            reuse_required,
            data_required,
            zero_rtt: false,
        }
    }

    /// The TLS of a new control connection from `ip`.
    pub fn session(&self, ip: IpAddr) -> SessionTls {
        let holder = Holder::new(ip);
        let mut control = (*self.base).clone();
        if self.zero_rtt {
            // rustls lets a resumption carry early data only from a ticket the server
            // stored (RFC 8446 8.1), which its memory gives up when used: a replayed
            // ClientHello finds its ticket gone, and its 0-RTT data is turned down.
            control.ticketer = Arc::new(NoTickets);
            control.session_storage =
                rustls::server::ServerSessionMemoryCache::new(SESSION_TICKETS);
            control.max_early_data_size = crate::engine::tls::EARLY_DATA;
        } else {
            control.ticketer =
                Arc::new(MarkedTickets::new(self.base.ticketer.clone(), holder.mark));
        }
        SessionTls {
            control: Arc::new(control),
            ticket_keys: self.base.ticketer.clone(),
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
    /// The server's ticket keys, which a stream-mode connection's ticketer opens tickets with.
    ticket_keys: Arc<dyn ProducesTickets>,
    holder: Arc<Holder>,
    reuse_required: bool,
}

impl SessionTls {
    /// What the control connection seals in its tickets (`set_resumption_data`, set before
    /// its handshake): a MODE E data connection resuming one is this session's at once.
    /// The same mark as `MarkedTickets` seals, which stream-mode connections need (rustls
    /// gives resumption data back only under TLS 1.3), but read per connection: the mark
    /// `MarkedTickets` records belongs to a configuration, which a session's parallel MODE E
    /// connections share.
    pub fn ticket_mark(&self) -> crate::engine::tls::TicketMark {
        self.holder.mark.to_be_bytes()
    }

    /// After login: whose session this is, for data connections that resume it. Anonymous
    /// sessions count as one account: anyone who can log in anonymously from the same address
    /// could as well transfer that file themselves.
    pub fn logged_in(&self, account: &str) {
        holders().logged_in(self.holder.mark, account);
    }

    /// A stream-mode (PROT P) data connection's TLS: no session tickets after the handshake.
    /// An uploader never reads its data connection, and bytes it leaves unread when it closes
    /// make its kernel answer with RST, which throws away the tail of the upload still in
    /// flight (rclone's Go TLS and C-Kermit's OpenSSL both lost files so).
    pub fn stream_data(&self) -> StreamDataTls {
        let tickets = Arc::new(MarkedTickets::new(
            self.ticket_keys.clone(),
            self.holder.mark,
        ));
        // The control connection's settings, its tickets opened by a ticketer of this
        // connection's own, which records the mark it found (a session that keeps its
        // tickets itself, `Tls::zero_rtt`, has no ticketer: they come from its store).
        let mut config = (*self.control).clone();
        if config.ticketer.enabled() {
            config.ticketer = tickets.clone();
        }
        config.send_tls13_tickets = 0;
        config.max_tls13_tickets = 0;
        config.max_early_data_size = 0;
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
        // Under TLS 1.3 the session says whose it was; a TLS 1.2 ticket, when opened.
        let sealed = data
            .received_resumption_data()
            .and_then(|d| <[u8; 8]>::try_from(d).ok())
            .map(u64::from_be_bytes);
        let Some(mark) = sealed.or(*lock(&self.tickets.opened)) else {
            return Err("the data connection resumed a TLS session without a ticket");
        };
        if mark == own.mark {
            return Ok(());
        }
        // The ticket may come from a control connection still logging in: a client that
        // shares one ticket cache among its connections (rclone) stores a new connection's
        // ticket before that connection's login is answered.
        let deadline = Instant::now() + LOGIN_WAIT;
        loop {
            match holders().same_login(own.mark, mark) {
                Some(true) => return Ok(()),
                Some(false) => break,
                None if Instant::now() < deadline => std::thread::sleep(LOGIN_POLL),
                None => break,
            }
        }
        Err("the data connection resumed the TLS session of another login")
    }
}

/// How long a data connection waits for the login of the control connection whose session it
/// resumed, and how often it looks.
const LOGIN_WAIT: Duration = Duration::from_secs(3);
const LOGIN_POLL: Duration = Duration::from_millis(5);

/// How long, and how many, ended logins are remembered: a client may resume the session of a
/// control connection it has since closed.
const ENDED_KEPT: Duration = Duration::from_secs(3600);
const ENDED_MOST: usize = 10_000;

/// A control connection's TLS session, known by a mark unique in this process.
#[derive(Debug)]
struct Holder {
    mark: u64,
}

impl Holder {
    fn new(ip: IpAddr) -> Holder {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mark = NEXT.fetch_add(1, Ordering::Relaxed);
        holders().started(mark, ip);
        Holder { mark }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        holders().ended(self.mark, Instant::now());
    }
}

/// The control connections under TLS by mark: address, account once logged in, and when the
/// connection ended (kept a while after, if it had logged in).
#[derive(Debug, Default)]
struct Holders {
    by_mark: HashMap<u64, (IpAddr, Option<String>)>,
    /// Ended logins, oldest first.
    ended: VecDeque<(Instant, u64)>,
}

impl Holders {
    fn started(&mut self, mark: u64, ip: IpAddr) {
        self.by_mark.insert(mark, (ip, None));
    }

    fn logged_in(&mut self, mark: u64, account: &str) {
        if let Some(h) = self.by_mark.get_mut(&mark) {
            h.1 = Some(account.to_owned());
        }
    }

    fn ended(&mut self, mark: u64, now: Instant) {
        match self.by_mark.get(&mark) {
            Some((_, Some(_))) => self.ended.push_back((now, mark)),
            _ => {
                self.by_mark.remove(&mark);
            }
        }
        while let Some(&(at, old)) = self.ended.front() {
            if now.duration_since(at) < ENDED_KEPT && self.ended.len() <= ENDED_MOST {
                break;
            }
            self.ended.pop_front();
            self.by_mark.remove(&old);
        }
    }

    /// Whether the logins behind two marks are of the same account from the same address:
    /// `None` while the second has not logged in yet (undecided).
    fn same_login(&self, own: u64, theirs: u64) -> Option<bool> {
        match (self.by_mark.get(&own), self.by_mark.get(&theirs)) {
            (Some((ip, Some(user))), Some((their_ip, Some(their_user)))) => {
                Some(ip == their_ip && user == their_user)
            }
            (Some((ip, Some(_))), Some((their_ip, None))) if ip == their_ip => None,
            _ => Some(false),
        }
    }
}

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

/// No stateless tickets: rustls then issues tickets from its session store.
#[derive(Debug)]
struct NoTickets;

impl ProducesTickets for NoTickets {
    fn enabled(&self) -> bool {
        false
    }

    fn lifetime(&self) -> u32 {
        0
    }

    fn encrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn decrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// Tickets a session keeps: what its client asks for on the control connection and one for
/// each data connection since, with room to spare.
const SESSION_TICKETS: usize = 256;

/// The SHA-256 of the first certificate in a PEM file: what a front end pins its data nodes
/// to (they show the same certificate).
pub fn fingerprint_of(cert: &Path) -> Result<[u8; 32]> {
    let first = CertificateDer::pem_file_iter(cert)
        .ok()
        .and_then(|mut certs| certs.next())
        .and_then(|c| c.ok())
        .with_context(|| format!("no PEM certificate in {}", cert.display()))?;
    Ok(crate::engine::tls::fingerprint(&first))
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
    config_for(chain, key)
}

fn config_for(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>> {
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
    // A MODE E data connection that resumed its own session's ticket is sent to from the
    // server's first flight (engine::tls). Control and stream-mode connections complete
    // their handshakes before anything is written, so this changes nothing for them.
    config.send_half_rtt_data = true;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 1));
    const THERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 2));

    #[test]
    fn a_session_lends_itself_only_to_the_same_account_from_the_same_address() {
        let mut h = Holders::default();
        for (mark, ip) in [(1, HERE), (2, HERE), (3, HERE), (4, THERE), (5, HERE)] {
            h.started(mark, ip);
        }
        h.logged_in(1, "alice");
        h.logged_in(2, "alice");
        h.logged_in(3, "bob");
        h.logged_in(4, "alice");
        assert_eq!(h.same_login(1, 2), Some(true));
        assert_eq!(h.same_login(1, 3), Some(false), "another account");
        assert_eq!(h.same_login(1, 4), Some(false), "another address");
        assert_eq!(h.same_login(1, 5), None, "still logging in: wait");
        assert_eq!(h.same_login(1, 99), Some(false), "no such session");
        // Not logged in itself: nobody's session is its own.
        assert_eq!(h.same_login(5, 1), Some(false));
        // A login that ended is remembered a while; one that never logged in is not.
        let now = Instant::now();
        h.ended(2, now);
        h.ended(5, now);
        assert_eq!(h.same_login(1, 2), Some(true));
        assert!(!h.by_mark.contains_key(&5));
        h.ended(3, now + ENDED_KEPT + Duration::from_secs(1));
        assert_eq!(
            h.same_login(1, 2),
            Some(false),
            "forgotten after ENDED_KEPT"
        );
    }

    #[test]
    fn ended_logins_are_bounded() {
        let mut h = Holders::default();
        let now = Instant::now();
        for mark in 0..(ENDED_MOST as u64 + 50) {
            h.started(mark, HERE);
            h.logged_in(mark, "anonymous");
            h.ended(mark, now);
        }
        assert!(h.by_mark.len() <= ENDED_MOST + 1, "{}", h.by_mark.len());
    }
}
