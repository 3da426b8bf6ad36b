//! Where received blocks go: a file written at offsets, or a stream (stdout, a pipe) that needs
//! the bytes in order, fed from a reorder buffer of bounded size.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

pub enum Sink {
    File(File),
    Ordered(Reorder),
    /// Data is checked and counted but not kept (benchmarks to /dev/null).
    Discard,
}

impl Sink {
    pub fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::File(f) => f.write_all_at(data, offset),
            Sink::Ordered(r) => r.write(offset, data),
            Sink::Discard => Ok(()),
        }
    }

    /// Blocks may land in any order, and land twice (sent again after a connection broke).
    pub fn random_access(&self) -> bool {
        !matches!(self, Sink::Ordered(_))
    }

    /// Flushes an ordered sink; an error if bytes are still waiting for a gap to fill.
    pub fn finish(&self) -> std::io::Result<()> {
        match self {
            Sink::Ordered(r) => r.finish(),
            _ => Ok(()),
        }
    }
}

/// Puts blocks that arrive out of order back in order. A block that is not next waits in
/// memory; when the waiting bytes reach `cap`, its connection's thread blocks (and so does
/// that TCP connection) until the gap is filled. The block that fills the gap is always let
/// through, so this cannot deadlock with a sender that hands out blocks in offset order, as
/// braid and Globus do.
pub struct Reorder {
    state: Mutex<State>,
    moved: Condvar,
    cap: usize,
    /// How long a block may wait for the gap before it is a stalled transfer.
    stall: Duration,
}

struct State {
    next: u64,
    pending: BTreeMap<u64, Vec<u8>>,
    pending_bytes: usize,
    spare: Vec<Vec<u8>>,
    out: Box<dyn Write + Send>,
}

impl Reorder {
    pub fn new(out: Box<dyn Write + Send>, cap: usize, stall: Duration) -> Reorder {
        Reorder {
            state: Mutex::new(State {
                next: 0,
                pending: BTreeMap::new(),
                pending_bytes: 0,
                spare: Vec::new(),
                out,
            }),
            moved: Condvar::new(),
            cap,
            stall,
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if offset < st.next {
                return Err(std::io::Error::other(format!(
                    "block at offset {offset} overlaps data already written (up to {})",
                    st.next
                )));
            }
            if offset == st.next {
                st.out.write_all(data)?;
                st.next += data.len() as u64;
                // Drain what this block unblocked.
                loop {
                    let next = st.next;
                    let Some(buf) = st.pending.remove(&next) else {
                        break;
                    };
                    st.out.write_all(&buf)?;
                    st.next += buf.len() as u64;
                    st.pending_bytes -= buf.len();
                    st.spare.push(buf);
                }
                self.moved.notify_all();
                return Ok(());
            }
            if st.pending_bytes + data.len() <= self.cap || st.pending.is_empty() {
                let mut buf = st.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(data);
                if st.pending.insert(offset, buf).is_some() {
                    return Err(std::io::Error::other(format!(
                        "two blocks at offset {offset}"
                    )));
                }
                st.pending_bytes += data.len();
                return Ok(());
            }
            let (guard, timeout) = self
                .moved
                .wait_timeout(st, self.stall)
                .unwrap_or_else(|p| p.into_inner());
            st = guard;
            if timeout.timed_out() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the reorder buffer is full and the data at offset {} has not arrived",
                        st.next
                    ),
                ));
            }
        }
    }

    fn finish(&self) -> std::io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = st.pending.keys().next() {
            return Err(std::io::Error::other(format!(
                "data is missing between offsets {} and {first}",
                st.next
            )));
        }
        st.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A writer whose bytes the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn reorders_blocks_from_several_threads_within_the_cap() {
        let out = Shared::default();
        let sink = Sink::Ordered(Reorder::new(
            Box::new(out.clone()),
            64,
            Duration::from_secs(10),
        ));
        let data: Vec<u8> = (0..4000u32).map(|i| (i % 251) as u8).collect();
        // Four "connections", each taking every fourth 40-byte block, in its own thread.
        std::thread::scope(|s| {
            for t in 0..4 {
                let (sink, data) = (&sink, &data);
                s.spawn(move || {
                    for off in (t * 40..data.len()).step_by(160) {
                        let end = (off + 40).min(data.len());
                        sink.write(off as u64, &data[off..end]).unwrap();
                    }
                });
            }
        });
        sink.finish().unwrap();
        assert!(*out.0.lock().unwrap() == data, "bytes out of order");
    }

    #[test]
    fn gaps_and_overlaps_are_errors() {
        let sink = Sink::Ordered(Reorder::new(
            Box::new(Shared::default()),
            1000,
            Duration::from_millis(50),
        ));
        sink.write(0, b"abc").unwrap();
        assert!(sink.write(1, b"x").is_err());
        sink.write(10, b"late").unwrap();
        assert!(sink.finish().is_err());
        // Full buffer and the gap never filled: a stall, not a hang.
        let small = Sink::Ordered(Reorder::new(
            Box::new(Shared::default()),
            4,
            Duration::from_millis(50),
        ));
        small.write(8, b"1234").unwrap();
        let e = small.write(20, b"5678").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }
}
