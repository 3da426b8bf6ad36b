//! zstd for compressed MODE E blocks (their framing is `braid_proto::compress`): one packer
//! per sending connection and one unpacker per receiving one, each with its buffers and zstd
//! context made once, and the transfer's count of what compression saved.

use braid_proto::compress::{MAX_RAW, PREFIX_LEN, Policy, Prefix};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use zstd::stream::raw::{DParameter, Decoder, Operation};
use zstd::zstd_safe::{CCtx, CParameter, InBuffer, OutBuffer, ResetDirective};

/// A compressed block is sent only when it saves at least this share of its bytes: below
/// that the receiver's work and the sender's copy cost more than the wire time they save.
const LEAST_SAVING: usize = 16;

/// Compresses blocks on one connection as one zstd stream: each block a flushed piece of the
/// current frame, so that it has the history of the blocks before it (web logs at level 16 in
/// 1 MiB blocks: 1/5.5 of their size as frames of their own, about 1/5.9 so). A new frame
/// starts at a level change and after a block that went plain, which the stream never saw.
/// Its zstd contexts count against a [`Budget`] shared by the whole process.
pub struct Packer {
    budget: &'static Budget,
    /// The stream's context, made for its level.
    stream: Option<Context>,
    /// A context for samples, while the connection sends plain (it has no stream then).
    sampler: Option<Context>,
    /// The prefix and data of the last block packed.
    out: Vec<u8>,
}

impl Default for Packer {
    fn default() -> Self {
        Packer::within(&BUDGET)
    }
}

/// The window a frame may use: 4 MiB, the most one block stands for; the receiver allows
/// twice that.
const WINDOW_LOG: u32 = 22;

/// The memory the zstd contexts of all connections of this process may hold at once: a
/// context at level 12 holds 47 MB, at 16 39 MB (their match tables), so without a bound
/// a server's downloads on slow paths, or a client's many connections, would take gigabytes.
/// A connection climbs only to levels whose context fits beside the others' (and sends
/// plain when none does).
pub static BUDGET: Budget = Budget::new(256 << 20);

/// Bytes of contexts held, against a most.
pub struct Budget {
    held: AtomicUsize,
    most: usize,
}

impl Budget {
    pub const fn new(most: usize) -> Budget {
        Budget {
            held: AtomicUsize::new(0),
            most,
        }
    }

    fn reserve(&'static self, bytes: usize) -> Option<Reserved> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= self.most).then_some(held + bytes)
            })
            .ok()
            .map(|_| Reserved {
                budget: self,
                bytes,
            })
    }
}

struct Reserved {
    budget: &'static Budget,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A zstd compression context and the memory it is counted for.
struct Context {
    zstd: CCtx<'static>,
    level: i32,
    /// A frame is open: the next block continues it.
    open: bool,
    reserved: Reserved,
}

impl Context {
    /// A context for `level` with a 4 MiB window, if its memory fits in `budget`.
    fn new(budget: &'static Budget, level: i32) -> Option<Context> {
        let reserved = budget.reserve(memory(level))?;
        let mut zstd = CCtx::try_create()?;
        zstd.set_parameter(CParameter::CompressionLevel(level))
            .ok()?;
        zstd.set_parameter(CParameter::WindowLog(WINDOW_LOG)).ok()?;
        Some(Context {
            zstd,
            level,
            open: false,
            reserved,
        })
    }
}

/// What a context at `level` holds with a 4 MiB window once it has compressed a block,
/// rounded up from `ZSTD_sizeof_CCtx` with zstd 1.5.7 (a test holds it to the zstd linked):
/// mostly its hash and chain tables, which grow with the level.
fn memory(level: i32) -> usize {
    let mb = match level {
        ..=2 => 6,
        3..=5 => 7,
        6..=8 => 9,
        9..=11 => 17,
        12..=15 => 48,
        16..=17 => 40,
        _ => 90,
    };
    mb << 20
}

impl Packer {
    /// A packer whose contexts count against `budget`.
    pub fn within(budget: &'static Budget) -> Packer {
        Packer {
            budget,
            stream: None,
            sampler: None,
            out: Vec::new(),
        }
    }

