"""Shared code for the PyTorch DataLoader test workloads (torch_*.py).

Every workload module defines

    NAME = "<pipeline name>"          # printed in the READY line
    EPOCH_SAMPLES = <int>             # default --epoch-samples (dataset length)
    def add_args(parser): ...         # optional: workload-specific options
    def build(args) -> torch.utils.data.Dataset   (map-style or IterableDataset)
    def gt_fields() -> str            # optional: more key=value counters for every GT line

and ends with `if __name__ == "__main__": sys.exit(torch_common.main(sys.modules[__name__]))`
(the guard matters: spawn/forkserver workers import the script again as __mp_main__).
Dataset classes live at module level so that spawn and forkserver can pickle them.

Ground-truth protocol on stdout (one line each, flushed), parsed by groundtruth.py:

    READY pid=<pid> pipeline=<name> num_workers=<n> batch_size=<b> start_method=<m>
          persistent_workers=<0|1> prefetch_factor=<p|none>     once, after the first batch
    GT wall_ns=<time.time_ns()> root=<batches> elems=<samples> stall_ns=<ns> epoch=<k>
          right after READY (the first: root=0 at the loader's first iter()), then every --gt-interval
    WORKERS pids=<p1,p2,..> epoch=<k> wall_ns=<ns>              each time a new set of worker
          processes has started (once with persistent workers, every epoch without)
    IO pid=<pid> wall_ns=<ns> bytes=<n> reads=<n> files=<n>     from each process that reads the
          dataset's files (a worker, or the training process without workers), if the dataset
          opens them with open_counted (torch_image does): once when a worker starts, then after
          every item it got
    CHECKSUM crc=<hex> root=<n>                                 with --checksum
    VAL epoch=<k> wall_ns=<ns>                                  with --val-samples, as each
          validation pass starts (after a GT line; another follows it); GT lines add
          val_root=<batches> val_ns=<ns>: the passes' batches and time, in neither root nor
          stall_ns
    DONE root=<n>                                               last line

root counts batches the loop took from the DataLoader, elems the samples in them (the sum of
every batch's leading dimension: exact for partial batches). stall_ns is the cumulative time
the training loop spent inside the DataLoader's iter() and next() calls (the data stall: with
num_workers=0 all the loading, with workers the waiting for a batch, plus the iter() at each
epoch start, which starts or resets the workers). epoch is the 0-based epoch of the last batch.
With --stall-detail GT lines add stall_cpu_ns, the loop thread's CPU time in those calls, and
stall_runq_ns, the time it waited there for a CPU (run_delay, /proc/thread-self/schedstat):
without workers a loader that reads no file spends the rest waiting for the GIL.
The simulated training step (--step-ms) runs outside those calls.

IO lines count, in the process that prints them and since it started, what the read() syscalls
on the dataset's files returned: bytes (their sum) and reads (those that returned data), through
a raw file whose every readinto is one read() (CountingRaw), and files, the distinct files
opened. A line is printed after the reads it counts, so at any instant the process's true count
lies between its last line before and its first line after; a worker prints a line of zeros
before its first item. Nothing else the process reads (imports, the MANIFEST) is counted.

SIGINT/SIGTERM end the loop (DONE, exit 0). Worker processes ignore both (the main process
shuts them down), and die with SIGKILL when their parent dies (PR_SET_PDEATHSIG), so a killed
main leaves no workers behind.
"""

import argparse
import io
import os
import signal
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_DATA = os.path.join(REPO, "tests", "data", "torch_images")

if HERE not in sys.path:
    sys.path.insert(0, HERE)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _quiet_stop_signals():
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


# A spawn worker (and the forkserver, whose forked workers inherit its
# handlers) imports the workload script again as __mp_main__, torch and all,
# seconds before worker_init runs: a Ctrl-C then would be a KeyboardInterrupt
# traceback from the import. Ignore the stop signals from here on
# (multiprocessing marks the process `_inheriting` while it re-imports).
def _reimported_by_multiprocessing():
    from multiprocessing import process

    return bool(getattr(process.current_process(), "_inheriting", False))


if _reimported_by_multiprocessing():
    _quiet_stop_signals()


