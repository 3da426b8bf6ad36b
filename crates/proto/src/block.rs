//! GridFTP extended block mode (MODE E): the 17-byte block header and the rules that say when
//! a transfer over several data connections is complete.
//!
//! Header: descriptor (1 byte), byte count (u64), offset (u64), big-endian. An EOF block
//! carries no data; its offset field is the number of data connections the receiver must see
//! EOD on. Waiting for EOD on the connections that happen to be open is not enough: another
//! one may still be on its way.

/// Length of a block header on the wire.
pub const HEADER_LEN: usize = 17;

/// Descriptor bits (GFD.20).
pub mod desc {
    /// End of record (legacy block mode; never used for files).
    pub const EOR: u8 = 0x80;
    /// End of file: no data follows; the offset field is the EOD count.
    pub const EOF: u8 = 0x40;
    /// Suspected errors (legacy).
    pub const ERRORS: u8 = 0x20;
    /// Restart marker (legacy; GFD.20 says not to use it in extended mode).
    pub const RESTART: u8 = 0x10;
    /// No more data on this connection for this transfer.
    pub const EOD: u8 = 0x08;
    /// The sender closes this connection after this block (otherwise it may be reused).
    pub const CLOSE: u8 = 0x04;
    /// braid's extension, only between peers that agreed on it: the payload is a
    /// compressed block ([`crate::compress`]), unwrapped before the block checks see it.
    pub const COMPRESSED: u8 = 0x02;
    /// Bits braid understands; any other bit is an error (as GFD.20 asks).
    pub const KNOWN: u8 = EOF | EOD | CLOSE | COMPRESSED;
}

/// One decoded block header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub descriptor: u8,
    pub count: u64,
    pub offset: u64,
}

/// A broken block stream: each one names what the peer did wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("block header has descriptor bits 0x{0:02x} that extended block mode does not define")]
    UnknownDescriptor(u8),
    #[error("EOF block carries {0} bytes of data; it must carry none")]
    DataInEof(u64),
    #[error("EOF block announces {0} data connections; it must be at least 1")]
    BadEodCount(u64),
    #[error("a second EOF block arrived (first announced {first}, now {second} connections)")]
    SecondEof { first: u64, second: u64 },
    #[error(
        "EOD arrived on {seen} data connections, more than the {expected} the EOF block announced"
    )]
    TooManyEods { seen: u64, expected: u64 },
    #[error("block at offset {offset} with {count} bytes ends past {limit}, the file's size")]
    PastEnd { offset: u64, count: u64, limit: u64 },
    #[error("block at offset {offset} with {count} bytes overflows a 64-bit offset")]
    Overflow { offset: u64, count: u64 },
    #[error("data arrived on a connection after its EOD")]
    DataAfterEod,
    #[error("a data connection closed before its EOD ({0})")]
    ClosedBeforeEod(String),
    #[error(
        "block at offset {offset} with {count} bytes ends past {room}, more than the disk can hold"
    )]
    PastRoom { offset: u64, count: u64, room: u64 },
    #[error(
        "block at offset {offset} with {count} bytes overlaps a block still arriving on another connection"
    )]
    Overlapping { offset: u64, count: u64 },
    #[error("block at offset {offset} carries different bytes than already arrived there")]
    Conflicting { offset: u64 },
    #[error(
        "the blocks received so far leave more than {0} separate pieces: too fragmented to keep track of"
    )]
    TooFragmented(usize),
    #[error("a compressed block is broken: {0}")]
    Compressed(String),
}

impl Header {
    pub fn data(offset: u64, count: u64) -> Header {
        Header {
            descriptor: 0,
            count,
            offset,
        }
    }

    /// The last header on a connection that does not also end the file.
    pub fn eod() -> Header {
        Header {
            descriptor: desc::EOD | desc::CLOSE,
            count: 0,
            offset: 0,
        }
    }

    /// The last header of the transfer: EOD for this connection and EOF for the file, telling
    /// the receiver how many connections to expect EOD on.
    pub fn eof(connections: u64) -> Header {
        Header {
            descriptor: desc::EOF | desc::EOD | desc::CLOSE,
            count: 0,
            offset: connections,
        }
    }

