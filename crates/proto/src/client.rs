//! The client side of one control connection, as a state machine: the mirror of
//! [`crate::session::Session`].
//!
//! The driver starts an [`Op`] (log in, read the features, set up MODE E, open a passive
//! port, start or finish a transfer, ...). The session says which commands to send
//! ([`ClientSession::poll_command`]) and takes the replies ([`ClientSession::handle_reply`])
//! until the op ends ([`ClientSession::poll_outcome`]) with an [`Outcome`], or with a
//! [`Failure`] that says what went wrong **by reply code**, never by the server's wording.
//! It never touches sockets, files or clocks.
//!
//! The session remembers what is in effect on the server (TYPE, MODE, elastic transfers,
//! OPTS RETR, SBUF, data connections left open by the last MODE E transfer), so a batch of
//! transfers sends each setting once and reuses data connections (reply 125).

use crate::addr;
use crate::command::{Command, EpsvArg, Mode, TransferType};
use crate::ranges::RangeSet;
use crate::reply::Reply;
use crate::retr_opts::{CcName, RetrOpts};
use std::collections::VecDeque;

/// What FEAT said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// Feature lines, upper-cased and trimmed.
    lines: Vec<String>,
}

impl Features {
    pub fn parse(r: &Reply) -> Features {
        if r.code != 211 {
            return Features::default();
        }
        Features {
            lines: r
                .lines
                .iter()
                .skip(1)
                .map(|l| l.trim().to_ascii_uppercase())
                .filter(|l| !l.is_empty() && l != "END")
                .collect(),
        }
    }

    /// Whether a feature whose first word is `name` was listed.
    pub fn has(&self, name: &str) -> bool {
        self.lines
            .iter()
            .any(|f| f.split_whitespace().next() == Some(name))
    }

    /// A braid front end whose data nodes take private data (FEAT `BRAID-STRIPED P`).
    pub fn striped_private(&self) -> bool {
        self.lines.iter().any(|f| {
            let mut words = f.split_whitespace();
            words.next() == Some("BRAID-STRIPED") && words.any(|w| w == "P")
        })
    }

    /// A globus-gridftp-server front end with remote data nodes (`-r`): its FEAT names the
    /// `remote` storage interface (`DSI remote-13.24`), where a server alone has `DSI file-…`.
    /// Its SPAS lists the nodes.
    pub fn gridftp_striped(&self) -> bool {
        self.lines.iter().any(|f| f.starts_with("DSI REMOTE"))
    }

    /// MODE Z (draft-preston-ftpext-deflate): stream mode through zlib.
    pub fn mode_z(&self) -> bool {
        self.lines
            .iter()
            .any(|f| f.split_whitespace().eq(["MODE", "Z"]))
    }

    /// The number after a feature's name (`BRAID 2` gives 2).
    pub fn version(&self, name: &str) -> Option<u32> {
        self.lines.iter().find_map(|f| {
            let mut words = f.split_whitespace();
            (words.next() == Some(name))
                .then(|| words.next()?.parse().ok())
                .flatten()
        })
    }

    /// Whether CKSM takes `alg` here (upper case): the server lists it after CKSM, as
    /// `CKSM MD5:10;ADLER32:10;` (Globus) or `CKSM XXH3;MD5;ADLER32;` (braid).
    pub fn checksum_offered(&self, alg: &str) -> bool {
        self.lines.iter().any(|f| {
            let mut words = f.split_whitespace();
            words.next() == Some("CKSM")
                && words
                    .next()
                    .is_some_and(|list| list.split(';').any(|a| a.split(':').next() == Some(alg)))
        })
    }

    /// A braid server that runs TLS on MODE E data connections under PROT P (`BRAID 3`);
    /// older ones would run them in clear.
    pub fn private_blocks(&self) -> bool {
        self.version("BRAID").unwrap_or(0) >= 3
    }

    /// A braid server that queues a checksum (SCKS) sent during an upload for a later file
    /// unless the running upload waits for its own (`BRAID 4`): uploads can then be announced
    /// ahead, each with its checksum. Older ones take any SCKS as the running upload's.
    pub fn announced_uploads(&self) -> bool {
        self.version("BRAID").unwrap_or(0) >= 4
    }

