#!/usr/bin/env python3
"""Parse a workload's stdout (READY / GT / DONE lines) and count elements in a time window.

Library:
    import groundtruth
    log = groundtruth.parse(lines)               # lines: iterable of str, or one str
    n = groundtruth.window_count(lines, start_ns, end_ns, key="root")
    r = groundtruth.window_rate(lines, start_ns, end_ns, key="elems")   # per second

CLI:
    groundtruth.py LOG                          # summary (JSON)
    groundtruth.py LOG --start NS --end NS [--key root|elems]

Counters are cumulative and sampled at the wall_ns of each GT line; values between
two GT lines are linearly interpolated. The PyTorch workloads (torch_*.py) add
`stall_ns=` and `epoch=` to their GT lines (usable as keys when every GT line has
them), more fields to READY (log.ready), and `WORKERS pids=..` and `CHECKSUM` lines
(log.workers, log.checksum). A window that starts before the first GT
line or ends after the last one is an error (WindowNotCovered), never extrapolated.

IO lines (torch_image) are per process: `IO pid= wall_ns= bytes= reads= files=`, what the read()
syscalls on the dataset's files returned in that process so far, printed after the reads they
count. Between two lines the true count is not interpolated but bounded:
log.io_bounds(pid, t_ns) is (value of the pid's last line at or before t, of its first line at
or after t), and log.io_window_bounds(pid, start_ns, end_ns) bounds what it read in between. A
process with no line after t read nothing after its last line (the log must run past t), and one
with no line before t had read nothing (its first line, a worker's zeros, precedes its reads).
The module needs only the standard library.
"""

import argparse
import bisect
import json
import sys

KEYS = ("root", "elems")
# Counters only some workloads print (the PyTorch ones); when the first GT line has
# one, every GT line must.
OPTIONAL_KEYS = ("stall_ns", "epoch")
# Counters of an IO line.
IO_KEYS = ("bytes", "reads", "files")


class GroundTruthError(ValueError):
    pass


class WindowNotCovered(GroundTruthError):
    pass


