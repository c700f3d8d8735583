#!/usr/bin/env python3
"""Lock contention inside a map function: every call inserts --keys entries
into one shared tf.lookup MutableHashTable, whose kernel holds the table's
mutex (an absl::Mutex) for the whole insert; with num_parallel_calls=2 the
two UDF threads queue on it.

Dataset.range(1 << 30) -> map(insert into the shared table, num_parallel_calls=2)
-> batch(4) -> prefetch(2). No input files.
"""
import sys

import common

NAME = "contention"
BATCHED = True


def add_args(p):
    p.add_argument("--keys", type=int, default=200000,
                   help="entries inserted per element (lock hold time)")


def build(args):
    import tensorflow as tf

    table = tf.lookup.experimental.MutableHashTable(
        key_dtype=tf.int64, value_dtype=tf.int64, default_value=-1)
    n = args.keys

    def fn(x):
        keys = tf.range(n, dtype=tf.int64) + (x % 4) * n
        table.insert(keys, keys)
        return x

    ds = tf.data.Dataset.range(1 << 30)
    ds = ds.map(fn, num_parallel_calls=2)
    ds = ds.batch(4)
    ds = ds.prefetch(2)
    return ds.with_options(common.options())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
