#!/usr/bin/env python3
"""Many small files over an emulated link: a whole tree down and up through `braid lab`,
braid against the tools people use for trees, each against its best server, in one run.

Rows, each a tree of FILES files of SIZE bytes in 10 directories, from and to /dev/shm:
  braid get -r / put -r -j 8          against braid serve, and against globus-gridftp-server
  lftp mirror -P 8 (-R to upload)     against vsftpd
  globus-url-copy -r -cc 8 -pp -fast  against globus-gridftp-server
Each row runs RUNS times, in turn with the others, each run in a lab of its own (the server in
the right host, the client in the left); the table gives the median seconds of the client's
command, files per second, and each tool's time over braid's (above 1: braid is faster).

    cargo build --release
    sudo python3 bench/tree_lab.py --scenario lan-100m --delay 10ms [--files 10000] [--size 4096]
    sudo python3 bench/tree_lab.py --scenario satellite-t1 --files 1000

Needs root (network namespaces), lftp, vsftpd, globus-url-copy and globus-gridftp-server
(scripts/test installs them); a row whose program is missing is skipped and said so. Every
lab and server is removed when its run ends, also on error.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from common import BRAID, gridftp_command, program, vsftpd_conf
from tree import count_files, layout, table

HOST = "198.18.0.2"


def wait_then(port, cmd):
    """The client's command, once the server listens, timed in nanoseconds by the shell."""
    return ("bash -c 'for i in $(seq 200); do (exec 3<>/dev/tcp/%s/%d) 2>/dev/null && break; sleep 0.05; done; "
            "a=$(date +%%s%%N); %s; rc=$?; b=$(date +%%s%%N); echo ELAPSED_NS $((b - a)); exit $rc'"
            % (HOST, port, cmd))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="lan-100m")
    ap.add_argument("--delay", help="one-way delay over the scenario's, e.g. 10ms")
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per file")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--direction", default="get,put")
    ap.add_argument("--tools", default="braid,lftp,globus", help="rows to run, by their first word")
    ap.add_argument("--braid", default=BRAID)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/tree_lab.py runs braid lab, which needs root")
    link = ["--scenario", args.scenario] + (["--delay", args.delay] if args.delay else [])
    work = tempfile.mkdtemp(prefix="braid-treelab-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(work, 0o755)
    rows, skipped = {}, []
    try:
        srv, up, src, local_src, dst = layout(work, args.files, args.size)
        b = args.braid
        serve = f"{b} serve --root {srv} --listen {HOST}:2121 --anonymous-write --max-connections 1000"
        url = f"ftp://{HOST}:2121"
        def braid_rows(row, server, port):
            at = f"ftp://{HOST}:{port}"
            return [(row, "get", server, port, f"{b} get -r -j 8 -q {at}/src/ {dst}", os.path.join(dst, "src")),
                    (row, "put", server, port, f"{b} put -r -j 8 -q {local_src} {at}/up/", os.path.join(up, "src"))]

        # (row, direction, server, port, client, where the files land)
        cases = braid_rows("braid -r -j 8 <-> braid serve", serve, 2121)
        if shutil.which("lftp") and program("vsftpd"):
            vs = f"{program('vsftpd')} {vsftpd_conf(work, srv, HOST, 2121, writable=True)}"
            lftp = "lftp -e \"set net:max-retries 1; %s; quit\" " + url
            cases += [
                ("lftp mirror -P 8 <-> vsftpd", "get", vs, 2121,
                 lftp % f"mirror -P 8 src {dst}/src", os.path.join(dst, "src")),
                ("lftp mirror -P 8 <-> vsftpd", "put", vs, 2121,
                 lftp % f"mirror -R -P 8 {local_src} up/src", os.path.join(up, "src")),
            ]
        else:
            skipped.append("lftp against vsftpd: lftp or vsftpd not installed")
        gs = program("globus-gridftp-server")
        if gs and shutil.which("globus-url-copy"):
            grid = " ".join(gridftp_command(srv, HOST, 2811))
            guc = "globus-url-copy -r -cc 8 -pp -fast -cd"
            # braid against the same server: a GridFTP server, not braid's own.
            cases += braid_rows("braid -r -j 8 <-> gridftp", grid, 2811)
            cases += [
                ("globus-url-copy -cc 8 -pp <-> gridftp", "get", grid, 2811,
                 f"{guc} ftp://{HOST}:2811{src}/ file://{dst}/src/", os.path.join(dst, "src")),
                ("globus-url-copy -cc 8 -pp <-> gridftp", "put", grid, 2811,
                 f"{guc} file://{local_src}/ ftp://{HOST}:2811{up}/src/", os.path.join(up, "src")),
            ]
        else:
            skipped.append("globus-url-copy: Globus programs not installed")
        directions = args.direction.split(",")
        for r in range(args.runs):
            for name, direction, server, port, client, landed in cases:
                if direction not in directions or name.split()[0].split("-")[0] not in args.tools.split(","):
                    continue
                shutil.rmtree(dst, ignore_errors=True)
                shutil.rmtree(os.path.join(up, "src"), ignore_errors=True)
                os.makedirs(dst)
                os.chmod(dst, 0o777)
                out = subprocess.run(
                    [b, "lab", "run", "--name", "treelab", "--json", "--timeout", str(args.timeout)] + link
                    + ["--server", server, "--client", wait_then(port, client)],
                    capture_output=True, text=True)
                try:
                    report = json.loads(out.stdout)
                    lines = report["client"]["stdout"].strip().splitlines()
                    took = int(lines[-1].split()[1]) / 1e9
                except (json.JSONDecodeError, KeyError, IndexError, ValueError):
                    print(f"  {name} {direction}: failed: {(out.stderr or out.stdout)[-800:]}")
                    continue
                got = count_files(landed)
                if report["client"].get("exit") != 0 or got != args.files:
                    print(f"  {name} {direction}: exit {report['client'].get('exit')}, {got} of {args.files} files: "
                          f"{report['client'].get('stderr', '')[-800:]}")
                    continue
                rows.setdefault((name, direction), []).append(took)
                print(f"  run {r + 1}: {name} {direction}: {took:.2f} s", flush=True)
    finally:
        subprocess.run([args.braid, "lab", "clean", "--name", "treelab"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    where = args.scenario + (f" with {args.delay} one way" if args.delay else "")
    print(f"\n{args.files} files of {args.size} bytes in 10 directories, {where}, median of {args.runs}, "
          f"{os.cpu_count()} cores\n")
    table(rows, "braid -r -j 8 <-> braid serve", directions, args.files)
    for s in skipped:
        print(f"skipped: {s}")


if __name__ == "__main__":
    main()
