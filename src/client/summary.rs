//! What a finished transfer reports: one line for people, one JSON object for scripts
//! (`--json`), per file and per batch.

use super::url::Target;
use std::time::Instant;

/// What a braid server said of its sending during a download (`113 Sender`, the last one).
#[derive(Debug, Clone, serde::Serialize)]
pub struct SenderSeen {
    pub sent: u64,
    pub resent: u64,
    /// Its data connections' time with data in flight, summed, ms.
    pub busy_ms: u64,
    /// Of that, held back by this side's receive window.
    pub rwnd_limited_ms: u64,
    /// Of that, held back by its own send buffer.
    pub sndbuf_limited_ms: u64,
}

/// What a finished transfer reports (`--json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub op: &'static str,
    pub url: String,
    pub local: String,
    /// Bytes moved in this run.
    pub bytes: u64,
    /// Size of the whole file, when known.
    pub size: Option<u64>,
    /// Where this run started (non-zero when resumed).
    pub resumed_from: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Transfer mode used: `stream` is plain FTP over one data connection,
    /// `stream-segmented` is plain FTP with a range of the file on each of `streams`
    /// sessions, `extended-block` is MODE E over `streams` connections.
    pub mode: &'static str,
    /// Most data connections open at the same time (a small file may finish before all the
    /// asked-for connections have joined).
    pub streams: u32,
    /// Bytes each data connection carried (MODE E).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_connection_bytes: Vec<u64>,
    /// The whole-file checksum that was compared with the server's, `ALG hex`.
    pub checksum: Option<String>,
    /// MODE E: each data connection's life (when it joined and ended, bytes, how it ended).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<crate::engine::stats::LinkRecord>,
    /// MODE E: open data connections over time, `[seconds, count]` at each change.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connection_count: Vec<crate::engine::stats::Count>,
    /// MODE E: one row per open connection per second: bytes, rate and the kernel's TCP_INFO.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<crate::engine::stats::Sample>,
    /// MODE E: how the connection count was chosen, `auto` (self-tuning) or `fixed` (`-n N`,
    /// `--schedule`, or a GridFTP server, whose count is fixed per transfer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning: Option<&'static str>,
    /// `braid cp`: how the data connections reached the far side, "direct" or "ssh-channel"
    /// (through ssh's own connection, where they could not get there themselves).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_route: Option<&'static str>,
    /// MODE E: the block size used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    /// MODE E: the congestion control of the sending side's data connections (this side's
    /// for an upload, the braid server's report for a download).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    /// MODE E download from a braid server: its last report on its data connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender: Option<SenderSeen>,
    /// MODE E, `-n auto`: each decision of the self-tuning, with what it measured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<crate::engine::hooks::Note>,
    /// MODE E, `--background`: the queueing delay the controller saw, its rate each second,
    /// and the time it spent yielding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background: Option<crate::engine::background::Report>,
    /// Data connections this transfer opened (0 when it reused those of the one before).
    pub new_data_connections: u32,
    /// A striped server: the most data nodes that moved this file at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_nodes: Option<u32>,
    /// A tree's small file fetched with others as one transfer (a bundle from a braid
    /// server): how many files that transfer carried. `streams`, `per_connection_bytes` and
    /// `seconds` are then the bundle's, and its one checksum covered them all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<u32>,
    /// MODE E under TLS: the data connections' handshakes, full and resumed (a resumed one
    /// skips the certificate exchange).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_handshakes: Option<crate::engine::transfer::Handshakes>,
    /// Compressed blocks were agreed on: the bytes on the wire, and the zstd levels used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<crate::engine::compress::Report>,
}

