#!/usr/bin/env python3
"""Throughput cost of `plumber-probe run` (the LD_PRELOAD shim) on a workload.

    python3 bench/shim_overhead.py [--probe target/release/plumber-probe]
        [--workload tfrecord_image] [--window 10] [--warmup 5] [--pairs 4]

The shim is loaded when the program starts, so it cannot be switched on and
off in one process as bench/overhead.py does with --pid. Instead each window
is a fresh run of the workload:

  OFF  `python <workload>` alone;
  ON   `plumber-probe run -q -o DIR -- python <workload>`, recording until the
       workload exits, so the shim records through the whole window.

Both measure the same window, [READY + warm-up, READY + warm-up + W] on the
wall clock (READY is printed after the first root element), from the
workload's own GT lines. Runs come in pairs ordered ABBA (OFF ON | ON OFF |
...) to cancel drift. Reports the throughput ratio mean(ON)/mean(OFF), each
pair's ratio, the same for elements per CPU-second of the workload process
(costs paid inside it, such as the hooks, count; other processes taking CPU
do not), and the CPU of the `plumber-probe run` parent during the window.
Standard library only; no root needed (the shim mode's point).
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Sampler, Workload, abba, check_setup, die, ratio_line  # noqa: E402


def one_run(args, kind, i, work):
    """Runs the workload once; returns the window's figures or an error."""
    seconds = args.warmup + args.window + 1
    prefix, outdir = (), None
    if kind == "ON":
        outdir = os.path.join(work, f"run-{i:02d}")
        shutil.rmtree(outdir, ignore_errors=True)
        prefix = (args.probe, "run", "-q", "-o", outdir, "--")
    wl = Workload(args.python, args.workload, seconds, work, args.workload_args,
                  prefix=prefix, tag=f"{kind.lower()}-{i:02d}")
    w = {"kind": kind}
    try:
        if not wl.ready.wait(timeout=180):
            return {**w, "error": f"no READY (see {wl.stderr_path})"}
        sampler = Sampler(wl.pid)
        if kind == "ON":
            sampler.probe_pid = wl.proc.pid
        start = time.time_ns() + int(args.warmup * 1e9)
        end = start + int(args.window * 1e9)
        time.sleep(max(0.0, (end - time.time_ns()) / 1e9))
        try:
            w["rate"] = wl.rate(start, end)
        except ValueError as e:
            return {**w, "error": str(e)}
        w["target_cpu"] = sampler.between(start, end, 1)
        if w["target_cpu"]:
            w["eff"] = w["rate"] / w["target_cpu"]
        if kind == "ON":
            w["parent_cpu"] = sampler.between(start, end, 3, probe_pid=wl.proc.pid)
        sampler.stopped = True
        rc = wl.proc.wait(timeout=args.window + 120)
        if rc != 0:
            w["error"] = f"exit status {rc} (see {wl.stderr_path})"
        elif outdir and not os.path.isfile(os.path.join(outdir, "stats.pb")):
            w["error"] = f"plumber-probe run wrote no stats.pb (see {wl.stderr_path})"
        return w
    finally:
        wl.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--probe", default=os.path.join(REPO, "target", "release", "plumber-probe"))
    ap.add_argument("--workload", default="tfrecord_image")
    ap.add_argument("--window", type=float, default=10.0, help="seconds per window (default 10)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after READY (default 5)")
    ap.add_argument("--pairs", type=int, default=4, help="OFF/ON pairs (default 4)")
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    ap.add_argument("--keep", metavar="DIR", help="keep the outputs and workload logs here")
    ap.add_argument("workload_args", nargs="*", help="extra workload arguments (after --)")
    args = ap.parse_args()

    check_setup(args, root=False)
    shim = os.path.join(os.path.dirname(args.probe), "libplumber_shim.so")
    if not os.path.isfile(shim):
        die(f"{shim} not found; build it with `cargo build --release -p plumber-shim`")
    if args.window <= 0 or args.pairs < 1:
        die("--window must be > 0 and --pairs >= 1")
    work = args.keep or tempfile.mkdtemp(prefix="plumber-shim-overhead-")
    os.makedirs(work, exist_ok=True)
    print(f"workload {args.workload}; {args.pairs} pairs of fresh runs (ABBA), "
          f"window {args.window:g} s after READY + {args.warmup:g} s; shim {shim}", flush=True)
    print(f"{'#':>2} {'pair':>4} {'kind':<4} {'elems/s':>9} {'target cpu':>10} "
          f"{'el/cpu-s':>8} {'parent cpu':>10}", flush=True)
    windows = []
    for i, kind in enumerate(abba(args.pairs)):
        k = i // 2
        w = one_run(args, kind, i, work)
        w["pair"] = k
        windows.append(w)
        if "error" in w:
            print(f"{i:>2} {k:>4} {kind:<4} ERROR {w['error']}", flush=True)
            continue
        pc = w.get("parent_cpu")
        print(f"{i:>2} {k:>4} {kind:<4} {w['rate']:9.1f} "
              f"{100 * (w['target_cpu'] or 0):9.1f}% {w.get('eff', float('nan')):8.0f} "
              f"{'' if pc is None else f'{100 * pc:9.2f}%':>10}", flush=True)
    ok = [w for w in windows if "error" not in w]
    print()
    line = ratio_line("throughput ratio shim/no-shim", ok, "rate", args.pairs)
    if line is None:
        print("no valid ON/OFF windows: no ratio", file=sys.stderr)
        return 1
    print(line)
    eff = ratio_line("elements per workload CPU-second, shim/no-shim", ok, "eff", args.pairs)
    if eff:
        print(eff)
    parent = [w["parent_cpu"] for w in ok if w.get("parent_cpu") is not None]
    if parent:
        print(f"plumber-probe run parent CPU during the window: "
              f"{100 * statistics.mean(parent):.2f}% of one core")
    n_err = len(windows) - len(ok)
    if n_err:
        print(f"{n_err} run(s) failed; see above")
    print(f"logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
