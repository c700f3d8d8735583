#!/usr/bin/env python3
"""Throughput cost of plumber-probe on a running tf.data workload.

    sudo python3 bench/overhead.py [--probe target/release/plumber-probe]
        [--workload tfrecord_image] [--window 10] [--pairs 4] [--mode model|uprobes]

Starts one workload (tests/workloads/<name>.py), waits for READY and a warm-up,
then measures alternating windows of the same length in ONE run:

  OFF  nothing attached: the window is [t, t + W] on the wall clock;
  ON   plumber-probe --duration W attached: the window is the probe's own
       recording window, report.json `window.start_ns`..`window.end_ns` (Unix
       ns, first poll to last poll), so the probe's start-up (symbol lookups,
       layout derivation, discovery uprobe) and its post-processing (writing
       stats.pb) are NOT counted.

The harness itself must cost both kinds of window alike (on saturated cores
every wakeup of it takes throughput from the target): it sleeps through an
OFF window and blocks on the probe's exit in an ON one, and its /proc
sampler does the same reads in both.

Windows come in pairs, ordered ABBA (OFF ON | ON OFF | OFF ON | ...) to cancel
linear drift. The target's throughput in a window is the workload's own
ground truth: the cumulative `elems` of its GT lines (every 0.1 s), linearly
interpolated at both ends, divided by the window length.

Reports each window, the ratio mean(ON)/mean(OFF), each pair's ON/OFF ratio,
whether the pairs show the 0.99 goal met or missed at two standard errors
(or that this machine's noise leaves it unresolved, whatever the mean), the
same ratio for elements per CPU-second of the target (much less sensitive
to other processes on a shared machine; it includes costs paid inside the
target such as uprobe handlers, but not the probe's own CPU), and the
probe's CPU use as % of one core (whole run from the rusage of the reaped
child, and during the recording window from /proc/<pid>/stat samples).
On a VM it also prints each window's steal (time the host took the vCPUs,
from /proc/stat): such a window loses throughput whichever kind it is, and
the ratio over the pairs without steal is printed beside the full one.
Standard library only. Needs root (the probe does).
"""

import argparse
import json
import os
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    CLK_TCK, REPO, Sampler, Workload, abba, check_setup, die, goal_line, pair_ratios, ratio_line,
)


# ------------------------------------------------------------------- probe --

def run_probe(args, pid, outdir, sampler):
    cmd = [args.probe, "--pid", str(pid), "--duration", str(args.window),
           "--output", outdir, "-q", "--mode", args.mode] + shlex.split(args.probe_args)
    t0 = time.time_ns()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler.probe_pid = proc.pid
    out_r, err_r = [], []
    ts = [threading.Thread(target=lambda: out_r.append(proc.stdout.read()), daemon=True),
          threading.Thread(target=lambda: err_r.append(proc.stderr.read()), daemon=True)]
    for t in ts:
        t.start()
    # Sleep until the probe exits, without polling: a poll every 50 ms would
    # wake this process 20 times a second in ON windows only, and on saturated
    # cores each wakeup per second costs the target ~0.02% of its throughput
    # (BENCHMARKS.md, the waker experiment), a cost that is the harness's.
    # A pidfd turns readable at the exit; wait4 then reaps the child for its
    # exact rusage (all threads).
    pidfd = os.pidfd_open(proc.pid)
    try:
        if not select.select([pidfd], [], [], args.window + args.probe_timeout)[0]:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        os.close(pidfd)
    t1 = time.time_ns()
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.probe_pid = None
    for t in ts:
        t.join(timeout=5)
    stdout = out_r[0] if out_r else ""
    stderr = err_r[0] if err_r else ""
    res = {
        "rc": proc.returncode, "pid": proc.pid, "launch_ns": t0, "exit_ns": t1,
        "cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": (t1 - t0) / 1e9,
        "stdout": stdout, "stderr": stderr, "start_ns": None, "end_ns": None,
        "mode_line": next((l for l in stdout.splitlines() if l.startswith("mode:")), ""),
        "notes": [l for l in stdout.splitlines() if l.startswith(("dropped:", "PARTIAL"))],
    }
    for name, text in (("probe.stdout", stdout), ("probe.stderr", stderr)):
        try:
            with open(os.path.join(outdir, name), "w") as f:
                f.write(text)
        except OSError:
            pass
    err_lines = [l for l in stderr.splitlines() if l.strip()]
    if err_lines:
        res["notes"].append(f"stderr: {err_lines[-1][:160]}")
    try:
        with open(os.path.join(outdir, "report.json")) as f:
            rep = json.load(f)
        w = rep["window"]
        res["start_ns"], res["end_ns"] = int(w["start_ns"]), int(w["end_ns"])
        res["partial"] = bool(w.get("partial"))
        res["report_mode"] = rep.get("mode")
    except (OSError, ValueError, KeyError) as e:
        res["report_error"] = str(e)
    return res


# ----------------------------------------------------------------- profile --

