#!/usr/bin/env python3
"""What a recording costs by mechanism, where the throughput ratio cannot
see it (a noisy machine, or parts too small): the probe's own CPU and
wakeups, and how long each attribution window keeps its probes in the
target.

    sudo python3 bench/probe_cost.py [--probe BIN ...] [--rounds 2] [--duration 30]

Starts one workload (tests/workloads/tfrecord_image.py) and records it
ROUNDS times with each probe binary in turn (several binaries: the same
workload measures each). During each recording it reads, every 50 ms, each
of the probe's threads' CPU time (/proc/PID/task/TID/schedstat, ns) and
voluntary context switches (a switch that is not a preemption is a sleep,
so each one is a wakeup), and, every ~10 ms, the run counts of the
window's BPF programs (`kernel.bpf_stats_enabled`, `bpftool prog show`):
a program whose count rises is attached. Prints per binary:

  * CPU ms/s and wakeups/s of the probe over the recording window
    (report.json `window`), and between windows (from 1 s after a window's
    programs last ran to 1.5 s before they next run, as the run counts
    show), per thread and in all;
  * per window, how long each program ran (first to last rise of its run
    count, ±10 ms) and how many times;
  * every program the probe loaded: its runs, run time per run and in all
    (kernel.bpf_stats_enabled's run_time_ns: the handlers' own time, in
    the target's threads or in interrupts; the traps around them are not
    counted).

The CPU and wakeups are exact; they are what the target's machine gives up
to the probe itself. The probes' time in is the window's cost in the
target (BENCHMARKS.md: ~5% of the pipeline's throughput while record_stop
is in, less for the lock and GIL probes alone). Standard library and
bpftool. Needs root.
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
from common import REPO, Workload, die  # noqa: E402

WINDOW_PROGS = ("record_stop_probe", "on_switch", "mutex_enter", "gil_enter")
# Margins around the window programs' observed runs that still count as the
# window: the attach before, the detach and the maps read at the next poll
# after.
BEFORE, AFTER = 1.5, 1.0


def thread_sample(pid):
    """tid -> (name, cpu ns, voluntary switches) of a live process."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"{base}/status") as f:
                vol = int(f.read().split("\nvoluntary_ctxt_switches:\t")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        out[tid] = (name, ns, vol)
    return out


def prog_snapshot():
    """BPF program id -> (name, run count, run time ns), for every program."""
    r = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    try:
        progs = json.loads(r.stdout)
    except ValueError:
        return {}
    return {p["id"]: (p.get("name", "?"), p.get("run_cnt", 0), p.get("run_time_ns", 0))
            for p in progs if "id" in p}


def window_counts(snap):
    """BPF program name -> run count, for the window's programs."""
    return {name: cnt for name, cnt, _ in snap.values() if name in WINDOW_PROGS}


def program_totals(snaps):
    """name -> (runs, run time ns) of the programs that appeared during the
    recording (the probe's), at the last snapshot that shows each."""
    before = set(snaps[0][1]) if snaps else set()
    last = {}
    for _, snap in snaps:
        for prog_id, (name, cnt, ns) in snap.items():
            if prog_id not in before:
                last[prog_id] = (name, cnt, ns)
    out = collections.defaultdict(lambda: [0, 0])
    for name, cnt, ns in last.values():
        out[name][0] += cnt
        out[name][1] += ns
    return out


def record(probe, pid, duration, outdir):
    stop = threading.Event()
    snaps = []

    def watch_progs():
        while not stop.is_set():
            snaps.append((time.time_ns(), prog_snapshot()))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch_progs, daemon=True)
    watcher.start()
    p = subprocess.Popen([probe, "--pid", str(pid), "--duration", str(duration),
                          "--output", outdir, "-q"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    threads = []
    while p.poll() is None:
        threads.append((time.time_ns(), thread_sample(p.pid)))
        time.sleep(0.05)
    stop.set()
    watcher.join()
    err = p.stderr.read()
    if p.returncode != 0:
        die(f"{probe} exited {p.returncode}: {err.strip()[-300:]}")
    with open(os.path.join(outdir, "report.json")) as f:
        w = json.load(f)["window"]
    counts = [(t, window_counts(snap)) for t, snap in snaps]
    return int(w["start_ns"]), int(w["end_ns"]), threads, counts, program_totals(snaps)


def usage_between(threads, start_ns, spans):
    """Seconds covered, CPU ns and wakeups per thread name within `spans`
    (seconds after start_ns)."""
    secs, cpu, wake = 0.0, collections.Counter(), collections.Counter()
    for (ta, a), (tb, b) in zip(threads, threads[1:]):
        if not any(start_ns + lo * 1e9 <= ta and tb <= start_ns + hi * 1e9 for lo, hi in spans):
            continue
        secs += (tb - ta) / 1e9
        for tid, (name, ns, vol) in b.items():
            if tid in a:
                cpu[name] += ns - a[tid][1]
                wake[name] += vol - a[tid][2]
    return secs, cpu, wake


def program_spans(counts, start_ns):
    """name -> [(from s, to s, runs)]: the stretches in which its count rose."""
    out = {}
    for name in WINDOW_PROGS:
        spans = []
        for (ta, a), (tb, b) in zip(counts, counts[1:]):
            if name not in a or name not in b or b[name] <= a[name]:
                continue
            lo, hi = (ta - start_ns) / 1e9, (tb - start_ns) / 1e9
            if spans and lo - spans[-1][1] < 0.1:
                spans[-1][1] = hi
                spans[-1][2] += b[name] - a[name]
            else:
                spans.append([lo, hi, b[name] - a[name]])
        out[name] = spans
    return out


def between_windows(spans, length):
    """(from s, to s) of the recording with no window program running,
    less the margins, from program_spans' output."""
    busy = sorted((lo - BEFORE, hi + AFTER) for runs in spans.values() for lo, hi, _ in runs)
    out, t = [], 0.0
    for lo, hi in busy:
        if lo > t:
            out.append((t, lo))
        t = max(t, hi)
    if t < length - BEFORE:
        out.append((t, length - BEFORE))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", action="append",
                    help="probe binary (repeatable; default target/release/plumber-probe)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        die("needs root (the probe does, and so do the BPF run counts)")
    probes = [os.path.abspath(p) for p in (args.probe or
                                           [os.path.join(REPO, "target", "release", "plumber-probe")])]
    for p in probes:
        if not os.access(p, os.X_OK):
            die(f"probe binary {p} not found; build it with `cargo build --release -p plumber-probe`")
    work = tempfile.mkdtemp(prefix="probe-cost-")
    seconds = 30 + args.rounds * len(probes) * (args.duration + 15)
    wl = Workload(args.python, "tfrecord_image", seconds, work, [])
    if not wl.ready.wait(180):
        wl.stop()
        die(f"workload not ready; see {wl.stderr_path}")
    time.sleep(5)
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        stats_was = f.read().strip()
    with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
        f.write("1")
    rows = collections.defaultdict(list)
    try:
        for r in range(args.rounds):
            for i, probe in enumerate(probes):
                out = os.path.join(work, f"r{r}-p{i}")
                rows[probe].append(record(probe, wl.pid, args.duration, out))
                time.sleep(2)
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(stats_was)
        wl.stop()
    print(f"workload tfrecord_image pid {wl.pid}; {args.rounds} recording(s) of "
          f"{args.duration:.0f} s per binary, in turn; logs in {work}")
    for probe in probes:
        print(f"\n{probe}")
        for n, (start, end, threads, counts, totals) in enumerate(rows[probe]):
            progs = program_spans(counts, start)
            length = (end - start) / 1e9
            for label, spans in (("recording", ((0.0, length),)),
                                 ("between windows", between_windows(progs, length))):
                secs, cpu, wake = usage_between(threads, start, spans)
                if secs <= 0:
                    continue
                per = "  ".join(f"{k} {cpu[k] / 1e6 / secs:.2f} ms/s {wake[k] / secs:.1f}/s"
                                for k in sorted(cpu))
                print(f"  #{n} {label:15} CPU {sum(cpu.values()) / 1e6 / secs:5.2f} ms/s, "
                      f"wakeups {sum(wake.values()) / secs:4.1f}/s ({secs:.1f} s): {per}")
            for name, spans in progs.items():
                text = " | ".join(f"{lo:6.2f}-{hi:6.2f} s: {hi - lo:.3f} s, {k} runs" for lo, hi, k in spans)
                print(f"  #{n} {name:17} {text}")
            # Start-up to exit, over the recording window's length: the
            # programs run only while the probe is attached.
            ncpu = os.cpu_count() or 1
            total = sum(ns for _, ns in totals.values())
            print(f"  #{n} BPF programs, run time over the {length:.1f} s window: "
                  f"{total / 1e6 / length:.2f} ms/s ({100 * total / 1e9 / length / ncpu:.3f}% "
                  f"of {ncpu} CPUs; traps and interrupts not included)")
            for name, (runs, ns) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
                if runs:
                    print(f"  #{n}   {name:18} {runs:8d} runs {ns / runs / 1e3:7.2f} us/run "
                          f"{ns / 1e6 / length:6.3f} ms/s")


if __name__ == "__main__":
    main()
