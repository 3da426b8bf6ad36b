//! Who is still sending in a MODE E transfer, and what the EOF block will say: the sender's
//! accounting as a pure state machine. `send.rs` keeps one under a mutex and takes it once
//! when a connection joins, idles, leaves or breaks (never per block).
//!
//! The rule it keeps: every connection that leaves normally sends EOD, the last one to leave
//! carries EOF with the number of EODs, and no connection joins after that. In an elastic
//! transfer an idle connection waits (blocks may come back from a broken one) until every
//! connection is idle; a retired one leaves at once unless it is the last one sending; a
//! broken one leaves without EOD.

/// The sender's roster of data connections.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Roster {
    /// Connections joined and not yet left.
    active: usize,
    /// Of those, how many found no block to send and wait (elastic only).
    idle: usize,
    /// EODs sent: the count the EOF block carries.
    eods: u64,
    /// The EOF block has been decided on: no connection may join any more.
    done: bool,
}

/// A connection leaving with EOD; `eof`: it is the last, and its EOF block carries this count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leave {
    pub eof: Option<u64>,
}

/// Every connection broke: nothing can send the rest (or the EOF block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllLost;

impl Roster {
    /// Counts a connection in; false once the EOF block was decided on (close it unused).
    pub fn admit(&mut self) -> bool {
        if self.done {
            return false;
        }
        self.active += 1;
        true
    }

    /// The last connection left with the EOF block.
    pub fn eof_sent(&self) -> bool {
        self.done
    }

    /// The sender has finished (EOF decided), or every connection is gone after at least one
    /// EOD.
    pub fn finished(&self) -> bool {
        self.done || (self.active == 0 && self.eods > 0)
    }

    /// A connection leaves with EOD.
    pub fn leave(&mut self) -> Leave {
        self.active -= 1;
        self.eods += 1;
        let last = self.active == 0;
        if last {
            self.done = true;
        }
        Leave {
            eof: last.then_some(self.eods),
        }
    }

    /// A connection found no block to send and waits.
    pub fn go_idle(&mut self) {
        self.idle += 1;
    }

    /// An idle connection has blocks to send again.
    pub fn wake(&mut self) {
        self.idle -= 1;
    }

    /// Every connection is idle: they may leave, one after another.
    pub fn all_idle(&self) -> bool {
        self.idle == self.active
    }

    /// An idle connection leaves (every connection being idle).
    pub fn leave_idle(&mut self) -> Leave {
        self.idle -= 1;
        self.leave()
    }

    /// A connection asked to stop (policy, or the receiver's half-close) leaves, unless it is
    /// the only one still sending.
    pub fn retire(&mut self) -> Option<Leave> {
        (self.active - self.idle > 1).then(|| self.leave())
    }

