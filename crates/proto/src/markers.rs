//! GridFTP's progress and restart markers (`112 Perf Marker`, `111 Range Marker`): written by
//! the server while an upload runs, read by the client to know what is stored.

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
