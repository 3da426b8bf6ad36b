//! An in-memory harness (in the spirit of quinn's `Pair`): a [`ClientSession`] and a server
//! [`Session`] wired together through their wire forms, with the server's I/O (passwords,
//! files, passive ports, transfers) answered from tables. Control-channel behaviour is tested
//! here in microseconds, deterministically; each command costs one simulated round trip.

use crate::client::{BlockSetup, ClientSession, Direction, Failure, Op, Outcome};
use crate::command::Command;
use crate::reply::{Reply, ReplyParser};
use crate::retr_opts::RetrOpts;
use crate::session::{Action, FsOp, FsOutcome, Perm, Session, SessionConfig, TransferOutcome};
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

pub struct Pair {
    pub client: ClientSession,
    pub server: Session,
    /// user → password
    pub users: BTreeMap<String, String>,
    /// path → size
    pub files: BTreeMap<String, u64>,
    /// Verbs the server answers with 500 before its session sees them (an older server).
    pub refuse: Vec<&'static str>,
    /// How the next transfers end, in order (Complete with kept connections by default).
    pub outcomes: VecDeque<TransferOutcome>,
    /// Every command line the server received.
    pub seen: Vec<String>,
    /// Round trips so far (one per command).
    pub round_trips: u32,
    /// Replies sent and not yet read by the client.
    in_flight: VecDeque<Reply>,
}

impl Pair {
    pub fn new() -> Pair {
        let server = Session::new(
            SessionConfig {
                anonymous: Some(Perm::ReadWrite),
                max_login_failures: 3,
                max_streams: 16,
                tls: false,
            },
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        );
        let mut p = Pair {
            client: ClientSession::new(),
            server,
            users: BTreeMap::new(),
            files: BTreeMap::new(),
            refuse: Vec::new(),
            outcomes: VecDeque::new(),
            seen: Vec::new(),
            round_trips: 0,
            in_flight: VecDeque::new(),
        };
        p.users.insert("alice".into(), "secret".into());
        p
    }

    /// Runs one op to its end.
    pub fn run(&mut self, op: Op) -> Result<Outcome, Failure> {
        self.client.begin(op);
        for _ in 0..100 {
            if let Some(o) = self.client.poll_outcome() {
                assert!(
                    self.client.poll_command().is_none(),
                    "a command was left to send after the op ended"
                );
                return o;
            }
            if let Some(cmd) = self.client.poll_command() {
                self.round_trips += 1;
                let replies = self.serve(&cmd);
                self.in_flight.extend(replies);
            }
            // Replies go through their wire form, one at a time, as the client reads them.
            if self.client.awaits_reply() {
                let r = self
                    .in_flight
                    .pop_front()
                    .expect("the client waits for a reply the server never sends");
                let mut parser = ReplyParser::new();
                parser.feed(&r.to_bytes());
                let r = parser.next_reply().expect("reply parses").expect("whole");
                self.client.handle_reply(r);
            }
        }
        panic!("the op did not end in 100 steps")
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
            Action::Reply(r) | Action::Close(r) | Action::StartTls(r) => vec![r],
            Action::Login { .. } => vec![Reply::new(451, "login check loops")],
            Action::Passive { extended } => {
                let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 40000);
                vec![self.server.passive_done(extended, Ok(addr))]
            }
            Action::Fs(op) => {
                let result = match op {
                    FsOp::Size { path, .. } => self
                        .files
                        .get(&path.relative())
                        .map(|&n| FsOutcome::Size(n))
                        .ok_or(crate::session::FsError::NotFound),
                    _ => Ok(FsOutcome::Done),
                };
                vec![self.server.fs_done(result)]
            }
            Action::Transfer(t) => {
                let size = self.files.get(&t.path().relative()).copied();
                let outcome = self
                    .outcomes
                    .pop_front()
                    .unwrap_or(TransferOutcome::Complete {
                        bytes: size.unwrap_or(0),
                        kept: true,
                    });
                let mut replies = vec![t.opening(size)];
                replies.extend(self.server.transfer_done(&t, outcome));
                replies
            }
        }
    }
}

fn setup(direction: Direction) -> Op {
    Op::BlockMode(BlockSetup {
        direction,
        retr: RetrOpts {
            parallelism: Some((4, 1, 8)),
            block_size: None,
            max_rate: None,
        },
        buffer: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::BlockPeer;
    use crate::ranges::RangeSet;
    use proptest::prelude::*;

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
