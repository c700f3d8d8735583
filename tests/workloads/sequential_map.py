#!/usr/bin/env python3
"""Synthetic CPU-bound sequential map (no num_parallel_calls).

Dataset.range(4096).repeat() -> map(stateless random matrix, a few matmul+tanh rounds,
no num_parallel_calls) -> batch(32) -> prefetch(1). No input files.
"""
import sys

import common

NAME = "sequential_map"
BATCHED = True


def add_args(p):
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--matrix", type=int, default=128, help="matrix side of the map's work")
    p.add_argument("--rounds", type=int, default=4, help="matmul rounds per element")


def build(args):
    import tensorflow as tf

    n = args.matrix
    rounds = args.rounds

    def work(x):
        m = tf.random.stateless_uniform([n, n], seed=tf.stack([x, tf.constant(7, tf.int64)]))
        for _ in range(rounds):
            m = tf.tanh(tf.matmul(m, m) / float(n))
        return tf.reduce_sum(m, axis=0), x

    ds = tf.data.Dataset.range(4096).repeat()
    ds = ds.map(work)
    ds = ds.batch(args.batch)
    ds = ds.prefetch(1)
    return ds.with_options(common.options())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
