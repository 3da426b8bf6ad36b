//! Third-party transfers between braid servers (`braid cp ftp://A/f ftp://B/f`): files go
//! from A to B directly, over MODE E data connections A opens to B; this side only drives the
//! two control connections and checks the checksums of both ends.
//!
//! Who may join is settled by TLS alone. B listens (EPSV) and takes data connections from any
//! address, but each must prove the binding of this side's control session with B (only this
//! side and B know it). This side passes that binding to A, with the SHA-256 of the
//! certificate B showed it, over A's own TLS control connection: A checks it reaches that B
//! and proves the binding. A stranger reaching B's port proves nothing; a PORT to anyone but
//! the client stays refused without this (FTP bounce).
//!
//! Between two GridFTP servers under GSI (`gsiftp://` both), each gets a proxy of the user's
//! credential at login, and they authenticate the data connections between them with it
//! themselves (DCAU A): the checksum both ends give is then ADLER32 or MD5.

use super::Options;
use super::control::Control;
use super::error::{ClientError, Result};
use super::listing::{ListEntry, list_tree};
use super::records::UploadRecord;
use super::sessions::session;
use super::url::Target;
use braid_proto::bundle::Named;
use braid_proto::checksum;
use braid_proto::client::{BlockSetup, Direction, Op};
use braid_proto::command::Command;
use braid_proto::ranges::RangeSet;
use braid_proto::reply::Reply;
use braid_proto::retr_opts::RetrOpts;
use std::collections::HashMap;
use std::time::Instant;

/// Data connections A opens to B first with `-n auto` (the default).
const STREAMS: u32 = 4;
/// With `-n auto`, A may go up to this many connections as its tuning finds they pay.
const MOST_STREAMS: u32 = 16;
/// Files up to this size go on one connection: more would cost a TLS handshake each for
/// nothing (a 1 MiB block is the unit of striping anyway).
const ONE_CONNECTION: u64 = 4 << 20;
/// A tree's files up to this size go in bundles. Alone, a file costs five round trips of the
/// client's (addresses, both starts, both checksums) and new TLS connections between the
/// servers: 0.39 s a file of 5 MB in the lab, whose data took 0.05 s. A bundle moves at most
/// about two seconds of data ([`super::bundle::BUNDLE_TIME`]), so that is what an interrupted
/// one costs again; larger files go alone, where A tunes their connections.
const BUNDLED_MOST: u64 = 64 << 20;

/// What copying one file did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Copied {
    pub source: String,
    pub destination: String,
    pub bytes: u64,
    /// Bytes B held already from an earlier copy that broke off (--resume).
    pub resumed_from: u64,
    pub seconds: f64,
    /// Connections A sent on: the count given with `-n`, or (`-n auto`) the most its tuning
    /// had open at once, as its reports said.
    pub streams: u32,
    /// "auto" where A tuned the count, "fixed" where `-n` gave it.
    pub tuning: &'static str,
    /// Both servers' checksum of the file (they agreed); of its whole bundle where `bundle`
    /// is set.
    pub checksum: String,
    pub algorithm: &'static str,
    /// The files of the bundle it went in (a tree's small files go many to a transfer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<u32>,
}

/// What a copy needs to know of its source on A.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    pub size: u64,
    /// Seconds since the epoch, where A says (MDTM, a listing's `modify`).
    pub modified: Option<i64>,
}

/// B's replies to a transfer until its final one, with what its range markers say it holds
/// saved in `record` as they come (the copy may be cut off at any moment).
fn stored_until_done(b: &mut Control, record: &UploadRecord) -> Result<Reply> {
    let mut saved = b.stored().clone();
    loop {
        let r = b.reply()?;
        if *b.stored() != saved {
            saved = b.stored().clone();
            let _ = record.save(&saved);
        }
        if !r.is_preliminary() {
            return Ok(r);
        }
    }
}

