//! The scalar and vector arguments of a dataset op as a GraphDef carries
//! them: one input per argument, after the dataset inputs, naming a `Const`
//! node when the recording knows the value and a `Placeholder` (its dtype
//! and shape, no value) when it does not.
//!
//! Plumber's analysis reads some of them (`fetch_metadata` in its
//! `analysis_lib.py`): the `count` of RepeatDataset and TakeDataset as one
//! int64, and the length of the tensor a TensorSliceDataset feeding an
//! interleave slices, as the number of files. Values come from the
//! recording only, never guessed: see docs/stats-format.md for which.

use std::collections::BTreeMap;

use crate::opnames;
use crate::proto::attr_value::{ListValue, Value as AttrKind};
use crate::proto::tensor_shape_proto::Dim;
use crate::proto::{AttrValue, DataType, NodeDef, TensorProto, TensorShapeProto};

/// One argument of an op, in TensorFlow's op definition order.
struct Arg {
    name: &'static str,
    /// None: depends on the program (a TensorSliceDataset's components).
    dtype: Option<DataType>,
    vector: bool,
}

const fn scalar(name: &'static str, dtype: DataType) -> Arg {
    Arg {
        name,
        dtype: Some(dtype),
        vector: false,
    }
}

const fn vector(name: &'static str, dtype: DataType) -> Arg {
    Arg {
        name,
        dtype: Some(dtype),
        vector: true,
    }
}

use DataType::{DtBool as B, DtInt32 as I32, DtInt64 as I64, DtResource as R, DtString as S};

const COUNT: &[Arg] = &[scalar("count", I64)];
const READER: &[Arg] = &[
    vector("filenames", S),
    scalar("compression_type", S),
    scalar("buffer_size", I64),
];
const BATCH_PARALLEL: &[Arg] = &[
    scalar("batch_size", I64),
    scalar("num_parallel_calls", I64),
    scalar("drop_remainder", B),
];
const INTERLEAVE_V3: &[Arg] = &[
    scalar("cycle_length", I64),
    scalar("block_length", I64),
    scalar("num_parallel_calls", I64),
];

/// (op, arguments after its dataset inputs). Captured tensors of
/// function-owning ops (`other_arguments`) are left out: how many there
/// are is not recorded. So are PaddedBatchDatasetV2's per-component
/// `padded_shapes`/`padding_values` and the `drop_remainder` after them.
const ARGS: &[(&str, &[Arg])] = &[
    ("RepeatDataset", COUNT),
    ("TakeDataset", COUNT),
    ("SkipDataset", COUNT),
    ("BatchDataset", &[scalar("batch_size", I64)]),
    ("PaddedBatchDatasetV2", &[scalar("batch_size", I64)]),
    (
        "BatchDatasetV2",
        &[scalar("batch_size", I64), scalar("drop_remainder", B)],
    ),
    ("ParallelBatchDataset", BATCH_PARALLEL),
    ("MapAndBatchDataset", BATCH_PARALLEL),
    ("PrefetchDataset", &[scalar("buffer_size", I64)]),
    ("ParallelMapDataset", &[scalar("num_parallel_calls", I32)]),
    ("ParallelMapDatasetV2", &[scalar("num_parallel_calls", I64)]),
    (
        "InterleaveDataset",
        &[scalar("cycle_length", I64), scalar("block_length", I64)],
    ),
    ("ParallelInterleaveDatasetV2", INTERLEAVE_V3),
    ("ParallelInterleaveDatasetV3", INTERLEAVE_V3),
    (
        "ParallelInterleaveDatasetV4",
        &[
            scalar("cycle_length", I64),
            scalar("block_length", I64),
            scalar("buffer_output_elements", I64),
            scalar("prefetch_input_elements", I64),
            scalar("num_parallel_calls", I64),
        ],
    ),
    (
        "ShuffleDataset",
        &[
            scalar("buffer_size", I64),
            scalar("seed", I64),
            scalar("seed2", I64),
        ],
    ),
    (
        "ShuffleDatasetV2",
        &[scalar("buffer_size", I64), scalar("seed_generator", R)],
    ),
    (
        "ShuffleDatasetV3",
        &[
            scalar("buffer_size", I64),
            scalar("seed", I64),
            scalar("seed2", I64),
            scalar("seed_generator", R),
        ],
    ),
    (
        "ShuffleAndRepeatDataset",
        &[
            scalar("buffer_size", I64),
            scalar("seed", I64),
            scalar("seed2", I64),
            scalar("count", I64),
        ],
    ),
    ("TFRecordDataset", READER),
    ("TextLineDataset", READER),
    (
        "FixedLengthRecordDatasetV2",
        &[
            vector("filenames", S),
            scalar("header_bytes", I64),
            scalar("record_bytes", I64),
            scalar("footer_bytes", I64),
            scalar("buffer_size", I64),
            scalar("compression_type", S),
        ],
    ),
    (
        "RangeDataset",
        &[
            scalar("start", I64),
            scalar("stop", I64),
            scalar("step", I64),
        ],
    ),
    (
        "TensorSliceDataset",
        &[Arg {
            name: "components",
            dtype: None,
            vector: true,
        }],
    ),
    (
        "CacheDatasetV2",
        &[scalar("filename", S), scalar("cache", R)],
    ),
];

