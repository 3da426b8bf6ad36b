//! Striped transfers (a braid front end with data nodes, FEAT `BRAID-STRIPED`): SPAS lists
//! one address per node, the client opens a few data connections to each, and each node moves
//! its stripes. A download counts each node's EOF on its own; an upload runs one sender per
//! node, all taking blocks from one file, so a faster node takes more. A node that fails
//! leaves its stripes to the others: the transfer goes again for what is missing (a
//! download: the blocks not here; an upload: the stripes the front end reports failed),
//! through the nodes still up, and ends with the whole file's checksum as ever.
//!
//! A striped Globus front end (FEAT `DSI remote-…`) takes uploads the same way; it sends a
//! download only to SPOR, so there this side listens, once per stripe, and its nodes connect.

use super::Options;
use super::block_get::{Landing, gridftp_joins};
use super::block_put::{Upload, announce, check_upload};
use super::control::Control;
use super::detour::DataAddr;
use super::error::{ClientError, Result};
use super::job::Dest;
use super::parallel::{block_mode, data_phase_failed, open_data, upload_failed};
use super::peer::{Peer, STALL, offers_elastic};
use super::plan::{PathHint, Plan};
use super::summary::{Summary, summary};
use super::url::Target;
use super::verify::verify;
use super::watch::Watch;
use crate::engine;
use crate::engine::send::{Blocks, Sent, Source};
use crate::engine::transfer::{Joins, Transfer};
use braid_proto::Command;
use braid_proto::checksum;
use braid_proto::client::Direction;
use braid_proto::retr_opts::RetrOpts;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Data connections per node unless `-n` says how many in all: a node's own link is the
/// limit, and one connection with the kernel's buffers fills most.
const PER_NODE: u32 = 2;

/// Most rounds a transfer takes: the first, then one per node lost (each round goes through
/// the nodes still up).
const MOST_ROUNDS: usize = 8;

/// Whether transfers on `c` go striped, and with what kind of server: a braid front end with
/// data nodes, in clear (the nodes do not take TLS data connections yet); or a Globus front
/// end with remote data nodes.
pub fn offered(c: &Control) -> Option<Peer> {
    match Peer::of(c)? {
        // Under PROT P only where the nodes take TLS bound to this session (`P`).
        Peer::Braid
            if c.has_feature("BRAID-STRIPED")
                && (c.data_tls().is_none() || c.striped_private()) =>
        {
            Some(Peer::Braid)
        }
        Peer::GridFtp if c.gridftp_striped() => Some(Peer::GridFtp),
        _ => None,
    }
}

/// Starts `cmd` on the connections of `stripes`, opened here (under GSI each runs its
/// handshake while the answer is read, as a Globus node answers only once it is done).
fn start_on(c: &mut Control, cmd: &Command, stripes: &[Joins]) -> Result<()> {
    let socks: Vec<&TcpStream> = stripes
        .iter()
        .flat_map(|j| j.open.iter().map(|conn| conn.tcp()))
        .collect();
    c.send_transfer(cmd)?;
    c.started_authenticating(cmd, &socks).map(drop)
}

/// The data connections of one round: `per` to each node, opened at once; under PROT P each
/// is TLS to the node (which shows the front end's certificate), bound to this session.
fn connect(c: &Control, addrs: &[DataAddr], per: u32, opts: &Options) -> Result<Vec<Joins>> {
    let opened: Vec<Result<Vec<TcpStream>>> = crate::fanout::at_once(
        addrs,
        |addr| (0..per).map(|_| open_data(addr, opts.buffer)).collect(),
        || Err(ClientError::Protocol("a connecting thread failed".into())),
    );
    opened
        .into_iter()
        .map(|socks| socks.map(|s| Joins::fixed(s, STALL).protected(c.data_tls())))
        .collect()
}

fn per_node(opts: &Options, nodes: usize) -> u32 {
    opts.streams
        .map(|n| n.div_ceil(nodes as u32).max(1))
        .unwrap_or(PER_NODE)
}

/// Stripes of a download from a Globus front end unless `-n` says how many: one data
/// connection each. Its front end deals stripes out to its nodes in turn, and does not say
/// how many nodes it has (SPAS would, but a download after it in the same session goes
/// through fewer of them): more stripes than nodes keep each node busy.
const GRIDFTP_STRIPES: u32 = 4;

