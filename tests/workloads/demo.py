#!/usr/bin/env python3
"""README demo: tfrecord_image deliberately mis-configured (map with num_parallel_calls=1, no prefetch).

TFRecordDataset(files).repeat() -> map(parse/decode/resize/normalize, num_parallel_calls=1)
-> batch(16), with TF's inject_prefetch rewrite turned off (it would otherwise add a
Prefetch on top). The map runs on one thread on a multi-core machine and nothing overlaps the
consumer with the producer, so the map is the bottleneck to find.
"""
import sys

import common
import tfrecord_image

NAME = "demo"
BATCHED = True


def add_args(p):
    p.add_argument("--batch", type=int, default=16)


def build(args):
    files = common.data_files(args)
    ds = tfrecord_image.image_pipeline(files, args.batch, 1, None)
    # TF would otherwise inject a Prefetch(AUTOTUNE) on top and hide the mistake.
    return ds.with_options(common.options(inject_prefetch=False))


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
