//! One control connection: reads commands, drives the protocol session and does the I/O it
//! asks for. Beside it: `connections.rs` opens data connections, `files.rs` does file
//! operations and listings, `supervise.rs` runs a transfer while the control connection
//! stays live (ABOR, STAT, markers, upload checks).

use super::conn::{Conn, Input};
use super::io::Io;
use super::{Config, Shutdown, reached};
use braid_proto::path::VPath;
use braid_proto::session::{Action, Session, SessionConfig, canonical_ip};
use braid_proto::{Command, MAX_LINE, Reply};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

/// The longest ADAT line taken: a client's whole certificate flight, in base64.
const ADAT_LINE: usize = 64 << 10;

pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    config: Arc<Config>,
    shutdown: watch::Receiver<Shutdown>,
) {
    // Clients send ABOR with TCP urgent data; keep that byte in the stream.
    let _ = socket2::SockRef::from(&stream).set_out_of_band_inline(true);
    let _ = stream.set_nodelay(true);
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let conn = Conn::new(stream, peer);
    let ends = Ends {
        peer,
        local,
        start: VPath::root(),
        guarded: true,
        greeting: Session::greeting(),
        forwarded: false,
    };
    run(conn, ends, config, shutdown).await;
}

/// One session on standard input and output (`braid serve --stdio`, started by ssh for
/// `braid cp`): no pre-login place to hold (ssh has admitted the client), starting in `start`,
/// greeting with `greeting` (which names the certificate).
pub(super) async fn serve_piped(
    conn: Conn,
    local: SocketAddr,
    start: VPath,
    greeting: Reply,
    config: Arc<Config>,
    shutdown: watch::Receiver<Shutdown>,
) {
    let ends = Ends {
        peer: conn.peer,
        local,
        start,
        guarded: false,
        greeting,
        forwarded: true,
    };
    run(conn, ends, config, shutdown).await;
}

/// Where a session's connection comes from and goes to.
struct Ends {
    peer: SocketAddr,
    /// Where passive data connections listen.
    local: SocketAddr,
    /// The directory the session starts in.
    start: VPath,
    /// Whether the session holds a pre-login place ([`super::guard`]) until it logs in.
    guarded: bool,
    greeting: Reply,
    /// A one-shot session over ssh, whose data connections may come through ssh's forward.
    forwarded: bool,
}

