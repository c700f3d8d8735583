//! Every test workload: tree, per-op counts over the window, parallelism.

use plumber_collector::proto::PipelineSnapshot;

use crate::harness::*;
use crate::plumber_ref::plumber_agrees;

/// What a workload's reconstructed pipeline must look like.
pub(crate) struct Expect {
    pub(crate) script: &'static str,
    pub(crate) args: &'static [&'static str],
    /// Ops from the top op down through first inputs.
    pub(crate) chain: &'static [&'static str],
    /// (owner op, op) pairs of datasets built inside functions.
    pub(crate) functions: &'static [(&'static str, &'static str)],
    /// (op, ground-truth key): op's elements over the window vs the
    /// workload's own count (`root` = elements the loop consumed, `elems` =
    /// elements before batching).
    pub(crate) counts: &'static [(&'static str, &'static str)],
    /// (op, parallelism TensorFlow uses).
    pub(crate) parallelism: &'static [(&'static str, f64)],
    /// (op, argument, value): arguments the stats.pb must carry as a
    /// `Const` with the workload's own configuration (its `--batch`, its
    /// `prefetch(n)`); None for a value TensorFlow autotunes, which must
    /// be a positive Const.
    pub(crate) arguments: &'static [(&'static str, &'static str, Option<i64>)],
    /// Recording window. An op's count over a window differs from what the
    /// training loop consumed by the change in the elements buffered
    /// between them; ops under autotuned buffers (an interleave's per-cycle
    /// buffers) need a longer window for that to stay well under 1%.
    pub(crate) seconds: f64,
}

/// Every workload, for tests that go through all of them.
pub(crate) const ALL: [&Expect; 6] = [
    &TFRECORD_IMAGE,
    &INTERLEAVE,
    &SEQUENTIAL_MAP,
    &PADDED_BATCH,
    &PY_FUNCTION,
    &DEMO,
];

fn check(e: &Expect) {
    let w = Workload::start(e.script, e.args);
    let out = tempdir(e.script.trim_end_matches(".py"));
    let s = record(&w, e.seconds, &out, &[]);
    let g = Graph::of(&s);
    assert_eq!(g.chain(), e.chain, "{}: op chain", e.script);
    for (owner, op) in e.functions {
        let owners = g.by_op(owner);
        assert!(!owners.is_empty(), "{}: no {owner}", e.script);
        assert!(
            g.nodes.iter().any(|n| n.1 == *op && n.3),
            "{}: no {op} inside a function of {owner}",
            e.script
        );
    }
    assert_counts(e, &w, &s, "");
    for (op, p) in e.parallelism {
        let n = g.by_op(op);
        let st = stat(&s, &n[0].0);
        assert_eq!(st.probe_parallelism, *p, "{}: {op} parallelism", e.script);
        assert_eq!(st.parallelism, *p as i64);
    }
    for (op, arg, want) in e.arguments {
        let got = const_arg(&s, op, arg);
        eprintln!("{}: {op} {arg} = {got:?}", e.script);
        match want {
            Some(v) => assert_eq!(got, Some(*v), "{}: {op} {arg}", e.script),
            None => assert!(
                got.is_some_and(|v| v >= 1),
                "{}: {op} {arg} {got:?}",
                e.script
            ),
        }
    }
    let probe = s.probe_info.as_ref().expect("probe_info");
    assert_eq!(probe.mode, "model");
    assert!(!probe.partial);
    // Plumber's own analysis loads the same file and agrees with ours;
    // the workload is stopped first so that it does not compete for CPU.
    drop(w);
    let agreed = plumber_agrees(
        &python(),
        &repo(),
        &out.join("stats.pb"),
        &out.join("report.json"),
        e.script,
    );
    eprintln!("{agreed}");
    let _ = std::fs::remove_dir_all(out);
}

/// The int64 `Const` argument `arg` of the first main-graph `op`, or None
/// where it is a Placeholder or missing.
fn const_arg(s: &PipelineSnapshot, op: &str, arg: &str) -> Option<i64> {
    use plumber_collector::proto::attr_value::Value;
    let g = s.graph.as_ref().expect("graph");
    let node = g.node.iter().find(|n| n.op == op)?;
    let a = g
        .node
        .iter()
        .find(|n| n.name == format!("{}/{arg}", node.name) && n.op == "Const")?;
    match a.attr.get("value").and_then(|v| v.value.as_ref()) {
        Some(Value::Tensor(t)) => t.int64_val.first().copied(),
        _ => None,
    }
}

