#!/usr/bin/env python3
"""Loopback throughput of braid next to the tools it means to beat, measured in one run.

Rows: iperf3 with one stream (memory to memory: the ceiling), braid get with -n auto (the
default) to /dev/null and with 1, 4 and 8 connections to /dev/null and to disk, curl downloading from vsftpd, and globus-url-copy -p 4
downloading from globus-gridftp-server. Each is run 3 times on the same cached file; the table
gives the median in MB/s (10^6 bytes/s) and its ratio to iperf3's median.

    cargo build --release && python3 bench/loopback.py [--size-mib 2048] [--runs 3] [--braid PATH]

A second table gives the CPU time per GiB moved, client and server together, for iperf3 (from
its own JSON) and braid get -n 4 to /dev/null (from rusage and /proc): what the data path
costs beyond the kernel's copies. It has two references: iperf3 memory to memory (no file is
read) and iperf3 -F reading the same cached file through its buffer (the work of moving a file). --braid measures another build (e.g. the one before a change).

Needs iperf3, vsftpd, curl, globus-url-copy and globus-gridftp-server (scripts/test installs
all but iperf3: apt-get install iperf3). Rows whose program is missing are skipped and said so.
Only loopback is used; every server started here is stopped at the end, also on error.
"""

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

IPERF_MEM = "iperf3, 1 stream, memory to memory"
IPERF_FILE = "iperf3 -F, 1 stream, reads the same file"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRAID = os.path.join(ROOT, "target", "release", "braid")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, limit=10.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{proc.args[0]} did not listen on {port}")


