#!/usr/bin/env bash
# Single-core speed of the whole-file checksums braid could use, on a cache-hot 1 MiB buffer:
# BLAKE3 (which would allow standard out-of-order tree hashing) and XXH3-128 (what braid's
# `XXH3` checksum is built on). This decided braid's checksum: see crates/proto/src/checksum.rs.
#   bench/hash_speed.sh
# Builds a throwaway program in a temporary directory (needs crates.io).
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/src"
cat > "$dir/Cargo.toml" <<'TOML'
[package]
name = "hash-speed"
version = "0.0.0"
edition = "2024"
[dependencies]
blake3 = "1.8"
twox-hash = { version = "2.1", default-features = false, features = ["std", "xxhash3_128"] }
[workspace]
TOML
cat > "$dir/src/main.rs" <<'RS'
use std::time::Instant;
fn rate(name: &str, rounds: usize, mut f: impl FnMut(&[u8]) -> u128) {
    let buf = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut acc = 0u128;
    for _ in 0..rounds {
        acc ^= f(&buf);
    }
    let gbs = rounds as f64 * buf.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
    println!("{name:>10}: {gbs:5.2} GB/s  (1 MiB buffer x {rounds}, acc {})", acc % 10);
}
fn main() {
    rate("BLAKE3", 2048, |b| u128::from_le_bytes(blake3::hash(b).as_bytes()[..16].try_into().unwrap()));
    rate("XXH3-128", 8192, |b| twox_hash::XxHash3_128::oneshot(b));
}
RS
cargo run --release -q --manifest-path "$dir/Cargo.toml"