    /// A braid server that sends many small files as one transfer (BNDL, RBND).
    pub fn bundles(&self) -> bool {
        self.has("BRAID-BUNDLE")
    }

    /// A braid server that also stores bundles (SBND; `BRAID-BUNDLE 2`).
    pub fn stores_bundles(&self) -> bool {
        self.version("BRAID-BUNDLE").unwrap_or(0) >= 2
    }

    /// The kind of MODE E peer, if any.
    pub fn block_peer(&self) -> Option<BlockPeer> {
        if self.has("BRAID") {
            Some(BlockPeer::Braid {
                elastic: self.version("BRAID").unwrap_or(0) >= 2,
            })
        } else if self.has("PARALLEL") {
            Some(BlockPeer::GridFtp)
        } else {
            None
        }
    }
}

/// A server that offers MODE E.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockPeer {
    /// braid: the client opens the data connections both ways; XXH3; `elastic` with FEAT
    /// `BRAID 2` (connections join, leave and break mid-transfer).
    Braid { elastic: bool },
    /// A GridFTP server: it connects to the client when it sends; MD5 through CKSM.
    GridFtp,
}

/// Which way a transfer's data flows, seen from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Download,
    Upload,
}

/// MODE E settings for the next transfers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSetup {
    pub direction: Direction,
    /// Sent with `OPTS RETR` for downloads.
    pub retr: RetrOpts,
    /// SBUF: fixed socket buffers.
    pub buffer: Option<u64>,
    /// Compressed blocks, asked for from a braid server that offers them (FEAT
    /// `BRAID-COMPRESS`); None: not asked for (off).
    pub compress: Option<crate::compress::Policy>,
}

/// One piece of work on the control connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// USER, then PASS when asked for.
    Login {
        user: String,
        password: String,
    },
    /// AUTH TLS; ends with [`Outcome::StartTls`]: the driver then runs the handshake and
    /// starts [`Op::Protect`].
    AuthTls,
    /// PBSZ 0 and PROT P (RFC 4217).
    Protect,
    Features,
    /// TYPE I, unless already in effect.
    Binary,
    /// `OPTS STOR Eager=1` (or `=0`): uploads' data goes without waiting for STOR's answer
    /// (a braid server, FEAT `BRAID 4`, drops a refused upload's data); sent only when it
    /// changes what is in effect.
    Eager(bool),
    /// MODE E with these settings, sending only what is not in effect yet.
    BlockMode(BlockSetup),
    /// EPSV, or PASV where EPSV is not understood.
    Passive,
    /// REST with byte ranges (MODE E).
    RestRanges(RangeSet),
    /// REST with an offset (stream mode).
    Rest(u64),
    /// Any command with the final reply codes that mean success.
    Simple {
        cmd: Command,
        ok: Vec<u16>,
    },
    /// Any command; whatever its final reply, that is the outcome.
    Ask(Command),
    /// Sends a transfer command (RETR, STOR, LIST, ...) and waits for 125 or 150.
    StartTransfer(Command),
    /// Waits for a transfer's final reply, taking markers on the way.
    FinishTransfer,
    /// CKSM of a whole file: the server's value, or None if it offers none.
    Checksum {
        alg: String,
        path: String,
    },
    Quit,
}

/// How an op ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(Reply),
    StartTls,
    Features(Features),
    /// The port the server listens on for data connections (at the control peer's address).
    Passive(u16),
    /// The transfer began; `reused`: on the data connections the last one left open (125).
    Started {
        reused: bool,
    },
    Checksum(Option<String>),
}

/// How an op failed, from the reply code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("login refused: {0}")]
    Login(Reply),
    /// 5yz for a request (no such file, permission, not understood, ...).
    #[error("{what} refused: {reply}")]
    Refused { what: String, reply: Reply },
    /// 4yz: the server could not do it now (421, 425, 426, 450, 451, ...).
    #[error("{what} failed: {reply}")]
    Transient { what: String, reply: Reply },
    /// 535 (RFC 2228 "failed security check"): the data failed the checksum.
    #[error("integrity check failed: {0}")]
    Integrity(Reply),
    /// 452 or 552: no room on the server.
    #[error("no space on the server: {0}")]
    NoSpace(Reply),
    /// A reply that makes no sense here.
    #[error("{0}")]
    Protocol(String),
    /// The control connection ended before the op did.
    #[error("the server closed the control connection before replying to {waiting_for}")]
    Closed { waiting_for: String },
}