async fn run(
    mut conn: Conn,
    ends: Ends,
    config: Arc<Config>,
    mut shutdown: watch::Receiver<Shutdown>,
) {
    let Ends {
        peer,
        local,
        start,
        guarded,
        greeting,
        forwarded,
    } = ends;
    let mut io = Io {
        config: config.clone(),
        peer,
        local,
        forwarded,
        root: None,
        passive: None,
        cached: None,
        anonymous_id: None,
        binding: None,
        tls: None,
        quota: None,
        nodes: None,
        gsi_context: None,
        gsi_user: None,
    };
    let mut session = Session::new(
        SessionConfig {
            anonymous: config.anonymous,
            max_login_failures: 3,
            max_streams: config.max_streams,
            tls: config.tls.is_some(),
            private_data_required: config.tls.as_ref().is_some_and(|t| t.data_required),
            compress: config.compress,
            third_party: config.third_party,
            data_node: matches!(config.striping, super::Striping::Node),
            striped: matches!(config.striping, super::Striping::FrontEnd(_)),
            gsi: config.gsi.is_some(),
        },
        peer.ip(),
    );
    session.start_in(start);
    let _counted = config.metrics.session();
    tracing::info!(%peer, "connected");
    let connected = Instant::now();
    let ip = canonical_ip(peer.ip());
    let entered = guarded.then(|| {
        config
            .guard
            .enter(config.ranges.of(ip), config.max_startups)
    });
    let mut place = match entered {
        None => None,
        Some(Ok(place)) => Some(place),
        Some(Err(why)) => {
            crate::warnings::warn("prelogin-full", ip, format_args!("refused: {why}"));
            let _ = conn.send_unlogged(&Reply::new(421, why)).await;
            return;
        }
    };
    let login_timeout = config
        .guard
        .login_timeout(config.login_timeout, config.max_startups);
    if conn.send(&greeting).await.is_err() {
        return;
    }
    let login_deadline = Instant::now() + login_timeout;
    loop {
        // Nothing more to answer at once: what was held back goes before the wait.
        if !conn.input_waiting() && conn.flush().await.is_err() {
            break;
        }
        let deadline = if session.user().is_none() {
            login_deadline
        } else {
            Instant::now() + config.idle_timeout
        };
        let input = tokio::select! {
            i = conn.next_input() => i,
            _ = tokio::time::sleep_until(deadline) => {
                let why = if session.user().is_none() { "Login timeout" } else { "Idle timeout" };
                let _ = conn.send(&Reply::new(421, format!("{why}; closing control connection."))).await;
                tracing::info!(%peer, "{why}");
                break;
            }
            () = super::login::pushed_out(place.as_mut()), if place.is_some() => {
                let _ = conn.send_unlogged(&Reply::new(421, super::login::PUSHED_OUT)).await;
                tracing::debug!(%peer, "pushed out by a newer connection before logging in");
                break;
            }
            _ = reached(&mut shutdown, Shutdown::Graceful) => {
                let _ = conn.send(&Reply::new(421, "Server is shutting down; closing control connection.")).await;
                break;
            }
        };
        let line = match input {
            Input::Line(l) => l,
            Input::Closed => break,
            Input::TooLong => {
                let r = Reply::new(
                    500,
                    format!("Command line too long (limit {MAX_LINE} bytes); closing connection."),
                );
                let _ = conn.send(&r).await;
                tracing::warn!(%peer, "overlong command line");
                break;
            }
        };
        let cmd = match Command::parse(&line) {
            Ok(c) => c,
            Err(e) => {
                if conn
                    .send(&Reply::new(e.reply_code(), format!("{e}.")))
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
        };
        match &cmd {
            Command::Pass(_) => tracing::debug!(%peer, "< PASS ****"),
            c => tracing::debug!(%peer, "< {}", c.to_line()),
        }
        conn.command = cmd.verb().to_string();
        conn.cork = conn.input_waiting();
        let mut action = session.handle(cmd);
        // 334 after AUTH GSSAPI: ADAT tokens follow, the client's carrying its certificate
        // chain in base64, which a VOMS proxy's attribute certificates make longer than a
        // command may be.
        if matches!(&action, Action::Reply(r) if r.code == 334) {
            conn.widen_lines(ADAT_LINE);
        }
        // Login and passive results may themselves close the session.
        if let Action::Login { user, password } = action {
            let answered = super::login::login(
                &mut conn,
                &mut io,
                &mut session,
                place.as_mut(),
                user,
                password,
            )
            .await;
            let Some(answered) = answered else {
                tracing::info!(%peer, "gone before the login was answered");
                break;
            };
            action = answered;
            if let Some(p) = &place {
                p.checking(false, false);
            }
            // Logged in: the pre-login place goes before the reply says so.
            if session.user().is_some() {
                place = None;
                conn.user = session.user().map(str::to_string);
            }
        }
        let keep_going = match action {
            Action::Reply(r) => {
                let upload = matches!(conn.command.as_str(), "STOR" | "APPE" | "SBND");
                if upload && r.code >= 400 && session.drains_refused_upload() {
                    io.drain_refused_upload().await;
                }
                conn.send(&r).await.is_ok()
            }
            Action::Close(r) => {
                conn.cork = false;
                let _ = conn.send(&r).await;
                false
            }
            Action::Login { .. } => true,
            Action::Passive { extended } => {
                let result = io.open_passive().await;
                let r = session.passive_done(extended, result);
                conn.send(&r).await.is_ok()
            }
            Action::Adat(token) => {
                let (outcome, lines) = io.adat(token).await;
                if let braid_proto::session::AdatOutcome::Failed(why) = &outcome {
                    tracing::warn!(%peer, "GSI login refused: {why}");
                }
                // The 235 goes unwrapped; what follows it, wrapped.
                let sent = match session.adat_done(outcome) {
                    Action::Reply(r) => conn.send(&r).await.is_ok(),
                    Action::Close(r) => {
                        let _ = conn.send(&r).await;
                        false
                    }
                    _ => false,
                };
                if let Some(lines) = lines {
                    conn.start_gsi(lines);
                }
                sent
            }
            Action::StripedPassive => {
                let result = io.striped_passive().await;
                let r = session.striped_passive_done(result);
                conn.send(&r).await.is_ok()
            }
            Action::Fs(op) => {
                let result = io.fs(op).await;
                let r = session.fs_done(result);
                conn.send(&r).await.is_ok()
            }
            Action::Transfer(t) => {
                super::supervise::transfer(&mut conn, &mut io, &mut session, t, &mut shutdown).await
            }
            // The client waits for this answer before its handshake.
            Action::StartTls(r) => match (&config.tls, {
                conn.cork = false;
                conn.send(&r).await
            }) {
                (Some(tls), Ok(())) => {
                    let session_tls = tls.session(canonical_ip(peer.ip()));
                    let started = conn
                        .start_tls(&session_tls, config.login_timeout)
                        .await
                        .map(|binding| (binding, session_tls));
                    match started {
                        Ok((binding, session_tls)) => {
                            io.binding = Some(binding);
                            io.tls = Some(session_tls);
                            tracing::info!(%peer, "control connection now uses TLS");
                            true
                        }
                        Err(e) => {
                            tracing::warn!(%peer, "{e}");
                            false
                        }
                    }
                }
                _ => false,
            },
        };
        if !keep_going {
            break;
        }
        if !session.keeps_data_connections() {
            io.cached = None;
        }
    }
    let _ = conn.flush().await;
    tracing::info!(
        %peer,
        user = conn.user.as_deref().unwrap_or("-"),
        seconds = (connected.elapsed().as_secs_f64() * 1e3).round() / 1e3,
        "disconnected"
    );
}
