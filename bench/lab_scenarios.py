#!/usr/bin/env python3
"""For each `braid lab` scenario: ping RTT against 2 x delay + serialization, and the goodput
of one iperf3 TCP flow (cubic) against the link's payload rate, after warm-up and over the
whole run (on the dial-up link a retransmission timeout stalls the flow for seconds and the
held-back data then arrives in one burst, so only the whole run means anything there).
Then the relay's speed: 1 and 2 Gbit/s links and an unlimited one, at MTU 1500 and 9000.

Needs root; run `cargo build --release` first. Takes about 7 minutes.
Usage: sudo python3 bench/lab_scenarios.py [path/to/braid]
"""
import json
import subprocess
import sys

BRAID = sys.argv[1] if len(sys.argv) > 1 else "target/release/braid"

# name: (iperf3 seconds, seconds of warm-up left out)
SCENARIOS = {
    "satellite-t1": (40, 15),
    "satellite-t1-ber": (40, 15),
    "dialup-14k4": (60, 20),
    "dsl-1m-bloat": (20, 5),
    "lfn-500m": (30, 10),
    "lan-100m": (10, 2),
}


def lab_run(args, server, client, timeout=300):
    out = subprocess.run(
        [BRAID, "lab", "run", "--name", "bench", "--json", "--timeout", str(timeout)]
        + args
        + ["--server", server, "--client", client],
        capture_output=True,
        text=True,
    )
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        sys.exit(f"braid lab run failed: {out.stderr}")


def scenario_params():
    """Rate (bit/s), one-way delay (ms) and MTU of each scenario's up direction, from
    `braid lab scenarios`."""
    text = subprocess.run([BRAID, "lab", "scenarios"], capture_output=True, text=True).stdout
    params, name = {}, None
    for line in text.splitlines():
        if not line.startswith(" "):
            name = line.strip()
            params[name] = {}
        elif line.strip().startswith("MTU"):
            params[name]["mtu"] = int(line.split()[1])
        elif line.strip().startswith("up"):
            spec = line.split(":", 1)[1]
            rate, unit = spec.split(",")[0].split()
            params[name]["rate"] = float(rate) * (1e6 if unit.startswith("M") else 1e3)
            params[name]["delay_ms"] = float(spec.split("delay")[1].split("ms")[0])
    return params


def steady(server_stdout, skip):
    intervals = json.loads(server_stdout)["intervals"][skip:]
    b = sum(i["sum"]["bytes"] for i in intervals)
    s = sum(i["sum"]["seconds"] for i in intervals)
    return b * 8 / s if s else 0.0


def main():
    params = scenario_params()
    rows = []
    for name, (secs, skip) in SCENARIOS.items():
        p = params[name]
        print(f"  measuring {name}", file=sys.stderr)
        r = lab_run(["--scenario", name], "true", "ping -c 5 -i 1 198.18.0.2")
        rtts = [float(l.split("time=")[1].split()[0]) for l in r["client"]["stdout"].splitlines() if "time=" in l]
        rtts.sort()
        expected_rtt = 2 * p["delay_ms"] + 2 * 84 * 8 / p["rate"] * 1000
        r = lab_run(
            ["--scenario", name],
            "iperf3 -s -1 -J",
            f"iperf3 -c 198.18.0.2 -t {secs} -C cubic -J",
        )
        goodput = steady(r["server"]["stdout"], skip)
        whole = json.loads(r["server"]["stdout"])["end"]["sum_received"]["bits_per_second"]
        ceiling = p["rate"] * (p["mtu"] - 52) / p["mtu"]
        link = r["link"]["up"]
        rows.append(
            (name, expected_rtt, rtts[len(rtts) // 2] if rtts else float("nan"), ceiling, goodput,
             whole, link["queue_drops"], link["lost"], link["device_drops"])
        )
    print(f"\nbraid lab scenarios: ping (median of 5) and one iperf3 cubic flow (server intervals after warm-up)\n")
    print("| scenario | RTT expected ms | RTT measured ms | payload rate kbit/s | goodput after warm-up kbit/s | ratio | whole run kbit/s | queue drops | lost | device drops |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, er, mr, c, g, w, qd, lost, dd in rows:
        print(f"| {n} | {er:.1f} | {mr:.1f} | {c/1e3:.1f} | {g/1e3:.1f} | {g/c:.3f} | {w/1e3:.1f} | {qd} | {lost} | {dd} |")

    print("\nrelay speed: one iperf3 cubic flow, 10 s, goodput after 2 s; device drops are packets")
    print("the relay was too slow to read (a run with any fails)\n")
    print("| link | MTU | goodput Gbit/s | payload rate Gbit/s | device drops |")
    print("|---|---|---|---|---|")
    for rate, mtu in (("1gbit", 1500), ("2gbit", 1500), (None, 1500), (None, 9000)):
        args = ["--mtu", str(mtu)] + (["--rate", rate, "--delay", "1ms"] if rate else [])
        r = lab_run(args, "iperf3 -s -1 -J", "iperf3 -c 198.18.0.2 -t 10 -C cubic -J")
        g = steady(r["server"]["stdout"], 2)
        drops = r["link"]["up"]["device_drops"] + r["link"]["down"]["device_drops"]
        ceiling = f"{float(rate[0]) * (mtu - 52) / mtu:.3f}" if rate else "-"
        print(f"| {rate or 'unlimited'}{', 1 ms' if rate else ''} | {mtu} | {g/1e9:.3f} | {ceiling} | {drops} |")


if __name__ == "__main__":
    main()