impl Failure {
    /// Classifies a final reply that did not mean success.
    pub fn from_reply(what: &str, reply: Reply) -> Failure {
        match reply.code {
            535 => Failure::Integrity(reply),
            452 | 552 => Failure::NoSpace(reply),
            530 | 532 => Failure::Login(reply),
            400..=499 => Failure::Transient {
                what: what.into(),
                reply,
            },
            _ => Failure::Refused {
                what: what.into(),
                reply,
            },
        }
    }
}

/// What a running op waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wait {
    /// `password`: PASS to send when asked for; None when it went out already.
    User {
        password: Option<String>,
    },
    Pass,
    Auth,
    Pbsz,
    Prot,
    Feat,
    /// A setting command; `then` records it as in effect.
    Setting(Setting),
    Epsv,
    Pasv,
    Rest,
    Simple {
        verb: String,
        ok: Vec<u16>,
    },
    Any,
    Started {
        verb: String,
    },
    Final,
    Cksm,
    Quit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Setting {
    Type,
    ModeE,
    Elastic,
    Retr(RetrOpts),
    Sbuf(u64),
    Eager(bool),
    Compress(crate::compress::Policy),
}

/// One op between `begin` and `poll_outcome`.
#[derive(Debug)]
struct Running {
    id: u64,
    /// Commands not sent yet, each with the reply it waits for.
    queue: VecDeque<(Command, Wait)>,
    outcome: Option<Result<Outcome, Failure>>,
}

/// The client side of one control connection.
#[derive(Debug, Default)]
pub struct ClientSession {
    features: Features,
    binary: bool,
    mode_e: bool,
    elastic: bool,
    retr: Option<RetrOpts>,
    sbuf: Option<u64>,
    /// `OPTS STOR Eager=1` is in effect.
    eager: bool,
    /// `OPTS BRAID COMPRESS`: what was asked, and whether the server agreed.
    compress: Option<(crate::compress::Policy, bool)>,
    no_epsv: bool,
    /// The last MODE E transfer left its data connections open, carrying data this way.
    cached: Option<Direction>,
    /// What `111 Range Marker` replies say the server has stored (uploads).
    stored: RangeSet,
    /// Ops begun and not yet polled, oldest first.
    ops: VecDeque<Running>,
    /// How many ops at the front of `ops` have sent every command: where the next command
    /// is looked for (a long pipeline would otherwise be walked for each one).
    sent_through: usize,
    next_id: u64,
    /// Sent, reply not yet seen: the op each belongs to, and what it waits for. Replies come
    /// in the order the commands went out; one whose op has ended is dropped.
    waiting: Waits,
    /// Commands handed out by `poll_command`, not yet sent.
    outbox: VecDeque<Command>,
    /// Send every command as soon as its op begins, without waiting for the replies before
    /// it (a braid server reads commands in order and answers each in turn).
    pipeline: bool,
    /// The verb of the last command sent (for errors).
    last_verb: String,
    /// The control connection has ended: every op fails.
    closed: bool,
    /// Answers to mid-transfer changes (rate, congestion control) not yet read.
    change_replies: usize,
    /// The latest `113 Sender` report of a running download.
    sender: Option<crate::markers::SenderReport>,
    /// Probes (`STAT`) not yet answered.
    probes_due: usize,
}

/// Replies due, in the order their commands went out, each with its op and what it waits
/// for; and how many each op still awaits, so that asking costs nothing however many files
/// are in flight.
#[derive(Debug, Default)]
struct Waits {
    queue: VecDeque<(u64, Wait)>,
    per_op: std::collections::HashMap<u64, usize>,
}

impl Waits {
    fn push_back(&mut self, id: u64, wait: Wait) {
        *self.per_op.entry(id).or_default() += 1;
        self.queue.push_back((id, wait));
    }

    fn push_front(&mut self, id: u64, wait: Wait) {
        *self.per_op.entry(id).or_default() += 1;
        self.queue.push_front((id, wait));
    }