impl Summary {
    pub fn human(&self) -> String {
        format!(
            "{} {} bytes in {:.2} s ({}/s), {} mode, {} stream(s){}{}{}",
            self.op,
            self.bytes,
            self.seconds,
            human_bytes(self.bytes_per_second),
            self.mode,
            self.streams,
            if self.resumed_from > 0 {
                format!(", resumed at byte {}", self.resumed_from)
            } else {
                String::new()
            },
            self.background.as_ref().map_or(String::new(), |b| {
                format!(
                    ", background: queue {} ms median over a {} ms base, {:.1} s yielding",
                    b.queue_p50_ms.map_or("?".into(), |q| format!("{q:.1}")),
                    b.base_ms.map_or("?".into(), |q| format!("{q:.1}")),
                    b.yielded_s
                )
            }),
            self.compression
                .as_ref()
                .filter(|c| c.compressed_blocks > 0)
                .map_or(String::new(), |c| format!(
                    ", compressed: {} on the wire (zstd level {})",
                    human_bytes(c.wire_bytes as f64),
                    c.levels
                        .iter()
                        .map(i32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
        )
    }
}

pub fn human_bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The URL without its password, for summaries and logs; `host:path` as scp writes it for a
/// file reached through ssh (`braid cp`, port 0).
pub fn display_url(t: &Target) -> String {
    if t.port == 0 {
        return format!("{}:{}", t.host, t.path);
    }
    let host = if t.host.contains(':') {
        format!("[{}]", t.host)
    } else {
        t.host.clone()
    };
    if t.gsi {
        // The path is absolute already; the user is the credential's mapping.
        let home = if t.path.starts_with('/') { "" } else { "/~/" };
        return format!("gsiftp://{}:{}{home}{}", host, t.port, t.path);
    }
    format!("ftp://{}@{}:{}/{}", t.user, host, t.port, t.path)
}

/// What a batch did, for `--json` (after the per-file summaries).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Batch {
    pub op: &'static str,
    pub files: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Always 1: the point of a batch.
    pub logins: u32,
    /// Data connections opened for the whole batch (reused ones are not counted again).
    pub data_connections: u32,
    #[serde(skip)]
    started: Instant,
}

impl Batch {
    pub fn start(op: &'static str) -> Batch {
        Batch {
            op,
            files: 0,
            bytes: 0,
            seconds: 0.0,
            bytes_per_second: 0.0,
            logins: 1,
            data_connections: 0,
            started: Instant::now(),
        }
    }

    pub fn add(&mut self, s: &Summary) {
        self.files += 1;
        self.bytes += s.bytes;
        self.data_connections += s.new_data_connections;
    }

    pub fn finish(mut self) -> Batch {
        self.seconds = self.started.elapsed().as_secs_f64();
        self.bytes_per_second = self.bytes as f64 / self.seconds.max(1e-9);
        self
    }
}

pub fn summary(
    op: &'static str,
    target: &Target,
    local: String,
    bytes: u64,
    size: Option<u64>,
    offset: u64,
    started: Instant,
) -> Summary {
    let seconds = started.elapsed().as_secs_f64();
    Summary {
        op,
        url: display_url(target),
        local,
        bytes,
        size,
        resumed_from: offset,
        seconds,
        bytes_per_second: bytes as f64 / seconds.max(1e-9),
        mode: "stream",
        streams: 1,
        per_connection_bytes: Vec::new(),
        checksum: None,
        connections: Vec::new(),
        connection_count: Vec::new(),
        timeline: Vec::new(),
        tuning: None,
        data_route: None,
        block_size: None,
        congestion: None,
        sender: None,
        decisions: Vec::new(),
        background: None,
        new_data_connections: 1,
        data_nodes: None,
        bundle: None,
        tls_handshakes: None,
        compression: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str) -> Target {
        Target {
            gsi: false,
            host: host.into(),
            port: 2121,
            user: "alice".into(),
            password: "secret".into(),
            path: "pub/f".into(),
        }
    }

    #[test]
    fn sizes_are_shown_in_binary_units() {
        assert_eq!(human_bytes(0.0), "0.0 B");
        assert_eq!(human_bytes(1023.0), "1023.0 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(3.0 * (1u64 << 30) as f64), "3.0 GiB");
        assert_eq!(human_bytes(2048.0 * (1u64 << 40) as f64), "2048.0 TiB");
    }

    #[test]
    fn a_url_is_shown_without_its_password_and_with_ipv6_in_brackets() {
        assert_eq!(display_url(&target("h")), "ftp://alice@h:2121/pub/f");
        assert_eq!(display_url(&target("::1")), "ftp://alice@[::1]:2121/pub/f");
        assert!(!display_url(&target("h")).contains("secret"));
        let far = Target {
            gsi: false,
            port: 0,
            ..target("box")
        };
        assert_eq!(display_url(&far), "box:pub/f");
    }

    #[test]
    fn the_line_for_people_says_mode_streams_and_where_a_resume_began() {
        let started = Instant::now();
        let mut s = summary(
            "get",
            &target("h"),
            "f".into(),
            1 << 20,
            Some(2 << 20),
            1 << 20,
            started,
        );
        assert_eq!(
            (s.mode, s.streams, s.new_data_connections),
            ("stream", 1, 1)
        );
        let line = s.human();
        assert!(line.starts_with("get 1048576 bytes in "), "{line}");
        assert!(
            line.contains("stream mode, 1 stream(s), resumed at byte 1048576"),
            "{line}"
        );
        s.resumed_from = 0;
        assert!(!s.human().contains("resumed"));
    }

    #[test]
    fn a_batch_adds_its_files_and_counts_only_new_data_connections() {
        let mut b = Batch::start("get-batch");
        let mut s = summary(
            "get",
            &target("h"),
            "a".into(),
            100,
            Some(100),
            0,
            Instant::now(),
        );
        b.add(&s);
        s.new_data_connections = 0;
        b.add(&s);
        let b = b.finish();
        assert_eq!(
            (b.files, b.bytes, b.data_connections, b.logins),
            (2, 200, 1, 1)
        );
        assert!(b.seconds > 0.0 && b.bytes_per_second > 0.0);
    }

    #[test]
    fn the_line_for_people_gives_background_modes_queue_and_time_yielding() {
        let mut s = summary(
            "get",
            &target("h"),
            "f".into(),
            10,
            Some(10),
            0,
            Instant::now(),
        );
        s.background = Some(crate::engine::background::Report {
            queue_p50_ms: Some(4.2),
            base_ms: Some(20.0),
            yielded_s: 1.5,
            ..Default::default()
        });
        let line = s.human();
        assert!(
            line.contains("background: queue 4.2 ms median over a 20.0 ms base, 1.5 s yielding"),
            "{line}"
        );
    }
}
