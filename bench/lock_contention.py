#!/usr/bin/env python3
"""Do the default mode's lock and attribution probes raise the lock
contention they measure?

The default mode times lock waits with a uprobe at `Mutex::LockSlow`'s
entry and a uretprobe at its return, and the return probe runs with the
lock just taken: its trap lengthens every contended critical section. If
that mattered, threads would find the lock held more often, so LockSlow
would be entered more often per element. This counts LockSlow's entries
per element of the workload with the entry probe alone (E) and with both
probes (B), in alternating blocks of one workload; O blocks attach nothing.
The counts per element hardly move with the host's speed, unlike the
throughput, so this resolves on a noisy machine too.

R blocks put a uprobe on `model::Node::record_stop` beside the entry probe:
the default mode's attribution windows trap there, and TensorFlow calls it
from the pool threads, possibly with a lock held; if its trap lengthened
critical sections, LockSlow would be entered more often per element too.

The probes are plain tracefs uprobes counted by `perf stat` (no BPF), at
the offsets of LockSlow and record_stop in the target's own
libtensorflow_framework.so.2, derived from its symbol table and program
headers. Needs root and tracefs.

    sudo python3 bench/lock_contention.py                 # EBOOBE twice, 15 s blocks
    sudo python3 bench/lock_contention.py --order EBEB --block 20
    sudo python3 bench/lock_contention.py --order ERREERREERREERRE  # record_stop's trap
"""

import argparse
import glob
import os
import re
import statistics
import subprocess
import tempfile
import time

from common import REPO, Workload, check_python, die

LOCKSLOW = "5Mutex8LockSlowEPKNS0_6MuHowSEPKNS0_9ConditionEi"  # as probe/src/attach.rs
RECORD_STOP = "_ZN10tensorflow4data5model4Node11record_stopEl"  # as probe/src/attach.rs
TRACEFS = "/sys/kernel/tracing"
GROUP = "pp_lock_contention"


def file_offset(lib, suffix):
    """File offset of the one defined dynamic symbol ending in `suffix`."""
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    hits = [l.split() for l in nm.stdout.splitlines() if l.endswith(suffix)]
    if len(hits) != 1:
        die(f"{len(hits)} symbols ending in {suffix} in {lib}; expected one")
    vaddr = int(hits[0][0], 16)
    ph = subprocess.run(["readelf", "-lW", lib], capture_output=True, text=True).stdout
    for m in re.finditer(r"LOAD\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x([0-9a-f]+)", ph):
        off, va, size = (int(x, 16) for x in m.groups())
        if va <= vaddr < va + size:
            return vaddr - va + off
    die(f"symbol at {vaddr:#x} outside every LOAD segment of {lib}")


def write_events(lines):
    # tracefs rejects the seek of Python's append mode.
    fd = os.open(f"{TRACEFS}/uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        for line in lines:
            os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", default="EBOOBE" * 2,
                    help="blocks: E entry, B entry+return, R entry+record_stop, O none")
    ap.add_argument("--block", type=float, default=15.0, help="seconds a block")
    ap.add_argument("--workload", default="tfrecord_image")
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        die("needs root (tracefs uprobes); run with sudo")
    if not os.path.isdir(f"{TRACEFS}/events"):
        die(f"no tracefs at {TRACEFS}; mount it: mount -t tracefs nodev {TRACEFS}")
    if set(args.order) - set("EBRO"):
        die("--order takes E, B, R and O only")
    check_python(args)
    libs = glob.glob(os.path.join(REPO, ".venv", "lib", "python3*", "site-packages",
                                  "tensorflow", "libtensorflow_framework.so.2"))
    if len(libs) != 1:
        die("no single libtensorflow_framework.so.2 in .venv; run scripts/setup.sh")
    lib = os.path.realpath(libs[0])
    off = file_offset(lib, LOCKSLOW)
    rs_off = file_offset(lib, RECORD_STOP)
    events = {"E": f"{GROUP}:entry", "B": f"{GROUP}:entry,{GROUP}:ret",
              "R": f"{GROUP}:entry,{GROUP}:rstop", "O": None}

    logdir = tempfile.mkdtemp(prefix="pp-lockc-")
    seconds = int(20 + len(args.order) * (args.block + 3) + 30)
    w = Workload(args.python, args.workload, seconds, logdir, [])
    rows = []
    try:
        # Inside the try, so that the events go whatever stops the run.
        write_events([f"p:{GROUP}/entry {lib}:{off:#x}", f"r:{GROUP}/ret {lib}:{off:#x}",
                      f"p:{GROUP}/rstop {lib}:{rs_off:#x}"])
        if not w.ready.wait(120):
            die(f"workload not READY; see {w.stderr_path}")
        time.sleep(15)  # autotune settles
        for kind in args.order:
            t0 = time.time_ns()
            if events[kind]:
                out = subprocess.run(
                    ["perf", "stat", "-x,", "-e", events[kind], "-p", str(w.pid), "--",
                     "sleep", str(args.block)], capture_output=True, text=True).stderr
                counts = {}
                for line in out.splitlines():
                    f = line.split(",")
                    if len(f) > 2 and f[0].isdigit():
                        counts[f[2].split(":")[-1]] = int(f[0])
                if "entry" not in counts:
                    die(f"perf stat counted nothing: {out.strip()[:300]}")
            else:
                time.sleep(args.block)
                counts = {}
            t1 = time.time_ns()
            rate = w.rate(t0, t1)
            n = rate * (t1 - t0) / 1e9
            rows.append((kind, rate, {k: v / n for k, v in counts.items()}))
            per = " ".join(f"{k} {v:.3f}/element" for k, v in rows[-1][2].items())
            print(f"{kind}  {rows[-1][1]:7.1f} elements/s  {per}", flush=True)
            time.sleep(1)
    finally:
        w.stop()
        for name in ("entry", "ret", "rstop"):
            try:
                write_events([f"-:{GROUP}/{name}"])
            except OSError:
                pass  # never added: the add failed before it

    print(f"\n{args.workload}, {args.block:g} s blocks, {len(rows)} blocks; logs: {logdir}")
    for kind, name in (("E", "entry probe only"), ("B", "entry + return probes"),
                       ("R", "entry + record_stop probes"), ("O", "nothing")):
        sel = [r for r in rows if r[0] == kind]
        if not sel:
            continue
        rate = statistics.mean(r[1] for r in sel)
        line = f"{kind} ({name}): {len(sel)} blocks, {rate:.0f} elements/s"
        if kind != "O":
            per = [r[2]["entry"] for r in sel]
            sd = statistics.stdev(per) if len(per) > 1 else 0.0
            line += f", LockSlow entries {statistics.mean(per):.3f}/element (sd {sd:.3f})"
        if kind == "R":
            line += f", record_stop {statistics.mean(r[2]['rstop'] for r in sel):.2f}/element"
        print(line)
    e = [r[2]["entry"] for r in rows if r[0] == "E"]
    for kind, why in (("B", "the return probe's"), ("R", "record_stop's")):
        x = [r[2]["entry"] for r in rows if r[0] == kind]
        if e and x:
            print(f"entries per element, {kind}/E: {statistics.mean(x) / statistics.mean(e):.4f} "
                  f"(above 1: {why} trap raises contention)")


if __name__ == "__main__":
    main()
