#!/usr/bin/env python3
"""Variable-length sequences, padded_batch(8), repeat() on top.

Dataset.range(1000) -> map(x -> tf.range(x % 17 + 1)) -> padded_batch(8) -> repeat().
One epoch is 125 batches, so the Range/Map/PaddedBatch iterators are re-created very often.
No input files.
"""
import sys

import common

NAME = "padded_batch"
BATCHED = True


def add_args(p):
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--range", type=int, default=1000, help="elements per epoch")


def build(args):
    import tensorflow as tf

    ds = tf.data.Dataset.range(args.range)
    ds = ds.map(lambda x: tf.range(x % 17 + 1))
    ds = ds.padded_batch(args.batch)
    ds = ds.repeat()
    return ds.with_options(common.options())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
