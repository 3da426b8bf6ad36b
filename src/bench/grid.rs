//! The sweep: which cells a benchmark measures, and in what order. Each round visits every
//! cell of a scenario once, in its own shuffled order, so that drift on a shared machine
//! (another job starting, the CPU warming) spreads over all cells instead of biasing the
//! ones measured last. Scenarios run one after the other, each on its own lab link.

use braid_proto::compress::Policy;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tool {
    Braid,
    /// braid's client against vsftpd: stream mode (ranges with -n N down); with
    /// --background it steers the one connection by its receive window or its pacing.
    BraidVsftpd,
    /// iperf3: TCP with nothing on top, the ceiling for a stream count and buffer.
    Iperf3,
    /// globus-url-copy -p N (MODE E) against globus-gridftp-server.
    GlobusUrlCopy,
    /// lftp against vsftpd: `pget -n N` downloads, one-stream uploads.
    Lftp,
    /// curl against vsftpd: one stream-mode connection.
    Curl,
    /// C-Kermit client and server, socket to socket (seed 003), with its own window, packet
    /// length and streaming.
    Kermit,
    /// braid's client against globus-gridftp-server: MODE E with another implementation's
    /// server (and its tree pipelining with one that reads commands ahead).
    BraidGlobus,
    /// lftp against braid serve: what a plain FTP client gets from braid's server.
    LftpBraid,
    /// `braid cp` through OpenSSH: the far side started by ssh, data over TLS connections.
    BraidCp,
    /// OpenSSH's scp (SFTP underneath since OpenSSH 9.0), one stream inside ssh's channel.
    Scp,
    /// `rsync -e ssh`: one stream inside ssh's channel.
    Rsync,
}

/// The server a tool's client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Braid,
    Vsftpd,
    Gridftp,
    Iperf3,
    Kermit,
    /// OpenSSH's server, for braid cp, scp and rsync.
    Sshd,
}

impl Tool {
    pub const ALL: [Tool; 12] = [
        Tool::Braid,
        Tool::BraidVsftpd,
        Tool::BraidGlobus,
        Tool::Iperf3,
        Tool::GlobusUrlCopy,
        Tool::Lftp,
        Tool::LftpBraid,
        Tool::Curl,
        Tool::Kermit,
        Tool::BraidCp,
        Tool::Scp,
        Tool::Rsync,
    ];