/// Each op's elements over the window of `s` against what the workload
/// counted itself, within 1%. `who` names the mode in messages.
///
/// An op under a Prefetch runs ahead of the training loop by what that
/// buffer holds: its count may exceed the loop's by the elements buffered
/// above it at the window's end. That matters where the window ends after
/// the loop stopped taking elements (`plumber-probe run`'s recording ends
/// with the workload, whose autotuned Prefetch then fills: padded_batch's
/// held 396 batches, and its Repeat read 1.26% over the loop's count).
pub(crate) fn assert_counts(e: &Expect, w: &Workload, s: &PipelineSnapshot, who: &str) {
    let g = Graph::of(s);
    for (op, key) in e.counts {
        let want = w.counted_in_window(s, key);
        let nodes = g.by_op(op);
        assert!(!nodes.is_empty(), "{}{who}: no {op} node", e.script);
        let got: i64 = nodes
            .iter()
            .map(|n| stat(s, &n.0).aggregate_elements_produced)
            .sum();
        assert_eq!(
            got,
            nodes
                .iter()
                .map(|n| stat(s, &n.0).elements_produced)
                .sum::<i64>()
        );
        let got = got as f64;
        let ahead = buffered_above(&g, s, &nodes, got);
        if ahead > 0.0 {
            eprintln!(
                "{}{who} {op}: {got:.0} elements, up to {ahead:.0} of them buffered above it at the end",
                e.script
            );
        }
        // Counted as the loop's count where the buffer explains the excess.
        let got = if got > want {
            (got - ahead).max(want)
        } else {
            got
        };
        assert_close(&format!("{}{who} {op} elements", e.script), got, want, 0.01);
    }
}

/// Elements (in `ops`' units, whose total is `got`) held at the window's
/// end in the buffers of the Prefetch ops above `ops`.
fn buffered_above(
    g: &Graph,
    s: &PipelineSnapshot,
    ops: &[&(String, String, Vec<String>, bool)],
    got: f64,
) -> f64 {
    let names: Vec<&str> = ops.iter().map(|n| n.0.as_str()).collect();
    g.nodes
        .iter()
        .filter(|p| p.1 == "PrefetchDataset" && names.iter().any(|n| g.reaches(&p.0, n)))
        .map(|p| {
            let st = stat(s, &p.0);
            // Buffered elements are the Prefetch's own (batches above a
            // batch op): in `ops`' units by the two counts' ratio.
            st.probe_buffered_elements as f64 * got / (st.elements_produced.max(1) as f64)
        })
        .sum()
}

pub(crate) const TFRECORD_IMAGE: Expect = Expect {
    script: "tfrecord_image.py",
    args: &["--seconds", "90"],
    chain: &[
        "PrefetchDataset",
        "BatchDatasetV2",
        "ParallelMapDatasetV2",
        "RepeatDataset",
        "FlatMapDataset",
        "TensorSliceDataset",
    ],
    functions: &[("FlatMapDataset", "TFRecordDataset")],
    counts: &[
        ("PrefetchDataset", "root"),
        ("BatchDatasetV2", "root"),
        ("ParallelMapDatasetV2", "elems"),
        ("TFRecordDataset", "elems"),
    ],
    parallelism: &[],
    arguments: &[
        ("BatchDatasetV2", "batch_size", Some(16)),
        ("PrefetchDataset", "buffer_size", None),
    ],
    seconds: 8.0,
};

#[test]
fn tfrecord_image() {
    check(&TFRECORD_IMAGE);
}

