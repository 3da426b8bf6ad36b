//! Data-connection addresses as FTP writes them: `h1,h2,h3,h4,p1,p2` (RFC 959 PORT and PASV)
//! and `|af|addr|port|` (RFC 2428 EPRT and EPSV).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};

/// Why an address argument was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("expected h1,h2,h3,h4,p1,p2 with numbers 0-255")]
    BadHostPort,
    #[error("expected |family|address|port| as RFC 2428 gives it")]
    BadExtended,
    /// RFC 2428 reply 522: the family is neither 1 (IPv4) nor 2 (IPv6).
    #[error("network protocol {0} is not supported")]
    UnsupportedFamily(String),
}

/// Parses the RFC 959 `h1,h2,h3,h4,p1,p2` form, as in PORT arguments and 227 replies.
pub fn parse_host_port(s: &str) -> Result<SocketAddrV4, AddrError> {
    let mut n = [0u8; 6];
    let mut parts = s.trim().split(',');
    for slot in n.iter_mut() {
        let p = parts.next().ok_or(AddrError::BadHostPort)?.trim();
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AddrError::BadHostPort);
        }
        *slot = p.parse().map_err(|_| AddrError::BadHostPort)?;
    }
    if parts.next().is_some() {
        return Err(AddrError::BadHostPort);
    }
    let ip = Ipv4Addr::new(n[0], n[1], n[2], n[3]);
    Ok(SocketAddrV4::new(
        ip,
        u16::from(n[4]) << 8 | u16::from(n[5]),
    ))
}

/// Formats the RFC 959 `h1,h2,h3,h4,p1,p2` form.
pub fn format_host_port(addr: SocketAddrV4) -> String {
    let o = addr.ip().octets();
    let p = addr.port();
    format!(
        "{},{},{},{},{},{}",
        o[0],
        o[1],
        o[2],
        o[3],
        p >> 8,
        p & 0xff
    )
}

/// Finds the host-port inside a 227 reply text such as `Entering Passive Mode (h1,...,p2).`
/// RFC 959 does not fix the text around the numbers, so look for the first run of six numbers.
pub fn parse_227(text: &str) -> Result<SocketAddrV4, AddrError> {
    let start = text
        .find(|c: char| c.is_ascii_digit())
        .ok_or(AddrError::BadHostPort)?;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == ','))
        .unwrap_or(rest.len());
    parse_host_port(&rest[..end])
}

/// Parses an EPRT argument `|1|132.235.1.2|6275|` (any printable delimiter).
pub fn parse_eprt(s: &str) -> Result<SocketAddr, AddrError> {
    let d = s.chars().next().ok_or(AddrError::BadExtended)?;
    if !(d.is_ascii_graphic()) || d.is_ascii_alphanumeric() {
        return Err(AddrError::BadExtended);
    }
    let fields: Vec<&str> = s.split(d).collect();
    // "", af, addr, port, ""
    if fields.len() != 5 || !fields[0].is_empty() || !fields[4].is_empty() {
        return Err(AddrError::BadExtended);
    }
    let port: u16 = parse_port(fields[3]).ok_or(AddrError::BadExtended)?;
    let ip: IpAddr = match fields[1] {
        "1" => IpAddr::V4(fields[2].parse().map_err(|_| AddrError::BadExtended)?),
        "2" => IpAddr::V6(fields[2].parse().map_err(|_| AddrError::BadExtended)?),
        other => return Err(AddrError::UnsupportedFamily(other.to_string())),
    };
    Ok(SocketAddr::new(ip, port))
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Formats an EPRT argument.
pub fn format_eprt(addr: SocketAddr) -> String {
    let af = if addr.is_ipv4() { 1 } else { 2 };
    format!("|{}|{}|{}|", af, addr.ip(), addr.port())
}

/// Finds the port in a 229 reply text: `Entering Extended Passive Mode (|||6446|)`.
pub fn parse_229(text: &str) -> Result<u16, AddrError> {
    let open = text.find('(').ok_or(AddrError::BadExtended)?;
    let close = text[open..].find(')').ok_or(AddrError::BadExtended)? + open;
    let inner = &text[open + 1..close];
    let d = inner.chars().next().ok_or(AddrError::BadExtended)?;
    let fields: Vec<&str> = inner.split(d).collect();
    if fields.len() != 5 {
        return Err(AddrError::BadExtended);
    }
    parse_port(fields[3]).ok_or(AddrError::BadExtended)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn host_port_examples() {
        let a = parse_host_port("127,0,0,1,4,1").unwrap();
        assert_eq!(a, "127.0.0.1:1025".parse().unwrap());
        assert_eq!(
            parse_host_port("256,0,0,1,4,1"),
            Err(AddrError::BadHostPort)
        );
        assert_eq!(parse_host_port("1,2,3,4,5"), Err(AddrError::BadHostPort));
        assert_eq!(
            parse_host_port("1,2,3,4,5,6,7"),
            Err(AddrError::BadHostPort)
        );
        assert_eq!(parse_host_port("1,2,3,4,-5,6"), Err(AddrError::BadHostPort));
        assert_eq!(
            parse_227("Entering Passive Mode (10,1,2,3,200,7).").unwrap(),
            "10.1.2.3:51207".parse().unwrap()
        );
    }

    #[test]
    fn eprt_examples() {
        assert_eq!(
            parse_eprt("|1|132.235.1.2|6275|").unwrap(),
            "132.235.1.2:6275".parse().unwrap()
        );
        assert_eq!(
            parse_eprt("|2|1080::8:800:200C:417A|5282|").unwrap(),
            "[1080::8:800:200C:417A]:5282".parse().unwrap()
        );
        assert_eq!(
            parse_eprt("|3|x|1|"),
            Err(AddrError::UnsupportedFamily("3".into()))
        );
        assert_eq!(parse_eprt("|1|1.2.3.4|70000|"), Err(AddrError::BadExtended));
        assert_eq!(
            parse_229("Entering Extended Passive Mode (|||6446|)").unwrap(),
            6446
        );
    }

    proptest! {
        #[test]
        fn host_port_round_trips(ip in any::<[u8; 4]>(), port in any::<u16>()) {
            let a = SocketAddrV4::new(ip.into(), port);
            prop_assert_eq!(parse_host_port(&format_host_port(a)).unwrap(), a);
            let text = format!("Entering Passive Mode ({}).", format_host_port(a));
            prop_assert_eq!(parse_227(&text).unwrap(), a);
        }

        #[test]
        fn eprt_round_trips(addr in any::<SocketAddr>()) {
            let addr = match addr { SocketAddr::V6(v6) => SocketAddr::new(IpAddr::V6(*v6.ip()), v6.port()), a => a };
            prop_assert_eq!(parse_eprt(&format_eprt(addr)).unwrap(), addr);
        }
    }
}
