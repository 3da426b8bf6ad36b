//! An in-memory harness (in the spirit of quinn's `Pair`): a [`ClientSession`] and a server
//! [`Session`] wired together through their wire forms, with the server's I/O (passwords,
//! files, passive ports, transfers) answered from tables. Control-channel behaviour is tested
//! here in microseconds, deterministically. A MODE E transfer of a file whose bytes are in
//! the tables goes through an in-memory data path: blocks at their offsets over the
//! transfer's connections as byte streams, put back together by the receiver's own checks
//! ([`blocks_over`], [`receive_blocks`]), so resumes, checksums and their failures are tested
//! end to end without a socket.
//!
//! Between the two runs a simulated control connection ([`Link`]): a one-way delay, so that a
//! dialogue's cost shows in simulated time; the server's bytes cut into segments of random
//! size, so that replies arrive split anywhere or several in one read (a transfer's 150,
//! markers and 226 together, say); and a cut after any number of bytes, a server or network
//! that vanishes mid-reply.

use crate::block::{BlockError, Completion, Connection, HEADER_LEN, Header, Next};
use crate::checksum;
use crate::client::{BlockSetup, ClientSession, Direction, Failure, Op, Outcome};
use crate::command::Command;
use crate::ranges::RangeSet;
use crate::reply::{Reply, ReplyParser};
use crate::retr_opts::RetrOpts;
use crate::session::{
    Action, Expected, FsOp, FsOutcome, Perm, Session, SessionConfig, Transfer, TransferKind,
    TransferOutcome,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The simulated control connection.
#[derive(Debug, Clone)]
pub struct Link {
    /// One way; a command and its reply cost twice this.
    pub delay: Duration,
    /// Server-to-client bytes arrive in segments of 1 to this many bytes, sizes drawn from a
    /// generator seeded with `seed` (TCP may cut a stream anywhere).
    pub max_segment: usize,
    pub seed: u64,
    /// The connection ends after this many server-to-client bytes.
    pub cut_after: Option<usize>,
}

impl Default for Link {
    fn default() -> Link {
        Link {
            delay: Duration::ZERO,
            max_segment: 4096,
            seed: 1,
            cut_after: None,
        }
    }
}

pub struct Pair {
    pub client: ClientSession,
    pub server: Session,
    /// user → password
    pub users: BTreeMap<String, String>,
    /// path → size
    pub files: BTreeMap<String, u64>,
    /// path → contents: a MODE E transfer of such a file moves its bytes through the in-memory
    /// data path (blocks over the transfer's connections), and CKSM hashes them.
    pub contents: BTreeMap<String, Vec<u8>>,
    /// The client's side of that data path: what it holds of each file (downloads land here;
    /// an upload sends what is here).
    pub local: BTreeMap<String, Vec<u8>>,
    /// Payload bytes the data path carried, over all transfers.
    pub carried: u64,
    /// Verbs the server answers with 500 before its session sees them (an older server).
    pub refuse: Vec<&'static str>,
    /// Paths whose transfers the server refuses at the start (550), as a file gone since
    /// the listing.
    pub gone: Vec<String>,
    /// How the next transfers end, in order (Complete with kept connections by default).
    pub outcomes: VecDeque<TransferOutcome>,
    /// Every command line the server received.
    pub seen: Vec<String>,
    /// Every transfer the server's session asked for.
    pub transfers: Vec<crate::session::Transfer>,
    /// Round trips so far (one per command).
    pub round_trips: u32,
    link: Link,
    segments: StdRng,
    /// Simulated time so far.
    pub now: Duration,
    /// Server-to-client bytes sent and not yet delivered.
    wire: VecDeque<u8>,
    /// Server-to-client bytes delivered so far.
    delivered: usize,
    /// The client's reply parser, and replies it has parsed but the client has not taken.
    parser: ReplyParser,
    parsed: VecDeque<Reply>,
}

impl Pair {
    pub fn new() -> Pair {
        Pair::over(Link::default())
    }

    pub fn over(link: Link) -> Pair {
        let server = Pair::server(crate::compress::Policy::Auto);
        let mut p = Pair {
            client: ClientSession::new(),
            server,
            users: BTreeMap::new(),
            files: BTreeMap::new(),
            contents: BTreeMap::new(),
            local: BTreeMap::new(),
            carried: 0,
            refuse: Vec::new(),
            gone: Vec::new(),
            outcomes: VecDeque::new(),
            seen: Vec::new(),
            transfers: Vec::new(),
            round_trips: 0,
            segments: StdRng::seed_from_u64(link.seed),
            link,
            now: Duration::ZERO,
            wire: VecDeque::new(),
            delivered: 0,
            parser: ReplyParser::new(),
            parsed: VecDeque::new(),
        };
        p.users.insert("alice".into(), "secret".into());
        p
    }

    /// The server's session: anonymous users may write; `compress` as `braid serve
    /// --compress` sets it.
    pub fn server(compress: crate::compress::Policy) -> Session {
        let config = SessionConfig {
            anonymous: Some(Perm::ReadWrite),
            max_login_failures: 3,
            max_streams: 16,
            tls: false,
            private_data_required: false,
            compress,
            third_party: true,
            data_node: false,
            striped: false,
            gsi: false,
        };
        Session::new(config, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Runs one op to its end.
    pub fn run(&mut self, op: Op) -> Result<Outcome, Failure> {
        let mut results = self.run_flight(vec![op]);
        results.remove(0)
    }

    /// Begins `ops` together and runs them to their ends; their outcomes in order. A
    /// pipelining client sends every command at once; one that is not, one per reply. Each
    /// batch of commands sent after a reply (or at the start) is one round trip.
    pub fn run_flight(&mut self, ops: Vec<Op>) -> Vec<Result<Outcome, Failure>> {
        let n = ops.len();
        for op in ops {
            self.client.begin(op);
        }
        let mut results = Vec::with_capacity(n);
        for _ in 0..100_000 {
            while let Some(o) = self.client.poll_outcome() {
                results.push(o);
            }
            if results.len() == n {
                assert!(
                    self.client.poll_command().is_none(),
                    "a command was left to send after the ops ended"
                );
                return results;
            }
            let mut sent = false;
            while let Some(cmd) = self.client.poll_command() {
                sent = true;
                for r in self.serve(&cmd) {
                    self.wire.extend(r.to_bytes());
                }
            }
            if sent {
                self.round_trips += 1;
                self.now += self.link.delay * 2;
            }
            if self.client.awaits_reply() {
                match self.parsed.pop_front() {
                    Some(r) => self.client.handle_reply(r),
                    None => self.deliver(),
                }
            }
        }
        panic!("the ops did not end")
    }

    /// Sends a command outside any op (a rate change during a transfer); its answer joins the
    /// server's bytes on the wire.
    pub fn send_now(&mut self, cmd: Command) {
        for r in self.serve(&cmd) {
            self.wire.extend(r.to_bytes());
        }
    }

    /// One segment of server-to-client bytes into the client's parser, or the end of the
    /// connection once the cut is reached.
    fn deliver(&mut self) {
        let room = match self.link.cut_after {
            Some(cut) => cut.saturating_sub(self.delivered),
            None => usize::MAX,
        };
        if room == 0 {
            self.client.handle_closed();
            return;
        }
        let size = self.segments.random_range(1..=self.link.max_segment.max(1));
        assert!(
            !self.wire.is_empty(),
            "the client waits for a reply the server never sends"
        );
        let n = size.min(room).min(self.wire.len());
        let segment: Vec<u8> = self.wire.drain(..n).collect();
        self.delivered += n;
        self.parser.feed(&segment);
        while let Some(r) = self
            .parser
            .next_reply()
            .expect("the server's replies parse")
        {
            self.parsed.push_back(r);
        }
    }

    /// The server's side of one command: through its wire form, into the session, with the
    /// I/O it asks for answered from the tables.
    fn serve(&mut self, cmd: &Command) -> Vec<Reply> {
        let mut wire = Vec::new();
        cmd.encode(&mut wire);
        let line = &wire[..wire.len() - 2];
        let cmd = Command::parse(line).expect("what the client sends, the server parses");
        self.seen.push(String::from_utf8_lossy(line).into_owned());
        if self.refuse.contains(&cmd.verb()) {
            return vec![Reply::new(500, "Unknown command.")];
        }
        let mut action = self.server.handle(cmd);
        if let Action::Login { user, password } = &action {
            let ok = user == "anonymous" || self.users.get(user) == Some(password);
            action = self.server.login_done(ok.then_some(Perm::ReadWrite));
        }
        match action {
            Action::Adat(_) => vec![Reply::new(535, "no GSI here")],
            Action::Reply(r) | Action::Close(r) | Action::StartTls(r) => vec![r],
            Action::Login { .. } => vec![Reply::new(451, "login check loops")],
            Action::Passive { extended } => {
                let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 40000);
                vec![self.server.passive_done(extended, Ok(addr))]
            }
            Action::StripedPassive => {
                let at = |i| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, i)), 40000);
                vec![self.server.striped_passive_done(Ok(vec![at(11), at(12)]))]
            }
            Action::Fs(op) => {
                let result = match op {
                    FsOp::Size { path, .. } => self
                        .files
                        .get(&path.relative())
                        .map(|&n| FsOutcome::Size(n))
                        .ok_or(crate::session::FsError::NotFound),
                    FsOp::Checksum { path, .. } => Ok(FsOutcome::Checksum(
                        self.contents
                            .get(&path.relative())
                            .map_or("c0ffee".into(), |c| checksum::hex(checksum::of(c))),
                    )),
                    _ => Ok(FsOutcome::Done),
                };
                vec![self.server.fs_done(result)]
            }
            Action::Transfer(t) if self.gone.contains(&t.path().relative()) => {
                vec![Reply::new(550, "No such file.")]
            }
            Action::Transfer(t) if t.block.is_some() && self.moves_bytes(&t) => {
                self.transfers.push(t.clone());
                let outcome = self.blocks_in_memory(&t);
                let size = self.files.get(&t.path().relative()).copied();
                let mut replies = vec![t.opening(size)];
                replies.extend(self.server.transfer_done(&t, outcome));
                replies
            }
            Action::Transfer(t) => {
                self.transfers.push(t.clone());
                let size = self.files.get(&t.path().relative()).copied();
                let outcome = self
                    .outcomes
                    .pop_front()
                    .unwrap_or(TransferOutcome::Complete {
                        bytes: size.unwrap_or(0),
                        kept: true,
                        checksum: None,
                    });
                let mut replies = vec![t.opening(size)];
                replies.extend(self.server.transfer_done(&t, outcome));
                replies
            }
        }
    }
}