/// The data connections of one round of a download from a Globus front end: it has its
/// nodes connect (GridFTP sends only to SPOR), `stripes` listeners here, one connection
/// each, from whichever node.
fn listen(c: &mut Control, stripes: usize, opts: &Options) -> Result<Vec<Joins>> {
    let listeners = c.striped_active(stripes)?;
    Ok(listeners
        .into_iter()
        .map(|listener| gridftp_joins(c, listener, 4 * (stripes + 1), opts.buffer))
        .collect())
}

/// Downloads `target` (`size` bytes) from a striped server: a braid front end, whose nodes
/// this side connects to (SPAS), or a Globus one, whose nodes connect here (SPOR).
pub fn get(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    dest: &Dest,
    size: u64,
    opts: &Options,
) -> Result<Summary> {
    let hint = || PathHint::of(c, Direction::Download, opts.buffer);
    let plan = Plan::new(opts, peer, offers_elastic(c), Some(size), hint);
    let spor_stripes = opts.streams.unwrap_or(GRIDFTP_STRIPES).clamp(1, 64) as usize;
    let retr = RetrOpts {
        max_rate: opts.rate_limit,
        // Each Globus stripe on one connection.
        parallelism: (peer == Peer::GridFtp).then_some((1, 1, 1)),
        ..RetrOpts::default()
    };
    let elastic = block_mode(c, Direction::Download, retr, opts)?;
    let landing = Landing::open(dest, &target.path, Some(size), &plan, elastic, opts)?;
    let started = Instant::now();
    let retr = Command::Retr(target.path.clone());
    // One per round: a round that failed may have aborted its own.
    let mut transfers: Vec<Transfer> = Vec::new();
    let mut nodes = 0;
    for round in 1.. {
        let have = landing.shared.snapshot().ranges;
        // All here (a resumed download that had it all, or an empty file): only the check.
        if have.covers(0, size) {
            break;
        }
        let stripes = match peer {
            Peer::Braid => {
                let addrs = c.striped_passive()?;
                nodes = nodes.max(addrs.len());
                connect(c, &addrs, per_node(opts, addrs.len()), opts)?
            }
            // Globus sends nothing of some stripes when REST names ranges already here (two
            // stripes after `REST 0-1048576`: one sent its share, the other nothing, and
            // both ended with EOF): what is missing comes on one.
            Peer::GridFtp if !have.is_empty() => listen(c, 1, opts)?,
            Peer::GridFtp => listen(c, spor_stripes, opts)?,
        };
        c.restart_ranges(&have)?;
        let answer_pending = c.start_incoming(&retr)?;
        transfers.push(Transfer::new(elastic));
        let transfer = &transfers[transfers.len() - 1];
        let watch = Watch::start(opts, Some(size), have.len());
        let (bytes, landing_ref) = (&landing.bytes, &landing);
        let at = have.len();
        let mut saved = Instant::now();
        let control = &mut *c;
        let received = watch.run(
            transfer.abort(),
            || {
                engine::receive::receive_stripes(
                    transfer,
                    stripes,
                    &landing.sink,
                    Some(size),
                    &landing.shared,
                )
            },
            || {
                watch.bar.set_position(at + bytes.load(Ordering::Relaxed));
                // What arrived, for --resume after a crash.
                if saved.elapsed() > std::time::Duration::from_secs(1) {
                    landing_ref.save();
                    saved = Instant::now();
                }
                // RETR refused while its answer is pending: no connection will come.
                if answer_pending && control.poll().is_ok() && control.refused_meanwhile() {
                    transfer.abort().abort();
                }
            },
        );
        if answer_pending && !watch.stopped() {
            // RETR's 150 (or its refusal, which is the error). Stopped (Ctrl-C), the stop
            // below ends the transfer without waiting for it.
            c.read_deferred()?;
        }
        landing.save();
        if watch.stopped() {
            landing.save_last();
            let got = landing.bytes.load(Ordering::Relaxed);
            return Err(watch.stop(c, got, "", landing.partial_name()));
        }
        // This side failed (the disk): no node is to blame, and going again would not help.
        if let Err(e @ engine::EngineError::Local(_)) = received {
            landing.save_last();
            let what = super::job::cannot_write(landing.partial_name().as_deref());
            let got = landing.bytes.load(Ordering::Relaxed);
            return Err(data_phase_failed(
                c,
                &retr,
                e,
                &what,
                got,
                landing.partial_name(),
            ));
        }
        let finished = c.final_reply_unless(|| false)?;
        let ok = matches!(&finished, Some(r) if r.code == 226 || r.code == 250);
        if received.is_ok() && ok {
            break;
        }
        let why = match (&received, &finished) {
            (_, Some(r)) if !ok => format!("{} {}", r.code, r.text()),
            (Err(e), _) => e.to_string(),
            _ => "the transfer ended early".into(),
        };
        let now = landing.shared.snapshot().ranges;
        if round >= MOST_ROUNDS || now.len() <= have.len() {
            landing.save_last();
            return Err(ClientError::Interrupted {
                bytes: landing.bytes.load(Ordering::Relaxed),
                why: format!("striped download failed: {why}"),
                partial: landing.partial_name(),
            });
        }
        eprintln!(
            "braid: {why}; fetching the {} bytes still missing through the data nodes still up",
            now.missing(size).len()
        );
    }
    let (got, _) = landing.whole(Some(size))?;
    let file = landing.part.as_ref().map(|p| &p.file);
    let verified = verify(c, peer, target, size, &got, file)?;
    let resumed_from = landing.resumed_from;
    let local = match landing.part {
        Some(p) => p.commit(Some(size))?,
        None => "-".into(),
    };
    if let Some(r) = &landing.record {
        r.remove();
    }
    let s = summary(
        "get",
        target,
        local,
        size - resumed_from,
        Some(size),
        resumed_from,
        started,
    );
    if peer == Peer::GridFtp {
        // The nodes that sent: each connects from its own address.
        let mut from: Vec<_> = transfers
            .iter()
            .flat_map(|t| t.links().into_iter().filter_map(|l| l.peer))
            .collect();
        from.sort();
        from.dedup();
        nodes = from.len();
    }
    Ok(striped(s, &transfers, verified, nodes))
}

