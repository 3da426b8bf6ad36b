//! MODE E downloads: blocks over N data connections land at their offsets, the whole-file
//! checksum is confirmed on the control connection, and a record beside the partial lets
//! `--resume` fetch only what is missing.

use super::Options;
use super::control::Control;
use super::error::{ClientError, Result};
use super::job::{Dest, PartFile, cannot_write};
use super::parallel::{
    block_mode, data_phase_failed, extended, open_and_start, pacer, sending_congestion, tick_every,
};
use super::peer::{Peer, STALL, offers_elastic};
use super::plan::{PathHint, Plan};
use super::probe::Prober;
use super::records::Sidecar;
use super::summary::{Summary, summary};
use super::url::Target;
use super::verify::verify;
use super::watch::Watch;
use crate::engine;
use crate::engine::background;
use crate::engine::hooks::Steering;
use crate::engine::receive::{Progress, Shared};
use crate::engine::sink::{Reorder, Sink};
use crate::engine::stats::View;
use crate::engine::transfer::{Accept, Joins, Transfer};
use braid_proto::Command;
use braid_proto::client::Direction;
use braid_proto::ranges::RangeSet;
use braid_proto::retr_opts::RetrOpts;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Downloads in MODE E. `size` is what SIZE said.
pub fn get(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    dest: &Dest,
    size: Option<u64>,
    opts: &Options,
) -> Result<Summary> {
    let hint = || PathHint::of(c, Direction::Download, opts.buffer);
    let plan = Plan::new(opts, peer, offers_elastic(c), size, hint);
    // Only braid servers pace (GridFTP servers ignore options they do not know, but there is
    // no need to find out). The pacer's rate goes with OPTS RETR now and again whenever the
    // pacer changes it.
    let congestion = sending_congestion(c, opts, &plan);
    let mut pacer = pacer(c, opts, congestion, plan.elastic, plan.elastic)?;
    let retr = RetrOpts {
        parallelism: Some((plan.start, plan.start.min(1), plan.max)),
        block_size: (opts.block_size.is_some() || peer == Peer::Braid).then_some(plan.block),
        congestion: congestion.filter(|_| peer == Peer::Braid),
        max_rate: pacer.rate(&View::at_start(None)),
        dscp: opts.background.map(|_| background::LOWER_EFFORT),
        ..RetrOpts::default()
    };
    let elastic = block_mode(c, Direction::Download, retr, opts)?;
    let landing = Landing::open(dest, &target.path, size, &plan, elastic, opts)?;
    let started = Instant::now();
    let transfer = super::parallel::transfer(c, Direction::Download, elastic);
    if opts.background.is_some() {
        // Only acknowledgements go this way, but they too should not compete.
        transfer.set_dscp(background::LOWER_EFFORT);
    }
    let todo = size.map(|s| s - landing.have.overlap(0, s));
    // A download is paced by the server, told the pacer's rate (above, and in the tick).
    let mut steering = Steering::new(plan.policy(), pacer, false, todo);
    steering.prime(&transfer);
    let complete_already =
        size.is_some_and(|s| landing.have.covers(0, s)) && landing.resumed_from > 0;
    let reused = !complete_already
        && receive(
            c,
            peer,
            target,
            &plan,
            &landing,
            &transfer,
            &mut steering,
            opts,
        )?;
    let (got, total) = landing.whole(size)?;
    let file = landing.part.as_ref().map(|p| &p.file);
    let verified = verify(c, peer, target, total, &got, file)?;
    let local = match landing.part {
        Some(p) => p.commit(Some(total))?,
        None => "-".into(),
    };
    if let Some(r) = &landing.record {
        r.remove();
    }
    let per_conn = transfer.per_link_bytes();
    let bytes = per_conn.iter().sum();
    let resumed_from = landing.resumed_from;
    let s = summary(
        "get",
        target,
        local,
        bytes,
        Some(total),
        resumed_from,
        started,
    );
    if opts.congestion.is_some() && peer == Peer::GridFtp {
        eprintln!("braid: --congestion: a GridFTP server sends with its own congestion control");
    }
    Ok(extended(s, &plan, &transfer, steering, verified, reused))
}

