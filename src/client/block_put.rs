//! MODE E uploads: only what the server does not hold yet goes out, in blocks over N data
//! connections. While the data moves, the server's `111 Range Marker` replies are written to
//! the upload record, so a broken upload (Ctrl-C, either side killed) can continue with
//! `--resume`; the end is confirmed with the whole-file checksum.

use super::Options;
use super::control::Control;
use super::detour::DataAddr;
use super::error::{ClientError, Result};
use super::job::local_err;
use super::parallel::{
    block_mode, data_phase_failed, extended, open_and_start, pacer, sending_congestion, tick_every,
    upload_failed,
};
use super::peer::{Peer, STALL, offers_elastic};
use super::plan::{PathHint, Plan};
use super::probe::Prober;
use super::records::UploadRecord;
use super::summary::{Summary, summary};
use super::url::Target;
use super::verify::{agree_with, held_for_sure, whole_file_checksum};
use super::watch::Watch;
use crate::engine;
use crate::engine::background;
use crate::engine::hooks::{Steering, Tell};
use crate::engine::send::{Sent, Source};
use crate::engine::tls::DataConn;
use crate::engine::transfer::{Joins, Transfer};
use braid_proto::Command;
use braid_proto::checksum;
use braid_proto::client::{Direction, Op};
use braid_proto::ranges::RangeSet;
use braid_proto::retr_opts::RetrOpts;
use std::fs::File;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A MODE E upload: the local file, and what the server already holds of it (REST ranges,
/// from the record a broken earlier run left).
pub struct Upload<'a> {
    pub file: &'a File,
    pub len: u64,
    pub record: UploadRecord,
    pub have: RangeSet,
}

/// Uploads in MODE E, sending only what the server does not hold yet.
pub fn put(
    c: &mut Control,
    peer: Peer,
    up: Upload,
    target: &Target,
    opts: &Options,
) -> Result<Summary> {
    let Upload {
        file,
        len,
        record,
        mut have,
    } = up;
    if peer == Peer::GridFtp && !have.is_empty() {
        have = held_for_sure(c, file, &have, &target.path)?;
    }
    let hint = || PathHint::of(c, Direction::Upload, opts.buffer);
    let todo_len = Some(have.missing(len).len());
    let plan = Plan::new(opts, peer, offers_elastic(c), todo_len, hint);
    let elastic = block_mode(c, Direction::Upload, RetrOpts::default(), opts)?;
    announce(c, peer, file, len, &have)?;
    // The record exists from the start: a later --resume then knows this upload was in MODE E.
    if let Err(e) = record.save(&have) {
        eprintln!(
            "braid: cannot keep a record of this upload in {} ({e}); if it breaks, it starts over",
            record.location()
        );
    }
    let stor = Command::Stor(target.path.clone());
    let started = Instant::now();
    let opened = match open(c, &stor, &plan, &have, elastic, opts) {
        Err(ClientError::Remote { reply, .. }) if !have.is_empty() => {
            eprintln!(
                "braid: the server cannot continue the earlier upload ({reply}); sending the whole file"
            );
            let again = Upload {
                file,
                len,
                record,
                have: RangeSet::new(),
            };
            return put(c, peer, again, target, opts);
        }
        // Refused before anything moved: nothing of it is on the server, and no record of it
        // may stay behind.
        Err(e) => {
            record.remove();
            return Err(e);
        }
        Ok(opened) => opened,
    };
    let transfer = super::parallel::transfer(c, Direction::Upload, elastic);
    let congestion = sending_congestion(c, opts, &plan);
    transfer.set_congestion(congestion);
    if opts.background.is_some() {
        transfer.set_dscp(background::LOWER_EFFORT);
    }
    let pacer = pacer(c, opts, congestion, elastic, true)?;
    let mut steering = Steering::new(plan.policy(), pacer, true, Some(have.missing(len).len()));
    steering.prime(&transfer);
    let reused = matches!(opened, Opened::Kept(_));
    let phase = Phase {
        peer,
        file,
        len,
        have: &have,
        record: &record,
        stor: &stor,
        target,
    };
    let (bytes, verified) = phase.run(c, &plan, opened, &transfer, &mut steering, opts)?;
    let s = summary(
        "put",
        target,
        String::new(),
        bytes,
        Some(len),
        have.len(),
        started,
    );
    Ok(extended(s, &plan, &transfer, steering, verified, reused))
}

