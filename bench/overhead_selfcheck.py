#!/usr/bin/env python3
"""Is the probe's self-reported cost true? Its `probe_overhead.target_share`
against the throughput it takes, measured A/B in one run.

    sudo python3 bench/overhead_selfcheck.py [--probe target/release/plumber-probe]
        [--window 8] [--pairs 4] [--cpus 1] [--settings uprobes,precise,hz999,default]

One workload (padded_batch: the fastest test pipeline, thousands of batches
a second, so that per-call costs are large) runs for the whole check. For
each setting in turn, OFF and ON windows alternate in ABBA order exactly as
in bench/overhead.py (whose probe runner this imports): OFF is a stretch of
wall clock with nothing attached, ON is `plumber-probe --pid --duration W`
with the setting's flags, measured over its own recording window. For each
setting it prints

  slowdown  1 - mean(ON elems/s) / mean(OFF elems/s), and each pair's;
  share     the mean `target_share` the ON windows' report.json gave;
  their ratio, and PASS when the share is within +/-25% (relative) of the
  slowdown. The `default` setting (no flags) is printed, not judged: its
  cost is below what this machine's noise can resolve. `timer999` (not in
  the default list) attaches no probe: the ON windows hold bare cpu-clock
  perf events at 999 Hz on every CPU, the sampler's timer without its
  program, whose cost no BPF statistic sees.

The settings that are judged are chosen so that the probe's cost is far
above the noise: `--mode uprobes` (a trap pair on every GetNext), `--precise`
(record_stop and the scheduler probes on all the time) and `--sample-hz 999`.

What the comparison needs. `target_share` is the probe's cost over the
target's CPU time. A throughput slowdown equals it only when the target is
CPU-bound on cores it saturates: then every nanosecond the probe takes, in
the target (BPF programs, traps) or beside it (the probe process on the same
cores), is a nanosecond of pipeline work not done. A target that leaves a
core idle loses far less than its share (the probe process runs on the idle
core; an in-target cost off the critical path delays nothing), so on such a
target the check would compare unlike things. padded_batch does not saturate
two cores (its Python loop and pipeline threads hand elements to each other),
so by default the workload, the probe and this script are all pinned to one
CPU (`--cpus 1`, inherited by the probe): the pinned target always has a
runnable thread, and everything the probe does runs on that CPU. Costs the
probe counts in full that run on the other CPU (scheduler tracepoints and the
sampler's perf event for other processes, which return at once) make the
share a slight overestimate there. `--cpus all` measures unpinned;
`--probe-cpus 0` (with `--cpus 1`) runs the probe on a CPU of its own, so
that the slowdown is what is paid in the target's context alone (compare it
with the in-target part of the share).

A secondary figure, elements per target CPU-second ON/OFF, isolates what is
paid inside the target (BPF, traps): it is printed beside the in-target part
of the share (bpf + traps over target CPU).

Timing: with the defaults, 4 settings x 4 pairs x (2 x 8 s + the probe's
start-up and exit, ~8 s on a loaded 2-core VM) + TensorFlow's start and the
warm-up: about 7 minutes. Needs root (the probe does) and a release build
of the probe.
"""

import argparse
import ctypes
import json
import os
import platform
import shutil
import statistics
import struct
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Sampler, Workload, abba, check_setup, die  # noqa: E402
from overhead import run_probe  # noqa: E402

# name -> (plumber-probe --mode, extra flags, judged)
SETTINGS = {
    "uprobes": ("uprobes", "", True),
    "precise": ("model", "--precise", True),
    "hz999": ("model", "--sample-hz 999", True),
    "default": ("model", "", False),
    # No probe: cpu-clock perf events at 999 Hz on every CPU with no
    # program, what the sampler's timer alone costs the target.
    "timer999": (None, "", False),
}
TOLERANCE = 0.25
# The share of its CPUs the target must use in the OFF windows for the
# comparison to hold.
SATURATED = 0.9


