//! What MODE E downloads and uploads share: the session's block-mode settings, the data
//! connections opened to a braid server, the sender's pacer and congestion control, the
//! summary of a transfer over many connections, and the errors of a data phase that failed.

use super::Options;
use super::control::{Control, connect_data};
use super::detour::DataAddr;
use super::error::{ClientError, Result};
use super::interrupt::send_abort;
use super::peer::{background_needs_braid, offers_elastic};
use super::plan::Plan;
use super::records::UploadRecord;
use super::summary::{SenderSeen, Summary};
use super::watch::TICK;
use crate::engine::background;
use crate::engine::hooks::{Cap, Pacer, Steering};
use crate::engine::transfer::Transfer;
use crate::engine::{self, EngineError};
use braid_proto::client::{BlockSetup, Direction, Failure, Op};
use braid_proto::compress::Policy;
use braid_proto::retr_opts::{CcName, RetrOpts};
use braid_proto::{Command, Reply};
use std::net::TcpStream;
use std::time::Duration;

/// Marks a summary as a MODE E transfer over these connections, with their timeline.
pub fn extended(
    mut s: Summary,
    plan: &Plan,
    transfer: &Transfer,
    steering: Steering,
    checksum: Option<String>,
    reused: bool,
) -> Summary {
    s.tls_handshakes = transfer.handshakes().any();
    s.compression = transfer
        .compression()
        .agreed()
        .then(|| transfer.compression().report());
    s.new_data_connections = if reused {
        0
    } else {
        transfer.links().len() as u32
    };
    let record = steering.finish(transfer);
    s.mode = "extended-block";
    s.tuning = Some(plan.tuning());
    s.block_size = Some(plan.block);
    s.congestion = record.congestion.map(|c| c.to_string());
    s.sender = record.sender.map(|r| SenderSeen {
        sent: r.sent,
        resent: r.resent,
        busy_ms: r.busy_ms,
        rwnd_limited_ms: r.rwnd_limited_ms,
        sndbuf_limited_ms: r.sndbuf_limited_ms,
    });
    s.decisions = record.decisions;
    s.background = record.background;
    s.per_connection_bytes = transfer.per_link_bytes();
    s.streams = transfer.most_open() as u32;
    s.checksum = checksum;
    s.connections = record.links;
    s.connection_count = record.counts;
    s.timeline = record.timeline;
    s
}

/// The sending side's congestion control: the user's, else background mode's for the path,
/// else the self-tuning's first choice (None: the system's).
pub fn sending_congestion(c: &Control, opts: &Options, plan: &Plan) -> Option<CcName> {
    opts.congestion
        .or_else(|| {
            opts.background
                .and_then(|_| background::congestion(c.path_rtt()))
        })
        .or(plan.start_congestion())
}

/// The transfer's pacer: background mode's controller (with the rate limit as its ceiling),
/// or the rate limit alone where `limits` (a download's sender may not take the limit).
/// Background mode needs the sender to be told rates (`elastic`: a braid server that also
/// answers probes while data moves). `congestion`: the sender's.
pub fn pacer(
    c: &Control,
    opts: &Options,
    congestion: Option<CcName>,
    elastic: bool,
    limits: bool,
) -> Result<Box<dyn Pacer>> {
    let Some(target) = opts.background else {
        return Ok(Box::new(Cap(opts.rate_limit.filter(|_| limits))));
    };
    if !elastic {
        return Err(background_needs_braid());
    }
    let info = c.socket().and_then(braid_sockopt::tcp_info);
    let rtt = c.path_rtt();
    let settings = background::Settings {
        target,
        limit: opts.rate_limit,
        mss: info
            .map(|i| u64::from(i.snd_mss))
            .filter(|&m| m >= 500)
            .unwrap_or(1448),
        // Small probes carry no serialization of their own, but may wait behind the
        // smallest burst the sender's congestion control makes.
        segments: background::burst_segments(congestion),
    };
    Ok(Box::new(background::Yielding::new(settings, rtt)))
}

/// How often the steering runs: background mode's probes and rate changes twice as often as
/// the self-tuning needs (its reaction time is what bounds the queue it leaves).
pub fn tick_every(opts: &Options) -> Duration {
    if opts.background.is_some() {
        TICK / 2
    } else {
        TICK
    }
}
/// MODE E and its settings, each sent once per session; whether transfers are elastic.
/// Pipelined (a braid server), the replies are read with the transfer's start, so the
/// settings cost no round trip of their own; the server said in FEAT what it offers, and a
/// refusal still fails the transfer there.
pub fn block_mode(
    c: &mut Control,
    direction: Direction,
    retr: RetrOpts,
    opts: &Options,
) -> Result<bool> {
    let op = Op::BlockMode(BlockSetup {
        direction,
        retr,
        buffer: opts.buffer,
        compress: (opts.compress != Policy::Off).then_some(opts.compress),
    });
    c.later(op, None)?;
    let pipelined = c.session().pipelining();
    Ok(c.session().elastic() || (pipelined && offers_elastic(c)))
}

/// A MODE E transfer this way, with the compressed blocks the session agreed on.
pub fn transfer(c: &mut Control, direction: Direction, elastic: bool) -> Transfer {
    let private = c.data_tls().is_some();
    let agreed = c.session().compression(direction, private);
    Transfer::new(elastic).with_compression(agreed)
}

/// the server's partial is bad: the record goes, so the next run sends everything.
pub fn upload_failed(r: Reply, record: &UploadRecord, c: &Control) -> ClientError {
    let e = transfer_failed(r);
    if matches!(e, ClientError::Integrity(_)) {
        record.remove();
    } else {
        let _ = record.save(c.stored());
    }
    e
}

