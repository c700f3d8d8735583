#!/usr/bin/env python3
"""Self-test of the PyTorch workloads (tests/workloads/torch_*.py): their ground-truth lines.

Runs each workload for a few seconds under .venv-torch (num_workers 0 and 2, fork and spawn,
persistent workers and short non-persistent epochs, a SIGINT to the whole process group) and
checks that READY/GT/WORKERS/CHECKSUM/DONE parse and agree: elems is exactly the batch sizes
the loader must have produced (partial batches included), stall_ns never exceeds the wall
time, epochs and worker sets follow, the checksum does not depend on the start method.
The runs go concurrently (~30 s on 2 cores). Prints SKIP and exits 0 without .venv-torch
(scripts/torch.sh installs it). Plain asserts; exit 0 = pass, 1 = fail.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKLOADS = os.path.join(REPO, "tests", "workloads")
PYTHON = os.path.join(REPO, ".venv-torch", "bin", "python")
sys.path.insert(0, WORKLOADS)

import groundtruth  # noqa: E402

TIMEOUT = 55  # seconds, per run (they run concurrently)
CLOCK_SLACK_NS = 5_000_000  # stall uses perf_counter, wall time.time: allow a little drift

# name -> (workload, dataset kind, args)
RUNS = {
    "image_w0": ("torch_image", "map",
                 ["--num-workers", "0", "--seconds", "3"]),
    "image_w2_fork_crc": ("torch_image", "map",
                          ["--num-workers", "2", "--max-batches", "10", "--checksum",
                           "--seconds", "60"]),
    # 10 batches: into the second epoch, whose new workers are seeded the same way
    "image_w2_spawn_crc": ("torch_image", "map",
                           ["--num-workers", "2", "--start-method", "spawn",
                            "--max-batches", "10", "--checksum", "--seconds", "60"]),
    "iterable_w2_short_epochs": ("torch_iterable", "iterable",
                                 ["--num-workers", "2", "--no-persistent-workers",
                                  "--epoch-samples", "100", "--batch-size", "16",
                                  "--seconds", "3"]),
    # the loop wrapped by Hugging Face Accelerate: its generator starts each epoch's
    # iterator at the first batch, and the WORKERS lines come then
    "pyxform_accelerate_w1": ("torch_pyxform", "map",
                              ["--accelerate", "--num-workers", "1", "--epoch-samples", "64",
                               "--batch-size", "16", "--pyiters", "300", "--seconds", "3"]),
    # stopped by a SIGINT to its process group (as a Ctrl-C would be)
    "pyxform_w2_sigint": ("torch_pyxform", "map",
                          ["--num-workers", "2", "--persistent-workers", "--step-ms", "5",
                           "--seconds", "60"]),
}
PROCS = {}
FILES = {}
RESULTS = {}
TMP = None


def _opt(args, name, default):
    return args[args.index(name) + 1] if name in args else default


def start_all():
    # Output goes to files: nothing to drain while the runs go on.
    for name, (wl, _kind, args) in RUNS.items():
        out, err = (os.path.join(TMP, f"{name}.{x}") for x in ("out", "err"))
        FILES[name] = (out, err)
        with open(out, "w") as o, open(err, "w") as e:
            PROCS[name] = subprocess.Popen(
                [PYTHON, os.path.join(WORKLOADS, wl + ".py"), "--gt-interval", "0.2"] + args,
                stdout=o, stderr=e, cwd=REPO, start_new_session=True)


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def kill_all():
    for p in PROCS.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def result(name):
    if name not in RESULTS:
        p = PROCS[name]
        try:
            p.wait(timeout=max(1, TIMEOUT - (time.time() - T0)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise AssertionError(f"{name}: no exit within {TIMEOUT} s\n"
                                 f"{_read(FILES[name][1])[-2000:]}")
        RESULTS[name] = (p.returncode, _read(FILES[name][0]), _read(FILES[name][1]))
    return RESULTS[name]


def epoch_sizes(kind, samples, batch, workers):
    """Batch sizes of one epoch, in the order the DataLoader yields them."""
    if kind == "map" or workers <= 1:
        shares = [samples]
    else:  # worker k streams samples k, k+n, ...; the loader takes one batch from each in turn
        shares = [len(range(k, samples, workers)) for k in range(workers)]
    per = [[batch] * (s // batch) + ([s % batch] if s % batch else []) for s in shares]
    out = []
    for r in range(max(len(p) for p in per)):
        out.extend(p[r] for p in per if r < len(p))
    return out


def check(name):
    """Common checks; returns the parsed log."""
    wl, kind, args = RUNS[name]
    rc, out, err = result(name)
    assert rc == 0, f"{name}: exit {rc}\n{err[-3000:]}"
    assert "Traceback" not in err, f"{name}: traceback on stderr\n{err[-3000:]}"
    log = groundtruth.parse(out)
    workers = int(_opt(args, "--num-workers", "2"))
    batch = int(_opt(args, "--batch-size", "32"))
    samples = int(_opt(args, "--epoch-samples", "256" if wl == "torch_image" else "1024"))
    r = log.ready
    assert log.pipeline == wl and log.pid == PROCS[name].pid, (name, r)
    assert r["num_workers"] == str(workers) and r["batch_size"] == str(batch), r
    assert r["start_method"] == _opt(args, "--start-method", "fork"), r
    persistent = "--persistent-workers" in args
    assert r["persistent_workers"] == str(int(persistent and workers > 0)), r
    assert log.keys == ("root", "elems", "stall_ns", "epoch"), log.keys
    roots, elems = log.series("root"), log.series("elems")
    stalls, epochs = log.series("stall_ns"), log.series("epoch")
    assert log.samples >= 3, f"{name}: {log.samples} GT lines"
    assert roots[0] == elems[0] == stalls[0] == epochs[0] == 0, out[:500]
    assert roots[1] >= 1 and stalls[1] > 0
    assert log.done_root == roots[-1], (log.done_root, roots[-1])
    seq = epoch_sizes(kind, samples, batch, workers)
    assert sum(seq) == samples
    t0 = log.wall_ns[0]
    for t, n, e, s, ep in zip(log.wall_ns, roots, elems, stalls, epochs):
        full, rem = divmod(n, len(seq))
        assert e == full * samples + sum(seq[:rem]), (name, n, e, seq)
        assert s <= t - t0 + CLOCK_SLACK_NS, (name, "stall over wall", s, t - t0)
        if n:
            assert ep == (n - 1) // len(seq), (name, n, ep, len(seq))
    if workers == 0:
        assert not log.workers, log.workers
    else:
        sets = log.workers
        assert sets, f"{name}: no WORKERS line"
        for w in sets:
            assert len(w["pids"]) == workers and len(set(w["pids"])) == workers, w
            assert log.pid not in w["pids"], w
        if persistent:
            assert len(sets) == 1 and sets[0]["epoch"] == 0, sets
        else:  # one new set per epoch started
            assert [w["epoch"] for w in sets] == list(range(epochs[-1] + 1)), sets
            for a, b in zip(sets, sets[1:]):
                assert not set(a["pids"]) & set(b["pids"]), (a, b)
    return log


def check_io(name, log):
    """torch_image's IO lines: each process that reads the dataset counts its own reads."""
    workers = [p for w in log.workers for p in w["pids"]]
    readers = workers or [log.pid]
    assert log.io, f"{name}: no IO lines"
    assert set(log.io) <= set(readers), (name, sorted(log.io), readers)
    for pid, pts in log.io.items():
        last = pts[-1][1]
        assert last["bytes"] > 0 and last["reads"] >= last["files"] > 0, (name, pid, last)
        if workers:  # a worker's first line comes before its first item
            assert pts[0][1] == {"bytes": 0, "reads": 0, "files": 0}, (name, pid, pts[0])
    # bounds of a pid at an instant: its lines around it
    pid, pts = next(iter(log.io.items()))
    t = (pts[0][0] + pts[-1][0]) // 2
    lo, hi = log.io_bounds(pid, t)
    assert lo <= hi and pts[0][1]["bytes"] <= lo and hi <= pts[-1][1]["bytes"], (lo, hi)


