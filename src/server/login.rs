//! USER and PASS, the way an attacker meets them: a check waits for the account's (and
//! range's) budget, runs on the password pool, and is answered no sooner than the penalties
//! say; a client that hangs up or is pushed out meanwhile gives its place back at once; a
//! check that cannot be had soon is answered 421 "try later" and counts as no failure. The
//! decisions are [`super::guard`]'s; this is the waiting.

use super::conn::{Conn, Input, MAX_QUEUED};
use super::guard::Place;
use super::guard::budget::Turn;
use super::io::Io;
use super::quota::{Limits, Quota};
use braid_proto::Reply;
use braid_proto::session::{Action, Session, canonical_ip};
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a login may wait for its account's budget before it is told to try later.
pub const MOST_BUDGET_WAIT: Duration = Duration::from_secs(5);

/// What a connection pushed out before it logged in is told.
pub(super) const PUSHED_OUT: &str =
    "Too many connections waiting to log in; yours waited longest. Try again.";

/// Checks a login and answers it; None when the client went away or its place was taken, and
/// the session ends.
pub(super) async fn login(
    conn: &mut Conn,
    io: &mut Io,
    session: &mut Session,
    mut place: Option<&mut Place>,
    user: String,
    password: String,
) -> Option<Action> {
    let config = io.config.clone();
    let anonymous = braid_proto::session::is_anonymous(&user);
    if !anonymous && let Some(subject) = io.gsi_user.as_ref().map(|g| g.subject.clone()) {
        return Some(gsi_login(io, session, &subject, &user).await);
    }
    let ip = canonical_ip(io.peer.ip());
    let range = config.ranges.of(ip);
    let guard = &config.guard;
    let anonymous_id = anonymous.then(|| password.clone());
    let checked = if anonymous {
        config.anonymous.map(|p| (p, config.root.clone()))
    } else {
        let asked = Instant::now();
        if let Some(p) = place.as_deref() {
            p.checking(true, guard.budget().is_familiar(range, &user, asked));
        }
        let familiar = loop {
            let turn = guard.budget().take(range, &user, Instant::now());
            match turn {
                Turn::Now { familiar } => break familiar,
                Turn::Later(at) if at.saturating_duration_since(asked) > MOST_BUDGET_WAIT => {
                    crate::warnings::warn(
                        "login-budget",
                        ip,
                        format_args!("too many logins of {user} lately: told to try later"),
                    );
                    return Some(Action::Close(Reply::new(
                        421,
                        "Too many login attempts for this account lately; try again in a minute.",
                    )));
                }
                Turn::Later(at) => {
                    let wait = tokio::time::sleep_until(at.into());
                    unless_gone(conn, place.as_deref_mut(), wait).await?;
                }
            }
        };
        let start = Instant::now();
        let (answer, stop) = {
            let failures = guard.failures();
            (
                failures.answer(config.login_fail_delay, range, &user, start),
                failures.stop_checking(range, &user, start),
            )
        };
        let checked = if stop {
            crate::warnings::warn(
                "login-unchecked",
                ip,
                format_args!(
                    "{user}: too many failed logins from this range lately; password not checked"
                ),
            );
            None
        } else {
            let users = config.clone();
            let name = user.clone();
            let check = config.guard.checks.run(familiar, move || {
                users
                    .users
                    .verify(&name, &password)
                    .map(|a| (a.perm, a.root.clone()))
            });
            match unless_gone(conn, place.as_deref_mut(), check).await? {
                Some(checked) => checked,
                None => {
                    crate::warnings::warn(
                        "login-queue",
                        ip,
                        format_args!("too many password checks waiting: {user} told to try later"),
                    );
                    return Some(Action::Close(Reply::new(
                        421,
                        "Too many logins being checked; try again in a minute.",
                    )));
                }
            }
        };
        let after = match checked {
            Some(_) => answer.success_after,
            None => {
                // Counted before the wait: hanging up early saves the guesser nothing.
                guard.failures().failed(range, &user, Instant::now());
                config.metrics.login_failed();
                // One line per failure, for fail2ban and the like: the budget bounds them.
                tracing::warn!(
                    peer = %io.peer,
                    user,
                    delay_ms = answer.failure_after.as_millis() as u64,
                    "failed login"
                );
                answer.failure_after
            }
        };
        let answer_at = tokio::time::sleep_until((start + after).into());
        unless_gone(conn, place, answer_at).await?;
        checked
    };
    let granted = match checked {
        Some((perm, root_path)) if enter(io, &root_path, &user, anonymous).await => {
            io.anonymous_id = anonymous_id;
            if let Some(tls) = &io.tls {
                tls.logged_in(if anonymous { "anonymous" } else { &user });
            }
            if !anonymous {
                guard.failures().succeeded(range, &user);
                guard.budget().succeeded(range, &user, Instant::now());
            }
            tracing::info!(peer = %io.peer, user, "logged in");
            Some(perm)
        }
        Some(_) => None,
        None if anonymous => {
            tokio::time::sleep(config.login_fail_delay).await;
            None
        }
        None => None,
    };
    Some(session.login_done(granted))
}

