//! TLS for `braid serve` (RFC 4217, explicit FTPS): the certificate and key a server presents.

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

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
