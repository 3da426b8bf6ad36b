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

use super::Options;
use super::control::Control;
use super::error::{ClientError, Result};
use super::listing::list_tree;
use super::records::UploadRecord;
use super::sessions::session;
use super::url::Target;
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
    /// Both servers' checksum of the file (they agreed).
    pub checksum: String,
    pub algorithm: &'static str,
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
}

impl Peers {
    /// Logs in to both, checks that both take part, and tells each its part: B takes data
    /// connections from anywhere that prove its binding, A connects to B's certificate.
    pub fn open(src: &Target, dst: &Target, opts: &Options) -> Result<Peers> {
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
        let mut peers = Peers {
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
        };
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
        })
    }

    /// Puts A and B in MODE E for a file of `size` bytes, A told how many connections to
    /// open first and at most: one for a small file, `-n`'s count, or (`-n auto`) a range A
    /// tunes within, unless a rate or background mode paces it.
    fn set_up(&mut self, size: u64) -> Result<(u32, u32)> {
        let tunes = self.streams.is_none() && self.rate.is_none() && self.background.is_none();
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
        let algorithm = checksum::NAME;
        let ends = [
            self.a.checksum(algorithm, from)?,
            self.b.checksum(algorithm, to)?,
        ];
        let [Some(mine), Some(theirs)] = ends else {
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
        let there = self.b.passive_addr()?.target;
        self.a.expect(&Command::Eprt(there), &[200])?;
        if !have.is_empty() {
            self.b.expect(&Command::RestRanges(have.clone()), &[350])?;
            self.a.expect(&Command::RestRanges(have.clone()), &[350])?;
        }
        self.b.reset_stored(have.clone());
        self.b.start_transfer(&Command::Stor(to.to_string()))?;
        if let Err(e) = self.a.start_transfer(&Command::Retr(from.to_string())) {
            // B waits for connections that will not come: stop it, or the next file waits too.
            let _ = self.b.cmd(&Command::Abor);
            let _ = self.b.final_reply();
            return Err(e);
        }
        Ok(())
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

    /// Copies the directory `from` on A, everything in it, into `to` on B (made if missing).
    /// `update`: files B has as large and not older are left alone; `resume`: files an earlier
    /// copy left part-way go on from there. A file that fails does not stop the others.
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
        let mut dirs: Vec<&str> = entries
            .iter()
            .filter(|e| e.kind.as_deref() == Some("dir"))
            .map(|e| e.name.as_str())
            .collect();
        // Parents before children.
        dirs.sort_by_key(|d| d.matches('/').count());
        for d in std::iter::once("").chain(dirs) {
            let path = join(to, d);
            if path.is_empty() {
                continue;
            }
            let r = self.b.cmd(&Command::Mkd(path.clone()))?;
            if r.code == 257 {
                out.directories_made += 1;
            }
        }
        for e in entries.iter().filter(|e| e.kind.as_deref() == Some("file")) {
            let (source, dest) = (join(from, &e.name), join(to, &e.name));
            if update
                && let Some(&(Some(size), modify)) = have.get(&e.name)
                && Some(size) == e.size
                && modify >= e.modify
            {
                out.skipped.push(e.name.clone());
                continue;
            }
            let found = match e.size {
                Some(size) => Ok(Source {
                    size,
                    modified: e.modify,
                }),
                None => self.source(&source),
            };
            let found = match found {
                Ok(found) => found,
                Err(err) => {
                    out.failed.push((e.name.clone(), err.to_string()));
                    continue;
                }
            };
            match self.copy(&source, &dest, found, resume) {
                Ok(c) => out.files.push(c),
                Err(err @ (ClientError::ControlLost(_) | ClientError::Connect { .. })) => {
                    return Err(err);
                }
                Err(err) => out.failed.push((e.name.clone(), err.to_string())),
            }
        }
        out.seconds = started.elapsed().as_secs_f64();
        Ok(out)
    }

    pub fn quit(self) {
        self.a.quit();
        self.b.quit();
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
