"""Shared code for the tf.data test workloads.

Every workload module defines

    NAME = "<pipeline name>"          # printed in the READY line
    BATCHED = True/False              # root elements are batches (elems = sum of batch sizes)
    def add_args(parser): ...         # optional: workload-specific options
    def build(args) -> tf.data.Dataset

and ends with `sys.exit(common.main(sys.modules[__name__]))`.

Ground-truth protocol on stdout (one line each, flushed):

    READY pid=<pid> pipeline=<name>                 once, after the first root element
    GT wall_ns=<time.time_ns()> root=<n> elems=<m>  right after READY (first root=0 elems=0 at the
                                                    iterator's creation), then every --gt-interval s
    DONE root=<n>                                   last line, after a final GT line

root is the number of elements the Python loop took from the iterator (cumulative);
elems is the number of dataset elements before batching (the sum of the leading
dimension of every root element for batched pipelines, = root otherwise).
wall_ns is taken right after the element counted in root was returned.
--seconds counts from READY. SIGTERM/SIGINT end the loop early (still DONE, exit 0).
"""

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_DATA = os.path.join(REPO, "tests", "data")

IMAGE_SIZE = 224

if HERE not in sys.path:
    sys.path.insert(0, HERE)


def make_parser(module):
    name = getattr(module, "NAME", "workload")
    doc = (getattr(module, "__doc__", None) or name).strip().splitlines()[0]
    p = argparse.ArgumentParser(prog=f"{name}.py", description=doc)
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="directory with train-*-of-*.tfrecord shards; generated there if none "
                        "(default: %(default)s)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="how long to consume after READY (default: %(default)s)")
    p.add_argument("--gt-interval", type=float, default=0.1,
                   help="seconds between GT lines (default: %(default)s)")
    p.add_argument("--hold", type=float, default=0.0,
                   help="after DONE, keep the process (and its iterator) alive this many seconds")
    p.add_argument("--max-root", type=int, default=0,
                   help="stop after this many root elements (0: no limit)")
    p.add_argument("--checksum", action="store_true",
                   help="print `CHECKSUM crc=<hex> root=<n>` before DONE: a CRC32 of every "
                        "consumed element's bytes in order (tools must not change it)")
    p.add_argument("--fork-workers", type=int, default=0,
                   help="with --checksum, compute the CRCs in a multiprocessing pool of this "
                        "many forked workers (tools must leave forked children alone)")
    p.add_argument("--no-autotune", action="store_true",
                   help="options.autotune.enabled = False: TensorFlow builds no autotune model")
    add = getattr(module, "add_args", None)
    if add is not None:
        add(p)
    return p


def parse_args(module, argv=None):
    return make_parser(module).parse_args(argv)


def options(inject_prefetch=True):
    """Default tf.data options (autotune on) with two graph rewrites turned off.

    * map_and_batch_fusion: otherwise map+batch become one MapAndBatch node.
    * map_parallelization: otherwise TF 2.21 rewrites every stateless map written
      without num_parallel_calls into ParallelMapV2 (autotuned), so no workload
      would have a sequential `Map` node.
    inject_prefetch stays at TF's default (on: a Prefetch(AUTOTUNE) is added on top
    of pipelines that do not end with one) unless inject_prefetch=False (demo.py).
    """
    import tensorflow as tf

    opts = tf.data.Options()
    opts.experimental_optimization.map_and_batch_fusion = False
    opts.experimental_optimization.map_parallelization = False
    if not inject_prefetch:
        opts.experimental_optimization.inject_prefetch = False
    return opts


def data_files(args):
    """Shard list under args.data, generating the default data set if there is none."""
    import gen_data

    files = gen_data.shard_files(args.data)
    if not files:
        files = gen_data.generate(args.data, files=4, records=128)
    if not files:
        raise SystemExit(f"no shards in {args.data}")
    return files


FEATURES = None


def parse_example(serialized):
    """tf.train.Example -> (JPEG bytes, label)."""
    import tensorflow as tf

    global FEATURES
    if FEATURES is None:
        FEATURES = {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }
    ex = tf.io.parse_single_example(serialized, FEATURES)
    return ex["image/encoded"], ex["label"]