fn args_of(op: &str) -> &'static [Arg] {
    ARGS.iter().find(|(o, _)| *o == op).map_or(&[], |(_, a)| a)
}

/// What the recording knows about one op's arguments.
pub(crate) struct Known<'a> {
    /// Model node name: its iterator prefix (`ForeverRepeat`, ...).
    pub model_name: &'a str,
    /// The parallelism TensorFlow ran the op with, when read.
    pub parallelism: Option<f64>,
    /// The fixed element ratio of the op's model node, when read: a
    /// batch's batch size.
    pub ratio: Option<f64>,
    /// A prefetch's buffer size (its model parameter), when read.
    pub buffer_size: Option<f64>,
    /// Files a reader op read (sorted).
    pub files: &'a [String],
    /// For a TensorSliceDataset feeding a function-owning op whose
    /// functions read files: those files (sorted).
    pub slice_files: Vec<String>,
}

enum Val {
    Int(i64),
    Strings(Vec<String>),
}

fn value(op: &str, arg: &Arg, k: &Known) -> Option<Val> {
    match arg.name {
        // The iterator prefix TensorFlow picked from the count: < 0 is
        // ForeverRepeat, 0 EmptyRepeat/EmptyTake/EmptySkip; Finite* says
        // only that it is positive.
        "count" if op != "ShuffleAndRepeatDataset" => {
            if k.model_name.starts_with("Forever") {
                Some(Val::Int(-1))
            } else if k.model_name.starts_with("Empty") {
                Some(Val::Int(0))
            } else {
                None
            }
        }
        // The value TensorFlow runs the op with (the model's parameter),
        // which is what an AUTOTUNE request (-1 in the program's graph)
        // resolved to at the window's end.
        "num_parallel_calls" if opnames::has_parallelism_knob(k.model_name) => k
            .parallelism
            .filter(|p| p.is_finite() && *p >= 1.0)
            .map(|p| Val::Int(p.round() as i64)),
        // A batch's model node is a known-ratio node whose ratio is the
        // batch size (TensorFlow builds it from the op's argument).
        "batch_size" => k.ratio.and_then(positive_int).map(Val::Int),
        // The value TensorFlow runs the prefetch with: an AUTOTUNE request
        // resolved to its current value, as for num_parallel_calls.
        "buffer_size" if op == "PrefetchDataset" => {
            k.buffer_size.and_then(positive_int).map(Val::Int)
        }
        "filenames" if !k.files.is_empty() => Some(Val::Strings(k.files.to_vec())),
        "components" if !k.slice_files.is_empty() => Some(Val::Strings(k.slice_files.clone())),
        _ => None,
    }
}

/// A whole number >= 1, as TensorFlow's model holds these in doubles.
fn positive_int(v: f64) -> Option<i64> {
    (v.is_finite() && v >= 1.0 && v.fract() == 0.0 && v <= i64::MAX as f64).then_some(v as i64)
}

fn attr(kind: AttrKind) -> AttrValue {
    AttrValue { value: Some(kind) }
}

fn shape(vector_len: Option<i64>) -> TensorShapeProto {
    TensorShapeProto {
        dim: vector_len
            .map(|size| Dim {
                size,
                name: String::new(),
            })
            .into_iter()
            .collect(),
        unknown_rank: false,
    }
}

