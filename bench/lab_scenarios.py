#!/usr/bin/env python3
"""The lab's accuracy as the two tables in docs/lab.md, measured by `braid bench`: this script only
chooses the runs and prints bench's report.json.

1. Each named scenario: a ping's RTT on the idle link against the configured one, and one
   iperf3 CUBIC flow (a payload of about 20 s at the link's payload rate; a fixed size on the
   lossy satellite link, which runs at 3 % of it) against the payload rate, with the link's
   queue drops and losses.
2. The relay's speed: 1 and 2 Gbit/s links, and unlimited ones at MTU 1500 and 9000. Device
   drops are packets the relay was too slow to read: a run with any is not trustworthy.

Needs root; run `cargo build --release` first. Takes about 6 minutes.
Usage: sudo python3 bench/lab_scenarios.py [path/to/braid]
"""
import json
import subprocess
import sys
import tempfile

BRAID = sys.argv[1] if len(sys.argv) > 1 else "target/release/braid"

# scenario: the size option of its run
SCENARIOS = {
    "satellite-t1": ["--duration", "20"],
    "satellite-t1-ber": ["--size", "200KB"],
    "dialup-14k4": ["--duration", "40"],
    "dsl-1m-bloat": ["--duration", "20"],
    "lfn-500m": ["--duration", "20"],
    "lan-100m": ["--duration", "20"],
}

# label: the link options of a relay-speed run
RELAY = {
    "1 Gbit/s, 1 ms, MTU 1500": ["--rate", "1gbit", "--delay", "1ms", "--duration", "10"],
    "2 Gbit/s, 1 ms, MTU 1500": ["--rate", "2gbit", "--delay", "1ms", "--duration", "10"],
    "unlimited, MTU 1500": ["--rate", "unlimited", "--delay", "0ms", "--size", "3GB"],
    "unlimited, MTU 9000": ["--rate", "unlimited", "--delay", "0ms", "--mtu", "9000", "--size", "8GB"],
}


def bench(scenario, extra, out):
    """One iperf3 CUBIC upload on `scenario`; bench's report.json."""
    cmd = [BRAID, "bench", "--scenario", scenario, "--tool", "iperf3", "-n", "1",
           "--direction", "put", "--congestion", "cubic", "--repeat", "1", "--idle-ping", "5",
           "--name", "labacc", "--out", out] + extra
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with open(f"{out}/report.json") as f:
            return json.load(f)
    except OSError:
        sys.exit(f"braid bench failed: {done.stderr}")


def main():
    work = tempfile.mkdtemp(prefix="lab-scenarios-")
    print("braid lab scenarios: idle ping (median) and one iperf3 CUBIC flow (whole run)\n")
    print("| scenario | RTT configured ms | RTT measured ms | payload rate kbit/s | iperf3 kbit/s (ratio) | queue drops | lost | device drops |")
    print("|---|---|---|---|---|---|---|---|")
    for name, extra in SCENARIOS.items():
        print(f"  measuring {name}", file=sys.stderr)
        r = bench(name, extra, f"{work}/{name}")
        path, link = r["paths"][name], r["links"][name]
        cell = r["cells"][0]
        got = cell["mbit_s"]["median"] * 1e3 if cell["mbit_s"] else float("nan")
        rate = path["up_payload_bps"] / 1e3
        print(f"| {name} | {path['ping_rtt_ms']:.1f} | {r['idle'][name]['p50_ms']:.1f} | {rate:.1f} "
              f"| {got:.1f} ({got / rate:.3f}) | {link['up']['queue_drops']} | {link['up']['lost']} "
              f"| {link['up']['device_drops'] + link['down']['device_drops']} |")

    print("\nrelay speed: one iperf3 CUBIC flow; device drops are packets the relay was too slow to read\n")
    print("| link | iperf3 Gbit/s | payload rate Gbit/s | device drops |")
    print("|---|---|---|---|")
    for label, extra in RELAY.items():
        print(f"  measuring {label}", file=sys.stderr)
        r = bench("lan-100m", extra, f"{work}/relay-{len(label)}-{extra[1]}")
        path, link = r["paths"]["lan-100m"], r["links"]["lan-100m"]
        got = r["cells"][0]["mbit_s"]["median"] / 1e3 if r["cells"][0]["mbit_s"] else float("nan")
        rate = path["up_payload_bps"]
        drops = link["up"]["device_drops"] + link["down"]["device_drops"]
        print(f"| {label} | {got:.3f} | {rate / 1e9:.3f} | {drops} |" if rate else
              f"| {label} | {got:.3f} | - | {drops} |")


if __name__ == "__main__":
    main()
