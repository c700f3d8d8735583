#!/usr/bin/env python3
"""Decode a Plumber-format stats.pb independently of plumber-probe's Rust code.

    .venv/bin/python tests/python/decode_stats.py STATS.pb [--all-fields]

Prints a JSON summary: graph nodes (name, op, input), the function library,
per-op stats keyed by OpStats.name, machine_info, ctx_info, iter_stats,
snapshot_info, and the numbers of the fields the reader skipped because
Plumber's schema does not declare them (plumber-probe's >= 1000 extensions).
Exits 2 with a one-line error on a missing, empty or undecodable file.

Library: decode_bytes(data) / decode_file(path) -> dict (raise StatsError).
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import stats_schema  # noqa: E402

# The per-op fields of the summary (all Plumber fields with --all-fields).
SUMMARY_STAT_FIELDS = [
    "elements_produced",
    "aggregate_elements_produced",
    "processing_time",
    "parallelism",
    "element_ratio",
    "bytes_produced",
    "bytes_consumed",
    # CPU time, waits and file reads (0 when not measured).
    "aggregate_processing_time_clock",
    "aggregate_udf_processing_time_clock",
    "aggregate_wait_time",
    "aggregate_disk_bytes_read",
    "aggregate_elements_consumed",
]


class StatsError(Exception):
    pass


def _is_repeated(field):
    # protobuf >= 5 has is_repeated; `label` was removed in protobuf 7.
    rep = getattr(field, "is_repeated", None)
    if rep is not None:
        return rep
    return field.label == field.LABEL_REPEATED


def _fields(msg, names=None):
    """Plain dict of scalar fields (int64 stay ints, unlike MessageToDict)."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        if names is not None and f.name not in names:
            continue
        v = getattr(msg, f.name)
        if f.message_type is not None:
            if _is_repeated(f):
                out[f.name] = [_fields(x) for x in v]
            else:
                out[f.name] = _fields(v) if msg.HasField(f.name) else None
        elif _is_repeated(f):
            out[f.name] = list(v)
        else:
            out[f.name] = v
    if names is not None:
        return {n: out[n] for n in names}
    return out


def _unknown_numbers(msg):
    from google.protobuf import unknown_fields

    return sorted({f.field_number for f in unknown_fields.UnknownFieldSet(msg)})


def summarize(snap, all_fields=False):
    g = snap.graph
    nodes = [{"name": n.name, "op": n.op, "input": list(n.input)} for n in g.node]
    functions = [f.signature.name for f in g.library.function]

    stats = {}
    duplicates = []
    names = None if all_fields else SUMMARY_STAT_FIELDS
    stat_unknown = set()
    for s in snap.stats:
        key = s.name
        if key in stats:
            duplicates.append(key)
            i = 2
            while f"{s.name}#{i}" in stats:
                i += 1
            key = f"{s.name}#{i}"
        stats[key] = _fields(s, names)
        stat_unknown.update(_unknown_numbers(s))

    def opt(field):
        return _fields(getattr(snap, field)) if snap.HasField(field) else None

    return {
        "graph": {
            "present": snap.HasField("graph"),
            "num_nodes": len(nodes),
            "nodes": nodes,
            "functions": functions,
            "producer": g.versions.producer if g.HasField("versions") else None,
        },
        "stats": stats,
        "duplicate_stat_names": duplicates,
        "machine_info": opt("machine_info"),
        "ctx_info": opt("ctx_info"),
        "iter_stats": opt("iter_stats"),
        "snapshot_info": opt("snapshot_info"),
        "skipped_fields": {
            "PipelineSnapshot": _unknown_numbers(snap),
            "OpStats": sorted(stat_unknown),
        },
    }


def parse_bytes(data):
    """bytes -> PipelineSnapshot message (raises StatsError)."""
    from google.protobuf.message import DecodeError

    if not data:
        raise StatsError("empty file")
    cls = stats_schema.pipeline_snapshot_class()
    snap = cls()
    try:
        snap.ParseFromString(data)
    except DecodeError as e:
        raise StatsError(f"not a PipelineSnapshot: {e}") from None
    known = [f for f, _ in snap.ListFields()]
    if not known:
        raise StatsError("no PipelineSnapshot field (1-7) present")
    return snap


def decode_bytes(data, all_fields=False):
    return summarize(parse_bytes(data), all_fields)


def decode_file(path, all_fields=False):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise StatsError(f"cannot read {path}: {e.strerror}") from None
    return decode_bytes(data, all_fields)


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="Decode a Plumber stats.pb to JSON.")
    p.add_argument("stats")
    p.add_argument("--all-fields", action="store_true",
                   help="every Plumber OpStats field, not just the summary ones")
    a = p.parse_args(argv)
    try:
        out = decode_file(a.stats, a.all_fields)
    except StatsError as e:
        print(f"decode_stats: {a.stats}: {e}", file=sys.stderr)
        return 2
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
