//! Where a GSI client finds its credential and the authorities it trusts, as the Globus tools
//! look for them: a proxy (`X509_USER_PROXY`, else `/tmp/x509up_u<uid>`), else a certificate
//! and an unencrypted key (`X509_USER_CERT`/`X509_USER_KEY`, else `~/.globus/usercert.pem`
//! and `userkey.pem`); the CAs in `X509_CERT_DIR`, else `~/.globus/certificates`, else
//! `/etc/grid-security/certificates`.

use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The user's GSI credential: TLS settings presenting it, and what signs a proxy of it.
pub struct GsiCredential {
    pub config: Arc<rustls::ClientConfig>,
    /// The chain and its key, as shown in every handshake and as the issuer of a delegated
    /// proxy.
    pub certified: Arc<rustls::sign::CertifiedKey>,
    /// The credential on data connections (DCAU A).
    pub data: Arc<crate::engine::gsi_data::GsiData>,
}

/// The credential of every GSI session of this process, read once.
pub fn credential() -> Result<Arc<GsiCredential>, String> {
    static MADE: OnceLock<Result<Arc<GsiCredential>, String>> = OnceLock::new();
    MADE.get_or_init(|| make(&Env::real()).map(Arc::new))
        .clone()
}

/// The variables and places that matter, so that tests need not set the real ones.
struct Env {
    vars: fn(&str) -> Option<String>,
    home: Option<PathBuf>,
    uid: u32,
}

impl Env {
    fn real() -> Env {
        Env {
            vars: |k| std::env::var(k).ok().filter(|v| !v.is_empty()),
            home: std::env::var_os("HOME").map(PathBuf::from),
            uid: rustix::process::getuid().as_raw(),
        }
    }

    fn var(&self, k: &str) -> Option<PathBuf> {
        (self.vars)(k).map(PathBuf::from)
    }

    fn in_home(&self, rel: &str) -> Option<PathBuf> {
        self.home.as_ref().map(|h| h.join(rel))
    }

    /// The certificate chain and key files: one file for a proxy, two otherwise.
    fn credential(&self) -> Result<(PathBuf, PathBuf), String> {
        let proxy = self
            .var("X509_USER_PROXY")
            .or_else(|| Some(PathBuf::from(format!("/tmp/x509up_u{}", self.uid))))
            .filter(|p| p.exists());
        if let Some(p) = proxy {
            return Ok((p.clone(), p));
        }
        let cert = self
            .var("X509_USER_CERT")
            .or_else(|| self.in_home(".globus/usercert.pem"));
        let key = self
            .var("X509_USER_KEY")
            .or_else(|| self.in_home(".globus/userkey.pem"));
        match (cert, key) {
            (Some(c), Some(k)) if c.exists() && k.exists() => Ok((c, k)),
            _ => Err(format!(
                "no GSI credential: no proxy ({}), and no certificate and key \
                 (X509_USER_CERT and X509_USER_KEY, or ~/.globus/usercert.pem and userkey.pem); \
                 make a proxy with grid-proxy-init or voms-proxy-init, or point those variables \
                 at your certificate and an unencrypted key",
                self.var("X509_USER_PROXY")
                    .unwrap_or_else(|| PathBuf::from(format!("/tmp/x509up_u{}", self.uid)))
                    .display()
            )),
        }
    }

    /// The directory of trusted CAs.
    fn ca_dir(&self) -> PathBuf {
        self.var("X509_CERT_DIR")
            .or_else(|| self.in_home(".globus/certificates").filter(|d| d.is_dir()))
            .unwrap_or_else(|| PathBuf::from("/etc/grid-security/certificates"))
    }
}

fn make(env: &Env) -> Result<GsiCredential, String> {
    let (chain_file, key_file) = env.credential()?;
    let chain = crate::engine::gsi_data::certificates(&chain_file)?;
    if chain.is_empty() {
        return Err(format!("no certificate in {}", chain_file.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|e| {
        format!(
            "cannot read the key in {} ({e}): an encrypted key cannot be used as it is; \
             make a proxy with grid-proxy-init (or voms-proxy-init) first",
            key_file.display()
        )
    })?;
    let dir = env.ca_dir();
    let roots = crate::engine::gsi_data::trusted(&dir)?;
    if roots.is_empty() {
        return Err(format!(
            "no CA certificate in {}: set X509_CERT_DIR to the directory of trusted CAs \
             (hash-named files, as /etc/grid-security/certificates has them)",
            dir.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("the key in {} cannot sign: {e}", key_file.display()))?;
    // Not `with_client_auth_cert`: it parses the certificate as a web one, and a proxy's
    // critical ProxyCertInfo extension (RFC 3820) is unknown there. The server checks it.
    let certified = Arc::new(rustls::sign::CertifiedKey::new(chain, signer));
    let roots = Arc::new(roots);
    let data = crate::engine::gsi_data::GsiData::new(certified.clone(), roots.clone())?;
    let credential = crate::engine::gsi_data::Credential(certified.clone());
    // TLS 1.2: the Globus GSS mechanism (GCT 6.2) completes its context after a TLS 1.2
    // handshake; under TLS 1.3 it exchanges the server's session tickets in a round of
    // their own before the delegation byte.
    let webpki =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| format!("GSI TLS setup: {e}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .map_err(|e| format!("GSI TLS setup: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(super::trust::Verifier::grid(webpki)))
        .with_client_cert_resolver(Arc::new(credential));
    config.resumption = rustls::client::Resumption::disabled();
    Ok(GsiCredential {
        config: Arc::new(config),
        certified,
        data: Arc::new(data),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::gsi_data::trusted;
    use std::path::Path;

    fn env(home: &Path) -> Env {
        Env {
            vars: |_| None,
            home: Some(home.to_path_buf()),
            uid: u32::MAX,
        }
    }

    #[test]
    fn without_a_credential_the_error_names_the_places_looked_and_the_fix() {
        let home = tempfile::tempdir().unwrap();
        let e = make(&env(home.path())).err().unwrap();
        assert!(e.contains("/tmp/x509up_u4294967295"), "{e}");
        assert!(e.contains("grid-proxy-init"), "{e}");
        assert!(e.contains("X509_USER_CERT"), "{e}");
    }

    #[test]
    fn a_credential_in_the_home_with_cas_of_their_own_makes_a_config() {
        let home = tempfile::tempdir().unwrap();
        let globus = home.path().join(".globus");
        std::fs::create_dir_all(globus.join("certificates")).unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["ca.example".into()]).unwrap();
        let user = rcgen::generate_simple_self_signed(vec!["user.example".into()]).unwrap();
        std::fs::write(globus.join("usercert.pem"), user.cert.pem()).unwrap();
        std::fs::write(globus.join("userkey.pem"), user.signing_key.serialize_pem()).unwrap();
        // A signing policy beside the CA is not read as a certificate.
        std::fs::write(globus.join("certificates/0a1b2c3d.0"), ca.cert.pem()).unwrap();
        std::fs::write(
            globus.join("certificates/0a1b2c3d.signing_policy"),
            "access_id_CA X509 '/CN=x'\n",
        )
        .unwrap();
        assert_eq!(trusted(&globus.join("certificates")).unwrap().len(), 1);
        assert!(make(&env(home.path())).is_ok());
        // Without the CAs, the error says where it looked.
        std::fs::remove_file(globus.join("certificates/0a1b2c3d.0")).unwrap();
        let e = make(&env(home.path())).err().unwrap();
        assert!(
            e.contains("no CA certificate") && e.contains("X509_CERT_DIR"),
            "{e}"
        );
    }
}
