//! Striping over data nodes (GridFTP's SPAS with several addresses, GFD.20's
//! `StripeLayout=Blocked`): the order a front end gives each node for one transfer, which bytes
//! a node sends, the SPAS reply that lists the nodes, and the reply that says which stripes
//! failed so that a client sends or fetches only those again.

use crate::ranges::RangeSet;
use crate::reply::Reply;
use std::net::{IpAddr, SocketAddrV4};

/// `OPTS BRAID NODE Client=IP;Stripe=I/N;Block=B[;Binding=HEX]`, from a front end to one of
/// its data nodes, for the next transfer: take data connections from the client at `IP`
/// (not from the front end, whose control connection this is), and move stripe `I` of `N`
/// of the file, blocks of `B` bytes dealt round-robin by offset. `Binding`: under PROT P, the
/// binding of the client's TLS session with the front end, which its data connections prove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOrder {
    pub client: IpAddr,
    pub stripe: u32,
    pub stripes: u32,
    pub block: u64,
    pub binding: Option<[u8; 32]>,
}

/// Smallest stripe block: a whole number of checksum chunks, and large enough that a node's
/// share of a big file stays a few thousand ranges.
pub const MIN_BLOCK: u64 = 4 << 20;

/// Most ranges one node's share may have: past it the blocks grow. (A receiver refuses more
/// than [`crate::ranges`]-level fragmentation; a dead node leaves a hole per block it had.)
const MOST_BLOCKS_PER_NODE: u64 = 1024;

/// The stripe block for a file of `size` bytes over `stripes` nodes: [`MIN_BLOCK`], or larger
/// so that no node has more than [`MOST_BLOCKS_PER_NODE`] blocks; always whole checksum chunks.
pub fn block_for(size: u64, stripes: u32) -> u64 {
    let chunk = crate::checksum::CHUNK;
    let most = MOST_BLOCKS_PER_NODE * u64::from(stripes.max(1));
    let want = size.div_ceil(most).max(MIN_BLOCK);
    want.div_ceil(chunk) * chunk
}

impl NodeOrder {
    pub fn format(&self) -> String {
        let mut s = format!(
            "Client={};Stripe={}/{};Block={}",
            self.client, self.stripe, self.stripes, self.block
        );
        if let Some(b) = &self.binding {
            s.push_str(";Binding=");
            s.push_str(&crate::hex::encode(b));
        }
        s
    }

    pub fn parse(s: &str) -> Result<NodeOrder, String> {
        let (mut client, mut stripe, mut block, mut binding) = (None, None, None, None);
        for part in s.trim().trim_end_matches(';').split(';') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not KEY=VALUE"))?;
            match k.trim().to_ascii_lowercase().as_str() {
                "client" => {
                    client = Some(
                        v.trim()
                            .parse::<IpAddr>()
                            .map_err(|_| format!("Client={v} is not an IP address"))?,
                    )
                }
                "stripe" => {
                    let (i, n) = v
                        .split_once('/')
                        .and_then(|(i, n)| Some((i.trim().parse().ok()?, n.trim().parse().ok()?)))
                        .filter(|&(i, n): &(u32, u32)| i < n && n <= 1024)
                        .ok_or_else(|| format!("Stripe={v} is not I/N with I < N <= 1024"))?;
                    stripe = Some((i, n));
                }
                "block" => {
                    let b: u64 = v
                        .trim()
                        .parse()
                        .ok()
                        .filter(|b: &u64| *b > 0 && b.is_multiple_of(crate::checksum::CHUNK))
                        .ok_or_else(|| {
                            format!(
                                "Block={v} is not a positive multiple of {}",
                                crate::checksum::CHUNK
                            )
                        })?;
                    block = Some(b);
                }
                "binding" => {
                    binding = Some(
                        crate::hex::decode(v.trim())
                            .ok_or_else(|| "Binding= takes 64 hex digits".to_string())?,
                    )
                }
                other => return Err(format!("{other} is not understood")),
            }
        }
        let (stripe, stripes) = stripe.ok_or("Stripe=I/N is missing")?;
        Ok(NodeOrder {
            client: client.ok_or("Client= is missing")?,
            stripe,
            stripes,
            block: block.ok_or("Block= is missing")?,
            binding,
        })
    }

    /// The part of `todo` this node moves: of the blocks `[k·B, (k+1)·B)`, those with
    /// `k mod N = I`.
    pub fn share(&self, todo: &RangeSet) -> RangeSet {
        let (b, n, i) = (self.block, u64::from(self.stripes), u64::from(self.stripe));
        let mut out = RangeSet::new();
        for (start, end) in todo.iter() {
            let mut k = start / b;
            // The first block of this stripe at or after `start`'s block.
            k += (i + n - k % n) % n;
            while k.saturating_mul(b) < end {
                let (s, e) = ((k * b).max(start), (k * b).saturating_add(b).min(end));
                if s < e {
                    out.insert(s, e);
                }
                k += n;
            }
        }
        out
    }
}

/// The SPAS reply listing one data address per node (GridFTP: one host-port per line).
pub fn spas_reply(addrs: &[SocketAddrV4]) -> Reply {
    let mut lines = vec!["Entering Striped Passive Mode".to_string()];
    lines.extend(
        addrs
            .iter()
            .map(|a| format!(" {}", crate::addr::format_host_port(*a))),
    );
    lines.push("End".into());
    Reply::multi(229, lines)
}

