mod common;

use common::*;
use plumber_collector::collect;
use plumber_collector::proto::pipeline_snapshot::OpStats;
use plumber_collector::proto::{GraphDef, NodeDef, PipelineSnapshot};
use plumber_collector::report::{measured, MeasuredNode, ReportDrop};

fn find<'a>(nodes: &'a [MeasuredNode], name: &str) -> &'a MeasuredNode {
    nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

#[test]
fn measured_from_our_snapshot() {
    let got = collect(flatmap_events()).unwrap();
    let r = got.report();
    assert_eq!(r, measured(&got.snapshot));
    assert_eq!(r.target.pid, 4242);
    assert_eq!(r.target.tensorflow_version, "2.21.0");
    assert_eq!(r.target.libraries.len(), 1);
    assert_eq!(r.mode, "model");
    assert_eq!(r.window.start_ns, WALL0 as i64);
    assert_eq!(r.window.end_ns, (WALL0 + 10 * SEC) as i64);
    assert!(!r.window.partial);
    assert_eq!(r.nodes.len(), 6);

    let parents: Vec<(&str, Option<&str>)> = r
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.parent.as_deref()))
        .collect();
    assert_eq!(
        parents,
        [
            ("TensorSliceDataset/_0", Some("FlatMapDataset/_1")),
            ("FlatMapDataset/_1", Some("ParallelMapDatasetV2/_2")),
            ("ParallelMapDatasetV2/_2", Some("BatchDatasetV2/_3")),
            ("BatchDatasetV2/_3", Some("PrefetchDataset/_4")),
            ("PrefetchDataset/_4", Some("dataset")),
            ("TFRecordDataset/_5", Some("FlatMapDataset/_1")),
        ]
    );
    let t = find(&r.nodes, "TFRecordDataset/_5");
    assert_eq!(t.op, "TFRecordDataset");
    assert_eq!(t.path, P_FTFREC);
    assert_eq!(t.elements_produced, 2700);
    assert_eq!(t.wall_ns, 27_000_000);
    assert_eq!(t.bytes_produced, 270_000);
    assert_eq!(t.buffered_elements, 1);
    assert_eq!(t.parallelism, 1.0);
    assert_eq!(find(&r.nodes, "ParallelMapDatasetV2/_2").parallelism, 4.0);
    assert!(r.drops.contains(&ReportDrop {
        what: "retired_node_unplaced".to_string(),
        count: 1
    }));
    // Serializes (the analyzer flattens these fields into report.json).
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"mode\":\"model\""));
}

