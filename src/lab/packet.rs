//! Damage that only an end-to-end check can see: flip one bit of a TCP or UDP payload, then
//! recompute the transport checksum so that the receiving kernel accepts the packet.

use etherparse::{IpNumber, Ipv4HeaderSlice, TcpHeaderSlice, UdpHeaderSlice};

/// Flips payload bit `choice % payload_bits` of an IPv4 TCP or UDP packet and fixes its
/// checksum. Returns false (packet untouched) when there is no payload to damage: other
/// protocols, IPv6, fragments, pure ACKs.
pub fn corrupt_payload(packet: &mut [u8], choice: u64) -> bool {
    let Some(at) = locate(packet) else {
        return false;
    };
    let payload_bits = (packet.len() - at.payload) as u64 * 8;
    if payload_bits == 0 {
        return false;
    }
    let bit = choice % payload_bits;
    packet[at.payload + (bit / 8) as usize] ^= 1 << (bit % 8);
    if let Some(sum) = checksum(packet, &at) {
        packet[at.checksum..at.checksum + 2].copy_from_slice(&sum.to_be_bytes());
    }
    true
}

/// Where an IPv4 packet's transport header, its payload and its checksum field start.
struct Located {
    l4: usize,
    payload: usize,
    checksum: usize,
    udp: bool,
}

/// None for anything but a whole (unfragmented, uncut) IPv4 TCP or UDP packet.
fn locate(p: &[u8]) -> Option<Located> {
    let ip = Ipv4HeaderSlice::from_slice(p).ok()?;
    let l4 = ip.slice().len();
    if usize::from(ip.total_len()) != p.len() || ip.is_fragmenting_payload() {
        return None;
    }
    match ip.protocol() {
        IpNumber::TCP => {
            let tcp = TcpHeaderSlice::from_slice(&p[l4..]).ok()?;
            let payload = l4 + tcp.slice().len();
            Some(Located {
                l4,
                payload,
                checksum: l4 + 16,
                udp: false,
            })
        }
        IpNumber::UDP => {
            UdpHeaderSlice::from_slice(&p[l4..]).ok()?;
            Some(Located {
                l4,
                payload: l4 + 8,
                checksum: l4 + 6,
                udp: true,
            })
        }
        _ => None,
    }
}

/// The transport checksum the packet needs now; None for a UDP packet sent without one
/// (checksum 0), which stays without.
fn checksum(p: &[u8], at: &Located) -> Option<u16> {
    let ip = Ipv4HeaderSlice::from_slice(p).ok()?;
    let (source, destination) = (ip.source(), ip.destination());
    let payload = &p[at.payload..];
    if at.udp {
        let udp = UdpHeaderSlice::from_slice(&p[at.l4..]).ok()?;
        if udp.checksum() == 0 {
            return None;
        }
        let header = udp.to_header();
        header
            .calc_checksum_ipv4_raw(source, destination, payload)
            .ok()
    } else {
        let tcp = TcpHeaderSlice::from_slice(&p[at.l4..]).ok()?;
        tcp.calc_checksum_ipv4_raw(source, destination, payload)
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};

    const LEFT: [u8; 4] = [198, 18, 0, 1];
    const RIGHT: [u8; 4] = [198, 18, 0, 2];

    fn udp(payload: &[u8]) -> Vec<u8> {
        let mut p = Vec::new();
        let b = PacketBuilder::ipv4(LEFT, RIGHT, 64).udp(5000, 6000);
        b.write(&mut p, payload).unwrap();
        p
    }

    fn tcp(payload: &[u8]) -> Vec<u8> {
        let mut p = Vec::new();
        let b = PacketBuilder::ipv4(LEFT, RIGHT, 64)
            .tcp(40000, 21, 1000, 4096)
            .ack(7);
        b.write(&mut p, payload).unwrap();
        p
    }

    /// Whether the packet's transport checksum is what its contents need.
    fn valid(p: &[u8]) -> bool {
        let s = SlicedPacket::from_ip(p).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = &s.net else {
            return false;
        };
        let (src, dst) = (ip.header().source(), ip.header().destination());
        match s.transport {
            Some(TransportSlice::Udp(u)) => {
                u.to_header()
                    .calc_checksum_ipv4_raw(src, dst, u.payload())
                    .unwrap()
                    == u.checksum()
            }
            Some(TransportSlice::Tcp(t)) => {
                t.to_header()
                    .calc_checksum_ipv4_raw(src, dst, t.payload())
                    .unwrap()
                    == t.checksum()
            }
            _ => false,
        }
    }

    #[test]
    fn a_flipped_payload_bit_keeps_a_valid_checksum() {
        for original in [udp(b"hello, satellite"), tcp(b"hello, satellite")] {
            assert!(valid(&original));
            let mut p = original.clone();
            assert!(corrupt_payload(&mut p, 12345));
            let changed: Vec<usize> = (0..p.len()).filter(|&i| p[i] != original[i]).collect();
            // One payload bit and the checksum, nothing else in the headers.
            let payload_at = original.len() - b"hello, satellite".len();
            let in_payload: Vec<&usize> = changed.iter().filter(|&&i| i >= payload_at).collect();
            assert_eq!(in_payload.len(), 1, "{changed:?}");
            let i = *in_payload[0];
            assert_eq!((original[i] ^ p[i]).count_ones(), 1);
            assert!(changed.len() <= 3, "{changed:?}");
            assert!(valid(&p), "checksum no longer valid");
        }
    }

    #[test]
    fn packets_without_payload_are_left_alone() {
        for mut empty in [udp(b""), tcp(b"")] {
            let before = empty.clone();
            assert!(!corrupt_payload(&mut empty, 7));
            assert_eq!(empty, before);
        }
        let mut short = vec![0x45, 0, 0, 10];
        assert!(!corrupt_payload(&mut short, 7));
        let mut ipv6 = vec![0x60; 60];
        assert!(!corrupt_payload(&mut ipv6, 7));
        // A cut packet (its IP length says more): not touched.
        let mut cut = udp(b"hello");
        cut.pop();
        let before = cut.clone();
        assert!(!corrupt_payload(&mut cut, 7));
        assert_eq!(cut, before);
    }
}
