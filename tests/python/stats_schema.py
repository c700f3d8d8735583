"""Plumber's PipelineSnapshot schema, built at run time with google.protobuf.

An independent reader for plumber-probe's stats.pb: it does not use the Rust
code nor the .proto files in collector/. Field names and numbers are those of
Plumber's tensorflow/core/framework/input_pipeline_analysis.proto (fields 1-31
of OpStats and the top-level messages). plumber-probe's own extension fields
(numbers >= 1000) are deliberately NOT declared: proto3 parsing must skip them,
which is what Plumber's own reader does.

`graph` is TensorFlow's real tensorflow.GraphDef (tensorflow/core/framework/
graph.proto, from tensorflow.core.framework.graph_pb2), so NodeDef attrs and
the FunctionDefLibrary decode with TensorFlow's full schema.

    import stats_schema
    PipelineSnapshot = stats_schema.pipeline_snapshot_class()
    snap = PipelineSnapshot.FromString(data)
"""

import importlib.util
import sys
import types

FILE_NAME = "plumber_probe_tests/input_pipeline_analysis.proto"
PACKAGE = "tensorflow"
GRAPH_PROTO = "tensorflow/core/framework/graph.proto"

# (name, number, type) with type one of the scalar names below or ".pkg.Message".
INT64, DOUBLE, STRING, BOOL = "int64", "double", "string", "bool"

OPSTATS_FIELDS = [
    ("elements_produced", 1, INT64),
    ("wallclock_time", 2, INT64),
    ("processing_time", 3, INT64),
    ("parallelism", 4, INT64),
    ("element_ratio", 5, DOUBLE),
    ("name", 6, STRING),
    ("count", 7, INT64),
    ("bytes_produced", 8, INT64),
    ("bytes_consumed", 9, INT64),
    ("processing_time_clock", 10, INT64),
    ("estimated_dataset_size", 11, INT64),  # deprecated in Plumber
    ("aggregate_elements_produced", 12, INT64),
    ("aggregate_processing_time", 13, INT64),
    ("aggregate_processing_time_clock", 14, INT64),
    ("scheduling_delay_time", 15, INT64),
    ("aggregate_bytes_produced", 16, INT64),
    ("aggregate_bytes_consumed", 17, INT64),
    ("aggregate_udf_processing_time", 18, INT64),
    ("aggregate_udf_processing_time_clock", 19, INT64),
    ("aggregate_scheduling_delay_time", 20, INT64),
    ("aggregate_avg_number_active_threads", 21, DOUBLE),
    ("aggregate_inter_op_parallelism", 22, BOOL),
    ("aggregate_wait_time", 23, INT64),
    ("aggregate_disk_bytes_read", 24, INT64),
    ("aggregate_elements_consumed", 25, INT64),
    ("cardinality", 26, INT64),
    ("aggregate_ratio", 27, INT64),
    ("aggregate_parallelism", 28, INT64),
    ("aggregate_max_buffer_size", 29, INT64),
    ("aggregate_max_bytes_per_element", 30, INT64),
    ("aggregate_misc_buffer_size", 31, INT64),
]

MACHINE_INFO_FIELDS = [
    ("num_cores", 1, INT64),
    ("memory_free", 2, INT64),
    ("memory_total", 3, INT64),
    ("estimated_disk_bandwidth", 4, DOUBLE),
    ("num_hyperthreads_per_core", 5, INT64),
    ("nominal_cpu_frequency", 6, DOUBLE),
    ("model", 7, STRING),
]

FILE_SIZE_FIELDS = [("name", 1, STRING), ("size", 2, INT64)]

CTX_INFO_FIELDS = [
    ("shared_threadpool_size", 1, INT64),
    ("udf_threadpool_size", 2, INT64),
    ("file_sizes", 3, ".tensorflow.PipelineSnapshot.FileSize", "repeated"),
]

ITERATOR_STATS_FIELDS = [
    ("avg_duration", 1, DOUBLE),
    ("var_duration", 2, DOUBLE),
    ("avg_wallclock_duration", 3, DOUBLE),
    ("autotune_output_time", 4, DOUBLE),
]

SNAPSHOT_INFO_FIELDS = [
    ("start_time", 1, INT64),
    ("current_time", 2, INT64),
    ("process_start_time", 3, INT64),
    ("process_current_time", 4, INT64),
]

SPAN_FIELDS = [("name", 1, STRING), ("start_time", 2, INT64), ("end_time", 3, INT64)]

PIPELINE_SNAPSHOT_FIELDS = [
    ("graph", 1, ".tensorflow.GraphDef"),
    ("stats", 2, ".tensorflow.PipelineSnapshot.OpStats", "repeated"),
    ("machine_info", 3, ".tensorflow.PipelineSnapshot.MachineInfo"),
    ("ctx_info", 4, ".tensorflow.PipelineSnapshot.CtxInfo"),
    ("iter_stats", 5, ".tensorflow.PipelineSnapshot.IteratorStats"),
    ("snapshot_info", 6, ".tensorflow.PipelineSnapshot.SnapshotInfo"),
    ("spans_context_snapshot", 7, ".tensorflow.SpanContextSnapshot"),
]

