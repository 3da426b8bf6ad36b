//! `cargo +nightly fuzz run session` (or `scripts/fuzz`): see `braid_proto::fuzzing::session`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| braid_proto::fuzzing::session(data));
