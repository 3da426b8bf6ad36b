//! GSI on a GridFTP data connection (`DCAU A`): before any data, a TLS 1.2 handshake in which
//! both ends show a credential of the same user (the client its own, the server the proxy the
//! client delegated to it at login), then the one-byte delegation flag (`0`) from the end that
//! connected, then the data in clear (PROT C): the handshake authenticates, it does not wrap.
//! A stranger who reaches the port has no credential of this user and gets nothing.
//!
//! Proxies (RFC 3820, and the older Globus forms) are certificates web PKI refuses (a critical
//! extension it does not know, an end entity signing another), so the chain is checked here:
//! each proxy signed by the certificate after it and valid now, the first certificate that is
//! not a proxy (the user's own) checked by web PKI against the trusted CAs, and its subject
//! must be this side's user's.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use x509_parser::prelude::FromDer;

/// What both ends of a GSI data connection need: this side's credential, shown as a TLS
/// client (it connected) or server (it accepted), and the check of the other end's.
#[derive(Debug)]
pub struct GsiData {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

impl GsiData {
    /// `certified` (its chain this side's certificate first, and its key) is the user's
    /// credential; the other end must show one of the user named by the first certificate of
    /// the chain that is not a proxy, issued under `roots`.
    pub fn new(
        certified: Arc<CertifiedKey>,
        roots: Arc<rustls::RootCertStore>,
    ) -> Result<GsiData, String> {
        let identity = user_subject(&certified.cert)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let check = Arc::new(PeerCheck {
            roots,
            identity: Some(identity),
        });
        let credential = Arc::new(Credential(certified));
        let setup = |e: Error| format!("GSI data connection setup: {e}");
        let client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS12])
            .map_err(setup)?
            .dangerous()
            .with_custom_certificate_verifier(check.clone())
            .with_client_cert_resolver(credential.clone());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS12])
            .map_err(setup)?
            .with_client_cert_verifier(check)
            .with_cert_resolver(credential);
        Ok(GsiData {
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// The handshake on a connection this side opened: it speaks first, and sends the flag.
    pub fn initiate(&self, sock: &mut TcpStream) -> std::io::Result<()> {
        // The name is not what is checked: the other end must be this user.
        let name = ServerName::try_from("gsi-data-channel").map_err(std::io::Error::other)?;
        let mut tls = rustls::ClientConnection::new(self.client.clone(), name)
            .map_err(std::io::Error::other)?;
        while tls.is_handshaking() {
            send(&mut tls, sock)?;
            if tls.is_handshaking() {
                take_record(&mut tls, sock)?;
            }
        }
        tls.writer().write_all(b"0")?;
        send(&mut tls, sock)
    }

    /// The handshake on a connection the other end opened: then its flag, which must say
    /// it delegates nothing.
    pub fn accept(&self, sock: &mut TcpStream) -> std::io::Result<()> {
        let mut tls =
            rustls::ServerConnection::new(self.server.clone()).map_err(std::io::Error::other)?;
        while tls.is_handshaking() {
            take_record(&mut tls, sock)?;
            send(&mut tls, sock)?;
        }
        let mut flag = [0u8; 1];
        loop {
            match tls.reader().read(&mut flag) {
                Ok(1) => break,
                Ok(_) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    take_record(&mut tls, sock)?
                }
                Err(e) => return Err(e),
            }
        }
        if flag[0] != b'0' {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the other end asked to delegate on a data connection",
            ));
        }
        Ok(())
    }
}

/// The certificates of a PEM file, in order (a proxy's chain: the proxy, then its issuers).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))
}

/// The CAs of a Globus CA directory: its hash-named files (`1a2b3c4d.0`) and any `.pem`, not
/// its signing policies, namespaces or CRLs (`.r0`). Empty if it holds none (the caller
/// says how to fix that).
pub fn trusted(dir: &Path) -> Result<rustls::RootCertStore, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "cannot read the CA directory {} ({e}): set X509_CERT_DIR to the directory of \
             trusted CAs",
            dir.display()
        )
    })?;
    let mut found = rustls::RootCertStore::empty();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ext = name.rsplit_once('.').map_or("", |(_, e)| e);
        let is_ca =
            name.ends_with(".pem") || (!ext.is_empty() && ext.bytes().all(|b| b.is_ascii_digit()));
        if is_ca && let Ok(certs) = certificates(&entry.path()) {
            found.add_parsable_certificates(certs);
        }
    }
    Ok(found)
}