/// The addresses a SPAS reply lists (one stripe each).
pub fn parse_spas(reply: &Reply) -> Result<Vec<SocketAddrV4>, String> {
    if reply.code != 229 {
        return Err(format!(
            "SPAS was answered {}: {}",
            reply.code,
            reply.text()
        ));
    }
    let addrs: Vec<SocketAddrV4> = reply
        .lines
        .iter()
        .filter_map(|l| crate::addr::parse_host_port(l.trim()).ok())
        .collect();
    if addrs.is_empty() {
        return Err(format!("the SPAS reply lists no address: {}", reply.text()));
    }
    Ok(addrs)
}

const FAILED: &str = "Stripes failed: ";

/// Why a striped transfer failed: which stripes (by their place in the SPAS reply) did not
/// complete, then why each. The others did: their bytes are stored.
pub fn failed_text(failed: &[(usize, String)]) -> String {
    let list: Vec<String> = failed.iter().map(|(i, _)| i.to_string()).collect();
    let why: Vec<String> = failed
        .iter()
        .map(|(i, why)| format!("stripe {i}: {why}"))
        .collect();
    format!("{FAILED}{} ({})", list.join(","), why.join("; "))
}

/// The stripes a reply carrying a [`failed_text`] names; None if it carries none.
pub fn failed_stripes(reply: &Reply) -> Option<Vec<usize>> {
    let text = reply.text();
    let at = text.find(FAILED)? + FAILED.len();
    let list = text[at..].split_whitespace().next()?;
    list.split(',').map(|i| i.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(stripe: u32, stripes: u32, block: u64) -> NodeOrder {
        NodeOrder {
            client: "198.18.0.9".parse().unwrap(),
            stripe,
            stripes,
            block,
            binding: None,
        }
    }

    #[test]
    fn an_order_reads_back_as_written_and_bad_ones_say_why() {
        let mut o = order(2, 4, 4 << 20);
        assert_eq!(NodeOrder::parse(&o.format()).unwrap(), o);
        o.binding = Some([7; 32]);
        assert_eq!(NodeOrder::parse(&o.format()).unwrap(), o);
        for (bad, says) in [
            ("Client=x;Stripe=0/2;Block=65536", "IP address"),
            ("Client=1.2.3.4;Stripe=2/2;Block=65536", "I < N"),
            ("Client=1.2.3.4;Stripe=0/2;Block=1000", "multiple of 65536"),
            ("Client=1.2.3.4;Block=65536", "Stripe=I/N is missing"),
            (
                "Client=1.2.3.4;Stripe=0/2;Block=65536;Evil=1",
                "not understood",
            ),
        ] {
            let e = NodeOrder::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_nodes_shares_are_disjoint_blocks_dealt_in_turn_that_cover_what_is_asked() {
        let b = 65536;
        let todo: RangeSet = [(0, 10 * b + 5), (12 * b + 7, 20 * b)]
            .into_iter()
            .collect();
        let shares: Vec<RangeSet> = (0..3).map(|i| order(i, 3, b).share(&todo)).collect();
        let mut all = RangeSet::new();
        for s in &shares {
            assert_eq!(s.len(), s.iter().map(|(a, e)| e - a).sum::<u64>());
            for (a, e) in s.iter() {
                assert_eq!(all.overlap(a, e), 0, "shares overlap at {a}");
                all.insert(a, e);
            }
        }
        assert_eq!(all, todo);
        // Stripe 1 of 3 holds blocks 1, 4, 7, 10 (of which 5 bytes are asked for), 13, 16, 19.
        let one: Vec<(u64, u64)> = shares[1].iter().collect();
        assert_eq!(one[0], (b, 2 * b));
        assert_eq!(one[3], (10 * b, 10 * b + 5));
        assert_eq!(one[4], (13 * b, 14 * b));
    }

    #[test]
    fn stripe_blocks_grow_with_the_file_so_a_share_stays_short() {
        assert_eq!(block_for(2 << 30, 4), MIN_BLOCK);
        let big = block_for(1 << 40, 4);
        assert!(big.is_multiple_of(crate::checksum::CHUNK));
        assert!((1u64 << 40).div_ceil(big) <= 4 * 1024);
    }

    #[test]
    fn spas_and_failed_replies_read_back() {
        let addrs: Vec<SocketAddrV4> = vec![
            "198.18.0.2:4000".parse().unwrap(),
            "198.18.0.3:4001".parse().unwrap(),
        ];
        let r = spas_reply(&addrs);
        let mut parser = crate::ReplyParser::new();
        parser.feed(&r.to_bytes());
        let back = parser.next_reply().unwrap().unwrap();
        assert_eq!(parse_spas(&back).unwrap(), addrs);
        let why = failed_text(&[
            (1, "data node 198.18.0.3:2121: connection reset".into()),
            (3, "data node 198.18.0.5:2121: gone".into()),
        ]);
        let f = Reply::new(426, format!("Connection closed; transfer aborted: {why}."));
        assert_eq!(failed_stripes(&f), Some(vec![1, 3]));
        assert_eq!(failed_stripes(&Reply::new(451, "disk full")), None);
    }
}