fn const_node(name: String, v: Val, dtype: DataType) -> NodeDef {
    let mut t = TensorProto {
        dtype: dtype as i32,
        ..Default::default()
    };
    match v {
        Val::Int(i) => {
            t.tensor_shape = Some(shape(None));
            match dtype {
                DataType::DtInt32 => t.int_val.push(i32::try_from(i).unwrap_or(i32::MAX)),
                _ => t.int64_val.push(i),
            }
        }
        Val::Strings(s) => {
            t.tensor_shape = Some(shape(Some(i64::try_from(s.len()).unwrap_or(i64::MAX))));
            t.string_val = s.into_iter().map(String::into_bytes).collect();
        }
    }
    let attr = BTreeMap::from([
        ("dtype".to_string(), attr(AttrKind::Type(dtype as i32))),
        ("value".to_string(), attr(AttrKind::Tensor(t))),
    ]);
    NodeDef {
        name,
        op: "Const".to_string(),
        attr,
        ..Default::default()
    }
}

fn placeholder(name: String, arg: &Arg) -> NodeDef {
    let mut attr_map = BTreeMap::new();
    if let Some(d) = arg.dtype {
        attr_map.insert("dtype".to_string(), attr(AttrKind::Type(d as i32)));
    }
    let len = arg.vector.then_some(-1);
    attr_map.insert("shape".to_string(), attr(AttrKind::Shape(shape(len))));
    NodeDef {
        name,
        op: "Placeholder".to_string(),
        attr: attr_map,
        ..Default::default()
    }
}