/// A login under GSI: the credential was checked by the handshake, and the grid-mapfile
/// says which account `subject` is (`user` names one, or `:globus-mapping:` the first): its
/// root and rights from --users, or the server's root read-write for a name not there. No
/// password is guessed here, so none of the budgets apply.
async fn gsi_login(io: &mut Io, session: &mut Session, subject: &str, user: &str) -> Action {
    let config = io.config.clone();
    let mapped = match config.gsi.clone() {
        Some(host) => {
            let (subject, user) = (subject.to_string(), user.to_string());
            tokio::task::spawn_blocking(move || host.map(&subject, &user))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        None => Err("GSI is not configured".into()),
    };
    let account = match mapped {
        Ok(a) => a,
        Err(why) => {
            tracing::warn!(peer = %io.peer, subject, user, "GSI login refused: {why}");
            return session.login_done_as(Err(why));
        }
    };
    let (perm, root_path) = match config.users.account(&account) {
        Some(a) => (a.perm, a.root.clone()),
        None => (braid_proto::session::Perm::ReadWrite, config.root.clone()),
    };
    if !enter(io, &root_path, &account, false).await {
        return session.login_done_as(Err("the account's directory is unusable".into()));
    }
    tracing::info!(peer = %io.peer, user = account, subject, "logged in by GSI");
    session.login_done_as(Ok((perm, account)))
}

/// Opens the account's root (and its quota) for the session; false, logged, when it cannot.
async fn enter(io: &mut Io, root_path: &std::path::Path, user: &str, anonymous: bool) -> bool {
    match open(&io.config, root_path, user, anonymous).await {
        Ok((root, quota)) => {
            io.root = Some(root);
            io.quota = quota;
            true
        }
        Err(e) => {
            tracing::error!(user, "root directory {} unusable: {e}", root_path.display());
            false
        }
    }
}

/// The account's root, and its quota if it has one (the first login to a root with a quota
/// counts what is under it).
async fn open(
    config: &std::sync::Arc<super::Config>,
    root_path: &std::path::Path,
    user: &str,
    anonymous: bool,
) -> std::io::Result<(std::sync::Arc<crate::fsroot::Root>, Option<Quota>)> {
    let root = config.open_root(root_path)?;
    let class = config.users.class(user);
    let limits = Limits {
        bytes: class.quota,
        files: class.quota_files,
    };
    if anonymous || !limits.any() {
        return Ok((root, None));
    }
    let (usages, at) = (config.usages.clone(), root_path.to_path_buf());
    let usage = tokio::task::spawn_blocking(move || usages.of(&at))
        .await
        .map_err(std::io::Error::other)?
        .map_err(|e| {
            std::io::Error::new(e.kind(), format!("counting its usage for the quota: {e}"))
        })?;
    Ok((root, Some(Quota { limits, usage })))
}

/// Runs `fut` while watching the control connection: None if the client hangs up or the
/// connection's pre-login place is taken by a newcomer first. Commands the client pipelines
/// meanwhile are kept for after.
async fn unless_gone<F: Future>(
    conn: &mut Conn,
    place: Option<&mut Place>,
    fut: F,
) -> Option<F::Output> {
    tokio::pin!(fut);
    let mut place = place;
    loop {
        tokio::select! {
            out = &mut fut => return Some(out),
            input = conn.read_input(), if conn.queued.len() < MAX_QUEUED => match input {
                Input::Line(l) => conn.queued.push_back(l),
                Input::TooLong | Input::Closed => return None,
            },
            () = pushed_out(place.as_deref_mut()) => {
                let why = Reply::new(421, PUSHED_OUT);
                let _ = conn.send_unlogged(&why).await;
                return None;
            }
        }
    }
}

/// Resolves when the connection's pre-login place is taken (never without one).
pub(super) async fn pushed_out(place: Option<&mut Place>) {
    match place {
        Some(p) => {
            let _ = (&mut p.pushed_out).await;
        }
        None => std::future::pending().await,
    }
}
