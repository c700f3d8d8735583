//! stats.pb read by an independent decoder, and the uprobe fallback mode.

use std::process::Command;

use crate::harness::*;

/// Python protobuf with Plumber's schema built at run time and TensorFlow's
/// own GraphDef (tests/python/decode_stats.py): no code shared with prost.
#[test]
fn stats_pb_decodes_with_an_independent_decoder() {
    let w = Workload::start("tfrecord_image.py", &["--seconds", "60"]);
    let out = tempdir("indep");
    let s = record(&w, 4.0, &out, &[]);
    let o = Command::new(python())
        .arg(repo().join("tests/python/decode_stats.py"))
        .arg(out.join("stats.pb"))
        .output()
        .expect("run decode_stats.py");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let nodes = v["graph"]["nodes"].as_array().expect("nodes");
    let ours = s.graph.as_ref().expect("graph");
    assert_eq!(nodes.len(), ours.node.len());
    for (theirs, mine) in nodes.iter().zip(&ours.node) {
        assert_eq!(theirs["name"], mine.name.as_str());
        assert_eq!(theirs["op"], mine.op.as_str());
    }
    assert_eq!(nodes.last().expect("last")["op"], "_Retval");
    for st in &s.stats {
        let t = &v["stats"][st.name.as_str()];
        assert_eq!(t["aggregate_elements_produced"].as_i64(), Some(st.aggregate_elements_produced), "{}", st.name);
        assert_eq!(t["processing_time"].as_i64(), Some(st.processing_time), "{}", st.name);
    }
    let mi = &v["machine_info"];
    assert!(mi["num_cores"].as_i64().unwrap_or(0) >= 1);
    assert!(mi["memory_total"].as_i64().unwrap_or(0) > 0);
    let si = &v["snapshot_info"];
    assert!(si["current_time"].as_i64() > si["start_time"].as_i64());
    // Our >= 1000 extension fields exist and are skipped by a Plumber reader.
    let skipped = &v["skipped_fields"];
    assert!(skipped["OpStats"].as_array().is_some_and(|a| a.iter().any(|n| n == 1001)), "{skipped}");
    assert!(skipped["PipelineSnapshot"].as_array().is_some_and(|a| a.iter().any(|n| n == 1000)), "{skipped}");
}

/// `--mode uprobes`: structure from iterator prefixes and counts from
/// GetNext returns, still matching what the workload counted.
#[test]
fn uprobe_fallback_mode() {
    let w = Workload::start("sequential_map.py", &["--seconds", "60"]);
    let out = tempdir("uprobes");
    let s = record(&w, 6.0, &out, &["--mode", "uprobes"]);
    assert_eq!(s.probe_info.as_ref().expect("probe_info").mode, "uprobes");
    let g = Graph::of(&s);
    assert_eq!(g.chain(), ["PrefetchDataset", "BatchDatasetV2", "MapDataset", "RepeatDataset", "RangeDataset"]);
    let info = s.snapshot_info.as_ref().expect("snapshot_info");
    w.wait_gt_past(info.current_time);
    let want = w.gt_at(info.current_time, "elems") - w.gt_at(info.start_time, "elems");
    let map = g.by_op("MapDataset");
    assert_close("uprobes MapDataset elements", stat(&s, &map[0].0).elements_produced as f64, want, 0.01);
    let report = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    assert!(report.contains("\"mode\": \"uprobes\""));
}