/// Uploads `up` to a striped server: a braid front end, or a Globus one (`peer`), which
/// checks no announced checksum and names no failed stripe: its upload is checked with CKSM
/// after, and one that fails is not sent again.
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
    let hint = || PathHint::of(c, Direction::Upload, opts.buffer);
    let todo = Some(have.missing(len).len());
    let plan = Plan::new(opts, peer, offers_elastic(c), todo, hint);
    let elastic = block_mode(c, Direction::Upload, RetrOpts::default(), opts)?;
    let started = Instant::now();
    let resumed_from = have.len();
    let stor = Command::Stor(target.path.clone());
    // One per node and round: a node's failure stops its own stripe, not the others'.
    let mut transfers: Vec<Transfer> = Vec::new();
    let progress = AtomicU64::new(0);
    let mut nodes = 0;
    let mut verified = None;
    for round in 1.. {
        // A fresh upload hashes its blocks as they go and says the checksum after; a round
        // that sends only some, before (the whole file read).
        let fresh = have.is_empty() && peer == Peer::Braid;
        announce(c, peer, file, len, &have)?;
        if let Err(e) = record.save(&have) {
            tracing::warn!("cannot keep a record of this upload: {e}");
        }
        let addrs = c.striped_passive()?;
        nodes = nodes.max(addrs.len());
        let stripes = connect(c, &addrs, per_node(opts, addrs.len()), opts)?;
        c.restart_ranges(&have)?;
        c.reset_stored(have.clone());
        start_on(c, &stor, &stripes)?;
        let blocks = Blocks::new(&have.missing(len), checksum::CHUNK);
        let options = engine::send::Options {
            block: plan.block,
            hash: fresh,
            keep: false,
        };
        let watch = Watch::start(opts, Some(len), have.len());
        let at = have.len();
        let first = transfers.len();
        for _ in &stripes {
            let t = Transfer::new(elastic);
            // --rate-limit: the whole upload's, shared by the nodes.
            t.set_pacing(opts.rate_limit.map(|r| (r / stripes.len() as u64).max(1)));
            transfers.push(t);
        }
        let round_transfers = &transfers[first..];
        // What the front end's markers say its nodes stored is recorded as it comes: a client
        // killed outright resumes from there.
        let mut recorded = have.clone();
        let control = &mut *c;
        let sent: Vec<std::result::Result<Sent, engine::EngineError>> = watch.run(
            round_transfers[0].abort(),
            || {
                crate::fanout::at_once(
                    stripes.into_iter().zip(round_transfers),
                    |(joins, transfer)| {
                        let source = Source::File { file, size: len };
                        engine::send::send_from(
                            transfer, source, &blocks, joins, options, &progress,
                        )
                    },
                    || Err(engine::EngineError::Setup("a sending thread failed".into())),
                )
            },
            || {
                watch
                    .bar
                    .set_position(at + progress.load(Ordering::Relaxed));
                // Ctrl-C stopped the first stripe: the others too.
                if round_transfers[0].abort().is_aborted() {
                    for t in round_transfers {
                        t.abort().abort();
                    }
                }
                if control.poll().is_ok() && *control.stored() != recorded {
                    recorded = control.stored().clone();
                    let _ = record.save(&recorded);
                }
            },
        );
        if watch.stopped() {
            let _ = record.save(c.stored());
            return Err(watch.stop(c, progress.load(Ordering::Relaxed), "", None));
        }
        let all_sent = sent.iter().all(|s| s.is_ok());
        if all_sent && fresh {
            let mut sum = braid_proto::checksum::ChunkSum::new();
            for s in sent.iter().flatten() {
                if let Some(part) = s.sum {
                    sum.merge(part);
                }
            }
            let hex = checksum::hex(sum.finish(len));
            c.send(&Command::Scks {
                alg: checksum::NAME.into(),
                value: Some(hex.clone()),
            })?;
            match c.final_reply_unless(|| false)? {
                Some(r) if r.code == 200 => verified = Some(format!("{} {hex}", checksum::NAME)),
                Some(r) => return Err(upload_failed(r, &record, c)),
                None => {}
            }
        }
        let Some(r) = c.final_reply_unless(|| false)? else {
            return Err(ClientError::Protocol("no final reply".into()));
        };
        if r.code == 226 || r.code == 250 {
            verified = check_upload(c, peer, file, len, &target.path, verified, false)?;
            break;
        }
        // The stripes the front end says failed go again; those it stored are held.
        let failed = braid_proto::stripes::failed_stripes(&r).filter(|_| peer == Peer::Braid);
        let Some(failed) = failed else {
            return Err(upload_failed(r, &record, c));
        };
        let before = have.len();
        for (i, s) in sent.iter().enumerate() {
            if let (false, Ok(s)) = (failed.contains(&i), s) {
                for (a, e) in s.taken.iter() {
                    have.insert(a, e);
                }
            }
        }
        let _ = record.save(&have);
        if round >= MOST_ROUNDS || have.len() <= before {
            return Err(upload_failed(r, &record, c));
        }
        eprintln!(
            "braid: {} {}; sending the {} bytes of the failed stripes through the data nodes still up",
            r.code,
            r.text(),
            have.missing(len).len()
        );
    }
    record.remove();
    let s = summary(
        "put",
        target,
        String::new(),
        len - resumed_from,
        Some(len),
        resumed_from,
        started,
    );
    Ok(striped(s, &transfers, verified, nodes))
}

/// The summary with a striped transfer's MODE E facts.
fn striped(
    mut s: Summary,
    transfers: &[Transfer],
    verified: Option<String>,
    nodes: usize,
) -> Summary {
    s.mode = "extended-block";
    s.checksum = verified;
    s.streams = transfers.iter().map(|t| t.most_open() as u32).sum();
    s.per_connection_bytes = transfers.iter().flat_map(|t| t.per_link_bytes()).collect();
    s.new_data_connections = transfers.iter().map(|t| t.links().len() as u32).sum();
    s.data_nodes = Some(nodes as u32);
    s.tls_handshakes = transfers
        .iter()
        .map(Transfer::handshakes)
        .sum::<crate::engine::transfer::Handshakes>()
        .any();
    s
}