pub(crate) const INTERLEAVE: Expect = Expect {
    script: "interleave.py",
    args: &["--seconds", "90"],
    chain: &[
        "PrefetchDataset",
        "BatchDatasetV2",
        "MapDataset",
        "RepeatDataset",
        "ParallelInterleaveDatasetV4",
        "TensorSliceDataset",
    ],
    functions: &[
        ("ParallelInterleaveDatasetV4", "FlatMapDataset"),
        ("FlatMapDataset", "TFRecordDataset"),
    ],
    counts: &[
        ("PrefetchDataset", "root"),
        ("BatchDatasetV2", "root"),
        ("MapDataset", "elems"),
        ("ParallelInterleaveDatasetV4", "elems"),
        ("TFRecordDataset", "elems"),
    ],
    parallelism: &[("MapDataset", 1.0)],
    arguments: &[
        ("BatchDatasetV2", "batch_size", Some(8)),
        ("PrefetchDataset", "buffer_size", Some(2)),
    ],
    seconds: 15.0,
};

#[test]
fn interleave() {
    check(&INTERLEAVE);
}

pub(crate) const SEQUENTIAL_MAP: Expect = Expect {
    script: "sequential_map.py",
    args: &["--seconds", "90"],
    chain: &[
        "PrefetchDataset",
        "BatchDatasetV2",
        "MapDataset",
        "RepeatDataset",
        "RangeDataset",
    ],
    functions: &[],
    counts: &[
        ("PrefetchDataset", "root"),
        ("BatchDatasetV2", "root"),
        ("MapDataset", "elems"),
        ("RangeDataset", "elems"),
    ],
    parallelism: &[("MapDataset", 1.0)],
    arguments: &[
        ("BatchDatasetV2", "batch_size", Some(32)),
        ("PrefetchDataset", "buffer_size", Some(1)),
    ],
    seconds: 8.0,
};

#[test]
fn sequential_map() {
    check(&SEQUENTIAL_MAP);
}

pub(crate) const PADDED_BATCH: Expect = Expect {
    script: "padded_batch.py",
    args: &["--seconds", "90"],
    chain: &[
        "PrefetchDataset",
        "RepeatDataset",
        "PaddedBatchDatasetV2",
        "MapDataset",
        "RangeDataset",
    ],
    functions: &[],
    counts: &[
        ("PrefetchDataset", "root"),
        ("RepeatDataset", "root"),
        ("PaddedBatchDatasetV2", "root"),
        ("MapDataset", "elems"),
        ("RangeDataset", "elems"),
    ],
    parallelism: &[],
    arguments: &[("PaddedBatchDatasetV2", "batch_size", Some(8))],
    seconds: 8.0,
};

#[test]
fn padded_batch_repeat() {
    check(&PADDED_BATCH);
}

pub(crate) const PY_FUNCTION: Expect = Expect {
    script: "py_function.py",
    args: &["--seconds", "90"],
    chain: &[
        "PrefetchDataset",
        "RepeatDataset",
        "PrefetchDataset",
        "BatchDatasetV2",
        "ParallelMapDatasetV2",
        "RangeDataset",
    ],
    functions: &[],
    counts: &[
        ("RepeatDataset", "root"),
        ("BatchDatasetV2", "root"),
        ("ParallelMapDatasetV2", "elems"),
        ("RangeDataset", "elems"),
    ],
    // num_parallel_calls=2 in the workload: the value TensorFlow uses.
    parallelism: &[("ParallelMapDatasetV2", 2.0)],
    // Its Prefetch is under the repeat, a new iterator every epoch, which
    // the first discovery may not see: its buffer size is not checked.
    arguments: &[("BatchDatasetV2", "batch_size", Some(8))],
    seconds: 8.0,
};

#[test]
fn py_function_map() {
    check(&PY_FUNCTION);
}

pub(crate) const DEMO: Expect = Expect {
    script: "demo.py",
    args: &["--seconds", "90"],
    chain: &[
        "BatchDatasetV2",
        "ParallelMapDatasetV2",
        "RepeatDataset",
        "FlatMapDataset",
        "TensorSliceDataset",
    ],
    functions: &[("FlatMapDataset", "TFRecordDataset")],
    counts: &[
        ("BatchDatasetV2", "root"),
        ("ParallelMapDatasetV2", "elems"),
        ("TFRecordDataset", "elems"),
    ],
    parallelism: &[("ParallelMapDatasetV2", 1.0)],
    arguments: &[("BatchDatasetV2", "batch_size", Some(16))],
    seconds: 8.0,
};

#[test]
fn demo_parallelism_is_what_the_code_says() {
    check(&DEMO);
}