/// The error for a data phase that failed: a local file error as such (the server is told with
/// ABOR), anything else as an interrupted transfer, with the server's final reply, which
/// usually says why.
pub fn data_phase_failed(
    c: &mut Control,
    cmd: &Command,
    e: EngineError,
    local_what: &str,
    bytes: u64,
    partial: Option<String>,
) -> ClientError {
    if let EngineError::Local(cause) = e {
        // Only this side knows it stopped: a sender blocked on connections nobody reads
        // any more gives no final reply until it is told with ABOR.
        send_abort(c);
        return ClientError::Local {
            what: local_what.into(),
            cause,
        };
    }
    if let EngineError::Tls(e) = e {
        send_abort(c);
        return ClientError::Tls(c.data_tls_failed(&e));
    }
    // The server's refusal is the cause (a full disk, say); what this side saw of it, a
    // connection it closed, comes second.
    let why = match c.finish_transfer(cmd) {
        Err(ClientError::Remote { reply, .. }) => {
            format!("server reported {reply} (this side saw: {e})")
        }
        _ => e.to_string(),
    };
    ClientError::Interrupted {
        bytes,
        why,
        partial,
    }
}

/// One data connection to `addr`, its socket buffers set to `buffer` (None: autotuning).
pub fn open_data(addr: &DataAddr, buffer: Option<u64>) -> Result<TcpStream> {
    let s = connect_data(addr)?;
    engine::set_buffer(&s, buffer);
    Ok(s)
}

/// Sends the transfer command, opens `n` data connections to the server's passive address,
/// then waits for 150. Connecting before the 150 matters: the Globus server sends it only once
/// data connections have arrived (a braid server takes them from its backlog after sending
/// it). If the server refused the command instead, that refusal is the error reported.
pub fn open_and_start(
    c: &mut Control,
    cmd: &Command,
    addr: &DataAddr,
    n: u32,
    buffer: Option<u64>,
    elastic: bool,
) -> Result<Vec<std::net::TcpStream>> {
    c.send_transfer(cmd)?;
    // All at once: each connection costs a round trip, and they need not wait for each other.
    let socks = crate::fanout::at_once(
        0..n,
        |_| open_data(addr, buffer),
        || Err(ClientError::Protocol("a connecting thread failed".into())),
    );
    // Elastic: a server that has already sent everything on the first connections closes its
    // listener, so a refused latecomer is no error.
    let (ok, failed): (Vec<_>, Vec<_>) = socks.into_iter().partition(|s| s.is_ok());
    let ok: Vec<TcpStream> = ok.into_iter().filter_map(|s| s.ok()).collect();
    c.started_authenticating(cmd, &ok.iter().collect::<Vec<_>>())?;
    match failed.into_iter().find_map(|s| s.err()) {
        Some(e) if !elastic || ok.is_empty() => Err(e),
        Some(e) => {
            tracing::debug!("a data connection was not needed: {e}");
            Ok(ok)
        }
        None => Ok(ok),
    }
}

/// An upload's final reply that is not success, classified by the client session: an
/// integrity failure (535), or an interrupted upload to continue with --resume.
pub fn transfer_failed(r: Reply) -> ClientError {
    match Failure::from_reply("the upload", r) {
        Failure::Integrity(r) => {
            ClientError::Integrity(format!("the server refused the upload: {r}"))
        }
        Failure::Login(r)
        | Failure::NoSpace(r)
        | Failure::Refused { reply: r, .. }
        | Failure::Transient { reply: r, .. } => ClientError::Interrupted {
            bytes: 0,
            why: format!("server reported {r}"),
            partial: None,
        },
        Failure::Protocol(why) => ClientError::Protocol(why),
        f @ Failure::Closed { .. } => ClientError::Protocol(f.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uploads_final_refusal_is_an_integrity_error_only_for_a_checksum() {
        let integrity = transfer_failed(Reply::new(535, "checksum mismatch"));
        assert!(
            matches!(integrity, ClientError::Integrity(_)),
            "{integrity}"
        );
        for code in [451, 452, 552, 421] {
            let e = transfer_failed(Reply::new(code, "no"));
            assert!(matches!(e, ClientError::Interrupted { .. }), "{code}: {e}");
            assert!(e.to_string().contains(&code.to_string()));
        }
    }

    #[test]
    fn background_mode_steers_twice_as_often() {
        let bg = Options {
            background: Some(std::time::Duration::from_millis(10)),
            ..Options::default()
        };
        assert_eq!(tick_every(&Options::default()), TICK);
        assert_eq!(tick_every(&bg), TICK / 2);
    }

    #[test]
    fn a_local_failure_aborts_and_a_broken_connection_gives_the_servers_reason_first() {
        use super::super::testing::{done, scripted};
        let stor = Command::Stor("f".into());
        let (mut c, server) = scripted(b"426 Aborted\r\n200 NOOP\r\n451 Disk full\r\n");
        let local = EngineError::Local(std::io::Error::other("cannot read"));
        let e = data_phase_failed(&mut c, &stor, local, "cannot read the file", 0, None);
        assert!(matches!(e, ClientError::Local { .. }), "{e}");
        let net = EngineError::Net {
            conn: 2,
            source: std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"),
        };
        let e = data_phase_failed(&mut c, &stor, net, "w", 100, Some("p".into()));
        let text = e.to_string();
        assert!(
            matches!(e, ClientError::Interrupted { bytes: 100, .. }),
            "{text}"
        );
        assert!(
            text.contains("server reported 451 Disk full (this side saw: data connection 2"),
            "{text}"
        );
        assert_eq!(done(c, server), "ABOR\r\nNOOP\r\n");
    }
}
