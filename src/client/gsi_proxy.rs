//! GSI delegation: the server sends a certificate request for a key of its own, and the
//! client signs it as an RFC 3820 proxy of its credential, so that the server can act as the
//! user towards another server (in a copy between two GridFTP servers, each shows the other
//! a proxy of the same user on the data connections: DCAU A). Pure: DER in, DER out, the
//! signing done by the caller's key.
//!
//! The proxy's subject is the issuer's subject with one CN more (its serial number), its
//! ProxyCertInfo extension critical with the inherit-all policy, as Globus makes them.
//! The certificate is written here in DER by hand: certificate builders keep one value per
//! attribute type, and a proxy's subject has two CNs.

use rustls::SignatureScheme;
use rustls::sign::SigningKey;
use x509_parser::prelude::FromDer;

/// How long a delegated proxy lives at most (as grid-proxy-init's default): a transfer that
/// needs it longer outlives the user's own credential anyway.
const LIFETIME_SECS: i64 = 12 * 3600;
/// A proxy starts a little in the past, for servers whose clocks run behind.
const SKEW_SECS: i64 = 300;

/// Signs the DER certificate request `request` as a proxy of `issuer` (DER) with `key`, the
/// issuer's, at `now` (seconds since the epoch): the proxy's DER.
pub fn sign_request(
    request: &[u8],
    issuer: &[u8],
    key: &dyn SigningKey,
    now: i64,
) -> Result<Vec<u8>, String> {
    use x509_parser::certification_request::X509CertificationRequest;
    let (_, req) = X509CertificationRequest::from_der(request)
        .map_err(|e| format!("the server's certificate request does not parse: {e}"))?;
    let spki = req.certification_request_info.subject_pki.raw;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(issuer)
        .map_err(|e| format!("the credential's certificate does not parse: {e}"))?;
    let issuer_name = cert.tbs_certificate.subject.as_raw();
    let ends = cert
        .validity()
        .not_after
        .timestamp()
        .min(now + LIFETIME_SECS);
    if ends <= now {
        return Err("the credential has expired: make a new proxy".into());
    }
    let (scheme, algorithm) = signature_for(key)?;
    let serial = u32::from_be_bytes(
        ring::digest::digest(&ring::digest::SHA256, spki).as_ref()[..4]
            .try_into()
            .map_err(|_| "digest too short".to_string())?,
    ) & 0x7fff_ffff;

    let mut tbs = Vec::new();
    tbs.extend(tlv(0xa0, &tlv(0x02, &[2]))); // version 3
    tbs.extend(tlv(0x02, &integer(serial as u64)));
    tbs.extend(&algorithm);
    tbs.extend(issuer_name);
    let mut validity = time(now - SKEW_SECS);
    validity.extend(time(ends));
    tbs.extend(tlv(0x30, &validity));
    tbs.extend(subject(issuer_name, serial)?);
    tbs.extend(spki);
    tbs.extend(tlv(0xa3, &tlv(0x30, &extensions())));
    let tbs = tlv(0x30, &tbs);

    let signer = key
        .choose_scheme(&[scheme])
        .ok_or("the credential's key cannot sign a proxy")?;
    let signature = signer
        .sign(&tbs)
        .map_err(|e| format!("signing the proxy: {e}"))?;
    let mut bits = vec![0u8]; // no unused bits
    bits.extend(signature);
    let mut whole = tbs;
    whole.extend(&algorithm);
    whole.extend(tlv(0x03, &bits));
    Ok(tlv(0x30, &whole))
}

/// The scheme to sign with, and its AlgorithmIdentifier in DER.
fn signature_for(key: &dyn SigningKey) -> Result<(SignatureScheme, Vec<u8>), String> {
    // sha256WithRSAEncryption (with its NULL), ecdsa-with-SHA256, ecdsa-with-SHA384.
    const RSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
    const ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
    const ECDSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
    let (scheme, oid, null) = match key.algorithm() {
        rustls::SignatureAlgorithm::RSA => (SignatureScheme::RSA_PKCS1_SHA256, RSA_SHA256, true),
        rustls::SignatureAlgorithm::ECDSA
            if key
                .choose_scheme(&[SignatureScheme::ECDSA_NISTP384_SHA384])
                .is_some() =>
        {
            (SignatureScheme::ECDSA_NISTP384_SHA384, ECDSA_SHA384, false)
        }
        rustls::SignatureAlgorithm::ECDSA => {
            (SignatureScheme::ECDSA_NISTP256_SHA256, ECDSA_SHA256, false)
        }
        other => return Err(format!("a {other:?} key cannot sign a proxy here")),
    };
    let mut id = tlv(0x06, oid);
    if null {
        id.extend([0x05, 0x00]);
    }
    Ok((scheme, tlv(0x30, &id)))
}

/// The issuer's name (a DER SEQUENCE of RDNs) with one RDN more: CN=`serial`.
fn subject(issuer: &[u8], serial: u32) -> Result<Vec<u8>, String> {
    let (inner, _) = contents(issuer).ok_or("the credential's subject does not parse")?;
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    let mut cn = tlv(0x06, CN);
    cn.extend(tlv(0x0c, serial.to_string().as_bytes()));
    let mut rdns = inner.to_vec();
    rdns.extend(tlv(0x31, &tlv(0x30, &cn)));
    Ok(tlv(0x30, &rdns))
}

