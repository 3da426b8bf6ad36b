//! GridFTP's progress and restart markers (`112 Perf Marker`, `111 Range Marker`): written by
//! the server while an upload runs, read by the client to know what is stored. And braid's
//! own `113 Sender` report: what the sending server's kernel says of a download's data
//! connections, so that the client's self-tuning sees loss and delay on a download as it does
//! on an upload.

use crate::ranges::RangeSet;
use crate::reply::Reply;

/// `111 Range Marker a-b,...`: byte ranges the receiver has stored (sent during an upload).
pub fn range_marker(ranges: &RangeSet) -> Reply {
    Reply::new(111, format!("Range Marker {ranges}"))
}

/// The ranges a `111 Range Marker` reply reports; None for any other reply.
pub fn parse_range_marker(r: &Reply) -> Option<RangeSet> {
    if r.code != 111 {
        return None;
    }
    let text = r.text();
    let ranges = text.trim().strip_prefix("Range Marker")?.trim();
    RangeSet::parse(ranges).ok()
}

/// `112-Perf Marker`: progress of a transfer, as GridFTP clients parse it.
pub fn perf_marker(unix_time: f64, bytes: u64) -> Reply {
    Reply::multi(
        112,
        vec![
            "Perf Marker".into(),
            format!(" Timestamp:  {unix_time:.1}"),
            " Stripe Index: 0".into(),
            format!(" Stripe Bytes Transferred: {bytes}"),
            " Total Stripe Count: 1".into(),
            "End.".into(),
        ],
    )
}

/// A sending side's data connections, summed: from `TCP_INFO` of each open one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SenderReport {
    /// Bytes sent, retransmissions included.
    pub sent: u64,
    /// Bytes sent again.
    pub resent: u64,
    /// Smoothed RTT, averaged over the connections, µs.
    pub rtt_us: u32,
    /// The lowest RTT any of them has seen, µs.
    pub min_rtt_us: u32,
    /// Their congestion control.
    pub cc: Option<crate::retr_opts::CcName>,
    /// Time they had data in flight, summed, ms; and of that, the time the receiver's window
    /// and the sender's buffer held them back (what limits a download, seen from its sender).
    pub busy_ms: u64,
    pub rwnd_limited_ms: u64,
    pub sndbuf_limited_ms: u64,
    /// Connections open and sending: a sender that tunes their count (a copy between
    /// servers) says what it chose (0: not said).
    pub open: u32,
}

/// `113 Sender sent=… resent=… rtt_us=… min_rtt_us=… cc=…`: sent by a braid server to a
/// braid client (one that asked for elastic transfers) during a download.
pub fn sender_marker(r: &SenderReport) -> Reply {
    let cc = r.cc.map(|c| format!(" cc={c}")).unwrap_or_default();
    let open = match r.open {
        0 => String::new(),
        n => format!(" open={n}"),
    };
    Reply::new(
        113,
        format!(
            "Sender sent={} resent={} rtt_us={} min_rtt_us={} busy_ms={} rwnd_ms={} sndbuf_ms={}{cc}{open}",
            r.sent,
            r.resent,
            r.rtt_us,
            r.min_rtt_us,
            r.busy_ms,
            r.rwnd_limited_ms,
            r.sndbuf_limited_ms
        ),
    )
}

/// The report a `113 Sender` reply carries; None for any other reply. Unknown fields are
/// skipped, so a later server may add some.
pub fn parse_sender_marker(r: &Reply) -> Option<SenderReport> {
    if r.code != 113 {
        return None;
    }
    let text = r.text();
    let fields = text.trim().strip_prefix("Sender")?;
    let mut out = SenderReport::default();
    for field in fields.split_whitespace() {
        let (k, v) = field.split_once('=')?;
        match k {
            "sent" => out.sent = v.parse().ok()?,
            "resent" => out.resent = v.parse().ok()?,
            "rtt_us" => out.rtt_us = v.parse().ok()?,
            "min_rtt_us" => out.min_rtt_us = v.parse().ok()?,
            "cc" => out.cc = crate::retr_opts::CcName::parse(v).ok(),
            "busy_ms" => out.busy_ms = v.parse().ok()?,
            "rwnd_ms" => out.rwnd_limited_ms = v.parse().ok()?,
            "sndbuf_ms" => out.sndbuf_limited_ms = v.parse().ok()?,
            "open" => out.open = v.parse().ok()?,
            _ => {}
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_report_survives_its_wire_form() {
        let r = SenderReport {
            sent: 123_456_789_012,
            resent: 4_096,
            rtt_us: 590_123,
            min_rtt_us: 590_000,
            cc: crate::retr_opts::CcName::parse("cubic").ok(),
            busy_ms: 12_000,
            rwnd_limited_ms: 7_000,
            sndbuf_limited_ms: 250,
            open: 7,
        };
        let wire = sender_marker(&r).to_bytes();
        let mut p = crate::ReplyParser::new();
        p.feed(&wire);
        let back = p.next_reply().unwrap().unwrap();
        assert_eq!(parse_sender_marker(&back), Some(r));
        let later = Reply::new(113, "Sender sent=5 resent=1 cwnd=10 rtt_us=7 min_rtt_us=6");
        assert_eq!(parse_sender_marker(&later).map(|r| r.sent), Some(5));
        for bad in ["Sender sent=x", "Sender sent", "Perf sent=1"] {
            assert_eq!(parse_sender_marker(&Reply::new(113, bad)), None, "{bad}");
        }
        assert_eq!(parse_sender_marker(&Reply::new(112, "Sender sent=1")), None);
    }
}
