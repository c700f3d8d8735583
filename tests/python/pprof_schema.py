"""pprof's Profile schema (github.com/google/pprof proto/profile.proto,
package perftools.profiles), built at run time with google.protobuf.

An independent reader for plumber-probe's profile.pb.gz: it does not use the
Rust code nor the vendored collector/proto/pprof/profile.proto. Field names
and numbers are those of pprof's profile.proto.

    import pprof_schema
    Profile = pprof_schema.profile_class()
    prof = Profile.FromString(data)
"""

FILE_NAME = "plumber_probe_tests/profile.proto"
PACKAGE = "perftools.profiles"

INT64, UINT64, STRING, BOOL = "int64", "uint64", "string", "bool"
REP = "repeated"

MESSAGES = {
    "Profile": [
        ("sample_type", 1, ".perftools.profiles.ValueType", REP),
        ("sample", 2, ".perftools.profiles.Sample", REP),
        ("mapping", 3, ".perftools.profiles.Mapping", REP),
        ("location", 4, ".perftools.profiles.Location", REP),
        ("function", 5, ".perftools.profiles.Function", REP),
        ("string_table", 6, STRING, REP),
        ("drop_frames", 7, INT64),
        ("keep_frames", 8, INT64),
        ("time_nanos", 9, INT64),
        ("duration_nanos", 10, INT64),
        ("period_type", 11, ".perftools.profiles.ValueType"),
        ("period", 12, INT64),
        ("comment", 13, INT64, REP),
        ("default_sample_type", 14, INT64),
    ],
    "ValueType": [("type", 1, INT64), ("unit", 2, INT64)],
    "Sample": [
        ("location_id", 1, UINT64, REP),
        ("value", 2, INT64, REP),
        ("label", 3, ".perftools.profiles.Label", REP),
    ],
    "Label": [("key", 1, INT64), ("str", 2, INT64), ("num", 3, INT64), ("num_unit", 4, INT64)],
    "Mapping": [
        ("id", 1, UINT64),
        ("memory_start", 2, UINT64),
        ("memory_limit", 3, UINT64),
        ("file_offset", 4, UINT64),
        ("filename", 5, INT64),
        ("build_id", 6, INT64),
        ("has_functions", 7, BOOL),
        ("has_filenames", 8, BOOL),
        ("has_line_numbers", 9, BOOL),
        ("has_inline_frames", 10, BOOL),
    ],
    "Location": [
        ("id", 1, UINT64),
        ("mapping_id", 2, UINT64),
        ("address", 3, UINT64),
        ("line", 4, ".perftools.profiles.Line", REP),
        ("is_folded", 5, BOOL),
    ],
    "Line": [("function_id", 1, UINT64), ("line", 2, INT64), ("column", 3, INT64)],
    "Function": [
        ("id", 1, UINT64),
        ("name", 2, INT64),
        ("system_name", 3, INT64),
        ("filename", 4, INT64),
        ("start_line", 5, INT64),
    ],
}

_CACHE = {}


def file_descriptor_proto():
    from google.protobuf import descriptor_pb2

    FD = descriptor_pb2.FieldDescriptorProto
    scalar = {INT64: FD.TYPE_INT64, UINT64: FD.TYPE_UINT64,
              STRING: FD.TYPE_STRING, BOOL: FD.TYPE_BOOL}
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.name = FILE_NAME
    fdp.package = PACKAGE
    fdp.syntax = "proto3"
    for name, fields in MESSAGES.items():
        m = fdp.message_type.add()
        m.name = name
        for spec in fields:
            fname, number, typ = spec[:3]
            f = m.field.add()
            f.name = fname
            f.number = number
            f.label = FD.LABEL_REPEATED if len(spec) > 3 else FD.LABEL_OPTIONAL
            if typ in scalar:
                f.type = scalar[typ]
            else:
                f.type = FD.TYPE_MESSAGE
                f.type_name = typ
    return fdp


def message_class(name):
    """Message class for e.g. 'Profile' or 'Sample'."""
    if name not in _CACHE:
        from google.protobuf import descriptor_pool, message_factory

        # A private pool: a process that also loads pprof's real generated
        # module (same package) must not clash with this reconstruction.
        pool = _CACHE.get("_pool")
        if pool is None:
            pool = descriptor_pool.DescriptorPool()
            pool.Add(file_descriptor_proto())
            _CACHE["_pool"] = pool
        desc = pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
        _CACHE[name] = message_factory.GetMessageClass(desc)
    return _CACHE[name]


def profile_class():
    return message_class("Profile")
