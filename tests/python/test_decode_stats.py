#!/usr/bin/env python3
"""Self-test of the independent stats.pb decoder (plain asserts; exit 0 = pass, 1 = fail).

    .venv/bin/python tests/python/test_decode_stats.py

Builds a PipelineSnapshot with the runtime-built class, adds plumber-probe-style
extension fields (numbers >= 1000) as raw bytes, serializes, decodes with
decode_stats, and checks every value; then checks the CLI's exit codes.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import decode_stats  # noqa: E402
import stats_schema  # noqa: E402


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_len(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number, value):
    return varint(number << 3 | 0) + varint(value)


def field_double(number, value):
    import struct

    return varint(number << 3 | 1) + struct.pack("<d", value)


STATS = [
    # name, elements_produced, aggregate_elements_produced, processing_time, parallelism,
    # element_ratio, bytes_produced, bytes_consumed
    ("Root", 100, 100, 1_000_000, 1, 1.0, 1_000, 1_000),
    ("Prefetch", 100, 100, 2_000_000, 1, 1.0, 1_000, 1_000),
    ("BatchV2", 100, 100, 30_000_000, 1, 16.0, 1_000, 1_600),
    ("ParallelMapV2", 1600, 1600, 2_500_000_000, 2, 1.0, 1_600, 40_000),
    ("TFRecord", 1600, 1600, 9_000_000, 1, 1.0, 40_000, 0),
]

# name -> (aggregate_processing_time_clock, aggregate_udf_processing_time_clock,
#          aggregate_wait_time, aggregate_disk_bytes_read, aggregate_elements_consumed),
# as plumber-probe fills them from thread CPU time and file reads.
USAGE = {
    "ParallelMapV2": (2_000_000_000, 1_900_000_000, 0, 0, 0),
    "TFRecord": (8_000_000, 0, 500_000, 4_984_538, 1),
}


def sample_snapshot():
    PS = stats_schema.pipeline_snapshot_class()
    snap = PS()
    g = snap.graph
    chain = ["TFRecordDataset/_1", "ParallelMapDatasetV2/_2", "BatchDatasetV2/_3",
             "PrefetchDataset/_4"]
    ops = ["TFRecordDataset", "ParallelMapDatasetV2", "BatchDatasetV2", "PrefetchDataset"]
    for i, (name, op) in enumerate(zip(chain, ops)):
        n = g.node.add(name=name, op=op)
        if i:
            n.input.append(chain[i - 1])
        n.attr["T"].type = 1  # TensorFlow's full AttrValue schema (DT_FLOAT)
    g.node.add(name="dataset", op="_Retval", input=[chain[-1]])
    fn = g.library.function.add()
    fn.signature.name = "__inference_parse_image_42"
    fn.signature.input_arg.add(name="args_0", type=7)  # DT_STRING
    g.versions.producer = 2183
    for (name, ep, aep, pt, par, er, bp, bc) in STATS:
        s = snap.stats.add()
        s.name = name
        s.elements_produced = ep
        s.aggregate_elements_produced = aep
        s.processing_time = pt
        s.parallelism = par
        s.element_ratio = er
        s.bytes_produced = bp
        s.bytes_consumed = bc
        s.aggregate_udf_processing_time = 7 if name == "ParallelMapV2" else 0
        s.aggregate_inter_op_parallelism = name == "ParallelMapV2"
        (s.aggregate_processing_time_clock, s.aggregate_udf_processing_time_clock,
         s.aggregate_wait_time, s.aggregate_disk_bytes_read,
         s.aggregate_elements_consumed) = USAGE.get(name, (0, 0, 0, 0, 0))
    mi = snap.machine_info
    mi.num_cores = 2
    mi.memory_free = 1 << 30
    mi.memory_total = 24 << 30
    mi.estimated_disk_bandwidth = 123.5
    mi.num_hyperthreads_per_core = 1
    mi.nominal_cpu_frequency = 2.5e9
    mi.model = "Test CPU"
    snap.ctx_info.shared_threadpool_size = 2
    snap.ctx_info.udf_threadpool_size = 2
    snap.ctx_info.file_sizes.add(name="/data/train-00000-of-00004.tfrecord", size=4984538)
    snap.iter_stats.avg_duration = 0.5
    si = snap.snapshot_info
    si.start_time = 1_700_000_000_000_000_000
    si.current_time = 1_700_000_010_000_000_000
    si.process_start_time = 1_699_999_990_000_000_000
    si.process_current_time = 1_700_000_010_000_000_000
    span = snap.spans_context_snapshot.span_ctxs.add().spans.add()
    span.name = "x"
    span.start_time = 1
    span.end_time = 2
    return snap


def with_extensions(snap):
    """Serialize, adding plumber-probe extension fields the schema does not declare."""
    PS = type(snap)
    snap = PS.FromString(snap.SerializeToString())
    stats = list(snap.stats)
    del snap.stats[:]
    data = snap.SerializeToString()
    ext = stats_schema.PROBE_OPSTATS_EXTENSIONS
    for s in stats:
        body = s.SerializeToString()
        body += field_len(1000, s.name.encode())                       # probe_model_name
        body += field_len(1001, ("Root::" + s.name).encode())          # probe_path
        body += field_varint(1002, 3)                                  # probe_buffered_elements
        body += field_double(1005, 1.5)                                # probe_parallelism
        if s.name == "ParallelMapV2":
            # Waits of the op's threads (ns, count), lock to futex.
            for name in ("probe_lock_wait_ns", "probe_lock_waits", "probe_gil_wait_ns",
                         "probe_gil_waits", "probe_cond_wait_ns", "probe_cond_waits",
                         "probe_futex_wait_ns", "probe_futex_waits", "probe_io_wait_ns"):
                body += field_varint(ext[name], 11)
        if s.name == "TFRecord":
            body += field_varint(ext["probe_io_bytes_read"], 4984538)
            body += field_varint(ext["probe_io_read_ns"], 500000)
            body += field_varint(ext["probe_files_opened"], 1)
            body += field_len(ext["probe_files"], PROBE_FILE)
        data += field_len(2, body)
    probe_info = field_len(1, b"model") + field_varint(2, 12345)
    data += field_len(1000, probe_info)                                # probe_info
    data += field_len(1001, field_len(1, b"ring") + field_varint(2, 0))  # probe_drops
    snap_ext = stats_schema.PROBE_SNAPSHOT_EXTENSIONS
    thread = (field_varint(1, 77) + field_len(2, b"tf_data_private_threadpool")
              + field_len(3, b"udf_pool") + field_varint(4, 1_900_000_000)
              + field_len(6, field_len(1, b"Root::ParallelMapV2") + field_varint(2, 1_900_000_000)))
    probe_cpu = (field_varint(1, 5_000_000_000) + field_varint(2, 4_000_000_000)
                 + field_varint(3, 2_008_000_000) + field_varint(4, 1) + field_varint(5, 1)
                 + field_len(6, thread))
    data += field_len(snap_ext["probe_cpu"], probe_cpu)
    data += field_len(snap_ext["probe_files"], PROBE_FILE)
    lock_site = (field_len(1, b"gil") + field_len(2, b"take_gil") + field_varint(4, 3)
                 + field_varint(5, 900))
    data += field_len(snap_ext["probe_lock_sites"], lock_site)
    data += field_varint(snap_ext["probe_unattributed_io_bytes"], 42)
    return data


# One ProbeFile: path, op_path, bytes_read, reads, opens, read_ns, size.
PROBE_FILE = (field_len(1, b"/data/train-00000-of-00004.tfrecord")
              + field_len(2, b"Root::TFRecord") + field_varint(3, 4984538)
              + field_varint(4, 76) + field_varint(5, 1) + field_varint(6, 500000)
              + field_varint(7, 4984538))


def check_summary(out):
    g = out["graph"]
    assert g["present"] is True
    assert g["num_nodes"] == 5, g
    names = [n["name"] for n in g["nodes"]]
    assert names[0] == "TFRecordDataset/_1" and names[-1] == "dataset", names
    assert g["nodes"][1] == {"name": "ParallelMapDatasetV2/_2", "op": "ParallelMapDatasetV2",
                             "input": ["TFRecordDataset/_1"]}, g["nodes"][1]
    assert g["functions"] == ["__inference_parse_image_42"], g["functions"]
    assert g["producer"] == 2183

    assert list(out["stats"]) == [s[0] for s in STATS], list(out["stats"])
    for (name, ep, aep, pt, par, er, bp, bc) in STATS:
        st = out["stats"][name]
        clock, udf_clock, wait, disk, consumed = USAGE.get(name, (0, 0, 0, 0, 0))
        assert st == {"elements_produced": ep, "aggregate_elements_produced": aep,
                      "processing_time": pt, "parallelism": par, "element_ratio": er,
                      "bytes_produced": bp, "bytes_consumed": bc,
                      "aggregate_processing_time_clock": clock,
                      "aggregate_udf_processing_time_clock": udf_clock,
                      "aggregate_wait_time": wait, "aggregate_disk_bytes_read": disk,
                      "aggregate_elements_consumed": consumed}, (name, st)
        assert isinstance(st["processing_time"], int)
    assert out["duplicate_stat_names"] == []

    mi = out["machine_info"]
    assert mi["num_cores"] == 2 and mi["memory_total"] == 24 << 30 and mi["model"] == "Test CPU", mi
    assert mi["estimated_disk_bandwidth"] == 123.5 and mi["nominal_cpu_frequency"] == 2.5e9
    si = out["snapshot_info"]
    assert si["current_time"] - si["start_time"] == 10_000_000_000, si
    assert out["ctx_info"]["file_sizes"] == [
        {"name": "/data/train-00000-of-00004.tfrecord", "size": 4984538}]
    assert out["iter_stats"]["avg_duration"] == 0.5


def test_roundtrip():
    snap = sample_snapshot()
    out = decode_stats.decode_bytes(snap.SerializeToString())
    check_summary(out)
    assert out["skipped_fields"] == {"PipelineSnapshot": [], "OpStats": []}, out["skipped_fields"]
    # Must survive JSON.
    json.loads(json.dumps(out))


def test_extensions_are_skipped():
    data = with_extensions(sample_snapshot())
    out = decode_stats.decode_bytes(data)
    check_summary(out)
    # Every extension but probe_buffered_bytes (1003) and probe_instances
    # (1004) is present in the sample, and Plumber's schema skips them all.
    ops_ext = sorted(set(stats_schema.PROBE_OPSTATS_EXTENSIONS.values()) - {1003, 1004})
    assert out["skipped_fields"] == {
        "PipelineSnapshot": sorted(stats_schema.PROBE_SNAPSHOT_EXTENSIONS.values()),
        "OpStats": ops_ext}, out["skipped_fields"]
    # The CPU/I-O fields Plumber does have are read.
    assert out["stats"]["TFRecord"]["aggregate_disk_bytes_read"] == 4984538


def test_extension_numbers():
    # Extensions never collide with Plumber's field numbers.
    for table in (stats_schema.PROBE_OPSTATS_EXTENSIONS,
                  stats_schema.PROBE_SNAPSHOT_EXTENSIONS):
        assert all(n >= 1000 for n in table.values()), table
        assert len(set(table.values())) == len(table), table
    plumber = {f[1] for f in stats_schema.OPSTATS_FIELDS}
    assert not plumber & set(stats_schema.PROBE_OPSTATS_EXTENSIONS.values())


def test_graph_is_tensorflow_graphdef():
    PS = stats_schema.pipeline_snapshot_class()
    gfield = PS.DESCRIPTOR.fields_by_name["graph"]
    assert gfield.number == 1
    assert gfield.message_type.full_name == "tensorflow.GraphDef"
    assert gfield.message_type.file.name == "tensorflow/core/framework/graph.proto"
    snap = PS.FromString(sample_snapshot().SerializeToString())
    assert type(snap.graph) is stats_schema.graph_def_class()
    assert snap.graph.node[0].attr["T"].type == 1
    ops = PS.DESCRIPTOR.nested_types_by_name["OpStats"]
    assert sorted(f.number for f in ops.fields) == list(range(1, 32))
    assert max(f.number for f in PS.DESCRIPTOR.fields) == 7


def test_all_fields():
    out = decode_stats.decode_bytes(sample_snapshot().SerializeToString(), all_fields=True)
    pm = out["stats"]["ParallelMapV2"]
    assert len(pm) == 31, sorted(pm)
    assert pm["aggregate_udf_processing_time"] == 7
    assert pm["aggregate_inter_op_parallelism"] is True


def test_duplicates():
    PS = stats_schema.pipeline_snapshot_class()
    snap = PS()
    snap.stats.add(name="Map", elements_produced=1)
    snap.stats.add(name="Map", elements_produced=2)
    out = decode_stats.decode_bytes(snap.SerializeToString())
    assert out["duplicate_stat_names"] == ["Map"]
    assert out["stats"]["Map"]["elements_produced"] == 1
    assert out["stats"]["Map#2"]["elements_produced"] == 2
    assert out["graph"]["present"] is False and out["machine_info"] is None


def test_bad_inputs():
    for data, what in [(b"", "empty"), (b"\xff\xff\xff\xff", "not a PipelineSnapshot"),
                       (field_len(1000, b"only an extension"), "no PipelineSnapshot field"),
                       (b"\x0a\x05abc", "not a PipelineSnapshot")]:
        try:
            decode_stats.decode_bytes(data)
        except decode_stats.StatsError as e:
            assert what in str(e), (data, str(e))
        else:
            raise AssertionError(f"{data!r} decoded")


def run_cli(path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, os.path.join(HERE, "decode_stats.py"), path],
                          capture_output=True, text=True, env=env, timeout=120)


def test_cli():
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "stats.pb")
        with open(good, "wb") as f:
            f.write(with_extensions(sample_snapshot()))
        r = run_cli(good)
        assert r.returncode == 0, r.stderr
        check_summary(json.loads(r.stdout))

        bad = os.path.join(d, "bad.pb")
        with open(bad, "wb") as f:
            f.write(b"\xff\xff\xff")
        for path in (bad, os.path.join(d, "missing.pb")):
            r = run_cli(path)
            assert r.returncode == 2, (path, r.returncode, r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("decode_stats: "), r.stderr
            assert r.stdout == ""


TESTS = [test_roundtrip, test_extensions_are_skipped, test_extension_numbers,
         test_graph_is_tensorflow_graphdef,
         test_all_fields, test_duplicates, test_bad_inputs, test_cli]


if __name__ == "__main__":
    import runner

    sys.exit(runner.run(TESTS))