/// Tells the server what it needs before the data: a braid server the whole-file checksum
/// (announced to come, for a fresh upload that hashes its blocks as they go; the value now
/// for a resumed one, which sends only some blocks), a GridFTP server the size (ALLO) and
/// that it should report what it holds every second.
pub(super) fn announce(
    c: &mut Control,
    peer: Peer,
    file: &File,
    len: u64,
    have: &RangeSet,
) -> Result<()> {
    match peer {
        Peer::Braid => {
            let scks = if have.is_empty() {
                Command::Scks {
                    alg: checksum::NAME.into(),
                    value: None,
                }
            } else {
                whole_file_checksum(file, len)?
            };
            let ok = vec![200];
            c.later(Op::Simple { cmd: scks, ok }, None)?;
        }
        Peer::GridFtp => {
            // Its answer is read before STOR's (with STOR, where the server pipelines).
            let ok = vec![200, 202];
            let cmd = Command::Allo(len.to_string());
            c.later(Op::Simple { cmd, ok }, Some(format!("ALLO {len}")))?;
            c.range_markers_every_second();
        }
    }
    Ok(())
}

/// The data connections an upload starts with.
enum Opened {
    /// Those the last upload of this session left open: no PASV, no connecting.
    Kept(Vec<DataConn>),
    /// Fresh ones to the server's passive address (where later ones go too).
    Fresh(Vec<TcpStream>, DataAddr),
}

/// Sends STOR and opens the data connections (before waiting for 150: the Globus server sends
/// it only once data connections have arrived; a braid server accepts them from its backlog
/// after sending it).
fn open(
    c: &mut Control,
    stor: &Command,
    plan: &Plan,
    have: &RangeSet,
    elastic: bool,
    opts: &Options,
) -> Result<Opened> {
    if c.session().can_reuse(Direction::Upload) {
        c.restart_ranges(have)?;
        c.reset_stored(have.clone());
        let kept = c.take_data_connections();
        c.start_transfer(stor)?;
        return Ok(Opened::Kept(kept));
    }
    let addr = c.passive_addr()?;
    c.restart_ranges(have)?;
    c.reset_stored(have.clone());
    let fresh = open_and_start(c, stor, &addr, plan.start, opts.buffer, elastic)?;
    Ok(Opened::Fresh(fresh, addr))
}

/// One upload's data phase and its end.
struct Phase<'a> {
    peer: Peer,
    file: &'a File,
    len: u64,
    have: &'a RangeSet,
    record: &'a UploadRecord,
    stor: &'a Command,
    target: &'a Target,
}

