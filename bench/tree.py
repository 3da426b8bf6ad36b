#!/usr/bin/env python3
"""Many small files: a whole tree down and up on loopback, braid against the tools people use
for trees, in one run.

Rows, each a whole tree of FILES files of SIZE bytes in 10 directories, from and to /dev/shm:
  braid get -r / put -r -j 8          against braid serve, and against globus-gridftp-server
  lftp mirror -P 8 (-R to upload)     against braid serve and against vsftpd
  globus-url-copy -r -cc 8 -pp -fast  against globus-gridftp-server
Each row runs RUNS times, in turn with the others; the table gives the median seconds, files
per second, and each tool's time over braid's (above 1: braid is faster).

    cargo build --release && python3 bench/tree.py [--files 10000] [--size 4096] [--runs 3]

Needs lftp, vsftpd, globus-url-copy and globus-gridftp-server (scripts/test installs them);
a row whose program is missing is skipped and said so. Only loopback is used; every server
started here is stopped at the end, also on error.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from common import BRAID, Servers, program, start_gridftp, start_vsftpd


def make_tree(top, files, size):
    for i in range(files):
        d = os.path.join(top, f"d{i % 10}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(os.urandom(size))


def layout(work, files, size):
    """The served root (with a writable `up`), the tree in it, a copy to upload, and where
    downloads land: (srv, up, src, local_src, dst)."""
    srv = os.path.join(work, "srv")
    up = os.path.join(srv, "up")
    os.makedirs(up)
    os.chmod(srv, 0o755)
    os.chmod(up, 0o777)
    src = os.path.join(srv, "src")
    make_tree(src, files, size)
    local_src = os.path.join(work, "local", "src")
    shutil.copytree(src, local_src)
    return srv, up, src, local_src, os.path.join(work, "dst")


def count_files(top):
    return sum(len(fs) for _, _, fs in os.walk(top))


def timed(cmd, expect_dir, files):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    took = time.perf_counter() - t
    got = count_files(expect_dir)
    if got != files:
        raise RuntimeError(f"{cmd[0]} moved {got} of {files} files")
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per file")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--braid", default=BRAID)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="braid-tree-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    servers = Servers()
    rows = {}
    skipped = []
    try:
        srv, up, src, local_src, dst = layout(work, args.files, args.size)

        p = servers.start([args.braid, "serve", "--root", srv, "--listen", "127.0.0.1:0", "--anonymous-write",
                           "--max-connections", "1000"])
        braid_port = int(p.stdout.readline().decode().rsplit(":", 1)[1].strip().rstrip("/"))
        def braid_cases(name, port):
            def get():
                return [args.braid, "get", "-r", "-j", "8", "-q", f"ftp://127.0.0.1:{port}/src/", dst], \
                    os.path.join(dst, "src")

            def put():
                return [args.braid, "put", "-r", "-j", "8", "-q", local_src, f"ftp://127.0.0.1:{port}/up/"], \
                    os.path.join(up, "src")
            return [(name, "get", get), (name, "put", put)]

        # (row, direction, command maker, where the files land)
        cases = braid_cases("braid -j 8 <-> braid serve", braid_port)

        def lftp_cases(name, port, remote_up, landed_up):
            def get():
                return ["lftp", "-e", f"set net:max-retries 1; mirror -P 8 src {dst}/src; quit",
                        f"ftp://127.0.0.1:{port}"], os.path.join(dst, "src")

            def put():
                return ["lftp", "-e", f"set net:max-retries 1; mirror -R -P 8 {local_src} {remote_up}/src; quit",
                        f"ftp://127.0.0.1:{port}"], landed_up
            return [(name, "get", get), (name, "put", put)]

        if shutil.which("lftp"):
            cases += lftp_cases("lftp mirror -P 8 <-> braid serve", braid_port, "up", os.path.join(up, "src"))
            vs = program("vsftpd")
            if vs:
                port = start_vsftpd(servers, work, srv, writable=True)
                # Paths relative to the login directory: vsftpd run by its launching user does not chroot.
                cases += lftp_cases("lftp mirror -P 8 <-> vsftpd", port, "up", os.path.join(up, "src"))
            else:
                skipped.append("lftp against vsftpd: vsftpd not installed")
        else:
            skipped.append("lftp: not installed")

        gs = program("globus-gridftp-server")
        if gs and shutil.which("globus-url-copy"):
            port = start_gridftp(servers, srv)
            guc = ["globus-url-copy", "-r", "-cc", "8", "-pp", "-fast", "-cd"]

            def g_get():
                return guc + [f"ftp://127.0.0.1:{port}{src}/", f"file://{dst}/src/"], os.path.join(dst, "src")

            def g_put():
                return guc + [f"file://{local_src}/", f"ftp://127.0.0.1:{port}{up}/src/"], os.path.join(up, "src")
            cases += [("globus-url-copy -cc 8 -pp <-> gridftp", "get", g_get),
                      ("globus-url-copy -cc 8 -pp <-> gridftp", "put", g_put)]
            cases += braid_cases("braid -j 8 <-> gridftp", port)
        else:
            skipped.append("globus-url-copy: Globus programs not installed")

        for r in range(args.runs):
            for name, direction, make in cases:
                cmd, landed = make()
                shutil.rmtree(dst, ignore_errors=True)
                shutil.rmtree(os.path.join(up, "src"), ignore_errors=True)
                os.makedirs(dst, exist_ok=True)
                try:
                    took = timed(cmd, landed, args.files)
                except (subprocess.SubprocessError, RuntimeError) as e:
                    print(f"  {name} {direction}: failed ({e})")
                    continue
                rows.setdefault((name, direction), []).append(took)
                print(f"  run {r + 1}: {name} {direction}: {took:.2f} s")
    finally:
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.files} files of {args.size} bytes in 10 directories, loopback, median of {args.runs}, "
          f"{os.cpu_count()} cores\n")
    table(rows, "braid -j 8 <-> braid serve", ("get", "put"), args.files)
    for s in skipped:
        print(f"skipped: {s}")


def table(rows, ours, directions, files):
    """The markdown table of `rows` ((tool, direction) -> seconds of each run): medians, files
    per second, and each tool's time over that of the `ours` row."""
    print("| tool | direction | seconds | files/s | x braid's time | runs (s) |")
    print("|---|---|---|---|---|---|")
    for direction in directions:
        mine = rows.get((ours, direction))
        ref = statistics.median(mine) if mine else None
        for (name, d), times in rows.items():
            if d != direction:
                continue
            m = statistics.median(times)
            ratio = f"{m / ref:.2f}" if ref else "-"
            print(f"| {name} | {d} | {m:.2f} | {files / m:.0f} | {ratio} | {', '.join(f'{t:.2f}' for t in times)} |")


if __name__ == "__main__":
    main()
