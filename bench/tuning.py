#!/usr/bin/env python3
"""Self-tuning against fixed connection counts, in the lab: braid get and put over named
scenarios with `-n auto` and with fixed counts, goodput over the whole command (from --json)
as a fraction of the link's payload rate, median of R runs, the queue drops the run caused,
and for auto the time until the transfer first reached 90 % of its final rate.

    cargo build --release && sudo python3 bench/tuning.py \\
        [--scenario satellite-t1-24k,satellite-t1,dsl-1m-bloat,lan-100m,lfn-200m] \\
        [--streams auto,1,2,4,8,16] [--direction get,put] [--repeat 3] [--seconds 60] \\
        [--security clear,tls]

Scenarios are `braid lab scenarios` names, plus:
- `satellite-t1-24k`: satellite-t1 with tcp_rmem/tcp_wmem capped at 48 KiB in both lab hosts,
  which gives XFTP's 1998 hosts their ~24 KB advertised window; braid may not raise it.
- `lfn-200m`: lfn-500m's delay and loss at 200 Mbit/s, which the relay carries cleanly on two
  cores (at 500 Mbit/s it drops packets at its TUN devices under load).

`--security tls` runs the same cells with TLS on the control and every data connection (a
certificate for 198.18.0.2 is made with openssl), to check that parallel streams bring the
same gain encrypted as in clear.

The file lasts about `--seconds` at the payload rate. Cells run in an interleaved order (each
repetition goes through every cell, shuffled with a fixed seed), so drift on a shared machine
does not bias one cell. Results go to --out (one JSON line per run) and a Markdown table to
stdout. Needs root; every lab is removed when its run ends.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from common import certificate, random_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CAP_24K = "sysctl -qw net.ipv4.tcp_rmem='4096 49152 49152' net.ipv4.tcp_wmem='4096 49152 49152'"

# name: (lab arguments, shell prefix run in both hosts, payload bit/s)
PAYLOAD = 1448 / 1500  # TCP payload per IP byte at MTU 1500 with timestamps
SCENARIOS = {
    "satellite-t1-24k": (["--scenario", "satellite-t1"], CAP_24K, 1.536e6),
    "satellite-t1": (["--scenario", "satellite-t1"], "", 1.536e6),
    "dsl-1m-bloat": (["--scenario", "dsl-1m-bloat"], "", 1e6),
    "lan-100m": (["--scenario", "lan-100m"], "", 100e6),
    "lfn-200m": (["--scenario", "lfn-500m", "--rate", "200mbit", "--queue", "3750000B"], "", 200e6),
    "lfn-500m": (["--scenario", "lfn-500m"], "", 500e6),
}


def run(braid, scenario, direction, streams, security, work, seconds, name):
    link, prefix, rate = SCENARIOS[scenario]
    server_tls = client_tls = ""
    if security == "tls":
        cert, key = certificate(work, "198.18.0.2")
        server_tls = f" --tls-cert {cert} --tls-key {key}"
        client_tls = f" --tls-ca {cert}"
    payload = rate * PAYLOAD / 8
    size = int(payload * seconds)
    src = os.path.join(work, "root", f"f{size}.bin")
    if not os.path.exists(src):
        random_file(src, size)
    serve = f"{braid} serve --root {work}/root --listen 198.18.0.2:2121 --anonymous-write{server_tls}"
    if direction == "get":
        client = f"{braid} get ftp://198.18.0.2:2121/f{size}.bin /dev/null -n {streams} --json -q{client_tls}"
    else:
        client = (f"env XDG_STATE_HOME={work}/state {braid} put {src} "
                  f"ftp://198.18.0.2:2121/up/u{size}.bin -n {streams} --json -q{client_tls}")
    wrap = lambda cmd: f"sh -c \"{prefix}; exec {cmd}\"" if prefix else cmd
    timeout = int(seconds * 6 + 120)
    out = subprocess.run(
        [braid, "lab", "run", "--name", name, "--json", "--timeout", str(timeout)] + link
        + ["--server", wrap(serve), "--client", wrap(client)],
        capture_output=True, text=True)
    try:
        report = json.loads(out.stdout)
    except json.JSONDecodeError:
        text = out.stderr or out.stdout
        return {"error": text if len(text) < 800 else text[:500] + " ... " + text[-300:]}
    try:
        summary = json.loads(report["client"]["stdout"].strip().splitlines()[-1])
    except (json.JSONDecodeError, KeyError, IndexError):
        client = report.get("client", {})
        return {"error": f"client exit {client.get('exit')}: {client.get('stderr', '')[-1500:]}"}
    drops = sum(report["link"][d].get("queue_drops", 0) for d in ("up", "down"))
    return {
        "fraction": summary["bytes_per_second"] / payload,
        "seconds": summary["seconds"],
        "streams": summary["streams"],
        "drops": drops,
        "t90": time_to_90(summary),
        "cc": summary.get("congestion"),
        "counts": summary.get("connection_count", []),
        "decisions": summary.get("decisions", []),
    }


def time_to_90(summary):
    """Seconds from the transfer's start until the rate, summed over connections from the
    kernel's byte counters in the timeline (`moved`), first reached 90 % of its final level
    (the median of the last half of the seconds), and that final level in bytes/s."""
    rows = {}
    for row in summary.get("timeline", []):
        if row.get("moved") is not None:
            rows.setdefault(row["conn"], []).append((row["t"], row["moved"]))
    per_second = {}
    for series in rows.values():
        for (t0, m0), (t1, m1) in zip(series, series[1:]):
            if t1 > t0:
                per_second.setdefault(int(t1), 0.0)
                per_second[int(t1)] += (m1 - m0) / (t1 - t0)
    if len(per_second) < 4:
        return None
    secs = sorted(per_second)
    final = statistics.median(per_second[s] for s in secs[len(secs) // 2:])
    return next((s for s in secs if per_second[s] >= 0.9 * final), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="satellite-t1-24k,satellite-t1,dsl-1m-bloat,lan-100m,lfn-200m")
    ap.add_argument("--streams", default="auto,1,2,4,8,16")
    ap.add_argument("--direction", default="get,put")
    ap.add_argument("--security", default="clear", help="clear, tls or clear,tls")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--braid", default=os.path.join(ROOT, "target", "release", "braid"))
    ap.add_argument("--out", default="tuning-results.jsonl")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/tuning.py runs braid lab, which needs root")
    scenarios = args.scenario.split(",")
    for s in scenarios:
        if s not in SCENARIOS:
            sys.exit(f"unknown scenario {s}; known: {', '.join(SCENARIOS)}")
    securities = args.security.split(",")
    if not set(securities) <= {"clear", "tls"}:
        sys.exit(f"--security takes clear, tls or both, not {args.security}")
    cells = [(s, d, n, t) for s in scenarios for d in args.direction.split(",")
             for n in args.streams.split(",") for t in securities]
    rng = random.Random(1)
    work = tempfile.mkdtemp(prefix="braid-tuning-")
    os.makedirs(os.path.join(work, "root", "up"))
    results = {c: [] for c in cells}
    name = f"tune{os.getpid() % 10000}"
    total = len(cells) * args.repeat
    done = 0
    try:
        with open(args.out, "a") as log:
            for rep in range(args.repeat):
                order = cells[:]
                rng.shuffle(order)
                for cell in order:
                    r = run(args.braid, *cell, work, args.seconds, name)
                    done += 1
                    r.update(scenario=cell[0], direction=cell[1], streams_asked=cell[2],
                             security=cell[3], rep=rep)
                    log.write(json.dumps(r) + "\n")
                    log.flush()
                    print(f"[{done}/{total}] {cell}: "
                          + (f"{r['fraction']:.3f} of payload rate, {r['streams']} streams, "
                             f"{r['drops']} drops" if "error" not in r else f"error {r['error']}"),
                          file=sys.stderr)
                    if "error" not in r:
                        results[cell].append(r)
    except KeyboardInterrupt:
        print("interrupted: the table has what was measured", file=sys.stderr)
    finally:
        subprocess.run(["rm", "-rf", work])
    print("| scenario | direction | -n | security | goodput / payload rate (median) | runs | streams used | congestion control | queue drops (median) | time to 90 % (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cell in cells:
        rs = results[cell]
        if not rs:
            continue
        frac = statistics.median(r["fraction"] for r in rs)
        runs = ", ".join(f"{r['fraction']:.3f}" for r in rs)
        used = ", ".join(str(r["streams"]) for r in rs)
        ccs = ", ".join(sorted({str(r.get("cc")) for r in rs}))
        drops = statistics.median(r["drops"] for r in rs)
        t90 = [r["t90"] for r in rs if r["t90"] is not None]
        t90 = f"{statistics.median(t90):.0f}" if t90 else "-"
        print(f"| {cell[0]} | {cell[1]} | {cell[2]} | {cell[3]} | {frac:.3f} | {runs} | {used} | {ccs} | {drops:.0f} | {t90} |")


if __name__ == "__main__":
    main()
