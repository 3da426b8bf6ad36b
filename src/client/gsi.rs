//! GSI on the control connection (`gsiftp://`, RFC 2228 with the Globus GSS mechanism): the
//! security context is a TLS handshake whose records travel base64-encoded in ADAT commands
//! and their 335/235 replies, followed by one byte of application data saying whether the
//! client delegates a credential (`D`: the server then sends a certificate request, and the
//! client answers with the proxy it signed; `0`: no delegation). Every later command goes as
//! `ENC <base64 TLS record>`, every reply comes back as `632`/`633` lines carrying the
//! plain reply. Pure: bytes and lines in, bytes and lines out; the socket is the caller's.

use super::error::{ClientError, Result};
use crate::engine::gsi_tokens::{self, TokenError};
use std::io::Write;

/// The security context being set up, or set up.
pub struct Gsi {
    tls: rustls::ClientConnection,
    host: String,
    /// Delegate a proxy of this credential to the server; None: delegate nothing.
    delegate: Option<std::sync::Arc<rustls::sign::CertifiedKey>>,
    /// The delegation byte has gone.
    flag_sent: bool,
    /// The server's certificate request (delegation), as far as it came.
    request: Vec<u8>,
    /// The proxy went: the context is complete once the server says 235.
    proxy_sent: bool,
}

impl Gsi {
    /// A context with the server `host` (checked against its certificate by `config`),
    /// delegating a proxy of `delegate` where given.
    pub fn new(
        config: &std::sync::Arc<rustls::ClientConfig>,
        host: &str,
        delegate: Option<std::sync::Arc<rustls::sign::CertifiedKey>>,
    ) -> Result<Gsi> {
        Ok(Gsi {
            tls: super::wire::client_conn(config, host)?,
            host: host.to_string(),
            delegate,
            flag_sent: false,
            request: Vec::new(),
            proxy_sent: false,
        })
    }

    /// The next ADAT argument, after the server's last token was taken ([`Gsi::take`]):
    /// handshake records, then, once the handshake is done, the delegation byte.
    pub fn next_token(&mut self) -> Result<String> {
        if !self.tls.is_handshaking() && !self.flag_sent {
            // `D`: the server sends a certificate request next; `0`: no delegation.
            let flag = if self.delegate.is_some() { b"D" } else { b"0" };
            self.tls
                .writer()
                .write_all(flag)
                .map_err(|e| failed(&e.to_string()))?;
            self.flag_sent = true;
        } else if let Some(cred) = &self.delegate
            && self.flag_sent
            && !self.proxy_sent
            && !self.request.is_empty()
        {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let issuer = cred
                .cert
                .first()
                .ok_or_else(|| failed("delegation: the credential has no certificate"))?;
            let proxy =
                super::gsi_proxy::sign_request(&self.request, issuer, cred.key.as_ref(), now)
                    .map_err(|e| failed(&format!("delegation: {e}")))?;
            self.tls
                .writer()
                .write_all(&proxy)
                .map_err(|e| failed(&e.to_string()))?;
            self.proxy_sent = true;
        }
        let token = gsi_tokens::give(&mut self.tls).map_err(|e| failed(&e.to_string()))?;
        if token.is_empty() {
            return Err(failed("the handshake stalled with nothing to send"));
        }
        Ok(token)
    }

    /// Takes the token of a 335 or 235 reply (`ADAT=<base64>`), if it has one.
    pub fn take(&mut self, reply_text: &str) -> Result<()> {
        let Some(token) = reply_text.split("ADAT=").nth(1) else {
            return Ok(());
        };
        self.incoming(token)?;
        // Application data now is the certificate request of a delegation.
        let data = gsi_tokens::plain(&mut self.tls).map_err(|e| failed(&e.to_string()))?;
        if self.delegate.is_some() && self.flag_sent && !self.proxy_sent {
            self.request.extend(data);
        }
        Ok(())
    }

    /// Whether the context is complete from this side (the server says so with 235).
    pub fn complete(&self) -> bool {
        self.flag_sent && !self.tls.is_handshaking() && (self.delegate.is_none() || self.proxy_sent)
    }

