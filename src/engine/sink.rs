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
    /// Many files end to end (a bundle).
    Bundle(super::bundle::Writer),
    /// Many files end to end, opened before the data came (a bundle a server stores).
    Landing(super::bundle::Landing),
    /// Bytes kept in memory at their offsets: a listing, small and of no known size (the
    /// receive's limit bounds it).
    Memory(Mutex<Vec<u8>>),
}

impl Sink {
    pub fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::File(f) => f.write_all_at(data, offset),
            Sink::Ordered(r) => r.write(offset, data),
            Sink::Bundle(w) => w.write(offset, data),
            Sink::Landing(l) => l.write_at(data, offset),
            Sink::Memory(m) => {
                let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
                let at = usize::try_from(offset).map_err(std::io::Error::other)?;
                let end = at + data.len();
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[at..end].copy_from_slice(data);
                Ok(())
            }
            Sink::Discard => Ok(()),
        }
    }

    /// Reads back what was written at `offset`; None where nothing is kept to read (an
    /// ordered stream, a discarding sink).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Option<std::io::Result<()>> {
        match self {
            Sink::File(f) => Some(f.read_exact_at(buf, offset)),
            Sink::Landing(l) => Some(l.read_exact_at(buf, offset)),
            Sink::Ordered(_) | Sink::Discard | Sink::Bundle(_) | Sink::Memory(_) => None,
        }
    }

    /// What a memory sink holds (nothing for others).
    pub fn into_memory(self) -> Vec<u8> {
        match self {
            Sink::Memory(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
            _ => Vec::new(),
        }
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
///
/// A lost connection breaks that order: its blocks come again later, behind data that waiting
/// threads would no longer read, and the thread of the lost connection may itself be waiting
/// and never notice. So when resends can happen (an elastic transfer), blocks beyond the cap
/// wait in an unlinked temporary file instead, every connection keeps reading, and blocks that
/// arrive twice (in part or whole) are written once.
pub struct Reorder {
    state: Mutex<State>,
    moved: Condvar,
    cap: usize,
    /// How long a block may wait for the gap before it is a stalled transfer.
    stall: Duration,
}

struct State {
    next: u64,
    pending: BTreeMap<u64, Held>,
    /// Bytes held in memory (spilled ones do not count against the cap).
    pending_bytes: usize,
    spare: Vec<Vec<u8>>,
    out: Box<dyn Write + Send>,
    /// Blocks may arrive twice, and spill to `spill` rather than wait.
    resends: bool,
    /// Blocks at their own offsets (a sparse file), created when first needed.
    spill: Option<File>,
}

/// A block waiting for the gap before it.
enum Held {
    Memory(Vec<u8>),
    Spilled(u64),
}

impl Held {
    fn len(&self) -> u64 {
        match self {
            Held::Memory(b) => b.len() as u64,
            Held::Spilled(n) => *n,
        }
    }
}

impl Reorder {
    /// `resends`: the sender sends a lost connection's blocks again (an elastic transfer).
    pub fn new(out: Box<dyn Write + Send>, cap: usize, stall: Duration, resends: bool) -> Reorder {
        Reorder {
            state: Mutex::new(State {
                next: 0,
                pending: BTreeMap::new(),
                pending_bytes: 0,
                spare: Vec::new(),
                out,
                resends,
                spill: None,
            }),
            moved: Condvar::new(),
            cap,
            stall,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, mut offset: u64, mut data: &[u8]) -> std::io::Result<()> {
        let mut st = self.lock();
        loop {
            if offset < st.next {
                let end = offset + data.len() as u64;
                if !st.resends {
                    return Err(std::io::Error::other(format!(
                        "block at offset {offset} overlaps data already written (up to {})",
                        st.next
                    )));
                }
                // Sent again after a loss: only what is not out yet counts.
                if end <= st.next {
                    return Ok(());
                }
                data = &data[(st.next - offset) as usize..];
                offset = st.next;
            }
            if offset == st.next {
                st.out.write_all(data)?;
                st.next += data.len() as u64;
                st.drain()?;
                self.moved.notify_all();
                return Ok(());
            }
            if let Some(held) = st.pending.get(&offset) {
                if !st.resends {
                    return Err(std::io::Error::other(format!(
                        "two blocks at offset {offset}"
                    )));
                }
                if held.len() >= data.len() as u64 {
                    return Ok(());
                }
            }
            if st.pending_bytes + data.len() <= self.cap || st.pending.is_empty() {
                let mut buf = st.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(data);
                st.pending_bytes += data.len();
                if let Some(Held::Memory(old)) = st.pending.insert(offset, Held::Memory(buf)) {
                    st.pending_bytes -= old.len();
                }
                return Ok(());
            }
            if st.resends {
                if st.spill.is_none() {
                    st.spill = Some(tempfile::tempfile()?);
                }
                if let Some(f) = &st.spill {
                    f.write_all_at(data, offset)?;
                }
                let len = data.len() as u64;
                if let Some(Held::Memory(old)) = st.pending.insert(offset, Held::Spilled(len)) {
                    st.pending_bytes -= old.len();
                }
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
        let mut st = self.lock();
        if let Some(first) = st.pending.keys().next() {
            return Err(std::io::Error::other(format!(
                "data is missing between offsets {} and {first}",
                st.next
            )));
        }
        st.out.flush()
    }
}

impl State {
    /// Writes out the waiting blocks that now follow on. After a loss one may start before
    /// `next` (a block sent again): only its part past `next` goes out.
    fn drain(&mut self) -> std::io::Result<()> {
        while let Some(first) = self.pending.first_entry().filter(|e| *e.key() <= self.next) {
            let (at, held) = first.remove_entry();
            let end = at + held.len();
            if end > self.next {
                match &held {
                    Held::Memory(buf) => self.out.write_all(&buf[(self.next - at) as usize..])?,
                    Held::Spilled(_) => self.write_spilled(self.next, end)?,
                }
                self.next = end;
            }
            if let Held::Memory(buf) = held {
                self.pending_bytes -= buf.len();
                self.spare.push(buf);
            }
        }
        Ok(())
    }

    /// Writes out `[from, end)` of the spill file: part of one spilled write, so one read.
    fn write_spilled(&mut self, from: u64, end: u64) -> std::io::Result<()> {
        let Some(f) = &self.spill else {
            return Err(std::io::Error::other("spilled data without a spill file"));
        };
        let mut buf = vec![0u8; (end - from) as usize];
        f.read_exact_at(&mut buf, from)?;
        self.out.write_all(&buf)
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
            false,
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
            false,
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
            false,
        ));
        small.write(8, b"1234").unwrap();
        let e = small.write(20, b"5678").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }

    /// After a lost connection: the blocks after the gap do not fit in memory and must not
    /// wait (one thread here, as if every other connection were stuck behind them), and the
    /// lost connection's pieces come again, whole or in part, some already written out.
    #[test]
    fn with_resends_blocks_spill_instead_of_waiting_and_duplicates_are_written_once() {
        let out = Shared::default();
        let sink = Sink::Ordered(Reorder::new(
            Box::new(out.clone()),
            100,
            Duration::from_millis(50),
            true,
        ));
        let data: Vec<u8> = (0..2000u32).map(|i| (i * 13 % 251) as u8).collect();
        let put = |a: usize, b: usize| sink.write(a as u64, &data[a..b]).unwrap();
        put(0, 50);
        put(100, 150); // the lost connection got this far into [50, 300)
        for a in (300..2000).step_by(100) {
            put(a, a + 100); // 1700 bytes waiting: 100 in memory, the rest spilled
        }
        put(250, 350); // a resend overlapping what waits: both go out trimmed
        put(100, 150); // the same piece again
        put(50, 120); // part of the block again, ending inside the piece that waits in memory
        put(50, 300); // the whole block again, overlapping what waits
        put(0, 50); // and a piece that is out already
        sink.finish().unwrap();
        assert!(
            *out.0.lock().unwrap() == data,
            "bytes lost, doubled or out of order"
        );
    }
}