def make_parser(module):
    name = getattr(module, "NAME", "torch_workload")
    doc = (getattr(module, "__doc__", None) or name).strip().splitlines()[0]
    p = argparse.ArgumentParser(prog=f"{name}.py", description=doc)
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="image directory (class subfolders of JPEGs); generated there if "
                        "incomplete (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="how long to consume after READY (default: %(default)s)")
    p.add_argument("--gt-interval", type=float, default=0.1,
                   help="seconds between GT lines (default: %(default)s)")
    p.add_argument("--hold", type=float, default=0.0,
                   help="after DONE, keep the process (and its workers) alive this many seconds")
    p.add_argument("--max-batches", type=int, default=0,
                   help="stop after this many batches (0: no limit)")
    p.add_argument("--checksum", action="store_true",
                   help="print `CHECKSUM crc=<hex> root=<n>` before DONE: CRC32 over every "
                        "consumed batch's tensor bytes, in order")
    p.add_argument("--seed", type=int, default=1234, help="torch/sampler seed")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prefetch-factor", type=int, default=None,
                   help="DataLoader prefetch_factor (only with workers; PyTorch's default 2)")
    p.add_argument("--pin-memory", action="store_true",
                   help="DataLoader pin_memory=True (a no-op with a warning without an accelerator)")
    p.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction, default=False,
                   help="keep the worker processes across epochs (only with workers)")
    p.add_argument("--sharing-strategy", choices=("file_descriptor", "file_system"), default=None,
                   help="torch.multiprocessing.set_sharing_strategy before the loader is made "
                        "(default: torch's, file_descriptor on Linux)")
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), default="fork",
                   help="multiprocessing context of the workers (default: %(default)s)")
    p.add_argument("--epoch-samples", type=int, default=getattr(module, "EPOCH_SAMPLES", 256),
                   help="dataset length: samples per epoch (default: %(default)s)")
    p.add_argument("--stall-detail", action="store_true",
                   help="GT lines add the loop's CPU time and run-queue wait inside the loader's "
                        "calls (stall_cpu_ns, stall_runq_ns)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step: this many ms of CPU work (torch matmuls, "
                        "calibrated at start) in the training process after every batch")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads in the training process (default %(default)s; "
                        "0: PyTorch's default, one per core). With more than one, its ops "
                        "(the step, and the transforms when num_workers=0) spin in OpenMP "
                        "barriers while workers hold the cores: on 2 busy cores torch_image at "
                        "num_workers=0 ran at 0.6 instead of ~10 batches/s")
    p.add_argument("--val-samples", type=int, default=0,
                   help="after each epoch, a validation pass over a second DataLoader (a new "
                        "dataset of this many samples, the same workers, not persistent) in a "
                        "`for` loop; its batches and time are not the GT's (val_root=, val_ns=)")
    p.add_argument("--new-loader", action="store_true",
                   help="after each epoch, a new dataset and a new DataLoader over it (the old "
                        "ones dropped), as a script that builds its loader in the epoch loop")
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True,
                   help="--no-shuffle: the training loader keeps its order too, so that only "
                        "the names it is bound to tell it from the validation loader")
    p.add_argument("--two-deep", action="store_true",
                   help="hold both loaders two attributes deep from the loop's locals only "
                        "(holder.data.train_loader, holder.data.val_loader), as a trainer's method "
                        "reaches them through self.data")
    p.add_argument("--loops", action="store_true",
                   help="take the training batches in a method of a TrainingEpochLoop and run "
                        "validation in EvaluationLoop.run, whose locals hold the loaders only as "
                        "fetcher._combined_loader._iterables (as Lightning's loops hold a "
                        "DataModule's): no name says which loader is which")
    p.add_argument("--accelerate", action="store_true",
                   help="wrap the training loader with Hugging Face Accelerate "
                        "(Accelerator(cpu=True).prepare, as transformers' Trainer does): the "
                        "loop iterates DataLoaderShard.__iter__, a generator that holds the "
                        "DataLoader's iterator and takes each batch one ahead")
    p.add_argument("--loader-class", choices=("DataLoader", "derived"), default="DataLoader",
                   help="derived: the training loader is of a class of the job's own, derived "
                        "from a mixin and then DataLoader (a validation loader stays torch's)")
    add = getattr(module, "add_args", None)
    if add is not None:
        add(p)
    return p


