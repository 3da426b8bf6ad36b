//! Damage that only an end-to-end check can see: flip one bit of a TCP or UDP payload, then
//! recompute the transport checksum so that the receiving kernel accepts the packet.

/// Flips payload bit `choice % payload_bits` of an IPv4 TCP or UDP packet and fixes its
/// checksum. Returns false (packet untouched) when there is no payload to damage: other
/// protocols, IPv6, fragments, pure ACKs.
pub fn corrupt_payload(packet: &mut [u8], choice: u64) -> bool {
    let Some((l4, payload_at, checksum_at)) = locate(packet) else {
        return false;
    };
    let payload_bits = (packet.len() - payload_at) as u64 * 8;
    if payload_bits == 0 {
        return false;
    }
    let bit = choice % payload_bits;
    packet[payload_at + (bit / 8) as usize] ^= 1 << (bit % 8);
    let udp_without_checksum = packet[9] == 17 && packet[checksum_at..checksum_at + 2] == [0, 0];
    if !udp_without_checksum {
        packet[checksum_at..checksum_at + 2].copy_from_slice(&[0, 0]);
        let mut sum = transport_checksum(packet, l4);
        if packet[9] == 17 && sum == 0 {
            sum = 0xffff;
        }
        packet[checksum_at..checksum_at + 2].copy_from_slice(&sum.to_be_bytes());
    }
    true
}

/// (start of the transport header, start of its payload, offset of its checksum field).
fn locate(p: &[u8]) -> Option<(usize, usize, usize)> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    let fragment = u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0;
    if ihl < 20 || total != p.len() || fragment {
        return None;
    }
    match p[9] {
        6 if p.len() >= ihl + 20 => {
            let header = usize::from(p[ihl + 12] >> 4) * 4;
            (header >= 20 && ihl + header <= p.len()).then_some((ihl, ihl + header, ihl + 16))
        }
        17 if p.len() >= ihl + 8 => Some((ihl, ihl + 8, ihl + 6)),
        _ => None,
    }
}

/// The TCP/UDP checksum of `p[l4..]` with the IPv4 pseudo-header.
pub fn transport_checksum(p: &[u8], l4: usize) -> u16 {
    let segment = &p[l4..];
    let mut sum: u64 = 0;
    sum += u64::from(u16::from_be_bytes([p[12], p[13]]));
    sum += u64::from(u16::from_be_bytes([p[14], p[15]]));
    sum += u64::from(u16::from_be_bytes([p[16], p[17]]));
    sum += u64::from(u16::from_be_bytes([p[18], p[19]]));
    sum += u64::from(p[9]);
    sum += segment.len() as u64;
    let mut words = segment.chunks_exact(2);
    for w in &mut words {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(u16::from_be_bytes([*last, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 UDP packet 198.18.0.1:5000 -> 198.18.0.2:6000 with a valid checksum.
    fn udp(payload: &[u8]) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            1,
            0x40,
            0,
            64,
            17,
            0,
            0,
        ];
        p.extend_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
        p.extend_from_slice(&5000u16.to_be_bytes());
        p.extend_from_slice(&6000u16.to_be_bytes());
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        let sum = transport_checksum(&p, 20);
        p[26..28].copy_from_slice(&sum.to_be_bytes());
        p
    }

    #[test]
    fn a_flipped_payload_bit_keeps_a_valid_checksum() {
        let original = udp(b"hello, satellite");
        // A valid packet sums to zero with its checksum in place.
        assert_eq!(transport_checksum(&original, 20), 0);
        let mut p = original.clone();
        assert!(corrupt_payload(&mut p, 12345));
        let changed: Vec<usize> = (0..p.len()).filter(|&i| p[i] != original[i]).collect();
        // One payload byte (one bit) and the two checksum bytes, nothing in the headers.
        let payload_byte = changed
            .iter()
            .find(|&&i| i >= 28)
            .copied()
            .expect("payload changed");
        assert_eq!((original[payload_byte] ^ p[payload_byte]).count_ones(), 1);
        assert!(
            changed.iter().all(|&i| i >= 28 || i == 26 || i == 27),
            "{changed:?}"
        );
        assert_eq!(transport_checksum(&p, 20), 0, "checksum no longer valid");
    }

    #[test]
    fn packets_without_payload_are_left_alone() {
        let mut empty = udp(b"");
        let before = empty.clone();
        assert!(!corrupt_payload(&mut empty, 7));
        assert_eq!(empty, before);
        let mut short = vec![0x45, 0, 0, 10];
        assert!(!corrupt_payload(&mut short, 7));
        let mut ipv6 = vec![0x60; 60];
        assert!(!corrupt_payload(&mut ipv6, 7));
    }
}