/// A's replies to a transfer until its final one, and the most data connections its reports
/// (`113 Sender … open=N`) said it had open at once.
fn sent_until_done(a: &mut Control) -> Result<(Reply, u32)> {
    let mut most = 0;
    loop {
        let r = a.reply()?;
        if let Some(report) = a.session().take_sender_report() {
            most = most.max(report.open);
        }
        if !r.is_preliminary() {
            return Ok((r, most));
        }
    }
}

/// What copying a tree did.
#[derive(Debug, Default, serde::Serialize)]
pub struct TreeCopied {
    pub files: Vec<Copied>,
    /// Files left alone by `--update`: the destination has them, as large and not older.
    pub skipped: Vec<String>,
    /// Files that failed, with why; the others went on.
    pub failed: Vec<(String, String)>,
    pub directories_made: usize,
    pub seconds: f64,
}

/// The two control sessions of copies from A to B, set up for them.
pub struct Peers {
    a: Control,
    b: Control,
    /// HOST:PORT of A and of B, for messages and the record of a copy.
    src_host: String,
    dst_host: String,
    /// `-n`; None: A tunes the count (`-n auto`).
    streams: Option<u32>,
    rate: Option<u64>,
    /// `--background`: A yields to other traffic on the path to B by itself, adding at most
    /// this many milliseconds of queueing delay (only A sees that path's round trip).
    background: Option<u32>,
    buffer: Option<u64>,
    /// Connections A was last told to open first and at most (OPTS RETR Parallelism).
    told: Option<(u32, u32)>,
    /// B is in MODE E (set with the first copy: listings before it go in stream mode).
    b_ready: bool,
    /// A and B hold the data connections between them that the last transfer left open, for
    /// the next bundle to go on without new ones (each a TLS handshake away).
    linked: bool,
    /// Both are GridFTP servers under GSI, not braid servers: the checksum both compute.
    gridftp_checksum: Option<&'static str>,
}

impl Peers {
    /// Logs in to both, checks that both take part, and tells each its part: B takes data
    /// connections from anywhere that prove its binding, A connects to B's certificate.
    pub fn open(src: &Target, dst: &Target, opts: &Options) -> Result<Peers> {
        if src.gsi || dst.gsi {
            return Peers::open_gridftp(src, dst, opts);
        }
        if opts.tls.is_none() {
            return Err(ClientError::Usage(
                "a copy between two servers needs TLS on both (--tls): the data connections \
                 between them prove through it that they belong to this copy"
                    .into(),
            ));
        }
        let a = session(src, opts, None)?;
        let mut b = session(dst, opts, None)?;
        for (c, t) in [(&a, src), (&b, dst)] {
            if !c.has_feature("BRAID-PEER") || !c.private_blocks() {
                return Err(ClientError::Usage(format!(
                    "{}:{} does not take part in copies between servers (it lists no FEAT \
                     BRAID-PEER): it is not a braid server, or its admin turned them off \
                     (--no-third-party); copy through this machine with get and put instead",
                    t.host, t.port
                )));
            }
        }
        b.expect(&Command::Opts("BRAID PEER=*".into()), &[200])?;
        let (Some(certificate), Some(binding)) = (b.server_certificate(), b.binding()) else {
            return Err(ClientError::Tls(format!(
                "{}: no TLS session to bind the data connections to",
                dst.host
            )));
        };
        let mut peers = Peers::logged_in(a, b, src, dst, opts, None);
        peers.a.expect(
            &Command::Opts(format!(
                "BRAID PEER={}:{}",
                braid_proto::hex::encode(&certificate),
                braid_proto::hex::encode(&binding.to_bytes())
            )),
            &[200],
        )?;
        Ok(peers)
    }

