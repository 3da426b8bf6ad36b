//! Ctrl-C during a transfer: the first one stops it cleanly (data connections closed, ABOR sent,
//! what arrived kept for `--resume`); a second one exits at once. Outside a data phase Ctrl-C
//! exits at once, as it would without braid's handler.

use super::control::Control;
use super::error::ClientError;
use crate::engine::Abort;
use braid_proto::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Ctrl-C (or SIGTERM) handling for one data phase; dropping it restores "exit at once".
pub struct Interrupt {
    flag: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Interrupt {
    pub fn install() -> Interrupt {
        use signal_hook::consts::{SIGINT, SIGTERM};
        for id in EXIT_ON_SIGNAL
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            signal_hook::low_level::unregister(id);
        }
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
        Interrupt { flag, ids }
    }

    pub fn hit(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        // signal-hook keeps its handler installed, which would now swallow Ctrl-C (and only
        // interrupt system calls): make it exit as it did before the data phase.
        let exit = Arc::new(AtomicBool::new(true));
        let mut restored = EXIT_ON_SIGNAL.lock().unwrap_or_else(|e| e.into_inner());
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            if let Ok(id) = signal_hook::flag::register_conditional_shutdown(sig, 130, exit.clone())
            {
                restored.push(id);
            }
        }
    }
}

/// The "exit at once" actions that stand in for the default signal action between data
/// phases; the next data phase removes them.
static EXIT_ON_SIGNAL: std::sync::Mutex<Vec<signal_hook::SigId>> =
    std::sync::Mutex::new(Vec::new());

/// Tells the server with ABOR that this side gave the transfer up (Ctrl-C, a local error)
/// and reads its replies (426 then 226, or 225).
pub fn send_abort(c: &mut Control) {
    if c.send(&Command::Abor).is_err() {
        return;
    }
    for _ in 0..3 {
        match c.reply() {
            Ok(r) if r.code == 426 || r.is_preliminary() => continue,
            _ => return,
        }
    }
}

/// Runs a stream-mode data phase over one connection, which Ctrl-C closes; says whether it did.
pub fn on_one_connection<R>(data: &std::net::TcpStream, work: impl FnOnce() -> R) -> (R, bool) {
    let abort = Abort::new();
    abort.register(data);
    let interrupt = Interrupt::install();
    let r = supervise(&abort, &interrupt, work, || {});
    (r, interrupt.hit())
}

/// What a transfer stopped by Ctrl-C reports, once the server has been told with ABOR.
pub fn stopped(c: &mut Control, bytes: u64, advice: &str, partial: Option<String>) -> ClientError {
    send_abort(c);
    ClientError::Interrupted {
        bytes,
        why: format!("stopped by Ctrl-C; the server was sent ABOR{advice}"),
        partial,
    }
}

/// Runs a data phase on this thread while a watcher thread turns Ctrl-C into `abort` (which
/// closes the data connections, waking the phase from its blocking calls) and calls `tick`
/// (progress bar, resume record) every 100 ms.
pub fn supervise<R>(
    abort: &Abort,
    interrupt: &Interrupt,
    work: impl FnOnce() -> R,
    mut tick: impl FnMut() + Send,
) -> R {
    let (done, finished) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                finished.recv_timeout(Duration::from_millis(100))
            {
                if interrupt.hit() {
                    abort.abort();
                }
                tick();
            }
        });
        let r = work();
        drop(done);
        r
    })
}
