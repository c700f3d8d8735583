#!/usr/bin/env python3
"""Where in plumber-probe's cycle the target loses throughput.

    sudo python3 bench/windows.py [--probe target/release/plumber-probe]
        [--workload tfrecord_image] [--record 40] [--rounds 4]

overhead.py compares whole windows, and this workload moves about 6%
between 10 s windows, so a 1-2% cost takes dozens of pairs to see. Most of
the probe's work comes in attribution windows (5-15 s apart, see
probe/src/usage.rs `Schedule`: record_stop and sched_switch for 250 ms and
a 50 ms tail, the lock and GIL probes for 800 ms). This script
lines the target's throughput up on those windows instead, averaging over
many of them: the loss each window costs, and the rate between windows
against a run with nothing attached, are then known to a fraction of a
percent.

One workload; ROUNDS times, in ABBA order: a recording of --record seconds
(plumber-probe with debug logs, which mark each window part), and the same
time with nothing attached. Throughput comes from the workload's own GT
lines (every 0.1 s). Prints, against the OFF mean: the ON/OFF ratio of the
whole recording windows, the rate in each 5 s block since the recording
started, the rate in each 250 ms bin after a window opens (one probe
period), and the mean loss per period.
Standard library only. Needs root.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Workload, abba, check_setup, die  # noqa: E402

BIN = 0.25
BLOCK = 5.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z")


def unix_ns(stamp):
    """RFC 3339 UTC stamp of a tracing line -> Unix ns."""
    m = STAMP.match(stamp)
    if not m:
        return None
    whole = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(
        tzinfo=datetime.timezone.utc)
    frac = m.group(2) or ".0"
    return int(whole.timestamp()) * 1_000_000_000 + int(float(frac) * 1e9)


def window_opens(log):
    """Unix ns of every attribution window's opening in a debug log."""
    out = []
    for line in log.splitlines():
        line = ANSI.sub("", line)
        if "window part opened" in line and "attribution" in line:
            t = unix_ns(line)
            if t is not None:
                out.append(t)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe", default=os.path.join(REPO, "target", "release", "plumber-probe"))
    ap.add_argument("--workload", default="tfrecord_image")
    ap.add_argument("--record", type=float, default=40.0, help="seconds per recording (default 40)")
    ap.add_argument("--rounds", type=int, default=4, help="ON/OFF pairs (default 4)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--probe-args", default="", help="extra plumber-probe arguments")
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    args = ap.parse_args()
    check_setup(args)

    work = tempfile.mkdtemp(prefix="pp-windows-")
    seconds = args.warmup + args.rounds * 2 * (args.record + 15) + 60
    wl = Workload(args.python, args.workload, seconds, work, [])
    try:
        if not wl.ready.wait(300) or wl.pid is None:
            die(f"workload not READY; see {wl.stderr_path}")
        time.sleep(args.warmup)
        on_rates, off_rates, opens, spans = [], [], [], []
        for i, kind in enumerate(abba(args.rounds)):
            if kind == "OFF":
                st = time.time_ns()
                time.sleep(args.record)
                en = time.time_ns()
                off_rates.append(wl.rate(st, en))
            else:
                out = os.path.join(work, f"on{i}")
                env = dict(os.environ, RUST_LOG="plumber_probe=debug", NO_COLOR="1")
                p = subprocess.run(
                    [args.probe, "--pid", str(wl.pid), "--duration", str(args.record),
                     "--output", out, "-q"] + args.probe_args.split(),
                    env=env, capture_output=True, text=True)
                if p.returncode != 0:
                    die(f"plumber-probe failed: {p.stderr.strip().splitlines()[-1:]}")
                with open(os.path.join(out, "report.json")) as f:
                    w = json.load(f)["window"]
                st, en = int(w["start_ns"]), int(w["end_ns"])
                on_rates.append(wl.rate(st, en))
                spans.append((st, en))
                # Whole periods only: each open to the next (or the end).
                o = [t for t in window_opens(p.stderr) if st <= t < en]
                opens += [(t, min(nxt, en)) for t, nxt in zip(o, o[1:] + [en])]
                shutil.rmtree(out, ignore_errors=True)
                time.sleep(0.5)
            print(f"{i:2} {kind:3} {wl.rate(st, en):7.1f} el/s", flush=True)
        off = statistics.mean(off_rates)
        print(f"\nwhole recordings ON/OFF: {statistics.mean(on_rates) / off:.4f} "
              f"({len(on_rates)} pairs, OFF {off:.1f} el/s)")
        # After-effects of the probe's start-up (symbol lookups, the first
        # attaches) would show as a slope here.
        print(f"rate / OFF mean by {BLOCK:.0f} s block since the recording started:")
        k = 0
        while True:
            v = [wl.rate(a + int(k * BLOCK * 1e9), a + int((k + 1) * BLOCK * 1e9)) / off
                 for a, b in spans if a + int((k + 1) * BLOCK * 1e9) <= b]
            if len(v) < 2:
                break
            print(f"  {k * BLOCK:4.0f}-{(k + 1) * BLOCK:.0f} s  {statistics.mean(v):.3f}  "
                  f"±{statistics.stdev(v) / len(v) ** 0.5:.3f}")
            k += 1
        if not opens:
            die("no window openings in the probe's debug log")
        period = statistics.median(b - a for a, b in opens)
        nbins = int(period / 1e9 / BIN)
        bins = [[] for _ in range(nbins)]
        for a, b in opens:
            for k in range(nbins):
                s, e = a + int(k * BIN * 1e9), a + int((k + 1) * BIN * 1e9)
                if e <= b:
                    bins[k].append(wl.rate(s, e) / off)
        print(f"{len(opens)} windows, period {period / 1e9:.2f} s; rate / OFF mean by "
              f"{int(BIN * 1000)} ms after a window opens (mean, se):")
        loss = 0.0
        for k, v in enumerate(bins):
            if len(v) < 2:
                continue
            m, se = statistics.mean(v), statistics.stdev(v) / len(v) ** 0.5
            loss += (1 - m) * BIN
            print(f"  {k * BIN:5.2f} s  {m:.3f}  ±{se:.3f}  {'#' * max(0, int((1 - m) * 200))}")
        print(f"mean loss per period: {loss:.3f} OFF-seconds of throughput "
              f"= {100 * loss / (nbins * BIN):.2f}% of the period")
    finally:
        wl.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
