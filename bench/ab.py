#!/usr/bin/env python3
"""Two braid builds head to head on loopback: `get -n 4` of one cached file to /dev/null,
alternating between the builds (ABBA order) so that drift on a shared machine hits both alike.
Prints MB/s and CPU seconds per GiB (client + server) for each, median and runs.

    python3 bench/ab.py OLD_BRAID NEW_BRAID [--runs 6] [--size-mib 1024] [-n 4]

Use it before and after a change that touches the data path (e.g. copy the old
target/release/braid aside first). Only loopback is used; both servers are stopped at the end.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

from common import children_cpu, proc_cpu, random_file


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("-n", type=int, default=4)
    args = ap.parse_args()
    bins = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    work = tempfile.mkdtemp(prefix="braid-ab-")
    procs, urls = {}, {}
    size = args.size_mib << 20
    try:
        random_file(os.path.join(work, "f.bin"), size)
        for k, b in bins.items():
            p = subprocess.Popen([b, "serve", "--root", work, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            procs[k] = p
            urls[k] = p.stdout.readline().split("ftp://")[1].strip().rstrip("/")
        get = lambda k: [bins[k], "get", f"ftp://{urls[k]}/f.bin", "/dev/null", "-n", str(args.n), "--json"]
        for k in bins:  # page cache and the servers' checksum caches
            subprocess.run(get(k), check=True, capture_output=True, timeout=600)
        rate = {k: [] for k in bins}
        cpu = {k: [] for k in bins}
        for i in range(args.runs):
            for k in (["old", "new"] if i % 2 == 0 else ["new", "old"]):
                before = proc_cpu(procs[k].pid) + children_cpu()
                out = subprocess.run(get(k), check=True, capture_output=True, text=True, timeout=600).stdout
                cpu[k].append((proc_cpu(procs[k].pid) + children_cpu() - before) / (size / 2**30))
                rate[k].append(json.loads(out)["bytes_per_second"] / 1e6)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"get -n {args.n}, {args.size_mib} MiB cached file to /dev/null, {args.runs} runs each, ABBA order\n")
    print(f"| build | MB/s | CPU s/GiB | runs (MB/s) |\n|---|---|---|---|")
    for k in bins:
        print(f"| {k} ({bins[k]}) | {statistics.median(rate[k]):.0f} | {statistics.median(cpu[k]):.3f} | "
              f"{', '.join(f'{v:.0f}' for v in rate[k])} |")


if __name__ == "__main__":
    main()
