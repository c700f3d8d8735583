#!/usr/bin/env python3
"""What one uprobe hit costs a thread, directly and through the caches.

The default mode's windows cost the image workload more throughput than
their traps and handlers take by themselves (BENCHMARKS.md, issue 4: ~5%
while record_stop is probed, ~5.7 us of throughput a hit on 2 cores, against
~0.8 us for the trap of an emulated instruction measured in a tight loop).
One explanation is the indirect cost of every kernel entry: the trap's path
evicts lines of the caches the thread was using, which it then refetches.
A tight loop cannot see that; a thread with a working set can.

bench/trap_cost.c calls a function whose first instruction is `push %rbp`
(emulated, so one trap a hit, like every probe the default mode keeps in),
then chases pointers through a random cycle of W bytes' cache lines,
`--steps` loads an iteration; or, for a size written `cW`, calls `--steps`
of W/64 generated 64-byte functions in a random cycle through a table: a
working set of code (instruction and uop caches, branch predictors). ON blocks hold a counting uprobe on the
function (a perf event of the uprobe PMU: no BPF, the cheapest handler
there is), OFF blocks none, in ABBA order. Per block, the thread's CPU time
per iteration; ON minus OFF is what a hit costs at that working set, and
that minus the cost at W = 0 what the caches add. Thread CPU time, not wall
time, so that the host's steal and other tasks fall out; one CPU
(`--cpu`). Needs root (perf_event_open of a uprobe) and a C compiler.

    sudo python3 bench/trap_cost.py
    sudo python3 bench/trap_cost.py --sizes 0,48k,1m,c1m --pairs 16 --block 0.5
"""

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import die  # noqa: E402
from lock_contention import file_offset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = "0,40k,1m,32m,c16k,c48k,c256k,c1m"


def size(s):
    """`40k` -> (40960, 0): data; `c40k` -> (40960, 1): code."""
    s = s.strip().lower()
    code = s.startswith("c")
    s = s[code:]
    mult = {"k": 1 << 10, "m": 1 << 20}.get(s[-1:], 1)
    return int(s.rstrip("km")) * mult, int(code)


def human(b, code):
    n = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"
    return f"{n} {'code' if code else 'data'}"


def per(r):
    """CPU ns per iteration of a block row (code, on, iterations, cpu_ns, hits)."""
    return r[3] / r[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=SIZES,
                    help=f"working sets, comma-separated, cW for code (default {SIZES})")
    ap.add_argument("--steps", type=int, default=128,
                    help="loads or calls an iteration (default 128)")
    ap.add_argument("--pairs", type=int, default=8,
                    help="ABBA quads a size, i.e. 2 ON and 2 OFF blocks each (default 8)")
    ap.add_argument("--block", type=float, default=0.5, help="seconds a block (default 0.5)")
    ap.add_argument("--cpu", type=int, default=1, help="the CPU to run on (default 1)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        die("trap_cost.py needs root for perf_event_open of a uprobe: run it with sudo")
    cc = shutil.which("cc") or die("no C compiler: apt-get install gcc")
    try:
        # The empty working set first, whatever --sizes says: the column
        # "beyond W=0" is each size's cost less its. Each size once.
        sizes = list(dict.fromkeys([(0, 0)] + [size(s) for s in args.sizes.split(",")]))
    except ValueError:
        die(f"--sizes {args.sizes}: expected sizes like 0,40k,1m,c256k")

    with tempfile.TemporaryDirectory(prefix="pp-trap-cost-") as tmp:
        exe = os.path.join(tmp, "trap_cost")
        # -rdynamic: file_offset reads the dynamic symbol table.
        build = subprocess.run([cc, "-O2", "-Wall", "-rdynamic", "-o", exe,
                                os.path.join(HERE, "trap_cost.c")], capture_output=True, text=True)
        if build.returncode != 0:
            die(f"cannot build bench/trap_cost.c: {build.stderr.strip()}")
        off = file_offset(exe, " probed")
        cmd = ["taskset", "-c", str(args.cpu), exe, hex(off), str(int(args.block * 1000)),
               str(args.pairs), str(args.steps)] + [("c" if c else "") + str(b) for b, c in sizes]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            die(f"trap_cost failed: {out.stderr.strip()}")

    rows = [tuple(int(x) for x in l.split()) for l in out.stdout.splitlines()]
    print(f"uprobe on an emulated `push %rbp`, counted by perf (no BPF); "
          f"{args.steps} loads or calls an iteration; CPU {args.cpu}; "
          f"{args.pairs} ABBA quads of {args.block:g} s blocks a size")
    print(f"{'working set':>14} {'OFF ns/iter':>12} {'ON ns/iter':>11} "
          f"{'a hit costs':>12} {'+/-':>7} {'beyond W=0':>11} {'hits/iter':>10}")
    base = None  # the empty working set's, measured first
    for w in sizes:
        mine = [r[1:] for r in rows if (r[0], r[1]) == w]
        quads = [mine[i:i + 4] for i in range(0, len(mine) - 3, 4)]
        extra = [(per(q[1]) + per(q[2]) - per(q[0]) - per(q[3])) / 2 for q in quads]
        hits = sum(r[4] for r in mine if r[1]) / sum(r[2] for r in mine if r[1])
        m = statistics.mean(extra)
        se = statistics.stdev(extra) / math.sqrt(len(extra)) if len(extra) > 1 else math.nan
        if base is None:
            base = m
        off = statistics.mean(per(r) for r in mine if not r[1])
        on = statistics.mean(per(r) for r in mine if r[1])
        print(f"{human(*w):>14} {off:12.1f} {on:11.1f} {m:9.0f} ns {se:7.0f} "
              f"{m - base:8.0f} ns {hits:10.3f}")


if __name__ == "__main__":
    main()
