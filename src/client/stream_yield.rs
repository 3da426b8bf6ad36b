//! Background mode on a stream-mode data connection, where the server is not braid: the
//! controller of [`crate::engine::background_stream`], ticked by the data phase's watcher, and
//! what it decides set on the socket (the pacing cap when uploading, the receive window's cap
//! when downloading).

use super::Options;
use super::control::Control;
use crate::engine::background::{self, Report, Settings};
use crate::engine::background_stream::{Apply, StreamYield};
use crate::engine::sockets::{set_congestion, set_dscp};
use std::net::TcpStream;
use std::time::Instant;

pub struct OnStream {
    sock: TcpStream,
    ctl: StreamYield,
    opened: Instant,
}

/// Starts background mode on `data` (None without `--background`, or if the socket cannot be
/// shared with the watcher, which is then said). `sending`: an upload.
pub fn start(c: &Control, data: &TcpStream, opts: &Options, sending: bool) -> Option<OnStream> {
    let target = opts.background?;
    let sock = match data.try_clone() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("--background cannot watch the data connection ({e}): it runs unpaced");
            return None;
        }
    };
    let rtt = c.path_rtt();
    // When braid sends, the control a yielding braid server uses; when it receives, the
    // sender's is unknown and assumed to burst as cubic does.
    let congestion = sending.then(background::congestion_by_data_rtt).flatten();
    if let Some(cc) = congestion {
        set_congestion(&sock, cc);
    }
    set_dscp(&sock, background::LOWER_EFFORT);
    let mss = braid_sockopt::tcp_info(&sock)
        .map(|i| u64::from(i.snd_mss))
        .filter(|&m| m >= 500)
        .unwrap_or(1448);
    let settings = Settings {
        target,
        limit: opts.rate_limit,
        mss,
        segments: background::burst_segments(congestion),
    };
    let mut on = OnStream {
        sock,
        ctl: StreamYield::new(settings, rtt, sending),
        opened: Instant::now(),
    };
    // The first window or rate holds before the watcher's first tick.
    on.tick();
    Some(on)
}

impl OnStream {
    /// Reads the connection's `TCP_INFO`, runs the controller and sets what it decides.
    pub fn tick(&mut self) {
        let Some(info) = braid_sockopt::tcp_info(&self.sock) else {
            return;
        };
        match self.ctl.tick(self.opened.elapsed(), info) {
            Apply::Pace(rate) => {
                if let Err(e) = braid_sockopt::set_max_pacing_rate(&self.sock, Some(rate)) {
                    tracing::debug!("SO_MAX_PACING_RATE: {e}");
                }
            }
            // Set every tick: the kernel's receive-buffer autotuning raises the cap as it
            // grows the buffer.
            Apply::Clamp(window) => {
                if let Err(e) = braid_sockopt::set_window_clamp(&self.sock, window) {
                    tracing::debug!("TCP_WINDOW_CLAMP: {e}");
                }
            }
        }
    }

    pub fn report(&self) -> Option<Report> {
        self.ctl.report()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_background_mode_nothing_watches_the_connection() {
        use super::super::testing::{done, scripted};
        let (c, server) = scripted(b"");
        assert!(start(&c, c.socket().unwrap(), &Options::default(), true).is_none());
        assert!(start(&c, c.socket().unwrap(), &Options::default(), false).is_none());
        done(c, server);
    }
}