def test_image_no_workers():
    log = check("image_w0")
    assert log.counters["root"][-1] >= 2
    check_io("image_w0", log)


def test_checksum_same_under_fork_and_spawn():
    a = check("image_w2_fork_crc")
    b = check("image_w2_spawn_crc")
    check_io("image_w2_fork_crc", a)
    check_io("image_w2_spawn_crc", b)
    assert a.checksum is not None and a.checksum[1] == 10 and a.done_root == 10, a.checksum
    assert a.checksum == b.checksum, (a.checksum, b.checksum)


def test_iterable_short_epochs():
    log = check("iterable_w2_short_epochs")
    # 100 samples, 2 workers, batch 16: 16,16,16,16,16,16,2,2 per epoch
    assert epoch_sizes("iterable", 100, 16, 2) == [16] * 6 + [2, 2]
    assert log.counters["epoch"][-1] >= 2, "expected several short epochs"


def test_accelerate_short_epochs():
    log = check("pyxform_accelerate_w1")
    assert log.counters["epoch"][-1] >= 2, "expected several short epochs"


def test_sigint_to_process_group():
    name = "pyxform_w2_sigint"
    p = PROCS[name]
    deadline = T0 + TIMEOUT - 10
    while time.time() < deadline and p.poll() is None:  # WORKERS comes before READY
        text = _read(FILES[name][0])
        if "READY" in text:
            break
        time.sleep(0.1)
    assert "READY" in text, text + _read(FILES[name][1])[-2000:]
    pids = groundtruth.parse(text).worker_pids()
    for w in pids:  # fork: the workers are the main process's children, named by PyTorch
        with open(f"/proc/{w}/status") as f:
            status = dict(x.split(":\t", 1) for x in f.read().splitlines() if ":\t" in x)
        assert int(status["PPid"]) == p.pid, (w, status["PPid"], p.pid)
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGINT)
    log = check(name)
    assert log.done_root >= 1
    for w in pids:
        assert not os.path.exists(f"/proc/{w}") or _zombie(w), f"worker {w} left running"


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


TESTS = [test_sigint_to_process_group, test_image_no_workers,
         test_checksum_same_under_fork_and_spawn, test_iterable_short_epochs,
         test_accelerate_short_epochs]


if __name__ == "__main__":
    if not os.path.exists(PYTHON):
        print(f"SKIP: {PYTHON} is absent (scripts/torch.sh installs PyTorch there)")
        sys.exit(0)
    import runner

    T0 = time.time()
    with tempfile.TemporaryDirectory(prefix="torch-workloads-") as TMP:
        start_all()
        try:
            rc = runner.run(TESTS)
        finally:
            kill_all()
    print(f"torch workloads: {time.time() - T0:.1f} s")
    sys.exit(rc)