/// Where a MODE E download lands: the sink its blocks go to, the partial file and its record,
/// and what it held before this run.
pub(super) struct Landing {
    pub(super) sink: Sink,
    pub(super) part: Option<PartFile>,
    /// None for standard output and /dev/null.
    pub(super) record: Option<Sidecar>,
    /// A file of one block is in before a watcher thread (Ctrl-C, progress, tuning) would
    /// have looked once: a tree of small files would start one per file for nothing. Nor is
    /// it recorded: it has nothing to resume from mid-way.
    watched: bool,
    /// What SIZE said.
    size: Option<u64>,
    pub(super) shared: Shared,
    pub(super) bytes: Arc<AtomicU64>,
    have: RangeSet,
    pub(super) resumed_from: u64,
}

impl Landing {
    pub(super) fn open(
        dest: &Dest,
        remote: &str,
        size: Option<u64>,
        plan: &Plan,
        elastic: bool,
        opts: &Options,
    ) -> Result<Landing> {
        let watched = size.is_none_or(|s| s > plan.block);
        let (sink, part, record, start) = match dest {
            Dest::Null => (
                Sink::Discard,
                None,
                None,
                Progress::holding(RangeSet::new()),
            ),
            Dest::Stdout => {
                // Room for a couple of blocks per connection, within bounds.
                let cap = (plan.block as usize * plan.max as usize * 2).clamp(8 << 20, 256 << 20);
                let out = Box::new(std::io::stdout());
                let sink = Sink::Ordered(Reorder::new(out, cap, STALL, elastic));
                (sink, None, None, Progress::holding(RangeSet::new()))
            }
            Dest::File(path) => {
                let (part, record, start) = open_partial(path, remote, size, watched, opts)?;
                let writer = part
                    .file
                    .try_clone()
                    .map_err(super::job::local_err("cannot duplicate file handle"))?;
                (Sink::File(writer), Some(part), record, start)
            }
        };
        let have = start.ranges.clone();
        let bytes = Arc::new(AtomicU64::new(0));
        Ok(Landing {
            sink,
            part,
            record,
            watched,
            size,
            shared: Shared::new(start, bytes.clone()),
            bytes,
            resumed_from: have.len(),
            have,
        })
    }

    /// The record a resume continues from: a watched file's (see `watched`).
    fn kept_record(&self) -> Option<&Sidecar> {
        self.record.as_ref().filter(|_| self.watched)
    }

    pub(super) fn save(&self) {
        if let Some(r) = self.kept_record() {
            r.save(&self.shared.snapshot());
        }
    }

    /// Records what arrived as the download stops unfinished.
    pub(super) fn save_last(&self) {
        if let Some(r) = self.kept_record() {
            r.save_last(&self.shared.snapshot());
        }
    }

    /// What arrived, and the file's size, once the server ended the transfer: an error if
    /// bytes are missing (kept for --resume).
    pub(super) fn whole(&self, size: Option<u64>) -> Result<(Progress, u64)> {
        let got = self.shared.snapshot();
        let total = size.unwrap_or_else(|| got.ranges.iter().last().map_or(0, |(_, e)| e));
        let missing = got.ranges.missing(total);
        if !missing.is_empty() {
            self.save_last();
            return Err(ClientError::Integrity(format!(
                "the server ended the transfer but bytes {missing} of {total} never arrived; run again with --resume"
            )));
        }
        Ok((got, total))
    }

    pub(super) fn partial_name(&self) -> Option<String> {
        self.part.as_ref().map(PartFile::name)
    }
}

/// `DEST.part` and its record: with `--resume` what the record says it holds (blocks land at
/// their offsets, so a partial may have holes: only its record says what it holds), else
/// emptied.
fn open_partial(
    path: &std::path::Path,
    remote: &str,
    size: Option<u64>,
    recorded: bool,
    opts: &Options,
) -> Result<(PartFile, Option<Sidecar>, Progress)> {
    let part = super::job::part_path(path);
    let sidecar = Sidecar::beside(&part, remote, size);
    let found = if opts.resume { sidecar.load() } else { None };
    if opts.resume && found.is_none() && part.exists() && recorded {
        eprintln!(
            "braid: {} has no matching record of what it holds ({}); downloading again",
            part.display(),
            sidecar.location()
        );
    }
    let part = PartFile::open(path, found.is_some())?;
    let start = found.unwrap_or_else(|| {
        sidecar.remove();
        Progress::holding(RangeSet::new())
    });
    Ok((part, Some(sidecar), start))
}