    /// The same end-of-connection header without CLOSE: the connection stays open for the
    /// session's next transfer (GridFTP data-channel caching).
    pub fn keeping_connection(self) -> Header {
        Header {
            descriptor: self.descriptor & !desc::CLOSE,
            ..self
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.descriptor;
        out[1..9].copy_from_slice(&self.count.to_be_bytes());
        out[9..17].copy_from_slice(&self.offset.to_be_bytes());
        out
    }

    /// Decodes and checks one header on its own; [`Connection`] and [`Completion`] check the
    /// sequence.
    pub fn decode(raw: &[u8; HEADER_LEN]) -> Result<Header, BlockError> {
        let mut count = [0u8; 8];
        let mut offset = [0u8; 8];
        count.copy_from_slice(&raw[1..9]);
        offset.copy_from_slice(&raw[9..17]);
        let h = Header {
            descriptor: raw[0],
            count: u64::from_be_bytes(count),
            offset: u64::from_be_bytes(offset),
        };
        if h.descriptor & !desc::KNOWN != 0 {
            return Err(BlockError::UnknownDescriptor(h.descriptor & !desc::KNOWN));
        }
        if h.is_eof() {
            // Globus leaves the count field 0; it is "unused", so data there is a lie.
            if h.count != 0 {
                return Err(BlockError::DataInEof(h.count));
            }
            if h.offset == 0 {
                return Err(BlockError::BadEodCount(0));
            }
        } else if h.offset.checked_add(h.count).is_none() {
            return Err(BlockError::Overflow {
                offset: h.offset,
                count: h.count,
            });
        }
        Ok(h)
    }

    pub fn is_eof(&self) -> bool {
        self.descriptor & desc::EOF != 0
    }

    pub fn is_eod(&self) -> bool {
        self.descriptor & desc::EOD != 0
    }

    /// Bytes of payload that follow this header.
    pub fn payload(&self) -> u64 {
        if self.is_eof() { 0 } else { self.count }
    }
}

/// What a receiving connection does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Read `count` bytes of payload and store them at `offset`, then read the next header.
    Payload { offset: u64, count: u64 },
    /// This connection is finished for this transfer.
    Done,
}

/// The checks one receiving data connection applies to its headers.
#[derive(Debug, Clone)]
pub struct Connection {
    /// Bytes past which no block may reach (the file's size when it is known).
    limit: Option<u64>,
    finished: bool,
    /// The sender ended with EOD but without CLOSE: the connection may carry the next transfer.
    reusable: bool,
}

impl Connection {
    pub fn new(limit: Option<u64>) -> Connection {
        Connection {
            limit,
            finished: false,
            reusable: false,
        }
    }

    /// Takes one header. EOD and EOF are also reported to the transfer's [`Completion`].
    pub fn header(&mut self, h: &Header, completion: &mut Completion) -> Result<Next, BlockError> {
        if self.finished {
            return Err(BlockError::DataAfterEod);
        }
        // A compressed block reaches here unwrapped, or from a sender that was not asked to
        // compress: then the bit is one this transfer does not define.
        if h.descriptor & desc::COMPRESSED != 0 {
            return Err(BlockError::UnknownDescriptor(desc::COMPRESSED));
        }
        if let Some(limit) = self.limit
            && !h.is_eof()
            && h.offset + h.count > limit
        {
            return Err(BlockError::PastEnd {
                offset: h.offset,
                count: h.count,
                limit,
            });
        }
        if h.is_eof() {
            completion.eof(h.offset)?;
        }
        if h.is_eod() {
            self.finished = true;
            self.reusable = h.descriptor & desc::CLOSE == 0;
            completion.eod()?;
        }
        match (h.payload(), self.finished) {
            (0, true) => Ok(Next::Done),
            (0, false) => Ok(Next::Payload {
                offset: h.offset,
                count: 0,
            }),
            // EOD on a block with data: store it, then this connection is done.
            (count, _) => Ok(Next::Payload {
                offset: h.offset,
                count,
            }),
        }
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Finished, and the sender did not set CLOSE.
    pub fn reusable(&self) -> bool {
        self.reusable
    }
}

/// Counts EODs against the EOF block's announcement, across all of a transfer's connections.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    expected: Option<u64>,
    eods: u64,
}