    /// `line` (a command with its CRLF) as the `ENC` line that carries it.
    pub fn wrap(&mut self, line: &[u8]) -> Result<Vec<u8>> {
        self.tls
            .writer()
            .write_all(line)
            .map_err(|e| failed(&e.to_string()))?;
        let mut out = b"ENC ".to_vec();
        let token = gsi_tokens::give(&mut self.tls).map_err(|e| failed(&e.to_string()))?;
        out.extend_from_slice(token.as_bytes());
        out.extend_from_slice(b"\r\n");
        Ok(out)
    }

    /// A reply line as the server sent it (without its CRLF): the plain reply bytes it
    /// carries (a `631`/`632`/`633` line), or the line itself with its CRLF when it came
    /// unprotected (a server refusing a command it could not unwrap).
    pub fn unwrap(&mut self, line: &[u8]) -> Result<Vec<u8>> {
        let wrapped = line.len() > 4
            && matches!(&line[..3], b"631" | b"632" | b"633")
            && matches!(line[3], b' ' | b'-');
        if !wrapped {
            let mut plain = line.to_vec();
            plain.extend_from_slice(b"\r\n");
            return Ok(plain);
        }
        let token = std::str::from_utf8(&line[4..])
            .map_err(|_| failed("a protected reply is not base64"))?;
        self.incoming(token)?;
        gsi_tokens::plain(&mut self.tls).map_err(|e| failed(&e.to_string()))
    }

    /// Feeds one base64 token of the server's to TLS.
    fn incoming(&mut self, token: &str) -> Result<()> {
        gsi_tokens::take(&mut self.tls, token).map_err(|e| match e {
            TokenError::Tls(e) => refused(&self.host, e),
            e => failed(&e.to_string()),
        })
    }
}

/// A handshake TLS ended, in words with the fix.
fn refused(host: &str, e: rustls::Error) -> ClientError {
    let why = match &e {
        rustls::Error::InvalidCertificate(c) => format!(
            "{host}'s certificate was refused ({c:?}): the CA that signed it must be in the \
             trusted directory (X509_CERT_DIR, else ~/.globus/certificates or \
             /etc/grid-security/certificates), and the certificate must name {host} (in its \
             subjectAltName, or as its Common Name host/{host}): connect by that name"
        ),
        rustls::Error::AlertReceived(a) => format!(
            "{host} refused the handshake ({a:?}): check that it trusts the CA of your \
             credential and that the credential has not expired"
        ),
        e => e.to_string(),
    };
    failed(&why)
}

