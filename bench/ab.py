#!/usr/bin/env python3
"""Two braid builds head to head, alternating between them (ABBA order) so that drift on a
shared machine hits both alike. Each build runs against its own server. Prints each build's
median and runs, and new/old.

    python3 bench/ab.py OLD_BRAID NEW_BRAID file [--runs 6] [--size-mib 1024] [-n 4|auto] [--put] [--data text]
    python3 bench/ab.py OLD_BRAID NEW_BRAID tree [--runs 4] [--files 10000] [--file-size 4096]
    sudo python3 bench/ab.py OLD_BRAID NEW_BRAID lab [--scenario satellite-t1] [--size-mib 4] [-n auto]

- file: `get -n N` of one cached file to /dev/null on loopback: MB/s, and CPU seconds per GiB
  (client + server); with `--put`, `put -n N` of it to each build's server, which writes it
  into /dev/shm.
- tree: `get -r` of a tree of FILES files (10 directories) on loopback into /dev/shm: seconds.
- lab: `get -n N` of one file to /dev/null across `braid lab run --scenario S` (needs root):
  MB/s; a lab of its own per run (the NEW build runs the lab).

Use it before and after a change that touches the data path (e.g. check out the old commit in
a worktree and build it there). One build twice with different client options compares the
options: `bench/ab.py B B file --old-args="--compress off" --new-args="--compress auto"`. Only loopback and the lab's namespaces are used; every server
and lab is stopped at the end.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from common import children_cpu, proc_cpu, random_file, text_file


def serve(b, root, writable=False):
    args = ["--anonymous-write"] if writable else []
    p = subprocess.Popen([b, "serve", "--root", root, "--listen", "127.0.0.1:0", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    return p, p.stdout.readline().split("ftp://")[1].strip().rstrip("/")


def abba(runs):
    for i in range(runs):
        yield from (["old", "new"] if i % 2 == 0 else ["new", "old"])


def file_ab(bins, args, work):
    size = args.size_mib << 20
    (text_file if args.data == "text" else random_file)(os.path.join(work, "f.bin"), size)
    procs, urls = {}, {}
    # Uploads land in memory, so that the disk's pace is not what is measured.
    shm = tempfile.mkdtemp(prefix="braid-ab-put-", dir="/dev/shm") if args.put else None
    try:
        for k, b in bins.items():
            procs[k], urls[k] = serve(b, shm or work, writable=args.put)

        def command(k):
            extra = (args.old_args if k == "old" else args.new_args).split()
            if args.put:
                move = ["put", os.path.join(work, "f.bin"), f"ftp://{urls[k]}/f-{k}.bin"]
            else:
                move = ["get", f"ftp://{urls[k]}/f.bin", "/dev/null"]
            return [bins[k], *move, "-n", args.n, "--json", *extra]

        for k in bins:  # page cache and the servers' checksum caches
            subprocess.run(command(k), check=True, capture_output=True, timeout=600)
        rate = {k: [] for k in bins}
        cpu = {k: [] for k in bins}
        for k in abba(args.runs):
            before = proc_cpu(procs[k].pid) + children_cpu()
            out = subprocess.run(command(k), check=True, capture_output=True, text=True, timeout=600).stdout
            cpu[k].append((proc_cpu(procs[k].pid) + children_cpu() - before) / (size / 2**30))
            rate[k].append(json.loads(out)["bytes_per_second"] / 1e6)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
    what = "to each server's /dev/shm" if args.put else "to /dev/null"
    print(f"{'put' if args.put else 'get'} -n {args.n}, {args.size_mib} MiB cached file "
          f"({args.data}) {what}, "
          f"{args.runs} runs each, ABBA order; old {args.old_args!r}, new {args.new_args!r}\n")
    table(bins, rate, "MB/s", cpu)


def tree_ab(bins, args, work):
    src = os.path.join(work, "src")
    for i in range(args.files):
        d = os.path.join(src, f"d{i % 10}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(os.urandom(args.file_size))
    procs, urls = {}, {}
    seconds = {k: [] for k in bins}
    try:
        for k, b in bins.items():
            procs[k], urls[k] = serve(b, src)
        for k in ["old", "new"] + list(abba(args.runs)):
            dest = tempfile.mkdtemp(prefix="braid-ab-tree-", dir="/dev/shm")
            try:
                t = time.monotonic()
                subprocess.run([bins[k], "get", "-r", f"ftp://{urls[k]}/", dest, "-q"], check=True,
                               capture_output=True, timeout=600)
                seconds[k].append(time.monotonic() - t)
            finally:
                shutil.rmtree(dest, ignore_errors=True)
        for k in bins:  # the first of each warmed the caches
            seconds[k].pop(0)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    print(f"get -r of {args.files} files of {args.file_size} bytes into /dev/shm, {args.runs} runs each, ABBA order\n")
    table(bins, seconds, "seconds")


def lab_ab(bins, args, work):
    size = args.size_mib << 20
    random_file(os.path.join(work, "f.bin"), size)
    rate = {k: [] for k in bins}
    for k in abba(args.runs):
        out = os.path.join(work, "out.json")
        client = f"sh -c '{bins[k]} get ftp://198.18.0.2:2121/f.bin /dev/null -n {args.n} --json > {out}'"
        server = f"{bins[k]} serve --root {work} --listen 198.18.0.2:2121"
        subprocess.run([bins["new"], "lab", "run", "--name", "braid-ab", "--scenario", args.scenario,
                        "--server", server, "--client", client], check=True, capture_output=True, timeout=900)
        with open(out) as f:
            rate[k].append(json.load(f)["bytes_per_second"] / 1e6)
    print(f"get -n {args.n} of {args.size_mib} MiB over braid lab {args.scenario}, {args.runs} runs each, ABBA order\n")
    table(bins, rate, "MB/s")


def table(bins, values, unit, cpu=None):
    print(f"| build | {unit} (median) |{' CPU s/GiB |' if cpu else ''} runs |\n|---|---|{'---|' if cpu else ''}---|")
    for k in bins:
        c = f" {statistics.median(cpu[k]):.3f} |" if cpu else ""
        print(f"| {k} ({bins[k]}) | {statistics.median(values[k]):.3f} |{c} "
              f"{', '.join(f'{v:.3f}' for v in values[k])} |")
    print(f"\nnew/old: {statistics.median(values['new']) / statistics.median(values['old']):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("workload", choices=["file", "tree", "lab"])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("-n", default="4", help="connections: a number or auto")
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--file-size", type=int, default=4096)
    ap.add_argument("--scenario", default="satellite-t1")
    ap.add_argument("--put", action="store_true", help="file: upload instead of download")
    ap.add_argument("--data", choices=["random", "text"], default="random",
                    help="file: random bytes, or braid bench's compressible text")
    ap.add_argument("--old-args", default="", help="file: more client options for OLD")
    ap.add_argument("--new-args", default="", help="file: more client options for NEW")
    args = ap.parse_args()
    bins = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    work = tempfile.mkdtemp(prefix="braid-ab-")
    try:
        {"file": file_ab, "tree": tree_ab, "lab": lab_ab}[args.workload](bins, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
