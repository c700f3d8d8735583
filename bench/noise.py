#!/usr/bin/env python3
"""Can this machine resolve 1%? The workload's own noise, nothing attached.

    python3 bench/noise.py [--seconds 200] [--copies 1|2] [--window 30] [--pairs 24]

Run it before bench/overhead.py. It starts the workload (or two copies, each
in its own session, so its own autogroup and an equal share of the CPUs),
skips a warm-up, and reads each copy's throughput from its GT lines and its
CPU from /proc (common.Sampler), with the machine's steal. Then, for blocks of
1, 5 and 15 s and of --window seconds:

  cv         the spread of the blocks' throughput;
  adjacent   the spread (sd) of the ratio of two adjacent blocks, pairs of
             blocks starting every second: what one OFF/ON pair of
             overhead.py sees with nothing attached;

and the standard error that an overhead.py run of --pairs pairs of
--window s windows would carry: adjacent / sqrt(pairs). Telling 0.99 from
1.00 at two standard errors needs it at 0.25% or less. --seconds must hold
at least six windows.

With --copies 2 it also gives the same for the ratio of the two copies'
throughputs and of their elements per CPU-second, with the correlation of
the two throughputs: a second copy is a useful control for overhead.py
only where that ratio is much steadier than either copy alone.
Standard library only; no root needed.
"""

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESOLVES, REPO, Sampler, Workload, check_python, die  # noqa: E402


def cv(v):
    return statistics.stdev(v) / statistics.mean(v) if len(v) > 2 else math.nan


def blocks(t0, t1, length, step):
    """(start, end) of consecutive blocks, and of adjacent pairs of blocks
    starting every `step` seconds (Unix ns)."""
    L, S = int(length * 1e9), int(step * 1e9)
    cons = [(t, t + L) for t in range(t0, t1 - L + 1, L)]
    adj = [((t, t + L), (t + L, t + 2 * L)) for t in range(t0, t1 - 2 * L + 1, S)]
    return cons, adj


def adjacent_sd(f, adj):
    r = [f(*b) / f(*a) for a, b in adj]
    return statistics.stdev(r) if len(r) > 2 else math.nan


def pct(x):
    return "   n/a" if math.isnan(x) else f"{100 * x:5.2f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    ap.add_argument("--workload", default="tfrecord_image")
    ap.add_argument("--seconds", type=float, default=200.0, help="seconds measured (default 200)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds after READY (default 10)")
    ap.add_argument("--copies", type=int, choices=(1, 2), default=1)
    ap.add_argument("--window", type=float, default=30.0, help="overhead.py's --window (default 30)")
    ap.add_argument("--pairs", type=int, default=24, help="overhead.py's --pairs (default 24)")
    args = ap.parse_args()
    check_python(args)
    if args.seconds < 6 * args.window:
        # Fewer blocks than that, and the spread of adjacent ones says little.
        die(f"--seconds must be at least six times --window (got {args.seconds:g} and {args.window:g})")

    logdir = tempfile.mkdtemp(prefix="pp-noise-")
    total = args.warmup + args.seconds + 5
    copies = [Workload(args.python, args.workload, total, logdir, [], tag=f"copy{i}",
                       new_session=True) for i in range(args.copies)]
    try:
        for w in copies:
            if not w.ready.wait(300) or w.pid is None:
                die(f"workload not READY; see {w.stderr_path}")
        samplers = [Sampler(w.pid) for w in copies]
        time.sleep(args.warmup)
        t0 = time.time_ns()
        time.sleep(args.seconds)
        t1 = time.time_ns()
        time.sleep(0.2)  # a CPU sample past t1
        for w in copies:
            if not w.wait_covered(t1):
                die(f"the workload stopped printing GT lines; see {w.stderr_path}")
        for smp in samplers:
            smp.stopped = True
    finally:
        for w in copies:
            w.stop()

    def count(w):
        return lambda s, e: w.value_at(e) - w.value_at(s)

    def eff(w, smp):
        """Elements per CPU-second of one copy."""
        return lambda s, e: count(w)(s, e) * 1e9 / (e - s) / smp.between(s, e, 1)

    if any(smp.between(t0, t1, 1) is None for smp in samplers):
        die(f"a workload exited before the end; see {logdir}")

    busy = samplers[0].between(t0, t1, 4)
    steal = samplers[0].between(t0, t1, 5)
    ncpu = os.cpu_count() or 1
    rates = [count(w)(t0, t1) * 1e9 / (t1 - t0) for w in copies]
    print(f"{args.workload}, {args.copies} cop{'y' if args.copies == 1 else 'ies'}, "
          f"{args.seconds:.0f} s after a {args.warmup:.0f} s warm-up: "
          + ", ".join(f"{r:.0f}" for r in rates) + " elements/s; "
          f"machine busy {100 * busy / ncpu:.1f}%, steal {100 * steal / ncpu:.2f}% of {ncpu} CPUs")
    lengths = sorted({1.0, 5.0, 15.0, args.window})
    head = f"{'block':>7}  {'n':>3}  " + "  ".join(
        f"{'copy' + str(i) + ' cv':>9} {'adjacent':>8}" for i in range(args.copies))
    if args.copies == 2:
        head += f"  {'A/B adjacent':>12} {'eff A/B adj.':>12} {'corr':>5}"
    print(head)
    verdict = {}
    for L in lengths:
        cons, adj = blocks(t0, t1, L, 1.0)
        if len(adj) < 3:
            continue
        line = f"{L:6.0f}s  {len(cons):3d}  "
        for w in copies:
            f = count(w)
            sd = adjacent_sd(f, adj)
            line += f"   {pct(cv([f(*b) for b in cons]))}   {pct(sd)}  "
            verdict.setdefault(L, []).append(sd)
        if args.copies == 2:
            fa, fb = count(copies[0]), count(copies[1])
            ea, eb = eff(copies[0], samplers[0]), eff(copies[1], samplers[1])
            sd = adjacent_sd(lambda s, e: fa(s, e) / fb(s, e), adj)
            sd_eff = adjacent_sd(lambda s, e: ea(s, e) / eb(s, e), adj)
            corr = (statistics.correlation([fa(*b) for b in cons], [fb(*b) for b in cons])
                    if len(cons) > 2 else math.nan)
            line += f"  {pct(sd):>12} {pct(sd_eff):>12} {corr:5.2f}"
            verdict[L].append(sd)
        print(line.rstrip())
    if args.window in verdict:
        sds = [x / math.sqrt(args.pairs) for x in verdict[args.window]]
        ok = "enough" if sds[0] <= RESOLVES else "not enough"
        print(f"an overhead.py run of {args.pairs} pairs of {args.window:.0f} s windows would be "
              f"known to ±{100 * sds[0]:.2f}% (one standard error): {ok} to tell 0.99 from 1.00 "
              f"(needs ±{100 * RESOLVES:.2f}%)")
        if args.copies == 2:
            ok = "enough" if sds[-1] <= RESOLVES else "not enough"
            print(f"the same run with a second copy as its control (the ratio of the two): "
                  f"±{100 * sds[-1]:.2f}%, {ok}")
    print(f"logs: {logdir}")


if __name__ == "__main__":
    main()