/// Writes what TLS has to send.
fn send<T>(tls: &mut rustls::ConnectionCommon<T>, sock: &mut TcpStream) -> std::io::Result<()> {
    while tls.wants_write() {
        tls.write_tls(sock)?;
    }
    Ok(())
}

/// Reads exactly one TLS record and gives it to TLS: the data that follows the handshake is
/// not TLS's, and must stay in the socket.
fn take_record<T>(
    tls: &mut rustls::ConnectionCommon<T>,
    sock: &mut TcpStream,
) -> std::io::Result<()> {
    let mut record = vec![0u8; 5];
    sock.read_exact(&mut record)?;
    let len = usize::from(u16::from_be_bytes([record[3], record[4]]));
    record.resize(5 + len, 0);
    sock.read_exact(&mut record[5..])?;
    let mut rest = &record[..];
    while !rest.is_empty() {
        tls.read_tls(&mut rest)?;
    }
    tls.process_new_packets()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok(())
}

/// The user's credential, shown whatever the other end asks for (the control connection's
/// GSI handshake shows it too).
#[derive(Debug)]
pub struct Credential(pub Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for Credential {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl rustls::server::ResolvesServerCert for Credential {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// A client's chain, on a GSI control connection, must be a credential of some user whose
/// CA is among `roots` (which user is for the grid-mapfile to say).
pub fn any_user(roots: Arc<rustls::RootCertStore>) -> Arc<dyn ClientCertVerifier> {
    Arc::new(PeerCheck {
        roots,
        identity: None,
    })
}

/// The other end's chain must be a credential of this user.
#[derive(Debug)]
struct PeerCheck {
    roots: Arc<rustls::RootCertStore>,
    /// The user's subject (DER): the first certificate of this side's chain not a proxy.
    /// None: any user's.
    identity: Option<Vec<u8>>,
}

impl PeerCheck {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), Error> {
        let bad = |why: CertificateError| Error::InvalidCertificate(why);
        let mut chain = vec![end_entity.clone()];
        chain.extend(intermediates.iter().cloned());
        let parsed = chain
            .iter()
            .map(|c| x509_parser::certificate::X509Certificate::from_der(c).map(|(_, c)| c))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad(CertificateError::BadEncoding))?;
        let user = parsed
            .iter()
            .position(|c| !is_proxy(c))
            .ok_or(bad(CertificateError::UnknownIssuer))?;
        let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        for i in 0..user {
            let (proxy, issuer) = (&parsed[i], &parsed[i + 1]);
            if proxy.issuer().as_raw() != issuer.subject().as_raw() {
                return Err(bad(CertificateError::UnknownIssuer));
            }
            let validity = proxy.validity();
            if secs < validity.not_before.timestamp() {
                return Err(bad(CertificateError::NotValidYet));
            }
            if secs > validity.not_after.timestamp() {
                return Err(bad(CertificateError::Expired));
            }
            signed_by(proxy, issuer)?;
        }
        let cert = webpki::EndEntityCert::try_from(&chain[user])
            .map_err(|_| bad(CertificateError::BadEncoding))?;
        let algorithms = rustls::crypto::ring::default_provider().signature_verification_algorithms;
        cert.verify_for_usage(
            algorithms.all,
            &self.roots.roots,
            &chain[user + 1..],
            now,
            webpki::KeyUsage::client_auth(),
            None,
            None,
        )
        .map_err(|e| bad(CertificateError::Other(rustls::OtherError(Arc::new(e)))))?;
        if self
            .identity
            .as_ref()
            .is_some_and(|me| parsed[user].subject().as_raw() != me.as_slice())
        {
            return Err(bad(CertificateError::ApplicationVerificationFailure));
        }
        Ok(())
    }
}

impl ServerCertVerifier for PeerCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        self.check(end_entity, intermediates, now)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        handshake_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        handshake_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        SCHEMES.to_vec()
    }
}

