#!/usr/bin/env python3
"""plumber-probe's time to first data, cold and warm layout cache.

    sudo python3 bench/first_data.py [--probe target/release/plumber-probe]
        [--workload tfrecord_image] [--runs 3] [--duration 1]

Starts one workload, waits for READY and a warm-up, then runs the probe
--runs times cold and --runs times warm, interleaved (cold, warm, cold, ...):

  cold  PLUMBER_PROBE_CACHE = a fresh, empty directory (layouts derived);
  warm  the same directory again, right after its cold run (cache hit).

Each run is `plumber-probe --pid PID --duration D --output DIR -q`; the figure
is the probe's own `time to first data X s` (from its start to its first poll
with data). Also shown: the probe's wall time to exit and its CPU time.
Prints the medians. Standard library only. Needs root (the probe does).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, check_setup, die  # noqa: E402
TTFD = re.compile(r"time to first data ([0-9.]+) s( \(layout cache hit\))?")


def probe_once(args, pid, cache, outdir):
    env = dict(os.environ, PLUMBER_PROBE_CACHE=cache)
    cmd = [args.probe, "--pid", str(pid), "--duration", str(args.duration),
           "--output", outdir, "-q", "--mode", args.mode]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate(timeout=args.duration + 300)
    wall = time.monotonic() - t0
    m = TTFD.search(out)
    return {"rc": p.returncode, "wall": wall, "out": out, "err": err,
            "ttfd": float(m.group(1)) if m else None, "hit": bool(m and m.group(2)),
            "mode_line": next((l for l in out.splitlines() if l.startswith("mode:")), "")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--probe", default=os.path.join(REPO, "target", "release", "plumber-probe"))
    ap.add_argument("--workload", default="tfrecord_image")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.0, help="probe --duration (default 1)")
    ap.add_argument("--mode", choices=("model", "uprobes", "auto"), default="model")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    args = ap.parse_args()

    check_setup(args)
    script = os.path.join(REPO, "tests", "workloads", f"{args.workload}.py")
    if not os.path.isfile(script):
        die(f"no workload {script}")

    work = tempfile.mkdtemp(prefix="plumber-first-data-")
    errf = open(os.path.join(work, "workload.stderr"), "wb")
    seconds = args.warmup + args.runs * 2 * (args.duration + 120) + 60
    wl = subprocess.Popen([args.python, script, "--seconds", str(seconds)],
                          stdout=subprocess.PIPE, stderr=errf, text=True, bufsize=1,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=REPO)
    ready = threading.Event()
    info = {}

    def reader():
        for line in wl.stdout:
            if line.startswith("READY"):
                info["pid"] = int(line.split("pid=")[1].split()[0])
                ready.set()
    threading.Thread(target=reader, daemon=True).start()

    cold, warm = [], []
    failed = 0
    try:
        if not ready.wait(timeout=180):
            die(f"workload never printed READY (see {work}/workload.stderr)")
        pid = info["pid"]
        print(f"workload {args.workload} pid {pid} ready; warm-up {args.warmup:.0f} s; "
              f"{args.runs} cold + {args.runs} warm runs of {args.probe} --mode {args.mode}", flush=True)
        time.sleep(args.warmup)
        for i in range(args.runs):
            cache = os.path.join(work, f"cache-{i}")
            os.makedirs(cache)  # fresh and empty
            for kind, acc in (("cold", cold), ("warm", warm)):
                out = os.path.join(work, f"out-{i}-{kind}")
                # CPU of the probe: RUSAGE_CHILDREN delta around its reaping
                # (the workload, also a child, is only reaped at the end).
                c0 = os.times()
                r = probe_once(args, pid, cache, out)
                c1 = os.times()
                cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
                hit = "cache hit" if r["hit"] else "no cache hit"
                if r["rc"] != 0 or r["ttfd"] is None:
                    failed += 1
                    err = (r["err"].strip().splitlines() or ["(no stderr)"])[-1]
                    print(f"{kind} {i + 1}: FAILED rc={r['rc']}: {err}", flush=True)
                    continue
                odd = ""
                if (kind == "cold") == r["hit"]:
                    odd = "  <-- unexpected: cold run hit the cache" if kind == "cold" else \
                          "  <-- unexpected: warm run missed the cache"
                acc.append((r["ttfd"], r["wall"], cpu))
                print(f"{kind} {i + 1}: time to first data {r['ttfd']:.2f} s ({hit}); "
                      f"probe exited after {r['wall']:.2f} s, CPU {cpu:.2f} s{odd}", flush=True)
    finally:
        if wl.poll() is None:
            wl.terminate()
            try:
                wl.wait(timeout=20)
            except subprocess.TimeoutExpired:
                wl.kill()
                wl.wait()
        errf.close()

    print()
    for kind, acc in (("cold", cold), ("warm", warm)):
        if acc:
            t = [a[0] for a in acc]
            print(f"{kind}: median time to first data {statistics.median(t):.2f} s "
                  f"(runs: {' '.join(f'{x:.2f}' for x in t)}); median probe CPU "
                  f"{statistics.median(a[2] for a in acc):.2f} s, wall to exit "
                  f"{statistics.median(a[1] for a in acc):.2f} s (--duration {args.duration:g})")
        else:
            print(f"{kind}: no successful run")
    shutil.rmtree(work, ignore_errors=True) if not failed else print(f"logs kept in {work}")
    return 0 if cold and warm and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
