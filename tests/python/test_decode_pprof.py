#!/usr/bin/env python3
"""Self-test of the independent pprof decoder (plain asserts; exit 0 = pass, 1 = fail).

    .venv/bin/python tests/python/test_decode_pprof.py

Builds profiles with the runtime-built schema (a valid one, then one broken
per rule of profile.proto), gzips them, decodes them with decode_pprof, and
checks the summary and the CLI's exit codes. The cross-check with a file
written by plumber-probe's Rust code is collector/tests/pprof.rs.
"""

import gzip
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import decode_pprof  # noqa: E402
import pprof_schema  # noqa: E402


def sample_profile():
    P = pprof_schema.profile_class()
    p = P()
    strings = [""]

    def s(x):
        if x not in strings:
            strings.append(x)
        return strings.index(x)

    for t, u in [("cpu", "nanoseconds"), ("lock_wait", "nanoseconds"), ("io", "bytes")]:
        p.sample_type.add(type=s(t), unit=s(u))
    for i, name in enumerate(["main", "decode", "take_gil"], start=1):
        p.function.add(id=i, name=s(name), system_name=s(name))
        loc = p.location.add(id=i)
        loc.line.add(function_id=i)
    # Leaf first: main -> decode.
    smp = p.sample.add(location_id=[2, 1], value=[100, 0, 4096])
    smp.label.add(key=s("op"), str=s("ParallelMapV2"))
    smp.label.add(key=s("tid"), num=101)
    smp = p.sample.add(location_id=[3, 1], value=[0, 30, 0])
    smp.label.add(key=s("op"), str=s("ParallelMapV2"))
    smp.label.add(key=s("lock"), str=s("gil"))
    smp = p.sample.add(location_id=[1], value=[7, 0, 0])
    smp.label.add(key=s("thread"), str=s("python3"))
    p.default_sample_type = s("cpu")
    p.duration_nanos = 5_000_000_000
    p.comment.append(s("pid 4242"))
    p.string_table.extend(strings)
    return p


def gz(p):
    return gzip.compress(p.SerializeToString(), mtime=0)


def test_summary():
    out = decode_pprof.decode_bytes(gz(sample_profile()), stacks=True)
    assert out["sample_types"] == [["cpu", "nanoseconds"], ["lock_wait", "nanoseconds"],
                                   ["io", "bytes"]], out["sample_types"]
    assert out["default_sample_type"] == "cpu"
    assert out["totals"] == {"cpu": 107, "lock_wait": 30, "io": 4096}, out["totals"]
    assert out["by_label"]["op"]["ParallelMapV2"] == {"cpu": 100, "lock_wait": 30, "io": 4096}
    assert out["by_label"]["lock"]["gil"]["lock_wait"] == 30
    assert out["by_label"]["tid"]["101"]["cpu"] == 100
    assert out["stacks"][0]["frames"] == ["main", "decode"], out["stacks"][0]
    assert out["stacks"][1]["labels"] == {"op": "ParallelMapV2", "lock": "gil"}
    assert (out["num_samples"], out["num_locations"], out["num_functions"]) == (3, 3, 3)
    assert out["comments"] == ["pid 4242"]
    assert out["duration_nanos"] == 5_000_000_000
    # Not gzip-compressed: read as well (pprof accepts both).
    raw = decode_pprof.decode_bytes(sample_profile().SerializeToString())
    assert raw["totals"] == out["totals"]


def expect_error(p, text):
    try:
        decode_pprof.decode_bytes(gz(p))
    except decode_pprof.PprofError as e:
        assert text in str(e), (text, str(e))
    else:
        raise AssertionError(f"no error for: {text}")


def test_rules():
    p = sample_profile()
    p.string_table[0] = "x"
    expect_error(p, 'string_table[0] must be ""')

    p = sample_profile()
    p.sample[0].value.append(1)
    expect_error(p, "4 values for 3 sample types")

    p = sample_profile()
    p.sample[0].location_id.append(99)
    expect_error(p, "no location 99")

    p = sample_profile()
    p.location[0].line[0].function_id = 42
    expect_error(p, "no function 42")

    p = sample_profile()
    p.function[1].id = 1
    expect_error(p, "function id 1 is used twice")

    p = sample_profile()
    p.location[2].id = 0
    expect_error(p, "has id 0")

    p = sample_profile()
    p.sample[0].label[0].str = 999
    expect_error(p, "string index 999 out of range")

    p = sample_profile()
    p.function[2].name = p.function[1].name
    p.function[2].system_name = p.function[1].system_name
    expect_error(p, "not deduplicated")

    p = sample_profile()
    del p.sample_type[:]
    expect_error(p, "no sample_type")


def test_bad_bytes():
    for data, text in [(b"", "empty file"), (b"\x1f\x8b\x08garbage", "bad gzip"),
                       (b"\xff\xff\xff", "not a pprof Profile")]:
        try:
            decode_pprof.decode_bytes(data)
        except decode_pprof.PprofError as e:
            assert text in str(e), (text, str(e))
        else:
            raise AssertionError(f"no error for {data!r}")


def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(HERE, "decode_pprof.py"), *args],
                          capture_output=True, text=True)


def test_cli():
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "profile.pb.gz")
        with open(good, "wb") as f:
            f.write(gz(sample_profile()))
        r = run_cli(good)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["totals"]["io"] == 4096
        assert "stacks" not in out

        bad = os.path.join(d, "bad.pb.gz")
        with open(bad, "wb") as f:
            f.write(b"\x1f\x8b\x08\x00trailing")
        for path in (bad, os.path.join(d, "missing.pb.gz")):
            r = run_cli(path)
            assert r.returncode == 2, (path, r.returncode, r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("decode_pprof: "), r.stderr
            assert r.stdout == ""


TESTS = [test_summary, test_rules, test_bad_bytes, test_cli]


if __name__ == "__main__":
    import runner

    sys.exit(runner.run(TESTS))
