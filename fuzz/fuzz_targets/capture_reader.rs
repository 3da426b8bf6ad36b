//! `cargo +nightly fuzz run capture_reader`: arbitrary bytes as a capture file. The reader and
//! the TCP analysis must report damage, never panic or loop.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = braid::trace::analyse(data, "fuzz", None, None);
});
