#!/usr/bin/env python3
"""Accuracy of `--pid` mode's per-op CPU split against the shim's, on one process.

    sudo python3 bench/shim_vs_pid.py [--workload interleave] [--runs 3]
        [--seconds 8] [--probe target/release/plumber-probe]

Each run starts the workload under `plumber-probe run` (the LD_PRELOAD shim
times every stretch of work between two `record_stop` calls, so its split is
the reference), attaches `plumber-probe --pid` for --seconds once it is READY,
then stops `run` with SIGTERM (which ends its recording and the workload), so
both modes cover nearly the same stretch of the same process: separate
processes, or stretches seconds apart, differ by more than the split's error.
Prints each op's CPU per element in both modes and their ratio (--pid over
run), and the ratios' range per op over the runs. The e2e test
`shim::run_agrees_with_pid_mode_on_every_workload` does the same with limits.
Standard library only. Needs root.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Workload, check_setup, die  # noqa: E402


def per_op(report_path):
    """op path -> (CPU ns per element, share of the op CPU)."""
    with open(report_path) as f:
        nodes = json.load(f)["nodes"]
    total = sum(n["cpu_ns"] for n in nodes) or 1.0
    return {
        n["path"]: (n["cpu_ns"] / max(n["elements_produced"], 1), n["cpu_ns"] / total)
        for n in nodes
    }


def one_run(args, work, i):
    out_run, out_pid = os.path.join(work, f"run{i}"), os.path.join(work, f"pid{i}")
    prefix = [args.probe, "run", "-q", "-o", out_run, "--"]
    # The workload's own limit is only a backstop: SIGTERM ends it.
    w = Workload(args.python, args.workload, args.seconds + 60, work, [], prefix=prefix,
                 tag=f"workload{i}")
    try:
        if not w.ready.wait(timeout=180):
            die(f"workload {args.workload} not READY within 180 s (see {w.stderr_path})")
        p = subprocess.run(
            [args.probe, "--pid", str(w.pid), "--duration", str(args.seconds), "-q",
             "-o", out_pid],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            die(f"plumber-probe --pid failed: {p.stderr.strip()}")
    finally:
        # SIGTERM to `plumber-probe run`: it writes its outputs and passes
        # the signal on to the workload.
        w.stop()
    for d in (out_pid, out_run):
        if not os.path.isfile(os.path.join(d, "report.json")):
            die(f"no report.json in {d}")
    return per_op(os.path.join(out_pid, "report.json")), per_op(os.path.join(out_run, "report.json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", default=os.path.join(REPO, "target", "release", "plumber-probe"))
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    ap.add_argument("--workload", default="interleave")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    check_setup(args)
    work = tempfile.mkdtemp(prefix="plumber-shim-vs-pid-")
    ratios = {}
    for i in range(args.runs):
        pid, run = one_run(args, work, i)
        print(f"run {i}: {'op':<60} {'--pid µs/el':>16} {'run µs/el':>16}  ratio")
        for path, (ep, sp) in pid.items():
            if path not in run:
                print(f"  {path}: not in the shim's report")
                continue
            er, sr = run[path]
            r = ep / er if er else float("nan")
            ratios.setdefault(path, []).append(r)
            print(f"  {path[-64:]:<64} {ep / 1e3:8.1f} ({100 * sp:4.1f}%) "
                  f"{er / 1e3:8.1f} ({100 * sr:4.1f}%)  {r:5.2f}")
    print(f"\n{args.workload}, {args.runs} run(s) of {args.seconds:g} s: --pid/run CPU per element")
    for path, rs in ratios.items():
        print(f"  {path[-64:]:<64} {min(rs):5.2f}-{max(rs):5.2f}")
    print(f"outputs: {work}")


if __name__ == "__main__":
    main()
