#!/usr/bin/env python3
"""Loopback throughput and CPU cost of braid next to the tools it means to beat, measured in
one run by `braid bench --loopback`; this script only chooses the runs and prints bench's
results as the table in docs/benchmarks.md.

Rows: iperf3 (memory to memory: the ceiling) with 1, 4 and 8 streams, braid get with -n auto
(the default) and 1, 4 and 8 connections to /dev/null (the data still checked against the
server's XXH3), curl downloading from vsftpd, and globus-url-copy -p 1, 4 and 8 from
globus-gridftp-server. Each runs --runs times on the same file in /dev/shm, in shuffled
rounds; the table gives the median in MB/s (10^6 bytes/s), its ratio to iperf3's one stream,
and the CPU seconds per GiB of client and server together, also against iperf3's.

    cargo build --release && python3 bench/loopback.py [--size-mib 2048] [--runs 3] [--braid PATH]

--braid measures another build (e.g. the one before a change). Tools that are not installed
are skipped with a note (scripts/test installs them all).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRAID = os.path.join(ROOT, "target", "release", "braid")

NAMES = {
    "iperf3": "iperf3 -P {n} (memory to memory)",
    "braid": "braid get -n {n} -> /dev/null (XXH3 checked)",
    "curl": "curl <- vsftpd (stream mode)",
    "globus-url-copy": "globus-url-copy -p {n} <- globus-gridftp-server",
}
ORDER = ["iperf3", "braid", "curl", "globus-url-copy"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--braid", default=BRAID, help="the braid binary to measure")
    args = ap.parse_args()
    if not os.access(args.braid, os.X_OK):
        sys.exit(f"{args.braid} is missing: run cargo build --release first")
    out = tempfile.mkdtemp(prefix="loopback-")
    cmd = [args.braid, "bench", "--loopback", "--tool", ",".join(ORDER), "-n", "1,4,8,auto",
           "--direction", "get", "--size", f"{args.size_mib}MiB", "--repeat", str(args.runs),
           "--out", out]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not os.path.exists(f"{out}/results.jsonl"):
        sys.exit(f"braid bench failed: {done.stderr}")
    for line in done.stderr.splitlines():
        if "is skipped" in line or "FAILED" in line:
            print(line, file=sys.stderr)

    runs = {}  # (tool, streams) -> [(MB/s, CPU s/GiB)]
    with open(f"{out}/results.jsonl") as f:
        for line in f:
            r = json.loads(line)
            m, c = r["measured"], r["cell"]
            if m["error"] or not m["bytes"]:
                continue
            cpu = m["cpu_seconds"] / (m["bytes"] / 2**30) if m["cpu_seconds"] is not None else None
            runs.setdefault((c["tool"], str(c["streams"])), []).append((m["bytes_per_second"] / 1e6, cpu))

    def median(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    ref = runs.get(("iperf3", "1"))
    ref_rate = median([r for r, _ in ref]) if ref else None
    ref_cpu = median([c for _, c in ref]) if ref else None
    print(f"\nloopback, {args.size_mib} MiB file in /dev/shm, median of {args.runs}, {os.cpu_count()} cores "
          f"(`braid bench --loopback`)\n")
    print("| what | MB/s | x iperf3 | CPU s/GiB | x iperf3 | runs (MB/s) |")
    print("|---|---|---|---|---|---|")
    for tool in ORDER:
        for n in ("1", "4", "8", "auto"):
            rs = runs.get((tool, n))
            if not rs:
                continue
            rate, cpu = median([r for r, _ in rs]), median([c for _, c in rs])
            x_rate = f"{rate / ref_rate:.2f}" if ref_rate else "-"
            x_cpu = f"{cpu / ref_cpu:.2f}" if cpu is not None and ref_cpu else "-"
            cpu_s = f"{cpu:.3f}" if cpu is not None else "-"
            print(f"| {NAMES[tool].format(n=n)} | {rate:.0f} | {x_rate} | {cpu_s} | {x_cpu} "
                  f"| {', '.join(f'{r:.0f}' for r, _ in rs)} |")
    print(f"\nbench's own report: {out}/report.md")


if __name__ == "__main__":
    main()