class Log:
    """Parsed workload output."""

    def __init__(self):
        self.pid = None
        self.pipeline = None
        self.ready = {}            # every READY field, as strings
        self.done_root = None
        self.checksum = None       # (crc, root) from a CHECKSUM line
        self.workers = []          # WORKERS lines: {"pids": [..], "epoch": k|None, "wall_ns": ns|None}
        self.wall_ns = []          # sorted, strictly increasing
        self.counters = {k: [] for k in KEYS}
        self.io = {}               # pid -> [(wall_ns, {bytes, reads, files})], in order

    @property
    def keys(self):
        return tuple(self.counters)

    def worker_pids(self):
        """Every worker pid of every WORKERS line, in order of appearance, once each."""
        seen = []
        for w in self.workers:
            seen.extend(p for p in w["pids"] if p not in seen)
        return seen

    @property
    def samples(self):
        return len(self.wall_ns)

    def series(self, key):
        if key not in self.counters:
            raise GroundTruthError(f"unknown key {key!r} (have {', '.join(self.counters)})")
        return self.counters[key]

    def value_at(self, t_ns, key="root"):
        """Cumulative counter at Unix-ns instant t_ns (linear interpolation)."""
        ts, vs = self.wall_ns, self.series(key)
        if not ts:
            raise WindowNotCovered("no GT lines")
        if t_ns < ts[0] or t_ns > ts[-1]:
            raise WindowNotCovered(
                f"instant {t_ns} outside the GT lines [{ts[0]}, {ts[-1]}]")
        i = bisect.bisect_left(ts, t_ns)
        if ts[i] == t_ns:
            return float(vs[i])
        t0, t1, v0, v1 = ts[i - 1], ts[i], vs[i - 1], vs[i]
        return v0 + (v1 - v0) * (t_ns - t0) / (t1 - t0)

    def window_count(self, start_ns, end_ns, key="root"):
        if end_ns < start_ns:
            raise GroundTruthError(f"window end {end_ns} before start {start_ns}")
        return self.value_at(end_ns, key) - self.value_at(start_ns, key)

    def window_rate(self, start_ns, end_ns, key="root"):
        if end_ns <= start_ns:
            raise GroundTruthError("empty window")
        return self.window_count(start_ns, end_ns, key) * 1e9 / (end_ns - start_ns)

    def stall_share(self, start_ns, end_ns):
        """Fraction of [start_ns, end_ns] the loop spent waiting for data (needs stall_ns)."""
        if end_ns <= start_ns:
            raise GroundTruthError("empty window")
        return self.window_count(start_ns, end_ns, "stall_ns") / (end_ns - start_ns)

    def io_bounds(self, pid, t_ns, key="bytes"):
        """(lo, hi) bounds of what `pid` had read at instant t_ns (0, 0 without IO lines)."""
        if key not in IO_KEYS:
            raise GroundTruthError(f"unknown IO key {key!r} (have {', '.join(IO_KEYS)})")
        pts = self.io.get(pid, [])
        before = [c[key] for t, c in pts if t <= t_ns]
        after = [c[key] for t, c in pts if t >= t_ns]
        lo = before[-1] if before else 0
        hi = after[0] if after else (pts[-1][1][key] if pts else 0)
        return lo, hi

    def io_window_bounds(self, pid, start_ns, end_ns, key="bytes"):
        """(lo, hi) bounds of what `pid` read between two instants."""
        if end_ns < start_ns:
            raise GroundTruthError(f"window end {end_ns} before start {start_ns}")
        lo0, hi0 = self.io_bounds(pid, start_ns, key)
        lo1, hi1 = self.io_bounds(pid, end_ns, key)
        return max(lo1 - hi0, 0), hi1 - lo0

    def summary(self):
        d = {"pid": self.pid, "pipeline": self.pipeline, "gt_lines": self.samples,
             "done_root": self.done_root}
        if self.samples:
            t0, t1 = self.wall_ns[0], self.wall_ns[-1]
            d.update(first_wall_ns=t0, last_wall_ns=t1, span_s=(t1 - t0) / 1e9)
            for k in self.counters:
                v = self.counters[k]
                d[f"{k}_total"] = v[-1]
                if t1 > t0 and k != "epoch":
                    d[f"{k}_per_s"] = (v[-1] - v[0]) * 1e9 / (t1 - t0)
            if "stall_ns" in self.counters and t1 > t0:
                d["stall_share"] = self.stall_share(t0, t1)
        for k in ("num_workers", "batch_size", "start_method"):
            if k in self.ready:
                d[k] = self.ready[k]
        if self.workers:
            d["worker_sets"] = len(self.workers)
            d["worker_pids"] = self.worker_pids()
        if self.checksum is not None:
            d["checksum"] = f"{self.checksum[0]:08x}"
        if self.io:
            d["io"] = {str(pid): pts[-1][1] for pid, pts in self.io.items()}
        return d


def _kv(fields, lineno):
    out = {}
    for f in fields:
        k, sep, v = f.partition("=")
        if not sep or not k:
            raise GroundTruthError(f"line {lineno}: bad field {f!r}")
        out[k] = v
    return out


def _int(d, k, lineno):
    try:
        return int(d[k])
    except KeyError:
        raise GroundTruthError(f"line {lineno}: missing {k}=") from None
    except ValueError:
        raise GroundTruthError(f"line {lineno}: {k}={d[k]!r} is not an integer") from None