    /// Logs in to two GridFTP servers under GSI (each gets a proxy of the user's credential,
    /// with which they authenticate each other's data connections).
    fn open_gridftp(src: &Target, dst: &Target, opts: &Options) -> Result<Peers> {
        if !(src.gsi && dst.gsi) {
            return Err(ClientError::Usage(
                "a copy between servers goes either between two braid servers (ftp:// with \
                 --tls) or between two GridFTP servers under GSI (gsiftp://, braid serve \
                 --gsi-cert among them), not from one kind to the other: name both gsiftp://, \
                 or copy through this machine with get and put"
                    .into(),
            ));
        }
        if opts.rate_limit.is_some() || opts.background.is_some() {
            return Err(ClientError::Usage(
                "--rate-limit and --background pace a braid server's sending; a GridFTP \
                 server does not take them"
                    .into(),
            ));
        }
        let a = session(src, opts, None)?;
        let b = session(dst, opts, None)?;
        let both = |alg| a.checksum_offered(alg) && b.checksum_offered(alg);
        let checksum = if both("ADLER32") { "ADLER32" } else { "MD5" };
        Ok(Peers::logged_in(a, b, src, dst, opts, Some(checksum)))
    }

    /// The two sessions, logged in to `src` and `dst`, with the settings of `opts`.
    fn logged_in(
        a: Control,
        b: Control,
        src: &Target,
        dst: &Target,
        opts: &Options,
        gridftp_checksum: Option<&'static str>,
    ) -> Peers {
        Peers {
            a,
            b,
            src_host: format!("{}:{}", src.host, src.port),
            dst_host: format!("{}:{}", dst.host, dst.port),
            streams: opts.streams.map(|n| n.max(1)),
            rate: opts.rate_limit,
            background: opts.background.map(|d| {
                (d.as_millis() as u32).clamp(1, braid_proto::retr_opts::MAX_BACKGROUND_MS)
            }),
            buffer: opts.buffer,
            told: None,
            b_ready: false,
            linked: false,
            gridftp_checksum,
        }
    }

    /// Copies `from` (on A) to `to` (on B), a file `size` bytes long last modified at
    /// `modified`; its checksum from both ends must agree. `resume`: where an earlier copy of
    /// this same file broke off, B's partial keeps what arrived and A sends only the rest.
    pub fn copy(&mut self, from: &str, to: &str, source: Source, resume: bool) -> Result<Copied> {
        let size = source.size;
        let (streams, most) = self.set_up(size)?;
        // B's range markers say what it holds, kept as an upload's are, for a later --resume.
        let record = UploadRecord::copy(
            &format!("ftp://{}/{}", self.src_host, from.trim_start_matches('/')),
            size,
            source.modified,
            &self.dst_host,
            to,
        );
        let have = match resume.then(|| record.load()).flatten() {
            Some(have) if have.iter().last().is_some_and(|(_, end)| end <= size) => have,
            _ => RangeSet::new(),
        };
        let started = Instant::now();
        match self.start(from, to, &have) {
            Err(ClientError::Remote { reply, .. }) if !have.is_empty() => {
                eprintln!(
                    "braid: {} cannot continue the earlier copy of {to} ({reply}); copying the whole file",
                    self.dst_host
                );
                record.remove();
                self.start(from, to, &RangeSet::new())?;
            }
            r => r?,
        }
        let (sent, taken) = std::thread::scope(|s| {
            let (a, b) = (&mut self.a, &mut self.b);
            let receiving = s.spawn(|| stored_until_done(b, &record));
            let sent = sent_until_done(a);
            let taken = receiving.join().unwrap_or_else(|_| {
                Err(ClientError::ControlLost("the reply reader failed".into()))
            });
            (sent, taken)
        });
        let ((sent, most_open), taken) = (sent?, taken?);
        let tuned = most > streams;
        let streams = if tuned && most_open > 0 {
            most_open
        } else {
            streams
        };
        let seconds = started.elapsed().as_secs_f64();
        for (reply, what) in [(&sent, "sending"), (&taken, "receiving")] {
            if reply.code / 100 != 2 {
                return Err(ClientError::Remote {
                    what: format!("the {what} server"),
                    reply: reply.clone(),
                });
            }
        }
        // B named the file: its partial is gone, and so is what the record says of it.
        record.remove();
        let (algorithm, checksum) = self.both_ends_agree(from, to)?;
        Ok(Copied {
            source: from.to_string(),
            destination: to.to_string(),
            bytes: size,
            resumed_from: have.len(),
            seconds,
            streams,
            tuning: if tuned { "auto" } else { "fixed" },
            checksum,
            algorithm,
            bundle: None,
        })
    }