def parse_args(module, argv=None):
    a = make_parser(module).parse_args(argv)
    if a.epoch_samples <= 0:
        raise SystemExit("--epoch-samples must be positive")
    if a.val_samples and a.stall_detail:
        raise SystemExit("--stall-detail does not leave out --val-samples' passes")
    if a.new_loader and a.stall_detail:
        raise SystemExit("--stall-detail does not leave out --new-loader's builds")
    if a.loops and (a.new_loader or a.two_deep or not a.val_samples):
        raise SystemExit("--loops takes --val-samples, without --new-loader or --two-deep")
    if a.accelerate and (a.loops or a.two_deep or a.new_loader or a.val_samples):
        raise SystemExit("--accelerate wraps the one training loader: without --loops, "
                         "--two-deep, --new-loader or --val-samples")
    if a.batch_size <= 0 or a.num_workers < 0:
        raise SystemExit("--batch-size must be positive and --num-workers non-negative")
    return a


# ---------------------------------------------------------------- data

def image_files(data_dir):
    """Sorted JPEG paths of a complete generated set (empty if incomplete)."""
    manifest = os.path.join(data_dir, "MANIFEST")
    if not os.path.exists(manifest):
        return []
    with open(manifest) as f:
        files = [os.path.join(data_dir, line.strip()) for line in f if line.strip()]
    return files if all(os.path.exists(p) for p in files) else []


def generate_images(data_dir, count=256, size=256, classes=4, seed=1234, quality=90):
    """Write `count` JPEGs into DATA/class_K/img_NNNN.jpg unless a complete set is there.

    Pixels are gen_data's (numpy PCG64 seeded with (seed, index)); files are written to a
    temporary name and renamed, the MANIFEST last, under a lock file, so concurrent
    generators do not collide and a half-written set is regenerated.
    """
    import fcntl

    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, ".gen.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        files = image_files(data_dir)
        if files:
            return files
        import numpy as np
        from PIL import Image

        from gen_data import _image

        t0 = time.time()
        names = []
        for i in range(count):
            rel = os.path.join(f"class_{i % classes}", f"img_{i:04d}.jpg")
            path = os.path.join(data_dir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            rng = np.random.default_rng([seed, i])
            tmp = path + ".tmp"
            Image.fromarray(_image(rng, size)).save(tmp, "JPEG", quality=quality)
            os.replace(tmp, path)
            names.append(rel)
        tmp = os.path.join(data_dir, "MANIFEST.tmp")
        with open(tmp, "w") as f:
            f.write("".join(n + "\n" for n in names))
        os.replace(tmp, os.path.join(data_dir, "MANIFEST"))
        print(f"torch_common: wrote {count} {size}x{size} JPEGs to {data_dir} in "
              f"{time.time() - t0:.1f} s", file=sys.stderr)
        return image_files(data_dir)


# ---------------------------------------------------------------- file reads (ground truth)

_IO = {"pid": None, "bytes": 0, "reads": 0, "files": set()}


def _io_counts():
    """This process's counts (a forked process starts from zero)."""
    if _IO["pid"] != os.getpid():
        _IO.update(pid=os.getpid(), bytes=0, reads=0, files=set())
    return _IO


class CountingRaw(io.RawIOBase):
    """A file opened for reading whose reads are counted: each readinto is one read() syscall
    (FileIO's), and what it returned is added to this process's counts."""

    def __init__(self, path):
        super().__init__()
        self._f = io.FileIO(path, "rb")
        _io_counts()["files"].add(os.path.abspath(path))

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        n = self._f.readinto(b)
        if n:
            c = _io_counts()
            c["bytes"] += n
            c["reads"] += 1
        return n

    def seek(self, pos, whence=io.SEEK_SET):
        return self._f.seek(pos, whence)

    def tell(self):
        return self._f.tell()

    def fileno(self):
        return self._f.fileno()

    def close(self):
        if not self.closed:
            self._f.close()
        super().close()


def open_counted(path):
    """open(path, "rb") whose reads count in this process's IO lines."""
    return io.BufferedReader(CountingRaw(path))


def emit_io():
    """This process's IO line (one write: lines of several processes never interleave)."""
    c = _io_counts()
    line = (f"IO pid={c['pid']} wall_ns={time.time_ns()} bytes={c['bytes']} reads={c['reads']} "
            f"files={len(c['files'])}\n")
    os.write(sys.stdout.fileno(), line.encode())


# ---------------------------------------------------------------- workers

def _set_pdeathsig():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def worker_init(worker_id):
    """DataLoader worker_init_fn: leave SIGINT/SIGTERM to the main process.

    A Ctrl-C reaches the whole process group; PyTorch's worker would raise
    KeyboardInterrupt (a traceback if it is inside the dataset code). The main
    process blocks both signals while it starts workers, so they are still
    blocked here (inherited across fork and exec): ignore, then unblock.
    """
    _quiet_stop_signals()
    _set_pdeathsig()
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    if info is not None and getattr(info.dataset, "counts_io", False):
        emit_io()


class _Blocked:
    """Block SIGINT/SIGTERM in the calling thread (workers start with them blocked)."""

    def __enter__(self):
        self.old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self.old)
        return False


