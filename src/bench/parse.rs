//! What the tools print about a run: braid's and iperf3's JSON, curl's timings, ping's lines.

use serde::Serialize;

/// What the sending side's kernel said about why it could not send faster (`TCP_INFO`, all
/// data connections together), for braid uploads.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SenderLimits {
    pub busy_ms: f64,
    /// Waiting for the receiver's window.
    pub rwnd_limited_ms: f64,
    /// Waiting for room in its own send buffer.
    pub sndbuf_limited_ms: f64,
}

impl SenderLimits {
    /// Which limit held the sender for most of its busy time, when one held it for at
    /// least a fifth.
    pub fn dominant(&self) -> Option<&'static str> {
        if self.busy_ms <= 0.0 {
            return None;
        }
        let (name, ms) = if self.rwnd_limited_ms >= self.sndbuf_limited_ms {
            ("receive window", self.rwnd_limited_ms)
        } else {
            ("send buffer", self.sndbuf_limited_ms)
        };
        (ms / self.busy_ms >= 0.2).then_some(name)
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Measured {
    /// Why the run gave no number.
    pub error: Option<String>,
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Data connections the tool used (braid's -n auto decides for itself).
    pub streams: Option<u32>,
    pub retransmits: Option<u64>,
    pub sender: Option<SenderLimits>,
    /// Ping RTTs during the run: (seconds since the benchmark started, ms).
    pub ping: Vec<(f64, f64)>,
    /// The whole command by the clock (login and all).
    pub wall_seconds: f64,
    /// CPU seconds the client and the servers used for the run (the client alone against a
    /// remote server).
    pub cpu_seconds: Option<f64>,
    /// braid: seconds from the transfer's start until its rate first reached 90 % of where it
    /// settled ([`ramp_to_90`]): how long the self-tuning takes to find its count.
    pub ramp_seconds: Option<f64>,
    /// braid: its data connections were TLS (its summary counts their handshakes).
    pub tls: bool,
    /// braid, when it agreed on compressed blocks: the bytes on the wire and zstd's levels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<serde_json::Value>,
}

/// `[epoch] 64 bytes from ...: icmp_seq=1 ttl=64 time=21.6 ms` (ping -D) → (epoch, ms).
pub fn parse_ping_line(line: &str) -> Option<(f64, f64)> {
    let stamp = line.strip_prefix('[')?.split(']').next()?.parse().ok()?;
    let ms = line.split("time=").nth(1)?.split_whitespace().next()?;
    Some((stamp, ms.parse().ok()?))
}

/// curl's `-w "%{size_download} %{size_upload} %{time_pretransfer} %{time_total}"`: the time
/// from the transfer command to the end, as braid times itself.
pub fn parse_curl(stdout: &str) -> Measured {
    let v: Vec<f64> = stdout
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let [down, up, pre, total] = v[..] else {
        return Measured {
            error: Some(format!("curl printed {stdout:?}, not its four numbers")),
            ..Measured::default()
        };
    };
    let bytes = down.max(up);
    let seconds = (total - pre).max(1e-6);
    Measured {
        bytes: bytes as u64,
        seconds,
        bytes_per_second: bytes / seconds,
        streams: Some(1),
        ..Measured::default()
    }
}

/// The last JSON line of `braid get|put --json`: bytes, seconds, connections, and for
/// uploads the kernel's sender-side limits from each connection's last timeline row.
pub fn parse_braid(stdout: &str) -> Measured {
    let Some(v) = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    else {
        return Measured {
            error: Some("braid printed no JSON summary".into()),
            ..Measured::default()
        };
    };
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64());
    let mut m = Measured {
        bytes: f("bytes").unwrap_or(0.0) as u64,
        seconds: f("seconds").unwrap_or(0.0),
        bytes_per_second: f("bytes_per_second").unwrap_or(0.0),
        streams: f("streams").map(|s| s as u32),
        tls: v.get("tls_handshakes").is_some(),
        compression: v.get("compression").cloned(),
        ..Measured::default()
    };
    if let Some(rows) = v.get("timeline").and_then(|t| t.as_array()) {
        // Each connection's last row holds its totals.
        let mut last = std::collections::BTreeMap::new();
        for r in rows {
            if let Some(c) = r.get("conn").and_then(|c| c.as_u64()) {
                last.insert(c, r);
            }
        }
        let sum = |k: &str| -> Option<f64> {
            let vals: Vec<f64> = last
                .values()
                .filter_map(|r| r.get(k).and_then(|x| x.as_f64()))
                .collect();
            (!vals.is_empty()).then(|| vals.iter().sum())
        };
        m.retransmits = sum("retransmits").map(|r| r as u64);
        m.ramp_seconds = ramp_to_90(rows);
        // A receiver's TCP_INFO has no sending time: only an upload says anything here.
        if let Some(busy) = sum("busy_ms").filter(|b| *b > 0.0) {
            m.sender = Some(SenderLimits {
                busy_ms: busy,
                rwnd_limited_ms: sum("rwnd_limited_ms").unwrap_or(0.0),
                sndbuf_limited_ms: sum("sndbuf_limited_ms").unwrap_or(0.0),
            });
        }
    }
    // A download: the braid server's own report of its sending.
    let sender = &v["sender"];
    if let Some(busy) = sender["busy_ms"].as_f64().filter(|b| *b > 0.0) {
        m.sender = Some(SenderLimits {
            busy_ms: busy,
            rwnd_limited_ms: sender["rwnd_limited_ms"].as_f64().unwrap_or(0.0),
            sndbuf_limited_ms: sender["sndbuf_limited_ms"].as_f64().unwrap_or(0.0),
        });
    }
    if m.seconds <= 0.0 {
        m.error = Some("braid's summary has no duration".into());
    }
    m
}

/// The whole second from the transfer's start at which its rate, summed over connections from
/// the kernel's byte counters (`moved` in each timeline row), first reached 90 % of its final
/// level: the median of the seconds in the run's second half. None for a run too short to
/// tell (under 4 seconds with counters).
pub fn ramp_to_90(rows: &[serde_json::Value]) -> Option<f64> {
    let mut series: std::collections::BTreeMap<u64, Vec<(f64, f64)>> = Default::default();
    for r in rows {
        let (Some(conn), Some(t), Some(moved)) = (
            r.get("conn").and_then(|c| c.as_u64()),
            r.get("t").and_then(|t| t.as_f64()),
            r.get("moved").and_then(|m| m.as_f64()),
        ) else {
            continue;
        };
        series.entry(conn).or_default().push((t, moved));
    }
    let mut per_second: std::collections::BTreeMap<u64, f64> = Default::default();
    for points in series.values() {
        for w in points.windows(2) {
            let ((t0, m0), (t1, m1)) = (w[0], w[1]);
            if t1 > t0 {
                *per_second.entry(t1 as u64).or_default() += (m1 - m0) / (t1 - t0);
            }
        }
    }
    if per_second.len() < 4 {
        return None;
    }
    let mut late: Vec<f64> = per_second
        .values()
        .skip(per_second.len() / 2)
        .copied()
        .collect();
    late.sort_by(f64::total_cmp);
    let settled = late[late.len() / 2];
    per_second
        .iter()
        .find(|(_, rate)| **rate >= 0.9 * settled)
        .map(|(s, _)| *s as f64)
}

/// iperf3 -J: what the receiver got, and the sender's retransmissions.
pub fn parse_iperf3(stdout: &str) -> Measured {
    let v: serde_json::Value = match serde_json::from_str(stdout) {
        Ok(v) => v,
        Err(e) => {
            return Measured {
                error: Some(format!("iperf3 printed no JSON: {e}")),
                ..Measured::default()
            };
        }
    };
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Measured {
            error: Some(format!("iperf3: {e}")),
            ..Measured::default()
        };
    }
    let end = &v["end"];
    let got = &end["sum_received"];
    let seconds = got["seconds"].as_f64().unwrap_or(0.0);
    let (received, sent) = (got["bytes"].as_u64(), end["sum_sent"]["bytes"].as_u64());
    // iperf3's receiver stops counting when the client says it has written everything, while
    // a socket buffer and a queue of data may still be on their way. Its rate over that span
    // is still a fair sample, unless the span missed most of the data (a run shorter than the
    // buffers): then it says nothing.
    let short = match (received, sent) {
        (Some(r), Some(s)) if r.saturating_mul(2) < s => Some(format!(
            "iperf3's receiver counted {r} of the {s} bytes sent (it stops counting once the \
             client has written everything, and socket buffers and the link's queue held more \
             than that): use a larger --size"
        )),
        _ => None,
    };
    Measured {
        error: short
            .or_else(|| (seconds <= 0.0).then(|| "iperf3 reported no transfer".to_string())),
        bytes: got["bytes"].as_u64().unwrap_or(0),
        seconds,
        bytes_per_second: got["bits_per_second"].as_f64().unwrap_or(0.0) / 8.0,
        streams: end["streams"].as_array().map(|s| s.len() as u32),
        retransmits: end["sum_sent"]["retransmits"].as_u64(),
        ..Measured::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_lines() {
        assert_eq!(
            parse_ping_line(
                "[1732464000.250000] 64 bytes from 198.18.0.2: icmp_seq=3 ttl=64 time=21.6 ms"
            ),
            Some((1732464000.25, 21.6))
        );
        assert_eq!(
            parse_ping_line("PING 198.18.0.2 (198.18.0.2) 56(84) bytes of data."),
            None
        );
        assert_eq!(
            parse_ping_line(
                "[1732464000.250000] From 198.18.0.1 icmp_seq=3 Destination Host Unreachable"
            ),
            None
        );
    }

    #[test]
    fn the_ramp_is_the_first_second_at_90_percent_of_the_settled_rate() {
        // Two connections: one at 100 bytes/s from the start, one that joins at second 3 with
        // 100 more; the rate settles at 200 bytes/s and reaches it (over 180) in second 4.
        let mut rows = Vec::new();
        for t in 0..=8u32 {
            rows.push(serde_json::json!({"t": t, "conn": 0, "moved": 100 * t}));
            if t >= 3 {
                rows.push(serde_json::json!({"t": t, "conn": 1, "moved": 100 * (t - 3)}));
            }
        }
        assert_eq!(ramp_to_90(&rows), Some(4.0));
        // Without the kernel's counters, or for three seconds, there is nothing to tell.
        let bare: Vec<_> = (0..9)
            .map(|t| serde_json::json!({"t": t, "conn": 0}))
            .collect();
        assert_eq!(ramp_to_90(&bare), None);
        assert_eq!(ramp_to_90(&rows[..4]), None);
    }

    #[test]
    fn braid_summary_and_sender_limits() {
        let out = r#"{"op":"put","bytes":4000000,"seconds":2.0,"bytes_per_second":2000000.0,"streams":2,"timeline":[
            {"t":1.0,"conn":0,"busy_ms":500.0,"rwnd_limited_ms":100.0,"sndbuf_limited_ms":0.0,"retransmits":1},
            {"t":2.0,"conn":0,"busy_ms":1000.0,"rwnd_limited_ms":600.0,"sndbuf_limited_ms":0.0,"retransmits":2},
            {"t":2.0,"conn":1,"busy_ms":900.0,"rwnd_limited_ms":500.0,"sndbuf_limited_ms":100.0,"retransmits":0}]}"#
            .replace('\n', "");
        let m = parse_braid(&format!("noise\n{out}\n"));
        assert_eq!(m.error, None);
        assert_eq!((m.bytes, m.seconds, m.streams), (4_000_000, 2.0, Some(2)));
        assert_eq!(m.retransmits, Some(2));
        let s = m.sender.unwrap();
        assert_eq!(
            (s.busy_ms, s.rwnd_limited_ms, s.sndbuf_limited_ms),
            (1900.0, 1100.0, 100.0)
        );
        assert_eq!(s.dominant(), Some("receive window"));
        assert!(parse_braid("not json").error.is_some());
        // A download carries the server's report instead.
        let get = r#"{"op":"get","bytes":10,"seconds":1.0,"bytes_per_second":10.0,"streams":1,
            "sender":{"sent":10,"resent":0,"busy_ms":900,"rwnd_limited_ms":0,"sndbuf_limited_ms":600}}"#
            .replace('\n', "");
        let s = parse_braid(&get).sender.unwrap();
        assert_eq!((s.busy_ms, s.sndbuf_limited_ms), (900.0, 600.0));
        assert_eq!(s.dominant(), Some("send buffer"));
    }

    #[test]
    fn curl_times_from_the_transfer_command() {
        let m = parse_curl("0 2000000 1.5 3.5");
        assert_eq!(m.error, None);
        assert_eq!(
            (m.bytes, m.seconds, m.bytes_per_second),
            (2_000_000, 2.0, 1_000_000.0)
        );
        assert!(parse_curl("oops").error.is_some());
    }

    #[test]
    fn iperf3_report() {
        let out = r#"{"start":{},"end":{"streams":[{},{}],"sum_sent":{"retransmits":7},
            "sum_received":{"bytes":1000000,"seconds":4.0,"bits_per_second":2000000.0}}}"#;
        let m = parse_iperf3(out);
        assert_eq!(m.error, None);
        assert_eq!(
            (m.bytes, m.seconds, m.bytes_per_second),
            (1_000_000, 4.0, 250_000.0)
        );
        assert_eq!((m.streams, m.retransmits), (Some(2), Some(7)));
        assert!(
            parse_iperf3(r#"{"error":"unable to connect"}"#)
                .error
                .is_some()
        );
        // A receiver that counted less than was sent is an error, not a low rate.
        let short = r#"{"end":{"sum_sent":{"bytes":2097152},
            "sum_received":{"bytes":0,"seconds":0.01,"bits_per_second":0.0}}}"#;
        assert!(parse_iperf3(short).error.unwrap().contains("larger --size"));
    }
}
