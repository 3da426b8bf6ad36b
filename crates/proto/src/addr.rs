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

/// IPv4-mapped IPv6 addresses compare as IPv4, so a dual-stack listener does not make the
/// peer check refuse a client's own address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// How addresses are grouped into ranges for every limit here: one host or one customer
/// usually holds an IPv4 /24 or an IPv6 /48 (a site: a single host is commonly given a /64,
/// and often a /56 or /48, so /64s would let one host count as thousands of sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranges {
    /// Prefix length for IPv4 addresses.
    pub v4: u8,
    /// Prefix length for IPv6 addresses.
    pub v6: u8,
}

impl Default for Ranges {
    fn default() -> Ranges {
        Ranges { v4: 24, v6: 48 }
    }
}

impl Ranges {
    /// The range `ip` is in: its address with the host bits cleared. IPv4-mapped IPv6
    /// addresses count as IPv4.
    pub fn of(&self, ip: IpAddr) -> IpAddr {
        match canonical_ip(ip) {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4) & mask32(self.v4);
                IpAddr::from(bits.to_be_bytes())
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & mask128(self.v6);
                IpAddr::from(bits.to_be_bytes())
            }
        }
    }
}

fn mask32(len: u8) -> u32 {
    match len.min(32) {
        0 => 0,
        n => u32::MAX << (32 - n),
    }
}

fn mask128(len: u8) -> u128 {
    match len.min(128) {
        0 => 0,
        n => u128::MAX << (128 - n),
    }
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

    #[test]
    fn ranges_group_v4_by_24_and_v6_by_48_unless_told_otherwise() {
        let r = Ranges::default();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(r.of(ip("198.18.7.9")), ip("198.18.7.0"));
        assert_eq!(r.of(ip("::ffff:198.18.7.9")), ip("198.18.7.0"));
        // Eight /64s of one site are one range.
        let site: Vec<IpAddr> = (0..8)
            .map(|i| r.of(ip(&format!("2001:2:0:{i}::1"))))
            .collect();
        assert!(site.iter().all(|s| *s == ip("2001:2::")));
        assert_ne!(r.of(ip("2001:2:1::1")), ip("2001:2::"));
        let narrow = Ranges { v4: 32, v6: 64 };
        assert_eq!(narrow.of(ip("198.18.7.9")), ip("198.18.7.9"));
        assert_ne!(
            narrow.of(ip("2001:2:0:1::1")),
            narrow.of(ip("2001:2:0:2::1"))
        );
        let none = Ranges { v4: 0, v6: 0 };
        assert_eq!(none.of(ip("198.18.7.9")), ip("0.0.0.0"));
    }
}