impl ClientCertVerifier for PeerCheck {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.check(end_entity, intermediates, now)
            .map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        handshake_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        handshake_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        SCHEMES.to_vec()
    }
}

/// The handshake signatures checked here.
const SCHEMES: &[SignatureScheme] = &[
    SignatureScheme::RSA_PKCS1_SHA256,
    SignatureScheme::RSA_PKCS1_SHA384,
    SignatureScheme::RSA_PKCS1_SHA512,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PSS_SHA384,
    SignatureScheme::RSA_PSS_SHA512,
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
];

/// The other end's handshake signature, by the key of its certificate (a proxy's too).
fn handshake_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, Error> {
    use ring::signature as s;
    let alg: &dyn s::VerificationAlgorithm = match dss.scheme {
        SignatureScheme::RSA_PKCS1_SHA256 => &s::RSA_PKCS1_2048_8192_SHA256,
        SignatureScheme::RSA_PKCS1_SHA384 => &s::RSA_PKCS1_2048_8192_SHA384,
        SignatureScheme::RSA_PKCS1_SHA512 => &s::RSA_PKCS1_2048_8192_SHA512,
        SignatureScheme::RSA_PSS_SHA256 => &s::RSA_PSS_2048_8192_SHA256,
        SignatureScheme::RSA_PSS_SHA384 => &s::RSA_PSS_2048_8192_SHA384,
        SignatureScheme::RSA_PSS_SHA512 => &s::RSA_PSS_2048_8192_SHA512,
        SignatureScheme::ECDSA_NISTP256_SHA256 => &s::ECDSA_P256_SHA256_ASN1,
        SignatureScheme::ECDSA_NISTP384_SHA384 => &s::ECDSA_P384_SHA384_ASN1,
        _ => {
            return Err(Error::PeerIncompatible(
                rustls::PeerIncompatible::NoSignatureSchemesInCommon,
            ));
        }
    };
    let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(cert)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    s::UnparsedPublicKey::new(alg, &parsed.public_key().subject_public_key.data)
        .verify(message, dss.signature())
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadSignature))?;
    Ok(HandshakeSignatureValid::assertion())
}

/// `cert`'s signature by `issuer`'s key.
fn signed_by(
    cert: &x509_parser::certificate::X509Certificate<'_>,
    issuer: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<(), Error> {
    use ring::signature as s;
    let oid = cert.signature_algorithm.algorithm.to_id_string();
    let alg: &dyn s::VerificationAlgorithm = match oid.as_str() {
        "1.2.840.113549.1.1.5" => &s::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
        "1.2.840.113549.1.1.11" => &s::RSA_PKCS1_2048_8192_SHA256,
        "1.2.840.113549.1.1.12" => &s::RSA_PKCS1_2048_8192_SHA384,
        "1.2.840.113549.1.1.13" => &s::RSA_PKCS1_2048_8192_SHA512,
        "1.2.840.10045.4.3.2" => &s::ECDSA_P256_SHA256_ASN1,
        "1.2.840.10045.4.3.3" => &s::ECDSA_P384_SHA384_ASN1,
        _ => return Err(Error::InvalidCertificate(CertificateError::BadSignature)),
    };
    s::UnparsedPublicKey::new(alg, &issuer.public_key().subject_public_key.data)
        .verify(cert.tbs_certificate.as_ref(), &cert.signature_value.data)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadSignature))
}

/// Whether a certificate is a proxy: it carries ProxyCertInfo (RFC 3820, or the draft's
/// OID Globus used before it), or it is a Globus legacy proxy, whose last CN is `proxy` or
/// `limited proxy`.
fn is_proxy(cert: &x509_parser::certificate::X509Certificate<'_>) -> bool {
    const PROXY_CERT_INFO: &[&str] = &["1.3.6.1.5.5.7.1.14", "1.3.6.1.4.1.3536.1.222"];
    let marked = cert
        .extensions()
        .iter()
        .any(|e| PROXY_CERT_INFO.contains(&e.oid.to_id_string().as_str()));
    let legacy = cert
        .subject()
        .iter_common_name()
        .last()
        .and_then(|cn| cn.as_str().ok())
        .is_some_and(|cn| cn == "proxy" || cn == "limited proxy");
    marked || legacy
}