impl Phase<'_> {
    /// Sends the blocks under the watch, then confirms the end: the bytes sent and what was
    /// checked.
    fn run(
        &self,
        c: &mut Control,
        plan: &Plan,
        opened: Opened,
        transfer: &Transfer,
        steering: &mut Steering,
        opts: &Options,
    ) -> Result<(u64, Option<String>)> {
        let joins = match opened {
            Opened::Fresh(socks, addr) => {
                plan.joins(socks, addr, opts.buffer, steering, transfer.waker())
            }
            Opened::Kept(kept) => Joins::cached(kept, STALL),
        }
        .protected(c.data_tls());
        let progress = AtomicU64::new(0);
        let resumed_from = self.have.len();
        let watch = Watch::start(opts, Some(self.len), resumed_from).every(tick_every(opts));
        let mut recorded = self.have.clone();
        let todo = self.have.missing(self.len);
        let options = engine::send::Options {
            block: plan.block,
            // A fresh upload to a braid server hashes the blocks as they go out and announces
            // the checksum at the end; a resumed one announced it before.
            hash: self.peer == Peer::Braid && self.have.is_empty(),
            // In a batch the connections stay open for the next upload (EOD without CLOSE),
            // which a braid and a GridFTP server both take up (125).
            keep: opts.keep_connections,
        };
        let source = Source::File {
            file: self.file,
            size: self.len,
        };
        let mut prober = opts.background.is_some().then(Prober::default);
        let send = || engine::send::send(transfer, source, &todo, joins, options, &progress);
        let result = watch.run(transfer.abort(), send, || {
            watch
                .bar
                .set_position(resumed_from + progress.load(Ordering::Relaxed));
            if let Some(p) = &mut prober {
                p.show(c, steering);
                if let Err(e) = p.send(c, Tell::default()) {
                    tracing::warn!("could not probe the path: {e}");
                }
            }
            steering.tick(transfer);
            if c.poll().is_ok() {
                self.keep_record(c, &mut recorded);
                transfer.confirm(c.stored());
                if c.refused_meanwhile() {
                    transfer.abort().abort();
                }
            }
        });
        let progress = progress.load(Ordering::Relaxed);
        if watch.stopped() {
            return Err(self.stop(c, &watch, progress));
        }
        let mut sent = result.map_err(|e| {
            let what = "cannot read the file being uploaded";
            let e = data_phase_failed(c, self.stor, e, what, progress, None);
            self.keep_record(c, &mut recorded);
            match e {
                ClientError::Interrupted { bytes, why, .. } => ClientError::Interrupted {
                    bytes,
                    why: format!("{why}; {}", self.keeps()),
                    partial: None,
                },
                e => e,
            }
        })?;
        let kept = std::mem::take(&mut sent.kept);
        let (verified, cksm_ahead) = self.conclude(c, &watch, &sent, progress)?;
        self.record.remove();
        // The server keeps them too once the upload is complete (GridFTP data-channel caching).
        c.keep_data_connections(Direction::Upload, kept);
        // Done: from here (reading the file back to check it) Ctrl-C exits at once.
        drop(watch);
        let verified = self.check(c, verified, cksm_ahead)?;
        Ok((sent.per_conn.iter().sum(), verified))
    }

    /// Writes what the server reported holding to the upload record, when it changed.
    fn keep_record(&self, c: &Control, recorded: &mut RangeSet) {
        if *c.stored() != *recorded {
            *recorded = c.stored().clone();
            let _ = self.record.save(recorded);
        }
    }

    fn keeps(&self) -> &'static str {
        match self.peer {
            Peer::Braid => {
                "the server keeps what arrived (not under the final name): run again with --resume to send the rest"
            }
            Peer::GridFtp => {
                "the server keeps what arrived: run again with --resume to send the rest"
            }
        }
    }

    /// The error of an upload Ctrl-C stopped, with what the server holds recorded.
    fn stop(&self, c: &mut Control, watch: &Watch, progress: u64) -> ClientError {
        let advice = format!("; {}", self.keeps());
        let e = watch.stop(c, progress, &advice, None);
        let _ = self.record.save(c.stored());
        e
    }

    /// The end of the data phase on the control connection: the checksum the blocks hashed
    /// to (a braid server checks it), then the final reply. What was checked, and whether the
    /// GridFTP server's CKSM was asked ahead (its answer follows).
    fn conclude(
        &self,
        c: &mut Control,
        watch: &Watch,
        sent: &Sent,
        progress: u64,
    ) -> Result<(Option<String>, bool)> {
        let mut verified = None;
        if let Some(sum) = sent.sum {
            let hex = checksum::hex(sum.finish(self.len));
            let scks = Command::Scks {
                alg: checksum::NAME.into(),
                value: Some(hex.clone()),
            };
            c.send(&scks)?;
            let Some(r) = c.final_reply_unless(|| watch.stopped())? else {
                return Err(self.stop(c, watch, progress));
            };
            if r.code != 200 {
                return Err(upload_failed(r, self.record, c));
            }
            verified = Some(format!("{} {hex}", checksum::NAME));
        }
        // A GridFTP server that reads pipelined commands answers CKSM right after its 226:
        // asked now, its answer costs no round trip of its own (a file of a tree costs two,
        // not three).
        let cksm_ahead = self.peer == Peer::GridFtp && c.session().pipelining();
        if cksm_ahead {
            c.send(&Command::Cksm {
                alg: self.peer.checksum(c).into(),
                offset: 0,
                length: None,
                path: self.target.path.clone(),
            })?;
        }
        let Some(r) = c.final_reply_unless(|| watch.stopped())? else {
            return Err(self.stop(c, watch, progress));
        };
        if r.code != 226 && r.code != 250 {
            if cksm_ahead {
                // Its answer is read too, so the session's next command meets its own reply.
                c.final_reply_unless(|| false)?;
            }
            return Err(upload_failed(r, self.record, c));
        }
        Ok((verified, cksm_ahead))
    }

    /// [`check_upload`] of this upload.
    fn check(
        &self,
        c: &mut Control,
        verified: Option<String>,
        cksm_ahead: bool,
    ) -> Result<Option<String>> {
        let (file, len, path) = (self.file, self.len, &self.target.path);
        check_upload(c, self.peer, file, len, path, verified, cksm_ahead)
    }
}

