//! `cargo +nightly fuzz run reply_parser` (or `scripts/fuzz`): see `braid_proto::fuzzing::reply_parser`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| braid_proto::fuzzing::reply_parser(data));