impl Completion {
    pub fn eof(&mut self, count: u64) -> Result<(), BlockError> {
        if let Some(first) = self.expected {
            return Err(BlockError::SecondEof {
                first,
                second: count,
            });
        }
        if count == 0 {
            return Err(BlockError::BadEodCount(0));
        }
        self.expected = Some(count);
        self.check()
    }

    pub fn eod(&mut self) -> Result<(), BlockError> {
        self.eods += 1;
        self.check()
    }

    fn check(&self) -> Result<(), BlockError> {
        match self.expected {
            Some(expected) if self.eods > expected => Err(BlockError::TooManyEods {
                seen: self.eods,
                expected,
            }),
            _ => Ok(()),
        }
    }

    /// The transfer has all its data: every announced connection sent EOD.
    pub fn complete(&self) -> bool {
        self.expected == Some(self.eods)
    }

    /// Connections still owed (when the EOF block has arrived).
    pub fn outstanding(&self) -> Option<u64> {
        self.expected.map(|e| e - self.eods.min(e))
    }
}

/// How far the bytes waiting on a connection reach into its part of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// They hold it whole: this many bytes, through its EOD header.
    Whole(usize),
    /// They end before its EOD; knowing more takes at least this many bytes.
    Short(usize),
    /// A header in them does not decode: the receiver will say why.
    Broken,
}