    /// Puts A and B in MODE E for a file of `size` bytes, A told how many connections to
    /// open first and at most: one for a small file, `-n`'s count, or (`-n auto`) a range A
    /// tunes within, unless a rate or background mode paces it.
    fn set_up(&mut self, size: u64) -> Result<(u32, u32)> {
        // A GridFTP server opens as many connections as told, and keeps to them.
        let tunes = self.streams.is_none()
            && self.rate.is_none()
            && self.background.is_none()
            && self.gridftp_checksum.is_none();
        let (streams, most) = match self.streams {
            _ if size <= ONE_CONNECTION => (1, 1),
            Some(n) => (n, n),
            None if tunes => (STREAMS, MOST_STREAMS),
            None => (STREAMS, STREAMS),
        };
        if self.told != Some((streams, most)) {
            self.a.run(Op::BlockMode(BlockSetup {
                direction: Direction::Download,
                retr: RetrOpts {
                    parallelism: Some((streams, 1, most)),
                    max_rate: self.rate,
                    background: self.background,
                    ..RetrOpts::default()
                },
                buffer: self.buffer,
                compress: None,
            }))?;
            self.told = Some((streams, most));
        }
        if !self.b_ready {
            self.b.run(Op::BlockMode(BlockSetup {
                direction: Direction::Upload,
                retr: RetrOpts::default(),
                buffer: self.buffer,
                compress: None,
            }))?;
            self.b_ready = true;
        }
        Ok((streams, most))
    }

    /// Both servers' checksum of the copy, which must agree: (algorithm, value).
    fn both_ends_agree(&mut self, from: &str, to: &str) -> Result<(&'static str, String)> {
        let algorithm = self.gridftp_checksum.unwrap_or(checksum::NAME);
        // Both asked at once: one round trip, not two.
        self.a.ask_checksum(algorithm, from)?;
        let theirs = self.b.checksum(algorithm, to)?;
        let mine = self.a.checksum_answer()?;
        let (Some(mine), Some(theirs)) = (mine, theirs) else {
            return Err(ClientError::Integrity(
                "a server gave no checksum of the file: the copy is unchecked".into(),
            ));
        };
        if mine != theirs {
            return Err(ClientError::Integrity(format!(
                "{from} on {} has checksum {mine}, the copy {to} on {} {theirs}: the copy is \
                 damaged",
                self.src_host, self.dst_host
            )));
        }
        Ok((algorithm, theirs))
    }

    /// Has B take `to` and A send `from` to it, but for the ranges B already `have`s.
    fn start(&mut self, from: &str, to: &str, have: &RangeSet) -> Result<()> {
        self.link()?;
        if !have.is_empty() {
            self.b.expect(&Command::RestRanges(have.clone()), &[350])?;
            self.a.expect(&Command::RestRanges(have.clone()), &[350])?;
        }
        self.b.reset_stored(have.clone());
        let stor = Command::Stor(to.to_string());
        if self.gridftp_checksum.is_some() {
            // A GridFTP server answers STOR's 150 only once the data connections came: A
            // must be asked to send before B's answer is read.
            self.b.send_transfer(&stor)?;
            let sent = self.a.start_transfer(&Command::Retr(from.to_string()));
            let taken = self.b.transfer_started(&stor);
            if let Err(e) = sent {
                self.abort_b();
                return Err(e);
            }
            return taken.map(drop);
        }
        self.b.start_transfer(&stor)?;
        if let Err(e) = self.a.start_transfer(&Command::Retr(from.to_string())) {
            // B waits for connections that will not come.
            self.abort_b();
            return Err(e);
        }
        Ok(())
    }