/// The subject (DER) of the first certificate of `chain` that is not a proxy: the user's.
pub fn user_subject(chain: &[CertificateDer<'_>]) -> Result<Vec<u8>, String> {
    for der in chain {
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
            .map_err(|e| format!("the credential's certificate does not parse: {e}"))?;
        if !is_proxy(&cert) {
            return Ok(cert.subject().as_raw().to_vec());
        }
    }
    Err("the credential holds proxies only, not the user's own certificate".into())
}

/// A CA of the tests' own and the certificates it signs, for the GSI tests here and in the
/// client (host certificates, users, a delegation's issuer).
#[cfg(test)]
pub(crate) mod test_grid {
    use std::sync::Arc;

    pub struct Ca {
        cert: rcgen::Certificate,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    impl Ca {
        pub fn new() -> Ca {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "grid CA");
            let cert = params.self_signed(&key).unwrap();
            Ca {
                cert,
                issuer: rcgen::Issuer::new(params, key),
            }
        }

        /// The CA as the one trusted root.
        pub fn roots(&self) -> Arc<rustls::RootCertStore> {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.cert.der().clone()).unwrap();
            Arc::new(roots)
        }

        /// A certificate of Common Name `cn` (no subjectAltName), and its key.
        pub fn sign(&self, cn: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
            (params.signed_by(&key, &self.issuer).unwrap(), key)
        }
    }

    /// `key` as rustls signs with it.
    pub fn signer(key: &rcgen::KeyPair) -> Arc<dyn rustls::sign::SigningKey> {
        rustls::crypto::ring::default_provider()
            .key_provider
            .load_private_key(rustls::pki_types::PrivateKeyDer::Pkcs8(
                key.serialize_der().into(),
            ))
            .unwrap()
    }

    /// A credential of `cn` from `ca`: its certificate alone, and its key.
    pub fn credential(ca: &Ca, cn: &str) -> Arc<rustls::sign::CertifiedKey> {
        let (cert, key) = ca.sign(cn);
        Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert.der().clone()],
            signer(&key),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::test_grid::{Ca, credential};
    use super::*;

    /// Runs `initiate` on one end of a loopback connection and `accept` on the other, then
    /// sends `after` in clear: what each side got.
    fn meet(a: &GsiData, b: &GsiData) -> (std::io::Result<()>, std::io::Result<Vec<u8>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::scope(|s| {
            let accepting = s.spawn(|| {
                let (mut sock, _) = listener.accept().unwrap();
                b.accept(&mut sock)?;
                let mut rest = Vec::new();
                sock.read_to_end(&mut rest)?;
                Ok(rest)
            });
            let mut sock = TcpStream::connect(addr).unwrap();
            let initiated = a
                .initiate(&mut sock)
                .and_then(|()| sock.write_all(b"data in clear"));
            drop(sock);
            (initiated, accepting.join().unwrap())
        })
    }

    #[test]
    fn two_ends_of_one_user_meet_and_the_data_follows_in_clear() {
        let ca = Ca::new();
        let (alice, bob) = (credential(&ca, "alice"), credential(&ca, "bob"));
        let end = |who: &Arc<CertifiedKey>| GsiData::new(who.clone(), ca.roots()).unwrap();
        let (sent, got) = meet(&end(&alice), &end(&alice));
        sent.unwrap();
        assert_eq!(got.unwrap(), b"data in clear");
        // bob is trusted by the same CA, but not alice: neither end takes the other.
        let (sent, got) = meet(&end(&bob), &end(&alice));
        assert!(sent.is_err() || got.is_err());
        assert!(got.is_err(), "alice's end took bob's");
    }
}
