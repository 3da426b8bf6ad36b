//! braid's FTP protocol logic, free of I/O.
//!
//! Everything here takes bytes or events in and gives bytes or events out: no sockets, no files,
//! no clock reads. That keeps the protocol unit-testable and fuzzable; the `braid` crate drives
//! it with real sockets and files.

pub mod addr;
pub mod ascii;
pub mod block;
pub mod bundle;
pub mod checksum;
pub mod client;
pub mod command;
pub mod compress;
pub mod connect_back;
pub mod hex;
pub mod line;
pub mod listing;
pub mod markers;
#[cfg(test)]
mod pair;
pub mod path;
pub mod ranges;
pub mod reply;
pub mod retr_opts;
pub mod session;
pub mod stripes;
pub mod time;

pub use command::{Command, ParseError};
pub use path::VPath;
pub use reply::{Reply, ReplyParser};

/// Longest control line braid accepts, CRLF included. RFC 959 sets no limit; a limit keeps a
/// hostile client from making the server buffer without bound.
pub const MAX_LINE: usize = 8192;

/// Entry points for `fuzz/` (cargo-fuzz). Compiled always so the unit tests exercise them too.
#[doc(hidden)]
pub mod fuzzing {
    /// A reply written out and read back.
    fn reparse(r: &crate::Reply) -> Result<Option<crate::Reply>, crate::reply::ReplyError> {
        let mut p = crate::reply::ReplyParser::new();
        p.feed(&r.to_bytes());
        p.next_reply()
    }

    /// Replies from a hostile server: the parser, the markers read out of replies, and what
    /// parses must write out to bytes that parse back the same.
    pub fn reply_parser(data: &[u8]) {
        // The same bytes as a listing a hostile server sends (MLSD or LIST lines).
        for line in String::from_utf8_lossy(data).lines() {
            let _ = crate::listing::parse_mlsx(line);
            if let Some(l) = crate::listing::parse_list(line) {
                assert!(
                    !l.name.is_empty() && line.contains(&l.name),
                    "{line:?}: {l:?}"
                );
            }
        }
        let mut parser = crate::reply::ReplyParser::new();
        parser.feed(data);
        while let Ok(Some(r)) = parser.next_reply() {
            let _ = crate::markers::parse_range_marker(&r);
            let _ = crate::markers::parse_sender_marker(&r);
            let back = reparse(&r);
            assert!(
                matches!(&back, Ok(Some(b)) if b.code == r.code),
                "{r:?} written out as {:?} parsed as {back:?}",
                String::from_utf8_lossy(&r.to_bytes())
            );
        }
    }

