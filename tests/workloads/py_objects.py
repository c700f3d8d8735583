#!/usr/bin/env python3
"""Pure Python, any CPython 3.9+: builds objects with known attributes and
prints, for each, a line `CHECK {json}` (its id(), an attribute path and
the value there) and, for objects its frames hold, `FIND {json}`; then
`READY` and it waits, inside a `for` loop whose iterator is on the frame's
value stack, with another iterator in a local and a third as an attribute
of a local. Runs until killed.

With --spinners N it first starts N threads that run Python without end
and prints `THREAD {json}` for each thread: its threading.get_ident() and
its kernel id; its main thread then wakes every millisecond instead of
sleeping an hour, and each time waits for a spinner to hand it the GIL.
"""
import json
import struct
import sys
import threading
import time


class Popen:
    def __init__(self, pid):
        self.pid = pid


class Process:
    def __init__(self, i):
        self._popen = Popen(40000 + i)
        self.name = "worker-%d" % i


class Values:
    def __init__(self):
        self.small = 7
        self.zero = 0
        self.negative = -123456
        self.large = 2 ** 100 + 12345
        self.large_negative = -(2 ** 62) - 1
        self.flag = True
        self.off = False
        self.nothing = None
        self.ratio = 0.1 + 2.5
        self.text = "hello objects"
        self.items = [1, "two", 3.0]
        self.pair = (5, -6)
        self._workers = [Process(i) for i in range(3)]


class Many:
    """More attributes than a shared key table holds (30 from 3.11):
    the instance's dict becomes a combined table."""

    def __init__(self):
        for i in range(40):
            setattr(self, "attr_%d" % i, i * 1000 + 1)


class Plain:
    def __init__(self, a, b):
        self.a = a
        self.b = b


class LoopIter:
    def __init__(self):
        self._num_yielded = 0
        self._send_idx = 11

    def __iter__(self):
        # Only the for loop's stack holds it: no local names it.
        print("FIND " + json.dumps({"id": hex(id(self)), "type": "LoopIter", "via": "stack"}))
        expect(self, "_send_idx", 11)
        sys.stdout.flush()
        return self

    def __next__(self):
        self._num_yielded += 1
        return self._num_yielded


class LocalIter:
    def __init__(self):
        self._num_workers = 4


class HeldIter:
    def __init__(self):
        self._rcvd_idx = 9


class DictIter:
    def __init__(self):
        self._num_yielded = 3


class GlobalIter:
    def __init__(self):
        self._num_yielded = 5


class Loader:
    def __init__(self):
        self._iterator = HeldIter()


def bits(f):
    return struct.unpack("<Q", struct.pack("<d", f))[0]


def expect(obj, path, value):
    if isinstance(value, bool):
        v = {"kind": "bool", "bool": value}
    elif value is None:
        v = {"kind": "none"}
    elif isinstance(value, int):
        v = {"kind": "int", "int": str(value)}
    elif isinstance(value, float):
        v = {"kind": "float", "bits": str(bits(value))}
    elif isinstance(value, str):
        v = {"kind": "str", "str": value}
    else:
        raise TypeError(value)
    print("CHECK " + json.dumps({"id": hex(id(obj)), "path": path, "value": v}))


def announce_global():
    """The object only the module's namespace holds, as a script's top-level loader: read
    here, in a frame gone once it returns, so that no stale slot of main's holds it too."""
    g = sys.modules[__name__].GLOBAL_ITER
    print("FIND " + json.dumps({"id": hex(id(g)), "type": type(g).__name__, "via": "global"}))


def main():
    vals = Values()
    for name in ("small", "zero", "negative", "large", "large_negative", "flag",
                 "off", "nothing", "ratio", "text"):
        expect(vals, name, getattr(vals, name))
    expect(vals, "items[0]", 1)
    expect(vals, "items[1]", "two")
    expect(vals, "items[2]", 3.0)
    expect(vals, "pair[1]", -6)
    for i in range(3):
        expect(vals, "_workers[%d]._popen.pid" % i, 40000 + i)
        expect(vals, "_workers[%d].name" % i, "worker-%d" % i)
    many = Many()
    for i in (0, 17, 29, 30, 39):
        expect(many, "attr_%d" % i, i * 1000 + 1)
    # Same class, attributes set in another order, and one deleted: no
    # longer the shared table's.
    plain = Plain(1, 2)
    other = Plain(3, 4)
    del other.a
    other.c = 5
    other.a = 6
    for o, path, v in ((plain, "a", 1), (plain, "b", 2), (other, "a", 6), (other, "c", 5)):
        expect(o, path, v)
    # A __dict__ made real by vars().
    seen = Plain(10, 20)
    d = vars(seen)
    expect(seen, "a", 10)
    expect(seen, "b", 20)
    # A __dict__ replaced by an ordinary dict.
    swapped = Plain(0, 0)
    swapped.__dict__ = {"a": 31, "b": 32}
    expect(swapped, "a", 31)
    expect(swapped, "b", 32)

    spinners = 0
    if "--spinners" in sys.argv:
        spinners = int(sys.argv[sys.argv.index("--spinners") + 1])
        started = []
        for _ in range(spinners):
            t = threading.Thread(target=_spin, daemon=True)
            t.start()
            started.append(t)
        for t in [threading.main_thread()] + started:
            while t.native_id is None:
                time.sleep(0.01)
            print("THREAD " + json.dumps({"ident": t.ident, "tid": t.native_id,
                                          "spins": t is not threading.main_thread()}))

    it = LocalIter()
    loader = Loader()
    # A loop that calls next() itself may keep its iterator in a dict that
    # a closure shares (a cell of this frame), as torch_common.py does.
    held = {"it": DictIter()}

    def peek():
        return held["it"]

    announce_global()
    for found, via in ((it, "local"), (loader._iterator, "attr"), (peek(), "item")):
        print("FIND " + json.dumps({"id": hex(id(found)), "type": type(found).__name__,
                                    "via": via}))
    del found  # it held the last one: each is to be found where it says
    # As `for i, batch in enumerate(loader)`: the stack holds the
    # enumerate object, which holds the iterator.
    for i, step in enumerate(LoopIter()):
        if step == 1:
            Runner().wait(spinners)
    print(it, loader, d, vals, many)


class MethodIter:
    def __init__(self):
        self._num_yielded = 7


class Runner:
    def wait(self, spinners):
        """Waits in a method's frame, which holds an iterator of its own: found there,
        the frame named as the method of its class on every version."""
        mine = MethodIter()
        print("FIND " + json.dumps({"id": hex(id(mine)), "type": "MethodIter", "via": "method"}))
        print("READY")
        sys.stdout.flush()
        if spinners:
            while True:
                time.sleep(0.001)
        time.sleep(3600)


def _spin():
    x = 1
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


if __name__ == "__main__":
    GLOBAL_ITER = GlobalIter()
    main()
