#!/usr/bin/env python3
"""PyTorch training script whose loop runs at module level (as a notebook cell does).

The same pure-Python transform as torch_pyxform.py (--pyiters iterations per sample), a
shuffled training DataLoader and, with --val-samples, a validation DataLoader in order, both
module globals, as is their iterator: no function's frame holds any of them, only the module's
own namespace (the frame's f_locals, its globals). After each training epoch a validation pass
runs in a `for` loop at module level. With --for-loop the training epochs are `for` loops too:
the training iterator then lives only on the module frame's value stack. With --in-object
both loaders are attributes of a global object (`trainer.train_loader`, as a trainer or a
data module holds them), and no global names them; with --nested too, that object is itself
an attribute of a global object (`app.trainer.train_loader`). With --in-dict the loaders are
the items of a dict (`loaders["train"]`, as the PyTorch tutorial's `dataloaders[phase]`), a
global, or with --in-object or --nested that object's attribute (`app.trainer.loaders["train"]`).
--extra-globals N adds N names to the
module's namespace before the loaders (a notebook's grows by `_i12`, `_12` a cell run).

Prints the torch_common protocol (READY, GT with val_root= and val_ns= when validating,
WORKERS, VAL, DONE); stall_ns is the time inside the training loader's iter() and next().
Only the options torch_common.run() would use here are honoured: --num-workers, --batch-size,
--epoch-samples, --val-samples, --seconds, --gt-interval, --seed, --start-method,
--persistent-workers, --prefetch-factor, --pyiters, --for-loop, --in-object, --nested,
--in-dict, --extra-globals.
"""

import argparse
import multiprocessing
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch_common  # noqa: E402
import torch_pyxform  # noqa: E402

NAME = "torch_toplevel"
EPOCH_SAMPLES = 1024


def add_args(p):
    torch_pyxform.add_args(p)
    p.add_argument("--for-loop", action="store_true",
                   help="train in `for x in train_loader:` (the iterator on the module frame's "
                        "stack only) instead of calling next() on a global iterator")
    p.add_argument("--in-object", action="store_true",
                   help="hold both loaders as attributes of a global object, not as globals")
    p.add_argument("--nested", action="store_true",
                   help="with --in-object: that object an attribute of another global object "
                        "(app.trainer.train_loader)")
    p.add_argument("--in-dict", action="store_true",
                   help="hold both loaders as items of a dict: a global, or with --in-object or "
                        "--nested that object's attribute (app.trainer.loaders[\"train\"])")
    p.add_argument("--extra-globals", type=int, default=0, metavar="N",
                   help="names added to the module's namespace before the loaders")


class Trainer:
    """What holds the loaders with --in-object."""


class App:
    """What holds the Trainer with --nested."""