    /// Has A open new data connections to B for the next transfer (B's EPSV, A's EPRT); the
    /// ones the last transfer left open go.
    fn link(&mut self) -> Result<()> {
        self.linked = false;
        let there = self.b.passive_addr()?.target;
        self.a.expect(&Command::Eprt(there), &[200])?;
        Ok(())
    }

    /// Stops B's transfer that A will send nothing to, or the next one waits behind it. ABOR
    /// goes at once, not behind the commands of a bundle asked for after this one: B reads
    /// it while the transfer runs and answers for both (426, then 226).
    fn abort_b(&mut self) {
        self.linked = false;
        if self.b.send(&Command::Abor).is_ok() {
            let _ = self.b.final_reply();
            let _ = self.b.final_reply();
        }
    }

    /// Asks both servers for a bundle of `files`: A to send them end to end as one MODE E
    /// transfer (RBND), B to store them (SBND) and name them, with their times, only once the
    /// whole arrived and hashes to the checksum A's end gives. One exchange for them all,
    /// instead of several round trips and data connections each (1,000 files of 4 KiB took
    /// 240 s one by one with the client 30 ms from the servers). On the connections the
    /// transfer before leaves open (`behind`: the bundle moving now, which this one follows at
    /// once on both servers), both servers' commands go now, B's data allowed before its
    /// answer (`OPTS STOR Eager=1`: refused, it is read and dropped); otherwise B's go now
    /// and A's once B has started ([`Peers::start_bundle`]).
    fn ask_bundle(&mut self, files: &[Bundled], behind: bool) -> Result<Asked> {
        // The connections the first bundle opens carry the later ones too: as many as a
        // large file starts with.
        let (streams, _) = self.set_up(u64::MAX)?;
        let on_a: Vec<Named> = files
            .iter()
            .map(|f| Named {
                size: f.size,
                path: f.from.clone(),
                mtime: None,
            })
            .collect();
        let on_b: Vec<Named> = files
            .iter()
            .map(|f| Named {
                size: f.size,
                path: f.to.clone(),
                mtime: f.modified,
            })
            .collect();
        let mut to_b = super::bundle_put::store_commands(&on_b);
        let b_lines = to_b.len();
        to_b.push(Op::StartTransfer(Command::StorBundle));
        let mut to_a = super::bundle::lines(&on_a);
        let a_lines = to_a.len();
        to_a.push(Op::StartTransfer(Command::RetrBundle));
        let linked = behind || self.linked;
        if linked {
            self.b.later(Op::Eager(true), None)?;
            self.b.begin_all(to_b)?;
            self.a.begin_all(to_a)?;
            return Ok(Asked {
                a_lines,
                b_lines,
                to_a: None,
                streams,
            });
        }
        self.link()?;
        self.b.begin_all(to_b)?;
        Ok(Asked {
            a_lines,
            b_lines,
            to_a: Some(to_a),
            streams,
        })
    }

    /// Reads both servers' answers to a bundle asked for, up to its start on both (A asked
    /// once B has started, on new connections). Err: it did not start, and no file of it was
    /// stored.
    fn start_bundle(&mut self, asked: Asked) -> Result<()> {
        let Asked {
            a_lines,
            b_lines,
            to_a,
            ..
        } = asked;
        let linked = to_a.is_none();
        // B's answers: a refusal leaves A unasked (new connections) or sending into B's
        // drain (kept ones), read to its end below.
        let b_refused = match bundle_started(&mut self.b, b_lines, &Command::StorBundle) {
            Ok(()) => None,
            Err(e @ ClientError::Remote { .. }) if !linked => return Err(e),
            Err(e @ ClientError::Remote { .. }) => Some(e),
            Err(e) => return Err(e),
        };
        if let Some(to_a) = to_a {
            self.a.begin_all(to_a)?;
        }
        if let Err(e) = bundle_started(&mut self.a, a_lines, &Command::RetrBundle) {
            match b_refused {
                None => self.abort_b(),
                // B reads and drops what A sends on the connections they share, and A sends
                // nothing: A's end of them goes (a MODE retires them), or B would wait for
                // it until its idle timeout.
                Some(_) => {
                    self.linked = false;
                    let mode = Command::Mode(braid_proto::command::Mode::Extended);
                    let _ = self.a.expect(&mode, &[200]);
                }
            }
            return Err(e);
        }
        if let Some(e) = b_refused {
            // A's data goes to B's drain: its end is read, and the bundle has failed.
            let _ = sent_until_done(&mut self.a)?;
            self.linked = false;
            return Err(e);
        }
        Ok(())
    }

