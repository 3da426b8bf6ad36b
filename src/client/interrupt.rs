//! Ctrl-C during a transfer: the first one stops it cleanly (data connections closed, ABOR sent,
//! what arrived kept for `--resume`); a second one exits at once. Outside a data phase Ctrl-C
//! exits at once, as it would without braid's handler.

use super::control::Control;
use braid_proto::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Ctrl-C (or SIGTERM) handling for one data phase; dropping it restores "exit at once".
pub struct Interrupt {
    flag: Arc<AtomicBool>,
    /// Set by SIGTERM only: a service manager's stop is not the user's Ctrl-C.
    term: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Interrupt {
    pub fn install() -> Interrupt {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut between = BETWEEN_PHASES.lock().unwrap_or_else(|e| e.into_inner());
        between.active += 1;
        for id in between.exit_ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        drop(between);
        let flag = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        for sig in [SIGINT, SIGTERM] {
            // The shutdown check runs first, so only a signal that finds the flag set exits.
            if let Ok(id) = signal_hook::flag::register_conditional_shutdown(sig, 130, flag.clone())
            {
                ids.push(id);
            }
            if let Ok(id) = signal_hook::flag::register(sig, flag.clone()) {
                ids.push(id);
            }
        }
        let term = Arc::new(AtomicBool::new(false));
        if let Ok(id) = signal_hook::flag::register(SIGTERM, term.clone()) {
            ids.push(id);
        }
        Interrupt { flag, term, ids }
    }

    pub fn hit(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// What stopped the transfer, as a user would name it.
    pub fn cause(&self) -> &'static str {
        if self.term.load(Ordering::SeqCst) {
            "SIGTERM"
        } else {
            "Ctrl-C"
        }
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        // signal-hook keeps its handler installed, which would now swallow Ctrl-C (and only
        // interrupt system calls): make it exit as it did before the data phase, unless
        // another handler still runs (a tree transfer's, around its files' own).
        let mut between = BETWEEN_PHASES.lock().unwrap_or_else(|e| e.into_inner());
        between.active = between.active.saturating_sub(1);
        if between.active > 0 {
            return;
        }
        let exit = Arc::new(AtomicBool::new(true));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            if let Ok(id) = signal_hook::flag::register_conditional_shutdown(sig, 130, exit.clone())
            {
                between.exit_ids.push(id);
            }
        }
    }
}

/// How many Ctrl-C handlers are installed, and the "exit at once" actions that stand in for
/// the default signal action when none is; the next handler removes them.
struct Between {
    active: usize,
    exit_ids: Vec<signal_hook::SigId>,
}

static BETWEEN_PHASES: std::sync::Mutex<Between> = std::sync::Mutex::new(Between {
    active: 0,
    exit_ids: Vec::new(),
});

/// Tells the server with ABOR that this side gave the transfer up (Ctrl-C, a local error, a
/// segment's end) and reads the replies to the transfer and to ABOR. Servers answer these
/// differently, and the same server differently by timing (426 then 226; or 226 for a
/// transfer that had just ended, then 225), so a NOOP follows: everything before its 200
/// belongs to the transfer and the abort, and the next command gets its own reply.
pub fn send_abort(c: &mut Control) {
    if c.send(&Command::Abor).is_err() || c.send(&Command::Noop).is_err() {
        return;
    }
    for _ in 0..6 {
        match c.reply() {
            Ok(r) if r.code == 200 => return,
            Ok(_) => continue,
            Err(_) => return,
        }
    }
}
