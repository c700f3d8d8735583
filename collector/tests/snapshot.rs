mod common;

use common::*;
use plumber_collector::collect;
use plumber_collector::proto::attr_value::Value;
use plumber_collector::proto::pipeline_snapshot::OpStats;
use plumber_collector::proto::{GraphDef, NodeDef, PipelineSnapshot};
use plumber_collector::snapshot::{read_stats, write_stats, StatsError};
use prost::Message;

fn stat<'a>(s: &'a PipelineSnapshot, name: &str) -> &'a OpStats {
    s.stats
        .iter()
        .find(|o| o.name == name)
        .unwrap_or_else(|| panic!("no stats for {name}"))
}

/// The dataset nodes and `dataset` (the argument nodes, `Const` and
/// `Placeholder`, are checked apart).
fn datasets(nodes: &[NodeDef]) -> Vec<&NodeDef> {
    nodes
        .iter()
        .filter(|n| n.op.contains("Dataset") || n.op == "_Retval")
        .collect()
}

fn names(g: &GraphDef) -> Vec<&str> {
    datasets(&g.node).iter().map(|n| n.name.as_str()).collect()
}

/// Inputs naming dataset nodes (`<Op>/_<n>`), not arguments.
fn data_inputs(n: &NodeDef) -> Vec<&str> {
    n.input
        .iter()
        .map(String::as_str)
        .filter(|i| i.rsplit('/').next().is_some_and(|l| l.starts_with('_')))
        .collect()
}

