"""Shared checks of the benchmark scripts (Python standard library only)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def die(msg):
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
    sys.exit(2)


def check_setup(args):
    """Root, the release probe binary and the project's venv, or a one-line error."""
    if os.geteuid() != 0:
        die("needs root (plumber-probe attaches with eBPF and process_vm_readv); run with sudo")
    args.probe = os.path.abspath(args.probe)
    if not (os.path.isfile(args.probe) and os.access(args.probe, os.X_OK)):
        die(f"probe binary {args.probe} not found; build it with `cargo build --release -p plumber-probe`")
    if not os.access(args.python, os.X_OK):
        die(f"python {args.python} not found (the workloads need the project's .venv)")
