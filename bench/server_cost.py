#!/usr/bin/env python3
"""What serving costs: braid serve and vsftpd under the same load, in the same run. CLIENTS
clients start together and each downloads its file and uploads it back with curl (stream
mode, the one way both servers speak), with the mix of sizes of bench/concurrent.py (1 KiB to
256 MiB). Each server runs the whole load in turn; the report gives, per server, the
transfers done and failed, the server's CPU seconds per GiB and per file (the server process
and every process it started and reaped: vsftpd forks per session), its peak anonymous memory
(PSS summed over its processes, so pages they share count once; mapped files left out) and the
wall time; beside it the clients' CPU and the sum (on loopback, the machine's whole cost: how a
server sends can move work to its receivers, see src/engine/file_send.rs).

    cargo build --release && python3 bench/server_cost.py [--clients 500] [--repeat 2]
    sudo python3 bench/server_cost.py --lab     # the clients in another lab host

Clients on the same two cores as the server make a ratio against one transfer alone
meaningless; the servers' own CPU, for the same work, is comparable. With --lab the servers run
in one host of a two-host lab (`braid lab`, an open link) and the clients in the other, so the
client processes are at least not in the server's network namespace (they still share the
cores, and the lab's relay carries every packet). Needs curl and vsftpd (and root for --lab).
Everything runs under a temporary directory (in /dev/shm when there is one) and is stopped and
removed at the end, also on failure or Ctrl-C."""

import argparse
import os
import random
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from common import raise_fd_limit, random_file, vsftpd_conf
from concurrent import BRAID, SIZES, human, sizes_for, timed

LAB = "cost"


def free_port(addr):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def tree(pid):
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def tree_cpu(pid):
    """CPU seconds of `pid`, its reaped children and those still running."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for i, p in enumerate(tree(pid)):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime; and for the top process cutime, cstime (what it reaped). A live
        # child's reaped children are counted in its own cutime when it is reaped in turn.
        used = int(fields[11]) + int(fields[12])
        if i == 0:
            used += int(fields[13]) + int(fields[14])
        total += used / tick
    return total


def pss_kib(pids):
    """Anonymous memory (PSS) of `pids`: what the server itself holds. Mapped files are left
    out: on /dev/shm a mapped file's pages would count as the server's, though they are the
    file's (braid writes from mappings to a peer on the same host)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                m = re.search(r"^Pss_Anon:\s+(\d+)", f.read(), re.M)
            total += int(m.group(1)) if m else 0
        except OSError:
            pass
    return total


