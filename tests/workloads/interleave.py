#!/usr/bin/env python3
"""Parallel interleave with a fixed parallelism over TFRecord files, then a sequential map.

from_tensor_slices(files).interleave(TFRecordDataset, cycle_length=2, num_parallel_calls=2,
deterministic=True) -> repeat() -> map(parse_single_example + decode_jpeg) -> batch(8) -> prefetch(2).
"""
import sys

import common

NAME = "interleave"
BATCHED = True


def add_args(p):
    p.add_argument("--batch", type=int, default=8)


def parse(serialized):
    import tensorflow as tf

    jpeg, label = common.parse_example(serialized)
    return tf.io.decode_jpeg(jpeg, channels=3), label


def build(args):
    import tensorflow as tf

    files = common.data_files(args)
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2,
                       deterministic=True)
    ds = ds.repeat()
    ds = ds.map(parse)
    ds = ds.batch(args.batch)
    ds = ds.prefetch(2)
    return ds.with_options(common.options())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
