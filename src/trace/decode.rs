//! From a captured frame to the TCP facts the analysis needs. Pure: bytes in, a segment (or
//! the reason there is none) out. Lengths come from the IP header, not from what was captured,
//! so captures cut short by a snap length still count every byte that was on the wire.

use etherparse::{EtherType, LaxNetSlice, LaxSlicedPacket, TcpOptionElement, TcpSlice};
use std::net::{IpAddr, SocketAddr};

/// Link-layer header types (pcap LINKTYPE_* values) braid reads.
pub const ETHERNET: i32 = 1;
pub const RAW: i32 = 101;
pub const IPV4: i32 = 228;
pub const IPV6: i32 = 229;
pub const LINUX_SLL: i32 = 113;
pub const LINUX_SLL2: i32 = 276;

/// One TCP segment as seen on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
    pub has_ack: bool,
    /// The raw window field (before scaling).
    pub window: u16,
    /// The window scale option, on SYNs that carry it.
    pub window_scale: Option<u8>,
    /// TCP payload bytes, from the IP header's lengths.
    pub data_len: u32,
    /// IP packet bytes (IP and TCP headers included), as bps.awk charges them.
    pub wire_len: u32,
    /// Payload bytes the capture did not keep.
    pub truncated: bool,
}

/// Why a frame yields no segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    UnknownLinkType,
    NotIp,
    NotTcp,
    Fragment,
    /// The headers themselves were cut by the snap length or are malformed.
    Short,
}

