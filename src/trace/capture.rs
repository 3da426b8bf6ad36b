//! Reading pcap and pcapng files frame by frame, in a fixed-size buffer, so memory does not
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

const BUFFER: usize = 1 << 20;

/// Calls `each` for every frame of the capture in `input`. Errors only when the input is not
/// a capture at all; damage later on ends the reading with [`End::Damaged`].
pub fn read(input: impl Read + Send, mut each: impl FnMut(Frame)) -> Result<End, String> {
    let mut reader = pcap_parser::create_reader(BUFFER, input).map_err(|e| match e {
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
            Err(PcapError::BufferTooSmall) => {
                return Ok(End::Damaged(format!(
                    "a block is larger than {BUFFER} bytes"
                )));
            }
            Err(e) => return Ok(End::Damaged(format!("malformed data: {e:?}"))),
        }
    }
}
