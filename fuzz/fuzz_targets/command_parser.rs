//! `cargo +nightly fuzz run command_parser`: arbitrary bytes on the control channel.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| braid_proto::fuzzing::command_parser(data));
