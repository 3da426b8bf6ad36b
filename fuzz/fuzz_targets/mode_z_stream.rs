//! `cargo +nightly fuzz run mode_z_stream` (or `scripts/fuzz`): a hostile peer's MODE Z
//! (deflate) stream through the reader braid inflates with; see
//! `braid::engine::compress::fuzzing::mode_z_stream` (a bomb stops at the limit).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| braid::engine::compress::fuzzing::mode_z_stream(data));