def worker_pids(it):
    """Pids of a multi-process iterator's workers (None for num_workers=0, or for a
    wrapper's generator before its first batch: its frame holds the iterator)."""
    frame = getattr(it, "gi_frame", None)
    if frame is not None:
        it = frame.f_locals.get("dataloader_iter")
    ws = getattr(it, "_workers", None)
    if ws is None:
        return None
    return [w.pid for w in ws]


# ---------------------------------------------------------------- training step

class Step:
    """A simulated training step: `ms` of CPU work in torch matmuls, calibrated once."""

    def __init__(self, ms):
        import torch

        self.ms = ms
        g = torch.Generator().manual_seed(0)
        self.a = torch.rand(96, 96, generator=g) / 96
        self.out = torch.empty(96, 96)
        best = None
        for _ in range(5):
            t = time.thread_time_ns()
            self._units(50)
            d = (time.thread_time_ns() - t) / 50
            best = d if best is None else min(best, d)
        self.unit_ns = max(best, 1.0)
        self.units = max(1, round(ms * 1e6 / self.unit_ns))
        print(f"torch_common: step {ms} ms = {self.units} matmuls of 96x96 "
              f"({self.unit_ns / 1e3:.1f} us each)", file=sys.stderr)

    def _units(self, n):
        import torch

        for _ in range(n):
            torch.mm(self.a, self.a, out=self.out)

    def run(self):
        self._units(self.units)


# ---------------------------------------------------------------- loop

