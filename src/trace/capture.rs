//! Reading pcap and pcapng files frame by frame, in a bounded buffer, so memory does not
//! grow with the capture.

use pcap_parser::pcapng::Block;
use pcap_parser::{PcapBlockOwned, PcapError};
use std::io::Read;

/// One captured frame.
pub struct Frame<'a> {
    /// Capture time, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    pub linktype: i32,
    pub data: &'a [u8],
}

/// How reading ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Complete,
    /// The file stops, or turns to garbage, part way: what came before was read.
    Damaged(String),
}

/// The buffer a capture is read through at first: packets are at most a snap length
/// (usually 256 KiB, often far less), so most captures never need more.
const FIRST_BUFFER: usize = 64 << 10;
/// The most the buffer grows to, for a block that does not fit: a bound on what a damaged
/// length field can make the reader allocate.
const BUFFER: usize = 1 << 20;

/// Calls `each` for every frame of the capture in `input`. Errors only when the input is not
/// a capture at all; damage later on ends the reading with [`End::Damaged`].
pub fn read(input: impl Read + Send, mut each: impl FnMut(Frame)) -> Result<End, String> {
    let mut capacity = FIRST_BUFFER;
    let input = Guarded {
        inner: input,
        blocks: BlockLengths::default(),
    };
    let mut reader = pcap_parser::create_reader(capacity, input).map_err(|e| match e {
        PcapError::Eof => "the file is empty".to_string(),
        PcapError::HeaderNotRecognized => "not a pcap or pcapng file".to_string(),
        e => format!("cannot read the capture header: {e:?}"),
    })?;
    // pcap: one link type and time unit; pcapng: one per interface.
    let mut legacy = (0i32, 1_000u64);
    let mut interfaces: Vec<(i32, u64, i64)> = Vec::new();
    // Refills in a row that did not complete a block: at the end of the file, a cut block.
    let mut stalled = 0;
    loop {
        match reader.next() {
            Ok((offset, block)) => {
                stalled = 0;
                match block {
                    PcapBlockOwned::LegacyHeader(h) => {
                        let unit = if h.is_nanosecond_precision() {
                            1
                        } else {
                            1_000
                        };
                        legacy = (h.network.0, unit);
                    }
                    PcapBlockOwned::Legacy(p) => each(Frame {
                        time_ns: u64::from(p.ts_sec) * 1_000_000_000
                            + u64::from(p.ts_usec) * legacy.1,
                        linktype: legacy.0,
                        data: p.data,
                    }),
                    PcapBlockOwned::NG(Block::SectionHeader(_)) => interfaces.clear(),
                    PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                        let per_second = idb.ts_resolution().unwrap_or(1_000_000).max(1);
                        interfaces.push((idb.linktype.0, per_second, idb.if_tsoffset));
                    }
                    PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                        if let Some(&(linktype, per_second, offset_s)) =
                            interfaces.get(epb.if_id as usize)
                        {
                            let ticks = (u64::from(epb.ts_high) << 32) | u64::from(epb.ts_low);
                            let ns = u128::from(ticks) * 1_000_000_000 / u128::from(per_second);
                            let ns = (ns as i128 + i128::from(offset_s) * 1_000_000_000).max(0);
                            each(Frame {
                                time_ns: ns as u64,
                                linktype,
                                data: epb.data,
                            });
                        }
                    }
                    PcapBlockOwned::NG(Block::SimplePacket(spb)) => {
                        // No timestamp: counted at time zero of the first interface.
                        if let Some(&(linktype, _, _)) = interfaces.first() {
                            each(Frame {
                                time_ns: 0,
                                linktype,
                                data: spb.data,
                            });
                        }
                    }
                    PcapBlockOwned::NG(_) => {}
                }
                reader.consume(offset);
            }
            Err(PcapError::Eof) => return Ok(End::Complete),
            Err(PcapError::Incomplete(_)) => {
                if stalled > 16 {
                    return Ok(End::Damaged(
                        "the capture ends in the middle of a packet".into(),
                    ));
                }
                stalled += 1;
                if reader.refill().is_err() {
                    return Ok(End::Damaged("cannot read further".into()));
                }
            }
            Err(PcapError::UnexpectedEof) => {
                return Ok(End::Damaged(
                    "the capture ends in the middle of a packet".into(),
                ));
            }
            Err(PcapError::BufferTooSmall) if capacity < BUFFER => {
                capacity = (capacity * 4).min(BUFFER);
                reader.grow(capacity);
                if reader.refill().is_err() {
                    return Ok(End::Damaged("cannot read further".into()));
                }
            }
            Err(PcapError::BufferTooSmall) => {
                return Ok(End::Damaged(format!(
                    "a block is larger than {BUFFER} bytes"
                )));
            }
            Err(e) => return Ok(End::Damaged(format!("malformed data: {e:?}"))),
        }
    }
}

