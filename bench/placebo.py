#!/usr/bin/env python3
"""A stand-in for plumber-probe that attaches nothing: the A/A check of
bench/overhead.py.

    sudo PLACEBO_STARTUP=0.4 python3 bench/overhead.py --probe bench/placebo.py \
        --window 30 --pairs 24

Takes the probe's command line, waits as long as the probe's warm start-up
takes (PLACEBO_STARTUP seconds, default 0.4: BENCHMARKS.md, time to first
data), sleeps through --duration seconds as its "recording", and writes the
report.json fields the harness reads (`window.start_ns`, `window.end_ns`).
Every ON window then carries the harness's own part (a child started and
reaped, its pipes read, the window taken from its report) and nothing of the
probe: a ratio away from 1.00 is the harness's bias or the machine's noise.
Standard library only.
"""

import json
import os
import sys
import time


def main(argv):
    try:
        duration = float(argv[argv.index("--duration") + 1])
        out = argv[argv.index("--output") + 1]
    except (ValueError, IndexError):
        print("placebo: needs --duration SECONDS and --output DIR", file=sys.stderr)
        return 2
    time.sleep(float(os.environ.get("PLACEBO_STARTUP", "0.4")))
    start = time.time_ns()
    time.sleep(duration)
    end = time.time_ns()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"mode": "placebo",
                   "window": {"start_ns": start, "end_ns": end, "partial": False}}, f)
    print("mode: placebo")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
