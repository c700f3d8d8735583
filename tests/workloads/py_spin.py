#!/usr/bin/env python3
"""Pure Python (no TensorFlow), any CPython 3.9+: spins in known, nested
functions and prints the interpreter's own view of that stack once
(traceback.format_stack() from the innermost function, then a line
`READY`), so a sampled stack can be compared with it. A second thread
spins in its own functions. Runs until killed.
"""
import sys
import threading
import traceback

# A plain flag, not a threading.Event: a call to Python code from here
# would be a frame the traceback does not show.
printed = False


def leaf_spin(n):
    global printed
    if not printed:
        sys.stdout.write("".join(traceback.format_stack()))
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        printed = True
    s = 0
    for i in range(n):
        s = (s * 31 + i) % 1000003
    return s


def middle(n):
    return leaf_spin(n) + 1


def outer():
    while True:
        middle(20000)


class Worker:
    def run(self):
        while True:
            self.step()

    def step(self):
        s = 0
        for i in range(20000):
            s += i * i
        return s


def main():
    threading.Thread(target=Worker().run, daemon=True).start()
    outer()


if __name__ == "__main__":
    main()