/// A capture on its way to pcap-parser, with the length of every pcapng block checked first:
/// pcap-parser 0.17 subtracts 12 from a block's length without looking (a Process Information
/// Block of length 4 to 11 overflows; found by the capture_reader fuzz target).
struct Guarded<R> {
    inner: R,
    blocks: BlockLengths,
}

impl<R: Read> Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.blocks
            .feed(&buf[..n])
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(n)
    }
}

/// Follows the block structure of a pcapng stream (no I/O): a block starts with its type and
/// total length (in the byte order its section's header declares), and a length must be at
/// least 12 and a multiple of 4. A legacy pcap file is not looked into.
#[derive(Default)]
struct BlockLengths {
    /// The first four bytes were not a pcapng section header: nothing more to check.
    legacy: bool,
    /// Whether the first four bytes have been seen (and `legacy` says what they were).
    known: bool,
    big_endian: bool,
    /// The current block's first bytes (type, length and, in a section header, byte order).
    header: Vec<u8>,
    /// Bytes of the current block still to come, once its header is read.
    left: u64,
}

const SECTION_HEADER: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

impl BlockLengths {
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() && !self.legacy {
            if self.left > 0 {
                let skip = (bytes.len() as u64).min(self.left);
                self.left -= skip;
                bytes = &bytes[skip as usize..];
                continue;
            }
            // The type first, then as much more as the type says the header has.
            let need = |h: &[u8]| -> usize {
                if h.len() >= 4 && h[..4] == SECTION_HEADER {
                    12
                } else {
                    8
                }
            };
            let take = bytes
                .len()
                .min(need(&self.header).saturating_sub(self.header.len()));
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if !self.known && self.header.len() >= 4 {
                self.known = true;
                self.legacy = self.header[..4] != SECTION_HEADER;
                continue;
            }
            let section = need(&self.header) == 12;
            if self.header.len() < need(&self.header) {
                continue;
            }
            if section {
                let magic = [
                    self.header[8],
                    self.header[9],
                    self.header[10],
                    self.header[11],
                ];
                self.big_endian = match magic {
                    [0x1a, 0x2b, 0x3c, 0x4d] => true,
                    [0x4d, 0x3c, 0x2b, 0x1a] => false,
                    _ => return Err("a pcapng section with an unknown byte order".into()),
                };
            }
            let raw = [
                self.header[4],
                self.header[5],
                self.header[6],
                self.header[7],
            ];
            let len = if self.big_endian {
                u32::from_be_bytes(raw)
            } else {
                u32::from_le_bytes(raw)
            };
            if len < 12 || len % 4 != 0 {
                return Err(format!(
                    "a pcapng block with an impossible length ({len} bytes)"
                ));
            }
            self.left = u64::from(len) - self.header.len() as u64;
            self.header.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcapng_blocks_of_impossible_length_are_refused_before_the_parser() {
        // 28 bytes: a section header in the given byte order, with its fixed fields only.
        let section = |word: fn(u32) -> [u8; 4]| {
            let mut b = SECTION_HEADER.to_vec();
            b.extend_from_slice(&word(28));
            b.extend_from_slice(&word(0x1a2b_3c4d));
            b.extend_from_slice(&[1, 0, 0, 0]);
            b.extend_from_slice(&[0xff; 8]);
            b.extend_from_slice(&word(28));
            b
        };
        // A little-endian section and an interface block of 20 bytes, in pieces of every size.
        let mut ng = section(u32::to_le_bytes);
        ng.extend_from_slice(&1u32.to_le_bytes());
        ng.extend_from_slice(&20u32.to_le_bytes());
        ng.extend_from_slice(&[1, 0, 0, 0, 0, 0, 4, 0]);
        ng.extend_from_slice(&20u32.to_le_bytes());
        let feed_in = |bytes: &[u8], piece: usize| {
            let mut b = BlockLengths::default();
            bytes.chunks(piece).try_for_each(|c| b.feed(c))
        };
        for piece in 1..=ng.len() {
            assert_eq!(feed_in(&ng, piece), Ok(()), "pieces of {piece}");
        }
        // The crash the fuzz target found: a Process Information Block (type 0x80000008)
        // claiming 8 bytes, in a big-endian section.
        let mut bad = section(u32::to_be_bytes);
        bad.extend_from_slice(&0x8000_0008u32.to_be_bytes());
        bad.extend_from_slice(&8u32.to_be_bytes());
        for piece in [1, 3, 7, bad.len()] {
            let e = feed_in(&bad, piece).unwrap_err();
            assert!(e.contains("impossible length (8 bytes)"), "{e}");
        }
        // A length that is no multiple of 4, and a legacy pcap file, not looked into.
        let mut odd = ng[..28].to_vec();
        odd.extend_from_slice(&1u32.to_le_bytes());
        odd.extend_from_slice(&21u32.to_le_bytes());
        assert!(feed_in(&odd, 5).is_err());
        assert_eq!(feed_in(&[0xd4, 0xc3, 0xb2, 0xa1, 3, 0, 0, 0], 3), Ok(()));
    }

    fn pcap(frames: &[usize]) -> Vec<u8> {
        let mut f = 0xa1b2c3d4u32.to_le_bytes().to_vec();
        f.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&(1u32 << 20).to_le_bytes());
        f.extend_from_slice(&101u32.to_le_bytes());
        for &len in frames {
            f.extend_from_slice(&[0; 8]);
            f.extend_from_slice(&(len as u32).to_le_bytes());
            f.extend_from_slice(&(len as u32).to_le_bytes());
            f.extend(std::iter::repeat_n(0x45u8, len));
        }
        f
    }