    /// The highest of `levels` (lowest first) whose context would fit in the budget beside
    /// the others' (this packer's own counted as free), as an index; None when not even the
    /// lowest does.
    pub fn highest_fitting(&self, levels: &[i32]) -> Option<usize> {
        let own = [&self.stream, &self.sampler]
            .into_iter()
            .flatten()
            .map(|c| c.reserved.bytes)
            .sum::<usize>();
        let free =
            (self.budget.most + own).saturating_sub(self.budget.held.load(Ordering::Acquire));
        levels.iter().rposition(|&l| memory(l) <= free)
    }

    /// The prefix and zstd data for `raw` at `level`, or None when it does not shrink by at
    /// least a sixteenth (random or already compressed data: then it goes as it is), or when
    /// no context for `level` fits in the budget.
    pub fn pack(&mut self, raw: &[u8], level: i32) -> Option<&[u8]> {
        if raw.is_empty() || raw.len() as u64 > MAX_RAW {
            return None;
        }
        // Compressing: no samples are taken until the connection goes plain again.
        self.sampler = None;
        if self.stream.as_ref().is_some_and(|c| c.level != level) {
            // A context of the level's own size: the tables of a higher one are let go.
            self.stream = None;
        }
        let context = match &mut self.stream {
            Some(c) => c,
            None => self.stream.insert(Context::new(self.budget, level)?),
        };
        // Room for data that saves enough and no more.
        let room = raw.len() - raw.len() / LEAST_SAVING;
        if self.out.len() < PREFIX_LEN + room {
            self.out.resize(PREFIX_LEN + room, 0);
        }
        let continues = context.open;
        let n = Self::flushed(
            &mut context.zstd,
            raw,
            &mut self.out[PREFIX_LEN..PREFIX_LEN + room],
        );
        let Some(n) = n else {
            // What the stream took in will never reach the receiver: a new frame next time.
            context.open = false;
            let _ = context.zstd.reset(ResetDirective::SessionOnly);
            return None;
        };
        context.open = true;
        let prefix = Prefix {
            raw_len: raw.len() as u32,
            level: level.clamp(i8::MIN.into(), i8::MAX.into()) as i8,
            continues,
        };
        self.out[..PREFIX_LEN].copy_from_slice(&prefix.encode());
        Some(&self.out[..PREFIX_LEN + n])
    }

    /// Feeds `raw` to the stream and flushes it into `out`: the bytes written, or None when
    /// they do not fit.
    fn flushed(zstd: &mut CCtx<'static>, raw: &[u8], out: &mut [u8]) -> Option<usize> {
        let mut input = InBuffer::around(raw);
        let mut output = OutBuffer::around(out);
        while input.pos() < raw.len() {
            zstd.compress_stream(&mut output, &mut input).ok()?;
            if output.pos() == output.capacity() && input.pos() < raw.len() {
                return None;
            }
        }
        loop {
            let left = zstd.flush_stream(&mut output).ok()?;
            if left == 0 {
                return Some(output.pos());
            }
            if output.pos() == output.capacity() {
                return None;
            }
        }
    }