/// The whole-file check of a complete upload of `len` bytes of `file` to `path`: a braid
/// server checked the announced checksum before its 226 (`verified` names it; without one,
/// this file's XXH3 is named); a GridFTP server's CKSM (already asked for, when `cksm_ahead`)
/// is compared with this file's.
pub(super) fn check_upload(
    c: &mut Control,
    peer: Peer,
    file: &File,
    len: u64,
    path: &str,
    verified: Option<String>,
    cksm_ahead: bool,
) -> Result<Option<String>> {
    match peer {
        Peer::Braid if verified.is_none() => {
            let sum = crate::sums::xxh3(file, len).map_err(local_err("cannot read the file"))?;
            Ok(Some(format!("{} {}", checksum::NAME, checksum::hex(sum))))
        }
        Peer::Braid => Ok(verified),
        Peer::GridFtp => {
            let alg = peer.checksum(c);
            let theirs = if cksm_ahead {
                c.final_reply_unless(|| false)?
                    .and_then(|r| braid_proto::client::checksum_in(&r))
            } else {
                c.checksum(alg, path)?
            };
            let local =
                crate::sums::named(alg, file, 0, len).map_err(local_err("cannot read the file"))?;
            let ours = "the file sent hashes to";
            agree_with(theirs, alg, path, &local, ours, "")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::testing::{done, scripted};

    #[test]
    fn a_braid_server_is_told_the_checksum_comes_or_given_it_for_a_resumed_upload() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let file = File::open(&path).unwrap();
        let (mut c, server) = scripted(b"200 later\r\n200 noted\r\n");
        announce(&mut c, Peer::Braid, &file, 10, &RangeSet::new()).unwrap();
        let held: RangeSet = [(0u64, 5u64)].into_iter().collect();
        announce(&mut c, Peer::Braid, &file, 10, &held).unwrap();
        let whole = checksum::hex(checksum::of(b"0123456789"));
        assert_eq!(
            done(c, server),
            format!("SCKS XXH3 *\r\nSCKS XXH3 {whole}\r\n")
        );
    }

    #[test]
    fn a_refused_announcement_fails_the_upload_before_any_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap();
        let (mut c, server) = scripted(b"504 No such checksum\r\n");
        let e = announce(&mut c, Peer::Braid, &file, 1, &RangeSet::new()).unwrap_err();
        assert!(matches!(e, ClientError::Remote { .. }), "{e}");
        done(c, server);
    }
}
