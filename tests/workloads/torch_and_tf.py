#!/usr/bin/env python3
"""torch_pyxform.py in a process that imported TensorFlow first.

A PyTorch job often loads TensorFlow too: tensorboard, tf.io, a dataset library. Its pipeline
is still its DataLoader. --tf-site DIR names a site-packages that holds tensorflow (the
project's TensorFlow venv: both venvs run the same CPython); every other argument goes to
torch_pyxform.py, whose protocol (READY, GT, WORKERS, DONE) this prints. --delay S waits S
seconds after importing TensorFlow, before torch is imported and the DataLoader made (a job
still starting when the probe attaches).
"""

import os
import runpy
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--tf-site" not in args or args.index("--tf-site") + 1 >= len(args):
        raise SystemExit("usage: torch_and_tf.py --tf-site DIR [--delay S] [torch_pyxform.py options]")
    i = args.index("--tf-site")
    site = args[i + 1]
    del args[i:i + 2]
    delay = 0.0
    if "--delay" in args:
        j = args.index("--delay")
        delay = float(args[j + 1])
        del args[j:j + 2]
    # After the torch venv's own packages: its numpy stays the one both use.
    sys.path.append(site)
    import tensorflow  # noqa: E402,F401

    print(f"TF pid={os.getpid()}", flush=True)
    time.sleep(delay)

    script = os.path.join(HERE, "torch_pyxform.py")
    sys.path.insert(0, HERE)
    sys.argv = [script] + args
    runpy.run_path(script, run_name="__main__")
