#!/usr/bin/env python3
"""Known CPU cost per element, spent on TensorFlow's UDF pool threads.

Dataset.range(1 << 30) -> map(tf.py_function(burn --burn-ms of thread CPU), num_parallel_calls=2)
-> batch(4) -> prefetch(2). No input files.

The map function spins until its own thread has used --burn-ms of CPU time
(time.thread_time_ns, so waiting for the GIL does not count), which makes the
map op's CPU time per element known: --burn-ms plus py_function's own cost
(about 0.4-0.9 ms here: tensor conversion, GIL hand-offs, the Eigen pool's
spinning). As ground truth for the whole of it, GT lines carry
`pool_cpu_ns=`: the CPU time the kernel counted for every thread that ran the
map function (TensorFlow's UDF pool; in this pipeline nothing else runs
there), read by the workload itself from /proc/self/task/TID/schedstat.
`--churn` also starts a short-lived Python thread every 100 ms that burns
10 ms of CPU and exits (threads that come and go during a recording).
"""
import sys
import threading
import time

import common

NAME = "cpu_burn"
BATCHED = True

# Native ids of the threads that ran the map function.
POOL_TIDS = set()


def gt_extra():
    total = 0
    for tid in list(POOL_TIDS):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # thread gone: its CPU no longer counts on either side
    return f" pool_cpu_ns={total}"


def add_args(p):
    p.add_argument("--burn-ms", type=float, default=4.0,
                   help="thread CPU time burnt per element, ms")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--parallel", type=int, default=2, help="num_parallel_calls of the map")
    p.add_argument("--churn", action="store_true",
                   help="start a short-lived CPU-burning thread every 100 ms")


def _spin(ns):
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < ns:
        pass


def _churn():
    while True:
        t = threading.Thread(target=_spin, args=(10_000_000,), daemon=True)
        t.start()
        t.join()
        time.sleep(0.1)


def build(args):
    import numpy as np
    import tensorflow as tf

    if args.churn:
        threading.Thread(target=_churn, daemon=True).start()

    burn_ns = int(args.burn_ms * 1e6)

    def burn(x):
        POOL_TIDS.add(threading.get_native_id())
        t0 = time.thread_time_ns()
        s = int(x.numpy())
        while time.thread_time_ns() - t0 < burn_ns:
            s = (s * 31 + 7) % 1000003
        return np.int64(s)

    def fn(x):
        y = tf.py_function(burn, [x], Tout=tf.int64)
        y.set_shape([])
        return y

    ds = tf.data.Dataset.range(1 << 30)
    ds = ds.map(fn, num_parallel_calls=args.parallel)
    ds = ds.batch(args.batch)
    ds = ds.prefetch(2)
    return ds.with_options(common.options())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