def parse_image(serialized):
    """parse_single_example + decode_jpeg + resize 224 + cast/normalize."""
    import tensorflow as tf

    jpeg, label = parse_example(serialized)
    img = tf.io.decode_jpeg(jpeg, channels=3)
    img = tf.image.resize(img, [IMAGE_SIZE, IMAGE_SIZE])  # float32, bilinear
    img = tf.cast(img, tf.float32) / 127.5 - 1.0
    return img, label


def _emit(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _element_crc(blobs):
    import zlib

    crc = 0
    for b in blobs:
        crc = zlib.crc32(b, crc)
    return crc


class _Checksum:
    """CRC32 over the consumed elements, in order (optionally in forked workers)."""

    def __init__(self, workers):
        self.crc = 0
        self.pool = None
        if workers > 0:
            import multiprocessing

            self.pool = multiprocessing.get_context("fork").Pool(workers)
        self.pending = []

    def add(self, element):
        import tensorflow as tf

        blobs = [t.numpy().tobytes() for t in tf.nest.flatten(element)]
        if self.pool is None:
            self.pending.append(_element_crc(blobs))
        else:
            self.pending.append(self.pool.apply_async(_element_crc, (blobs,)))

    def result(self):
        import zlib

        for p in self.pending:
            v = p if isinstance(p, int) else p.get(timeout=120)
            self.crc = zlib.crc32(v.to_bytes(4, "little"), self.crc)
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
        return self.crc


def _leading_dim(element):
    import tensorflow as tf

    first = tf.nest.flatten(element)[0]
    return int(first.shape[0])


def run(module, args):
    name = module.NAME
    batched = getattr(module, "BATCHED", True)
    ds = module.build(args)
    if getattr(args, "no_autotune", False):
        import tensorflow as tf

        opts = tf.data.Options()
        opts.autotune.enabled = False
        ds = ds.with_options(opts)

    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    # Optional workload-specific ground truth appended to GT lines
    # (" key=value ..."), e.g. cpu_burn's pool thread CPU.
    gt_extra = getattr(module, "gt_extra", lambda: "")
    # Nothing is consumed before the iterator exists: the first GT line
    # says so, for tools whose window opens before the first element
    # (`plumber-probe run` finds the pipeline as the iterator is built).
    built, built_extra = time.time_ns(), gt_extra()
    it = iter(ds)
    count = _leading_dim if batched else (lambda _x: 1)

    x = next(it)
    root = 1
    elems = count(x)
    checksum = _Checksum(args.fork_workers) if args.checksum else None
    if checksum is not None:
        checksum.add(x)
    now = time.time_ns()
    interval = max(int(args.gt_interval * 1e9), 1)
    deadline = now + int(args.seconds * 1e9)
    _emit(f"READY pid={os.getpid()} pipeline={name}")
    _emit(f"GT wall_ns={built} root=0 elems=0{built_extra}")
    _emit(f"GT wall_ns={now} root={root} elems={elems}{gt_extra()}")
    last = (root, now)
    next_gt = now + interval

    while now < deadline and not stop["flag"]:
        if args.max_root and root >= args.max_root:
            break
        try:
            x = next(it)
        except StopIteration:
            break
        root += 1
        elems += count(x)
        if checksum is not None:
            checksum.add(x)
        now = time.time_ns()
        if now >= next_gt:
            _emit(f"GT wall_ns={now} root={root} elems={elems}{gt_extra()}")
            last = (root, now)
            next_gt += interval
            if next_gt <= now:  # fell behind (stall): restart the grid
                next_gt = now + interval
    if last[0] != root:
        _emit(f"GT wall_ns={now} root={root} elems={elems}{gt_extra()}")
    if checksum is not None:
        _emit(f"CHECKSUM crc={checksum.result():08x} root={root}")
    _emit(f"DONE root={root}")

    if args.hold > 0:
        end = time.time() + args.hold
        while not stop["flag"] and time.time() < end:
            time.sleep(min(0.1, max(0.0, end - time.time())))
    return 0


def main(module, argv=None):
    args = parse_args(module, argv)
    rc = run(module, args)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: tf.data background threads (py_function in
    # particular) can make a normal exit slow or hang.
    os._exit(rc)
