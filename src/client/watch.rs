//! The one supervision loop every transfer runs under: a progress bar (on a terminal, when
//! asked), Ctrl-C or SIGTERM turned into a clean stop (the data connections closed, ABOR sent,
//! what arrived kept for `--resume`), and a tick for whatever the route steers while its data
//! moves (self-tuning, background mode's rate, the resume record).

use super::Options;
use super::control::Control;
use super::error::ClientError;
use super::interrupt::{Interrupt, send_abort};
use crate::engine::Abort;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::mpsc;
use std::time::Duration;

/// How often the watcher ticks: often enough for a progress bar and for the self-tuning.
pub const TICK: Duration = Duration::from_millis(100);

/// One data phase being watched; dropping it restores "Ctrl-C exits at once".
pub struct Watch {
    pub bar: ProgressBar,
    interrupt: Interrupt,
    period: Duration,
}

impl Watch {
    /// Starts watching a transfer of `total` bytes (None: unknown) that begins at `at`.
    pub fn start(opts: &Options, total: Option<u64>, at: u64) -> Watch {
        Watch {
            bar: progress_bar(opts, total, at),
            interrupt: Interrupt::install(),
            period: TICK,
        }
    }

    /// Ticks every `period` instead (background mode steers twice as often: its reaction time
    /// bounds the queue it leaves).
    pub fn every(mut self, period: Duration) -> Watch {
        self.period = period;
        self
    }

    /// Runs `work` on this thread while a watcher thread turns Ctrl-C into `abort` (which
    /// closes the data connections, waking `work` from its blocking calls) and calls `tick`
    /// every period. The bar is cleared when `work` returns.
    pub fn run<R>(&self, abort: &Abort, work: impl FnOnce() -> R, tick: impl FnMut() + Send) -> R {
        let r = supervise(self.period, abort, &self.interrupt, work, tick);
        self.bar.finish_and_clear();
        r
    }

    /// Whether Ctrl-C (or SIGTERM) stopped the transfer.
    pub fn stopped(&self) -> bool {
        self.interrupt.hit()
    }

    /// What a stopped transfer reports, once the server has been told with ABOR: how far it
    /// got, what stopped it, and `advice` on what to do next.
    pub fn stop(
        &self,
        c: &mut Control,
        bytes: u64,
        advice: &str,
        partial: Option<String>,
    ) -> ClientError {
        send_abort(c);
        ClientError::Interrupted {
            bytes,
            why: format!(
                "stopped by {}; the server was sent ABOR{advice}",
                self.interrupt.cause()
            ),
            partial,
        }
    }
}

/// Runs `work` while a watcher thread turns a hit `interrupt` into `abort` and calls `tick`
/// every `period`.
pub fn supervise<R>(
    period: Duration,
    abort: &Abort,
    interrupt: &Interrupt,
    work: impl FnOnce() -> R,
    mut tick: impl FnMut() + Send,
) -> R {
    let (done, finished) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(period) {
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

fn progress_bar(opts: &Options, total: Option<u64>, start: u64) -> ProgressBar {
    if !opts.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(t) => ProgressBar::new(t),
        None => ProgressBar::new_spinner(),
    };
    let style = ProgressStyle::with_template(
        "{bytes:>10}/{total_bytes:10} [{wide_bar}] {binary_bytes_per_sec:>12} ETA {eta:>4}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("=> "));
    bar.set_position(start);
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn the_watcher_ticks_while_the_work_runs_and_stops_with_it() {
        let abort = Abort::new();
        let interrupt = Interrupt::install();
        let ticks = AtomicU32::new(0);
        let (go, wait) = mpsc::channel::<()>();
        let r = supervise(
            Duration::from_millis(1),
            &abort,
            &interrupt,
            // The work ends only once the watcher has ticked three times.
            || {
                wait.recv().ok();
                7
            },
            || {
                if ticks.fetch_add(1, Ordering::SeqCst) == 2 {
                    let _ = go.send(());
                }
            },
        );
        assert_eq!(r, 7);
        // The scope joined the watcher: it ticked while the work waited, and is gone.
        assert!(ticks.load(Ordering::SeqCst) >= 3);
        assert!(!abort.is_aborted(), "nothing was interrupted");
    }

    #[test]
    fn a_stopped_transfer_tells_the_server_and_says_what_stopped_it() {
        use super::super::testing::{done, scripted};
        let (mut c, server) = scripted(b"426 Aborted\r\n226 ABOR ok\r\n200 NOOP ok\r\n");
        let watch = Watch::start(&Options::default(), Some(100), 0);
        assert!(!watch.stopped() && watch.bar.is_hidden());
        let e = watch.stop(
            &mut c,
            40,
            "; run again with --resume",
            Some("f.part".into()),
        );
        let text = e.to_string();
        assert!(text.contains("after 40 bytes"), "{text}");
        assert!(
            text.contains("stopped by Ctrl-C; the server was sent ABOR; run again"),
            "{text}"
        );
        assert!(text.contains("kept in f.part"), "{text}");
        assert_eq!(done(c, server), "ABOR\r\nNOOP\r\n");
    }
}