def random_file(path, size):
    """Writes `size` random bytes to `path`, 64 MiB at a time."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n


def certificate(work, host):
    """A self-signed certificate (and key) for `host`, a name or an IPv4 address, in `work`:
    made once, with openssl, as admins make them."""
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    if not os.path.exists(cert):
        san = f"IP:{host}" if host.replace(".", "").isdigit() else f"DNS:{host}"
        subprocess.run(
            ["openssl", "req", "-x509", "-nodes", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", cert, "-days", "1",
             "-subj", f"/CN={host}", "-addext", f"subjectAltName={san}"],
            check=True, capture_output=True)
    return cert, key


def program(name):
    for d in ("/usr/sbin", "/sbin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def start_vsftpd(servers, work, root, writable=False):
    """An anonymous vsftpd serving `root` on a free loopback port (uploads too when
    `writable`); returns the port. Run by its launching user, it does not chroot: paths in
    commands are relative to `root` or absolute on this machine."""
    port = free_port()
    empty = os.path.join(work, "empty")
    os.makedirs(empty, exist_ok=True)
    conf = os.path.join(work, "vsftpd.conf")
    write = ("write_enable=YES\nanon_upload_enable=YES\nanon_mkdir_write_enable=YES\n"
             "anon_other_write_enable=YES\nanon_umask=022\n") if writable else ""
    with open(conf, "w") as f:
        f.write(f"listen=YES\nlisten_ipv6=NO\nlisten_address=127.0.0.1\nlisten_port={port}\n"
                f"background=NO\nanonymous_enable=YES\nlocal_enable=NO\nanon_root={root}\n"
                f"no_anon_password=YES\nseccomp_sandbox=NO\nrun_as_launching_user=YES\n{write}"
                f"max_clients=0\nmax_per_ip=0\n"
                f"pasv_enable=YES\npasv_address=127.0.0.1\nsecure_chroot_dir={empty}\n")
    wait_port(port, servers.start([program("vsftpd"), conf]))
    return port


def start_gridftp(servers, home):
    """An anonymous globus-gridftp-server (as this user) with `home` as its home directory,
    on a free loopback port; returns the port."""
    port = free_port()
    user = os.environ.get("USER", "root")
    wait_port(port, servers.start([program("globus-gridftp-server"), "-aa", "-anonymous-user", user,
                                   "-auth-level", "0", "-p", str(port),
                                   "-control-interface", "127.0.0.1", "-data-interface", "127.0.0.1",
                                   "-home-dir", home, "-allow-root", "-log-level", "ERROR"]))
    return port


class Servers:
    """Processes to stop at the end, each in its own process group."""

    def __init__(self):
        self.procs = []

    def start(self, args, **kw):
        p = subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # p.pid leads its own group (start_new_session)
            except ProcessLookupError:
                pass
            p.wait()


def proc_cpu(pid):
    """CPU seconds (user + system) a running process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, size):
    """Runs cmd, returns MB/s over wall-clock time."""
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    return size / (time.perf_counter() - t) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--braid", default=BRAID, help="the braid binary to measure")
    args = ap.parse_args()
    braid = args.braid
    if not os.access(braid, os.X_OK):
        sys.exit(f"{braid} is missing: run cargo build --release first")
    size = args.size_mib << 20
    work = tempfile.mkdtemp(prefix="braid-bench-")
    os.chmod(work, 0o755)
    servers = Servers()
    rows = []  # (name, [MB/s...]) or (name, None, why)
    cpu = {}  # name -> [CPU seconds per GiB, client + server]
    try:
        srv = os.path.join(work, "srv")
        os.mkdir(srv)
        os.chmod(srv, 0o755)
        src = os.path.join(srv, "f.bin")
        random_file(src, size)
        os.chmod(src, 0o644)
        subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)  # into the page cache

        def measure(name, fn):
            try:
                rows.append((name, [fn() for _ in range(args.runs)]))
            except Exception as e:  # a failed row is reported, not hidden
                rows.append((name, None, str(e)))
            print(f"  measured {name}", file=sys.stderr)

        if program("iperf3"):
            def iperf(extra, key):
                port = free_port()
                servers.start(["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(port)])
                time.sleep(0.3)
                out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-n", str(size), "-J"]
                                     + extra, check=True, capture_output=True, text=True, timeout=300).stdout
                end = json.loads(out)["end"]
                u = end["cpu_utilization_percent"]
                secs = end["sum_received"]["seconds"]
                moved = end["sum_received"]["bytes"]
                cpu.setdefault(key, []).append(
                    (u["host_total"] + u["remote_total"]) / 100 * secs / (moved / 2**30))
                return end["sum_received"]["bits_per_second"] / 8e6
            measure("iperf3, 1 stream (memory to memory)", lambda: iperf([], IPERF_MEM))
            # The same cached file braid sends, read through iperf3's buffer: the work of moving
            # a file, where memory to memory leaves out the sender's read.
            measure("iperf3 -F, 1 stream (reads the same cached file)", lambda: iperf(["-F", src], IPERF_FILE))
        else:
            rows.append(("iperf3, 1 stream (memory to memory)", None, "iperf3 not installed"))

        p = servers.start([braid, "serve", "--root", srv, "--listen", "127.0.0.1:0"], text=True)
        line = p.stdout.readline()
        url = line.split("ftp://")[1].strip().rstrip("/")
        disk = os.path.join(work, "disk.bin")
        # Not measured: the server computes the file's checksum on the first download and
        # keeps it, so every row below measures the same steady state.
        subprocess.run([braid, "get", f"ftp://{url}/f.bin", "/dev/null"], check=True,
                       capture_output=True, timeout=600)
        for n in ("auto", 1, 4, 8):
            def braid_get(dest, n=n):
                before = proc_cpu(p.pid) + children_cpu()
                out = subprocess.run([braid, "get", f"ftp://{url}/f.bin", dest, "-n", str(n), "--json"],
                                     check=True, capture_output=True, text=True, timeout=600).stdout
                if n == 4 and dest == "/dev/null":
                    used = proc_cpu(p.pid) + children_cpu() - before
                    cpu.setdefault("braid get -n 4 -> /dev/null", []).append(used / (size / 2**30))
                if os.path.exists(disk):
                    os.remove(disk)
                return json.loads(out)["bytes_per_second"] / 1e6
            measure(f"braid get -n {n} -> /dev/null (XXH3 checked)", lambda: braid_get("/dev/null"))
            if n != "auto":
                measure(f"braid get -n {n} -> disk (XXH3 checked)", lambda: braid_get(disk))

        vs = program("vsftpd")
        if vs and shutil.which("curl"):
            port = start_vsftpd(servers, work, srv)
            measure("curl <- vsftpd (stream mode)",
                    lambda: timed(["curl", "-sS", "-o", "/dev/null", f"ftp://127.0.0.1:{port}/f.bin"], size))
        else:
            rows.append(("curl <- vsftpd (stream mode)", None, "vsftpd or curl not installed"))

        gs = program("globus-gridftp-server")
        if gs and shutil.which("globus-url-copy"):
            port = start_gridftp(servers, srv)
            measure("globus-url-copy -p 4 <- globus-gridftp-server",
                    lambda: timed(["globus-url-copy", "-p", "4", f"ftp://127.0.0.1:{port}{src}",
                                   "file:///dev/null"], size))
        else:
            rows.append(("globus-url-copy -p 4 <- globus-gridftp-server", None, "Globus programs not installed"))
    finally:
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)

    ref = next((statistics.median(r[1]) for r in rows if r[0].startswith("iperf3") and r[1]), None)
    cores = os.cpu_count()
    print(f"\nloopback, {args.size_mib} MiB cached file, median of {args.runs}, {cores} cores\n")
    print(f"| {'what':52} | {'MB/s':>7} | {'x iperf3':>8} | runs (MB/s)")
    print(f"|{'-' * 54}|{'-' * 9}|{'-' * 10}|------------")
    for r in rows:
        if r[1] is None:
            print(f"| {r[0]:52} | {'-':>7} | {'-':>8} | skipped: {r[2]}")
            continue
        med = statistics.median(r[1])
        ratio = f"{med / ref:.2f}" if ref else "-"
        print(f"| {r[0]:52} | {med:7.0f} | {ratio:>8} | {', '.join(f'{v:.0f}' for v in r[1])}")
    if cpu:
        refs = {k: statistics.median(cpu[k]) for k in (IPERF_MEM, IPERF_FILE) if k in cpu}
        print(f"\nCPU seconds per GiB moved, client + server, median of {args.runs}\n")
        print(f"| {'what':52} | {'s/GiB':>7} | {'x memory':>8} | {'x file':>8} | runs")
        print(f"|{'-' * 54}|{'-' * 9}|{'-' * 10}|{'-' * 10}|------------")
        for name, v in cpu.items():
            med = statistics.median(v)
            ratios = [f"{med / refs[k]:.2f}" if k in refs else "-" for k in (IPERF_MEM, IPERF_FILE)]
            print(f"| {name:52} | {med:7.3f} | {ratios[0]:>8} | {ratios[1]:>8} | {', '.join(f'{x:.3f}' for x in v)}")
        print("\nx memory: against iperf3 memory to memory; x file: against iperf3 -F reading the same file.")

if __name__ == "__main__":
    main()