def second_profile(wl, windows, length):
    """ON/OFF throughput by second of the window: tells a cost that lasts the
    whole recording from a transient the probe's start-up leaves behind
    (its discovery uprobe runs just before the window opens)."""
    bins = int(length)
    if bins < 2:
        return None
    rates = {"ON": [[] for _ in range(bins)], "OFF": [[] for _ in range(bins)]}
    for w in windows:
        for i in range(bins):
            a = w["start"] + i * 1_000_000_000
            b = a + 1_000_000_000
            if b > w["end"]:
                break
            try:
                rates[w["kind"]][i].append(wl.rate(a, b))
            except ValueError:
                break
    cols = []
    for i in range(bins):
        on, off = rates["ON"][i], rates["OFF"][i]
        if not on or not off:
            break
        cols.append(f"{statistics.mean(on) / statistics.mean(off):.3f}")
    if not cols:
        return None
    return f"throughput ON/OFF by second of the window: {' '.join(cols)}"


# -------------------------------------------------------------------- main --

# Steal share of the machine under which a window counts as calm.
STEAL_CALM = 0.01


def fmt_pct(x):
    return "   n/a" if x is None else f"{100 * x:5.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--probe", default=os.path.join(REPO, "target", "release", "plumber-probe"))
    ap.add_argument("--workload", default="tfrecord_image")
    ap.add_argument("--window", type=float, default=10.0, help="seconds per window (default 10)")
    ap.add_argument("--pairs", type=int, default=4, help="OFF/ON pairs (default 4)")
    ap.add_argument("--mode", choices=("model", "uprobes"), default="model")
    ap.add_argument("--probe-args", default="",
                    help="extra plumber-probe arguments, e.g. '--sample-hz 0'")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after READY (default 5)")
    ap.add_argument("--settle", type=float, default=0.5,
                    help="pause after the probe exits before the next window (default 0.5)")
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    ap.add_argument("--probe-timeout", type=float, default=120.0,
                    help="extra seconds the probe may take beyond --window (default 120)")
    ap.add_argument("--keep", metavar="DIR", help="keep the probe outputs and workload log here")
    ap.add_argument("workload_args", nargs="*", help="extra workload arguments (after --)")
    args = ap.parse_args()

    check_setup(args)
    if args.window <= 0 or args.pairs < 1:
        die("--window must be > 0 and --pairs >= 1")

    work = args.keep or tempfile.mkdtemp(prefix="plumber-overhead-")
    os.makedirs(work, exist_ok=True)
    # Generous: warm-up + 2 windows per pair + probe start-up/teardown.
    seconds = args.warmup + args.pairs * (2 * args.window + 60) + 120
    wl = Workload(args.python, args.workload, seconds, work, args.workload_args)
    try:
        if not wl.ready.wait(timeout=180):
            die(f"workload never printed READY (see {wl.stderr_path})")
        print(f"workload {args.workload} pid {wl.pid} ready; warm-up {args.warmup:.0f} s; "
              f"probe {args.probe} --mode {args.mode}; {args.pairs} pairs of {args.window:g} s windows (ABBA)",
              flush=True)
        sampler = Sampler(wl.pid)
        time.sleep(args.warmup)

        order = [(i // 2, kind) for i, kind in enumerate(abba(args.pairs))]

        windows = []  # dicts
        t_run0 = time.time_ns()
        print(f"{'#':>2} {'pair':>4} {'kind':<4} {'t0 s':>6} {'len s':>6} {'elems/s':>9} "
              f"{'target cpu':>10} {'el/cpu-s':>8} {'machine':>8} {'steal':>6} {'probe cpu':>9}  note", flush=True)
        for i, (k, kind) in enumerate(order):
            w = {"pair": k, "kind": kind, "note": ""}
            if kind == "OFF":
                start = time.time_ns()
                time.sleep(args.window)
                end = start + int(args.window * 1e9)
            else:
                outdir = os.path.join(work, f"probe-{i:02d}")
                shutil.rmtree(outdir, ignore_errors=True)
                r = run_probe(args, wl.pid, outdir, sampler)
                w["probe"] = r
                start, end = r["start_ns"], r["end_ns"]
                if r["rc"] != 0 or start is None or end is None or end <= start:
                    err = (r["stderr"].strip().splitlines() or ["(no stderr)"])[-1]
                    w["error"] = f"probe rc={r['rc']}: {err} {r.get('report_error', '')}".strip()
                    start = end = None
                else:
                    w["probe_cpu_run"] = r["cpu_s"] / r["wall_s"]
                    w["probe_cpu_window"] = sampler.between(start, end, 3, probe_pid=r["pid"])
                    w["note"] = r["mode_line"] + ("; " + "; ".join(r["notes"]) if r["notes"] else "")
                time.sleep(args.settle)
            if start is not None:
                try:
                    w["rate"] = wl.rate(start, end)
                except ValueError as e:
                    w["error"] = str(e)
                w["start"], w["end"] = start, end
                w["target_cpu"] = sampler.between(start, end, 1)
                w["machine"] = sampler.between(start, end, 4)
                st = sampler.between(start, end, 5)
                w["steal"] = None if st is None else st / os.cpu_count()
                if w.get("rate") is not None and w["target_cpu"]:
                    w["eff"] = w["rate"] / w["target_cpu"]
            windows.append(w)
            if "error" in w:
                print(f"{i:>2} {k:>4} {kind:<4} {'':>6} {'':>6} {'ERROR':>9}  {w['error']}", flush=True)
            else:
                mach = None if w["machine"] is None else w["machine"] / os.cpu_count()
                print(f"{i:>2} {k:>4} {kind:<4} {(start - t_run0) / 1e9:6.1f} {(end - start) / 1e9:6.2f} "
                      f"{w['rate']:9.1f} {fmt_pct(w['target_cpu']):>10} "
                      f"{w['eff'] if 'eff' in w else float('nan'):8.0f} {fmt_pct(mach):>8} "
                      f"{fmt_pct(w.get('steal')):>6} "
                      f"{fmt_pct(w.get('probe_cpu_window')) if kind == 'ON' else '':>9}  {w['note']}",
                      flush=True)
            if wl.done.is_set():
                print("workload exited early", file=sys.stderr)
                break
    finally:
        wl.stop()

    # ------------------------------------------------------------- summary --
    ok = lambda w: "rate" in w and "error" not in w
    on = [w["rate"] for w in windows if w["kind"] == "ON" and ok(w)]
    off = [w["rate"] for w in windows if w["kind"] == "OFF" and ok(w)]
    print()
    valid = [w for w in windows if ok(w)]
    line = ratio_line("throughput ratio probe/no-probe", valid, "rate", args.pairs)
    if line is None:
        print("no valid ON/OFF windows: no ratio", file=sys.stderr)
        return 1
    print(f"mean elems/s: ON {statistics.mean(on):.1f} ({len(on)} windows), "
          f"OFF {statistics.mean(off):.1f} ({len(off)} windows)")
    print(line)
    print(goal_line(pair_ratios(valid, "rate", args.pairs)))
    # Secondary, far less sensitive to other processes taking CPU from the
    # target: elements per CPU-second of the target. It keeps costs paid
    # inside the target (uprobe handlers, page faults) but not the probe's own
    # CPU, which is reported below.
    eff = ratio_line("elements per target CPU-second, probe/no-probe", valid, "eff", args.pairs)
    if eff:
        print(eff)
    busy = [w["machine"] / os.cpu_count() for w in windows if w.get("machine") is not None]
    if busy:
        print(f"machine busy (all {os.cpu_count()} CPUs, target included) during the windows: "
              f"{100 * min(busy):.0f}-{100 * max(busy):.0f}%")
    steal = [w["steal"] for w in valid if w.get("steal") is not None]
    if steal:
        print(f"steal (the host running something else on the vCPUs) during the windows: "
              f"{100 * min(steal):.1f}-{100 * max(steal):.1f}%")
        # A window the host took CPU from loses throughput whichever kind
        # it is; on a shared host the pairs without any are the cleaner
        # comparison (not a replacement for the ratio above: dropping
        # pairs by a measured property can bias it if the probe itself
        # changed steal, so both are printed).
        calm = [w for w in valid if w.get("steal") is not None and w["steal"] <= STEAL_CALM]
        pairs = {w["pair"] for w in calm if w["kind"] == "ON"} & {w["pair"] for w in calm if w["kind"] == "OFF"}
        if pairs and len(pairs) < args.pairs:
            sub = ratio_line(f"throughput ratio over the {len(pairs)} pairs with steal <= "
                             f"{100 * STEAL_CALM:.0f}% in both windows",
                             [w for w in calm if w["pair"] in pairs], "rate", args.pairs)
            if sub:
                print(sub)
    runs = [w["probe_cpu_run"] for w in windows if "probe_cpu_run" in w]
    inwin = [w["probe_cpu_window"] for w in windows if w.get("probe_cpu_window") is not None]
    probes = [w["probe"] for w in windows if "probe" in w and "probe_cpu_run" in w]
    if runs:
        cpu_s = [p["cpu_s"] for p in probes]
        wall_s = [p["wall_s"] for p in probes]
        print(f"probe CPU (% of one core): whole run {100 * statistics.mean(runs):.2f}% "
              f"(mean {statistics.mean(cpu_s):.2f} s CPU over {statistics.mean(wall_s):.1f} s wall per run, "
              f"start-up and output included); during the recording window "
              + (f"{100 * statistics.mean(inwin):.2f}%" if inwin else "n/a")
              + f" (/proc samples, {CLK_TCK} ticks/s)")
    ttfd = [p["mode_line"] for p in probes]
    if ttfd:
        print(f"probe: {ttfd[0]}" + (f" ... {ttfd[-1]}" if len(ttfd) > 1 else ""))
    profile = second_profile(wl, valid, args.window)
    if profile:
        print(profile)
    n_err = sum(1 for w in windows if "error" in w)
    if n_err:
        print(f"{n_err} window(s) failed; see above")
    print(f"logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