    /// How many bytes `sample` compresses to at `level`, by a context of its own (the
    /// connection sends plain while it samples, so its stream's context is let go); its
    /// length when no context fits in the budget.
    pub fn sample(&mut self, sample: &[u8], level: i32) -> usize {
        self.stream = None;
        if self.sampler.is_none() {
            self.sampler = Context::new(self.budget, level);
        }
        let Some(context) = &mut self.sampler else {
            return sample.len();
        };
        if context
            .zstd
            .set_parameter(CParameter::CompressionLevel(level))
            .is_err()
        {
            return sample.len();
        }
        let room = sample.len() - sample.len() / LEAST_SAVING;
        if self.out.len() < room {
            self.out.resize(room, 0);
        }
        context
            .zstd
            .compress2(&mut self.out[..room], sample)
            .unwrap_or(sample.len())
    }
}

/// Inflates a connection's compressed blocks, in the order they came, never past what each
/// prefix announced.
#[derive(Default)]
pub struct Unpacker {
    zstd: Option<Decoder<'static>>,
    /// A frame is open, which a block that continues it needs.
    open: bool,
    out: Vec<u8>,
}

impl Unpacker {
    /// The `prefix.raw_len` bytes `data` stands for; an error says why it is broken (data
    /// that inflates to more or fewer bytes than announced, or continues no frame, included).
    pub fn unpack(&mut self, prefix: Prefix, data: &[u8]) -> Result<&[u8], String> {
        let zstd = match &mut self.zstd {
            Some(z) => z,
            None => {
                let mut z = Decoder::new().map_err(|e| format!("cannot start zstd: {e}"))?;
                z.set_parameter(DParameter::WindowLogMax(WINDOW_LOG + 1))
                    .map_err(|e| format!("cannot start zstd: {e}"))?;
                self.zstd.insert(z)
            }
        };
        if !prefix.continues {
            zstd.reinit()
                .map_err(|e| format!("cannot restart zstd: {e}"))?;
        } else if !self.open {
            return Err("it continues a zstd frame that no block before it began".into());
        }
        // Until it inflates whole the stream is broken: nothing after it can continue it.
        self.open = false;
        let want = prefix.raw_len as usize;
        // One byte more than announced, to tell data that is too long from an exact one.
        if self.out.len() < want + 1 {
            self.out.resize(want + 1, 0);
        }
        let mut input = InBuffer::around(data);
        let mut output = OutBuffer::around(&mut self.out[..want + 1]);
        let broken = |e: std::io::Error| {
            format!("zstd cannot inflate it into the {want} bytes its prefix announced ({e})")
        };
        while input.pos() < data.len() && output.pos() <= want {
            let before = (input.pos(), output.pos());
            zstd.run(&mut input, &mut output).map_err(broken)?;
            if (input.pos(), output.pos()) == before {
                break;
            }
        }
        // Whatever the decoder still holds for this block.
        if output.pos() <= want {
            zstd.run(&mut InBuffer::around(&[]), &mut output)
                .map_err(broken)?;
        }
        let n = output.pos();
        if n != want || input.pos() != data.len() {
            return Err(format!(
                "it inflates to {}, not the {want} bytes its prefix announced",
                if n > want {
                    "more".to_string()
                } else if input.pos() != data.len() {
                    format!("{n} bytes with {} left over", data.len() - input.pos())
                } else {
                    format!("{n} bytes")
                }
            ));
        }
        self.open = true;
        Ok(&self.out[..want])
    }
}

/// A transfer's compression: what its ends agreed on, and what it did.
#[derive(Debug, Default)]
pub struct Compression {
    /// None: not agreed on, so a compressed block is a protocol error. `Some(Off)`: the peer
    /// may send compressed blocks, this side sends none.
    policy: Option<Policy>,
    /// Payload bytes on the wire (compressed blocks as sent, plain blocks as they are).
    wire: AtomicU64,
    /// Bytes of the file that went in compressed blocks.
    packed_raw: AtomicU64,
    blocks: AtomicU64,
    /// The zstd levels blocks were made at: bit `level + LEVEL_BIAS`.
    levels: AtomicU32,
}

const LEVEL_BIAS: i32 = 8;

/// What compression did in one transfer, as `-v` and `--json` report it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Payload bytes that crossed the network for the file's bytes.
    pub wire_bytes: u64,
    /// Blocks that went compressed, and the bytes of the file they stood for.
    pub compressed_blocks: u64,
    pub compressed_bytes: u64,
    /// The zstd levels used, lowest first.
    pub levels: Vec<i32>,
}

impl Compression {
    pub fn new(policy: Option<Policy>) -> Compression {
        Compression {
            policy,
            ..Compression::default()
        }
    }

    /// Whether the peer may send compressed blocks.
    pub fn agreed(&self) -> bool {
        self.policy.is_some()
    }

    /// What this side does as the sender.
    pub fn sending(&self) -> Policy {
        self.policy.unwrap_or(Policy::Off)
    }

    pub fn plain(&self, bytes: u64) {
        self.wire.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn packed(&self, raw: u64, wire: u64, level: i32) {
        self.wire.fetch_add(wire, Ordering::Relaxed);
        self.packed_raw.fetch_add(raw, Ordering::Relaxed);
        self.blocks.fetch_add(1, Ordering::Relaxed);
        let bit = (level + LEVEL_BIAS).clamp(0, 31) as u32;
        self.levels.fetch_or(1 << bit, Ordering::Relaxed);
    }

    pub fn report(&self) -> Report {
        let bits = self.levels.load(Ordering::Relaxed);
        Report {
            wire_bytes: self.wire.load(Ordering::Relaxed),
            compressed_blocks: self.blocks.load(Ordering::Relaxed),
            compressed_bytes: self.packed_raw.load(Ordering::Relaxed),
            levels: (0..32)
                .filter(|b| bits & (1 << b) != 0)
                .map(|b| b - LEVEL_BIAS)
                .collect(),
        }
    }
}

/// Entry points for `fuzz/`.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;
    use braid_proto::block::{HEADER_LEN, Header};