def parse(log_lines, strict=False):
    """Parse READY/GT/WORKERS/IO/CHECKSUM/DONE lines; others are ignored (an error if strict)."""
    if isinstance(log_lines, (bytes, bytearray)):
        log_lines = log_lines.decode()
    if isinstance(log_lines, str):
        log_lines = log_lines.splitlines()
    log = Log()
    for lineno, line in enumerate(log_lines, 1):
        fields = line.split()
        if not fields:
            continue
        tag = fields[0]
        if tag == "GT":
            d = _kv(fields[1:], lineno)
            t = _int(d, "wall_ns", lineno)
            if not log.wall_ns:  # the first GT line decides the optional counters
                for k in OPTIONAL_KEYS:
                    if k in d:
                        log.counters[k] = []
            keys = log.keys
            extra = [k for k in OPTIONAL_KEYS if k in d and k not in log.counters]
            if extra:
                raise GroundTruthError(f"line {lineno}: {extra[0]}= not on the first GT line")
            vals = {k: _int(d, k, lineno) for k in keys}
            if log.wall_ns and t <= log.wall_ns[-1]:
                if t == log.wall_ns[-1] and all(vals[k] == log.counters[k][-1] for k in keys):
                    continue  # exact duplicate
                raise GroundTruthError(f"line {lineno}: wall_ns not increasing")
            for k in keys:
                if log.counters[k] and vals[k] < log.counters[k][-1]:
                    raise GroundTruthError(f"line {lineno}: {k} decreased")
            log.wall_ns.append(t)
            for k in keys:
                log.counters[k].append(vals[k])
        elif tag == "READY":
            d = _kv(fields[1:], lineno)
            log.pid = _int(d, "pid", lineno)
            log.pipeline = d.get("pipeline")
            log.ready = d
        elif tag == "WORKERS":
            d = _kv(fields[1:], lineno)
            if "pids" not in d:
                raise GroundTruthError(f"line {lineno}: missing pids=")
            try:
                pids = [int(p) for p in d["pids"].split(",")]
            except ValueError:
                raise GroundTruthError(f"line {lineno}: pids={d['pids']!r} is not a list "
                                       "of integers") from None
            log.workers.append({
                "pids": pids,
                "epoch": _int(d, "epoch", lineno) if "epoch" in d else None,
                "wall_ns": _int(d, "wall_ns", lineno) if "wall_ns" in d else None})
        elif tag == "IO":
            d = _kv(fields[1:], lineno)
            pid, t = _int(d, "pid", lineno), _int(d, "wall_ns", lineno)
            vals = {k: _int(d, k, lineno) for k in IO_KEYS}
            pts = log.io.setdefault(pid, [])
            if pts and t < pts[-1][0]:
                raise GroundTruthError(f"line {lineno}: wall_ns of pid {pid} went back")
            if pts and any(vals[k] < pts[-1][1][k] for k in IO_KEYS):
                raise GroundTruthError(f"line {lineno}: an IO counter of pid {pid} decreased")
            pts.append((t, vals))
        elif tag == "CHECKSUM":
            d = _kv(fields[1:], lineno)
            try:
                crc = int(d.get("crc", ""), 16)
            except ValueError:
                raise GroundTruthError(f"line {lineno}: bad crc=") from None
            log.checksum = (crc, _int(d, "root", lineno))
        elif tag == "DONE":
            d = _kv(fields[1:], lineno)
            log.done_root = _int(d, "root", lineno)
        elif strict:
            raise GroundTruthError(f"line {lineno}: unexpected line {line[:80]!r}")
    return log


def _as_log(log_lines):
    return log_lines if isinstance(log_lines, Log) else parse(log_lines)


def window_count(log_lines, start_ns, end_ns, key="root"):
    """Elements of counter `key` consumed between two Unix-ns instants (float).

    log_lines: the workload's stdout as lines, one string, or a parsed Log.
    Raises WindowNotCovered if [start_ns, end_ns] is not inside the GT lines.
    """
    return _as_log(log_lines).window_count(start_ns, end_ns, key)


def window_rate(log_lines, start_ns, end_ns, key="root"):
    """Elements per second of counter `key` over [start_ns, end_ns]."""
    return _as_log(log_lines).window_rate(start_ns, end_ns, key)


def read_log(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse(f.read())


def main(argv=None):
    p = argparse.ArgumentParser(description="Summarise a workload log / count a window.")
    p.add_argument("log")
    p.add_argument("--start", type=int, help="window start, Unix ns")
    p.add_argument("--end", type=int, help="window end, Unix ns")
    p.add_argument("--key", default="root", choices=KEYS + OPTIONAL_KEYS)
    a = p.parse_args(argv)
    try:
        log = read_log(a.log)
        out = log.summary()
        if a.start is not None or a.end is not None:
            if a.start is None or a.end is None:
                raise GroundTruthError("--start and --end go together")
            out["window"] = {"start_ns": a.start, "end_ns": a.end, "key": a.key,
                             "count": log.window_count(a.start, a.end, a.key),
                             "per_s": log.window_rate(a.start, a.end, a.key)}
    except (OSError, GroundTruthError) as e:
        print(f"groundtruth: {e}", file=sys.stderr)
        return 2
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
