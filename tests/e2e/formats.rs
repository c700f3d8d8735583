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
        assert_eq!(
            t["aggregate_elements_produced"].as_i64(),
            Some(st.aggregate_elements_produced),
            "{}",
            st.name
        );
        assert_eq!(
            t["processing_time"].as_i64(),
            Some(st.processing_time),
            "{}",
            st.name
        );
    }
    let mi = &v["machine_info"];
    assert!(mi["num_cores"].as_i64().unwrap_or(0) >= 1);
    assert!(mi["memory_total"].as_i64().unwrap_or(0) > 0);
    let si = &v["snapshot_info"];
    assert!(si["current_time"].as_i64() > si["start_time"].as_i64());
    // Our >= 1000 extension fields exist and are skipped by a Plumber reader.
    let skipped = &v["skipped_fields"];
    assert!(
        skipped["OpStats"]
            .as_array()
            .is_some_and(|a| a.iter().any(|n| n == 1001)),
        "{skipped}"
    );
    assert!(
        skipped["PipelineSnapshot"]
            .as_array()
            .is_some_and(|a| a.iter().any(|n| n == 1000)),
        "{skipped}"
    );
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
    assert_eq!(
        g.chain(),
        [
            "PrefetchDataset",
            "BatchDatasetV2",
            "MapDataset",
            "RepeatDataset",
            "RangeDataset"
        ]
    );
    let want = w.counted_in_window(&s, "elems");
    let map = g.by_op("MapDataset");
    assert_close(
        "uprobes MapDataset elements",
        stat(&s, &map[0].0).elements_produced as f64,
        want,
        0.01,
    );
    let report = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    assert!(report.contains("\"mode\": \"uprobes\""));
}

/// The offsets derived from the pinned wheel's machine code (cold, no
/// cache) are the ones found by hand in the feasibility spike
/// (../shared/reference/tf-internals.md §2), and a second run hits the cache.
#[test]
fn layout_derived_from_the_pinned_wheel() {
    let w = Workload::start("sequential_map.py", &["--seconds", "60"]);
    let cache = tempdir("layout-cache");
    let inspect = || {
        let o = Command::new(probe_bin())
            .args(["inspect", "--pid", &w.pid.to_string()])
            .env("PLUMBER_PROBE_CACHE", &cache)
            .output()
            .expect("inspect");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("json")
    };
    let v = inspect();
    assert_eq!(v["tensorflow_version"], "2.21.0");
    assert_eq!(v["layout_cache_hit"], false);
    let n = &v["derived"]["node"];
    let want = [
        ("id", 0x10),
        ("name", 0x18),
        ("buffered_bytes", 0x40),
        ("buffered_elements", 0x50),
        ("bytes_consumed", 0x68),
        ("bytes_produced", 0x70),
        ("num_elements", 0x78),
        ("processing_time", 0x80),
        ("inputs", 0x100),
        ("output", 0x118),
    ];
    for (field, off) in want {
        assert_eq!(n[field], off, "model::Node::{field}");
    }
    let it = &v["derived"]["iter"];
    assert_eq!(it["node"], 0x8);
    assert_eq!(it["prefix"], 0x70);
    assert_eq!(it["parallelism"]["ParallelMapV2"], 0xb8);
    assert_eq!(inspect()["layout_cache_hit"], true);
}

/// `--save-events` keeps every observation; `replay` rebuilds the same
/// stats.pb from them without the target (the collector has no BPF
/// dependency).
#[test]
fn saved_events_replay_to_the_same_stats() {
    let w = Workload::start("sequential_map.py", &["--seconds", "60"]);
    let out = tempdir("replay");
    let recorded = record(&w, 3.0, &out, &["--save-events"]);
    drop(w);
    let again = out.join("again");
    let o = run_probe(&[
        "replay",
        out.join("events.jsonl").to_str().expect("utf8"),
        "--output",
        again.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(read_snapshot(&again.join("stats.pb")), recorded);
    for f in ["report.json", "report.txt", "pipeline.svg", "pipeline.dot"] {
        assert_eq!(
            std::fs::read(out.join(f)).expect(f),
            std::fs::read(again.join(f)).expect(f),
            "{f} differs after replay"
        );
    }
}

/// Autotune disabled: TensorFlow builds no model, so the default mode falls
/// back to uprobes by itself, says so, and still counts right.
#[test]
fn autotune_disabled_falls_back_to_uprobes() {
    let w = Workload::start("sequential_map.py", &["--seconds", "60", "--no-autotune"]);
    let out = tempdir("noautotune");
    let s = record(&w, 4.0, &out, &[]);
    assert_eq!(s.probe_info.as_ref().expect("probe_info").mode, "uprobes");
    let g = Graph::of(&s);
    let want = w.counted_in_window(&s, "elems");
    let map = g.by_op("MapDataset");
    assert_close(
        "no-autotune MapDataset elements",
        stat(&s, &map[0].0).elements_produced as f64,
        want,
        0.01,
    );
}
