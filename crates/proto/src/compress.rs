//! Compressed MODE E blocks, a braid extension (FEAT `BRAID 5`, then `OPTS BRAID
//! COMPRESS=auto|on|off`): a data block whose descriptor has [`desc::COMPRESSED`] carries,
//! instead of the file's bytes, a 6-byte prefix (the bytes it stands for, u32 big-endian, the
//! zstd level it was made at, and flags) and zstd data: the start of a zstd frame, or with
//! [`CONTINUES`] the next flushed piece of the frame the compressed block before it on the
//! same data connection began, so that each block has the history of those before it. A
//! receiver thus inflates a connection's compressed blocks in the order they came, with one
//! zstd context per connection, and each block to exactly the bytes it announced. Its header's offset is the file offset
//! as always and its count the bytes on the wire, so a receiver that unwraps it hands the
//! block checks an ordinary header for the original bytes: offsets, resume, range markers and
//! the whole-file checksum (over the original bytes) do not change.
//!
//! The codec itself lives with the data path; this module holds what both ends must agree on.

use crate::block::{BlockError, Header, desc};

/// The most bytes one compressed block may stand for. A receiver never inflates more than
/// this per block, whatever a hostile frame claims (a decompression bomb ends here).
pub const MAX_RAW: u64 = 4 << 20;

/// Bytes before the zstd data: the original length, the level and the flags.
pub const PREFIX_LEN: usize = 6;

/// Prefix flag: the zstd data continues the frame of the compressed block before it on this
/// connection (without it, a new frame starts and the receiver forgets the old one).
pub const CONTINUES: u8 = 0x01;

/// What each side of a session wants: `off` never compresses, `on` compresses every block
/// that shrinks, `auto` only while compressing moves the file faster than sending it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    Off,
    #[default]
    Auto,
    On,
}

impl Policy {
    pub fn parse(s: &str) -> Result<Policy, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(Policy::Off),
            "auto" => Ok(Policy::Auto),
            "on" => Ok(Policy::On),
            _ => Err(format!(
                "{s:?} is not a compression setting (auto, on or off)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Off => "off",
            Policy::Auto => "auto",
            Policy::On => "on",
        }
    }

    /// What a transfer does when its sender wants `self` and the other end `other`: off if
    /// either says off, on only if one says on and neither off.
    pub fn with(self, other: Policy) -> Policy {
        match (self, other) {
            (Policy::Off, _) | (_, Policy::Off) => Policy::Off,
            (Policy::On, _) | (_, Policy::On) => Policy::On,
            _ => Policy::Auto,
        }
    }
}

/// The prefix of a compressed block's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// Bytes of the file the block stands for.
    pub raw_len: u32,
    /// The zstd level it was compressed at (reported, not needed to decompress).
    pub level: i8,
    /// Whether it continues the frame of the connection's compressed block before it.
    pub continues: bool,
}

impl Prefix {
    pub fn encode(&self) -> [u8; PREFIX_LEN] {
        let mut out = [0u8; PREFIX_LEN];
        out[..4].copy_from_slice(&self.raw_len.to_be_bytes());
        out[4] = self.level as u8;
        out[5] = if self.continues { CONTINUES } else { 0 };
        out
    }
}

/// The header of a compressed block at `offset` whose payload (prefix and frame) is `wire`
/// bytes long.
pub fn header(offset: u64, wire: u64) -> Header {
    Header {
        descriptor: desc::COMPRESSED,
        count: wire,
        offset,
    }
}

/// Checks a compressed block's header before its payload is read: it must carry data and no
/// end of file, and its payload must fit what any block may stand for (so the receiver never
/// buffers more than [`MAX_RAW`] and the prefix).
pub fn check_header(h: &Header) -> Result<(), BlockError> {
    let bad = |why: String| Err(BlockError::Compressed(why));
    if h.is_eof() {
        return bad("the EOF block is marked compressed".into());
    }
    if h.count <= PREFIX_LEN as u64 {
        return bad(format!(
            "a {}-byte compressed block at offset {} is too short for its prefix",
            h.count, h.offset
        ));
    }
    if h.count > MAX_RAW + PREFIX_LEN as u64 {
        return bad(format!(
            "a compressed block at offset {} is {} bytes on the wire, more than the {MAX_RAW} \
             any block may stand for",
            h.offset, h.count
        ));
    }
    Ok(())
}