fn failed(why: &str) -> ClientError {
    ClientError::Tls(format!("GSI security context: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as B64;
    use std::io::Read;
    use std::path::Path;
    use std::sync::Arc;

    /// A TLS 1.2 server in memory standing for the GridFTP server's side of the context.
    fn server() -> (rustls::ServerConnection, Arc<rustls::ClientConfig>) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = made.cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (
            rustls::ServerConnection::new(Arc::new(server)).unwrap(),
            Arc::new(client),
        )
    }

    /// Feeds base64 `token` to `s`; what `s` sends back, in base64.
    fn answer(s: &mut rustls::ServerConnection, token: &str) -> String {
        let bytes = B64.decode(token).unwrap();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            s.read_tls(&mut rest).unwrap();
            s.process_new_packets().unwrap();
        }
        let mut out = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut out).unwrap();
        }
        B64.encode(out)
    }

    #[test]
    fn the_context_goes_in_adat_tokens_and_then_every_line_is_wrapped() {
        let (mut s, config) = server();
        let mut gsi = Gsi::new(&config, "localhost", None).unwrap();
        let mut rounds = 0;
        while !gsi.complete() {
            let token = gsi.next_token().unwrap();
            let back = answer(&mut s, &token);
            gsi.take(&format!("ADAT={back}")).unwrap();
            rounds += 1;
            assert!(rounds < 5, "the handshake does not end");
        }
        // The last token carried the delegation byte: none asked for.
        let mut flag = Vec::new();
        let _ = s.reader().read_to_end(&mut flag);
        assert_eq!(flag, b"0");
        assert!(!s.is_handshaking());

        let line = gsi.wrap(b"PWD\r\n").unwrap();
        let text = String::from_utf8(line).unwrap();
        let token = text
            .strip_prefix("ENC ")
            .and_then(|t| t.strip_suffix("\r\n"))
            .unwrap();
        answer(&mut s, token);
        let mut command = Vec::new();
        let _ = s.reader().read_to_end(&mut command);
        assert_eq!(command, b"PWD\r\n");

        s.writer().write_all(b"257 \"/home\"\r\n").unwrap();
        let reply = answer(&mut s, "");
        let plain = gsi.unwrap(format!("633 {reply}").as_bytes()).unwrap();
        assert_eq!(plain, b"257 \"/home\"\r\n");
        // A reply the server could not protect passes as it is.
        assert_eq!(gsi.unwrap(b"500 what?").unwrap(), b"500 what?\r\n");
        assert!(gsi.unwrap(b"633 not base64!").is_err());
    }

    /// braid's two halves meet in memory: the server's context (`server::gsi`) takes the
    /// client's handshake and delegation byte, asks for a proxy, gets one for the key it
    /// made, names the user as grid-mapfiles do; then commands and replies (a multi-line one
    /// too) go wrapped both ways.
    #[test]
    fn braids_server_context_takes_the_client_and_the_proxy_it_delegates() {
        use crate::engine::gsi_data::test_grid::{Ca, credential};
        use crate::server::gsi::{GsiHost, Step};
        let ca = Ca::new();
        let (host, host_key) = ca.sign("host/localhost");
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(host_key.serialize_der().into());
        let host = GsiHost::with(vec![host.der().clone()], key, ca.roots(), Path::new("")).unwrap();
        let alice = credential(&ca, "alice");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
            ca.roots(),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(super::super::trust::Verifier::grid(webpki)))
            .with_client_cert_resolver(Arc::new(crate::engine::gsi_data::Credential(
                alice.clone(),
            )));
        let mut gsi = Gsi::new(&Arc::new(config), "localhost", Some(alice.clone())).unwrap();
        let mut server = host.accepting().unwrap();
        for round in 0.. {
            assert!(round < 6, "the context does not end");
            match server.step(&gsi.next_token().unwrap()).unwrap() {
                Step::More(token) => gsi.take(&format!("ADAT={token}")).unwrap(),
                Step::Done(last) => {
                    if let Some(token) = last {
                        gsi.take(&format!("ADAT={token}")).unwrap();
                    }
                    break;
                }
            }
        }
        assert!(gsi.complete());
        let context = server.established().unwrap();
        assert_eq!(context.subject, "/CN=alice");
        let proxy = context.delegated.expect("a delegated proxy");
        assert_eq!(proxy.cert.len(), 2, "the proxy, then alice's certificate");
        assert_eq!(
            crate::engine::gsi_data::user_subject(&proxy.cert).unwrap(),
            crate::engine::gsi_data::user_subject(&alice.cert).unwrap()
        );
        crate::engine::gsi_data::GsiData::new(proxy, ca.roots()).unwrap();

        let mut lines = context.lines;
        let wrapped = gsi.wrap(b"CWD /data\r\n").unwrap();
        let command = lines
            .unwrap(&wrapped[..wrapped.len() - 2])
            .unwrap()
            .unwrap();
        assert_eq!(command, b"CWD /data");
        assert!(
            lines.unwrap(b"CWD /elsewhere").is_none(),
            "an unprotected line passed"
        );
        let reply = lines
            .wrap(b"211-Features:\r\n DCAU\r\n211 End\r\n")
            .unwrap();
        let reply = String::from_utf8(reply).unwrap();
        let sent: Vec<&str> = reply.lines().collect();
        assert_eq!(sent.len(), 3, "{reply}");
        assert!(
            sent[0].starts_with("632-") && sent[2].starts_with("632 "),
            "{reply}"
        );
        let mut plain = Vec::new();
        for line in sent {
            plain.extend(gsi.unwrap(line.as_bytes()).unwrap());
        }
        assert_eq!(plain, b"211-Features:\r\n DCAU\r\n211 End\r\n");
    }
}