    pub fn parse(s: &str) -> Result<Tool, String> {
        Tool::ALL
            .into_iter()
            .find(|t| t.name() == s || (s == "globus" && *t == Tool::GlobusUrlCopy))
            .ok_or_else(|| {
                let names: Vec<&str> = Tool::ALL.iter().map(|t| t.name()).collect();
                format!("{s:?}: the tools are {}", names.join(", "))
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            Tool::Braid => "braid",
            Tool::BraidVsftpd => "braid-vsftpd",
            Tool::Iperf3 => "iperf3",
            Tool::GlobusUrlCopy => "globus-url-copy",
            Tool::Lftp => "lftp",
            Tool::Curl => "curl",
            Tool::Kermit => "kermit",
            Tool::BraidGlobus => "braid-globus",
            Tool::LftpBraid => "lftp-braid",
            Tool::BraidCp => "braid-cp",
            Tool::Scp => "scp",
            Tool::Rsync => "rsync",
        }
    }

    pub fn server(self) -> Server {
        match self {
            Tool::Braid | Tool::LftpBraid => Server::Braid,
            Tool::BraidVsftpd | Tool::Lftp | Tool::Curl => Server::Vsftpd,
            Tool::BraidGlobus | Tool::GlobusUrlCopy => Server::Gridftp,
            Tool::Iperf3 => Server::Iperf3,
            Tool::Kermit => Server::Kermit,
            Tool::BraidCp | Tool::Scp | Tool::Rsync => Server::Sshd,
        }
    }

    /// The programs the tool needs on this machine: its client and its server.
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            Tool::Braid => &[],
            Tool::BraidVsftpd => &["vsftpd"],
            Tool::Iperf3 => &["iperf3"],
            Tool::GlobusUrlCopy => &["globus-url-copy", "globus-gridftp-server"],
            Tool::Lftp => &["lftp", "vsftpd"],
            Tool::Curl => &["curl", "vsftpd"],
            Tool::Kermit => &["kermit"],
            Tool::BraidGlobus => &["globus-gridftp-server"],
            Tool::LftpBraid => &["lftp"],
            Tool::BraidCp => &["sshd", "ssh", "ssh-keygen"],
            Tool::Scp => &["sshd", "scp", "ssh-keygen"],
            Tool::Rsync => &["sshd", "rsync", "ssh-keygen"],
        }
    }

    /// Whether the tool can move a whole tree (`braid bench --files`).
    pub fn moves_trees(self) -> bool {
        !matches!(self, Tool::Iperf3 | Tool::Curl | Tool::Kermit)
    }

    /// Tools that report no time of their own: the bench times the whole command and takes
    /// off what a 1-byte file costs them.
    pub fn timed_by_clock(self) -> bool {
        matches!(
            self,
            Tool::Lftp
                | Tool::LftpBraid
                | Tool::GlobusUrlCopy
                | Tool::Kermit
                | Tool::Scp
                | Tool::Rsync
        )
    }

    /// Whether the tool can run a cell: only braid has blocks and self-tuning; curl has one
    /// stream and no buffer option; lftp uploads over one stream.
    pub fn supports(
        self,
        direction: Direction,
        streams: Streams,
        buffer: Option<u64>,
        block: Option<u64>,
    ) -> bool {
        let fixed = matches!(streams, Streams::Fixed(_));
        match self {
            Tool::Braid => true,
            Tool::BraidGlobus | Tool::BraidCp => block.is_none(),
            Tool::Iperf3 | Tool::GlobusUrlCopy => fixed && block.is_none(),
            Tool::Lftp | Tool::LftpBraid | Tool::BraidVsftpd => {
                block.is_none()
                    && match direction {
                        Direction::Get => fixed,
                        Direction::Put => streams == Streams::Fixed(1),
                    }
            }
            Tool::Curl | Tool::Kermit | Tool::Scp | Tool::Rsync => {
                streams == Streams::Fixed(1) && buffer.is_none() && block.is_none()
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// The client in `left` downloads from the server in `right`.
    Get,
    /// The client uploads.
    Put,
}

impl Direction {
    pub fn parse(s: &str) -> Result<Direction, String> {
        match s {
            "get" => Ok(Direction::Get),
            "put" => Ok(Direction::Put),
            _ => Err(format!("{s:?}: the directions are get and put")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Direction::Get => "get",
            Direction::Put => "put",
        }
    }
}

/// A stream count: a number, or braid's self-tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    Fixed(u32),
    Auto,
}

impl Streams {
    pub fn parse(s: &str) -> Result<Streams, String> {
        if s == "auto" {
            return Ok(Streams::Auto);
        }
        match s.parse::<u32>() {
            Ok(n @ 1..=64) => Ok(Streams::Fixed(n)),
            _ => Err(format!("{s:?}: a stream count is 1 to 64 or auto")),
        }
    }

    pub fn label(self) -> String {
        match self {
            Streams::Fixed(n) => n.to_string(),
            Streams::Auto => "auto".into(),
        }
    }
}

impl Serialize for Streams {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Streams::Fixed(n) => s.serialize_u32(*n),
            Streams::Auto => s.serialize_str("auto"),
        }
    }
}

/// One combination of the swept parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cell {
    pub scenario: String,
    pub tool: Tool,
    pub direction: Direction,
    pub streams: Streams,
    /// Socket buffer set on each data connection; None: the kernel tunes it.
    pub buffer: Option<u64>,
    /// braid's block size; None: braid's default.
    pub block: Option<u64>,
    /// The client runs under `nice -n 19` (seed 000: it changes nothing on the network).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub nice: bool,
    /// braid with `--background`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
    /// braid's `--compress` (braid's tools only; None for the others).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "policy_name"
    )]
    pub compress: Option<Policy>,
    /// Kermit's own parameters (kermit cells only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kermit: Option<Kermit>,
}

/// What Kermit's benchmark varied (seed 003): window slots, packet length, streaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Kermit {
    /// 1-32; ignored while streaming.
    pub window: u32,
    /// Bytes, up to 9024.
    pub packet: u32,
    pub streaming: bool,
}

impl Cell {
    /// The tool as a table shows it.
    pub fn tool_label(&self) -> String {
        let mut s = self.tool.name().to_string();
        if let Some(k) = self.kermit {
            s += &format!(
                " (window {}, packets {}, streaming {})",
                k.window,
                k.packet,
                if k.streaming { "on" } else { "off" }
            );
        }
        if self.nice {
            s += " (nice 19)";
        }
        if self.background {
            s += " --background";
        }
        match (self.tool, self.compress) {
            (Tool::LftpBraid, Some(Policy::On)) => s += " (MODE Z)",
            (_, Some(p)) if p != Policy::Auto => s += &format!(" --compress {}", p.name()),
            _ => {}
        }
        s
    }
}

