#!/usr/bin/env python3
"""Many idle logged-in sessions against one `braid serve`: its memory and threads per idle
session, and how long a new login takes while they are open.

    python3 bench/idle_sessions.py --sessions 10000

The sessions come from many loopback addresses (127.A.B.1), 16 per address, so that the
server's per-address caps apply as they would to real clients. Everything runs on loopback
and is stopped at the end, also on failure."""

import argparse
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BRAID = os.path.join(HERE, "..", "target", "release", "braid")
PER_ADDRESS = 16


def source(i):
    n = i // PER_ADDRESS
    return f"127.{1 + n // 250}.{n % 250}.1"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def read_reply(sock, deadline):
    """The next complete reply's code; multi-line replies are read to their end."""
    buf = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
        lines = buf.split(b"\r\n")
        for line in lines[:-1]:
            if len(line) >= 4 and line[:3].isdigit() and line[3:4] == b" ":
                return int(line[:3])
    raise TimeoutError("no reply")


def login(addr, src, timeout=30):
    deadline = time.monotonic() + timeout
    s = socket.create_connection(addr, timeout=timeout, source_address=(src, 0))
    code = read_reply(s, deadline)
    if code != 220:
        raise RuntimeError(f"greeting {code}")
    s.sendall(b"USER anonymous\r\n")
    read_reply(s, deadline)
    s.sendall(b"PASS idle@\r\n")
    code = read_reply(s, deadline)
    if code != 230:
        raise RuntimeError(f"login {code}")
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=10000)
    ap.add_argument("--probes", type=int, default=20, help="new logins timed at the end")
    args = ap.parse_args()
    # The server and this script each hold a descriptor per session (sessions share their
    # root directory's); the server inherits the limit.
    need = args.sessions + 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), max(hard, need)))
    except (ValueError, OSError):
        sys.exit(f"need {need} open files; raise the limit (ulimit -n {need}) or run as root")
    root = tempfile.mkdtemp(prefix="braid-idle-")
    server_log = tempfile.NamedTemporaryFile(prefix="braid-idle-", suffix=".log", delete=False)
    server = subprocess.Popen(
        [BRAID, "serve", "--listen", "127.0.0.1:0", "--root", root,
         "--max-connections", str(args.sessions + 100), "--max-per-ip", str(PER_ADDRESS),
         "--idle-timeout", "3600"],
        stdout=subprocess.PIPE, stderr=server_log, text=True,
        env={**os.environ, "RUST_LOG": "warn"})
    socks = []
    try:
        line = server.stdout.readline()
        host, port = line.split("ftp://")[1].strip().rstrip("/").rsplit(":", 1)
        addr = (host, int(port))
        time.sleep(0.3)
        base_rss, base_threads = rss_kib(server.pid), threads(server.pid)
        started = time.monotonic()
        for i in range(args.sessions):
            try:
                socks.append(login(addr, source(i)))
            except Exception as e:
                sys.exit(f"session {i} from {source(i)}: {e!r}; server log: {server_log.name}")
        took = time.monotonic() - started
        time.sleep(1)
        rss, nthreads = rss_kib(server.pid), threads(server.pid)
        probes = []
        for i in range(args.probes):
            t0 = time.monotonic()
            s = login(addr, f"127.254.{i}.1")
            probes.append((time.monotonic() - t0) * 1000)
            s.close()
        # The idle sessions still answer.
        alive = 0
        for s in socks[:: max(1, len(socks) // 100)]:
            s.sendall(b"NOOP\r\n")
            alive += read_reply(s, time.monotonic() + 10) == 200
        print(f"sessions: {args.sessions} logged in over {took:.1f} s")
        print(f"server memory: {base_rss / 1024:.1f} MiB before, {rss / 1024:.1f} MiB with them: "
              f"{(rss - base_rss) / args.sessions:.1f} KiB per idle session")
        print(f"server threads: {base_threads} before, {nthreads} with them")
        print(f"new login while they idle: median {statistics.median(probes):.1f} ms, "
              f"max {max(probes):.1f} ms over {len(probes)}")
        print(f"idle sessions answering NOOP: {alive} of {len(socks[:: max(1, len(socks) // 100)])} asked")
    finally:
        for s in socks:
            s.close()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        os.rmdir(root)


if __name__ == "__main__":
    main()