    /// A connection broke: it leaves without EOD. An error if none is left to carry on.
    pub fn lose(&mut self) -> Result<(), AllLost> {
        self.active -= 1;
        if self.active == 0 {
            Err(AllLost)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    //! The elastic protocol end to end, in memory: a sender (roster, block cursor, blocks sent
    //! again after a break) and a receiver (the EOD/EOF checks of `braid_proto::block` and the
    //! receiving state's bookkeeping), joined by per-connection FIFOs. Proptest picks the order
    //! of every event: connections joining, blocks taken, messages delivered, connections
    //! retired and connections breaking with messages still in flight.
    use super::*;
    use crate::engine::receive::Progress;
    use crate::engine::send::Blocks;
    use braid_proto::block::{Completion, Connection, Header, Next};
    use braid_proto::checksum::{self, ChunkSum};
    use braid_proto::ranges::RangeSet;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Side {
        Busy,
        Idle,
        Gone,
    }

    enum Msg {
        Block(u64, u64),
        End(Header),
    }

    struct Conn {
        side: Side,
        carried: Vec<(u64, u64)>,
        wire: VecDeque<Msg>,
        checks: Connection,
        /// The receiver gave up on it (it broke).
        dead: bool,
    }

    struct Model {
        data: Vec<u8>,
        blocks: Blocks,
        redo: Vec<(u64, u64)>,
        roster: Roster,
        conns: Vec<Conn>,
        completion: Completion,
        got: Progress,
        received: Vec<u8>,
        all_lost: bool,
    }

    impl Model {
        fn new(size: usize) -> Model {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 251) as u8).collect();
            let todo: RangeSet = [(0, size as u64)].into_iter().collect();
            Model {
                blocks: Blocks::new(&todo, checksum::CHUNK),
                received: vec![0; size],
                data,
                redo: Vec::new(),
                roster: Roster::default(),
                conns: Vec::new(),
                completion: Completion::default(),
                got: Progress::holding(RangeSet::new()),
                all_lost: false,
            }
        }

        fn join(&mut self) {
            if self.roster.admit() {
                let limit = Some(self.data.len() as u64);
                self.conns.push(Conn {
                    side: Side::Busy,
                    carried: Vec::new(),
                    wire: VecDeque::new(),
                    checks: Connection::new(limit),
                    dead: false,
                });
            }
        }

        fn send_end(&mut self, k: usize, l: Leave) {
            let h = match l.eof {
                Some(n) => Header::eof(n),
                None => Header::eod(),
            };
            self.conns[k].wire.push_back(Msg::End(h));
            self.conns[k].side = Side::Gone;
        }

        /// Connection k's sender takes a step: a block of about `want` bytes, or idling, or
        /// leaving.
        fn step(&mut self, k: usize, want: u64) {
            match self.conns[k].side {
                Side::Gone => {}
                Side::Idle => {
                    if !self.redo.is_empty() {
                        self.roster.wake();
                        self.conns[k].side = Side::Busy;
                    } else if self.roster.all_idle() {
                        let l = self.roster.leave_idle();
                        self.send_end(k, l);
                    }
                }
                Side::Busy => {
                    let next = self.redo.pop().or_else(|| self.blocks.take(want));
                    match next {
                        Some((o, n)) => {
                            self.conns[k].carried.push((o, n));
                            self.conns[k].wire.push_back(Msg::Block(o, n));
                        }
                        None => {
                            self.roster.go_idle();
                            self.conns[k].side = Side::Idle;
                        }
                    }
                }
            }
        }

        fn retire(&mut self, k: usize) {
            if self.conns[k].side == Side::Busy
                && let Some(l) = self.roster.retire()
            {
                self.send_end(k, l);
            }
        }

        /// Connection k breaks while sending (a sender learns of a break from a failed write):
        /// what is still on its wire never arrives.
        fn lose(&mut self, k: usize) {
            let c = &mut self.conns[k];
            if c.side != Side::Busy {
                return;
            }
            c.side = Side::Gone;
            c.dead = true;
            c.wire.clear();
            self.redo.append(&mut c.carried);
            if self.roster.lose().is_err() {
                self.all_lost = true;
            }
        }

        /// The receiver reads one message of connection k.
        fn deliver(&mut self, k: usize) -> Result<(), String> {
            let Some(m) = self.conns[k].wire.pop_front() else {
                return Ok(());
            };
            let c = &mut self.conns[k];
            let h = match m {
                Msg::Block(o, n) => Header::data(o, n),
                Msg::End(h) => h,
            };
            let next = c
                .checks
                .header(&h, &mut self.completion)
                .map_err(|e| e.to_string())?;
            if let Next::Payload { offset, count } = next
                && count > 0
            {
                let end = offset + count;
                let piece = &self.data[offset as usize..end as usize];
                self.received[offset as usize..end as usize].copy_from_slice(piece);
                let mut sum = ChunkSum::new();
                let ends_file = end == self.data.len() as u64;
                let aligned = sum.add(offset, piece, ends_file).is_ok();
                self.got.record(offset, end, aligned.then_some(sum));
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn connections_joining_leaving_and_breaking_never_lose_or_double_a_block(
            size in 0usize..400_000,
            start in 1usize..4,
            events in proptest::collection::vec((0u8..10, 0usize..8, 1u64..200_000), 0..300),
        ) {
            let mut m = Model::new(size);
            for _ in 0..start {
                m.join();
            }
            // Blocks of any size a sender may ask for: the cutter keeps them on chunks.
            for (what, k, want) in events {
                let k = k % m.conns.len().max(1);
                match what {
                    0 => m.join(),
                    1 => m.retire(k),
                    2 => m.lose(k),
                    3..=5 => m.step(k, want),
                    _ => m.deliver(k).map_err(TestCaseError::fail)?,
                }
                if m.all_lost {
                    // The transfer fails, cleanly: it cannot finish, and that is the error.
                    return Ok(());
                }
            }
            // The network drains and the senders finish: whatever happened before, the
            // receiver must end up complete, with every byte once.
            for _ in 0..100_000 {
                if m.roster.finished() && m.conns.iter().all(|c| c.wire.is_empty()) {
                    break;
                }
                for k in 0..m.conns.len() {
                    m.step(k, checksum::CHUNK);
                    m.deliver(k).map_err(TestCaseError::fail)?;
                }
            }
            prop_assert!(m.roster.finished());
            prop_assert!(m.completion.complete(), "EOF and EOD counts disagree");
            prop_assert!(m.got.ranges.covers(0, size as u64));
            prop_assert!(m.received == m.data);
            let sum = m.got.sum.expect("every block was aligned").finish(size as u64);
            prop_assert_eq!(sum, checksum::of(&m.data), "a block was counted twice or not at all");
        }
    }
}
