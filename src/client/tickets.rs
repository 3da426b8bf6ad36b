//! Where the client keeps TLS sessions to resume: like rustls's own in-memory cache, with room
//! for as many tickets as it opens data connections at once. rustls keeps 8 per server, so the
//! 9th of 16 parallel connections would pay a full handshake (certificate check included).

use rustls::NamedGroup;
use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::ServerName;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Tickets kept per server; a ticket is used once (RFC 8446, section C.4).
const PER_SERVER: usize = 64;

/// Servers remembered: a client process talks to one or a few.
const SERVERS: usize = 16;

#[derive(Debug, Default)]
pub struct Tickets {
    servers: Mutex<HashMap<ServerName<'static>, Server>>,
}

#[derive(Debug, Default)]
struct Server {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    /// Oldest first.
    tls13: VecDeque<Tls13ClientSessionValue>,
}

impl Tickets {
    fn with<T>(&self, name: &ServerName<'_>, f: impl FnOnce(&mut Server) -> T) -> Option<T> {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        servers.get_mut(&name.to_owned()).map(f)
    }

    fn with_new<T>(&self, name: ServerName<'static>, f: impl FnOnce(&mut Server) -> T) -> T {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        if !servers.contains_key(&name)
            && servers.len() >= SERVERS
            && let Some(any) = servers.keys().next().cloned()
        {
            servers.remove(&any);
        }
        f(servers.entry(name).or_default())
    }
}

impl ClientSessionStore for Tickets {
    fn set_kx_hint(&self, name: ServerName<'static>, group: NamedGroup) {
        self.with_new(name, |s| s.kx_hint = Some(group));
    }

    fn kx_hint(&self, name: &ServerName<'_>) -> Option<NamedGroup> {
        self.with(name, |s| s.kx_hint).flatten()
    }

    fn set_tls12_session(&self, name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.with_new(name, |s| s.tls12 = Some(value));
    }

    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.with(name, |s| s.tls12.clone()).flatten()
    }

    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.with(name, |s| s.tls12 = None);
    }

    fn insert_tls13_ticket(&self, name: ServerName<'static>, value: Tls13ClientSessionValue) {
        self.with_new(name, |s| {
            if s.tls13.len() >= PER_SERVER {
                s.tls13.pop_front();
            }
            s.tls13.push_back(value);
        });
    }

    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.with(name, |s| s.tls13.pop_back()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rustls::client::ClientSessionStore;

    fn name(host: &str) -> ServerName<'static> {
        ServerName::try_from(host.to_string()).unwrap()
    }

    #[test]
    fn hints_are_kept_per_server_and_the_oldest_server_goes_past_the_limit() {
        let t = Tickets::default();
        t.set_kx_hint(name("a.example"), NamedGroup::X25519);
        assert_eq!(t.kx_hint(&name("a.example")), Some(NamedGroup::X25519));
        assert_eq!(t.kx_hint(&name("b.example")), None);
        for i in 0..SERVERS + 4 {
            t.set_kx_hint(name(&format!("s{i}.example")), NamedGroup::secp256r1);
        }
        let kept = t.servers.lock().unwrap().len();
        assert_eq!(kept, SERVERS, "bounded memory whatever the servers");
    }
}