#[test]
fn measured_from_a_plumber_file() {
    // What Plumber's TensorFlow writes: no probe fields, Consts in the graph,
    // parallelism only as an integer, buffers only as aggregate_max_buffer_size.
    let node = |name: &str, op: &str, input: &[&str]| NodeDef {
        name: name.to_string(),
        op: op.to_string(),
        input: input.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let snap = PipelineSnapshot {
        graph: Some(GraphDef {
            node: vec![
                node("Const/_0", "Const", &[]),
                node("TFRecordDataset/_1", "TFRecordDataset", &["Const/_0"]),
                node("Const/_2", "Const", &[]),
                node(
                    "ParallelMapDatasetV2/_3",
                    "ParallelMapDatasetV2",
                    &["TFRecordDataset/_1", "Const/_2"],
                ),
                node("dataset", "_Retval", &["ParallelMapDatasetV2/_3"]),
            ],
            ..Default::default()
        }),
        stats: vec![
            OpStats {
                name: "ParallelMapDatasetV2/_3".to_string(),
                aggregate_elements_produced: 10,
                aggregate_processing_time: 1000,
                parallelism: 6,
                aggregate_max_buffer_size: 12,
                aggregate_bytes_produced: 99,
                ..Default::default()
            },
            OpStats {
                name: "TFRecordDataset/_1".to_string(),
                aggregate_elements_produced: 10,
                parallelism: 1,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let r = measured(&snap);
    assert_eq!(r.target.pid, 0);
    assert_eq!(r.target.tensorflow_version, "");
    assert!(r.target.libraries.is_empty());
    assert_eq!(r.mode, "");
    assert_eq!(
        (r.window.start_ns, r.window.end_ns, r.window.partial),
        (0, 0, false)
    );
    let m = find(&r.nodes, "ParallelMapDatasetV2/_3");
    assert_eq!(m.parent.as_deref(), Some("dataset"));
    assert_eq!(m.op, "ParallelMapDatasetV2");
    assert_eq!(m.path, "");
    assert_eq!(
        (
            m.elements_produced,
            m.wall_ns,
            m.parallelism,
            m.buffered_elements,
            m.bytes_produced
        ),
        (10, 1000, 6.0, 12, 99)
    );
    let t = find(&r.nodes, "TFRecordDataset/_1");
    assert_eq!(t.parent.as_deref(), Some("ParallelMapDatasetV2/_3"));
    assert!(r.drops.is_empty());
}

#[test]
fn measured_from_an_empty_snapshot_does_not_panic() {
    let r = measured(&PipelineSnapshot::default());
    assert!(r.nodes.is_empty());
}

#[test]
fn not_measured_travels_from_the_source_to_stats_pb_and_report_json() {
    use plumber_collector::event::Event;
    use plumber_collector::report::not_measured_note;
    use prost::Message;

    let missing = vec!["lock waits".to_string(), "wait call sites".to_string()];
    let events: Vec<Event> = flatmap_events()
        .into_iter()
        .map(|e| match e {
            Event::Target(mut t) => {
                t.not_measured = missing.clone();
                Event::Target(t)
            }
            e => e,
        })
        .collect();
    let got = collect(events).unwrap();
    // Through the stats.pb bytes, as `analyze` reads it.
    let back = PipelineSnapshot::decode(got.snapshot.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back.probe_info.unwrap().not_measured, missing);
    let r = measured(&got.snapshot);
    assert_eq!(r.not_measured, missing);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["not_measured"][0], "lock waits");
    let note = not_measured_note(&r.not_measured);
    assert!(note.starts_with("NOT MEASURED"));
    assert!(note.contains("  - wait call sites\n"));

    // `--pid` mode measures everything: no key, no note.
    let full = collect(flatmap_events()).unwrap().report();
    assert!(full.not_measured.is_empty());
    assert!(serde_json::to_value(&full)
        .unwrap()
        .get("not_measured")
        .is_none());
    assert_eq!(not_measured_note(&full.not_measured), "");
}

/// The summary is the report less its `nodes`, field for field, and reads
/// back from a report.json that has `nodes`.
#[test]
fn summary_is_the_report_without_nodes() {
    let r = collect(flatmap_events()).unwrap().report();
    let mut full = serde_json::to_value(&r).unwrap();
    let (summary, nodes) = r.clone().split_nodes();
    assert_eq!(nodes, r.nodes);
    full.as_object_mut().unwrap().remove("nodes");
    let text = serde_json::to_string(&summary).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        full
    );
    let back: plumber_collector::report::MeasuredSummary =
        serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
    assert_eq!(back, summary);
}

#[test]
fn the_cost_line_names_its_parts() {
    use plumber_collector::report::ReportOverhead;
    let pid = ReportOverhead {
        target_share: 0.006,
        target_cpu_ns: 1_000_000_000,
        bpf_ns: 2_000_000,
        trap_ns: 3_000_000,
        probe_cpu_ns: 1_000_000,
        budget: 0.01,
        ..Default::default()
    };
    assert_eq!(
        pid.line(),
        "probe cost: 0.60% of the target's CPU (in-target BPF 0.20%, uprobe traps 0.30%, probe process 0.10%); budget 1%"
    );
    // `run`: no BPF, no traps; the shim's hooks instead.
    let run = ReportOverhead {
        target_share: 0.012,
        target_cpu_ns: 1_000_000_000,
        shim_ns: 7_000_000,
        probe_cpu_ns: 5_000_000,
        budget: 0.01,
        ..Default::default()
    };
    assert_eq!(
        run.line(),
        "probe cost: 1.20% of the target's CPU (shim hooks 0.70%, probe process 0.50%); budget 1% — OVER BUDGET"
    );
}