    /// A session driven by arbitrary command lines, every request it makes answered the way
    /// the bytes say (granted or refused): it must never panic, and every reply must be one
    /// line-safe FTP reply.
    pub fn session(data: &[u8]) {
        use crate::session::{
            Action, AdatOutcome, FsError, Perm, Session, SessionConfig, TransferOutcome,
        };
        let mut s = Session::new(
            SessionConfig {
                anonymous: Some(Perm::ReadWrite),
                max_login_failures: 3,
                max_streams: 8,
                tls: data.first().is_some_and(|b| b & 1 == 1),
                private_data_required: data.first().is_some_and(|b| b & 2 == 2),
                compress: crate::compress::Policy::Auto,
                third_party: true,
                data_node: false,
                striped: false,
                gsi: data.first().is_some_and(|b| b & 4 == 4),
            },
            std::net::IpAddr::from([198, 18, 0, 1]),
        );
        let check = |r: &crate::Reply| {
            assert!((100..600).contains(&r.code), "{r:?}");
            assert!(matches!(reparse(r), Ok(Some(_))), "{r:?}");
        };
        let mut lines = crate::line::LineBuffer::new(crate::MAX_LINE);
        lines.extend(data);
        let mut coin = data.iter().copied().cycle();
        let mut yes = move || coin.next().is_some_and(|b| b & 2 == 2);
        while let Ok(Some(line)) = lines.next_line() {
            let Ok(cmd) = crate::Command::parse(&line) else {
                continue;
            };
            let mut action = s.handle(cmd);
            if let Action::Login { .. } = action {
                action = s.login_done(yes().then_some(Perm::ReadWrite));
            }
            match action {
                Action::Adat(token) => {
                    let outcome = match (yes(), yes()) {
                        (true, true) => AdatOutcome::More(token),
                        (true, false) => AdatOutcome::Done {
                            token: None,
                            delegated: yes(),
                        },
                        _ => AdatOutcome::Failed("refused".into()),
                    };
                    if let Action::Reply(r) | Action::Close(r) = s.adat_done(outcome) {
                        check(&r);
                    }
                }
                Action::Reply(r) | Action::Close(r) | Action::StartTls(r) => check(&r),
                Action::Login { .. } => {}
                Action::Passive { extended } => {
                    let addr = std::net::SocketAddr::from(([198, 18, 0, 2], 40000));
                    let result = if yes() {
                        Ok(addr)
                    } else {
                        Err("no port".into())
                    };
                    check(&s.passive_done(extended, result));
                }
                Action::StripedPassive => {
                    let addr = std::net::SocketAddr::from(([198, 18, 0, 3], 40001));
                    check(&s.striped_passive_done(Ok(vec![addr])))
                }
                Action::Fs(_) => check(&s.fs_done(Err(FsError::NotFound))),
                Action::Transfer(t) => {
                    let outcome = if yes() {
                        TransferOutcome::Complete {
                            bytes: 1,
                            kept: yes(),
                            checksum: None,
                        }
                    } else {
                        TransferOutcome::ConnectionLost("gone".into())
                    };
                    check(&t.opening(Some(1)));
                    for r in s.transfer_done(&t, outcome) {
                        check(&r);
                    }
                }
            }
        }
    }

    /// Feeds arbitrary bytes through the line splitter and the command parser. Whatever parses
    /// must encode to a line that parses back to the same command: what the server logs and
    /// what the client sends are the same thing.
    pub fn command_parser(data: &[u8]) {
        let mut lines = crate::line::LineBuffer::new(crate::MAX_LINE);
        lines.extend(data);
        while let Ok(Some(line)) = lines.next_line() {
            if let Ok(cmd) = crate::Command::parse(&line) {
                let mut wire = Vec::new();
                cmd.encode(&mut wire);
                let again = crate::Command::parse(&wire[..wire.len() - 2]);
                assert_eq!(
                    again.as_ref(),
                    Ok(&cmd),
                    "{:?} re-encoded as {:?}",
                    String::from_utf8_lossy(&line),
                    String::from_utf8_lossy(&wire)
                );
            }
        }
    }
}

/// The fuzz targets' properties on random input shaped like the real thing, in every test run.
#[cfg(test)]
mod fuzz_properties {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn replies_a_hostile_server_might_send(
            lines in proptest::collection::vec(
                "[0-9]{3}[ -][ -~]{0,30}|[ -~]{0,12}|[-dl][rwx-]{9} [0-9] [a-z ]{1,9}[0-9]{1,4} (Jan|Nov) [0-9]{1,2} [0-9:]{4,5} [ -~]{0,12}",
                0..8,
            ),
        ) {
            crate::fuzzing::reply_parser((lines.join("\r\n") + "\r\n").as_bytes());
        }

        #[test]
        fn command_sequences_never_upset_a_session(
            seed in any::<u8>(),
            cmds in proptest::collection::vec(
                (proptest::sample::select(crate::command::KNOWN_VERBS.to_vec()), "[ -~]{0,16}"),
                0..40,
            ),
        ) {
            let mut data = vec![seed];
            for (verb, arg) in cmds {
                data.extend_from_slice(format!("{verb} {arg}\r\n").as_bytes());
            }
            crate::fuzzing::session(&data);
        }
    }
}
