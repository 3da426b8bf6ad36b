//! A client connection in clear or through TLS (explicit FTPS, RFC 4217), read and written
//! the same way.

use super::error::{ClientError, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

pub enum Wire {
    Clear(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Wire {
    /// The TCP connection underneath, for socket options and shutdown.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Wire::Clear(s) => s,
            Wire::Tls(s) => &s.sock,
        }
    }

    /// Starts TLS on `sock`, checking the server's certificate against `host`.
    pub fn tls(sock: TcpStream, config: &Arc<rustls::ClientConfig>, host: &str) -> Result<Wire> {
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| ClientError::Usage(format!("{host} cannot be checked by TLS: {e}")))?;
        let conn = rustls::ClientConnection::new(config.clone(), name)
            .map_err(|e| ClientError::Tls(format!("TLS setup: {e}")))?;
        let mut s = rustls::StreamOwned::new(conn, sock);
        // Handshake now, so a certificate problem is reported as such.
        while s.conn.is_handshaking() {
            s.conn
                .complete_io(&mut s.sock)
                .map_err(|e| ClientError::Tls(handshake_failed(host, &e)))?;
        }
        Ok(Wire::Tls(Box::new(s)))
    }

    /// Ends the data written: close_notify under TLS, then FIN.
    pub fn finish(&mut self) {
        if let Wire::Tls(s) = self {
            s.conn.send_close_notify();
            let _ = s.flush();
        }
        let _ = self.tcp().shutdown(std::net::Shutdown::Write);
    }
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Wire::Clear(s) => s.read(buf),
            Wire::Tls(s) => match s.read(buf) {
                // A server that closes without close_notify: the end of the data, as curl
                // and lftp also take it (FTP's own replies say whether it was complete).
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
                r => r,
            },
        }
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Wire::Clear(s) => s.write(buf),
            Wire::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Wire::Clear(s) => s.flush(),
            Wire::Tls(s) => s.flush(),
        }
    }
}

/// The TLS settings `--tls` uses: the certificates in `ca` (PEM) if given, else the system's.
pub fn client_config(ca: Option<&Path>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use anyhow::Context;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let mut given = Vec::new();
    match ca {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("cannot read PEM certificates from {}", path.display()))?
            {
                let cert = cert.with_context(|| format!("bad PEM in {}", path.display()))?;
                roots
                    .add(cert.clone())
                    .with_context(|| format!("unusable certificate in {}", path.display()))?;
                given.push(cert);
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        anyhow::bail!(
            "no trusted certificates to check the server with: give the server's CA with --tls-ca FILE"
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .context("TLS setup")?;
    let verifier = Arc::new(super::trust::Verifier::new(webpki, given));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS setup")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    // A ticket for each MODE E data connection, so that they resume the control connection's
    // session rather than each checking the certificate again.
    let mut config = config;
    config.resumption =
        rustls::client::Resumption::store(Arc::new(super::tickets::Tickets::default()));
    config.send_ticket_request = Some(rustls::client::TicketRequest {
        new_session_count: crate::engine::tls::TICKETS,
        resumption_count: 1,
    });
    Ok(Arc::new(config))
}

/// A failed TLS handshake as a sentence: what happened, and what to do about it.
pub(super) fn handshake_failed(host: &str, e: &std::io::Error) -> String {
    let fix = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(_)) => {
            "the server's certificate is not trusted here: if it is self-signed or from a private CA, \
             pass that certificate (PEM) with --tls-ca FILE"
        }
        Some(rustls::Error::AlertReceived(_)) => {
            "the server refused the handshake: check that it accepts TLS 1.2 or 1.3"
        }
        Some(_) => "check the server's TLS setup",
        None => {
            "the connection broke during the handshake: check that the server speaks TLS after AUTH TLS"
        }
    };
    format!("TLS handshake with {host} failed: {e}; {fix}")
}
