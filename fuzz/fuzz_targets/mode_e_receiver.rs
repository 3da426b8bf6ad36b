//! `cargo +nightly fuzz run mode_e_receiver` (or `scripts/fuzz`): a hostile sender's block
//! streams against the receiver's bookkeeping; see `braid::engine::receive::fuzzing`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| braid::engine::receive::fuzzing::mode_e_receiver(data));