    /// Reads a started bundle to its end: A's (with the checksum of what it sent), which the
    /// client passes to B, then B's once it has checked it and named the files. The bundle's
    /// checksum and, for the report, the connections A sent on (`streams` if it did not say).
    /// Err: no file of it was stored.
    fn finish_bundle(&mut self, streams: u32) -> Result<(String, u32)> {
        let (sent, most_open) = sent_until_done(&mut self.a)?;
        let sum = match (sent.code / 100, braid_proto::bundle::sum_in(&sent.text())) {
            (2, Some(sum)) => sum,
            (2, None) => {
                self.abort_b();
                return Err(ClientError::Protocol(format!(
                    "{} ended a bundle without its checksum ({sent})",
                    self.src_host
                )));
            }
            _ => {
                self.abort_b();
                return Err(ClientError::Remote {
                    what: "the sending server".into(),
                    reply: sent,
                });
            }
        };
        self.b.send(&Command::Scks {
            alg: checksum::NAME.into(),
            value: Some(sum.clone()),
        })?;
        // The checksum's answer, then the bundle's end (a mismatch is that end's error); or,
        // where B failed while the data came (its disk full, say), that end first.
        let (first, second) = (self.b.final_reply()?, self.b.final_reply()?);
        let end = match (first.code, second.code / 100) {
            (200, 2) => None,
            (200, _) => Some(second),
            _ => Some(first),
        };
        if let Some(end) = end {
            self.linked = false;
            return Err(ClientError::Remote {
                what: "the receiving server".into(),
                reply: end,
            });
        }
        self.linked = true;
        Ok((sum, if most_open > 0 { most_open } else { streams }))
    }

    /// The size and modification time of a file on A, or why there is none.
    pub fn source(&mut self, path: &str) -> Result<Source> {
        let r = self.a.size(path)?;
        let size = r.size().ok_or_else(|| ClientError::Remote {
            what: format!("SIZE {path} on {}", self.src_host),
            reply: r,
        })?;
        let modified = super::tree::remote_mtime(&mut self.a, path);
        Ok(Source { size, modified })
    }

