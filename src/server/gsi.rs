//! GSI for `braid serve` (`--gsi-cert`, `--gsi-key`, `--grid-mapfile`): the acceptor's half of
//! what `client::gsi` does. AUTH GSSAPI, then ADAT tokens carrying a TLS 1.2 handshake in which
//! the client shows a user's credential (a proxy, or the certificate itself) and the server
//! its host certificate; then the client's delegation byte, and on `D` the server's
//! certificate request and the proxy the client signs for it. After that every command comes
//! as `ENC`/`MIC` and every reply line goes back as `632`; the grid-mapfile maps the user's
//! name to an account. The delegated proxy is what the server shows on data connections
//! (DCAU A), to the client or to another server in a copy between two.
//!
//! Pure: tokens and lines in, tokens and lines out; the socket is the caller's.

use crate::engine::gsi_tokens::{self, TokenError};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use x509_parser::prelude::FromDer;

/// The server's GSI: its host credential, the CAs it trusts, its grid-mapfile.
#[derive(Debug)]
pub struct GsiHost {
    config: Arc<rustls::ServerConfig>,
    pub roots: Arc<rustls::RootCertStore>,
    grid_map: PathBuf,
}

impl GsiHost {
    /// The host certificate and key (PEM), the directory of trusted CAs (hash-named files,
    /// as /etc/grid-security/certificates holds them) and the grid-mapfile, which is read
    /// at each login so that an edit counts at once (as Globus reads it).
    pub fn load(
        cert: &Path,
        key: &Path,
        ca_dir: &Path,
        grid_map: &Path,
    ) -> anyhow::Result<GsiHost> {
        use anyhow::Context;
        let chain = crate::engine::gsi_data::certificates(cert).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(!chain.is_empty(), "no certificate in {}", cert.display());
        let key = {
            use rustls::pki_types::pem::PemObject;
            PrivateKeyDer::from_pem_file(key).with_context(|| {
                format!(
                    "cannot read the host key {} (it must not be encrypted)",
                    key.display()
                )
            })?
        };
        let roots = crate::engine::gsi_data::trusted(ca_dir).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            !roots.is_empty(),
            "no CA certificate in {}: give --gsi-ca-dir the directory of the CAs whose users \
             may log in (hash-named files)",
            ca_dir.display()
        );
        std::fs::metadata(grid_map)
            .with_context(|| format!("cannot read the grid-mapfile {}", grid_map.display()))?;
        GsiHost::with(chain, key, Arc::new(roots), grid_map)
    }

    /// The same from what the files hold.
    pub fn with(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        roots: Arc<rustls::RootCertStore>,
        grid_map: &Path,
    ) -> anyhow::Result<GsiHost> {
        use anyhow::Context;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // TLS 1.2: the Globus GSS mechanism ends its context after a TLS 1.2 handshake.
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS12])?
            .with_client_cert_verifier(crate::engine::gsi_data::any_user(roots.clone()))
            .with_single_cert(chain, key)
            .context("the host certificate and key do not go together")?;
        Ok(GsiHost {
            config: Arc::new(config),
            roots,
            grid_map: grid_map.to_path_buf(),
        })
    }

    /// A new security context, as AUTH GSSAPI starts one.
    pub fn accepting(&self) -> Result<Accepting, String> {
        Ok(Accepting {
            tls: rustls::ServerConnection::new(self.config.clone()).map_err(|e| e.to_string())?,
            stage: Stage::Handshake,
            key: None,
            proxy: Vec::new(),
            delegated: None,
        })
    }

    /// The account `user` (`:globus-mapping:` for the first the user is mapped to) that the
    /// grid-mapfile gives `subject`, or why none.
    pub fn map(&self, subject: &str, user: &str) -> Result<String, String> {
        let text = std::fs::read_to_string(&self.grid_map)
            .map_err(|e| format!("the grid-mapfile {}: {e}", self.grid_map.display()))?;
        map_user(&text, subject, user)
    }
}

