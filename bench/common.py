"""Shared pieces of the benchmark scripts (Python standard library only)."""

import bisect
import os
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def die(msg):
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
    sys.exit(2)


def check_setup(args, root=True):
    """Root (unless not needed), the release probe binary and the project's
    venv, or a one-line error."""
    if root and os.geteuid() != 0:
        die("needs root (plumber-probe attaches with eBPF and process_vm_readv); run with sudo")
    args.probe = os.path.abspath(args.probe)
    if not (os.path.isfile(args.probe) and os.access(args.probe, os.X_OK)):
        die(f"probe binary {args.probe} not found; build it with `cargo build --release -p plumber-probe`")
    check_python(args)


def check_python(args):
    """The project's venv, or a one-line error."""
    if not os.access(args.python, os.X_OK):
        die(f"python {args.python} not found (the workloads need the project's .venv)")


def abba(pairs):
    """Window kinds for `pairs` OFF/ON pairs in ABBA order (OFF ON | ON OFF
    | ...), so that a linear drift of the machine cancels."""
    kinds = []
    for k in range(pairs):
        kinds += ["OFF", "ON"] if k % 2 == 0 else ["ON", "OFF"]
    return kinds


# ---------------------------------------------------------------- workload --

class Workload:
    """The workload process and its GT lines, read by a background thread.
    `prefix` runs it under another command (`plumber-probe run ... --`); the
    pid is the one the workload prints, not the prefix's. `new_session`: its
    own session, so its own autogroup (copies then share the CPUs equally)."""

    def __init__(self, python, name, seconds, logdir, extra, prefix=(), tag="workload",
                 new_session=False):
        script = os.path.join(REPO, "tests", "workloads", f"{name}.py")
        if not os.path.isfile(script):
            die(f"no workload {script}")
        self.stderr_path = os.path.join(logdir, f"{tag}.stderr")
        self.stdout_path = os.path.join(logdir, f"{tag}.stdout")
        self._err = open(self.stderr_path, "wb")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self.proc = subprocess.Popen(
            list(prefix) + [python, script, "--seconds", str(seconds)] + list(extra),
            stdout=subprocess.PIPE, stderr=self._err, env=env, cwd=REPO,
            text=True, bufsize=1, start_new_session=new_session)
        self.pid = None
        self.ts = []      # GT wall_ns
        self.elems = []   # GT cumulative elems
        self.ready = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self._out = open(self.stdout_path, "w")
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        for line in self.proc.stdout:
            self._out.write(line)
            if line.startswith("READY"):
                for tok in line.split():
                    if tok.startswith("pid="):
                        self.pid = int(tok[4:])
                self.ready.set()
            elif line.startswith("GT "):
                f = dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)
                with self.lock:
                    t = int(f["wall_ns"])
                    if not self.ts or t > self.ts[-1]:
                        self.ts.append(t)
                        self.elems.append(int(f["elems"]))
        self._out.flush()
        self.done.set()

    def last_ns(self):
        with self.lock:
            return self.ts[-1] if self.ts else 0

    def wait_covered(self, t_ns, timeout=10.0):
        end = time.time() + timeout
        while self.last_ns() < t_ns:
            if self.done.is_set() or time.time() > end:
                return False
            time.sleep(0.05)
        return True

    def value_at(self, t_ns):
        with self.lock:
            ts, vs = self.ts, self.elems
            if not ts or t_ns < ts[0] or t_ns > ts[-1]:
                raise ValueError(f"instant {t_ns} not covered by GT lines")
            i = bisect.bisect_left(ts, t_ns)
            if ts[i] == t_ns:
                return float(vs[i])
            t0, t1, v0, v1 = ts[i - 1], ts[i], vs[i - 1], vs[i]
            return v0 + (v1 - v0) * (t_ns - t0) / (t1 - t0)

    def rate(self, start_ns, end_ns):
        """elems/s between two Unix-ns instants (waits for GT coverage)."""
        if not self.wait_covered(end_ns):
            raise ValueError("workload stopped printing GT lines before the window ended")
        n = self.value_at(end_ns) - self.value_at(start_ns)
        return n * 1e9 / (end_ns - start_ns)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()


# ----------------------------------------------------------------- sampler --