/// The argument nodes of `node` (a dataset op already named, with its
/// dataset inputs), to be listed before it: appends their names to its
/// inputs and sets the attrs known along with them.
pub(crate) fn add_args(node: &mut NodeDef, k: &Known) -> Vec<NodeDef> {
    let mut out = Vec::new();
    for arg in args_of(&node.op) {
        let name = format!("{}/{}", node.name, arg.name);
        node.input.push(name.clone());
        match value(&node.op, arg, k) {
            Some(v) => {
                let dtype = arg.dtype.unwrap_or(DataType::DtString);
                if arg.name == "components" {
                    // One string component, a scalar per element.
                    let list = |l: ListValue| attr(AttrKind::List(l));
                    node.attr.insert(
                        "Toutput_types".to_string(),
                        list(ListValue {
                            r#type: vec![dtype as i32],
                            ..Default::default()
                        }),
                    );
                    node.attr.insert(
                        "output_shapes".to_string(),
                        list(ListValue {
                            shape: vec![shape(None)],
                            ..Default::default()
                        }),
                    );
                }
                out.push(const_node(name, v, dtype));
            }
            // Plumber reads these two counts as a Const's single int64 and
            // fails on any other node: an unknown count names no node, so
            // that Plumber logs "Failed to find" and goes on without it.
            None if arg.name == "count"
                && matches!(node.op.as_str(), "RepeatDataset" | "TakeDataset") => {}
            None => out.push(placeholder(name, arg)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str) -> NodeDef {
        NodeDef {
            name: format!("{op}/_1"),
            op: op.to_string(),
            input: vec!["In/_0".to_string()],
            ..Default::default()
        }
    }

    fn known(model_name: &str) -> Known<'_> {
        Known {
            model_name,
            parallelism: None,
            ratio: None,
            buffer_size: None,
            files: &[],
            slice_files: Vec::new(),
        }
    }

    fn tensor(n: &NodeDef) -> &TensorProto {
        match n.attr.get("value").and_then(|a| a.value.as_ref()) {
            Some(AttrKind::Tensor(t)) => t,
            other => panic!("no tensor value: {other:?}"),
        }
    }

    #[test]
    fn forever_repeat_count_is_a_minus_one_const() {
        let mut n = node("RepeatDataset");
        let args = add_args(&mut n, &known("ForeverRepeat"));
        assert_eq!(n.input, ["In/_0", "RepeatDataset/_1/count"]);
        assert_eq!(args.len(), 1);
        assert_eq!(args[0].op, "Const");
        assert_eq!(tensor(&args[0]).int64_val, [-1]);
        assert_eq!(tensor(&args[0]).dtype, DataType::DtInt64 as i32);
    }

    #[test]
    fn finite_count_is_named_but_has_no_node() {
        let mut n = node("TakeDataset");
        let args = add_args(&mut n, &known("FiniteTake"));
        assert_eq!(n.input, ["In/_0", "TakeDataset/_1/count"]);
        assert!(args.is_empty());
        let mut n = node("TakeDataset");
        let args = add_args(&mut n, &known("EmptyTake"));
        assert_eq!(tensor(&args[0]).int64_val, [0]);
    }

    #[test]
    fn unknown_scalars_are_typed_placeholders() {
        let mut n = node("BatchDatasetV2");
        let args = add_args(&mut n, &known("BatchV2"));
        let ops: Vec<&str> = args.iter().map(|a| a.op.as_str()).collect();
        assert_eq!(ops, ["Placeholder", "Placeholder"]);
        assert_eq!(
            args[1].attr.get("dtype").and_then(|a| a.value.clone()),
            Some(AttrKind::Type(DataType::DtBool as i32))
        );
        assert_eq!(n.input.len(), 3);
    }

    #[test]
    fn parallelism_and_files_are_consts() {
        let mut n = node("ParallelMapDatasetV2");
        let mut k = known("ParallelMapV2");
        k.parallelism = Some(2.0);
        let args = add_args(&mut n, &k);
        assert_eq!(tensor(&args[0]).int64_val, [2]);

        let mut n = node("TensorSliceDataset");
        let mut k = known("TensorSlice");
        k.slice_files = vec!["/a".into(), "/b".into()];
        let args = add_args(&mut n, &k);
        let t = tensor(&args[0]);
        assert_eq!(t.dtype, DataType::DtString as i32);
        assert_eq!(t.string_val, [b"/a".to_vec(), b"/b".to_vec()]);
        assert_eq!(t.tensor_shape.as_ref().map(|s| s.dim[0].size), Some(2));
        assert!(n.attr.contains_key("Toutput_types"));
    }

    #[test]
    fn batch_size_and_prefetch_buffer_are_consts_when_read() {
        for op in [
            "BatchDatasetV2",
            "PaddedBatchDatasetV2",
            "MapAndBatchDataset",
            "ParallelBatchDataset",
        ] {
            let mut n = node(op);
            let mut k = known("BatchV2");
            k.ratio = Some(16.0);
            let args = add_args(&mut n, &k);
            assert_eq!(args[0].name, format!("{op}/_1/batch_size"));
            assert_eq!(args[0].op, "Const", "{op}");
            assert_eq!(tensor(&args[0]).int64_val, [16], "{op}");
            // drop_remainder stays unknown.
            let last = args.last().map(|a| a.op.as_str());
            if op != "PaddedBatchDatasetV2" {
                assert_eq!(last, Some("Placeholder"), "{op}");
            }
        }
        let mut n = node("PrefetchDataset");
        let mut k = known("Prefetch");
        k.buffer_size = Some(2.0);
        let args = add_args(&mut n, &k);
        assert_eq!(args[0].op, "Const");
        assert_eq!(tensor(&args[0]).int64_val, [2]);
        assert_eq!(tensor(&args[0]).dtype, DataType::DtInt64 as i32);
    }

    #[test]
    fn odd_ratios_and_buffer_sizes_stay_placeholders() {
        for bad in [0.0, 0.5, 2.5, -1.0, f64::NAN, f64::INFINITY] {
            let mut n = node("BatchDatasetV2");
            let mut k = known("BatchV2");
            k.ratio = Some(bad);
            assert_eq!(add_args(&mut n, &k)[0].op, "Placeholder", "{bad}");
            let mut n = node("PrefetchDataset");
            let mut k = known("Prefetch");
            k.buffer_size = Some(bad);
            assert_eq!(add_args(&mut n, &k)[0].op, "Placeholder", "{bad}");
        }
        // A reader's or a shuffle's buffer_size is not a prefetch's.
        let mut n = node("ShuffleDataset");
        let mut k = known("Shuffle");
        k.buffer_size = Some(8.0);
        assert_eq!(add_args(&mut n, &k)[0].op, "Placeholder");
    }

    #[test]
    fn ops_without_scalar_arguments_get_none() {
        let mut n = node("MapDataset");
        assert!(add_args(&mut n, &known("Map")).is_empty());
        assert_eq!(n.input, ["In/_0"]);
    }
}