#[derive(Debug, PartialEq)]
enum Stage {
    Handshake,
    /// The handshake ended: the delegation byte comes next.
    Flag,
    /// A certificate request went: the proxy comes next.
    Proxy,
    Done,
}

/// A context being set up.
pub struct Accepting {
    tls: rustls::ServerConnection,
    stage: Stage,
    /// The key of the delegation's certificate request.
    key: Option<rcgen::KeyPair>,
    /// The delegated proxy (and its chain), as far as it came.
    proxy: Vec<u8>,
    delegated: Option<Arc<CertifiedKey>>,
}

/// What an ADAT gave.
#[derive(Debug)]
pub enum Step {
    /// 335: the token to answer with; the context needs more.
    More(String),
    /// 235: done, with a last token or none.
    Done(Option<String>),
}

/// A context set up: who the client is, what it delegated, and the wrapping of lines.
pub struct Established {
    /// The user's name as grid-mapfiles write it (`/O=Grid/CN=Alice`).
    pub subject: String,
    /// The proxy the client delegated (its chain, and the key made here).
    pub delegated: Option<Arc<CertifiedKey>>,
    pub lines: Wrapper,
}

impl Accepting {
    /// Takes the client's token (base64) and says what to answer.
    pub fn step(&mut self, token: &str) -> Result<Step, String> {
        feed(&mut self.tls, token)?;
        loop {
            match self.stage {
                Stage::Handshake if !self.tls.is_handshaking() => self.stage = Stage::Flag,
                Stage::Handshake | Stage::Done => break,
                Stage::Flag => {
                    let mut flag = [0u8; 1];
                    match self.tls.reader().read(&mut flag) {
                        Ok(1) => {}
                        _ => break,
                    }
                    match flag[0] {
                        b'0' => self.stage = Stage::Done,
                        b'D' => {
                            let (key, request) = certificate_request()?;
                            self.tls
                                .writer()
                                .write_all(&request)
                                .map_err(|e| e.to_string())?;
                            self.key = Some(key);
                            self.stage = Stage::Proxy;
                        }
                        other => return Err(format!("an unknown delegation flag {other:#04x}")),
                    }
                }
                Stage::Proxy => {
                    let got = gsi_tokens::plain(&mut self.tls).map_err(|e| e.to_string())?;
                    self.proxy.extend(got);
                    let Some(chain) = certificates_in(&self.proxy)? else {
                        break;
                    };
                    let key = self.key.take().ok_or("no key for the delegated proxy")?;
                    self.delegated = Some(self.delegated_credential(chain, &key)?);
                    self.stage = Stage::Done;
                }
            }
        }
        let out = gsi_tokens::give(&mut self.tls).map_err(|e| e.to_string())?;
        let token = (!out.is_empty()).then_some(out);
        match (&self.stage, token) {
            (Stage::Done, token) => Ok(Step::Done(token)),
            (_, Some(token)) => Ok(Step::More(token)),
            (_, None) => Err("the client's token left the handshake nothing to answer".into()),
        }
    }

    /// The context, once [`Accepting::step`] said Done.
    pub fn established(self) -> Result<Established, String> {
        if self.stage != Stage::Done {
            return Err("the security context is not complete".into());
        }
        let chain = self
            .tls
            .peer_certificates()
            .ok_or("the client showed no certificate")?;
        let subject = user_name(chain)?;
        Ok(Established {
            subject,
            delegated: self.delegated,
            lines: Wrapper { tls: self.tls },
        })
    }