if __name__ == "__main__":
    import torch

    args = torch_common.parse_args(sys.modules[__name__])
    stop = {"flag": False}
    for s in torch_common.STOP_SIGNALS:
        signal.signal(s, lambda signum, frame: stop.update(flag=True))
    torch.set_num_threads(max(args.threads, 1))
    torch.manual_seed(args.seed)
    for i in range(args.extra_globals):
        globals()[f"_i{i}"] = f"cell {i}"
    train_loader = torch_common.make_loader(torch_pyxform.build(args), args)
    val_loader = None
    if args.val_samples > 0:
        vargs = argparse.Namespace(**vars(args))
        vargs.epoch_samples, vargs.persistent_workers = args.val_samples, False
        val_loader = torch_common.make_loader(torch_pyxform.build(vargs), vargs, training=False)

    # Where the loops take the loaders from: the module's own globals, a
    # global object's attributes (the names deleted), or those of an
    # object that a global object holds; with --in-dict, a dict's items
    # there.
    trainer = sys.modules[__name__]
    if args.in_object or args.nested:
        trainer = Trainer()
        if args.in_dict:
            trainer.loaders = {"train": train_loader, "val": val_loader}
        else:
            trainer.train_loader, trainer.val_loader = train_loader, val_loader
        del train_loader, val_loader
    elif args.in_dict:
        loaders = {"train": train_loader, "val": val_loader}
        del train_loader, val_loader
    if args.nested:
        app = App()
        app.trainer = trainer
        del trainer

    class _Items:
        """The loaders of a dict, as attributes (looked up at each use)."""

        def __init__(self, d):
            self.train_loader, self.val_loader = d["train"], d["val"]

    def the():
        """What holds the loaders, looked up at each use as a loop's `app.trainer` is."""
        if args.in_dict:
            return _Items(app.trainer.loaders if args.nested
                          else trainer.loaders if args.in_object else loaders)
        return app.trainer if args.nested else trainer

    root = elems = epoch = stall = val_root = val_ns = 0
    pids = None
    it = None

    def gt(now):
        extra = f" val_ns={val_ns} val_root={val_root}" if the().val_loader is not None else ""
        torch_common._emit(f"GT wall_ns={now} root={root} elems={elems} stall_ns={stall} "
                           f"epoch={epoch}{extra}")

    built = time.time_ns()
    deadline = next_gt = None
    interval = max(int(args.gt_interval * 1e9), 1)

    def took(x):
        """Counts a batch; READY at the first; GT lines every --gt-interval."""
        global root, elems, deadline, next_gt
        root += 1
        elems += torch_common._leading_dim(x)
        now = time.time_ns()
        if deadline is None:
            deadline = now + int(args.seconds * 1e9)
            torch_common._emit(
                f"READY pid={os.getpid()} pipeline={NAME} num_workers={args.num_workers} "
                f"batch_size={args.batch_size} start_method={args.start_method} "
                f"persistent_workers={int(bool(args.persistent_workers))} "
                f"prefetch_factor={args.prefetch_factor or 2}")
            torch_common._emit(f"GT wall_ns={built} root=0 elems=0 stall_ns=0 epoch=0")
            gt(now)
            next_gt = now + interval
        elif now >= next_gt:
            gt(now)
            next_gt = max(next_gt + interval, now)

    def workers_started(w):
        global pids
        if w and w != pids:
            pids = w
            torch_common._emit(f"WORKERS pids={','.join(map(str, w))} epoch={epoch} "
                               f"wall_ns={time.time_ns()}")

    def validate():
        global val_root, val_ns
        gt(time.time_ns())
        torch_common._emit(f"VAL epoch={epoch - 1} wall_ns={time.time_ns()}")
        t = time.perf_counter_ns()
        with torch_common._Blocked():
            for _ in the().val_loader:
                val_root += 1
        val_ns += time.perf_counter_ns() - t
        gt(time.time_ns())

    def going():
        return not stop["flag"] and (deadline is None or time.time_ns() < deadline)

    while args.for_loop and going():
        # The epoch's next() calls are the time between two bodies.
        t = time.perf_counter_ns()
        first = True
        for x in the().train_loader:
            stall += time.perf_counter_ns() - t
            if first:
                workers_started(sorted(c.pid for c in multiprocessing.active_children()))
                first = False
            took(x)
            if not going():
                break
            t = time.perf_counter_ns()
        else:
            stall += time.perf_counter_ns() - t
            epoch += 1
            if the().val_loader is not None:
                validate()
    while not args.for_loop and going():
        t = time.perf_counter_ns()
        if it is None:
            with torch_common._Blocked():
                it = iter(the().train_loader)
            workers_started(torch_common.worker_pids(it))
        try:
            x = next(it)
        except StopIteration:
            stall += time.perf_counter_ns() - t
            it = None
            epoch += 1
            if the().val_loader is not None:
                validate()
            continue
        stall += time.perf_counter_ns() - t
        took(x)
    gt(time.time_ns())
    torch_common._emit(f"DONE root={root}")
    if it is not None and hasattr(it, "_shutdown_workers"):
        with torch_common._Blocked():
            it._shutdown_workers()
