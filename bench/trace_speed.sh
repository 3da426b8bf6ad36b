#!/usr/bin/env bash
# Time and peak memory of `braid trace` and `tcptrace -l` on the same ~1 GB capture, made
# inside the link emulator (1 Gbit/s, MTU 1500, full packets). Needs root, tcpdump, tcptrace,
# iperf3 and GNU time; run `cargo build --release` first.
# Usage: sudo bench/trace_speed.sh [path/to/braid]
set -euo pipefail
braid=$(realpath "${1:-target/release/braid}")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
capture="$dir/big.pcap"
"$braid" lab run --name tracebench --rate 1gbit --delay 1ms --queue 1000pkt \
    --server "iperf3 -s -1" \
    --client "tcpdump -i braid0 -s 0 -B 65536 -Z root -w $capture -U 2>/dev/null & p=\$!; sleep 1; iperf3 -c 198.18.0.2 -n 1000M -C cubic >/dev/null; sleep 0.5; kill -INT \$p; wait \$p" \
    >/dev/null 2>&1
size=$(stat -c %s "$capture")
echo "capture: $((size / 1000000)) MB, $(tcpdump -r "$capture" 2>/dev/null | wc -l) packets"
measure() {
    local name=$1; shift
    /usr/bin/time -f "%e %M" -o "$dir/time" "$@" >/dev/null 2>&1
    read -r secs kb < "$dir/time"
    echo "| $name | $secs | $((kb / 1024)) |"
}
echo "| program | seconds | peak RSS MiB |"
echo "|---|---|---|"
measure "braid trace" "$braid" trace "$capture"
measure "braid trace --json --plot" "$braid" trace "$capture" --json --plot "$dir/p.svg"
measure "tcptrace -l" tcptrace -l -n -r "$capture"