    /// The delegated proxy as a credential: the certificate the client signed (its issuers
    /// after it, where the client sent them, else the chain it showed), with the key made
    /// here, which the certificate must carry.
    fn delegated_credential(
        &self,
        mut chain: Vec<CertificateDer<'static>>,
        key: &rcgen::KeyPair,
    ) -> Result<Arc<CertifiedKey>, String> {
        let first = chain.first().ok_or("the delegated proxy is empty")?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(first)
            .map_err(|e| format!("the delegated proxy does not parse: {e}"))?;
        if cert.public_key().raw != rcgen::PublicKeyData::subject_public_key_info(key).as_slice() {
            return Err("the delegated proxy is not for the key this server asked for".into());
        }
        if chain.len() == 1
            && let Some(shown) = self.tls.peer_certificates()
        {
            chain.extend(shown.iter().cloned());
        }
        let signer = rustls::crypto::ring::default_provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(key.serialize_der().into()))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(CertifiedKey::new(chain, signer)))
    }
}

/// A key made now, and a certificate request for it, which the client signs as a proxy.
fn certificate_request() -> Result<(rcgen::KeyPair, Vec<u8>), String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    // The signer names the proxy after its own subject; the request's is not read.
    params.distinguished_name = rcgen::DistinguishedName::new();
    let request = params.serialize_request(&key).map_err(|e| e.to_string())?;
    Ok((key, request.der().to_vec()))
}

/// The DER certificates `bytes` holds, once the first is whole (None before).
fn certificates_in(bytes: &[u8]) -> Result<Option<Vec<CertificateDer<'static>>>, String> {
    let mut rest = bytes;
    let mut found = Vec::new();
    while !rest.is_empty() {
        match x509_parser::certificate::X509Certificate::from_der(rest) {
            Ok((after, _)) => {
                let used = rest.len() - after.len();
                found.push(CertificateDer::from(rest[..used].to_vec()));
                rest = after;
            }
            Err(x509_parser::nom::Err::Incomplete(_)) if found.is_empty() => return Ok(None),
            Err(e) => return Err(format!("the delegated proxy does not parse: {e}")),
        }
    }
    Ok((!found.is_empty()).then_some(found))
}

/// The user's name, as grid-mapfiles write it, from the chain the client showed: the subject
/// of its first certificate that is not a proxy.
fn user_name(chain: &[CertificateDer<'_>]) -> Result<String, String> {
    let der = crate::engine::gsi_data::user_subject(chain)?;
    let (_, name) = x509_parser::x509::X509Name::from_der(&der)
        .map_err(|e| format!("the user's name does not parse: {e}"))?;
    Ok(slashed(&name))
}

/// A name in OpenSSL's one-line form: `/O=Grid/OU=Site/CN=Alice`.
fn slashed(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let mut out = String::new();
    for rdn in name.iter() {
        for attr in rdn.iter() {
            let oid = attr.attr_type();
            let key = match x509_parser::objects::oid2abbrev(oid, registry) {
                Ok("Email") => "emailAddress".to_string(),
                Ok(k) => k.to_string(),
                Err(_) => oid.to_id_string(),
            };
            let value = attr.as_str().map_or_else(
                |_| braid_proto::hex::encode(attr.attr_value().data),
                str::to_string,
            );
            out.push_str(&format!("/{key}={value}"));
        }
    }
    out
}

/// `subject`'s account in a grid-mapfile's `text`: lines `"/O=Grid/CN=Alice" alice,guest`,
/// the first account the default (`:globus-mapping:`), another only when asked by name.
pub fn map_user(text: &str, subject: &str, user: &str) -> Result<String, String> {
    let wanted = normal_dn(subject);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((dn, accounts)) = split_entry(line) else {
            continue;
        };
        if normal_dn(&dn) != wanted {
            continue;
        }
        let accounts: Vec<&str> = accounts
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        return match user {
            ":globus-mapping:" | "" => accounts
                .first()
                .map(|a| a.to_string())
                .ok_or_else(|| format!("{subject} is mapped to no account")),
            u if accounts.contains(&u) => Ok(u.to_string()),
            u => Err(format!("{subject} may not log in as {u}")),
        };
    }
    Err(format!(
        "{subject} is not in the grid-mapfile: the admin adds a line \"{subject}\" ACCOUNT"
    ))
}