class Sampler(threading.Thread):
    """The server's peak memory (PSS over its processes) and process count, twice a second."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.stop = threading.Event()
        self.peak_kib = 0
        self.peak_procs = 0

    def run(self):
        while not self.stop.wait(0.5):
            pids = tree(self.pid)
            self.peak_procs = max(self.peak_procs, len(pids))
            self.peak_kib = max(self.peak_kib, pss_kib(pids))


def start_server(kind, work, root, addr, clients, prefix):
    """(process, port) of `kind` serving `root` on `addr`, writable, anonymous."""
    log = open(os.path.join(work, f"{kind}.log"), "w")
    if kind == "braid":
        p = subprocess.Popen(
            prefix + [BRAID, "serve", "--listen", f"{addr}:0", "--root", root, "--anonymous",
                      "--anonymous-write", "--max-per-ip", str(clients + 50),
                      "--max-connections", str(8 * clients + 100)],
            stdout=subprocess.PIPE, stderr=log, text=True)
        for line in p.stdout:
            m = re.search(r"ftp://[\d.]+:(\d+)", line)
            if m:
                threading.Thread(target=p.stdout.read, daemon=True).start()
                return p, int(m.group(1))
        sys.exit(f"braid serve did not start; see {log.name}")
    port = free_port(addr) if not prefix else 2121
    conf = vsftpd_conf(work, root, addr, port, writable=True)
    vsftpd = shutil.which("vsftpd") or "/usr/sbin/vsftpd"
    p = subprocess.Popen(prefix + [vsftpd, conf], stdout=log, stderr=log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe = subprocess.run(prefix + ["curl", "-sS", "--max-time", "2",
                                         f"ftp://{addr}:{port}/"], capture_output=True)
        if probe.returncode == 0:
            return p, port
        time.sleep(0.1)
    p.kill()
    sys.exit(f"vsftpd did not start; see {log.name}")


def command(direction, addr, port, name, src, prefix):
    url = f"ftp://{addr}:{port}"
    if direction == "get":
        return prefix + ["curl", "-sS", "--fail", f"{url}/{name}", "-o", "/dev/null"]
    return prefix + ["curl", "-sS", "--fail", "-T", src, f"{url}/up/{os.path.basename(src)}"]


def load(kind, args, work, root, sizes, addr, server_prefix, client_prefix):
    """One run of the whole load against `kind`; its row of the report."""
    up = os.path.join(root, "up")
    shutil.rmtree(up, ignore_errors=True)
    os.makedirs(up)
    server, port = start_server(kind, work, root, addr, args.clients, server_prefix)
    # The process whose tree does the serving: `ip netns exec` execs its command in place.
    try:
        before = tree_cpu(server.pid)
        sampler = Sampler(server.pid)
        sampler.start()
        results, lock = [], threading.Lock()
        env = dict(os.environ, HOME=work)
        start = time.monotonic()
        # The clients' CPU: every curl is a child of this script, reaped when it ends (the
        # server is reaped only after the load).
        children = resource.getrusage(resource.RUSAGE_CHILDREN)

        def client(i):
            size = sizes[i]
            src = os.path.join(work, f"c{i}.bin")
            if not os.path.exists(src):
                os.link(os.path.join(root, f"f{size}.bin"), src)
            for direction in ("get", "put"):
                cmd = command(direction, addr, port, f"f{size}.bin", src, client_prefix)
                secs, code, err = timed(cmd, env)
                with lock:
                    results.append((direction, size, secs, code, err.strip()[-300:]))

        pool = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        # vsftpd's session processes end as their clients quit: wait until they are reaped.
        deadline = time.monotonic() + 10
        while len(tree(server.pid)) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        cpu = tree_cpu(server.pid) - before
        sampler.stop.set()
        sampler.join()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    done = [r for r in results if r[3] == 0]
    failed = [r for r in results if r[3] != 0]
    moved = sum(r[1] for r in done)
    return {
        "server": kind, "done": len(done), "failed": failed, "gib": moved / 2**30,
        "cpu": cpu, "client_cpu": client_cpu, "wall": wall, "pss_mib": sampler.peak_kib / 1024,
        "procs": sampler.peak_procs,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=1, help="runs per server, alternating")
    ap.add_argument("--lab", action="store_true",
                    help="servers in one host of a two-host lab, clients in the other (root)")
    ap.add_argument("--only", choices=["braid", "vsftpd"],
                    help="run the load against one server alone (to profile it)")
    ap.add_argument("--dir", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    args = ap.parse_args()
    for tool in ("curl",):
        if shutil.which(tool) is None:
            sys.exit(f"bench/server_cost.py needs {tool}")
    if shutil.which("vsftpd") is None and not os.path.exists("/usr/sbin/vsftpd"):
        sys.exit("bench/server_cost.py needs vsftpd (apt-get install vsftpd)")
    if not os.access(BRAID, os.X_OK):
        sys.exit("build first: cargo build --release")
    raise_fd_limit(args.clients)
    work = tempfile.mkdtemp(prefix="braid-cost-", dir=args.dir)
    # vsftpd run by root would refuse a root-owned anonymous root it can write: the files are
    # readable and writable by everyone, as a test server's are.
    os.chmod(work, 0o755)
    lab = None
    try:
        root = os.path.join(work, "root")
        os.makedirs(root)
        sizes = sizes_for(args.clients, random.Random(7))
        for size in sorted(set(sizes)):
            random_file(os.path.join(root, f"f{size}.bin"), size)
        addr, server_prefix, client_prefix = "127.0.0.1", [], []
        if args.lab:
            if os.geteuid() != 0:
                sys.exit("--lab creates network namespaces: run it as root")
            lab = subprocess.Popen([BRAID, "lab", "link", "--name", LAB],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
            for line in lab.stderr:
                if "are up" in line:
                    break
            else:
                sys.exit("braid lab link did not come up")
            threading.Thread(target=lab.stderr.read, daemon=True).start()
            addr = "198.18.0.2"
            server_prefix = ["ip", "netns", "exec", f"{LAB}-right"]
            client_prefix = ["ip", "netns", "exec", f"{LAB}-left"]
        rows = []
        for _ in range(args.repeat):
            for kind in [args.only] if args.only else ("braid", "vsftpd"):
                rows.append(load(kind, args, work, root, sizes, addr, server_prefix,
                                 client_prefix))
        report(args, sizes, rows)
        if any(r["failed"] for r in rows):
            sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        if lab is not None:
            lab.send_signal(2)
            try:
                lab.wait(timeout=30)
            except subprocess.TimeoutExpired:
                lab.kill()
        shutil.rmtree(work, ignore_errors=True)


def report(args, sizes, rows):
    print(f"clients: {args.clients}, each a curl download and upload; sizes "
          + ", ".join(f"{sizes.count(s)} x {human(s)}" for s, _ in SIZES)
          + ("; clients in another lab host" if args.lab else "; all on loopback"))
    print("| server | transfers done | failed | GiB | CPU s | CPU s per GiB | CPU ms per file "
          "| clients' CPU s | server + clients CPU s "
          "| peak anonymous memory MiB (PSS) | peak processes | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server']} | {r['done']} | {len(r['failed'])} | {r['gib']:.2f} | "
              f"{r['cpu']:.2f} | {r['cpu'] / max(r['gib'], 1e-9):.2f} | "
              f"{1000 * r['cpu'] / max(r['done'], 1):.2f} | {r['client_cpu']:.2f} | "
              f"{r['cpu'] + r['client_cpu']:.2f} | {r['pss_mib']:.1f} | {r['procs']} | "
              f"{r['wall']:.1f} |")
    for kind in ("braid", "vsftpd"):
        mine = [r for r in rows if r["server"] == kind]
        for r in mine:
            for f in r["failed"][:3]:
                print(f"  FAILED ({kind}) {f[0]} {human(f[1])}: exit {f[3]}: {f[4]}")
    if args.only:
        return
    per = {k: statistics.mean(r["cpu"] / max(r["gib"], 1e-9) for r in rows if r["server"] == k)
           for k in ("braid", "vsftpd")}
    per_file = {k: statistics.mean(r["cpu"] / max(r["done"], 1) for r in rows
                                   if r["server"] == k) for k in ("braid", "vsftpd")}
    both = {k: statistics.mean(r["cpu"] + r["client_cpu"] for r in rows if r["server"] == k)
            for k in ("braid", "vsftpd")}
    print(f"braid / vsftpd: CPU per GiB {per['braid'] / per['vsftpd']:.2f}, "
          f"CPU per file {per_file['braid'] / per_file['vsftpd']:.2f}, server and clients "
          f"together {both['braid'] / both['vsftpd']:.2f} (means over the runs)")


if __name__ == "__main__":
    main()
