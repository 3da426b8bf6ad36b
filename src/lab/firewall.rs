//! A firewall in front of a lab host: new TCP connections reach it only on the ports it
//! accepts; a SYN to any other port is dropped without an answer, as a real firewall's DROP
//! does (no RST: the connecting side waits until its own timeout). Packets of connections
//! already open, and everything that is not a TCP SYN, pass.

use etherparse::{IpNumber, Ipv4HeaderSlice, TcpHeaderSlice};

/// The ports a host accepts new TCP connections on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepts(Vec<u16>);

impl Accepts {
    /// `22,2222`, or `none` for a host that takes no connection from the other side.
    pub fn parse(s: &str) -> Result<Accepts, String> {
        if s.trim() == "none" {
            return Ok(Accepts(Vec::new()));
        }
        s.split(',')
            .map(|p| {
                p.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| format!("{p:?} is not a port: give ports as 22,2222 or none"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Accepts)
    }

    /// Whether `packet` (IPv4) may go on: false only for a connection's opening SYN to a port
    /// not accepted.
    pub fn passes(&self, packet: &[u8]) -> bool {
        match opening_port(packet) {
            Some(port) => self.0.contains(&port),
            None => true,
        }
    }
}

/// The destination port of a TCP SYN without ACK (a connection being opened).
fn opening_port(p: &[u8]) -> Option<u16> {
    let ip = Ipv4HeaderSlice::from_slice(p).ok()?;
    if ip.protocol() != IpNumber::TCP || ip.is_fragmenting_payload() {
        return None;
    }
    let tcp = TcpHeaderSlice::from_slice(p.get(ip.slice().len()..)?).ok()?;
    (tcp.syn() && !tcp.ack()).then(|| tcp.destination_port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    fn tcp(port: u16, syn: bool, ack: bool) -> Vec<u8> {
        let mut b = etherparse::TcpHeader::new(40000, port, 1, 4096);
        b.syn = syn;
        b.ack = ack;
        let mut p = Vec::new();
        PacketBuilder::ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64)
            .tcp_header(b)
            .write(&mut p, &[])
            .unwrap();
        p
    }

    #[test]
    fn only_openings_to_other_ports_are_dropped() {
        let a = Accepts::parse("22, 2222").unwrap();
        assert!(a.passes(&tcp(22, true, false)));
        assert!(a.passes(&tcp(2222, true, false)));
        assert!(!a.passes(&tcp(40123, true, false)));
        // An answer (SYN-ACK) and the packets of open connections go on.
        assert!(a.passes(&tcp(40123, true, true)));
        assert!(a.passes(&tcp(40123, false, true)));
        let mut udp = Vec::new();
        PacketBuilder::ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64)
            .udp(5000, 40123)
            .write(&mut udp, b"x")
            .unwrap();
        assert!(a.passes(&udp));
    }

    #[test]
    fn none_takes_no_connection_and_bad_ports_are_refused() {
        let none = Accepts::parse("none").unwrap();
        assert!(!none.passes(&tcp(22, true, false)));
        assert!(none.passes(&tcp(22, false, true)));
        assert!(
            Accepts::parse("22,x")
                .unwrap_err()
                .contains("\"x\" is not a port")
        );
        assert!(Accepts::parse("0").is_err());
        assert!(Accepts::parse("70000").is_err());
    }
}