/// The data phase: the data connections (reused, opened to a braid server, or accepted from
/// a GridFTP server), the blocks received under the watch, then the final reply. Whether the
/// connections were those the last download left open.
#[allow(clippy::too_many_arguments)]
fn receive(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    plan: &Plan,
    landing: &Landing,
    transfer: &Transfer,
    steering: &mut Steering,
    opts: &Options,
) -> Result<bool> {
    // Written now, so the space for the next version is reserved before data arrives.
    landing.save();
    let retr = Command::Retr(target.path.clone());
    let (conns, reused) = connect(
        c,
        peer,
        &retr,
        plan,
        &landing.have,
        transfer,
        steering,
        opts,
    )?;
    let alg = peer.checksum(c);
    c.checksum_after_transfer(alg, &target.path)?;
    let size = landing.size;
    let watch = Watch::start(opts, size, landing.resumed_from).every(tick_every(opts));
    let receive =
        || engine::receive::receive(transfer, conns, &landing.sink, size, &landing.shared);
    // Under GSI the ticker also watches for RETR refused (its answer comes late).
    let result = if landing.watched || c.authenticates_data() {
        let mut tick = ticker(c, transfer, steering, landing, &watch, opts);
        watch.run(transfer.abort(), receive, &mut tick)
    } else {
        let r = receive();
        watch.bar.finish_and_clear();
        r
    };
    if result.is_err() && c.authenticates_data() && c.refused_meanwhile() {
        // The server refused RETR, whose answer is read only now (see `connect`).
        c.transfer_started(&retr)?;
    }
    let received = landing.bytes.load(Ordering::Relaxed);
    let partial = landing.partial_name();
    if watch.stopped() {
        landing.save_last();
        return Err(watch.stop(c, received, "", partial));
    }
    if let Err(e) = result.map(|kept| c.keep_data_connections(Direction::Download, kept.socks)) {
        landing.save_last();
        let what = cannot_write(partial.as_deref());
        return Err(data_phase_failed(c, &retr, e, &what, received, partial));
    }
    let finished = c.finish_transfer(&retr);
    // The server's last report came before its final reply.
    if let Some(report) = c.session().take_sender_report() {
        steering.sender_reported(report);
    }
    if let Err(e) = finished {
        landing.save_last();
        return Err(ClientError::Interrupted {
            bytes: received,
            why: e.to_string(),
            partial,
        });
    }
    // Everything arrived: the record says so, and the room kept for its next version goes
    // (a Ctrl-C while the file is checked ends the process at once, and left it behind).
    landing.save_last();
    Ok(reused)
}

/// What the watcher does every tick while blocks arrive: the progress bar; a braid server's
/// report (113: loss and RTT for the tuning); background mode's probes; the steering's
/// decisions told to the server; the record saved once a second.
fn ticker<'a>(
    c: &'a mut Control,
    transfer: &'a Transfer,
    steering: &'a mut Steering,
    landing: &'a Landing,
    watch: &'a Watch,
    opts: &Options,
) -> impl FnMut() + Send + 'a {
    let mut prober = opts.background.is_some().then(Prober::default);
    let mut last_save = Instant::now();
    let elastic = transfer.elastic();
    // Under GSI the answer to RETR is read with the transfer's end (see `connect`): a
    // refusal, seen here, ends the wait for connections that will not come.
    let answer_pending = c.authenticates_data();
    move || {
        let at = landing.resumed_from + landing.bytes.load(Ordering::Relaxed);
        watch.bar.set_position(at);
        let polled = (elastic || answer_pending) && c.poll().is_ok();
        if polled && answer_pending && c.refused_meanwhile() {
            transfer.abort().abort();
        }
        if polled && let Some(report) = c.session().take_sender_report() {
            steering.sender_reported(report);
        }
        if let Some(p) = &mut prober {
            p.show(c, steering);
        }
        let tell = steering.tick(transfer);
        let told = match &mut prober {
            Some(p) => p.send(c, tell),
            None => c.tell(tell),
        };
        if let Err(e) = told {
            tracing::warn!("could not tell the server of a change: {e}");
        }
        if last_save.elapsed() > Duration::from_secs(1) {
            landing.save();
            last_save = Instant::now();
        }
    }
}

