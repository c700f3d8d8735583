#!/usr/bin/env python3
"""Decode and check a pprof profile.pb.gz independently of plumber-probe's Rust code.

    .venv/bin/python tests/python/decode_pprof.py PROFILE.pb.gz [--stacks]

Prints a JSON summary: the sample types, the total of each, totals per value
of the `op`, `thread`, `tid` and `lock` labels (and the DataLoader's `stage`,
`process` and `pid`), the table sizes, and with
--stacks every sample (frames outermost first, values, labels). Checks the
rules of pprof's profile.proto on the way: string_table[0] == "", ids nonzero
and unique, every reference (locations, functions, mappings, strings)
resolvable, every sample with one value per sample type, functions not
repeated. Exits 2 with a one-line error on a missing, empty, undecodable or
invalid file.

Library: decode_bytes(data, stacks=False) / decode_file(path) -> dict
(raise PprofError).
"""

import gzip
import json
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import pprof_schema  # noqa: E402

# The TensorFlow stack sampler's labels, then the DataLoader stage sampler's.
LABEL_KEYS = ["op", "op_path", "thread", "thread_role", "tid", "lock", "stage", "process", "pid"]


class PprofError(Exception):
    pass


def _unique_ids(items, what):
    ids = {}
    for i, x in enumerate(items):
        if x.id == 0:
            raise PprofError(f"{what}[{i}] has id 0 (ids must be nonzero)")
        if x.id in ids:
            raise PprofError(f"{what} id {x.id} is used twice")
        ids[x.id] = x
    return ids


def check(prof):
    """Raise PprofError unless `prof` follows profile.proto's rules."""
    st = prof.string_table
    if len(st) == 0 or st[0] != "":
        raise PprofError('string_table[0] must be ""')

    def s(i, what):
        if not 0 <= i < len(st):
            raise PprofError(f"{what}: string index {i} out of range ({len(st)} strings)")
        return st[i]

    if not prof.sample_type:
        raise PprofError("no sample_type")
    for vt in prof.sample_type:
        s(vt.type, "sample_type.type")
        s(vt.unit, "sample_type.unit")
    mappings = _unique_ids(prof.mapping, "mapping")
    functions = _unique_ids(prof.function, "function")
    locations = _unique_ids(prof.location, "location")
    for f in prof.function:
        s(f.name, f"function {f.id} name")
        s(f.system_name, f"function {f.id} system_name")
        s(f.filename, f"function {f.id} filename")
    for m in prof.mapping:
        s(m.filename, f"mapping {m.id} filename")
        s(m.build_id, f"mapping {m.id} build_id")
    for loc in prof.location:
        if loc.mapping_id and loc.mapping_id not in mappings:
            raise PprofError(f"location {loc.id}: no mapping {loc.mapping_id}")
        for ln in loc.line:
            if ln.function_id not in functions:
                raise PprofError(f"location {loc.id}: no function {ln.function_id}")
    n = len(prof.sample_type)
    for i, smp in enumerate(prof.sample):
        if len(smp.value) != n:
            raise PprofError(f"sample {i} has {len(smp.value)} values for {n} sample types")
        for lid in smp.location_id:
            if lid not in locations:
                raise PprofError(f"sample {i}: no location {lid}")
        keys = set()
        for lb in smp.label:
            k = s(lb.key, f"sample {i} label key")
            if k in keys:
                raise PprofError(f"sample {i}: label {k!r} twice")
            keys.add(k)
            s(lb.str, f"sample {i} label {k!r}")
            s(lb.num_unit, f"sample {i} label {k!r} num_unit")
            if lb.str and lb.num:
                raise PprofError(f"sample {i}: label {k!r} has both str and num")
    for c in prof.comment:
        s(c, "comment")
    s(prof.default_sample_type, "default_sample_type")
    s(prof.drop_frames, "drop_frames")
    s(prof.keep_frames, "keep_frames")
    names = [st[f.name] for f in prof.function]
    if len(set(names)) != len(names):
        raise PprofError("a function name appears in two functions (not deduplicated)")
    return functions, locations


def summarize(prof, stacks=False):
    functions, locations = check(prof)
    st = prof.string_table
    types = [st[vt.type] for vt in prof.sample_type]
    totals = {t: 0 for t in types}
    by_label = {k: {} for k in LABEL_KEYS}
    out_stacks = []
    for smp in prof.sample:
        for t, v in zip(types, smp.value):
            totals[t] += v
        labels = {}
        for lb in smp.label:
            key = st[lb.key]
            labels[key] = st[lb.str] if lb.str else lb.num
        for key, val in labels.items():
            if key in by_label:
                acc = by_label[key].setdefault(str(val), {t: 0 for t in types})
                for t, v in zip(types, smp.value):
                    acc[t] += v
        if stacks:
            frames = []
            for lid in smp.location_id:
                loc = locations[lid]
                # Inlined frames: the last line is the caller.
                for ln in loc.line:
                    frames.append(st[functions[ln.function_id].name])
            frames.reverse()  # profile.proto lists the leaf first
            out_stacks.append({"frames": frames, "values": list(smp.value), "labels": labels})
    out = {
        "sample_types": [[st[vt.type], st[vt.unit]] for vt in prof.sample_type],
        "default_sample_type": st[prof.default_sample_type],
        "totals": totals,
        "by_label": by_label,
        "num_samples": len(prof.sample),
        "num_locations": len(prof.location),
        "num_functions": len(prof.function),
        "num_mappings": len(prof.mapping),
        "num_strings": len(st),
        "time_nanos": prof.time_nanos,
        "duration_nanos": prof.duration_nanos,
        "comments": [st[c] for c in prof.comment],
    }
    if stacks:
        out["stacks"] = out_stacks
    return out


def parse_bytes(data):
    """bytes (gzip-compressed or not) -> Profile message (raises PprofError)."""
    from google.protobuf.message import DecodeError

    if not data:
        raise PprofError("empty file")
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise PprofError(f"bad gzip data: {e}") from None
    prof = pprof_schema.profile_class()()
    try:
        prof.ParseFromString(data)
    except DecodeError as e:
        raise PprofError(f"not a pprof Profile: {e}") from None
    return prof


def decode_bytes(data, stacks=False):
    return summarize(parse_bytes(data), stacks)


def decode_file(path, stacks=False):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PprofError(f"cannot read: {e.strerror}") from None
    return decode_bytes(data, stacks)


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="Decode and check a pprof profile.pb.gz.")
    p.add_argument("profile")
    p.add_argument("--stacks", action="store_true", help="list every sample")
    a = p.parse_args(argv)
    try:
        out = decode_file(a.profile, a.stacks)
    except PprofError as e:
        print(f"decode_pprof: {a.profile}: {e}", file=sys.stderr)
        return 2
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