pub fn decode(linktype: i32, frame: &[u8]) -> Result<Segment, Skip> {
    let packet = match linktype {
        ETHERNET => LaxSlicedPacket::from_ethernet(frame).map_err(|_| Skip::Short)?,
        RAW | IPV4 | IPV6 => LaxSlicedPacket::from_ip(frame).map_err(|_| Skip::Short)?,
        LINUX_SLL => {
            let proto = frame.get(14..16).ok_or(Skip::Short)?;
            LaxSlicedPacket::from_ether_type(
                EtherType(u16::from_be_bytes([proto[0], proto[1]])),
                &frame[16..],
            )
        }
        LINUX_SLL2 => {
            let proto = frame.get(0..2).ok_or(Skip::Short)?;
            let rest = frame.get(20..).ok_or(Skip::Short)?;
            LaxSlicedPacket::from_ether_type(
                EtherType(u16::from_be_bytes([proto[0], proto[1]])),
                rest,
            )
        }
        _ => return Err(Skip::UnknownLinkType),
    };
    let (src_ip, dst_ip, ip_len, ip_payload_len, payload) = match &packet.net {
        Some(LaxNetSlice::Ipv4(v4)) => {
            let h = v4.header();
            let header_len = u32::from(h.ihl()) * 4;
            let total = u32::from(h.total_len());
            if h.is_fragmenting_payload() {
                return Err(Skip::Fragment);
            }
            let ext = v4.extensions().auth.map_or(0, |a| a.slice().len() as u32);
            (
                IpAddr::V4(h.source_addr()),
                IpAddr::V4(h.destination_addr()),
                total,
                total.saturating_sub(header_len + ext),
                v4.payload(),
            )
        }
        Some(LaxNetSlice::Ipv6(v6)) => {
            let h = v6.header();
            let ext = v6.extensions().slice().len() as u32;
            let payload_len = u32::from(h.payload_length());
            if v6.payload().fragmented {
                return Err(Skip::Fragment);
            }
            (
                IpAddr::V6(h.source_addr()),
                IpAddr::V6(h.destination_addr()),
                payload_len + 40,
                payload_len.saturating_sub(ext),
                v6.payload(),
            )
        }
        _ => return Err(Skip::NotIp),
    };
    if payload.ip_number != etherparse::IpNumber::TCP {
        return Err(Skip::NotTcp);
    }
    let tcp = TcpSlice::from_slice(payload.payload).map_err(|_| Skip::Short)?;
    let header_len = u32::from(tcp.data_offset()) * 4;
    let data_len = ip_payload_len.saturating_sub(header_len);
    let window_scale = tcp.options_iterator().find_map(|o| match o {
        Ok(TcpOptionElement::WindowScale(s)) => Some(s),
        _ => None,
    });
    Ok(Segment {
        src: SocketAddr::new(src_ip, tcp.source_port()),
        dst: SocketAddr::new(dst_ip, tcp.destination_port()),
        seq: tcp.sequence_number(),
        ack: tcp.acknowledgment_number(),
        syn: tcp.syn(),
        fin: tcp.fin(),
        rst: tcp.rst(),
        has_ack: tcp.ack(),
        window: tcp.window_size(),
        window_scale,
        data_len,
        wire_len: ip_len,
        truncated: (tcp.payload().len() as u32) < data_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv4 + TCP (20-byte header, no options) from 198.18.0.1:40000 to 198.18.0.2:21, ack 7,
    /// window 4096, TCP `flags`; `data` bytes of payload of which `kept` were captured.
    fn ipv4_tcp(seq: u32, flags: u8, data: u32, kept: usize) -> Vec<u8> {
        let mut tcp = etherparse::TcpHeader::new(40000, 21, seq, 4096);
        tcp.acknowledgment_number = 7;
        tcp.ack = flags & 0x10 != 0;
        tcp.psh = flags & 0x08 != 0;
        tcp.syn = flags & 0x02 != 0;
        tcp.fin = flags & 0x01 != 0;
        let mut p = Vec::new();
        let b =
            etherparse::PacketBuilder::ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64).tcp_header(tcp);
        b.write(&mut p, &vec![0xAB; data as usize]).unwrap();
        p.truncate(40 + kept);
        p
    }

    #[test]
    fn lengths_come_from_the_ip_header_even_when_the_capture_is_cut() {
        let frame = ipv4_tcp(1000, 0x18, 1448, 60);
        let s = decode(RAW, &frame).unwrap();
        assert_eq!(
            (s.seq, s.ack, s.data_len, s.wire_len),
            (1000, 7, 1448, 1488)
        );
        assert!(s.truncated && s.has_ack && !s.syn);
        assert_eq!(s.src, "198.18.0.1:40000".parse().unwrap());
        assert_eq!(s.window, 4096);
        // The same packet behind an Ethernet header and behind Linux cooked headers.
        let mut eth = vec![0u8; 12];
        eth.extend_from_slice(&[0x08, 0x00]);
        eth.extend_from_slice(&frame);
        assert_eq!(decode(ETHERNET, &eth), Ok(s.clone()));
        let mut sll = vec![0u8; 14];
        sll.extend_from_slice(&[0x08, 0x00]);
        sll.extend_from_slice(&frame);
        assert_eq!(decode(LINUX_SLL, &sll), Ok(s.clone()));
        let mut sll2 = vec![0x08, 0x00];
        sll2.extend_from_slice(&[0u8; 18]);
        sll2.extend_from_slice(&frame);
        assert_eq!(decode(LINUX_SLL2, &sll2), Ok(s));
    }

    #[test]
    fn other_traffic_is_skipped_with_a_reason() {
        let mut udp = ipv4_tcp(1, 0x10, 0, 0);
        udp[9] = 17;
        assert_eq!(decode(RAW, &udp), Err(Skip::NotTcp));
        let mut fragment = ipv4_tcp(1, 0x10, 100, 100);
        fragment[6] = 0x20; // more fragments
        assert_eq!(decode(RAW, &fragment), Err(Skip::Fragment));
        assert_eq!(decode(RAW, &[0x45, 0, 0]), Err(Skip::Short));
        assert_eq!(
            decode(RAW, &ipv4_tcp(1, 0x10, 0, 0)[..30]),
            Err(Skip::Short)
        );
        assert_eq!(decode(9999, &[]), Err(Skip::UnknownLinkType));
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        assert_eq!(decode(ETHERNET, &arp), Err(Skip::NotIp));
    }
}