    /// Compressed blocks from a hostile peer (each a header, a prefix and zstd data), taken
    /// as a receiving connection takes them, with one zstd context, until one is refused:
    /// whatever they claim, nothing past [`MAX_RAW`] is buffered or inflated per block, and
    /// what inflates is exactly what its prefix announced, also for blocks that continue a
    /// frame. Returns how many blocks inflated.
    pub fn compressed_block(mut data: &[u8]) -> usize {
        let mut unpacker = Unpacker::default();
        let mut inflated = 0;
        while let Some((raw, rest)) = data.split_first_chunk::<HEADER_LEN>() {
            let Ok(h) = Header::decode(raw) else { break };
            if braid_proto::compress::check_header(&h).is_err() {
                break;
            }
            assert!(h.count <= MAX_RAW + PREFIX_LEN as u64);
            let (payload, next) = rest.split_at(rest.len().min(h.count as usize));
            data = next;
            let Ok((prefix, plain)) = braid_proto::compress::unwrap(&h, payload) else {
                break;
            };
            assert!(plain.count <= MAX_RAW);
            match unpacker.unpack(prefix, &payload[PREFIX_LEN..]) {
                Ok(bytes) => assert_eq!(bytes.len() as u64, plain.count),
                Err(_) => break,
            }
            inflated += 1;
        }
        inflated
    }

    /// Most bytes [`mode_z_stream`] inflates: the part a caller's own limit plays in braid
    /// (a download's announced size, an upload's quota and disk).
    pub const MODE_Z_LIMIT: u64 = 16 << 20;