impl Pair {
    /// Whether a transfer's bytes are in the tables: a download of a file with contents, or
    /// an upload of a file the client holds.
    fn moves_bytes(&self, t: &Transfer) -> bool {
        let path = t.path().relative();
        match t.kind {
            TransferKind::Retr(_) => self.contents.contains_key(&path),
            TransferKind::Stor(_) => self.local.contains_key(&path),
            _ => false,
        }
    }

    /// One MODE E transfer through the in-memory data path: the sender's bytes the receiver
    /// does not hold (REST ranges) cut into blocks over the transfer's connections, and put
    /// back together by the receiver's checks; an upload then meets its announced checksum.
    fn blocks_in_memory(&mut self, t: &Transfer) -> TransferOutcome {
        let Some(mode) = &t.block else {
            return TransferOutcome::NoConnection("not MODE E".into());
        };
        let path = t.path().relative();
        let block = mode.block_size.unwrap_or(64 << 10);
        let connections = mode.parallelism.max(1) as usize;
        let upload = matches!(t.kind, TransferKind::Stor(_));
        let (from, to) = if upload {
            (&self.local, &mut self.contents)
        } else {
            (&self.contents, &mut self.local)
        };
        let data = from.get(&path).cloned().unwrap_or_default();
        let streams = blocks_over(&data, &mode.have, block, connections);
        let into = to.entry(path).or_default();
        let moved = match receive_blocks(&streams, Some(data.len() as u64), into) {
            Ok(n) => n,
            Err(e) => return TransferOutcome::ConnectionLost(e.to_string()),
        };
        into.truncate(data.len());
        self.carried += moved;
        let stored = checksum::hex(checksum::of(into));
        match &t.expect {
            Some(Expected::Value(want)) if upload && *want != stored => {
                TransferOutcome::ChecksumMismatch {
                    expected: want.clone(),
                    actual: stored,
                }
            }
            _ => TransferOutcome::Complete {
                bytes: moved,
                kept: true,
                checksum: None,
            },
        }
    }
}

