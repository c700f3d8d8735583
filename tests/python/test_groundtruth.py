#!/usr/bin/env python3
"""Self-test of tests/workloads/groundtruth.py (plain asserts; exit 0 = pass, 1 = fail)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "workloads"))

import groundtruth  # noqa: E402

LOG = """\
some stderr-ish noise
READY pid=4242 pipeline=tfrecord_image
GT wall_ns=1000000000 root=1 elems=16
GT wall_ns=1100000000 root=11 elems=176
GT wall_ns=1200000000 root=31 elems=496
GT wall_ns=1400000000 root=31 elems=496
GT wall_ns=1500000000 root=41 elems=656
DONE root=41
"""


def approx(a, b, eps=1e-9):
    return abs(a - b) <= eps * max(1.0, abs(a), abs(b))


def test_parse():
    log = groundtruth.parse(LOG)
    assert log.pid == 4242 and log.pipeline == "tfrecord_image" and log.done_root == 41
    assert log.samples == 5
    s = log.summary()
    assert s["root_total"] == 41 and s["elems_total"] == 656
    assert approx(s["root_per_s"], 40 / 0.5)


def test_window_count():
    lines = LOG.splitlines()
    # exact sample points
    assert groundtruth.window_count(lines, 1_000_000_000, 1_500_000_000) == 40
    assert groundtruth.window_count(lines, 1_000_000_000, 1_500_000_000, key="elems") == 640
    # interpolation inside one interval: 1.05 s -> 6, 1.15 s -> 21
    assert approx(groundtruth.window_count(LOG, 1_050_000_000, 1_150_000_000), 15)
    # flat part (stall)
    assert groundtruth.window_count(LOG, 1_200_000_000, 1_400_000_000) == 0
    assert approx(groundtruth.window_rate(LOG, 1_000_000_000, 1_100_000_000), 100.0)
    # parsed Log accepted too
    assert groundtruth.window_count(groundtruth.parse(LOG), 1_000_000_000, 1_000_000_000) == 0


def test_not_covered():
    for a, b in [(999_999_999, 1_100_000_000), (1_100_000_000, 1_500_000_001)]:
        try:
            groundtruth.window_count(LOG, a, b)
        except groundtruth.WindowNotCovered:
            pass
        else:
            raise AssertionError((a, b))
    try:
        groundtruth.window_count("READY pid=1 pipeline=x\n", 0, 1)
    except groundtruth.WindowNotCovered:
        pass
    else:
        raise AssertionError("empty log")


def test_bad_lines():
    for bad in ["GT wall_ns=5 root=x elems=1", "GT wall_ns=5 root=1",
                "GT wall_ns=5 root=2 elems=2\nGT wall_ns=4 root=3 elems=3",
                "GT wall_ns=5 root=2 elems=2\nGT wall_ns=6 root=1 elems=3"]:
        try:
            groundtruth.parse(bad)
        except groundtruth.GroundTruthError:
            pass
        else:
            raise AssertionError(bad)


TESTS = [test_parse, test_window_count, test_not_covered, test_bad_lines]


if __name__ == "__main__":
    import runner

    sys.exit(runner.run(TESTS))