    /// A MODE Z stream from a hostile peer, through the reader the server's uploads and the
    /// client's downloads inflate with (flate2's zlib decoder), read in pieces as the copy
    /// loops read: it ends, fails, or is cut at the limit, and memory stays that of one piece
    /// whatever the stream claims.
    pub fn mode_z_stream(data: &[u8]) {
        use std::io::Read;
        let mut inflating = flate2::read::ZlibDecoder::new(data).take(MODE_Z_LIMIT + 1);
        let mut piece = vec![0u8; 64 << 10];
        let mut total = 0u64;
        loop {
            match inflating.read(&mut piece) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n as u64,
            }
        }
        assert!(total <= MODE_Z_LIMIT + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n);
        let mut i = 0u64;
        while out.len() < n {
            out.extend(format!("2026-11-28 09:{:02} GET /item/{} 200\n", i % 60, i % 977).bytes());
            i += 1;
        }
        out.truncate(n);
        out
    }

    #[test]
    fn text_packs_and_unpacks_to_the_same_bytes() {
        let raw = text(1 << 20);
        let mut p = Packer::default();
        let packed = p.pack(&raw, 3).expect("text shrinks").to_vec();
        assert!(packed.len() < raw.len() / 4, "{} bytes", packed.len());
        let h = braid_proto::compress::header(0, packed.len() as u64);
        let (prefix, plain) = braid_proto::compress::unwrap(&h, &packed).expect("prefix");
        assert_eq!((prefix.level, plain.count), (3, 1 << 20));
        let mut u = Unpacker::default();
        assert_eq!(
            u.unpack(prefix, &packed[PREFIX_LEN..]).expect("inflates"),
            raw
        );
        // The same packer at another level, then back.
        assert!(p.pack(&raw, 1).is_some());
        assert_eq!(
            p.pack(&raw, 3).map(<[u8]>::to_vec),
            Some(packed),
            "a level change is undone"
        );
    }

    /// Packs `blocks` in turn on one packer: each block's prefix and data.
    fn pack_all(p: &mut Packer, blocks: &[&[u8]], level: i32) -> Vec<Option<Vec<u8>>> {
        blocks
            .iter()
            .map(|b| p.pack(b, level).map(<[u8]>::to_vec))
            .collect()
    }

    fn prefix_of(packed: &[u8]) -> Prefix {
        let h = braid_proto::compress::header(0, packed.len() as u64);
        braid_proto::compress::unwrap(&h, packed).expect("prefix").0
    }

    #[test]
    fn a_connections_blocks_are_one_stream_each_smaller_for_the_history_before_it() {
        let raw = text(3 << 20);
        let blocks: Vec<&[u8]> = raw.chunks(256 << 10).collect();
        let streamed = pack_all(&mut Packer::default(), &blocks, 3);
        let alone: usize = blocks
            .iter()
            .map(|b| Packer::default().pack(b, 3).map_or(b.len(), <[u8]>::len))
            .sum();
        let total: usize = streamed.iter().flatten().map(Vec::len).sum();
        assert!(total < alone * 9 / 10, "{total} streamed, {alone} alone");
        let mut u = Unpacker::default();
        for (i, (packed, block)) in streamed.iter().zip(&blocks).enumerate() {
            let packed = packed.as_deref().expect("text shrinks");
            let prefix = prefix_of(packed);
            assert_eq!(prefix.continues, i > 0);
            let got = u.unpack(prefix, &packed[PREFIX_LEN..]).expect("inflates");
            assert_eq!(got, *block, "block {i}");
        }
        // A block that continues a frame is refused by a receiver that never saw its start.
        let second = streamed[1].as_deref().expect("packed");
        let e = Unpacker::default()
            .unpack(prefix_of(second), &second[PREFIX_LEN..])
            .expect_err("no frame to continue");
        assert!(e.contains("no block before it began"), "{e}");
    }

    #[test]
    fn a_block_sent_plain_or_a_new_level_starts_a_new_frame() {
        let raw = text(1 << 20);
        let noise: Vec<u8> = (0..128 << 10).map(|_| rand::random::<u8>()).collect();
        let (a, b) = raw.split_at(512 << 10);
        let mut p = Packer::default();
        let packed = pack_all(&mut p, &[a, &noise, b], 3);
        assert!(packed[1].is_none(), "noise goes plain");
        let after_noise = packed[2].as_deref().expect("text shrinks");
        assert!(!prefix_of(after_noise).continues);
        let at_6 = p.pack(a, 6).expect("shrinks").to_vec();
        assert!(!prefix_of(&at_6).continues);
        // The receiver, which saw the first block only, takes both as fresh frames.
        let mut u = Unpacker::default();
        let first = packed[0].as_deref().expect("text shrinks");
        assert_eq!(u.unpack(prefix_of(first), &first[PREFIX_LEN..]), Ok(a));
        assert_eq!(
            u.unpack(prefix_of(after_noise), &after_noise[PREFIX_LEN..]),
            Ok(b)
        );
        assert_eq!(u.unpack(prefix_of(&at_6), &at_6[PREFIX_LEN..]), Ok(a));
        let next = p.pack(b, 6).expect("shrinks").to_vec();
        assert!(prefix_of(&next).continues);
        assert_eq!(u.unpack(prefix_of(&next), &next[PREFIX_LEN..]), Ok(b));
        // A connection samples only while it sends plain: its stream's context is let go.
        assert!(p.sample(b, 1) < b.len() / 2);
        let after_sample = p.pack(a, 6).expect("shrinks").to_vec();
        assert!(!prefix_of(&after_sample).continues);
        assert_eq!(
            u.unpack(prefix_of(&after_sample), &after_sample[PREFIX_LEN..]),
            Ok(a)
        );
    }

    /// A budget of its own for a test (the process's is shared by tests running beside it).
    fn budget(mb: usize) -> &'static Budget {
        Box::leak(Box::new(Budget::new(mb << 20)))
    }

    #[test]
    fn each_level_s_context_holds_no_more_than_it_is_counted_for() {
        let raw = text(1 << 20);
        for level in crate::engine::compress_level::LEVELS {
            let mut c = Context::new(budget(1000), level).expect("fits");
            let mut out = vec![0; 1 << 20];
            assert!(Packer::flushed(&mut c.zstd, &raw, &mut out).is_some());
            let held = c.zstd.sizeof();
            assert!(
                held <= memory(level) && held > memory(level) / 2,
                "level {level}: {held} bytes, counted as {}",
                memory(level)
            );
        }
    }

    #[test]
    fn contexts_past_the_budget_are_not_made_and_their_room_comes_back() {
        let budget = budget(100);
        let raw = text(256 << 10);
        let (mut a, mut b, mut c) = (
            Packer::within(budget),
            Packer::within(budget),
            Packer::within(budget),
        );
        let levels = crate::engine::compress_level::LEVELS;
        let at = |l: i32| levels.iter().position(|&x| x == l);
        assert_eq!(a.highest_fitting(&levels), at(16));
        assert!(a.pack(&raw, 16).is_some());
        assert!(b.pack(&raw, 16).is_some());
        // 80 of 100 MB held: room for level 9's 17 MB, not 12's or 16's.
        assert_eq!(c.highest_fitting(&levels), at(9));
        assert!(c.pack(&raw, 16).is_none());
        assert!(c.pack(&raw, 9).is_some());
        // A packer's own context counts as room for its next level.
        assert_eq!(b.highest_fitting(&levels), at(16));
        // A packer let go gives its room back; a level lower lets the higher one's go.
        drop(a);
        assert!(b.pack(&raw, 1).is_some());
        assert_eq!(c.highest_fitting(&levels), at(16));
        assert!(c.pack(&raw, 16).is_some());
        drop((b, c));
        assert_eq!(budget.held.load(Ordering::Acquire), 0);
    }

    #[test]
    fn random_bytes_are_not_packed() {
        let raw: Vec<u8> = (0..256 << 10).map(|_| rand::random::<u8>()).collect();
        assert!(Packer::default().pack(&raw, 1).is_none());
        assert!(Packer::default().pack(&[], 1).is_none());
    }

    #[test]
    fn a_frame_that_inflates_to_other_than_announced_is_refused() {
        let raw = text(100_000);
        let packed = Packer::default().pack(&raw, 1).expect("shrinks").to_vec();
        let frame = &packed[PREFIX_LEN..];
        let mut u = Unpacker::default();
        let claim = |raw_len| Prefix {
            raw_len,
            level: 1,
            continues: false,
        };
        // Claims fewer bytes than it holds: the bomb stops at the claim.
        let e = u.unpack(claim(1000), frame).expect_err("too long");
        assert!(e.contains("the 1000 bytes"), "{e}");
        let e = u.unpack(claim(200_000), frame).expect_err("too short");
        assert!(e.contains("100000 bytes"), "{e}");
        let mut broken = frame.to_vec();
        let mid = broken.len() / 2;
        broken[mid] ^= 0xff;
        broken.truncate(broken.len() - 3);
        assert!(u.unpack(claim(100_000), &broken).is_err());
        // A sound block after the broken ones still inflates.
        assert_eq!(u.unpack(claim(100_000), frame).expect("sound"), raw);
    }

    #[test]
    fn the_report_adds_up_what_went_and_at_which_levels() {
        let c = Compression::new(Some(Policy::Auto));
        c.plain(100);
        c.packed(1000, 200, 3);
        c.packed(1000, 150, -1);
        c.packed(1000, 150, 3);
        assert_eq!(
            c.report(),
            Report {
                wire_bytes: 600,
                compressed_blocks: 3,
                compressed_bytes: 3000,
                levels: vec![-1, 3],
            }
        );
        assert!(!Compression::new(None).agreed());
        assert_eq!(Compression::new(None).sending(), Policy::Off);
    }

    #[test]
    fn the_fuzz_entry_inflates_only_what_a_block_announces() {
        let raw = text(50_000);
        let packed = Packer::default().pack(&raw, 1).expect("shrinks").to_vec();
        let mut block = braid_proto::compress::header(0, packed.len() as u64)
            .encode()
            .to_vec();
        block.extend(&packed);
        assert_eq!(fuzzing::compressed_block(&block), 1);
        // The same frame announced as fewer bytes, and cut short.
        block[17..21].copy_from_slice(&100u32.to_be_bytes());
        assert_eq!(fuzzing::compressed_block(&block), 0);
        assert_eq!(fuzzing::compressed_block(&block[..40]), 0);
        assert_eq!(fuzzing::compressed_block(&[]), 0);
    }

    #[test]
    fn the_fuzz_entry_takes_blocks_that_continue_a_frame_in_order_only() {
        let raw = text(200_000);
        let (a, b) = raw.split_at(100_000);
        let mut p = Packer::default();
        let blocks: Vec<Vec<u8>> = [a, b]
            .iter()
            .map(|part| {
                let packed = p.pack(part, 3).expect("shrinks");
                let mut block = braid_proto::compress::header(0, packed.len() as u64)
                    .encode()
                    .to_vec();
                block.extend(packed);
                block
            })
            .collect();
        let (first, second) = (&blocks[0], &blocks[1]);
        assert!(prefix_of(&second[braid_proto::block::HEADER_LEN..]).continues);
        assert_eq!(
            fuzzing::compressed_block(&[first.as_slice(), second].concat()),
            2
        );
        // The continuing block alone, or first, is refused (and so ends the input).
        assert_eq!(fuzzing::compressed_block(second), 0);
        assert_eq!(
            fuzzing::compressed_block(&[second.as_slice(), first].concat()),
            0
        );
        assert_eq!(
            fuzzing::compressed_block(&[first.as_slice(), first].concat()),
            2
        );
    }

    #[test]
    fn the_mode_z_fuzz_entry_stops_a_bomb_at_its_limit() {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        // 64 MiB of zeros: about 64 kB deflated, four times the limit inflated.
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            z.write_all(&zeros).unwrap();
        }
        let bomb = z.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{}", bomb.len());
        fuzzing::mode_z_stream(&bomb);
        fuzzing::mode_z_stream(&bomb[..bomb.len() / 2]);
        fuzzing::mode_z_stream(b"not zlib at all");
        fuzzing::mode_z_stream(&[]);
    }
}