    fn pcapng(frames: &[usize]) -> Vec<u8> {
        fn block(kind: u32, body: &[u8]) -> Vec<u8> {
            let len = (12 + body.len().div_ceil(4) * 4) as u32;
            let mut b = kind.to_le_bytes().to_vec();
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(body);
            b.resize(len as usize - 4, 0);
            b.extend_from_slice(&len.to_le_bytes());
            b
        }
        let mut shb = 0x1A2B_3C4Du32.to_le_bytes().to_vec();
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&(-1i64).to_le_bytes());
        let mut f = block(0x0A0D_0D0A, &shb);
        f.extend(block(1, &[101, 0, 0, 0, 0, 0, 0, 0]));
        for &len in frames {
            let mut epb = vec![0; 12];
            epb.extend_from_slice(&(len as u32).to_le_bytes());
            epb.extend_from_slice(&(len as u32).to_le_bytes());
            epb.extend(std::iter::repeat_n(0x45u8, len));
            f.extend(block(6, &epb));
        }
        f
    }

    fn lengths(file: &[u8]) -> (Vec<usize>, End) {
        let mut seen = Vec::new();
        let end = read(file, |f| seen.push(f.data.len())).unwrap();
        (seen, end)
    }

    /// The buffer starts small and grows for a frame that does not fit, up to its bound.
    #[test]
    fn frames_larger_than_the_first_buffer_are_read_and_oversized_ones_reported() {
        let sizes = [100, 100_000, 60, 300_000, 1000];
        for file in [pcap(&sizes), pcapng(&sizes)] {
            assert_eq!(lengths(&file), (sizes.to_vec(), End::Complete));
        }
        for file in [pcap(&[100, 2 << 20, 100]), pcapng(&[100, 2 << 20, 100])] {
            let (seen, end) = lengths(&file);
            assert_eq!(seen, [100]);
            assert!(
                matches!(&end, End::Damaged(why) if why.contains("larger than")),
                "{end:?}"
            );
        }
    }
}