/// The data connections of a download, and whether they are those the last one left open
/// (no PASV, no connecting). A GridFTP server keeps those it opened to us while neither PORT
/// nor the parallelism changed (OPTS RETR, sent only when it did, and then the count
/// differs).
#[allow(clippy::too_many_arguments)]
fn connect(
    c: &mut Control,
    peer: Peer,
    retr: &Command,
    plan: &Plan,
    have: &RangeSet,
    transfer: &Transfer,
    steering: &mut Steering,
    opts: &Options,
) -> Result<(Joins, bool)> {
    let n = plan.start;
    if c.session().can_reuse(Direction::Download)
        && (peer == Peer::Braid || c.kept_connections() == n)
    {
        c.restart_ranges(have)?;
        let socks = c.take_data_connections();
        if !c.start_transfer(retr)? && peer == Peer::GridFtp {
            return Err(ClientError::Integrity(format!(
                "the server answered {} with 150, not 125: it did not keep the data \
                 connections it left open, and braid no longer listens for new ones; run again",
                retr.verb()
            )));
        }
        return Ok((Joins::cached(socks, STALL).protected(c.data_tls()), true));
    }
    let joins = match peer {
        Peer::Braid => {
            let addr = c.passive_addr()?;
            c.restart_ranges(have)?;
            let elastic = transfer.elastic();
            let socks = open_and_start(c, retr, &addr, n, opts.buffer, elastic)?;
            plan.joins(socks, addr, opts.buffer, steering, transfer.waker())
                .protected(c.data_tls())
        }
        Peer::GridFtp => {
            let listener = c.active_listener()?;
            c.restart_ranges(have)?;
            c.start_incoming(retr)?;
            gridftp_joins(c, listener, 4 * n as usize + 4, opts.buffer)
        }
    };
    Ok((joins, false))
}

/// The data connections a GridFTP server opens to `listener`, at most `max`: from the control
/// connection's peer; from any host for a striped Globus front end, which has a data node of
/// its choosing connect from that node's address, named nowhere beforehand (the whole file
/// is checked with the server's CKSM at the end).
pub(super) fn gridftp_joins(
    c: &Control,
    listener: std::net::TcpListener,
    max: usize,
    buffer: Option<u64>,
) -> Joins {
    let admits = crate::engine::transfer::Admits {
        anyone: c.gridftp_striped(),
        ..crate::engine::transfer::Admits::client(c.peer().ip())
    };
    let accept = Accept {
        listener,
        peer: admits,
        max,
        buffer,
        timeout: Some(STALL),
    };
    Joins::accept(accept, STALL).protected(c.gsi_accepting())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(block: u64) -> Plan {
        let opts = Options {
            streams: Some(4),
            block_size: Some(block),
            ..Options::default()
        };
        Plan::new(&opts, Peer::Braid, true, None, || panic!("no path needed"))
    }

    #[test]
    fn a_resumed_download_starts_from_what_its_record_says_and_a_new_one_from_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        let part = super::super::job::part_path(&dest);
        std::fs::write(&part, vec![1u8; 4 << 20]).unwrap();
        let record = Sidecar::beside(&part, "pub/f", Some(8 << 20));
        let holds: RangeSet = [(0u64, 1u64 << 20), (3 << 20, 4 << 20)]
            .into_iter()
            .collect();
        record.save(&Progress::holding(holds.clone()));
        let resume = Options {
            resume: true,
            ..Options::default()
        };
        let l = Landing::open(
            &Dest::File(dest.clone()),
            "pub/f",
            Some(8 << 20),
            &plan(1 << 20),
            true,
            &resume,
        )
        .unwrap();
        assert_eq!(l.have, holds);
        assert_eq!(l.resumed_from, 2 << 20);
        assert!(l.watched, "8 blocks: watched and recorded");
        drop(l);
        // Another remote file's record does not count: the partial starts over.
        let l = Landing::open(
            &Dest::File(dest.clone()),
            "pub/other",
            Some(8 << 20),
            &plan(1 << 20),
            true,
            &resume,
        )
        .unwrap();
        assert!(l.have.is_empty());
        assert_eq!(std::fs::metadata(&part).unwrap().len(), 0, "emptied");
        assert!(!record.exists(), "its stale record is gone");
    }

    #[test]
    fn a_one_block_file_is_neither_watched_nor_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("small");
        let l = Landing::open(
            &Dest::File(dest.clone()),
            "small",
            Some(1000),
            &plan(1 << 20),
            true,
            &Options::default(),
        )
        .unwrap();
        assert!(!l.watched);
        l.save();
        l.save_last();
        let sidecar = super::super::records::sidecar_path(&super::super::job::part_path(&dest));
        assert!(!sidecar.exists(), "a record for a one-block file");
        // Standard output: an ordered sink, no partial.
        let l = Landing::open(
            &Dest::Stdout,
            "f",
            None,
            &plan(1 << 20),
            true,
            &Options::default(),
        )
        .unwrap();
        assert!(l.part.is_none() && l.record.is_none() && matches!(l.sink, Sink::Ordered(_)));
    }
}
