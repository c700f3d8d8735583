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


TORCH_LOG = """\
WORKERS pids=501,502 epoch=0 wall_ns=1000000000
READY pid=500 pipeline=torch_image num_workers=2 batch_size=32 start_method=spawn persistent_workers=0 prefetch_factor=2
GT wall_ns=1000000000 root=0 elems=0 stall_ns=0 epoch=0
GT wall_ns=2000000000 root=1 elems=32 stall_ns=900000000 epoch=0
GT wall_ns=2100000000 root=9 elems=256 stall_ns=950000000 epoch=0
WORKERS pids=511,512 epoch=1 wall_ns=2150000000
GT wall_ns=2200000000 root=11 elems=320 stall_ns=1000000000 epoch=1
CHECKSUM crc=00c0ffee root=11
DONE root=11
"""


def test_torch_fields():
    log = groundtruth.parse(TORCH_LOG)
    assert log.pid == 500 and log.pipeline == "torch_image" and log.done_root == 11
    assert log.ready["num_workers"] == "2" and log.ready["start_method"] == "spawn"
    assert log.keys == ("root", "elems", "stall_ns", "epoch")
    assert log.series("epoch") == [0, 0, 0, 1]
    assert [w["pids"] for w in log.workers] == [[501, 502], [511, 512]]
    assert [w["epoch"] for w in log.workers] == [0, 1]
    assert log.workers[1]["wall_ns"] == 2_150_000_000
    assert log.worker_pids() == [501, 502, 511, 512]
    assert log.checksum == (0xC0FFEE, 11)
    # stall as a counter: 50 ms of the 100 ms between 2.1 s and 2.2 s
    assert groundtruth.window_count(TORCH_LOG, 2_100_000_000, 2_200_000_000,
                                    key="stall_ns") == 50_000_000
    assert approx(log.stall_share(2_100_000_000, 2_200_000_000), 0.5)
    s = log.summary()
    assert s["stall_ns_total"] == 1_000_000_000 and s["epoch_total"] == 1
    assert approx(s["stall_share"], 1.0 / 1.2)
    assert s["worker_sets"] == 2 and s["checksum"] == "00c0ffee" and s["num_workers"] == "2"
    assert "epoch_per_s" not in s


def test_torch_optional_keys():
    # TF logs have no stall_ns: asking for it is an error, not a zero
    try:
        groundtruth.parse(LOG).series("stall_ns")
    except groundtruth.GroundTruthError:
        pass
    else:
        raise AssertionError("stall_ns on a TF log")
    # WORKERS without epoch/wall_ns is accepted
    log = groundtruth.parse("WORKERS pids=7\n")
    assert log.workers == [{"pids": [7], "epoch": None, "wall_ns": None}]


def test_torch_bad_lines():
    for bad in [
            # stall_ns went back
            "GT wall_ns=5 root=1 elems=1 stall_ns=9 epoch=0\nGT wall_ns=6 root=2 elems=2 stall_ns=8 epoch=0",
            # first line had stall_ns, a later one not
            "GT wall_ns=5 root=1 elems=1 stall_ns=9 epoch=0\nGT wall_ns=6 root=2 elems=2 epoch=0",
            # a later line has a counter the first did not
            "GT wall_ns=5 root=1 elems=1\nGT wall_ns=6 root=2 elems=2 stall_ns=1",
            "GT wall_ns=5 root=1 elems=1 stall_ns=x epoch=0",
            "WORKERS pids=1,x", "WORKERS epoch=1", "CHECKSUM crc=zz root=1", "CHECKSUM crc=1"]:
        try:
            groundtruth.parse(bad)
        except groundtruth.GroundTruthError:
            pass
        else:
            raise AssertionError(bad)


IO_LOG = """\
IO pid=7 wall_ns=100 bytes=0 reads=0 files=0
IO pid=8 wall_ns=150 bytes=0 reads=0 files=0
IO pid=7 wall_ns=200 bytes=1000 reads=2 files=1
IO pid=8 wall_ns=250 bytes=500 reads=1 files=1
IO pid=7 wall_ns=300 bytes=1500 reads=3 files=2
"""


def test_io_lines():
    log = groundtruth.parse(IO_LOG)
    assert sorted(log.io) == [7, 8] and len(log.io[7]) == 3
    # between two lines: bounded, not interpolated
    assert log.io_bounds(7, 250) == (1000, 1500)
    # on a line: exact
    assert log.io_bounds(7, 200) == (1000, 1000)
    # before the first line (a worker's zeros): nothing read yet
    assert log.io_bounds(8, 50) == (0, 0)
    # after the last line: nothing read since
    assert log.io_bounds(8, 400, key="reads") == (1, 1)
    assert log.io_bounds(9, 400) == (0, 0)
    # a process that started and finished inside the window: exact
    assert log.io_window_bounds(8, 120, 400) == (500, 500)
    assert log.io_window_bounds(7, 150, 250) == (0, 1500)
    assert log.summary()["io"]["7"] == {"bytes": 1500, "reads": 3, "files": 2}
    for bad in ["IO pid=7 wall_ns=5 bytes=9 reads=1 files=1\nIO pid=7 wall_ns=6 bytes=8 reads=1 files=1",
                "IO pid=7 wall_ns=5 bytes=9 reads=1 files=1\nIO pid=7 wall_ns=4 bytes=9 reads=1 files=1",
                "IO pid=7 wall_ns=5 bytes=9 reads=1"]:
        try:
            groundtruth.parse(bad)
        except groundtruth.GroundTruthError:
            pass
        else:
            raise AssertionError(bad)


TESTS = [test_parse, test_window_count, test_not_covered, test_bad_lines, test_torch_fields,
         test_torch_optional_keys, test_torch_bad_lines, test_io_lines]


if __name__ == "__main__":
    import runner

    sys.exit(runner.run(TESTS))