fn policy_name<S: serde::Serializer>(p: &Option<Policy>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_str(p.name()),
        None => s.serialize_none(),
    }
}

/// The axes of a sweep.
#[derive(Debug, Clone)]
pub struct Grid {
    pub scenarios: Vec<String>,
    pub tools: Vec<Tool>,
    pub directions: Vec<Direction>,
    pub streams: Vec<Streams>,
    pub buffers: Vec<Option<u64>>,
    pub blocks: Vec<Option<u64>>,
    /// Without and/or with `nice -n 19` on the client.
    pub nice: Vec<bool>,
    /// braid without and/or with `--background` (other tools have no such mode).
    pub background: Vec<bool>,
    /// braid's `--compress` settings (other tools run once, as they are).
    pub compress: Vec<Policy>,
    /// Kermit's settings, each a cell of its own for the kermit tool.
    pub kermit: Vec<Kermit>,
}

impl Grid {
    /// Every combination, scenario by scenario, that the tool can run (see
    /// [`Tool::supports`]).
    pub fn cells(&self) -> Vec<Cell> {
        let mut out = Vec::new();
        for scenario in &self.scenarios {
            for &tool in &self.tools {
                for &direction in &self.directions {
                    for &streams in &self.streams {
                        for &buffer in &self.buffers {
                            for &block in &self.blocks {
                                if !tool.supports(direction, streams, buffer, block) {
                                    continue;
                                }
                                let kermit: Vec<Option<Kermit>> = match tool {
                                    Tool::Kermit => self.kermit.iter().copied().map(Some).collect(),
                                    _ => vec![None],
                                };
                                let background: Vec<bool> = match tool {
                                    Tool::Braid | Tool::BraidVsftpd => self.background.clone(),
                                    _ => vec![false],
                                };
                                let compress: Vec<Option<Policy>> = match tool {
                                    Tool::Braid | Tool::BraidCp => {
                                        self.compress.iter().copied().map(Some).collect()
                                    }
                                    // lftp has MODE Z, off unless asked for: a cell with it
                                    // for `on`, one without for `auto` or `off`.
                                    Tool::LftpBraid => {
                                        let mut cells = Vec::new();
                                        if self.compress.iter().any(|&p| p != Policy::On) {
                                            cells.push(None);
                                        }
                                        if self.compress.contains(&Policy::On) {
                                            cells.push(Some(Policy::On));
                                        }
                                        cells
                                    }
                                    _ => vec![None],
                                };
                                for &nice in &self.nice {
                                    for &background in &background {
                                        for &compress in &compress {
                                            for &k in &kermit {
                                                out.push(Cell {
                                                    scenario: scenario.clone(),
                                                    tool,
                                                    direction,
                                                    streams,
                                                    buffer,
                                                    block,
                                                    nice,
                                                    background,
                                                    compress,
                                                    kermit: k,
                                                });
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// One measurement to make: cell `cell` (an index into the cells), its `repeat`th time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Run {
    pub cell: usize,
    pub repeat: u32,
}

/// The order of the runs: the cells of one scenario stay together; within it, `repeats`
/// rounds, each a shuffle of all its cells (the same seed gives the same order).
pub fn schedule(cells: &[Cell], repeats: u32, seed: u64) -> Vec<Run> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(cells.len() * repeats as usize);
    let mut start = 0;
    while start < cells.len() {
        let end = start
            + cells[start..]
                .iter()
                .take_while(|c| c.scenario == cells[start].scenario)
                .count();
        for repeat in 0..repeats {
            let mut round: Vec<usize> = (start..end).collect();
            round.shuffle(&mut rng);
            out.extend(round.into_iter().map(|cell| Run { cell, repeat }));
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        Grid {
            scenarios: vec!["a".into(), "b".into()],
            tools: vec![Tool::Braid, Tool::Iperf3, Tool::Curl, Tool::Lftp],
            directions: vec![Direction::Get, Direction::Put],
            streams: vec![Streams::Fixed(1), Streams::Fixed(8), Streams::Auto],
            buffers: vec![None, Some(24 << 10)],
            blocks: vec![None, Some(1 << 20)],
            nice: vec![false],
            background: vec![false],
            compress: vec![Policy::Auto],
            kermit: Vec::new(),
        }
    }

    #[test]
    fn cells_cover_the_grid() {
        let cells = grid().cells();
        // Per scenario: braid 2 directions × 3 counts × 2 buffers × 2 blocks = 24, iperf3
        // 2 × 2 (no auto) × 2 (no blocks) = 8, curl 2 directions × 1 stream × the default
        // buffer = 2, lftp get 2 counts × 2 buffers + put 1 stream × 2 buffers = 6.
        assert_eq!(cells.len(), 2 * (24 + 8 + 2 + 6));
        assert!(
            cells
                .iter()
                .filter(|c| c.tool == Tool::Curl)
                .all(|c| c.streams == Streams::Fixed(1) && c.buffer.is_none())
        );
        assert!(!cells.iter().any(|c| c.tool == Tool::Lftp
            && c.direction == Direction::Put
            && c.streams != Streams::Fixed(1)));
        assert!(
            !cells.iter().any(
                |c| c.tool == Tool::Iperf3 && (c.streams == Streams::Auto || c.block.is_some())
            )
        );
        for (i, a) in cells.iter().enumerate() {
            assert!(!cells[i + 1..].contains(a), "{a:?} twice");
        }
    }

    #[test]
    fn lftp_braid_runs_with_mode_z_for_on_and_without_for_auto_or_off() {
        let lftp = |compress: Vec<Policy>| {
            let g = Grid {
                scenarios: vec!["a".into()],
                tools: vec![Tool::LftpBraid],
                directions: vec![Direction::Get],
                streams: vec![Streams::Fixed(1)],
                buffers: vec![None],
                blocks: vec![None],
                compress,
                ..grid()
            };
            g.cells().iter().map(|c| c.compress).collect::<Vec<_>>()
        };
        assert_eq!(lftp(vec![Policy::On]), [Some(Policy::On)]);
        assert_eq!(lftp(vec![Policy::Auto]), [None]);
        assert_eq!(
            lftp(vec![Policy::Off, Policy::On]),
            [None, Some(Policy::On)]
        );
    }

    #[test]
    fn schedule_interleaves_rounds_and_keeps_scenarios_together() {
        let cells = grid().cells();
        let runs = schedule(&cells, 3, 7);
        assert_eq!(runs.len(), cells.len() * 3);
        // Every (cell, repeat) once.
        for c in 0..cells.len() {
            for r in 0..3 {
                assert_eq!(
                    runs.iter()
                        .filter(|x| **x == Run { cell: c, repeat: r })
                        .count(),
                    1
                );
            }
        }
        // Scenario a's runs all come before b's.
        let first_b = runs
            .iter()
            .position(|r| cells[r.cell].scenario == "b")
            .unwrap();
        assert!(
            runs[first_b..]
                .iter()
                .all(|r| cells[r.cell].scenario == "b")
        );
        // Within a scenario, round r is complete before round r + 1 begins.
        let per = first_b / 3;
        for (i, run) in runs[..first_b].iter().enumerate() {
            assert_eq!(run.repeat as usize, i / per);
        }
        // Rounds are shuffled differently: not the cells' order, not all alike.
        let round = |r: usize| -> Vec<usize> {
            runs[r * per..(r + 1) * per]
                .iter()
                .map(|x| x.cell)
                .collect()
        };
        assert_ne!(round(0), (0..per).collect::<Vec<_>>());
        assert!(round(0) != round(1) || round(1) != round(2));
        // The same seed, the same order; another seed, another.
        assert_eq!(schedule(&cells, 3, 7), runs);
        assert_ne!(schedule(&cells, 3, 8), runs);
    }

    #[test]
    fn tools_parse_by_name() {
        for t in Tool::ALL {
            assert_eq!(Tool::parse(t.name()), Ok(t));
        }
        assert_eq!(Tool::parse("globus"), Ok(Tool::GlobusUrlCopy));
        let unknown = Tool::parse("bbcp").unwrap_err();
        // The refusal lists the tools there are.
        assert!(unknown.contains("braid-cp, scp, rsync"), "{unknown}");
    }

    #[test]
    fn streams_parse() {
        assert_eq!(Streams::parse("auto"), Ok(Streams::Auto));
        assert_eq!(Streams::parse("16"), Ok(Streams::Fixed(16)));
        assert!(Streams::parse("0").is_err());
        assert!(Streams::parse("65").is_err());
    }
}
