#!/usr/bin/env python3
"""PyTorch pipeline with a CPU-heavy pure-Python transform (holds the GIL of its process).

A map-style dataset whose __getitem__(i) runs --pyiters (5000) iterations of a Python
integer recurrence seeded by i, filling a 64-float vector -> (float32[64], label).
With num_workers=0 that loop runs in the training process and holds its GIL; with workers
each worker process holds its own.

--gil-threads N starts N threads in the training process that run Python without end (as
a busy metrics or logging thread would): without workers the transform then waits for the
GIL. The GT lines carry item_wall_ns= and item_cpu_ns=, the wall and thread CPU time the
training process spent in __getitem__ (0 with workers): a pure-Python transform that does
no I/O spends the difference waiting for the GIL.

--shared-lock MS makes each __getitem__ hold a multiprocessing.Lock that every worker shares
for MS ms (a sleep: a read through a handle the workers share, as an HDF5 file or a database
connection behind a lock), after its Python loop: the workers serialise on it. The GT lines
then carry lock_wait_ns= and lock_item_ns=, all workers' time waiting to acquire it and their
wall time in __getitem__, summed in shared memory.

--item-sleep MS makes each __getitem__ sleep MS ms after its Python loop, holding nothing (a
read from network storage: an object store, a remote file system): the workers wait off their
cores, and more of them overlap more waits.

--item-cpu sums every worker's thread CPU time in __getitem__ in shared memory: the GT lines
carry it as workers_item_cpu_ns.
"""

import multiprocessing
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch_common  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

NAME = "torch_pyxform"
EPOCH_SAMPLES = 1024


# __getitem__'s wall and thread CPU time in this process, ns.
ITEM = {"wall": 0, "cpu": 0}
# --shared-lock: the lock, and the workers' wait for it and time in __getitem__ (ns, shared).
SHARED = {}
# --item-cpu: the workers' thread CPU time in __getitem__ (ns, shared).
ITEM_CPU = {}


def add_args(p):
    p.add_argument("--pyiters", type=int, default=5000,
                   help="Python loop iterations per sample (default %(default)s)")
    p.add_argument("--gil-threads", type=int, default=0,
                   help="threads in the training process that run Python without end")
    p.add_argument("--shared-lock", type=float, default=0.0, metavar="MS",
                   help="ms each item holds a lock all workers share (default: none)")
    p.add_argument("--item-sleep", type=float, default=0.0, metavar="MS",
                   help="ms each item sleeps, holding nothing (default: none)")
    p.add_argument("--item-cpu", action="store_true",
                   help="sum the workers' CPU time in __getitem__ (GT workers_item_cpu_ns)")


def gt_fields():
    out = f"item_wall_ns={ITEM['wall']} item_cpu_ns={ITEM['cpu']}"
    if SHARED:
        out += f" lock_wait_ns={SHARED['wait'].value} lock_item_ns={SHARED['item'].value}"
    if ITEM_CPU:
        out += f" workers_item_cpu_ns={ITEM_CPU['cpu'].value}"
    return out


def _add(v, ns):
    with v.get_lock():
        v.value += ns


def _spin():
    x = 1
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def py_loop(i, iters, seed):
    x = (i * 2654435761 + seed) & 0x7FFFFFFF
    out = [0.0] * 64
    for k in range(iters):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out[k & 63] += (x >> 8) / 8388608.0
    return out


class PyTransform(Dataset):
    def __init__(self, length, iters, seed, sleep_ms=0.0):
        self.length, self.iters, self.seed = length, iters, seed
        self.sleep_s = sleep_ms / 1000.0

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        import torch

        w, c = time.perf_counter_ns(), time.thread_time_ns()
        out = torch.tensor(py_loop(i, self.iters, self.seed), dtype=torch.float32), i % 10
        if SHARED:
            self._locked_read()
        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        ITEM["wall"] += time.perf_counter_ns() - w
        ITEM["cpu"] += time.thread_time_ns() - c
        if ITEM_CPU and torch.utils.data.get_worker_info() is not None:
            _add(ITEM_CPU["cpu"], time.thread_time_ns() - c)
        if SHARED:
            _add(SHARED["item"], time.perf_counter_ns() - w)
        return out

    def _locked_read(self):
        t = time.perf_counter_ns()
        with SHARED["lock"]:
            _add(SHARED["wait"], time.perf_counter_ns() - t)
            time.sleep(SHARED["ms"] / 1000.0)


def build(args):
    if args.shared_lock > 0:
        # Made before the DataLoader: forked workers inherit them.
        SHARED.update(lock=multiprocessing.Lock(), ms=args.shared_lock,
                      wait=multiprocessing.Value("q", 0), item=multiprocessing.Value("q", 0))
    if args.item_cpu:
        ITEM_CPU["cpu"] = multiprocessing.Value("q", 0)
    for _ in range(args.gil_threads):
        threading.Thread(target=_spin, daemon=True).start()
    return PyTransform(args.epoch_samples, args.pyiters, args.seed, args.item_sleep)


if __name__ == "__main__":
    sys.exit(torch_common.main(sys.modules[__name__]))