/// Where a connection's part of a transfer ends in `prefix`, the bytes waiting on it, read
/// ahead without taking them: a receiver that finds the whole of it already there can read it
/// without ever waiting for the sender.
pub fn waiting(prefix: &[u8]) -> Waiting {
    let mut at = 0usize;
    loop {
        let Some(raw) = prefix
            .get(at..at.saturating_add(HEADER_LEN))
            .and_then(|h| <&[u8; HEADER_LEN]>::try_from(h).ok())
        else {
            return Waiting::Short(at.saturating_add(HEADER_LEN));
        };
        let Ok(h) = Header::decode(raw) else {
            return Waiting::Broken;
        };
        let Some(next) = usize::try_from(h.payload())
            .ok()
            .and_then(|p| at.checked_add(HEADER_LEN)?.checked_add(p))
        else {
            return Waiting::Short(usize::MAX);
        };
        if h.is_eod() {
            return if next <= prefix.len() {
                Waiting::Whole(next)
            } else {
                Waiting::Short(next)
            };
        }
        at = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_bytes_captured_from_globus_url_copy() {
        // research/protocol.md §1.2: conn1 data block, then EOF|EOD with 4 connections.
        let raw: [u8; 17] = [
            0x00, 0, 0, 0, 0, 0, 0x0d, 0xc6, 0xc0, 0, 0, 0, 0, 0, 0x20, 0, 0,
        ];
        assert_eq!(Header::decode(&raw), Ok(Header::data(0x200000, 902848)));
        let eof: [u8; 17] = [0x48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4];
        let h = Header::decode(&eof).unwrap();
        assert!(h.is_eof() && h.is_eod() && h.offset == 4 && h.payload() == 0);
    }

    proptest! {
        #[test]
        fn headers_round_trip(d in proptest::sample::select(vec![0u8, desc::EOD, desc::EOD | desc::CLOSE]),
                              count in 0u64..u64::MAX / 2, offset in 0u64..u64::MAX / 2) {
            let h = Header { descriptor: d, count, offset };
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn decode_never_panics(raw in proptest::array::uniform17(any::<u8>())) {
            let _ = Header::decode(&raw);
        }
    }

    #[test]
    fn rejects_what_gfd20_leaves_undefined_or_contradictory() {
        let mut raw = Header::data(0, 1).encode();
        raw[0] = desc::RESTART;
        assert_eq!(
            Header::decode(&raw),
            Err(BlockError::UnknownDescriptor(0x10))
        );
        raw[0] = 0x01;
        assert_eq!(
            Header::decode(&raw),
            Err(BlockError::UnknownDescriptor(0x01))
        );
        let mut eof = Header::eof(2);
        eof.count = 5;
        assert_eq!(Header::decode(&eof.encode()), Err(BlockError::DataInEof(5)));
        assert_eq!(
            Header::decode(&Header::eof(0).encode()),
            Err(BlockError::BadEodCount(0))
        );
        let over = Header::data(u64::MAX - 1, 2);
        assert!(matches!(
            Header::decode(&over.encode()),
            Err(BlockError::Overflow { .. })
        ));
    }

    #[test]
    fn complete_only_when_every_announced_connection_sent_eod() {
        let mut c = Completion::default();
        let mut a = Connection::new(Some(100));
        let mut b = Connection::new(Some(100));
        assert_eq!(
            a.header(&Header::data(0, 60), &mut c),
            Ok(Next::Payload {
                offset: 0,
                count: 60
            })
        );
        assert_eq!(a.header(&Header::eod(), &mut c), Ok(Next::Done));
        assert!(!a.reusable(), "EOD with CLOSE: the connection goes away");
        // EOD on every open connection, but EOF says three: a third is still coming.
        assert_eq!(
            b.header(&Header::eof(3).keeping_connection(), &mut c),
            Ok(Next::Done)
        );
        assert!(
            b.reusable(),
            "EOD without CLOSE: cached for the next transfer"
        );
        assert!(!c.complete());
        assert_eq!(c.outstanding(), Some(1));
        let mut late = Connection::new(Some(100));
        assert_eq!(
            late.header(&Header::data(60, 40), &mut c),
            Ok(Next::Payload {
                offset: 60,
                count: 40
            })
        );
        assert!(!c.complete());
        late.header(&Header::eod(), &mut c).unwrap();
        assert!(c.complete());
        // A fourth EOD is a lie about the count.
        let mut extra = Connection::new(Some(100));
        assert!(matches!(
            extra.header(&Header::eod(), &mut c),
            Err(BlockError::TooManyEods { .. })
        ));
    }

    #[test]
    fn sequence_errors_are_reported() {
        let mut c = Completion::default();
        let mut a = Connection::new(Some(10));
        assert!(matches!(
            a.header(&Header::data(5, 6), &mut c),
            Err(BlockError::PastEnd { .. })
        ));
        a.header(&Header::eod(), &mut c).unwrap();
        assert_eq!(
            a.header(&Header::data(0, 1), &mut c),
            Err(BlockError::DataAfterEod)
        );
        let mut b = Connection::new(None);
        b.header(&Header::eof(2), &mut c).unwrap();
        let mut d = Connection::new(None);
        assert!(matches!(
            d.header(&Header::eof(2), &mut c),
            Err(BlockError::SecondEof { .. })
        ));
    }

    #[test]
    fn waiting_finds_the_eod_that_ends_a_connections_part() {
        let data = Header::data(0, 5).encode();
        let end = Header::eof(1).keeping_connection().encode();
        let mut stream = data.to_vec();
        stream.extend_from_slice(b"hello");
        stream.extend_from_slice(&end);
        let whole = stream.len();
        // The next file's blocks may follow on a kept connection: they are not counted.
        stream.extend_from_slice(&Header::data(0, 3).encode());
        assert_eq!(waiting(&stream), Waiting::Whole(whole));
        assert_eq!(waiting(&stream[..whole]), Waiting::Whole(whole));
        assert_eq!(waiting(&stream[..whole - 1]), Waiting::Short(whole));
        assert_eq!(waiting(&stream[..3]), Waiting::Short(HEADER_LEN));
        assert_eq!(waiting(&stream[..HEADER_LEN + 2]), Waiting::Short(whole));
        // An empty file: its EOF header alone.
        assert_eq!(waiting(&end), Waiting::Whole(HEADER_LEN));
        // EOD on a block that carries data.
        let mut last = Header::data(0, 2);
        last.descriptor = desc::EOD;
        let mut one = last.encode().to_vec();
        one.extend_from_slice(b"ab");
        assert_eq!(waiting(&one), Waiting::Whole(HEADER_LEN + 2));
        let mut bad = stream.clone();
        bad[0] = 0x01;
        assert_eq!(waiting(&bad), Waiting::Broken);
    }

    proptest! {
        #[test]
        fn waiting_never_claims_more_than_it_was_given(
            prefix in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            if let Waiting::Whole(n) = waiting(&prefix) {
                prop_assert!(n <= prefix.len());
            }
        }
    }
}