/// The sending side of the in-memory data path: the bytes of `data` not in `have`, in blocks
/// of at most `block` bytes at their offsets, dealt round-robin over `connections` byte
/// streams; the first stream ends with EOF (announcing the count), the others with EOD, all
/// keeping their connections for the next transfer.
pub fn blocks_over(data: &[u8], have: &RangeSet, block: u64, connections: usize) -> Vec<Vec<u8>> {
    let mut streams = vec![Vec::new(); connections.max(1)];
    let mut next = 0;
    for (start, end) in have.missing(data.len() as u64).iter() {
        let mut at = start;
        while at < end {
            let n = block.max(1).min(end - at);
            let s = &mut streams[next % connections.max(1)];
            s.extend_from_slice(&Header::data(at, n).encode());
            s.extend_from_slice(&data[at as usize..(at + n) as usize]);
            at += n;
            next += 1;
        }
    }
    let count = streams.len() as u64;
    for (i, s) in streams.iter_mut().enumerate() {
        let end = if i == 0 {
            Header::eof(count)
        } else {
            Header::eod()
        };
        s.extend_from_slice(&end.keeping_connection().encode());
    }
    streams
}

/// The receiving side: each stream's blocks written into `into` at their offsets (grown as
/// needed), through the checks a receiver applies to every header ([`Connection`]) and to the
/// transfer's connections together ([`Completion`]). The payload bytes, or the rule broken.
pub fn receive_blocks(
    streams: &[Vec<u8>],
    limit: Option<u64>,
    into: &mut Vec<u8>,
) -> Result<u64, BlockError> {
    let mut completion = Completion::default();
    let mut moved = 0;
    for s in streams {
        let mut conn = Connection::new(limit);
        let mut at = 0;
        while !conn.finished() {
            let raw: [u8; HEADER_LEN] = s
                .get(at..at + HEADER_LEN)
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| BlockError::ClosedBeforeEod("a stream ended".into()))?;
            at += HEADER_LEN;
            let h = Header::decode(&raw)?;
            if let Next::Payload { offset, count } = conn.header(&h, &mut completion)? {
                let (offset, count) = (offset as usize, count as usize);
                let payload = s
                    .get(at..at + count)
                    .ok_or_else(|| BlockError::ClosedBeforeEod("a block was cut".into()))?;
                if into.len() < offset + count {
                    into.resize(offset + count, 0);
                }
                into[offset..offset + count].copy_from_slice(payload);
                at += count;
                moved += count as u64;
            }
        }
    }
    if !completion.complete() {
        return Err(BlockError::ClosedBeforeEod("connections owed".into()));
    }
    Ok(moved)
}

fn setup(direction: Direction) -> Op {
    setup_compressed(direction, None)
}