    /// Copies the directory `from` on A, everything in it, into `to` on B (made if missing,
    /// with its parents). `update`: files B has as large and not older are left alone;
    /// `resume`: files an earlier copy left part-way go on from there. Files up to
    /// [`BUNDLED_MOST`] go in bundles where both servers take them, the others one by one. A
    /// file that fails does not stop the others.
    pub fn copy_tree(
        &mut self,
        from: &str,
        to: &str,
        update: bool,
        resume: bool,
    ) -> Result<TreeCopied> {
        let started = Instant::now();
        let entries = list_tree(&mut self.a, from, None)?;
        let mut out = TreeCopied::default();
        // What B has already, for --update: its tree under `to`, if there is one.
        let have: HashMap<String, (Option<u64>, Option<i64>)> = if update {
            list_tree(&mut self.b, to, None)
                .unwrap_or_default()
                .into_iter()
                .map(|e| (e.name, (e.size, e.modify)))
                .collect()
        } else {
            HashMap::new()
        };
        out.directories_made = self.make_dirs(to, &entries)?;
        let mut small = Vec::new();
        let mut large = Vec::new();
        let bundles = self.bundles();
        for e in entries.iter().filter(|e| e.kind.as_deref() == Some("file")) {
            if update
                && let Some(&(Some(size), modify)) = have.get(&e.name)
                && Some(size) == e.size
                && modify >= e.modify
            {
                out.skipped.push(e.name.clone());
                continue;
            }
            match e.size {
                Some(size) if bundles && size <= BUNDLED_MOST => small.push(Bundled {
                    name: e.name.clone(),
                    from: join(from, &e.name),
                    to: join(to, &e.name),
                    size,
                    modified: e.modify,
                }),
                _ => large.push(e),
            }
        }
        // Each bundle's commands go to both servers as soon as the one before has started on
        // both, so that A sends it right behind that one.
        let mut bytes = super::bundle::FIRST_BYTES;
        let mut rest = &small[..];
        let mut next: Option<(&[Bundled], Asked)> = None;
        let mut again: Vec<&Bundled> = Vec::new();
        loop {
            let (run, asked) = match next.take() {
                Some(asked) => asked,
                None if rest.is_empty() => break,
                None => {
                    let run = take_bundle(&mut rest, bytes);
                    match self.ask_bundle(run, false) {
                        Ok(asked) => (run, asked),
                        Err(err) if breaks_copy(&err) => return Err(err),
                        Err(err) => {
                            tracing::info!("a bundle of {} files failed ({err})", run.len());
                            again.extend(run);
                            continue;
                        }
                    }
                }
            };
            let at = Instant::now();
            let streams = asked.streams;
            let done = match self.start_bundle(asked) {
                Ok(()) => {
                    if !rest.is_empty() {
                        let following = take_bundle(&mut rest, bytes);
                        next = Some((following, self.ask_bundle(following, true)?));
                    }
                    self.finish_bundle(streams)
                }
                Err(err) => Err(err),
            };
            match done {
                Ok((sum, streams)) => {
                    let seconds = at.elapsed().as_secs_f64();
                    let total: u64 = run.iter().map(|f| f.size).sum();
                    bytes = super::bundle::next_bytes(total, at.elapsed());
                    out.files.extend(run.iter().map(|f| Copied {
                        source: f.from.clone(),
                        destination: f.to.clone(),
                        bytes: f.size,
                        resumed_from: 0,
                        seconds,
                        streams,
                        tuning: "fixed",
                        checksum: sum.clone(),
                        algorithm: checksum::NAME,
                        bundle: Some(run.len() as u32),
                    }));
                }
                Err(err) if breaks_copy(&err) => return Err(err),
                Err(err) => {
                    tracing::info!("a bundle of {} files failed ({err})", run.len());
                    again.extend(run);
                }
            }
        }
        // The files of bundles that failed go one by one, once no bundle is under way.
        for f in again {
            let found = Source {
                size: f.size,
                modified: f.modified,
            };
            self.copy_or_note(&f.name, &f.from, &f.to, Ok(found), resume, &mut out)?;
        }
        for e in large {
            let (source, dest) = (join(from, &e.name), join(to, &e.name));
            let found = match e.size {
                Some(size) => Ok(Source {
                    size,
                    modified: e.modify,
                }),
                None => self.source(&source),
            };
            self.copy_or_note(&e.name, &source, &dest, found, resume, &mut out)?;
        }
        out.seconds = started.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Copies one file of a tree, or notes in `out` why it failed; Err: the copy cannot go on.
    fn copy_or_note(
        &mut self,
        name: &str,
        from: &str,
        to: &str,
        found: Result<Source>,
        resume: bool,
        out: &mut TreeCopied,
    ) -> Result<()> {
        match found.and_then(|found| self.copy(from, to, found, resume)) {
            Ok(c) => out.files.push(c),
            Err(err) if breaks_copy(&err) => return Err(err),
            Err(err) => out.failed.push((name.to_string(), err.to_string())),
        }
        Ok(())
    }

    /// Whether both servers move bundles: A sends them (RBND) and B stores them (SBND).
    fn bundles(&mut self) -> bool {
        self.a.session().features().bundles() && self.b.session().features().stores_bundles()
    }

    /// Makes `to` on B, its parents where missing, and the directories of `entries` beneath
    /// it, parents first; how many were made. Err: `to` neither exists nor could be made, so
    /// no file could go there.
    fn make_dirs(&mut self, to: &str, entries: &[ListEntry]) -> Result<usize> {
        let top = to.trim_end_matches('/');
        let mut dirs: Vec<String> = super::tree::parents(top).collect();
        let parents = dirs.len();
        if !top.is_empty() {
            dirs.push(top.to_string());
        }
        let mut below: Vec<&str> = entries
            .iter()
            .filter(|e| e.kind.as_deref() == Some("dir"))
            .map(|e| e.name.as_str())
            .collect();
        below.sort_by_key(|d| d.matches('/').count());
        dirs.extend(below.into_iter().map(|d| join(to, d)));
        let made = super::tree::make_dirs(&mut self.b, &dirs);
        if !top.is_empty() && !made.contains(&parents) {
            let r = self.b.cmd(&Command::Mlst(Some(top.to_string())))?;
            if r.code != 250 {
                return Err(ClientError::Remote {
                    what: format!("making the directory {top} on {}", self.dst_host),
                    reply: r,
                });
            }
        }
        Ok(made.len())
    }

    pub fn quit(self) {
        self.a.quit();
        self.b.quit();
    }
}

/// A file of a tree to go in a bundle: its name in the tree, its path on A and on B, its size
/// and time as A listed them.
struct Bundled {
    name: String,
    from: String,
    to: String,
    size: u64,
    modified: Option<i64>,
}

/// A bundle asked for, its answers still to read ([`Peers::start_bundle`]).
struct Asked {
    a_lines: usize,
    b_lines: usize,
    /// A's commands, where they wait for B's start on new connections; None: they went with
    /// B's, on the connections the transfer before it leaves open.
    to_a: Option<Vec<Op>>,
    /// The connections A was told to send on.
    streams: u32,
}

/// Whether an error ends the whole copy (a server or the way to it is gone) rather than one
/// file or bundle.
fn breaks_copy(err: &ClientError) -> bool {
    matches!(
        err,
        ClientError::ControlLost(_) | ClientError::Connect { .. }
    )
}

/// The next bundle's files, taken off the front of `rest` ([`bundle_len`]).
fn take_bundle<'a>(rest: &mut &'a [Bundled], bytes: u64) -> &'a [Bundled] {
    let (run, after) = rest.split_at(bundle_len(rest, bytes));
    *rest = after;
    run
}

