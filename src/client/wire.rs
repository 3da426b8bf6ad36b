//! A client connection in clear or through TLS (explicit FTPS, RFC 4217), read and written
//! the same way.

use super::error::{ClientError, Result};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

/// The client's connections are the engine's: in clear, or TLS as the client.
pub use crate::engine::tls::DataConn as Wire;

/// A stream-mode data connection's bytes as the transfer means them: inflated in MODE Z
/// (`deflated`), as they come otherwise.
pub fn reading(data: &mut Wire, deflated: bool) -> Box<dyn std::io::Read + '_> {
    if deflated {
        Box::new(flate2::read::ZlibDecoder::new(data))
    } else {
        Box::new(data)
    }
}

/// Starts TLS on `sock`, checking the server's certificate against `host`. The handshake runs
/// now, so a certificate problem is reported as such.
pub fn tls(sock: TcpStream, config: &Arc<rustls::ClientConfig>, host: &str) -> Result<Wire> {
    Ok(Wire::Client(
        Box::new(tls_stream(sock, config, host)?),
        None,
    ))
}

/// The same on any byte stream (`braid cp`'s dialogue inside ssh's channel, a socket pair).
pub fn tls_stream<S: std::io::Read + std::io::Write>(
    sock: S,
    config: &Arc<rustls::ClientConfig>,
    host: &str,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, S>> {
    finish_tls(sock, client_conn(config, host)?, host, &[])
}

/// A TLS client checking the server against `host`, its ClientHello ready to go.
pub fn client_conn(
    config: &Arc<rustls::ClientConfig>,
    host: &str,
) -> Result<rustls::ClientConnection> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| ClientError::Usage(format!("{host} cannot be checked by TLS: {e}")))?;
    rustls::ClientConnection::new(config.clone(), name)
        .map_err(|e| ClientError::Tls(format!("TLS setup: {e}")))
}

/// Runs `conn`'s handshake on `sock` to its end, `ahead` first: bytes of the server's that
/// were read before TLS took over the stream (behind its 234 to AUTH TLS).
pub fn finish_tls<S: std::io::Read + std::io::Write>(
    sock: S,
    mut conn: rustls::ClientConnection,
    host: &str,
    ahead: &[u8],
) -> Result<rustls::StreamOwned<rustls::ClientConnection, S>> {
    let failed = |e: std::io::Error| ClientError::Tls(handshake_failed(host, &e));
    let mut rest = ahead;
    // Each read takes some of a non-empty slice, or fails.
    while !rest.is_empty() {
        conn.read_tls(&mut rest).map_err(failed)?;
        conn.process_new_packets()
            .map_err(|e| failed(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    }
    let mut s = rustls::StreamOwned::new(conn, sock);
    crate::engine::tls::handshake(&mut s.conn, &mut s.sock).map_err(failed)?;
    Ok(s)
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
    config_with(provider, verifier).map(Arc::new)
}

/// The TLS settings for a one-shot server over ssh (`braid cp`): its certificate alone, known
/// by the SHA-256 its greeting gave over ssh's channel.
pub fn pinned_config(sha256: [u8; 32]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(super::trust::Pinned::new(sha256, &provider));
    let mut config = config_with(provider, verifier)?;
    // A one-shot server's tickets allow 0-RTT data (server::tls, `zero_rtt`): an upload's
    // data connections send from their ClientHello (engine::tls).
    config.enable_early_data = true;
    Ok(Arc::new(config))
}

/// Client settings checking servers with `verifier`, with session tickets for the data
/// connections.
fn config_with(
    provider: Arc<rustls::crypto::CryptoProvider>,
    verifier: Arc<dyn rustls::client::danger::ServerCertVerifier>,
) -> anyhow::Result<rustls::ClientConfig> {
    use anyhow::Context;
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
    Ok(config)
}

/// A failed TLS handshake as a sentence: what happened, and what to do about it.
pub(super) fn handshake_failed(host: &str, e: &std::io::Error) -> String {
    let (why, fix) = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => certificate_refused(host, c),
        Some(rustls::Error::AlertReceived(_)) => (
            e.to_string(),
            "the server refused the handshake: check that it accepts TLS 1.2 or 1.3".into(),
        ),
        Some(_) => (e.to_string(), "check the server's TLS setup".into()),
        None => (
            e.to_string(),
            "the connection broke during the handshake: check that the server speaks TLS after AUTH TLS".into(),
        ),
    };
    format!("TLS handshake with {host} failed: {why}; {fix}")
}

/// Why a server's certificate was refused, in words, and what to do about it.
fn certificate_refused(host: &str, c: &rustls::CertificateError) -> (String, String) {
    use rustls::CertificateError as C;
    let recipe = "docs/tls.md has a recipe for one";
    let (why, fix) = match c {
        C::NotValidForName | C::NotValidForNameContext { .. } => (
            format!("the server's certificate is not for {host}"),
            format!(
                "a certificate names its hosts in its subjectAltName (DNS:{host} or IP:{host});                  the Common Name alone is not read. Connect by a name the certificate carries,                  or give the server one that names this host ({recipe})"
            ),
        ),
        C::UnknownIssuer => (
            "the server's certificate is signed by an authority not trusted here".into(),
            "if it is self-signed or from a private CA, pass that certificate (PEM) with              --tls-ca FILE"
                .into(),
        ),
        C::Expired | C::ExpiredContext { .. } => (
            "the server's certificate has expired".into(),
            "the server needs a new one (or this machine's clock is wrong)".into(),
        ),
        C::NotValidYet | C::NotValidYetContext { .. } => (
            "the server's certificate is not valid yet".into(),
            "check this machine's clock and the server's".into(),
        ),
        C::Other(o) if o.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity) => (
            "the server presents a CA certificate (CA:TRUE) as its own, as `openssl req -x509`              makes them"
                .into(),
            format!(
                "pass that very certificate with --tls-ca FILE (braid then accepts it as the                  server's), or give the server one made for it ({recipe})"
            ),
        ),
        other => (
            format!("the server's certificate was refused ({other:?})"),
            "if it is self-signed or from a private CA, pass that certificate (PEM) with              --tls-ca FILE"
                .into(),
        ),
    };
    (why, fix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(c: rustls::CertificateError) -> String {
        let e = std::io::Error::other(rustls::Error::InvalidCertificate(c));
        handshake_failed("ftp.example", &e)
    }

    #[test]
    fn a_refused_certificate_is_explained_with_what_to_do() {
        let name = said(rustls::CertificateError::NotValidForName);
        assert!(name.contains("not for ftp.example"), "{name}");
        assert!(
            name.contains("subjectAltName") && name.contains("DNS:ftp.example"),
            "{name}"
        );
        let issuer = said(rustls::CertificateError::UnknownIssuer);
        assert!(issuer.contains("--tls-ca"), "{issuer}");
        let ca = said(rustls::CertificateError::Other(rustls::OtherError(
            std::sync::Arc::new(webpki::Error::CaUsedAsEndEntity),
        )));
        assert!(
            ca.contains("CA:TRUE") && !ca.contains("CaUsedAsEndEntity"),
            "{ca}"
        );
        assert!(said(rustls::CertificateError::Expired).contains("expired"));
    }

    #[test]
    fn a_handshake_cut_short_says_to_check_the_server_speaks_tls() {
        let e = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof");
        let text = handshake_failed("h", &e);
        assert!(text.contains("speaks TLS after AUTH TLS"), "{text}");
    }
}