    fn pop_front(&mut self) -> Option<(u64, Wait)> {
        let (id, wait) = self.queue.pop_front()?;
        if let std::collections::hash_map::Entry::Occupied(mut due) = self.per_op.entry(id) {
            *due.get_mut() -= 1;
            if *due.get() == 0 {
                due.remove();
            }
        }
        Some((id, wait))
    }

    fn front(&self) -> Option<&(u64, Wait)> {
        self.queue.front()
    }

    fn clear(&mut self) {
        self.queue.clear();
        self.per_op.clear();
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a reply is due to op `id`.
    fn due(&self, id: u64) -> bool {
        self.per_op.contains_key(&id)
    }
}

impl ClientSession {
    pub fn new() -> ClientSession {
        ClientSession::default()
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    /// `OPTS STOR Eager=1` is in effect (its answer has been read).
    pub fn eager(&self) -> bool {
        self.eager
    }

    /// MODE E transfers are elastic on this session.
    pub fn elastic(&self) -> bool {
        self.elastic
    }

    /// What a MODE E transfer this way does about compressed blocks: None unless they were
    /// asked for and the server did not refuse; a download only accepts them; an upload
    /// compresses as asked, except
    /// that `auto` does not over TLS (`private`), where compressed lengths can leak what an
    /// attacker could not otherwise read (CRIME, BREACH): only an explicit `on` does.
    pub fn compression(
        &self,
        direction: Direction,
        private: bool,
    ) -> Option<crate::compress::Policy> {
        use crate::compress::Policy;
        let (asked, true) = self.compress? else {
            return None;
        };
        Some(match (direction, asked) {
            (Direction::Download, _) => Policy::Off,
            (Direction::Upload, Policy::Auto) if private => Policy::Off,
            (Direction::Upload, p) => p,
        })
    }

    /// What the server's range markers say it holds.
    pub fn stored(&self) -> &RangeSet {
        &self.stored
    }

    /// Starts counting range markers afresh from what the server is known to hold.
    pub fn reset_stored(&mut self, have: RangeSet) {
        self.stored = have;
    }

    /// Whether the next MODE E transfer this way can go without PASV: the last one left its
    /// data connections open (GridFTP data-channel caching).
    pub fn can_reuse(&self, direction: Direction) -> bool {
        self.mode_e && self.cached == Some(direction)
    }

    /// Records that the last transfer left its data connections open this way (or not).
    pub fn set_cached(&mut self, cached: Option<Direction>) {
        self.cached = cached;
    }

    /// Lets ops overlap: each op's commands go out as soon as it begins, behind those already
    /// sent, and outcomes come out in the order the ops began. Only for servers known to read
    /// pipelined commands in order (`session::reads_pipelined`); others get one command at a
    /// time.
    pub fn set_pipeline(&mut self, on: bool) {
        self.pipeline = on;
    }

    pub fn pipelining(&self) -> bool {
        self.pipeline
    }

    /// Starts an op; returns its id. Without pipelining, any op still running is dropped
    /// (replies still due to it are read and ignored); with it, the op queues behind the
    /// others.
    pub fn begin(&mut self, op: Op) -> u64 {
        if !self.pipeline {
            self.ops.clear();
            self.sent_through = 0;
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut running = Running {
            id,
            queue: VecDeque::new(),
            outcome: None,
        };
        if self.closed {
            running.outcome = Some(Err(Failure::Closed {
                waiting_for: "anything more (it had closed already)".into(),
            }));
            self.ops.push_back(running);
            return id;
        }
        let steps: Vec<(Command, Wait)> = match op {
            Op::Login { user, password } if self.pipeline => vec![
                (Command::User(user), Wait::User { password: None }),
                (Command::Pass(password), Wait::Pass),
            ],
            Op::Login { user, password } => vec![(
                Command::User(user),
                Wait::User {
                    password: Some(password),
                },
            )],
            Op::AuthTls => vec![(Command::Auth("TLS".into()), Wait::Auth)],
            Op::Protect => vec![
                (Command::Pbsz(0), Wait::Pbsz),
                (Command::Prot('P'), Wait::Prot),
            ],
            Op::Features => vec![(Command::Feat, Wait::Feat)],
            Op::Binary if self.binary => vec![],
            Op::Binary => vec![(
                Command::Type(TransferType::Image),
                Wait::Setting(Setting::Type),
            )],
            Op::Eager(on) if on == self.eager => vec![],
            Op::Eager(on) => vec![(
                Command::Opts(format!("STOR Eager={}", u8::from(on))),
                Wait::Setting(Setting::Eager(on)),
            )],
            Op::BlockMode(setup) => self.plan_block_mode(setup),
            Op::Passive if self.no_epsv => vec![(Command::Pasv, Wait::Pasv)],
            Op::Passive => vec![(Command::Epsv(EpsvArg::Default), Wait::Epsv)],
            Op::RestRanges(r) => vec![(Command::RestRanges(r), Wait::Rest)],
            Op::Rest(n) => vec![(Command::Rest(n), Wait::Rest)],
            Op::Simple { cmd, ok } => {
                let verb = cmd.verb().to_string();
                vec![(cmd, Wait::Simple { verb, ok })]
            }
            Op::Ask(cmd) => vec![(cmd, Wait::Any)],
            Op::StartTransfer(cmd) => {
                let verb = cmd.verb().to_string();
                vec![(cmd, Wait::Started { verb })]
            }
            Op::FinishTransfer => {
                // No command: the final reply of the transfer under way.
                self.waiting.push_back(id, Wait::Final);
                vec![]
            }
            Op::Checksum { alg, path } => vec![(
                Command::Cksm {
                    alg,
                    offset: 0,
                    length: None,
                    path,
                },
                Wait::Cksm,
            )],
            Op::Quit => vec![(Command::Quit, Wait::Quit)],
        };
        if steps.is_empty() && !self.waits_for(id) {
            // Everything asked for is in effect already.
            running.outcome = Some(Ok(Outcome::Done(Reply::new(200, "Already in effect."))));
        }
        running.queue.extend(steps);
        self.ops.push_back(running);
        self.pump();
        id
    }

    /// The op whose outcome [`ClientSession::poll_outcome`] gives next, by the id `begin`
    /// returned.
    pub fn oldest(&self) -> Option<u64> {
        self.ops.front().map(|o| o.id)
    }

    /// Whether a reply is due to op `id`.
    fn waits_for(&self, id: u64) -> bool {
        self.waiting.due(id)
    }

    /// MODE E, then only the settings that differ from what is in effect.
    fn plan_block_mode(&mut self, setup: BlockSetup) -> Vec<(Command, Wait)> {
        let mut steps = Vec::new();
        if !self.mode_e {
            steps.push((Command::Mode(Mode::Extended), Wait::Setting(Setting::ModeE)));
        }
        let braid2 = matches!(
            self.features.block_peer(),
            Some(BlockPeer::Braid { elastic: true })
        );
        if braid2 && !self.elastic {
            steps.push((
                Command::Opts("BRAID ELASTIC".into()),
                Wait::Setting(Setting::Elastic),
            ));
        }
        if setup.direction == Direction::Download && self.retr != Some(setup.retr) {
            steps.push((
                Command::Opts(format!("RETR {}", setup.retr.encode())),
                Wait::Setting(Setting::Retr(setup.retr)),
            ));
        }
        if let Some(p) = setup.compress
            && self.features.has("BRAID-COMPRESS")
            && self.compress.map(|(asked, _)| asked) != Some(p)
        {
            // Taken as agreed until the answer says otherwise: a server that lists the
            // feature takes the option, and the transfer need not wait for the answer.
            self.compress = Some((p, true));
            steps.push((
                Command::Opts(format!("BRAID COMPRESS={}", p.name())),
                Wait::Setting(Setting::Compress(p)),
            ));
        }
        if let Some(b) = setup.buffer
            && self.sbuf != Some(b)
        {
            steps.push((Command::Sbuf(b), Wait::Setting(Setting::Sbuf(b))));
        }
        steps
    }

    /// Moves commands to the outbox: without pipelining one at a time, each after the reply
    /// to the one before (RFC 959 does not promise pipelining); with it, all there are.
    fn pump(&mut self) {
        loop {
            if !self.pipeline && !self.waiting.is_empty() {
                return;
            }
            while self
                .ops
                .get(self.sent_through)
                .is_some_and(|o| o.outcome.is_some() || o.queue.is_empty())
            {
                self.sent_through += 1;
            }
            let Some(op) = self.ops.get_mut(self.sent_through) else {
                return;
            };
            let Some((cmd, wait)) = op.queue.pop_front() else {
                return;
            };
            self.last_verb = cmd.verb().to_string();
            self.outbox.push_back(cmd);
            self.waiting.push_back(op.id, wait);
        }
    }

    /// The next command to send, if any.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.outbox.pop_front()
    }

    /// How the oldest op ended, once it has.
    pub fn poll_outcome(&mut self) -> Option<Result<Outcome, Failure>> {
        self.ops.front()?.outcome.as_ref()?;
        self.sent_through = self.sent_through.saturating_sub(1);
        self.ops.pop_front()?.outcome
    }

    /// Whether a reply is due (to a running op, or one to read and drop).
    pub fn awaits_reply(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The control connection ended (the server closed it, or the network lost it). The op
    /// waiting for a reply fails, and so does every op after it.
    pub fn handle_closed(&mut self) {
        self.closed = true;
        let waiting_for = match self.waiting.front() {
            Some((_, Wait::Final)) => "the end of the transfer".to_string(),
            _ => self.last_verb.clone(),
        };
        self.waiting.clear();
        self.outbox.clear();
        for op in self.ops.iter_mut().filter(|o| o.outcome.is_none()) {
            op.queue.clear();
            op.outcome = Some(Err(Failure::Closed {
                waiting_for: waiting_for.clone(),
            }));
        }
    }

    /// Changes how the server sends the running download (its cap, `rate`, where Some, and its
    /// congestion control, where Some): the command to send now,
    /// outside any op. The server answers it when it reads it, before or after the transfer's
    /// end; the session takes that answer wherever it comes.
    pub fn change_sending(
        &mut self,
        rate: Option<Option<u64>>,
        congestion: Option<CcName>,
    ) -> Command {
        self.change_replies += 1;
        let opts = RetrOpts {
            // 0 lifts the cap.
            max_rate: rate.map(|r| r.unwrap_or(0)),
            congestion,
            ..RetrOpts::default()
        };
        Command::Opts(format!("RETR {}", opts.encode()))
    }

    /// A probe of the control connection's round trip during a transfer (background mode):
    /// `STAT`, which a braid server answers at once while data moves (213), or in turn after
    /// the transfer (211). Either answer is taken by [`ClientSession::answers_probe`] wherever
    /// it comes, since no other reply has those codes.
    pub fn probe(&mut self) -> Command {
        self.probes_due += 1;
        Command::Stat(None)
    }

    /// Whether `r` answers a probe (and is no one else's reply).
    pub fn answers_probe(&mut self, r: &Reply) -> bool {
        if self.probes_due > 0 && matches!(r.code, 211 | 213) {
            self.probes_due -= 1;
            return true;
        }
        false
    }

    /// Whether `r` answers a mid-transfer change: while the transfer runs, its end is never a
    /// 200; once it has ended, the answers still due come before that to any later command.
    fn answers_change(&mut self, r: &Reply) -> bool {
        if self.change_replies == 0 || r.is_preliminary() {
            return false;
        }
        let transfer_running = matches!(self.waiting.front(), Some((_, Wait::Final)));
        if transfer_running && r.code != 200 {
            return false;
        }
        self.change_replies -= 1;
        true
    }

    /// Notes what a reply says in passing (range markers, sender reports), whenever it is
    /// read.
    pub fn note(&mut self, r: &Reply) {
        if let Some(ranges) = crate::markers::parse_range_marker(r) {
            for (a, b) in ranges.iter() {
                self.stored.insert(a, b);
            }
        }
        if let Some(report) = crate::markers::parse_sender_marker(r) {
            self.sender = Some(report);
        }
    }

    /// What the server last reported of its sending (a braid server, during a download);
    /// taken, so each report is seen once.
    pub fn take_sender_report(&mut self) -> Option<crate::markers::SenderReport> {
        self.sender.take()
    }

    /// Takes one reply from the server.
    pub fn handle_reply(&mut self, r: Reply) {
        self.note(&r);
        if self.answers_probe(&r) || self.answers_change(&r) {
            return;
        }
        let Some((id, wait)) = self.waiting.front().cloned() else {
            // Unasked-for: markers after a transfer, or a 421 before closing.
            return;
        };
        if r.is_preliminary() && !matches!(wait, Wait::Started { .. }) {
            return;
        }
        self.waiting.pop_front();
        let Some(i) = self
            .ops
            .iter()
            .position(|o| o.id == id && o.outcome.is_none())
        else {
            // Its op ended or was dropped: a pipelined command after a failure, say.
            self.pump();
            return;
        };
        let refused_start = matches!(wait, Wait::Started { .. });
        let step = self.step(wait, r.clone());
        if refused_start && matches!(step, Step::End(Err(_))) {
            self.drop_final_of_refused(&r);
        }
        let more_due = self.waits_for(id);
        let op = &mut self.ops[i];
        match step {
            // The last command of the op: its reply is the outcome.
            Step::Next if op.queue.is_empty() && !more_due => {
                op.outcome = Some(Ok(Outcome::Done(r)));
            }
            Step::Next => {}
            Step::Then(cmd, wait) => {
                op.queue.push_front((cmd, wait));
                self.sent_through = self.sent_through.min(i);
            }
            Step::Wait(wait) => self.waiting.push_front(id, wait),
            Step::End(o) => {
                op.queue.clear();
                op.outcome = Some(o);
            }
        }
        self.pump();
    }

    /// A transfer the server refused at its start has no final reply: the wait for one,
    /// begun ahead behind its start (pipelined transfers), ends with the refusal, or it would
    /// take the next command's answer for its own and shift every reply after it.
    fn drop_final_of_refused(&mut self, r: &Reply) {
        let Some(&(id, Wait::Final)) = self.waiting.front() else {
            return;
        };
        self.waiting.pop_front();
        if let Some(op) = self
            .ops
            .iter_mut()
            .find(|o| o.id == id && o.outcome.is_none())
        {
            op.outcome = Some(Err(Failure::from_reply(
                "the transfer (refused)",
                r.clone(),
            )));
        }
    }

    fn step(&mut self, wait: Wait, r: Reply) -> Step {
        let fail = |what: &str, r: Reply| Step::End(Err(Failure::from_reply(what, r)));
        match wait {
            Wait::User { password } => match (r.code, password) {
                (230, _) => Step::End(Ok(Outcome::Done(r))),
                (331 | 332, Some(password)) => Step::Then(Command::Pass(password), Wait::Pass),
                // PASS went out with USER (pipelined).
                (331 | 332, None) => Step::Next,
                _ => Step::End(Err(Failure::Login(r))),
            },
            Wait::Pass => match r.code {
                230 | 202 => Step::End(Ok(Outcome::Done(r))),
                _ => Step::End(Err(Failure::Login(r))),
            },
            Wait::Auth => match r.code {
                234 => Step::End(Ok(Outcome::StartTls)),
                _ => fail(
                    "AUTH TLS (the server offers no TLS; drop --tls to go on in clear)",
                    r,
                ),
            },
            Wait::Pbsz if r.code == 200 => Step::Next,
            Wait::Pbsz => fail("PBSZ", r),
            Wait::Prot if r.code == 200 => Step::End(Ok(Outcome::Done(r))),
            Wait::Prot => fail("PROT P", r),
            Wait::Feat => {
                self.features = Features::parse(&r);
                Step::End(Ok(Outcome::Features(self.features.clone())))
            }
            // A server that compresses nothing says so; blocks then go as they are.
            Wait::Setting(Setting::Compress(p)) => {
                self.compress = Some((p, r.code == 200));
                Step::Next
            }
            Wait::Setting(s) => {
                if r.code != 200 {
                    return fail(setting_name(&s), r);
                }
                match s {
                    Setting::Type => self.binary = true,
                    Setting::ModeE => self.mode_e = true,
                    Setting::Elastic => self.elastic = true,
                    Setting::Retr(o) => self.retr = Some(o),
                    Setting::Sbuf(b) => self.sbuf = Some(b),
                    Setting::Eager(on) => self.eager = on,
                    Setting::Compress(_) => {}
                }
                Step::Next
            }
            Wait::Epsv => match r.code {
                229 => match addr::parse_229(&r.text()) {
                    Ok(port) => self.passive(port),
                    Err(e) => Step::End(Err(Failure::Protocol(format!("bad 229 reply {r}: {e}")))),
                },
                500 | 501 | 502 | 504 | 522 => {
                    self.no_epsv = true;
                    Step::Then(Command::Pasv, Wait::Pasv)
                }
                _ => fail("EPSV", r),
            },
            Wait::Pasv => match r.code {
                227 => match addr::parse_227(&r.text()) {
                    Ok(a) => self.passive(a.port()),
                    Err(e) => Step::End(Err(Failure::Protocol(format!("bad 227 reply {r}: {e}")))),
                },
                _ => fail("PASV", r),
            },
            Wait::Rest if r.code == 350 => Step::End(Ok(Outcome::Done(r))),
            Wait::Rest => fail("REST (the server cannot resume)", r),
            Wait::Simple { verb, ok } => {
                if ok.contains(&r.code) {
                    Step::End(Ok(Outcome::Done(r)))
                } else {
                    fail(&verb, r)
                }
            }
            Wait::Any => Step::End(Ok(Outcome::Done(r))),
            Wait::Started { verb } => match r.code {
                125 | 150 => Step::End(Ok(Outcome::Started {
                    reused: r.code == 125,
                })),
                // Markers before the transfer opens (none expected, but harmless).
                110..=199 => Step::Wait(Wait::Started { verb }),
                _ => fail(&verb, r),
            },
            Wait::Final => match r.code {
                226 | 250 => Step::End(Ok(Outcome::Done(r))),
                _ => fail("the transfer", r),
            },
            Wait::Cksm => Step::End(Ok(Outcome::Checksum(checksum_in(&r)))),
            Wait::Quit => Step::End(Ok(Outcome::Done(r))),
        }
    }

    /// A passive port: any data connections left open are replaced by the new ones.
    fn passive(&mut self, port: u16) -> Step {
        self.cached = None;
        Step::End(Ok(Outcome::Passive(port)))
    }
}

/// The checksum a reply to CKSM gives, lower-case hex: None unless it is a 213 (a server
/// without that algorithm, or without the file, refuses).
pub fn checksum_in(r: &Reply) -> Option<String> {
    (r.code == 213).then(|| r.text().trim().to_ascii_lowercase())
}

/// What one reply leads to.
enum Step {
    /// This command is done; go on with the op's next one.
    Next,
    /// Send this command next.
    Then(Command, Wait),
    /// Wait for another reply to the same command.
    Wait(Wait),
    End(Result<Outcome, Failure>),
}

fn setting_name(s: &Setting) -> &'static str {
    match s {
        Setting::Type => "TYPE I",
        Setting::ModeE => "MODE E",
        Setting::Elastic => "OPTS BRAID ELASTIC",
        Setting::Retr(_) => "OPTS RETR",
        Setting::Sbuf(_) => "SBUF",
        Setting::Eager(_) => "OPTS STOR Eager",
        Setting::Compress(_) => "OPTS BRAID COMPRESS",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(lines: &[&str]) -> Features {
        let mut all = vec!["Extensions supported".to_string()];
        all.extend(lines.iter().map(|l| l.to_string()));
        all.push("End".into());
        Features::parse(&Reply::multi(211, all))
    }

    #[test]
    fn checksum_algorithms_are_read_from_the_cksm_feature_line() {
        // globus-gridftp-server 13's line, and braid's.
        let globus = features(&[
            " CKSM MD5:10;ADLER32:10;SHA1:10;SHA256:11;SHA512:12;",
            " MLSR",
        ]);
        assert!(globus.checksum_offered("ADLER32"));
        assert!(globus.checksum_offered("MD5"));
        assert!(!globus.checksum_offered("XXH3"));
        assert!(
            !globus.checksum_offered("SHA"),
            "a prefix of a name is not the name"
        );
        let braid = features(&[" CKSM XXH3;MD5;ADLER32;"]);
        assert!(braid.checksum_offered("XXH3") && braid.checksum_offered("ADLER32"));
        // A server that lists CKSM alone says nothing of its algorithms.
        assert!(!features(&[" CKSM"]).checksum_offered("MD5"));
    }
}