#[cfg(test)]
mod on_sockets {
    //! Compressed blocks through the real sender and receiver on loopback connections.
    use super::*;
    use crate::engine::EngineError;
    use crate::engine::receive::{Progress, Shared, receive};
    use crate::engine::send::{Options, Source, send};
    use crate::engine::sink::Sink;
    use crate::engine::transfer::{Joins, Transfer};
    use braid_proto::block::Header;
    use braid_proto::ranges::RangeSet;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    fn pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let out: Vec<TcpStream> = (0..n)
            .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
            .collect();
        let inn = (0..n).map(|_| l.accept().unwrap().0).collect();
        (out, inn)
    }

    /// Log lines, then random bytes, then log lines: blocks of both kinds in one file.
    fn mixed() -> Vec<u8> {
        let mut data = Vec::new();
        let mut i = 0u64;
        while data.len() < 3 << 20 {
            data.extend(
                format!(
                    "10.0.{}.{} - GET /files/{} 200 {}\n",
                    i % 7,
                    i % 251,
                    i % 89,
                    i % 4096
                )
                .bytes(),
            );
            i += 1;
        }
        data.truncate(3 << 20);
        data.splice(1 << 20..2 << 20, (0..1 << 20).map(|_| rand::random::<u8>()));
        data
    }

    /// Moves `todo` of `data` from a sender with `sending` to a receiver that holds `have`
    /// already (and agreed on compression if `agreed`); the receiver's file, its sum, and
    /// both transfers.
    fn transfer(
        data: &[u8],
        sending: Policy,
        agreed: bool,
        have: &RangeSet,
    ) -> (
        Result<Vec<u8>, EngineError>,
        Option<u128>,
        Transfer,
        Transfer,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("got");
        std::fs::write(&path, vec![0u8; data.len()]).unwrap();
        for (s, e) in have.iter() {
            std::fs::write(&path, {
                let mut f = std::fs::read(&path).unwrap();
                f[s as usize..e as usize].copy_from_slice(&data[s as usize..e as usize]);
                f
            })
            .unwrap();
        }
        let (out, inn) = pairs(3);
        let sender = Transfer::new(false).with_compression(Some(sending));
        let receiver = Transfer::new(false).with_compression(agreed.then_some(Policy::Off));
        let todo = have.missing(data.len() as u64);
        let shared = Shared::new(Progress::holding(have.clone()), Default::default());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(&path)
            .unwrap();
        let got = std::thread::scope(|s| {
            s.spawn(|| {
                let options = Options {
                    block: 256 << 10,
                    hash: false,
                    keep: false,
                };
                let joins = Joins::fixed(out, Duration::from_secs(10));
                let _ = send(
                    &sender,
                    Source::Memory(data),
                    &todo,
                    joins,
                    options,
                    &Default::default(),
                );
            });
            let joins = Joins::fixed(inn, Duration::from_secs(10));
            receive(
                &receiver,
                joins,
                &Sink::File(file),
                Some(data.len() as u64),
                &shared,
            )
        });
        let sum = shared.snapshot().sum.map(|s| s.finish(data.len() as u64));
        (
            got.map(|_| std::fs::read(&path).unwrap()),
            sum,
            sender,
            receiver,
        )
    }

    #[test]
    fn compressed_and_plain_blocks_arrive_as_the_file_with_its_checksum() {
        let data = mixed();
        let empty = RangeSet::new();
        let (got, sum, sender, receiver) = transfer(&data, Policy::On, true, &empty);
        assert!(got.expect("received") == data, "the file differs");
        assert_eq!(sum, Some(braid_proto::checksum::of(&data)));
        let (sent, seen) = (
            sender.compression().report(),
            receiver.compression().report(),
        );
        assert_eq!(sent, seen, "both ends count the same");
        // The text went compressed; the random megabyte took its own size on the wire, alone
        // or inside blocks that reach into it from the text (a settled connection's blocks
        // may be larger than the transfer's, so how many there are is not fixed).
        assert!(sent.compressed_bytes >= 1 << 20, "{sent:?}");
        assert!(sent.wire_bytes >= 1 << 20, "{sent:?}");
        assert!(sent.wire_bytes < (1 << 20) + (1 << 20) / 2, "{sent:?}");
        assert!(!sent.levels.is_empty());
    }

    #[test]
    fn a_resumed_transfer_sends_only_what_is_missing_compressed() {
        let data = mixed();
        let have = RangeSet::from_iter([(0, 512 << 10), (2 << 20, (2 << 20) + 4096)]);
        let (got, _, sender, _) = transfer(&data, Policy::On, true, &have);
        assert!(got.expect("received") == data, "the file differs");
        let sent = sender.compression().report();
        assert!(sent.compressed_blocks > 0, "{sent:?}");
        assert!(
            sent.compressed_bytes + 4096 + (512 << 10) <= 3 << 20,
            "{sent:?}"
        );
    }

    #[test]
    fn a_receiver_that_did_not_agree_refuses_compressed_blocks() {
        let data = mixed();
        let (got, ..) = transfer(&data, Policy::On, false, &RangeSet::new());
        let e = got.expect_err("refused").to_string();
        assert!(e.contains("0x02"), "{e}");
    }

    #[test]
    fn off_sends_nothing_compressed() {
        let data = mixed();
        let (got, _, sender, _) = transfer(&data, Policy::Off, true, &RangeSet::new());
        assert!(got.expect("received") == data);
        let sent = sender.compression().report();
        assert_eq!((sent.compressed_blocks, sent.wire_bytes), (0, 3 << 20));
    }

    #[test]
    fn a_corrupt_compressed_block_is_a_clear_error() {
        let raw = vec![b'a'; 100_000];
        let mut packed = Packer::default().pack(&raw, 1).expect("shrinks").to_vec();
        let last = packed.len() - 1;
        packed[last] ^= 0x55;
        packed[PREFIX_LEN + 2] ^= 0x55;
        let (mut out, inn) = pairs(1);
        let mut w = out.remove(0);
        w.write_all(&braid_proto::compress::header(0, packed.len() as u64).encode())
            .unwrap();
        w.write_all(&packed).unwrap();
        w.write_all(&Header::eof(1).encode()).unwrap();
        let receiver = Transfer::new(false).with_compression(Some(Policy::Off));
        let shared = Shared::new(Progress::default(), Default::default());
        let got = receive(
            &receiver,
            Joins::fixed(inn, Duration::from_secs(10)),
            &Sink::Discard,
            Some(raw.len() as u64),
            &shared,
        );
        let e = got.expect_err("corrupt").to_string();
        assert!(e.contains("compressed block is broken"), "{e}");
        assert!(
            shared.snapshot().ranges.is_empty(),
            "nothing counted as stored"
        );
    }
}
