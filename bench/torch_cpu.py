#!/usr/bin/env python3
"""CPU per batch of a PyTorch DataLoader job, by where it runs: the training
process, and its workers (live and reaped), from /proc over one window.

    python3 bench/torch_cpu.py [--window 10] [--warmup 3] -- torch_pyxform.py --num-workers 2 --batch-size 16

Starts tests/workloads/SCRIPT with .venv-torch's Python and the given flags,
waits for its READY line and --warmup seconds, then reads, at both ends of
--window seconds: the training process's own CPU (utime+stime), the CPU of
its children reaped so far (cutime+cstime) and of each live child, and the
batches its GT lines counted (root=). Children's CPU over the window is the
reaped growth plus the live children's at the end less every child's at the
start (one that was reaped meanwhile had at least that much), so a worker
that lived across an edge counts only its time inside. No root needed; no
probe attached. Prints CPU-ms per batch for each part and the batches/s.
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, proc_stat  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def stat(pid):
    """(ppid, own CPU s, reaped children's CPU s) of pid; None once gone."""
    f = proc_stat(pid)
    if f is None:
        return None
    return int(f[1]), (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK


def children(pid):
    """CPU seconds of each live child of pid."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = stat(int(d))
            if s and s[0] == pid:
                out[int(d)] = s[1]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("workload", nargs=argparse.REMAINDER, help="-- SCRIPT FLAGS...")
    a = ap.parse_args()
    args = [x for x in a.workload if x != "--"]
    if not args:
        ap.error("name a workload: -- torch_pyxform.py --num-workers 2")
    py = os.path.join(REPO, ".venv-torch", "bin", "python")
    cmd = [py, os.path.join(REPO, "tests", "workloads", args[0]), "--seconds",
           str(a.warmup + a.window + 60)] + args[1:]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()
    try:
        deadline = time.time() + 300
        while not any(l.startswith("READY") for l in list(lines)):
            if p.poll() is not None or time.time() > deadline:
                sys.exit(f"{args[0]} did not start (exit {p.poll()})")
            time.sleep(0.1)
        time.sleep(a.warmup)

        def now():
            gt = [l for l in list(lines) if l.startswith("GT ")]
            root = int(re.search(r"root=(\d+)", gt[-1]).group(1)) if gt else 0
            return time.time(), root, stat(p.pid), children(p.pid)

        t0, r0, s0, k0 = now()
        time.sleep(a.window)
        t1, r1, s1, k1 = now()
    finally:
        p.kill()
        p.wait()
    batches = r1 - r0
    if batches <= 0 or not s0 or not s1:
        sys.exit("no batches counted in the window")
    own = s1[1] - s0[1]
    workers = (s1[2] - s0[2]) + sum(k1.values()) - sum(k0.values())
    ms = lambda s: 1000.0 * s / batches  # noqa: E731
    print(f"{' '.join(args)}: {batches / (t1 - t0):.1f} batches/s; CPU-ms per batch: "
          f"training process {ms(own):.2f}, workers {ms(workers):.2f}, all {ms(own + workers):.2f}")


if __name__ == "__main__":
    main()
