//! Checking a server's certificate: the Web PKI rules, plus one case curl and lftp accept and
//! rustls does not. `openssl req -x509 -nodes` marks the self-signed certificate it makes as a
//! CA (`CA:TRUE`), and Web PKI forbids a CA certificate as a server's own. A certificate the user
//! gave with `--tls-ca` is one they chose to trust as it is, so when the server presents exactly
//! that certificate it is accepted as the server's, still checked for the name and the dates.
//! Under GSI, a grid host certificate's name may be its Common Name alone (`host/NAME`).

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};
use std::sync::Arc;

/// Web PKI verification, and the certificates given by hand accepted as the server's own.
#[derive(Debug)]
pub struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    /// The certificates from `--tls-ca` (none for the system's).
    given: Vec<CertificateDer<'static>>,
    /// A GridFTP server's host certificate, checked as GSI checks it: where its
    /// subjectAltName does not carry the name, its Common Name as grid CAs issue them,
    /// `host/NAME` (or `SERVICE/NAME`, or `NAME` alone).
    grid_names: bool,
}

impl Verifier {
    pub fn new(webpki: Arc<WebPkiServerVerifier>, given: Vec<CertificateDer<'static>>) -> Self {
        Verifier {
            webpki,
            given,
            grid_names: false,
        }
    }

    /// For GSI's host certificates (see `grid_names`).
    pub fn grid(webpki: Arc<WebPkiServerVerifier>) -> Self {
        Verifier {
            webpki,
            given: Vec::new(),
            grid_names: true,
        }
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let e = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        // Web PKI checks the chain (authority, dates) before the name: refused for the name
        // alone, the rest held.
        let for_name = matches!(
            e,
            Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            )
        );
        if self.grid_names && for_name && grid_name_matches(end_entity, &server_name.to_str()) {
            return Ok(ServerCertVerified::assertion());
        }
        if !(is_ca_used_as_server(&e) && self.given.iter().any(|g| g == end_entity)) {
            return Err(e);
        }
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(server_name)
            .map_err(|_| Error::InvalidCertificate(CertificateError::NotValidForName))?;
        check_dates(end_entity, now)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Whether the certificate's last Common Name is `host`, or `SERVICE/host`.
fn grid_name_matches(der: &CertificateDer<'_>, host: &str) -> bool {
    use x509_parser::prelude::FromDer;
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(der) else {
        return false;
    };
    let Some(cn) = cert
        .subject()
        .iter_common_name()
        .last()
        .and_then(|a| a.as_str().ok())
    else {
        return false;
    };
    let name = cn.rsplit_once('/').map_or(cn, |(_, n)| n);
    !host.is_empty() && name.eq_ignore_ascii_case(host)
}

/// One certificate and no other, known by its SHA-256 from a channel already trusted (ssh's,
/// for `braid cp`): no name, date or authority to check, only that the server holds that
/// certificate's key (the handshake's signatures, checked as rustls checks them).
#[derive(Debug)]
pub struct Pinned {
    sha256: [u8; 32],
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl Pinned {
    pub fn new(sha256: [u8; 32], provider: &rustls::crypto::CryptoProvider) -> Self {
        Pinned {
            sha256,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if crate::engine::tls::fingerprint(end_entity) == self.sha256 {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Whether Web PKI refused the certificate only for being a CA's.
fn is_ca_used_as_server(e: &Error) -> bool {
    matches!(e, Error::InvalidCertificate(CertificateError::Other(o))
        if o.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity))
}

/// The certificate's validity period contains `now`.
fn check_dates(der: &CertificateDer<'_>, now: UnixTime) -> Result<(), Error> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let validity = cert.validity();
    if now < validity.not_before.timestamp() {
        return Err(Error::InvalidCertificate(CertificateError::NotValidYet));
    }
    if now > validity.not_after.timestamp() {
        return Err(Error::InvalidCertificate(CertificateError::Expired));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grid host certificate with no subjectAltName is taken for the host its Common Name
    /// names (`host/NAME`), from a trusted CA; not for another host, nor from another CA.
    #[test]
    fn a_grid_host_certificate_is_known_by_its_common_name() {
        use crate::engine::gsi_data::test_grid::Ca;
        let ca = Ca::new();
        let (host_cert, _) = ca.sign("host/dtn.example");
        let webpki = |roots: Arc<rustls::RootCertStore>| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .unwrap()
        };
        let check = |v: &Verifier, host: &str| {
            v.verify_server_cert(
                host_cert.der(),
                &[],
                &ServerName::try_from(host.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        let trusted = Verifier::grid(webpki(ca.roots()));
        assert!(check(&trusted, "dtn.example").is_ok());
        assert!(check(&trusted, "DTN.example").is_ok());
        assert!(check(&trusted, "other.example").is_err());
        // Only where asked for: an ftp:// server's certificate is named in its SAN.
        let web = Verifier::new(webpki(ca.roots()), Vec::new());
        assert!(check(&web, "dtn.example").is_err());
        let stranger = Ca::new();
        assert!(check(&Verifier::grid(webpki(stranger.roots())), "dtn.example").is_err());
    }

    /// A pinned verifier takes the certificate it was told of, whatever name is asked for,
    /// and refuses any other, even one for the same name.
    #[test]
    fn a_pinned_certificate_is_the_only_one_taken() {
        let name = crate::engine::tls::ONE_SHOT_NAME.to_string();
        let told = rcgen::generate_simple_self_signed(vec![name.clone()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec![name]).unwrap();
        let provider = rustls::crypto::ring::default_provider();
        let pinned = Pinned::new(crate::engine::tls::fingerprint(told.cert.der()), &provider);
        let check = |cert: &CertificateDer<'_>, host: &str| {
            pinned.verify_server_cert(
                cert,
                &[],
                &ServerName::try_from(host.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        assert!(check(told.cert.der(), "anything.example").is_ok());
        assert!(matches!(
            check(other.cert.der(), crate::engine::tls::ONE_SHOT_NAME),
            Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure
            ))
        ));
    }
}
