//! A client connection in clear or through TLS (explicit FTPS, RFC 4217), read and written
//! the same way.

use super::error::{ClientError, Result};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

/// The client's connections are the engine's: in clear, or TLS as the client.
pub use crate::engine::tls::DataConn as Wire;

/// Starts TLS on `sock`, checking the server's certificate against `host`. The handshake runs
/// now, so a certificate problem is reported as such.
pub fn tls(sock: TcpStream, config: &Arc<rustls::ClientConfig>, host: &str) -> Result<Wire> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| ClientError::Usage(format!("{host} cannot be checked by TLS: {e}")))?;
    let conn = rustls::ClientConnection::new(config.clone(), name)
        .map_err(|e| ClientError::Tls(format!("TLS setup: {e}")))?;
    let mut s = rustls::StreamOwned::new(conn, sock);
    crate::engine::tls::handshake(&mut s.conn, &mut s.sock)
        .map_err(|e| ClientError::Tls(handshake_failed(host, &e)))?;
    Ok(Wire::Client(Box::new(s)))
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
