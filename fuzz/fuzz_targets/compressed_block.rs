//! `cargo +nightly fuzz run compressed_block` (or `scripts/fuzz`): a hostile sender's
//! compressed MODE E blocks on one connection against the receiver's unwrapping and zstd; see
//! `braid::engine::compress::fuzzing` (a decompression bomb stops at the block's limit).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid::engine::compress::fuzzing::compressed_block(data);
});