def _emit(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _leaves(y)
    elif isinstance(x, dict):
        for k in sorted(x):
            yield from _leaves(x[k])
    else:
        yield x


def _batch_crc(batch, crc):
    import numpy as np
    import torch

    for t in _leaves(batch):
        if isinstance(t, torch.Tensor):
            crc = zlib.crc32(np.ascontiguousarray(t.detach().cpu().numpy()), crc)
        else:
            crc = zlib.crc32(repr(t).encode(), crc)
    return crc


def _leading_dim(batch):
    import torch

    for t in _leaves(batch):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    raise ValueError("batch has no tensor with a leading dimension")


def derived_loader_class():
    """A DataLoader class of the job's own, as training code defines one: a mixin first,
    so that DataLoader is only in its MRO, not its first base."""
    from torch.utils.data import DataLoader

    class Logged:
        def describe(self):
            return type(self).__name__

    class TrainLoader(Logged, DataLoader):
        pass

    return TrainLoader


def make_loader(dataset, args, training=True):
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    if args.sharing_strategy:
        torch.multiprocessing.set_sharing_strategy(args.sharing_strategy)
    g = torch.Generator()
    g.manual_seed(args.seed)
    kw = dict(batch_size=args.batch_size, num_workers=args.num_workers,
              pin_memory=args.pin_memory, generator=g)
    if not isinstance(dataset, IterableDataset):
        kw["shuffle"] = training and args.shuffle
    if args.num_workers > 0:
        kw.update(worker_init_fn=worker_init, prefetch_factor=args.prefetch_factor,
                  persistent_workers=args.persistent_workers,
                  multiprocessing_context=args.start_method)
    cls = derived_loader_class() if training and args.loader_class == "derived" else DataLoader
    return cls(dataset, **kw)


def run(module, args):
    import torch

    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True

    for s in STOP_SIGNALS:
        signal.signal(s, on_signal)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dataset = module.build(args)
    loader = make_loader(dataset, args)
    if args.accelerate:
        try:
            from accelerate import Accelerator
        except ImportError:
            raise SystemExit("--accelerate needs accelerate in the venv "
                             "(tests/requirements-torch.txt: bash scripts/torch.sh)")
        loader = Accelerator(cpu=True).prepare(loader)
    step = Step(args.step_ms) if args.step_ms > 0 else None
    nw = args.num_workers
    persistent = int(bool(args.persistent_workers and nw > 0))
    prefetch = (args.prefetch_factor if args.prefetch_factor is not None else 2) if nw else "none"

    st = {"it": None, "epoch": 0, "stall": 0, "stall_cpu": 0, "stall_runq": 0, "pids": None,
          "started": False, "val_ns": 0, "val_root": 0, "root": 0, "elems": 0,
          "unnoted": False}
    truth = args.stall_detail
    val_loader = None
    if args.val_samples > 0:
        vargs = argparse.Namespace(**vars(args))
        vargs.epoch_samples = args.val_samples
        vargs.persistent_workers = False
        # In order, as a validation loader is.
        val_loader = make_loader(module.build(vargs), vargs, training=False)

    # --two-deep: only `holder` names the loaders, two attributes away.
    holder = None
    if args.two_deep:
        holder = _Holder(loader, val_loader)
        loader = val_loader = None
    # --loops: only the loops' fetchers hold them (in a list: not looked into).
    loops = []
    if args.loops:
        loops = [TrainingEpochLoop(loader), EvaluationLoop(val_loader)]
        loader = val_loader = None

    def the_loader():
        if loops:
            return loops[0].fetcher._combined_loader._iterables
        return holder.data.train_loader if holder else loader

    def the_val():
        if loops:
            return loops[1].fetcher._combined_loader._iterables
        return holder.data.val_loader if holder else val_loader

    def validate():
        """One pass over the validation loader, between two GT lines: its batches and time
        (val_root, val_ns) are neither root nor stall_ns."""
        gt(time.time_ns(), st["root"], st["elems"])
        _emit(f"VAL epoch={st['epoch']} wall_ns={time.time_ns()}")
        t = time.perf_counter_ns()
        with _Blocked():
            if loops:
                loops[1].run(st)
            else:
                for _ in the_val():
                    st["val_root"] += 1
        st["val_ns"] += time.perf_counter_ns() - t
        gt(time.time_ns(), st["root"], st["elems"])

    def renew():
        nonlocal loader
        if holder:
            holder.data.train_loader = None
            holder.data.train_loader = make_loader(module.build(args), args)
            return
        loader = None
        loader = make_loader(module.build(args), args)

    def note_workers():
        """A WORKERS line when the iterator's workers are new; whether they were known."""
        pids = worker_pids(st["it"])
        if pids is not None and pids != st["pids"]:
            st["pids"] = pids
            _emit(f"WORKERS pids={','.join(map(str, pids))} epoch={st['epoch']} "
                  f"wall_ns={time.time_ns()}")
        return pids is not None

    def next_batch():
        t = time.perf_counter_ns()
        if truth:
            c, q = time.thread_time_ns(), _run_delay_ns()
        try:
            while True:
                if st["it"] is None:
                    with _Blocked():
                        st["it"] = iter(the_loader())
                    # A wrapper's generator starts the iterator at its first batch.
                    st["unnoted"] = not note_workers() and hasattr(st["it"], "gi_frame")
                try:
                    batch = next(st["it"])
                    if st["unnoted"]:
                        st["unnoted"] = not note_workers()
                    return batch
                except StopIteration:
                    st["it"] = None
                    if st["started"]:
                        st["epoch"] += 1
                        st["started"] = False
                    else:
                        raise RuntimeError("an epoch yielded no batch")
                    if the_val() is not None:
                        st["stall"] += time.perf_counter_ns() - t
                        validate()
                        t = time.perf_counter_ns()
                    if args.new_loader:
                        # Outside the stall: the loop's own code, not the loader's.
                        st["stall"] += time.perf_counter_ns() - t
                        renew()
                        t = time.perf_counter_ns()
        finally:
            st["stall"] += time.perf_counter_ns() - t
            if truth:
                st["stall_cpu"] += time.thread_time_ns() - c
                st["stall_runq"] += _run_delay_ns() - q

    fields = getattr(module, "gt_fields", None)

    def gt(now, root, elems):
        extra = f" {fields()}" if fields else ""
        if the_val() is not None:
            extra += f" val_ns={st['val_ns']} val_root={st['val_root']}"
        if truth:
            extra += f" stall_cpu_ns={st['stall_cpu']} stall_runq_ns={st['stall_runq']}"
        _emit(f"GT wall_ns={now} root={root} elems={elems} stall_ns={st['stall']} "
              f"epoch={st['epoch']}{extra}")

    def next_or_stop():
        # A worker that dies (e.g. SIGKILLed by hand) makes PyTorch raise
        # RuntimeError; after a stop signal that just ends the run.
        try:
            return next_batch()
        except RuntimeError:
            if stop["flag"]:
                return None
            raise

    def take():
        return loops[0].advance(next_or_stop) if loops else next_or_stop()

    built = time.time_ns()
    x = take()
    if x is None:
        _emit("DONE root=0")
        return 0
    st["started"] = True
    root, elems = 1, _leading_dim(x)
    st["root"], st["elems"] = root, elems
    crc = _batch_crc(x, 0) if args.checksum else None
    if step is not None:
        step.run()
    now = time.time_ns()
    interval = max(int(args.gt_interval * 1e9), 1)
    deadline = now + int(args.seconds * 1e9)
    _emit(f"READY pid={os.getpid()} pipeline={module.NAME} num_workers={nw} "
          f"batch_size={args.batch_size} start_method={args.start_method} "
          f"persistent_workers={persistent} prefetch_factor={prefetch}")
    _emit(f"GT wall_ns={built} root=0 elems=0 stall_ns=0 epoch=0")
    gt(now, root, elems)
    last = root
    next_gt = now + interval

    while now < deadline and not stop["flag"]:
        if args.max_batches and root >= args.max_batches:
            break
        x = take()
        if x is None:
            break
        st["started"] = True
        root += 1
        elems += _leading_dim(x)
        st["root"], st["elems"] = root, elems
        if crc is not None:
            crc = _batch_crc(x, crc)
        if step is not None:
            step.run()
        now = time.time_ns()
        if now >= next_gt:
            gt(now, root, elems)
            last = root
            next_gt += interval
            if next_gt <= now:  # fell behind (stall): restart the grid
                next_gt = now + interval
    if last != root:
        gt(now, root, elems)
    if crc is not None:
        _emit(f"CHECKSUM crc={crc:08x} root={root}")
    _emit(f"DONE root={root}")

    if args.hold > 0:
        end = time.time() + args.hold
        while not stop["flag"] and time.time() < end:
            time.sleep(min(0.1, max(0.0, end - time.time())))

    # Shut the workers down now (they would otherwise wait for the
    # iterator's finaliser or, after os._exit, for their watchdog).
    it = st["it"] if st["it"] is not None else getattr(the_loader(), "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        with _Blocked():
            try:
                it._shutdown_workers()
            except RuntimeError as e:
                # Past DONE nothing the run printed can change: a worker
                # dying as it exits (once in CI, a spawned worker aborting
                # in torch's C++ teardown: "terminate called without an
                # active exception") is reported, not the run's failure.
                print(f"torch_common: at shutdown: {e}", file=sys.stderr)
    return 0


class _Combined:
    """--loops: holds a loader as Lightning's CombinedLoader does, as `_iterables`."""

    def __init__(self, loader):
        self._iterables = loader


class _Fetcher:
    def __init__(self, loader):
        self._combined_loader = _Combined(loader)


class TrainingEpochLoop:
    """--loops: the training batches are taken in advance(), as in Lightning's
    _TrainingEpochLoop.advance, whose frame holds the loader only as a local fetcher's
    _combined_loader._iterables; validation runs from inside it (at an epoch's end)."""

    def __init__(self, loader):
        self.fetcher = _Fetcher(loader)

    def advance(self, take):
        fetcher = self.fetcher  # noqa: F841 (held in the frame, as Lightning's is)
        return take()


class EvaluationLoop:
    """--loops: a validation pass, as Lightning's _EvaluationLoop.run."""

    def __init__(self, loader):
        self.fetcher = _Fetcher(loader)

    def run(self, st):
        fetcher = self.fetcher
        for _ in fetcher._combined_loader._iterables:
            st["val_root"] += 1


class _Holder:
    """What holds a trainer's data (--two-deep): holder.data.train_loader."""

    def __init__(self, train_loader, val_loader):
        self.data = argparse.Namespace(train_loader=train_loader, val_loader=val_loader)


_SCHED = {}


def _run_delay_ns():
    """The calling thread's time runnable but waiting for a CPU, ns. Read through libc
    without releasing the GIL (ctypes.PyDLL): a read through Python's io releases it, and
    with another Python thread busy each release costs a switch interval to take it back,
    inside the very calls this measures."""
    import ctypes

    if not _SCHED:  # the loop's thread calls first: thread-self is its
        _SCHED["libc"] = ctypes.PyDLL(None)
        _SCHED["buf"] = ctypes.create_string_buffer(128)
        _SCHED["fd"] = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    n = _SCHED["libc"].pread(_SCHED["fd"], _SCHED["buf"], 127, ctypes.c_long(0))
    return int(_SCHED["buf"].raw[:max(n, 0)].split()[1])


def main(module, argv=None):
    args = parse_args(module, argv)
    rc = run(module, args)
    sys.stdout.flush()
    sys.stderr.flush()
    return rc