def timer_window(args, hz=999):
    """An ON window of bare cpu-clock events (no program) on every CPU."""
    if platform.machine() != "x86_64":
        return {"error": "timer999 opens its perf events by x86-64's syscall number"}
    libc = ctypes.CDLL(None, use_errno=True)
    nr_perf_event_open = 298
    fds = []
    try:
        for cpu in range(os.cpu_count()):
            # perf_event_attr: type SOFTWARE, size, config CPU_CLOCK,
            # sample_period; the rest zero.
            attr = struct.pack("IIQQ", 1, 128, 0, 1_000_000_000 // hz).ljust(128, b"\0")
            fd = libc.syscall(nr_perf_event_open, ctypes.create_string_buffer(attr, 128), -1, cpu, -1, 0)
            if fd < 0:
                return {"error": f"perf_event_open: errno {ctypes.get_errno()}"}
            fds.append(fd)
        start = time.time_ns()
        time.sleep(args.window)
        end = time.time_ns()
    finally:
        for fd in fds:
            os.close(fd)
    return {"start": start, "end": end, "share": 0.0, "in_target": 0.0}


def on_window(args, setting, wl, sampler, outdir):
    """One ON window: the probe's result with its window, rate and share."""
    mode, flags, _ = SETTINGS[setting]
    if mode is None:
        return timer_window(args)
    pargs = types.SimpleNamespace(probe=args.probe, window=args.window, mode=mode,
                                  probe_args=flags, probe_timeout=args.probe_timeout)
    shutil.rmtree(outdir, ignore_errors=True)
    r = run_probe(pargs, wl.pid, outdir, sampler)
    if r["rc"] != 0 or r["start_ns"] is None or r["end_ns"] <= r["start_ns"]:
        err = (r["stderr"].strip().splitlines() or ["(no stderr)"])[-1]
        return {"error": f"probe rc={r['rc']}: {err}"}
    try:
        with open(os.path.join(outdir, "report.json")) as f:
            o = json.load(f)["probe_overhead"]
    except (OSError, ValueError, KeyError) as e:
        return {"error": f"no probe_overhead in report.json: {e}"}
    w = {"start": r["start_ns"], "end": r["end_ns"], "overhead": o,
         "share": o["target_share"],
         "in_target": (o["bpf_ns"] + o["trap_ns"] + o.get("shim_ns", 0)) / max(o["target_cpu_ns"], 1)}
    return w


def measure(args, setting, wl, sampler, work):
    """ABBA pairs of one setting; the windows, each with rate and target CPU."""
    windows = []
    for i, kind in enumerate(abba(args.pairs)):
        pair = i // 2
        if kind == "OFF":
            start = time.time_ns()
            time.sleep(args.window)
            w = {"start": start, "end": start + int(args.window * 1e9)}
        else:
            w = on_window(args, setting, wl, sampler, os.path.join(work, f"{setting}-{i:02d}"))
            time.sleep(args.settle)
        w.update(kind=kind, pair=pair)
        if "error" not in w:
            try:
                w["rate"] = wl.rate(w["start"], w["end"])
            except ValueError as e:
                w["error"] = str(e)
            cpu = sampler.between(w["start"], w["end"], 1)
            w["cpu"] = cpu
            if cpu and "rate" in w:
                w["eff"] = w["rate"] / cpu
        windows.append(w)
        show = (f"  {setting:<8} pair {pair} {kind:<3} " + (
            f"ERROR {w['error']}" if "error" in w else
            f"{w['rate']:9.1f} elems/s  target CPU {w['cpu'] or 0:.2f}" + (f"  share {100 * w['share']:.2f}%" if kind == "ON" else "")))
        print(show, flush=True)
        if wl.done.is_set():
            die("the workload exited early")
    return windows


def pair_slowdowns(windows, key):
    """1 - ON/OFF of `key` for each pair that has both windows."""
    out = []
    for k in sorted({w["pair"] for w in windows}):
        ws = {w["kind"]: w for w in windows if w["pair"] == k and key in w}
        if "ON" in ws and "OFF" in ws:
            out.append(1 - ws["ON"][key] / ws["OFF"][key])
    return out


def summarize(setting, windows):
    """The setting's row: slowdown, share, ratio, spread, verdict."""
    ok = [w for w in windows if "error" not in w and "rate" in w]
    on = [w for w in ok if w["kind"] == "ON"]
    off = [w for w in ok if w["kind"] == "OFF"]
    if not on or not off:
        return {"setting": setting, "verdict": "NO DATA"}
    slow = 1 - statistics.mean(w["rate"] for w in on) / statistics.mean(w["rate"] for w in off)
    share = statistics.mean(w["share"] for w in on)
    per = pair_slowdowns(ok, "rate")
    se = statistics.stdev(per) / len(per) ** 0.5 if len(per) >= 2 else float("nan")
    effs = [w for w in ok if "eff" in w]
    eff_on = [w["eff"] for w in effs if w["kind"] == "ON"]
    eff_off = [w["eff"] for w in effs if w["kind"] == "OFF"]
    eff_slow = (1 - statistics.mean(eff_on) / statistics.mean(eff_off)) if eff_on and eff_off else None
    cpu_off = [w["cpu"] for w in off if w.get("cpu")]
    judged = SETTINGS[setting][2]
    ratio = share / slow if slow > 0 else float("inf")
    if not judged:
        verdict = "reported"
    elif slow > 0 and abs(share - slow) <= TOLERANCE * slow:
        verdict = "PASS"
    else:
        verdict = "FAIL"
    return {"setting": setting, "slow": slow, "share": share, "ratio": ratio, "per": per,
            "se": se, "verdict": verdict, "eff_slow": eff_slow,
            "in_target": statistics.mean(w["in_target"] for w in on), "on": len(on), "off": len(off),
            "cpu_off": statistics.mean(cpu_off) if cpu_off else None}


def print_table(rows, ncpu):
    print()
    print(f"{'setting':<8} {'A/B slowdown':>12} {'self-report':>11} {'ratio':>6} "
          f"{'pairs: min..max (sd)':>24} {'+/-se':>7}  {'in-target eff. slowdown / share':>31}  verdict")
    for r in rows:
        if "slow" not in r:
            print(f"{r['setting']:<8} {'':>12} {'':>11} {'':>6} {'':>24} {'':>7}  {'':>31}  {r['verdict']}")
            continue
        per = r["per"]
        spread = (f"{100 * min(per):.2f}..{100 * max(per):.2f}% ({100 * statistics.stdev(per):.2f})"
                  if len(per) >= 2 else "n/a")
        eff = ("n/a" if r["eff_slow"] is None else
               f"{100 * r['eff_slow']:.2f}% / {100 * r['in_target']:.2f}%")
        note = ""
        if r["verdict"] in ("PASS", "FAIL") and r["se"] == r["se"] and r["se"] > TOLERANCE * abs(r["slow"]):
            note = " (noise above the tolerance: rerun quiet)"
        print(f"{r['setting']:<8} {100 * r['slow']:11.2f}% {100 * r['share']:10.2f}% {r['ratio']:6.2f} "
              f"{spread:>24} {100 * r['se']:6.2f}%  {eff:>31}  {r['verdict']}{note}")
    # The comparison's premise: without the probe the target kept its CPUs
    # busy. Other processes on them, or a target that waits, break it.
    low = [r for r in rows if r.get("cpu_off") is not None and r["cpu_off"] < SATURATED * ncpu]
    for r in low:
        print(f"WARNING {r['setting']}: the target used {r['cpu_off']:.2f} of its {ncpu} CPU(s) in the OFF "
              f"windows (< {100 * SATURATED:.0f}%): it did not saturate them (other processes, or waits), "
              f"so its slowdown is not its cost share; rerun on a quiet machine")


def pin(cpus):
    """Pins this process (and so the probe it starts) to `cpus`; the prefix
    that pins the workload the same way."""
    if cpus == "all":
        return ()
    try:
        mask = {int(c) for c in cpus.split(",")}
        os.sched_setaffinity(0, mask)
    except (ValueError, OSError) as e:
        die(f"--cpus {cpus}: {e}")
    return ("taskset", "-c", cpus)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--probe", default=os.path.join(REPO, "target", "release", "plumber-probe"))
    ap.add_argument("--workload", default="padded_batch")
    ap.add_argument("--window", type=float, default=8.0, help="seconds per window (default 8)")
    ap.add_argument("--pairs", type=int, default=4, help="OFF/ON pairs per setting (default 4)")
    ap.add_argument("--settings", default=",".join(s for s in SETTINGS if s != "timer999"),
                    help=f"comma-separated, from {', '.join(SETTINGS)} (default all but timer999)")
    ap.add_argument("--cpus", default="1",
                    help="CPUs the workload, the probe and this script run on (default 1; 'all': unpinned)")
    ap.add_argument("--probe-cpus", default=None,
                    help="CPUs the probe and this script run on, apart from the workload's --cpus "
                         "(default: the same as --cpus)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after READY (default 5)")
    ap.add_argument("--settle", type=float, default=0.5, help="pause after each ON window (default 0.5)")
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    ap.add_argument("--probe-timeout", type=float, default=120.0)
    ap.add_argument("--keep", metavar="DIR", help="keep the probe outputs and workload log here")
    args = ap.parse_args()
    check_setup(args)
    settings = [s for s in args.settings.split(",") if s]
    bad = [s for s in settings if s not in SETTINGS]
    if bad or args.window <= 0 or args.pairs < 1:
        die(f"unknown settings {bad}" if bad else "--window must be > 0 and --pairs >= 1")

    prefix = pin(args.cpus)
    work = args.keep or tempfile.mkdtemp(prefix="plumber-selfcheck-")
    os.makedirs(work, exist_ok=True)
    seconds = args.warmup + len(settings) * args.pairs * (2 * args.window + 60) + 120
    wl = Workload(args.python, args.workload, seconds, work, [], prefix=prefix)
    rows = []
    try:
        if not wl.ready.wait(timeout=180):
            die(f"workload never printed READY (see {wl.stderr_path})")
        if args.probe_cpus:
            pin(args.probe_cpus)
        print(f"workload {args.workload} pid {wl.pid} on CPUs {args.cpus}"
              f"{'' if not args.probe_cpus else f', probe on CPUs {args.probe_cpus}'}; {args.pairs} ABBA pairs of "
              f"{args.window:g} s windows per setting; probe {args.probe}", flush=True)
        sampler = Sampler(wl.pid)
        time.sleep(args.warmup)
        for s in settings:
            rows.append(summarize(s, measure(args, s, wl, sampler, work)))
    finally:
        wl.stop()
    ncpu = os.cpu_count() if args.cpus == "all" else len(args.cpus.split(","))
    print_table(rows, ncpu)
    judged = [r for r in rows if SETTINGS[r["setting"]][2]]
    if not judged:
        print(f"no judged setting: figures reported only; logs: {work}")
        return 0
    ok = all(r["verdict"] == "PASS" for r in judged)
    print(f"{'PASS' if ok else 'FAIL'}: every judged setting's self-report within "
          f"+/-{100 * TOLERANCE:.0f}% (relative) of its A/B slowdown"
          f"{'' if ok else ' does not hold'}; logs: {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