fn setup_compressed(direction: Direction, compress: Option<crate::compress::Policy>) -> Op {
    Op::BlockMode(BlockSetup {
        direction,
        retr: RetrOpts {
            parallelism: Some((4, 1, 8)),
            ..RetrOpts::default()
        },
        buffer: None,
        compress,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::BlockPeer;
    use crate::compress::Policy;
    use crate::ranges::RangeSet;
    use proptest::prelude::*;
    use std::time::Duration;

    fn logged_in() -> Pair {
        let mut p = Pair::new();
        let login = Op::Login {
            user: "alice".into(),
            password: "secret".into(),
        };
        assert!(matches!(p.run(login), Ok(Outcome::Done(r)) if r.code == 230));
        let Ok(Outcome::Features(f)) = p.run(Op::Features) else {
            panic!("no features")
        };
        assert_eq!(f.block_peer(), Some(BlockPeer::Braid { elastic: true }));
        p.run(Op::Binary).unwrap();
        p
    }

    #[test]
    fn a_batch_of_downloads_logs_in_once_sets_mode_e_once_and_reuses_connections() {
        let mut p = logged_in();
        for i in 0..3 {
            p.files.insert(format!("f{i}"), 1000 + i);
        }
        for i in 0..3 {
            p.run(setup(Direction::Download)).unwrap();
            let reuse = p.client.can_reuse(Direction::Download);
            assert_eq!(reuse, i > 0, "file {i}");
            if !reuse {
                assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
            }
            let retr = Command::Retr(format!("f{i}"));
            let started = p.run(Op::StartTransfer(retr)).unwrap();
            assert_eq!(started, Outcome::Started { reused: reuse });
            p.run(Op::FinishTransfer).unwrap();
            // The engine kept the connections (the server sent EOD without CLOSE).
            p.client.set_cached(Some(Direction::Download));
        }
        let count = |verb: &str| p.seen.iter().filter(|l| l.starts_with(verb)).count();
        assert_eq!(count("USER"), 1);
        assert_eq!(count("MODE E"), 1);
        assert_eq!(count("OPTS BRAID ELASTIC"), 1);
        assert_eq!(count("OPTS RETR"), 1);
        assert_eq!(count("EPSV"), 1);
        assert_eq!(count("RETR"), 3);
        assert!(p.client.elastic());
        // An upload cannot ride on download connections: the client asks for PASV again.
        assert!(!p.client.can_reuse(Direction::Upload));
        // USER, PASS, FEAT, TYPE, MODE, OPTS x2, EPSV, 3 x RETR (their final replies need no
        // command of their own).
        assert_eq!(p.round_trips, 11);
    }

    #[test]
    fn a_checksum_mismatch_is_an_integrity_failure_by_its_code() {
        let mut p = logged_in();
        p.run(setup(Direction::Upload)).unwrap();
        p.run(Op::Passive).unwrap();
        p.outcomes.push_back(TransferOutcome::ChecksumMismatch {
            expected: "ab".into(),
            actual: "cd".into(),
        });
        p.run(Op::StartTransfer(Command::Stor("up".into())))
            .unwrap();
        match p.run(Op::FinishTransfer) {
            Err(Failure::Integrity(r)) => assert_eq!(r.code, 535),
            other => panic!("{other:?}"),
        }
        // A lost connection is transient, a missing file refused, a full disk its own kind.
        p.outcomes
            .push_back(TransferOutcome::ConnectionLost("gone".into()));
        p.run(Op::Passive).unwrap();
        p.run(Op::StartTransfer(Command::Stor("up".into())))
            .unwrap();
        assert!(matches!(
            p.run(Op::FinishTransfer),
            Err(Failure::Transient { reply, .. }) if reply.code == 426
        ));
        p.outcomes
            .push_back(TransferOutcome::Local(crate::session::FsError::NoSpace));
        p.run(Op::Passive).unwrap();
        p.run(Op::StartTransfer(Command::Stor("up".into())))
            .unwrap();
        assert!(matches!(
            p.run(Op::FinishTransfer),
            Err(Failure::NoSpace(_))
        ));
    }

    #[test]
    fn wrong_passwords_then_the_server_gives_up() {
        let mut p = Pair::new();
        let bad = || Op::Login {
            user: "alice".into(),
            password: "wrong".into(),
        };
        for code in [530, 530, 421] {
            match p.run(bad()) {
                Err(Failure::Login(r)) => assert_eq!(r.code, code),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_server_without_epsv_gets_pasv_from_then_on() {
        let mut p = logged_in();
        p.refuse.push("EPSV");
        assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
        assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
        let epsv = p.seen.iter().filter(|l| *l == "EPSV").count();
        let pasv = p.seen.iter().filter(|l| *l == "PASV").count();
        assert_eq!((epsv, pasv), (1, 2));
    }

    #[test]
    fn range_markers_during_an_upload_are_collected() {
        let mut c = ClientSession::new();
        c.begin(Op::FinishTransfer);
        let mut have = RangeSet::new();
        have.insert(0, 10);
        c.reset_stored(have);
        c.handle_reply(Reply::new(111, "Range Marker 10-100,200-300"));
        c.handle_reply(Reply::new(112, "Perf Marker"));
        assert!(
            c.poll_outcome().is_none(),
            "markers do not end the transfer"
        );
        c.handle_reply(Reply::new(226, "Transfer complete."));
        assert!(matches!(c.poll_outcome(), Some(Ok(Outcome::Done(_)))));
        assert_eq!(c.stored().to_string(), "0-100,200-300");
    }

    /// One MODE E transfer of `path` on a logged-in pair: settings, a passive address where
    /// the connections are not kept, the start and the end; how it ended.
    fn transfer(
        p: &mut Pair,
        direction: Direction,
        have: &RangeSet,
        cmd: Command,
    ) -> Result<Outcome, Failure> {
        p.run(setup(direction)).unwrap();
        if !p.client.can_reuse(direction) {
            p.run(Op::Passive).unwrap();
        }
        if !have.is_empty() {
            p.run(Op::RestRanges(have.clone())).unwrap();
        }
        p.run(Op::StartTransfer(cmd)).unwrap();
        let end = p.run(Op::FinishTransfer);
        if end.is_ok() {
            p.client.set_cached(Some(direction));
        }
        end
    }

    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn a_download_moves_every_byte_once_and_the_servers_checksum_is_of_what_arrived() {
        let mut p = logged_in();
        let data = bytes(300_001, 5);
        p.files.insert("f".into(), data.len() as u64);
        p.contents.insert("f".into(), data.clone());
        transfer(
            &mut p,
            Direction::Download,
            &RangeSet::new(),
            Command::Retr("f".into()),
        )
        .unwrap();
        assert!(p.local["f"] == data, "the download differs");
        assert_eq!(p.carried, data.len() as u64, "each byte once");
        let cksm = Op::Checksum {
            alg: "XXH3".into(),
            path: "f".into(),
        };
        let want = checksum::hex(checksum::of(&p.local["f"]));
        assert_eq!(p.run(cksm), Ok(Outcome::Checksum(Some(want))));
    }

    #[test]
    fn a_resumed_download_carries_only_what_the_client_lacks() {
        let mut p = logged_in();
        let data = bytes(1 << 20, 6);
        p.files.insert("f".into(), data.len() as u64);
        p.contents.insert("f".into(), data.clone());
        // A broken earlier run left two ranges, with holes between and after them.
        let have: RangeSet = [(0u64, 200_000u64), (500_000, 600_000)]
            .into_iter()
            .collect();
        let mut partial = vec![0u8; data.len()];
        for (a, b) in have.iter() {
            partial[a as usize..b as usize].copy_from_slice(&data[a as usize..b as usize]);
        }
        p.local.insert("f".into(), partial);
        transfer(
            &mut p,
            Direction::Download,
            &have,
            Command::Retr("f".into()),
        )
        .unwrap();
        assert_eq!(p.carried, data.len() as u64 - have.len());
        assert!(p.local["f"] == data, "the resumed download differs");
    }

    #[test]
    fn an_upload_takes_its_name_only_when_it_hashes_to_what_was_announced() {
        let mut p = logged_in();
        let data = bytes(200_000, 7);
        p.local.insert("up".into(), data.clone());
        let scks = |value: &str| Op::Simple {
            cmd: Command::Scks {
                alg: "XXH3".into(),
                value: Some(value.into()),
            },
            ok: vec![200],
        };
        p.run(scks("00000000000000000000000000000000")).unwrap();
        let refused = transfer(
            &mut p,
            Direction::Upload,
            &RangeSet::new(),
            Command::Stor("up".into()),
        );
        assert!(
            matches!(&refused, Err(Failure::Integrity(r)) if r.code == 535),
            "{refused:?}"
        );
        p.run(scks(&checksum::hex(checksum::of(&data)))).unwrap();
        transfer(
            &mut p,
            Direction::Upload,
            &RangeSet::new(),
            Command::Stor("up".into()),
        )
        .unwrap();
        assert!(p.contents["up"] == data, "the upload differs");
    }

    #[test]
    fn a_stream_that_ends_early_or_a_missing_connection_is_no_whole_transfer() {
        let data = bytes(100_000, 8);
        let mut streams = blocks_over(&data, &RangeSet::new(), 16 << 10, 3);
        let mut into = Vec::new();
        assert_eq!(
            receive_blocks(&streams, Some(100_000), &mut into),
            Ok(100_000)
        );
        assert!(into == data);
        // The EOF announced three connections: two are not enough.
        let two = streams[..2].to_vec();
        assert!(receive_blocks(&two, Some(100_000), &mut Vec::new()).is_err());
        // A block cut short.
        let cut = streams[1].len() - 100;
        streams[1].truncate(cut);
        assert!(receive_blocks(&streams, Some(100_000), &mut Vec::new()).is_err());
        // A block past the end the receiver knows.
        let streams = blocks_over(&data, &RangeSet::new(), 16 << 10, 3);
        assert!(receive_blocks(&streams, Some(50_000), &mut Vec::new()).is_err());
    }

    proptest! {
        #[test]
        fn any_file_over_any_connections_and_blocks_arrives_whole(
            len in 0usize..200_000,
            connections in 1usize..9,
            block in 1u64..70_000,
            held in 0usize..200_000,
        ) {
            let data = bytes(len, len as u64 + 1);
            let held = held.min(len) as u64;
            let have: RangeSet = [(0u64, held)].into_iter().filter(|(_, e)| *e > 0).collect();
            let streams = blocks_over(&data, &have, block, connections);
            let mut into = data[..held as usize].to_vec();
            let moved = receive_blocks(&streams, Some(len as u64), &mut into).unwrap();
            prop_assert_eq!(moved, len as u64 - held);
            into.resize(len, 0);
            prop_assert!(into == data);
        }
    }

    /// A whole session: login, features, MODE E, two downloads (the second on the first's
    /// connections), a checksum, QUIT.
    fn dialogue() -> Vec<Op> {
        let retr = |f: &str| Op::StartTransfer(Command::Retr(f.into()));
        vec![
            Op::Login {
                user: "alice".into(),
                password: "secret".into(),
            },
            Op::Features,
            Op::Binary,
            setup(Direction::Download),
            Op::Passive,
            retr("f0"),
            Op::FinishTransfer,
            setup(Direction::Download),
            retr("f1"),
            Op::FinishTransfer,
            Op::Checksum {
                alg: "XXH3".into(),
                path: "f1".into(),
            },
            Op::Quit,
        ]
    }

    /// Runs the dialogue over `link`, one op at a time; each op's result, and the
    /// server-to-client bytes the client had taken in and the simulated time when it ended.
    #[allow(clippy::type_complexity)]
    fn run_dialogue(link: Link) -> (Vec<Result<Outcome, Failure>>, Vec<(usize, Duration)>, Pair) {
        let one_by_one = dialogue().into_iter().map(|op| vec![op]).collect();
        run_flights(link, false, one_by_one)
    }

    /// Runs `flights` over `link` (each begun together), pipelining or not; as `run_dialogue`.
    #[allow(clippy::type_complexity)]
    fn run_flights(
        link: Link,
        pipeline: bool,
        flights: Vec<Vec<Op>>,
    ) -> (Vec<Result<Outcome, Failure>>, Vec<(usize, Duration)>, Pair) {
        let mut p = Pair::over(link);
        p.client.set_pipeline(pipeline);
        p.files.insert("f0".into(), 10);
        p.files.insert("f1".into(), 20);
        let mut results = Vec::new();
        let mut at = Vec::new();
        for flight in flights {
            let finishing = matches!(flight[..], [Op::FinishTransfer]);
            let rs = p.run_flight(flight);
            if finishing && rs.iter().all(|r| r.is_ok()) {
                // The engine kept the connections (the server sent EOD without CLOSE).
                p.client.set_cached(Some(Direction::Download));
            }
            for r in rs {
                results.push(r);
                at.push((p.delivered, p.now));
            }
        }
        (results, at, p)
    }

    /// The start-up a long path pays before the first byte, in simulated time (the number
    /// the self-tuning and many-files work will bring down).
    #[test]
    fn over_a_long_path_the_first_download_waits_nine_round_trips_and_the_next_one_one() {
        let delay = Duration::from_millis(300);
        let (results, at, p) = run_dialogue(Link {
            delay,
            ..Link::default()
        });
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        let rtt = delay * 2;
        // USER, PASS, FEAT, TYPE, MODE E, OPTS BRAID, OPTS RETR, EPSV, RETR f0.
        assert_eq!(at[5].1, rtt * 9, "until the first download starts");
        // RETR f1 only: the settings and the data connections carry over.
        assert_eq!(at[8].1 - at[6].1, rtt, "the second download's start");
        assert_eq!(p.round_trips, 12, "with CKSM and QUIT");
    }

    /// The dialogue as a pipelining client runs it against a braid server: login, FEAT, TYPE,
    /// SIZE and EPSV in one flight; the MODE E settings with RETR in the next.
    fn pipelined_flights() -> Vec<Vec<Op>> {
        let retr = |f: &str| Op::StartTransfer(Command::Retr(f.into()));
        let mut d = dialogue();
        let size = Op::Ask(Command::Size("f0".into()));
        let passive = d.remove(4);
        let first: Vec<Op> = d.drain(..3).chain([size, passive]).collect();
        assert_eq!(d[1], retr("f0"));
        let second: Vec<Op> = d.drain(..2).collect();
        let mut flights = vec![first, second];
        flights.extend(d.into_iter().map(|op| vec![op]));
        flights
    }

    #[allow(clippy::type_complexity)]
    fn run_pipelined(link: Link) -> (Vec<Result<Outcome, Failure>>, Vec<(usize, Duration)>, Pair) {
        run_flights(link, true, pipelined_flights())
    }

    /// What the client's pipelined start does: the same outcomes as one command at a time,
    /// in two round trips to the first download's start instead of nine.
    #[test]
    fn a_pipelined_start_takes_two_round_trips_and_ends_every_op_the_same() {
        let delay = Duration::from_millis(300);
        let (sequential, _, _) = run_dialogue(Link {
            delay,
            ..Link::default()
        });
        let (mut pipelined, at, p) = run_pipelined(Link {
            delay,
            ..Link::default()
        });
        // SIZE is the one op the sequential dialogue has not, and EPSV goes before the MODE E
        // settings.
        assert!(matches!(pipelined.remove(3), Ok(Outcome::Done(r)) if r.code == 213));
        pipelined.swap(3, 4);
        assert_eq!(pipelined, sequential);
        let rtt = delay * 2;
        assert_eq!(at[6].1, rtt * 2, "until the first download starts");
        let login = p.seen.iter().position(|l| l.starts_with("USER")).unwrap();
        assert_eq!(p.seen[login + 1], "PASS secret", "PASS goes with USER");
    }

    /// A pipelined login that fails at USER: PASS's answer, already on its way, is not taken
    /// for FEAT's, and the ops after the login end by their own replies.
    #[test]
    fn a_pipelined_failure_leaves_the_replies_behind_it_to_their_own_ops() {
        let mut p = Pair::new();
        p.client.set_pipeline(true);
        p.refuse = vec!["USER"];
        let results = p.run_flight(vec![
            Op::Login {
                user: "alice".into(),
                password: "secret".into(),
            },
            Op::Features,
            Op::Ask(Command::Size("f".into())),
        ]);
        assert!(
            matches!(&results[0], Err(Failure::Login(r)) if r.code == 500),
            "{results:?}"
        );
        assert!(
            matches!(&results[1], Ok(Outcome::Features(f)) if f.has("BRAID")),
            "{results:?}"
        );
        assert!(
            matches!(&results[2], Ok(Outcome::Done(r)) if r.code == 530),
            "{results:?}"
        );
        assert_eq!(p.round_trips, 1);
    }

    /// A pipelining session whose first download has left its data connections open.
    fn pipelining_with_kept_connections() -> Pair {
        let mut p = logged_in();
        p.client.set_pipeline(true);
        p.run(setup(Direction::Download)).unwrap();
        assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
        p.run(Op::StartTransfer(Command::Retr("first".into())))
            .unwrap();
        p.run(Op::FinishTransfer).unwrap();
        p
    }

    /// Downloads requested ahead, each as RETR, its end and CKSM, where the middle file has
    /// gone: its refusal ends its start and its end, and every other op still gets its own
    /// reply (the files after it start, end and have their checksums), in one round trip.
    #[test]
    fn a_refused_transfer_requested_ahead_ends_without_taking_the_next_reply() {
        let mut p = pipelining_with_kept_connections();
        p.gone = vec!["b".into()];
        let trips = p.round_trips;
        let ahead = |f: &str| {
            [
                Op::StartTransfer(Command::Retr(f.into())),
                Op::FinishTransfer,
                Op::Checksum {
                    alg: "XXH3".into(),
                    path: f.into(),
                },
            ]
        };
        let results = p.run_flight(["a", "b", "c"].into_iter().flat_map(ahead).collect());
        assert_eq!(p.round_trips - trips, 1);
        let started = Ok(Outcome::Started { reused: true });
        let sum = Ok(Outcome::Checksum(Some("c0ffee".into())));
        for f in [0, 2] {
            assert_eq!(results[3 * f], started, "{results:?}");
            assert!(matches!(&results[3 * f + 1], Ok(Outcome::Done(r)) if r.code == 226));
            assert_eq!(results[3 * f + 2], sum, "{results:?}");
        }
        for refused in &results[3..5] {
            assert!(
                matches!(refused, Err(Failure::Refused { reply, .. }) if reply.code == 550),
                "{results:?}"
            );
        }
    }

    /// A whole flight of 1,024 files requested ahead (the most a session keeps), every
    /// tenth one gone: one round trip, and every op ends by its own reply, in order.
    #[test]
    fn a_thousand_files_requested_ahead_end_each_by_its_own_reply_in_one_round_trip() {
        let mut p = pipelining_with_kept_connections();
        let names: Vec<String> = (0..1024).map(|i| format!("f{i}")).collect();
        p.gone = names.iter().step_by(10).cloned().collect();
        let trips = p.round_trips;
        let ops = names.iter().flat_map(|f| {
            [
                Op::StartTransfer(Command::Retr(f.clone())),
                Op::FinishTransfer,
                Op::Checksum {
                    alg: "XXH3".into(),
                    path: f.clone(),
                },
            ]
        });
        let results = p.run_flight(ops.collect());
        assert_eq!(p.round_trips - trips, 1);
        assert_eq!(results.len(), 3 * 1024);
        for (i, r) in results.chunks(3).enumerate() {
            if i % 10 == 0 {
                assert!(
                    r[..2]
                        .iter()
                        .all(|o| matches!(o, Err(Failure::Refused { .. }))),
                    "file {i}: {r:?}"
                );
            } else {
                assert_eq!(r[0], Ok(Outcome::Started { reused: true }), "file {i}");
                assert!(
                    matches!(&r[1], Ok(Outcome::Done(d)) if d.code == 226),
                    "file {i}"
                );
                assert_eq!(
                    r[2],
                    Ok(Outcome::Checksum(Some("c0ffee".into()))),
                    "file {i}"
                );
            }
        }
    }

    /// `OPTS STOR Eager=1` goes once, only while uploads' data is to go eagerly, and the
    /// server drops a refused upload's data only then and only on connections kept from an
    /// upload (a download's would carry nothing of the client's).
    #[test]
    fn eager_uploads_are_asked_for_once_and_the_server_drains_only_then() {
        let mut p = logged_in();
        p.run(setup(Direction::Upload)).unwrap();
        assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
        p.run(Op::StartTransfer(Command::Stor("up".into())))
            .unwrap();
        p.run(Op::FinishTransfer).unwrap();
        assert!(!p.server.drains_refused_upload(), "not asked for");
        let sent = |p: &Pair| p.seen.iter().filter(|l| l.starts_with("OPTS STOR")).count();
        p.run(Op::Eager(true)).unwrap();
        assert!(p.client.eager() && p.server.drains_refused_upload());
        // Sent ahead, an upload comes on the open connections alone; the server need not
        // watch for more (it does for the others).
        p.run(Op::StartTransfer(Command::Stor("ahead".into())))
            .unwrap();
        p.run(Op::FinishTransfer).unwrap();
        let fixed = |p: &Pair| -> Vec<bool> {
            let blocks = p
                .transfers
                .iter()
                .map(|t| t.block.as_ref().map(|b| b.fixed));
            blocks.map(|f| f.expect("MODE E")).collect()
        };
        assert_eq!(fixed(&p), [false, true]);
        p.run(Op::Eager(true)).unwrap();
        assert_eq!(sent(&p), 1, "{:?}", p.seen);
        p.run(Op::Eager(false)).unwrap();
        assert!(!p.client.eager() && !p.server.drains_refused_upload());
        assert_eq!(p.seen.last().map(String::as_str), Some("OPTS STOR Eager=0"));
        // Kept from a download: nothing to drain.
        p.run(Op::Eager(true)).unwrap();
        p.run(setup(Direction::Download)).unwrap();
        assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
        p.run(Op::StartTransfer(Command::Retr("f".into()))).unwrap();
        p.run(Op::FinishTransfer).unwrap();
        assert!(!p.server.drains_refused_upload());
        assert_eq!(fixed(&p), [false, true, false], "a download is never fixed");
    }

    /// A pair whose server runs with `braid serve --compress <server>`, logged in.
    fn compressing(server: Policy) -> Pair {
        let mut p = Pair::new();
        p.server = Pair::server(server);
        let login = Op::Login {
            user: "alice".into(),
            password: "secret".into(),
        };
        p.run(login).unwrap();
        p.run(Op::Features).unwrap();
        p.run(Op::Binary).unwrap();
        p
    }

    /// What each MODE E transfer the server ran did about compressed blocks.
    fn compression(p: &Pair) -> Vec<Option<Policy>> {
        let blocks = p.transfers.iter().map(|t| t.block.as_ref());
        blocks.map(|b| b.expect("MODE E").compression).collect()
    }

    fn one_transfer(p: &mut Pair, direction: Direction, compress: Option<Policy>) {
        p.run(setup_compressed(direction, compress)).unwrap();
        assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
        let cmd = match direction {
            Direction::Download => Command::Retr("f".into()),
            Direction::Upload => Command::Stor("up".into()),
        };
        p.run(Op::StartTransfer(cmd)).unwrap();
        p.run(Op::FinishTransfer).unwrap();
    }

    #[test]
    fn compressed_blocks_are_asked_for_once_and_each_side_compresses_only_what_it_sends() {
        let mut p = compressing(Policy::Auto);
        one_transfer(&mut p, Direction::Download, Some(Policy::Auto));
        one_transfer(&mut p, Direction::Upload, Some(Policy::Auto));
        let asked = p
            .seen
            .iter()
            .filter(|l| l.starts_with("OPTS BRAID COMPRESS"));
        assert_eq!(asked.collect::<Vec<_>>(), ["OPTS BRAID COMPRESS=auto"]);
        // The server compresses what it sends and takes compressed uploads.
        assert_eq!(compression(&p), [Some(Policy::Auto), Some(Policy::Off)]);
        let c = &p.client;
        assert_eq!(c.compression(Direction::Download, false), Some(Policy::Off));
        assert_eq!(c.compression(Direction::Upload, false), Some(Policy::Auto));
        // Over TLS, auto compresses nothing; an explicit on does.
        assert_eq!(c.compression(Direction::Upload, true), Some(Policy::Off));
        one_transfer(&mut p, Direction::Upload, Some(Policy::On));
        assert_eq!(
            p.client.compression(Direction::Upload, true),
            Some(Policy::On)
        );
    }

    /// A client may ask the server to yield to other traffic by itself (a copy between
    /// servers, whose path only the sender sees): the queueing delay it may add goes in OPTS
    /// RETR, holds for the session's later downloads, and 0 ends it.
    #[test]
    fn background_asked_in_opts_retr_holds_until_the_client_ends_it() {
        let mut p = compressing(Policy::Off);
        for background in [Some(25), None, Some(0)] {
            p.run(Op::BlockMode(BlockSetup {
                direction: Direction::Download,
                retr: RetrOpts {
                    parallelism: Some((2, 2, 2)),
                    background,
                    ..RetrOpts::default()
                },
                buffer: None,
                compress: None,
            }))
            .unwrap();
            assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
            p.run(Op::StartTransfer(Command::Retr("f".into()))).unwrap();
            p.run(Op::FinishTransfer).unwrap();
        }
        let asked: Vec<_> = p
            .transfers
            .iter()
            .map(|t| t.block.as_ref().expect("MODE E").background)
            .collect();
        assert_eq!(asked, [Some(25), Some(25), None]);
        assert!(
            p.seen
                .iter()
                .any(|l| l == "OPTS RETR Parallelism=2,2,2;Background=25;"),
            "{:?}",
            p.seen
        );
    }

    #[test]
    fn a_server_set_to_on_compresses_unless_the_client_says_off() {
        let mut p = compressing(Policy::On);
        one_transfer(&mut p, Direction::Download, Some(Policy::Auto));
        one_transfer(&mut p, Direction::Download, Some(Policy::Off));
        assert_eq!(compression(&p), [Some(Policy::On), Some(Policy::Off)]);
    }

    #[test]
    fn a_server_that_compresses_nothing_is_not_asked_and_refuses_if_asked_anyway() {
        let mut p = compressing(Policy::Off);
        one_transfer(&mut p, Direction::Download, Some(Policy::On));
        assert!(
            !p.seen.iter().any(|l| l.contains("COMPRESS")),
            "{:?}",
            p.seen
        );
        assert_eq!(compression(&p), [None]);
        assert_eq!(p.client.compression(Direction::Upload, false), None);
        let r = p.run(Op::Ask(Command::Opts("BRAID COMPRESS=on".into())));
        assert!(matches!(&r, Ok(Outcome::Done(x)) if x.code == 504), "{r:?}");
        let r = p.run(Op::Ask(Command::Mode(crate::command::Mode::Deflate)));
        assert!(matches!(&r, Ok(Outcome::Done(x)) if x.code == 504), "{r:?}");
        assert_eq!(compression(&p), [None]);
    }

    #[test]
    fn mode_z_deflates_stream_transfers_at_the_level_asked_for_until_another_mode() {
        use crate::command::Mode;
        let mut p = compressing(Policy::Auto);
        let ask = |p: &mut Pair, cmd: Command| match p.run(Op::Ask(cmd)) {
            Ok(Outcome::Done(r)) => r.code,
            other => panic!("{other:?}"),
        };
        assert_eq!(ask(&mut p, Command::Mode(Mode::Deflate)), 200);
        assert_eq!(ask(&mut p, Command::Opts("MODE Z LEVEL 9".into())), 200);
        assert_eq!(ask(&mut p, Command::Opts("MODE Z LEVEL 10".into())), 501);
        let stream = |p: &mut Pair| {
            assert_eq!(p.run(Op::Passive), Ok(Outcome::Passive(40000)));
            p.run(Op::StartTransfer(Command::Retr("f".into()))).unwrap();
            p.run(Op::FinishTransfer).unwrap();
            p.transfers.last().map(|t| t.deflate)
        };
        assert_eq!(stream(&mut p), Some(Some(9)));
        assert_eq!(ask(&mut p, Command::Mode(Mode::Stream)), 200);
        assert_eq!(stream(&mut p), Some(None));
        ask(&mut p, Command::Mode(Mode::Deflate));
        ask(&mut p, Command::Mode(Mode::Extended));
        assert_eq!(stream(&mut p), Some(None), "MODE E ends MODE Z");
    }

    proptest! {
        /// Pipelined, too, however the server's bytes are cut, every op ends as when they
        /// come whole.
        #[test]
        fn pipelined_replies_cut_anywhere_end_every_op_the_same(seed in any::<u64>(), max_segment in 1usize..40) {
            let (want, _, _) = run_pipelined(Link::default());
            let (got, _, _) = run_pipelined(Link { seed, max_segment, ..Link::default() });
            prop_assert_eq!(got, want);
        }

        /// However TCP cuts the server's bytes (a reply split anywhere, several replies in
        /// one read), the session ends each op exactly as when they come whole.
        #[test]
        fn replies_cut_anywhere_end_every_op_the_same(seed in any::<u64>(), max_segment in 1usize..40) {
            let (want, _, _) = run_dialogue(Link::default());
            let (got, _, _) = run_dialogue(Link { seed, max_segment, ..Link::default() });
            prop_assert_eq!(got, want);
        }

        /// The control connection ends after any number of bytes: every op whose replies had
        /// all arrived ends as usual, the rest fail as a closed connection, none hangs.
        #[test]
        fn a_connection_cut_anywhere_fails_exactly_the_ops_it_cut_off(where_ in 0.0..1.02f64, seed in any::<u64>()) {
            // One byte per read: the fewest bytes each op needs.
            let (want, at, _) = run_dialogue(Link { max_segment: 1, ..Link::default() });
            let need: Vec<usize> = at.iter().map(|a| a.0).collect();
            let cut = (*need.last().unwrap() as f64 * where_) as usize;
            let (got, _, _) = run_dialogue(Link { seed, max_segment: 16, cut_after: Some(cut), ..Link::default() });
            for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                if need[i] <= cut {
                    prop_assert_eq!(got, want, "op {} had all its replies", i);
                } else {
                    prop_assert!(matches!(got, Err(Failure::Closed { .. })), "op {}: {:?}", i, got);
                }
            }
        }
    }

    /// The server answers a mid-transfer rate change whenever it reads it: before the
    /// transfer's 226 (a long transfer) or after it (one that was ending); either way the
    /// session takes the answer as such and the ops around it end as usual.
    #[test]
    fn a_rate_change_is_answered_before_or_after_the_transfer_ends() {
        let mut c = ClientSession::new();
        c.begin(Op::FinishTransfer);
        let cmd = c.change_sending(Some(Some(1000)), None);
        assert_eq!(cmd.to_line(), "OPTS RETR MaxRate=1000;");
        c.probe();
        c.handle_reply(Reply::new(200, "OPTS Command Successful."));
        c.handle_reply(Reply::new(213, "Status: 10 bytes transferred so far."));
        assert!(c.poll_outcome().is_none(), "neither answer is the end");
        c.handle_reply(Reply::new(226, "Transfer complete."));
        assert!(matches!(c.poll_outcome(), Some(Ok(Outcome::Done(r))) if r.code == 226));

        // After: through the real server session, the answer on the wire between the 226 and
        // the reply to the next command.
        let mut p = logged_in();
        p.files.insert("f".into(), 10);
        p.run(setup(Direction::Download)).unwrap();
        p.run(Op::Passive).unwrap();
        p.run(Op::StartTransfer(Command::Retr("f".into()))).unwrap();
        let cmd = p.client.change_sending(Some(None), None);
        assert_eq!(cmd.to_line(), "OPTS RETR MaxRate=0;");
        p.send_now(cmd);
        // A background transfer's probe, answered after the end (211) and taken as such.
        let probe = p.client.probe();
        assert_eq!(probe.to_line(), "STAT");
        p.send_now(probe);
        assert!(matches!(p.run(Op::FinishTransfer), Ok(Outcome::Done(r)) if r.code == 226));
        let checksum = Op::Checksum {
            alg: "XXH3".into(),
            path: "f".into(),
        };
        assert_eq!(
            p.run(checksum),
            Ok(Outcome::Checksum(Some("c0ffee".into())))
        );
        assert!(matches!(p.run(Op::Quit), Ok(Outcome::Done(r)) if r.code == 221));
    }

    fn any_reply() -> impl Strategy<Value = Reply> {
        (100u16..600, "[ -~]{0,20}").prop_map(|(code, text)| Reply::new(code, text))
    }

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Login {
                user: "u".into(),
                password: "p".into()
            }),
            Just(Op::Features),
            Just(Op::Binary),
            Just(Op::Eager(true)),
            Just(Op::Passive),
            Just(setup(Direction::Download)),
            Just(Op::StartTransfer(Command::Retr("f".into()))),
            Just(Op::FinishTransfer),
            Just(Op::Protect),
            Just(Op::Quit),
        ]
    }

    proptest! {
        /// Whatever a server replies, an op ends or keeps waiting, sends one command at a
        /// time, and never sends after it ended.
        #[test]
        fn any_replies_end_an_op_cleanly(op in any_op(), replies in proptest::collection::vec(any_reply(), 0..12)) {
            let mut c = ClientSession::new();
            c.begin(op);
            let mut ended = false;
            for r in replies {
                let sent = std::iter::from_fn(|| c.poll_command()).count();
                prop_assert!(sent <= 1);
                prop_assert!(!(ended && sent > 0), "sent after the end");
                c.handle_reply(r);
                if c.poll_outcome().is_some() {
                    ended = true;
                }
                prop_assert!(!(ended && c.awaits_reply() && c.poll_command().is_some()));
            }
        }
    }
}