#[test]
fn chain_graph_inputs_first() {
    let s = collect(chain_events()).unwrap().snapshot;
    let g = s.graph.as_ref().unwrap();
    assert_eq!(
        names(g),
        [
            "TFRecordDataset/_0",
            "ParallelMapDatasetV2/_1",
            "BatchDatasetV2/_2",
            "PrefetchDataset/_3",
            "dataset"
        ]
    );
    let nodes = datasets(&g.node);
    let ops: Vec<&str> = nodes.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(
        ops,
        [
            "TFRecordDataset",
            "ParallelMapDatasetV2",
            "BatchDatasetV2",
            "PrefetchDataset",
            "_Retval"
        ]
    );
    assert!(data_inputs(nodes[0]).is_empty());
    assert_eq!(data_inputs(nodes[1]), ["TFRecordDataset/_0"]);
    assert_eq!(data_inputs(nodes[2]), ["ParallelMapDatasetV2/_1"]);
    assert_eq!(data_inputs(nodes[3]), ["BatchDatasetV2/_2"]);
    assert_eq!(nodes[4].input, ["PrefetchDataset/_3"]);
    // Arguments follow the dataset inputs, each listed before its op.
    assert_eq!(
        nodes[2].input,
        [
            "ParallelMapDatasetV2/_1",
            "BatchDatasetV2/_2/batch_size",
            "BatchDatasetV2/_2/drop_remainder"
        ]
    );
    let arg = |name: &str| {
        let i = g.node.iter().position(|n| n.name == name);
        let of = g
            .node
            .iter()
            .position(|n| name.starts_with(&format!("{}/", n.name)));
        assert!(i < of, "{name} listed after its op");
        &g.node[i.expect("argument node")]
    };
    assert_eq!(arg("BatchDatasetV2/_2/batch_size").op, "Placeholder");
    assert_eq!(arg("PrefetchDataset/_3/buffer_size").op, "Placeholder");
    assert_eq!(arg("TFRecordDataset/_0/compression_type").op, "Placeholder");
    assert!(g.library.is_none());

    // One OpStats per node except `dataset`; Root has none.
    let stat_names: Vec<&str> = s.stats.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(stat_names, &names(g)[..4]);

    let b = stat(&s, "BatchDatasetV2/_2");
    assert_eq!(
        (b.elements_produced, b.aggregate_elements_produced),
        (1000, 1000)
    );
    assert_eq!(
        (b.processing_time, b.aggregate_processing_time),
        (3_000_000_000, 3_000_000_000)
    );
    assert_eq!(
        (b.bytes_produced, b.aggregate_bytes_produced),
        (100_000, 100_000)
    );
    assert_eq!(
        (b.bytes_consumed, b.aggregate_bytes_consumed),
        (10_000, 10_000)
    );
    assert_eq!(b.element_ratio, 32.0);
    assert_eq!((b.count, b.probe_instances), (1, 1));
    assert_eq!(b.cardinality, -2);
    assert_eq!(b.wallclock_time, 10_000_000_000);
    assert_eq!(
        (b.processing_time_clock, b.aggregate_processing_time_clock),
        (0, 0)
    );
    assert_eq!(b.probe_model_name, "BatchV2");
    assert_eq!(b.probe_path, P_BATCH);
    assert_eq!((b.parallelism, b.probe_parallelism), (1, 1.0));

    let m = stat(&s, "ParallelMapDatasetV2/_1");
    assert_eq!((m.parallelism, m.probe_parallelism), (3, 2.5));
    assert_eq!(
        (
            m.aggregate_max_buffer_size,
            m.probe_buffered_elements,
            m.probe_buffered_bytes
        ),
        (16, 16, 1600)
    );
    assert_eq!(stat(&s, "TFRecordDataset/_0").element_ratio, -1.0);
    assert_eq!(stat(&s, "PrefetchDataset/_3").aggregate_max_buffer_size, 8);

    let mi = s.machine_info.unwrap();
    assert_eq!(
        (mi.num_cores, mi.memory_total, mi.memory_free),
        (16, 64 << 30, 32 << 30)
    );
    let si = s.snapshot_info.unwrap();
    assert_eq!(si.start_time, WALL0 as i64);
    assert_eq!(si.current_time, (WALL0 + 10 * SEC) as i64);
    assert_eq!(si.process_start_time, CPU0 as i64);
    assert_eq!(si.process_current_time, (CPU0 + 20 * SEC) as i64);
    let it = s.iter_stats.unwrap();
    assert_eq!(
        (
            it.avg_duration,
            it.var_duration,
            it.avg_wallclock_duration,
            it.autotune_output_time
        ),
        (-1.0, -1.0, -1.0, 0.0)
    );
    let pi = s.probe_info.as_ref().unwrap();
    assert_eq!(
        (pi.mode.as_str(), pi.pid, pi.tensorflow_version.as_str()),
        ("model", 4242, "2.21.0")
    );
    assert_eq!(pi.libraries.len(), 1);
    assert!(!pi.partial);
    assert_eq!(pi.tool_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(s.probe_drops.len(), 1);
    assert_eq!(
        (s.probe_drops[0].what.as_str(), s.probe_drops[0].count),
        ("ringbuf", 3)
    );
}

#[test]
fn flatmap_function_library() {
    let s = collect(flatmap_events()).unwrap().snapshot;
    let g = s.graph.as_ref().unwrap();
    assert_eq!(
        names(g),
        [
            "TensorSliceDataset/_0",
            "FlatMapDataset/_1",
            "ParallelMapDatasetV2/_2",
            "BatchDatasetV2/_3",
            "PrefetchDataset/_4",
            "dataset"
        ]
    );
    let fm = datasets(&g.node)[1];
    assert_eq!(
        data_inputs(fm),
        ["TensorSliceDataset/_0"],
        "function datasets are not inputs"
    );
    let Some(Value::Func(f)) = &fm.attr["f"].value else {
        panic!("FlatMap has no function attr: {:?}", fm.attr);
    };
    assert_eq!(f.name, "FlatMapDataset_1_fn");
    let lib = g.library.as_ref().unwrap();
    assert_eq!(lib.function.len(), 1);
    let func = &lib.function[0];
    assert_eq!(func.signature.as_ref().unwrap().name, "FlatMapDataset_1_fn");
    let fnodes: Vec<&str> = datasets(&func.node_def)
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(fnodes, ["TFRecordDataset/_5"]);
    assert_eq!(datasets(&func.node_def)[0].op, "TFRecordDataset");

    let t = stat(&s, "TFRecordDataset/_5");
    assert_eq!(t.aggregate_elements_produced, 2700);
    assert_eq!((t.count, t.probe_instances), (4, 4));
    assert_eq!(
        t.wallclock_time, 10_000_000_000,
        "one live instance at the end"
    );
    assert_eq!(t.probe_path, P_FTFREC);
    assert_eq!(stat(&s, "FlatMapDataset/_1").element_ratio, 0.005);
    assert_eq!(s.stats.len(), 6);
    assert!(s
        .probe_drops
        .iter()
        .any(|d| d.what == "retired_node_unplaced" && d.count == 1));
}

#[test]
fn nested_function_ops_go_to_the_library() {
    // An interleave whose function builds Map(TFRecord): Map is the function
    // dataset, TFRecord its input inside the same function.
    let at = |k: i64| {
        vec![
            node(1, 1, "Root", "Root", None, c(10 * k, 0)),
            with_par(
                node(
                    2,
                    2,
                    "ParallelInterleaveV4",
                    "Root::PI",
                    Some(1),
                    c(10 * k, 0),
                ),
                8.0,
            ),
            node(
                3,
                3,
                "TensorSlice",
                "Root::PI::TensorSlice",
                Some(2),
                c(k, 0),
            ),
            fn_node(4, 4, "Map", "Root::PI::Map", Some(2), c(10 * k, 0)),
            node(
                5,
                5,
                "TFRecord",
                "Root::PI::Map::TFRecord",
                Some(4),
                c(10 * k, 0),
            ),
        ]
    };
    let s = collect([poll(0, at(0)), poll(1, at(1))]).unwrap().snapshot;
    let g = s.graph.as_ref().unwrap();
    assert_eq!(
        names(g),
        [
            "TensorSliceDataset/_0",
            "ParallelInterleaveDatasetV4/_1",
            "dataset"
        ]
    );
    let func = &g.library.as_ref().unwrap().function[0];
    assert_eq!(
        func.signature.as_ref().unwrap().name,
        "ParallelInterleaveDatasetV4_1_fn"
    );
    let fnodes: Vec<(&str, Vec<&str>)> = datasets(&func.node_def)
        .into_iter()
        .map(|n| (n.name.as_str(), data_inputs(n)))
        .collect();
    assert_eq!(
        fnodes,
        [
            ("TFRecordDataset/_2", vec![]),
            ("MapDataset/_3", vec!["TFRecordDataset/_2"])
        ]
    );
    assert_eq!(
        stat(&s, "ParallelInterleaveDatasetV4/_1").probe_parallelism,
        8.0
    );
    // The parallelism read is the op's num_parallel_calls argument.
    let npc = g
        .node
        .iter()
        .find(|n| n.name == "ParallelInterleaveDatasetV4/_1/num_parallel_calls")
        .expect("num_parallel_calls node");
    assert_eq!(npc.op, "Const");
    let Some(Value::Tensor(t)) = &npc.attr["value"].value else {
        panic!("no value: {npc:?}");
    };
    assert_eq!(t.int64_val, [8]);
    assert_eq!(
        stat(&s, "ParallelInterleaveDatasetV4/_1").element_ratio,
        0.1
    );
    assert_eq!(s.stats.len(), 4);
}

#[test]
fn unknown_parallelism_of_a_knob_op() {
    let at = |k: i64| {
        vec![
            node(1, 1, "Root", "Root", None, c(k, 0)),
            node(
                2,
                2,
                "ParallelMapV2",
                "Root::ParallelMapV2",
                Some(1),
                c(k, 0),
            ),
        ]
    };
    let s = collect([poll(0, at(0)), poll(1, at(5))]).unwrap().snapshot;
    let m = stat(&s, "ParallelMapDatasetV2/_0");
    assert_eq!((m.parallelism, m.probe_parallelism), (1, 0.0));
}

#[test]
fn protobuf_round_trip() {
    let s = collect(flatmap_events()).unwrap().snapshot;
    let bytes = s.encode_to_vec();
    assert_eq!(PipelineSnapshot::decode(bytes.as_slice()).unwrap(), s);

    let dir = scratch_dir("roundtrip");
    let path = dir.join("stats.pb");
    write_stats(&path, &s).unwrap();
    assert_eq!(read_stats(&path).unwrap(), s);
    // Overwrite in place, and leave no temporary file behind.
    write_stats(&path, &s).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files, ["stats.pb"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn write_into_missing_dir_fails_cleanly() {
    let dir = scratch_dir("missingdir");
    let path = dir.join("nope").join("stats.pb");
    let s = collect(chain_events()).unwrap().snapshot;
    let e = write_stats(&path, &s).unwrap_err();
    assert!(matches!(e, StatsError::Write { .. }), "{e:?}");
    assert!(e.to_string().contains("stats.pb"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn read_stats_errors() {
    let dir = scratch_dir("readerrors");
    let good = collect(chain_events()).unwrap().snapshot;
    let bytes = good.encode_to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty.pb", vec![]),
        ("garbage.pb", b"garbage text, not a protobuf\n".to_vec()),
        ("ff.pb", vec![0xff; 16]),
        ("truncated.pb", bytes[..bytes.len() - 1].to_vec()),
        (
            "nograph.pb",
            PipelineSnapshot {
                graph: None,
                ..good.clone()
            }
            .encode_to_vec(),
        ),
        (
            "nostats.pb",
            PipelineSnapshot {
                stats: vec![],
                ..good.clone()
            }
            .encode_to_vec(),
        ),
    ];
    for (name, content) in &cases {
        std::fs::write(dir.join(name), content).unwrap();
    }
    let err = |name: &str| read_stats(dir.join(name)).unwrap_err();
    for (name, _) in &cases {
        let msg = err(name).to_string();
        assert!(msg.contains(name), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
    }
    assert!(matches!(err("empty.pb"), StatsError::Empty { .. }));
    assert!(err("empty.pb").to_string().contains("empty file"));
    assert!(
        matches!(err("garbage.pb"), StatsError::Decode { .. }),
        "{:?}",
        err("garbage.pb")
    );
    assert!(matches!(err("ff.pb"), StatsError::Decode { .. }));
    assert!(matches!(err("truncated.pb"), StatsError::Decode { .. }));
    assert!(err("truncated.pb").to_string().contains("truncated"));
    assert!(matches!(err("nograph.pb"), StatsError::NoGraph { .. }));
    assert!(err("nograph.pb").to_string().contains("no graph"));
    assert!(matches!(err("nostats.pb"), StatsError::NoStats { .. }));
    assert!(err("nostats.pb").to_string().contains("no op stats"));
    // Any cut through the file is an error, never a panic.
    for cut in (1..bytes.len()).step_by(7) {
        std::fs::write(dir.join("cut.pb"), &bytes[..cut]).unwrap();
        let _ = read_stats(dir.join("cut.pb"));
    }
    assert!(matches!(
        read_stats(dir.join("missing.pb")),
        Err(StatsError::Read { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_parent_cycle_keeps_every_op() {
    // Two nodes naming each other as parent (bad reads): no top op, but
    // their counts must still be in the file, the table and the report.
    let at = |k: i64| {
        vec![
            node(1, 1, "Map", "A", Some(2), c(k, 0)),
            node(2, 2, "Range", "B", Some(1), c(2 * k, 0)),
        ]
    };
    let got = collect([poll(0, at(0)), poll(1, at(3))]).unwrap();
    let s = &got.snapshot;
    let mut paths: Vec<(String, i64)> = s
        .stats
        .iter()
        .map(|o| (o.probe_path.clone(), o.aggregate_elements_produced))
        .collect();
    paths.sort();
    assert_eq!(paths, [("A".to_string(), 3), ("B".to_string(), 6)]);
    assert_eq!(
        s.graph.as_ref().unwrap().node.last().unwrap().name,
        "dataset"
    );
    assert_eq!(got.table().lines().count(), 3);
    assert_eq!(got.report().nodes.len(), 2);
}

/// The int64 value of the argument node `name`, None for a Placeholder.
fn const_arg(g: &GraphDef, name: &str) -> Option<i64> {
    let n = g.node.iter().find(|n| n.name == name).expect(name);
    match n.attr.get("value").and_then(|v| v.value.as_ref()) {
        Some(Value::Tensor(t)) if n.op == "Const" => t.int64_val.first().copied(),
        _ => None,
    }
}

#[test]
fn batch_size_and_prefetch_buffer_from_the_recording() {
    // Read on the middle poll only (the last instance's batch had too few
    // batches to check): the latest value read is kept.
    let mut evs = chain_events();
    if let Some(plumber_collector::event::Event::Poll(p)) = evs.get_mut(2) {
        for n in &mut p.nodes {
            match n.name.as_str() {
                "BatchV2" => n.ratio = Some(16.0),
                "Prefetch" => n.buffer_size = Some(2.0),
                _ => {}
            }
        }
    }
    let s = collect(evs).unwrap().snapshot;
    let g = s.graph.as_ref().unwrap();
    assert_eq!(const_arg(g, "BatchDatasetV2/_2/batch_size"), Some(16));
    assert_eq!(const_arg(g, "PrefetchDataset/_3/buffer_size"), Some(2));
    // Nothing tells drop_remainder.
    assert_eq!(const_arg(g, "BatchDatasetV2/_2/drop_remainder"), None);

    // A recording without them (an older one) keeps Placeholders.
    let s = collect(chain_events()).unwrap().snapshot;
    let g = s.graph.as_ref().unwrap();
    assert_eq!(const_arg(g, "BatchDatasetV2/_2/batch_size"), None);
    assert_eq!(const_arg(g, "PrefetchDataset/_3/buffer_size"), None);
}
