#!/usr/bin/env python3
"""A real training loop: Keras model.fit on tunable.py's image pipeline, the training step
sharing the cores with the pipeline.

The pipeline is tunable.py's (same flags: --shape, --map-parallel, --prefetch, --cache,
--autotune), mapped to (image, label % 10); the model a small conv net (Conv2D 8x3x3
stride 4 -> global average pooling -> Dense 10), SGD, one epoch of unbounded steps that
a callback stops after --seconds. The callback prints the usual ground truth (READY after
the first step, GT lines, DONE): root = training steps (batches), elems = images.
"""
import os
import signal
import sys
import time

import common
import tunable

NAME = "keras_fit"
BATCHED = True


def add_args(p):
    tunable.add_args(p)


def build(args):
    return tunable.build(args).map(lambda img, label: (img, label % 10))


def model():
    import tensorflow as tf

    m = tf.keras.Sequential([
        tf.keras.Input(shape=(common.IMAGE_SIZE, common.IMAGE_SIZE, 3)),
        tf.keras.layers.Conv2D(8, 3, strides=4, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(10),
    ])
    m.compile(optimizer="sgd",
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def fit(args):
    import tensorflow as tf

    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    emit = common._emit

    class GroundTruth(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = 0
            self.deadline = None
            self.next_gt = 0
            self.interval = max(int(args.gt_interval * 1e9), 1)

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            now = time.time_ns()
            if self.deadline is None:
                self.deadline = now + int(args.seconds * 1e9)
                emit(f"READY pid={os.getpid()} pipeline={NAME}")
                emit(f"GT wall_ns={now} root=1 elems={args.batch}")
                self.next_gt = now + self.interval
            elif now >= self.next_gt:
                emit(f"GT wall_ns={now} root={self.steps} elems={self.steps * args.batch}")
                self.next_gt = max(self.next_gt + self.interval, now)
            if now >= self.deadline or stop["flag"] or (
                    args.max_root and self.steps >= args.max_root):
                self.model.stop_training = True

    gt = GroundTruth()
    model().fit(build(args), epochs=1, steps_per_epoch=10**9, verbose=0, callbacks=[gt])
    emit(f"GT wall_ns={time.time_ns()} root={gt.steps} elems={gt.steps * args.batch}")
    emit(f"DONE root={gt.steps}")
    if args.hold > 0:
        end = time.time() + args.hold
        while not stop["flag"] and time.time() < end:
            time.sleep(0.1)
    return 0


if __name__ == "__main__":
    rc = fit(common.parse_args(sys.modules[__name__]))
    sys.stdout.flush()
    os._exit(rc)
