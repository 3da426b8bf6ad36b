#!/usr/bin/env python3
"""Many clients at once against one `braid serve` on loopback: CLIENTS clients start together,
and each downloads its file and uploads it back (ROUNDS times), with a mix of sizes
(1 KiB to 256 MiB) and of ways to move them (curl in stream mode, braid MODE E with 4
connections, braid MODE E with 4 connections over TLS). Reports failed transfers, the
aggregate throughput against one transfer of each kind measured alone in the same run, and
the server's peak sessions, memory and threads.

    cargo build --release && python3 bench/concurrent.py [--clients 500] [--rounds 1]

The server allows every client to log in at once: one address range may have an eighth of
--max-connections waiting to log in, and all the clients come from 127.0.0.1, so the server
gets 8 places per client (an admin whose clients come through one NAT does the same). Needs
curl and openssl. Everything runs on loopback under a temporary directory (--dir) and is
stopped and removed at the end, also on failure or Ctrl-C. The files live in /dev/shm when
there is one (--dir): uploads end with an fsync, and a disk would be what is measured."""

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import certificate, children_cpu, proc_cpu, raise_fd_limit, random_file

HERE = os.path.dirname(os.path.abspath(__file__))
BRAID = os.path.join(HERE, "..", "target", "release", "braid")

# Size classes: (bytes, clients per 100). Most clients move small files, a few move large
# ones, so that the bytes are mostly in large files as on a real server.
SIZES = [(1 << 10, 40), (64 << 10, 30), (1 << 20, 20), (16 << 20, 9), (256 << 20, 1)]
KINDS = ["stream", "mode-e", "tls"]
# A transfer that takes longer than this failed (the run is bounded in time).
TRANSFER_LIMIT = 600


def sizes_for(clients, rng):
    out = []
    for size, per100 in SIZES:
        out += [size] * max(1, round(clients * per100 / 100))
    rng.shuffle(out)
    return out[:clients]


def command(kind, direction, port, name, src, cert, env_home):
    """The command for one transfer, and its environment."""
    url = f"ftp://127.0.0.1:{port}"
    env = dict(os.environ, HOME=env_home, XDG_STATE_HOME=os.path.join(env_home, "state"))
    if kind == "stream":
        if direction == "get":
            return ["curl", "-sS", "--fail", f"{url}/{name}", "-o", "/dev/null"], env
        return ["curl", "-sS", "--fail", "-T", src, f"{url}/up/{os.path.basename(src)}"], env
    tls = []
    if kind == "tls":
        url = f"ftp://localhost:{port}"
        tls = ["--tls-ca", cert]
    if direction == "get":
        return [BRAID, "get", f"{url}/{name}", "/dev/null", "-n", "4", "-q"] + tls, env
    return [BRAID, "put", src, f"{url}/up/{os.path.basename(src)}", "-n", "4", "-q"] + tls, env


class Sampler(threading.Thread):
    """Samples the server's memory, threads and sessions every 100 ms."""

    def __init__(self, pid, metrics):
        super().__init__(daemon=True)
        self.pid, self.metrics = pid, metrics
        self.stop = threading.Event()
        self.peak = {"rss_kib": 0, "threads": 0, "sessions": 0}

    def run(self):
        while not self.stop.wait(0.1):
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    status = f.read()
                rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
                nthreads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
                page = urllib.request.urlopen(self.metrics, timeout=2).read().decode()
                sessions = int(float(re.search(r"^braid_sessions (\S+)", page, re.M).group(1)))
            except (OSError, AttributeError, ValueError):
                continue
            for key, value in (("rss_kib", rss), ("threads", nthreads), ("sessions", sessions)):
                self.peak[key] = max(self.peak[key], value)


