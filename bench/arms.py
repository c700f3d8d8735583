#!/usr/bin/env python3
"""Diagnosis: several probe configurations against nothing attached, on one
workload, in windows of the same length.

    sudo W=15 ROUNDS=8 python3 bench/arms.py OFF - "-|--interval-ms 2000"

Each argument is an arm: `OFF` (nothing attached), or
`SKIP[|PROBE ARGS[|PREFIX CMD]]`: a `PLUMBER_PROBE_SKIP` value (`-` for
none; see probe/src/usage.rs), extra plumber-probe arguments, and a command
to run the probe under (e.g. `env RUST_LOG=plumber_probe=debug`). The arms
run ROUNDS times, forward then reverse order, each for W seconds (ON: the
probe's own recording window from its report.json). Prints, per window and
as the mean per arm: the workload's throughput (its GT lines), the target's
CPU and the machine's busy share. A few rounds do not resolve 1-3% on a
noisy machine; overhead.py with many pairs is the figure to quote.
Standard library only. Needs root.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Sampler, Workload  # noqa: E402

W = float(os.environ.get("W", "15"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))


def main():
    arms = sys.argv[1:]
    if not arms:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    probe = os.path.join(REPO, "target", "release", "plumber-probe")
    work = tempfile.mkdtemp(prefix="arms-")
    seconds = 5 + ROUNDS * len(arms) * 2 * (W + 8) + 60
    wl = Workload(os.path.join(REPO, ".venv", "bin", "python"), "tfrecord_image", seconds, work, [])
    wl.ready.wait(180)
    s = Sampler(wl.pid)
    time.sleep(5)
    res = {a: [] for a in arms}
    order = []
    for r in range(ROUNDS):
        order += arms if r % 2 == 0 else arms[::-1]
    try:
        for i, a in enumerate(order):
            if a == "OFF":
                st = time.time_ns()
                time.sleep(W)
                en = st + int(W * 1e9)
            else:
                skip, _, extra = a.partition("|")
                extra, _, pre = extra.partition("|")
                env = dict(os.environ, PLUMBER_PROBE_SKIP="" if skip == "-" else skip)
                out = os.path.join(work, f"p{i}")
                p = subprocess.run(
                    pre.split() + [probe, "--pid", str(wl.pid), "--duration", str(W),
                                   "--output", out, "-q"] + extra.split(),
                    env=env, capture_output=True, text=True)
                try:
                    with open(os.path.join(out, "report.json")) as f:
                        w = json.load(f)["window"]
                    st, en = int(w["start_ns"]), int(w["end_ns"])
                except (OSError, KeyError, ValueError):
                    print("ERR", a, p.stderr[-300:])
                    continue
                time.sleep(0.5)
            rate = wl.rate(st, en)
            cpu = s.between(st, en, 1)
            mach = s.between(st, en, 4) / os.cpu_count()
            res[a].append((rate, cpu, mach))
            print(f"{i:2} {a:50} rate {rate:7.1f} target {100 * cpu:6.1f}% "
                  f"machine {100 * mach:5.1f}%", flush=True)
    finally:
        wl.stop()
    print()
    for a in arms:
        v = res[a]
        if v:
            print(f"{a:50} rate {statistics.mean(x[0] for x in v):7.1f} "
                  f"target {100 * statistics.mean(x[1] for x in v):6.2f}% "
                  f"machine {100 * statistics.mean(x[2] for x in v):5.2f}%  n={len(v)}")


if __name__ == "__main__":
    main()
