#!/usr/bin/env python3
"""GIL-bound map: tf.py_function with a pure-Python loop, num_parallel_calls=2.

Dataset.range(1024) -> map(tf.py_function(loop of --pyiters iterations), num_parallel_calls=2)
-> batch(8) -> prefetch(1) -> repeat(). No input files.
"""
import sys

import common

NAME = "py_function"
BATCHED = True


def add_args(p):
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--pyiters", type=int, default=2000,
                   help="pure-Python loop iterations per element")


def build(args):
    import numpy as np
    import tensorflow as tf

    iters = args.pyiters

    def py_loop(x):
        s = int(x.numpy())
        for i in range(iters):
            s = (s * 31 + i) % 1000003
        return np.float32(s)

    def fn(x):
        y = tf.py_function(py_loop, [x], Tout=tf.float32)
        y.set_shape([])
        return y

    ds = tf.data.Dataset.range(1024)
    ds = ds.map(fn, num_parallel_calls=2)
    ds = ds.batch(args.batch)
    ds = ds.prefetch(1)
    ds = ds.repeat()
    return ds.with_options(common.options())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
