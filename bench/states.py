#!/usr/bin/env python3
"""Diagnosis: where the target's threads are while recorded and while not.

    sudo python3 bench/states.py [--window 30] [--pairs 8] [--probe-args ARGS]

Some recordings on some VMs see the target's CPU drop (the pipeline idles)
while windows without the probe never do; overhead.py shows it only as a
low pair. This script alternates OFF and ON windows as overhead.py does
(ON: the probe's own recording window from report.json) and sweeps the
target's threads every 50 ms: each thread's state and, for sleeping ones,
the top of its kernel stack (/proc/PID/task/TID/stack, root only), plus
the per-CPU idle and steal ticks. Prints, per window: throughput (GT
lines), target CPU, idle and steal per CPU, runnable target threads per
sweep; then, per kind and for every ON window whose target CPU is below
the lowest OFF window's, where the sleeping threads sleep (mean threads
per sweep by kernel stack). A probe that blocks the target shows there as
a stack no OFF window has. Standard library only.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Sampler, Workload, abba, check_setup, die  # noqa: E402


def cpu_ticks():
    """Per CPU: (idle+iowait, steal, total) ticks."""
    out = []
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and not line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:]]
                out.append((v[3] + v[4], v[7], sum(v[:8])))
    return out


class Sweeper:
    """Thread states and kernel stacks of the target every 50 ms."""

    def __init__(self, pid):
        self.pid = pid
        self.sweeps = []  # (wall_ns, Counter of state/stack, cpu ticks)
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stopped:
            now, tally = time.time_ns(), collections.Counter()
            try:
                tids = os.listdir(f"/proc/{self.pid}/task")
            except OSError:
                return
            for t in tids:
                try:
                    with open(f"/proc/{self.pid}/task/{t}/stat") as f:
                        s = f.read()
                    state = s[s.rindex(")") + 2]
                    if state in "SD":
                        with open(f"/proc/{self.pid}/task/{t}/stack") as f:
                            frames = [ln.split(" ", 1)[1].split("+")[0]
                                      for ln in f.read().splitlines() if " " in ln]
                        tally[f"{state} {' < '.join(frames[:5])}"] += 1
                    else:
                        tally[state] += 1
                except (OSError, ValueError):
                    pass  # the thread exited
            with self.lock:
                self.sweeps.append((now, tally, cpu_ticks()))
            time.sleep(0.05)

    def between(self, st, en):
        with self.lock:
            s = [x for x in self.sweeps if st <= x[0] <= en]
        if len(s) < 2:
            return None
        tally = collections.Counter()
        for _, t, _ in s:
            tally.update(t)
        a, b = s[0][2], s[-1][2]
        idle = [(y[0] - x[0]) / max(1, y[2] - x[2]) for x, y in zip(a, b)]
        steal = [(y[1] - x[1]) / max(1, y[2] - x[2]) for x, y in zip(a, b)]
        return len(s), tally, idle, steal


def show(title, n, tally, top=12):
    print(f"{title}: {n} sweeps, threads per sweep by state and kernel stack")
    for k, v in tally.most_common(top):
        print(f"  {v / n:7.3f}  {k}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", default=os.path.join(REPO, "target", "release", "plumber-probe"))
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    ap.add_argument("--workload", default="tfrecord_image")
    ap.add_argument("--window", type=float, default=30)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--probe-args", default="")
    args = ap.parse_args()
    check_setup(args)
    work = tempfile.mkdtemp(prefix="pp-states-")
    wl = Workload(args.python, args.workload, 20 + args.pairs * 2 * (args.window + 10) + 30, work, [])
    if not wl.ready.wait(300) or wl.pid is None:
        die(f"workload not READY; see {wl.stderr_path}")
    cpu, sw = Sampler(wl.pid), Sweeper(wl.pid)
    time.sleep(5)
    rows = []
    try:
        for i, kind in enumerate(abba(args.pairs)):
            if kind == "OFF":
                st = time.time_ns()
                time.sleep(args.window)
                en = time.time_ns()
            else:
                out = os.path.join(work, f"on{i}")
                p = subprocess.run([args.probe, "--pid", str(wl.pid), "--duration", str(args.window),
                                    "--output", out, "-q"] + args.probe_args.split(),
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    die(f"plumber-probe failed: {p.stderr.strip().splitlines()[-1:]}")
                with open(os.path.join(out, "report.json")) as f:
                    w = json.load(f)["window"]
                st, en = int(w["start_ns"]), int(w["end_ns"])
                time.sleep(0.5)
            wl.wait_covered(en)
            got, share = sw.between(st, en), cpu.between(st, en, 1)
            if got is None or share is None:
                print(f"{i:2} {kind:3} too short to sample", flush=True)
                continue
            n, tally, idle, steal = got
            rows.append((kind, share, n, tally))
            print(f"{i:2} {kind:3} {wl.rate(st, en):7.1f} el/s  target {100 * rows[-1][1]:5.1f}%  idle "
                  f"{' '.join(f'{100 * x:4.1f}%' for x in idle)}  steal "
                  f"{' '.join(f'{100 * x:4.1f}%' for x in steal)}  runnable "
                  f"{tally['R'] / n:.2f}", flush=True)
    finally:
        sw.stopped = cpu.stopped = True
        wl.stop()
    for kind in ("OFF", "ON"):
        sel = [r for r in rows if r[0] == kind]
        tally = collections.Counter()
        for r in sel:
            tally.update(r[3])
        show(f"\n{kind}", sum(r[2] for r in sel), tally)
    floor = min((r[1] for r in rows if r[0] == "OFF"), default=0)
    for i, r in enumerate(rows):
        if r[0] == "ON" and r[1] < floor:
            show(f"\nwindow {i} (ON, target {100 * r[1]:.1f}% < every OFF window's)", r[2], r[3])


if __name__ == "__main__":
    main()