def timed(cmd, env):
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TRANSFER_LIMIT)
        code, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        code, err = "timeout", f"over {TRANSFER_LIMIT} s"
    return time.monotonic() - start, code, err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=1, help="downloads and uploads per client")
    ap.add_argument("--dir", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else None,
                    help="where the files go (default: /dev/shm, so that the disk is not what is "
                    "measured)")
    args = ap.parse_args()
    for tool in ("curl", "openssl"):
        if shutil.which(tool) is None:
            sys.exit(f"bench/concurrent.py needs {tool}")
    if not os.access(BRAID, os.X_OK):
        sys.exit("build first: cargo build --release")
    raise_fd_limit(args.clients)
    work = tempfile.mkdtemp(prefix="braid-concurrent-", dir=args.dir)
    server = None
    try:
        root = os.path.join(work, "root")
        os.makedirs(os.path.join(root, "up"))
        cert, key = certificate(work, "localhost")
        rng = random.Random(7)
        sizes = sizes_for(args.clients, rng)
        for size in sorted(set(sizes)):
            random_file(os.path.join(root, f"f{size}.bin"), size)
        # The server's log goes to a file: at this rate it is long.
        log = open(os.path.join(work, "server.log"), "w")
        server = subprocess.Popen(
            [BRAID, "serve", "--listen", "127.0.0.1:0", "--root", root, "--anonymous",
             "--anonymous-write", "--tls-cert", cert, "--tls-key", key,
             "--max-per-ip", str(args.clients + 50), "--max-connections", str(8 * args.clients + 100),
             "--metrics", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=log, text=True)
        port = metrics = None
        for line in server.stdout:
            m = re.search(r"(ftp|http)://127\.0\.0\.1:(\d+)", line)
            if m and m.group(1) == "ftp":
                port = int(m.group(2))
            elif m:
                metrics = f"http://127.0.0.1:{m.group(2)}/metrics"
            if port and metrics:
                break
        if port is None or metrics is None:
            sys.exit(f"the server did not start; see {log.name}")
        threading.Thread(target=server.stdout.read, daemon=True).start()
        home = os.path.join(work, "home")
        os.makedirs(home)

        # One transfer of each kind alone: the reference rates.
        big = max(s for s, _ in SIZES)
        big_src = os.path.join(root, f"f{big}.bin")
        if not os.path.exists(big_src):
            random_file(big_src, big)
        alone = {}
        for kind in KINDS:
            for direction in ("get", "put"):
                cmd, env = command(kind, direction, port, f"f{big}.bin", big_src, cert, home)
                secs, code, err = timed(cmd, env)
                if code != 0:
                    sys.exit(f"{kind} {direction} alone failed ({code}): {err}")
                alone[(kind, direction)] = big / secs
        base_rss = rss_kib(server.pid)
        base_threads = threads(server.pid)
        server_cpu = proc_cpu(server.pid)
        clients_cpu = children_cpu()

        sampler = Sampler(server.pid, metrics)
        sampler.start()
        results = []
        lock = threading.Lock()
        start = time.monotonic()

        def client(i):
            size = sizes[i]
            kind = KINDS[i % len(KINDS)]
            src = os.path.join(work, f"c{i}.bin")
            os.link(os.path.join(root, f"f{size}.bin"), src)
            for _ in range(args.rounds):
                for direction in ("get", "put"):
                    cmd, env = command(kind, direction, port, f"f{size}.bin", src, cert, home)
                    secs, code, err = timed(cmd, env)
                    end = time.monotonic()
                    with lock:
                        results.append((kind, direction, size, secs, end, code, err.strip()[-300:]))

        pool = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        sampler.stop.set()
        last = max((r[4] for r in results), default=start)
        wall = last - start
        cpu = (proc_cpu(server.pid) - server_cpu, children_cpu() - clients_cpu)
        report(args, sizes, results, alone, wall, cpu, sampler.peak, base_rss, base_threads)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(work, ignore_errors=True)


def report(args, sizes, results, alone, wall, cpu, peak, base_rss, base_threads):
    failed = [r for r in results if r[5] != 0]
    done = [r for r in results if r[5] == 0]
    moved = sum(r[2] for r in done)
    aggregate = moved / wall
    # The time the same transfers would take one after another, each at the rate one
    # transfer of its kind reaches alone: the reference the aggregate is held against.
    alone_time = sum(r[2] / alone[(r[0], r[1])] for r in done)
    print(f"clients: {args.clients}, {args.rounds} round(s) each; sizes "
          + ", ".join(f"{sizes.count(s)} x {human(s)}" for s, _ in SIZES))
    print(f"transfers: {len(done)} complete, {len(failed)} failed")
    for kind in KINDS:
        for direction in ("get", "put"):
            rows = [r for r in done if r[0] == kind and r[1] == direction]
            print(f"  {kind:7} {direction}: {len(rows):6} done, "
                  f"{sum(r[2] for r in rows) / 2**20:9.0f} MiB; alone: "
                  f"{alone[(kind, direction)] / 1e6:7.0f} MB/s")
    kinds = {}
    for r in failed:
        kinds.setdefault((r[0], r[1], r[5]), []).append(r)
    for (kind, direction, code), rs in sorted(kinds.items(), key=lambda k: -len(k[1])):
        print(f"  FAILED {len(rs)} x {kind} {direction}, exit {code}, e.g. {human(rs[0][2])}: "
              f"{rs[0][6]}")
    print(f"aggregate: {aggregate / 1e6:.0f} MB/s over {wall:.1f} s; the same transfers at the "
          f"rate of one alone: {moved / alone_time / 1e6:.0f} MB/s; "
          f"ratio {alone_time / wall:.2f}")
    print(f"CPU: server {cpu[0]:.1f} s, clients {cpu[1]:.1f} s, of {wall * os.cpu_count():.1f} s "
          f"({os.cpu_count()} cores for {wall:.1f} s)")
    big = [r[3] for r in done if r[2] == max(s for s, _ in SIZES)]
    small = [r[3] for r in done if r[2] == min(s for s, _ in SIZES)]
    if small:
        print(f"1 KiB transfers: median {statistics.median(small) * 1e3:.0f} ms, "
              f"max {max(small) * 1e3:.0f} ms")
    if big:
        print(f"256 MiB transfers: median {statistics.median(big):.1f} s, max {max(big):.1f} s")
    sessions = max(peak["sessions"], 1)
    print(f"server: peak {peak['sessions']} sessions; memory {base_rss / 1024:.1f} MiB idle, "
          f"peak {peak['rss_kib'] / 1024:.1f} MiB "
          f"({(peak['rss_kib'] - base_rss) / sessions:.0f} KiB per session at the peak); "
          f"threads {base_threads} idle, peak {peak['threads']} "
          f"({(peak['threads'] - base_threads) / sessions:.1f} per session)")
    if failed:
        sys.exit(1)


def human(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


if __name__ == "__main__":
    main()