/// ProxyCertInfo (critical: inherit all of the issuer's rights, no path limit) and key usage
/// (critical: digital signature, key encipherment).
fn extensions() -> Vec<u8> {
    const PROXY_CERT_INFO: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x0e];
    const INHERIT_ALL: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x15, 0x01];
    const KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x0f];
    let critical = [0x01, 0x01, 0xff];
    let mut pci = tlv(0x06, PROXY_CERT_INFO);
    pci.extend(critical);
    pci.extend(tlv(0x04, &tlv(0x30, &tlv(0x30, &tlv(0x06, INHERIT_ALL)))));
    let mut usage = tlv(0x06, KEY_USAGE);
    usage.extend(critical);
    // BIT STRING, 5 unused bits: digitalSignature (bit 0) and keyEncipherment (bit 2).
    usage.extend(tlv(0x04, &tlv(0x03, &[0x05, 0xa0])));
    let mut all = tlv(0x30, &pci);
    all.extend(tlv(0x30, &usage));
    all
}

/// A DER element: tag, length, value.
fn tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|&b| b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(value);
    out
}

/// The contents of the DER element at the start of `der`, and what follows it.
fn contents(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let first = *der.get(1)?;
    let (len, at) = if first < 0x80 {
        (first as usize, 2)
    } else {
        let n = (first & 0x7f) as usize;
        let bytes = der.get(2..2 + n)?;
        (
            bytes.iter().fold(0usize, |a, &b| (a << 8) | b as usize),
            2 + n,
        )
    };
    let end = at.checked_add(len)?;
    Some((der.get(at..end)?, der.get(end..)?))
}

/// A non-negative INTEGER's content octets.
fn integer(n: u64) -> Vec<u8> {
    let mut bytes: Vec<u8> = n
        .to_be_bytes()
        .into_iter()
        .skip_while(|&b| b == 0)
        .collect();
    if bytes.first().is_none_or(|&b| b & 0x80 != 0) {
        bytes.insert(0, 0);
    }
    bytes
}

/// UTCTime (years before 2050) or GeneralizedTime of `secs` since the epoch.
fn time(secs: i64) -> Vec<u8> {
    let c = braid_proto::time::Civil::from_unix(secs);
    // RFC 3659's YYYYMMDDHHMMSS, which GeneralizedTime is, and UTCTime without the century.
    let full = c.mdtm();
    if (1950..2050).contains(&c.year) {
        tlv(0x17, format!("{}Z", &full[2..]).as_bytes())
    } else {
        tlv(0x18, format!("{full}Z").as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_come_out_as_the_calendar_has_them() {
        assert_eq!(time(951_782_400), tlv(0x17, b"000229000000Z"));
        assert_eq!(time(2_524_608_000), tlv(0x18, b"20500101000000Z"));
    }

    #[test]
    fn a_request_is_signed_as_a_proxy_of_the_issuer_with_one_cn_more() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "braid test");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        params.not_after = rcgen::date_time_ymd(2030, 1, 1);
        let issuer_key = rcgen::KeyPair::generate().unwrap();
        let issuer = params.self_signed(&issuer_key).unwrap();
        let requester = rcgen::KeyPair::generate().unwrap();
        let request = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&requester)
            .unwrap();
        let key = crate::engine::gsi_data::test_grid::signer(&issuer_key);
        let now = 1_800_000_000;
        let der = sign_request(request.der(), issuer.der(), key.as_ref(), now).unwrap();

        let (rest, proxy) = x509_parser::certificate::X509Certificate::from_der(&der).unwrap();
        assert!(rest.is_empty());
        let (_, signed_by) =
            x509_parser::certificate::X509Certificate::from_der(issuer.der()).unwrap();
        let named = signed_by.subject().to_string();
        assert!(named.contains("CN=alice") && named.contains("O=braid test"));
        assert_eq!(proxy.issuer().to_string(), named);
        let serial = proxy
            .tbs_certificate
            .raw_serial_as_string()
            .replace(':', "");
        let serial = u64::from_str_radix(&serial, 16).unwrap();
        assert_eq!(proxy.subject().to_string(), format!("{named}, CN={serial}"));
        // The requester's key, signed by the issuer's.
        assert_eq!(
            proxy.public_key().raw,
            x509_parser::certification_request::X509CertificationRequest::from_der(request.der())
                .unwrap()
                .1
                .certification_request_info
                .subject_pki
                .raw
        );
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            &signed_by.public_key().subject_public_key.data,
        )
        .verify(proxy.tbs_certificate.as_ref(), &proxy.signature_value.data)
        .unwrap();
        let pci = proxy
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.6.1.5.5.7.1.14")
            .unwrap();
        assert!(pci.critical);
        assert_eq!(proxy.validity().not_before.timestamp(), now - SKEW_SECS);
        assert_eq!(proxy.validity().not_after.timestamp(), now + LIFETIME_SECS);
        // An expired credential signs nothing.
        let late = 1_900_000_000; // 2030-03-17
        assert!(sign_request(request.der(), issuer.der(), key.as_ref(), late).is_err());
    }
}