def proc_stat(pid):
    """/proc/PID/stat's fields after the command name (index 0 is field 3,
    the state; utime is 11, stime 12, cutime 13, cstime 14), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rindex(")") + 2:].split()


def proc_cpu_ticks(pid):
    """utime+stime (clock ticks) of a whole process, or None."""
    rest = proc_stat(pid)
    return None if rest is None else int(rest[11]) + int(rest[12])


def system_ticks():
    """(busy, steal) ticks of the whole machine. Steal is time the host ran
    something else on our vCPUs; a window with steal loses throughput to the
    host whichever kind it is."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    v = [int(x) for x in parts]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    steal = v[7] if len(v) > 7 else 0
    return sum(v[:8]) - idle, steal


class Sampler:
    """Samples (wall_ns, target ticks, probe pid, probe ticks, machine busy
    ticks, machine steal ticks) every 50 ms."""

    def __init__(self, target_pid):
        self.target_pid = target_pid
        self.probe_pid = None
        self.samples = []
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stopped:
            now = time.time_ns()
            t = proc_cpu_ticks(self.target_pid)
            ppid = self.probe_pid
            # The same work with or without a probe (its own stat file when
            # none), so that the harness costs ON and OFF windows alike.
            p = proc_cpu_ticks(ppid or os.getpid())
            if not ppid:
                p = None
            b, st = system_ticks()
            with self.lock:
                self.samples.append((now, t, ppid, p, b, st))
            time.sleep(0.05)

    def between(self, start_ns, end_ns, idx, probe_pid=None):
        """Ticks/s of field idx (1 target, 3 probe, 4 machine, 5 steal) between the
        first sample at/after start and the last at/before end."""
        with self.lock:
            s = [x for x in self.samples if start_ns <= x[0] <= end_ns
                 and x[idx] is not None and (probe_pid is None or x[2] == probe_pid)]
        if len(s) < 2 or s[-1][0] == s[0][0]:
            return None
        return (s[-1][idx] - s[0][idx]) / CLK_TCK / ((s[-1][0] - s[0][0]) / 1e9)


# One standard error of a mean ratio that tells 0.99 from 1.00 at two
# standard errors (bench/noise.py, bench/overhead.py).
RESOLVES = 0.0025


def pair_ratios(windows, key, pairs):
    """ON/OFF of `key` for each pair k that has both windows."""
    per = []
    for k in range(pairs):
        ws = {w["kind"]: w for w in windows if w["pair"] == k}
        if key in ws.get("ON", {}) and key in ws.get("OFF", {}):
            per.append(ws["ON"][key] / ws["OFF"][key])
    return per


def ratio_line(what, windows, key, pairs):
    """`what: mean(ON)/mean(OFF) (pairs: ...; spread)` for one figure of
    windows tagged kind ON/OFF and pair k, or None without both kinds."""
    on = [w[key] for w in windows if w["kind"] == "ON" and key in w]
    off = [w[key] for w in windows if w["kind"] == "OFF" and key in w]
    if not on or not off:
        return None
    per = pair_ratios(windows, key, pairs)
    spread = ""
    if len(per) >= 2:
        spread = (f"; pair min {min(per):.3f} max {max(per):.3f} "
                  f"median {statistics.median(per):.3f} sd {statistics.stdev(per):.3f}")
    return (f"{what}: {statistics.mean(on) / statistics.mean(off):.3f} "
            f"(pairs: {' '.join(f'{r:.3f}' for r in per)}{spread})")


def goal_line(per, goal=0.99):
    """Whether the pair ratios show the mean at or above `goal`, at two
    standard errors either way; a run whose standard error is too wide to
    tell `goal` from 1.00 says so, whatever its mean, so that a noisy run
    is not read as a result. Runs on one machine have differed from each
    other by more than their own standard errors (BENCHMARKS.md), so a run
    that meets the goal says to repeat it."""
    if len(per) < 2:
        return f"goal >= {goal}: not resolved (fewer than two pairs)"
    mean = statistics.mean(per)
    se = statistics.stdev(per) / len(per) ** 0.5
    shown = f"mean of the pairs {mean:.4f} +/-{se:.4f} (one standard error, {len(per)} pairs)"
    if se > RESOLVES:
        return (f"goal >= {goal}: NOT RESOLVED on this machine: {shown}; telling {goal} from "
                f"1.00 needs +/-{RESOLVES:.4f} or less (measure the noise with bench/noise.py)")
    if mean - 2 * se >= goal:
        return (f"goal >= {goal}: met in this run, {shown}; repeat it: runs have differed by "
                f"more than their own errors")
    if mean + 2 * se < goal:
        return f"goal >= {goal}: missed in this run, {shown}"
    return f"goal >= {goal}: within two standard errors of it, neither met nor missed: {shown}"