/// Reads a compressed block's prefix and gives the header of the original bytes it stands for
/// (the same offset and the other descriptor bits), to go through the ordinary block checks.
pub fn unwrap(h: &Header, payload: &[u8]) -> Result<(Prefix, Header), BlockError> {
    let Some(raw) = payload.get(..PREFIX_LEN) else {
        return Err(BlockError::Compressed("its prefix is cut short".into()));
    };
    let raw_len = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
    if raw_len == 0 || u64::from(raw_len) > MAX_RAW {
        return Err(BlockError::Compressed(format!(
            "the block at offset {} claims to stand for {raw_len} bytes (1 to {MAX_RAW} allowed)",
            h.offset
        )));
    }
    if raw[5] & !CONTINUES != 0 {
        return Err(BlockError::Compressed(format!(
            "the block at offset {} has prefix flags {:#04x}, which this version does not know",
            h.offset, raw[5]
        )));
    }
    let prefix = Prefix {
        raw_len,
        level: raw[4] as i8,
        continues: raw[5] & CONTINUES != 0,
    };
    let plain = Header {
        descriptor: h.descriptor & !desc::COMPRESSED,
        count: u64::from(raw_len),
        offset: h.offset,
    };
    if plain.offset.checked_add(plain.count).is_none() {
        return Err(BlockError::Overflow {
            offset: plain.offset,
            count: plain.count,
        });
    }
    Ok((prefix, plain))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{Completion, Connection, Next};

    #[test]
    fn policies_parse_and_combine() {
        for p in [Policy::Off, Policy::Auto, Policy::On] {
            assert_eq!(Policy::parse(p.name()), Ok(p));
        }
        assert_eq!(Policy::parse(" ON "), Ok(Policy::On));
        assert!(Policy::parse("zstd").is_err());
        assert_eq!(Policy::On.with(Policy::Off), Policy::Off);
        assert_eq!(Policy::Auto.with(Policy::On), Policy::On);
        assert_eq!(Policy::Auto.with(Policy::Auto), Policy::Auto);
    }

    #[test]
    fn a_compressed_header_decodes_and_unwraps_to_the_original_block() {
        let h = header(1 << 20, 300);
        let decoded = Header::decode(&h.encode()).expect("decodes");
        assert_eq!(decoded, h);
        check_header(&decoded).expect("sane");
        let mut payload = Prefix {
            raw_len: 65536,
            level: -3,
            continues: true,
        }
        .encode()
        .to_vec();
        payload.extend([0u8; 294]);
        let (prefix, plain) = unwrap(&decoded, &payload).expect("unwraps");
        assert_eq!(prefix.level, -3);
        assert!(prefix.continues);
        assert_eq!(plain, Header::data(1 << 20, 65536));
        // The unwrapped header is what the ordinary checks see.
        let mut c = Connection::new(Some(2 << 20));
        let next = c.header(&plain, &mut Completion::default());
        assert_eq!(
            next,
            Ok(Next::Payload {
                offset: 1 << 20,
                count: 65536
            })
        );
    }

    #[test]
    fn a_compressed_header_that_was_not_unwrapped_is_refused_by_the_block_checks() {
        let mut c = Connection::new(None);
        let got = c.header(&header(0, 100), &mut Completion::default());
        assert_eq!(got, Err(BlockError::UnknownDescriptor(desc::COMPRESSED)));
    }

    #[test]
    fn hostile_sizes_are_refused_before_anything_is_buffered_or_inflated() {
        assert!(check_header(&header(0, MAX_RAW + PREFIX_LEN as u64 + 1)).is_err());
        assert!(check_header(&header(0, PREFIX_LEN as u64)).is_err());
        let eof = Header {
            descriptor: desc::EOF | desc::EOD | desc::COMPRESSED,
            count: 0,
            offset: 1,
        };
        assert!(check_header(&eof).is_err());
        let too_big = Prefix {
            raw_len: MAX_RAW as u32 + 1,
            level: 1,
            continues: false,
        }
        .encode();
        assert!(unwrap(&header(0, 10), &too_big).is_err());
        let empty = Prefix {
            raw_len: 0,
            level: 1,
            continues: false,
        }
        .encode();
        assert!(unwrap(&header(0, 10), &empty).is_err());
        assert!(unwrap(&header(0, 10), &[0, 0]).is_err());
        let near_end = Prefix {
            raw_len: 16,
            level: 1,
            continues: false,
        }
        .encode();
        assert!(unwrap(&header(u64::MAX - 4, 10), &near_end).is_err());
        // Flags this version does not know are refused, not ignored.
        let mut unknown = Prefix {
            raw_len: 16,
            level: 1,
            continues: false,
        }
        .encode();
        unknown[5] = 0x02;
        assert!(unwrap(&header(0, 10), &unknown).is_err());
    }
}
