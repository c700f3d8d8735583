#!/usr/bin/env python3
"""Main workload: TFRecord JPEG images -> parallel parse/decode/resize map -> batch(16) -> prefetch.

TFRecordDataset(files).repeat() -> map(parse_single_example + decode_jpeg + resize 224 +
cast/normalize, num_parallel_calls=AUTOTUNE) -> batch(16) -> prefetch(AUTOTUNE).
"""
import sys

import common

NAME = "tfrecord_image"
BATCHED = True


def add_args(p):
    p.add_argument("--batch", type=int, default=16)


def image_pipeline(files, batch, num_parallel_calls, prefetch):
    """Shared with demo.py. num_parallel_calls/prefetch: int, "autotune" or None."""
    import tensorflow as tf

    def n(v):
        return tf.data.AUTOTUNE if v == "autotune" else v

    ds = tf.data.TFRecordDataset(files).repeat()
    ds = ds.map(common.parse_image, num_parallel_calls=n(num_parallel_calls))
    ds = ds.batch(batch)
    if prefetch is not None:
        ds = ds.prefetch(n(prefetch))
    return ds


def build(args):
    files = common.data_files(args)
    ds = image_pipeline(files, args.batch, "autotune", "autotune")
    return ds.with_options(common.options())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