/// How many of `files` the next bundle takes: at least one, then while they come to no more
/// than `bytes`, and no more than a server stores at once.
fn bundle_len(files: &[Bundled], bytes: u64) -> usize {
    let most = super::bundle::MOST_FILES.min(braid_proto::bundle::STORE_MOST);
    let mut total = 0;
    files
        .iter()
        .take(most)
        .take_while(|f| {
            total += f.size;
            total <= bytes
        })
        .count()
        .max(1)
}

/// Reads the answers to a bundle's `lines` commands before its transfer command and to that
/// command's start. Err: the first refusal, or why the session broke.
fn bundle_started(c: &mut Control, lines: usize, cmd: &Command) -> Result<()> {
    let refused = super::bundle::named(c, lines).map_err(|f| f.error)?;
    match c.transfer_started(cmd) {
        Ok(_) => refused.map_or(Ok(()), Err),
        Err(e @ ClientError::Remote { .. }) => Err(refused.unwrap_or(e)),
        Err(e) => Err(e),
    }
}

/// `dir/name`, or `name` alone where `dir` is the login directory.
fn join(dir: &str, name: &str) -> String {
    match (dir.trim_end_matches('/'), name) {
        ("", n) => n.to_string(),
        (d, "") => d.to_string(),
        (d, n) => format!("{d}/{n}"),
    }
}
