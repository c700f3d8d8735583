#!/usr/bin/env python3
"""Write synthetic, deterministic JPEG TFRecord shards for the workloads.

    .venv/bin/python tests/workloads/gen_data.py --out DIR --files 4 --records 128

Each shard DIR/train-0000K-of-0000N.tfrecord holds `records` tf.train.Example
records with features `image/encoded` (bytes, a noisy JPEG of --size x --size
pixels, RGB) and `label` (int64). Pixels come from numpy's PCG64 generator
seeded with --seed, so the same arguments give the same bytes (given the same
libjpeg inside TensorFlow). Shards are written to a temporary name and renamed,
and a lock file serialises concurrent generators on the same directory.
"""

import argparse
import fcntl
import glob
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SHARD_GLOB = "train-*-of-*.tfrecord"


def shard_files(data_dir):
    """Sorted list of existing shards in data_dir (empty if none)."""
    return sorted(glob.glob(os.path.join(data_dir, SHARD_GLOB)))


def _image(rng, size):
    import numpy as np

    # Smooth colour gradient + a few rectangles + per-pixel noise: real JPEG
    # work for the decoder, files of moderate size (~30-40 KB at 256x256).
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.empty((size, size, 3), np.float32)
    phase = rng.uniform(0, 2 * np.pi, 3)
    for c in range(3):
        base[..., c] = 128 + 90 * np.sin(2 * np.pi * (x * (c + 1) + y * (3 - c)) + phase[c])
    for _ in range(4):
        x0, y0 = rng.integers(0, size - 16, 2)
        w, h = rng.integers(8, size // 3, 2)
        base[y0:y0 + h, x0:x0 + w, :] = rng.uniform(0, 255, 3)
    base += rng.normal(0, 24, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def generate(out, files=4, records=128, size=256, seed=1234, quality=90, quiet=False):
    """Generate the shards unless they already exist. Returns the shard list."""
    os.makedirs(out, exist_ok=True)
    lock_path = os.path.join(out, ".gen_data.lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        existing = shard_files(out)
        if existing:
            if not quiet:
                print(f"gen_data: {len(existing)} shards already in {out}", file=sys.stderr)
            return existing

        import numpy as np
        import tensorflow as tf

        t0 = time.time()
        total = 0
        for f in range(files):
            name = os.path.join(out, f"train-{f:05d}-of-{files:05d}.tfrecord")
            tmp = name + ".tmp"
            with tf.io.TFRecordWriter(tmp) as w:
                for r in range(records):
                    idx = f * records + r
                    rng = np.random.default_rng([seed, idx])
                    jpeg = tf.io.encode_jpeg(_image(rng, size), quality=quality).numpy()
                    ex = tf.train.Example(features=tf.train.Features(feature={
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[idx % 10])),
                    }))
                    w.write(ex.SerializeToString(deterministic=True))
            os.replace(tmp, name)
            total += os.path.getsize(name)
        if not quiet:
            print(f"gen_data: wrote {files} shards x {records} records ({total} bytes, "
                  f"{size}x{size} JPEG) to {out} in {time.time() - t0:.1f} s", file=sys.stderr)
        return shard_files(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--records", type=int, default=128)
    p.add_argument("--size", type=int, default=256, help="image side in pixels")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--quality", type=int, default=90)
    a = p.parse_args(argv)
    for name in generate(a.out, a.files, a.records, a.size, a.seed, a.quality):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