# plumber-probe's extension fields (docs/stats-format.md), by message. Listed
# for reference and for the self-test only: they are NOT added to the schema,
# so a reader with Plumber's schema skips them.
PROBE_OPSTATS_EXTENSIONS = {
    "probe_model_name": 1000,
    "probe_path": 1001,
    "probe_buffered_elements": 1002,
    "probe_buffered_bytes": 1003,
    "probe_instances": 1004,
    "probe_parallelism": 1005,
    "probe_lock_wait_ns": 1006,
    "probe_lock_waits": 1007,
    "probe_gil_wait_ns": 1008,
    "probe_gil_waits": 1009,
    "probe_cond_wait_ns": 1010,
    "probe_cond_waits": 1011,
    "probe_futex_wait_ns": 1012,
    "probe_futex_waits": 1013,
    "probe_io_bytes_read": 1014,
    "probe_io_read_ns": 1015,
    "probe_files_opened": 1016,
    "probe_files": 1017,
    "probe_io_wait_ns": 1018,
}
PROBE_SNAPSHOT_EXTENSIONS = {
    "probe_info": 1000,
    "probe_drops": 1001,
    "probe_cpu": 1002,
    "probe_files": 1003,
    "probe_lock_sites": 1004,
    "probe_unattributed_io_bytes": 1005,
}

_CACHE = {}


def import_graph_pb2(light=True):
    """Import tensorflow.core.framework.graph_pb2 (puts graph.proto in the default pool).

    light=True and TensorFlow not imported yet: import only the generated proto
    modules (~0.2 s) instead of all of TensorFlow (~5 s), through a temporary
    namespace stand-in for the `tensorflow` package that is removed afterwards,
    so a later `import tensorflow` still loads the real package.
    """
    if "tensorflow.core.framework.graph_pb2" in sys.modules:
        return sys.modules["tensorflow.core.framework.graph_pb2"]
    if not light or "tensorflow" in sys.modules:
        from tensorflow.core.framework import graph_pb2
        return graph_pb2
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tensorflow is not installed (run scripts/setup.sh)")
    stub = types.ModuleType("tensorflow")
    stub.__path__ = list(spec.submodule_search_locations)
    sys.modules["tensorflow"] = stub
    try:
        from tensorflow.core.framework import graph_pb2
    finally:
        if sys.modules.get("tensorflow") is stub:
            del sys.modules["tensorflow"]
    return graph_pb2


def _add_fields(msg, fields):
    from google.protobuf import descriptor_pb2

    FD = descriptor_pb2.FieldDescriptorProto
    scalar = {INT64: FD.TYPE_INT64, DOUBLE: FD.TYPE_DOUBLE,
              STRING: FD.TYPE_STRING, BOOL: FD.TYPE_BOOL}
    for spec in fields:
        name, number, typ = spec[:3]
        repeated = len(spec) > 3 and spec[3] == "repeated"
        f = msg.field.add()
        f.name = name
        f.number = number
        f.label = FD.LABEL_REPEATED if repeated else FD.LABEL_OPTIONAL
        if typ in scalar:
            f.type = scalar[typ]
        else:
            f.type = FD.TYPE_MESSAGE
            f.type_name = typ
        if name == "estimated_dataset_size":
            f.options.deprecated = True


def file_descriptor_proto():
    """The FileDescriptorProto of our reconstruction of Plumber's schema."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.name = FILE_NAME
    fdp.package = PACKAGE
    fdp.syntax = "proto3"
    fdp.dependency.append(GRAPH_PROTO)

    scs = fdp.message_type.add()
    scs.name = "SpanContextSnapshot"
    span = scs.nested_type.add()
    span.name = "Span"
    _add_fields(span, SPAN_FIELDS)
    ctx = scs.nested_type.add()
    ctx.name = "SpanContext"
    _add_fields(ctx, [("spans", 1, ".tensorflow.SpanContextSnapshot.Span", "repeated")])
    _add_fields(scs, [("span_ctxs", 1, ".tensorflow.SpanContextSnapshot.SpanContext", "repeated")])

    ps = fdp.message_type.add()
    ps.name = "PipelineSnapshot"
    for name, fields in [("OpStats", OPSTATS_FIELDS),
                         ("MachineInfo", MACHINE_INFO_FIELDS),
                         ("FileSize", FILE_SIZE_FIELDS),
                         ("CtxInfo", CTX_INFO_FIELDS),
                         ("IteratorStats", ITERATOR_STATS_FIELDS),
                         ("SnapshotInfo", SNAPSHOT_INFO_FIELDS)]:
        m = ps.nested_type.add()
        m.name = name
        _add_fields(m, fields)
    _add_fields(ps, PIPELINE_SNAPSHOT_FIELDS)
    return fdp


def _file_descriptor(light=True):
    from google.protobuf import descriptor_pool

    import_graph_pb2(light=light)
    pool = descriptor_pool.Default()
    try:
        fd = pool.FindFileByName(FILE_NAME)
    except KeyError:
        fd = None
    if fd is None:
        try:
            existing = pool.FindMessageTypeByName(PACKAGE + ".PipelineSnapshot")
        except KeyError:
            existing = None
        if existing is not None:
            raise RuntimeError("tensorflow.PipelineSnapshot is already defined by "
                               f"{existing.file.name} in the default descriptor pool")
        pool.Add(file_descriptor_proto())
        fd = pool.FindFileByName(FILE_NAME)
    return fd


def message_class(full_name, light=True):
    """Message class for e.g. 'tensorflow.PipelineSnapshot.OpStats'."""
    from google.protobuf import message_factory

    if full_name not in _CACHE:
        _file_descriptor(light)
        from google.protobuf import descriptor_pool

        desc = descriptor_pool.Default().FindMessageTypeByName(full_name)
        _CACHE[full_name] = message_factory.GetMessageClass(desc)
    return _CACHE[full_name]


def pipeline_snapshot_class(light=True):
    return message_class(PACKAGE + ".PipelineSnapshot", light)


def graph_def_class(light=True):
    return import_graph_pb2(light).GraphDef
