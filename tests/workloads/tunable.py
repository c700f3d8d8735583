#!/usr/bin/env python3
"""The image pipeline with every knob a recommendation names as a flag (bench/validate.py).

--shape image:     TFRecordDataset(files).repeat() -> map(parse/decode/resize) -> batch(16)
--shape cacheable: TFRecordDataset(files) -> map(parse/decode/resize) -> batch(16) -> repeat()
                   (one pass of the data set fits in memory: a cache below the repeat saves
                   the decode from the second epoch on)
then [.prefetch(--prefetch)]. --map-parallel N|autotune (default 1: sequential on one
thread), --prefetch N|autotune|none (default none), --cache none|reader|map|batch (insert
.cache() right after that op), --autotune (every knob tf.data.AUTOTUNE). TF's
inject_prefetch rewrite is off, so "no prefetch" means none.
"""
import sys

import common

NAME = "tunable"
BATCHED = True


def knob(v):
    return v if v in ("autotune", "none") else int(v)


def add_args(p):
    p.add_argument("--shape", choices=("image", "cacheable"), default="image")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--map-parallel", type=knob, default=1)
    p.add_argument("--prefetch", type=knob, default="none")
    p.add_argument("--cache", choices=("none", "reader", "map", "batch"), default="none")
    p.add_argument("--autotune", action="store_true",
                   help="num_parallel_calls and prefetch set to tf.data.AUTOTUNE")


def build(args):
    import tensorflow as tf

    def n(v):
        return tf.data.AUTOTUNE if v == "autotune" else v

    if args.autotune:
        args.map_parallel, args.prefetch = "autotune", "autotune"
    files = common.data_files(args)
    ds = tf.data.TFRecordDataset(files)
    if args.cache == "reader":
        ds = ds.cache()
    if args.shape == "image":
        ds = ds.repeat()
    ds = ds.map(common.parse_image, num_parallel_calls=n(args.map_parallel))
    if args.cache == "map":
        ds = ds.cache()
    ds = ds.batch(args.batch)
    if args.cache == "batch":
        ds = ds.cache()
    if args.shape == "cacheable":
        ds = ds.repeat()
    if args.prefetch != "none":
        ds = ds.prefetch(n(args.prefetch))
    return ds.with_options(common.options(inject_prefetch=False))


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