/// A grid-mapfile line's name (quoted, or a word) and the rest.
fn split_entry(line: &str) -> Option<(String, &str)> {
    if let Some(quoted) = line.strip_prefix('"') {
        let mut dn = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => dn.extend(chars.next().map(|(_, c)| c)),
                '"' => return Some((dn, quoted[i + 1..].trim())),
                c => dn.push(c),
            }
        }
        return None;
    }
    let (dn, rest) = line.split_once(char::is_whitespace)?;
    Some((dn.to_string(), rest.trim()))
}

/// The e-mail attribute has had three spellings.
fn normal_dn(dn: &str) -> String {
    dn.replace("/Email=", "/emailAddress=")
        .replace("/E=", "/emailAddress=")
}

/// Commands in and replies out under an established context.
pub struct Wrapper {
    tls: rustls::ServerConnection,
}

impl Wrapper {
    /// The command a protected line (`ENC`, `MIC` or `CONF` and a token) carries, without its
    /// CRLF; None for a line that is not protected.
    pub fn unwrap(&mut self, line: &[u8]) -> Option<Result<Vec<u8>, String>> {
        let text = std::str::from_utf8(line).ok()?;
        let (verb, token) = text.split_once(' ')?;
        if !["ENC", "MIC", "CONF"].contains(&verb.to_ascii_uppercase().as_str()) {
            return None;
        }
        let unwrapped = feed(&mut self.tls, token)
            .and_then(|()| gsi_tokens::plain(&mut self.tls).map_err(|e| e.to_string()))
            .map(|mut plain| {
                while plain.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    plain.pop();
                }
                plain
            });
        Some(unwrapped)
    }

    /// `reply` (its lines, each with CRLF) as protected lines: each wrapped alone, `632-`
    /// before all but the last, as Globus sends them.
    pub fn wrap(&mut self, reply: &[u8]) -> Result<Vec<u8>, String> {
        let lines: Vec<&[u8]> = reply
            .split_inclusive(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let mut out = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            self.tls
                .writer()
                .write_all(line)
                .map_err(|e| e.to_string())?;
            let token = gsi_tokens::give(&mut self.tls).map_err(|e| e.to_string())?;
            let sep = if i + 1 == lines.len() { ' ' } else { '-' };
            out.extend_from_slice(format!("632{sep}{token}\r\n").as_bytes());
        }
        Ok(out)
    }
}

/// Feeds a token's TLS records to `tls`.
fn feed(tls: &mut rustls::ServerConnection, token: &str) -> Result<(), String> {
    gsi_tokens::take(tls, token).map_err(|e| match e {
        TokenError::Tls(e) => format!("GSI handshake refused: {e}"),
        e => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_mapfile_maps_a_name_to_its_first_account_or_to_one_asked_for() {
        let text = "# comment\n\
                    \"/O=Grid/OU=Site/CN=Alice Smith\" alice,guest\n\
                    /O=Grid/CN=bob bob\n\
                    \"/O=Grid/CN=Carol/Email=c@x\" carol\n";
        let map = |s, u| map_user(text, s, u);
        assert_eq!(
            map("/O=Grid/OU=Site/CN=Alice Smith", ":globus-mapping:").unwrap(),
            "alice"
        );
        assert_eq!(
            map("/O=Grid/OU=Site/CN=Alice Smith", "guest").unwrap(),
            "guest"
        );
        assert!(
            map("/O=Grid/OU=Site/CN=Alice Smith", "bob")
                .unwrap_err()
                .contains("may not")
        );
        assert_eq!(map("/O=Grid/CN=bob", ":globus-mapping:").unwrap(), "bob");
        assert_eq!(
            map("/O=Grid/CN=Carol/emailAddress=c@x", "").unwrap(),
            "carol"
        );
        let e = map("/O=Grid/CN=Mallory", ":globus-mapping:").unwrap_err();
        assert!(e.contains("not in the grid-mapfile"), "{e}");
    }
}
