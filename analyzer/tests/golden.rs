//! Golden reports: the worked example of plumber-model.md §9 and an
//! I/O-bound, a cache-fits, a cache-blocked-by-randomness and a GIL-bound
//! pipeline. Each case checks its key numbers here and compares report.txt,
//! report.json and pipeline.svg (and pipeline.dot) with the files under
//! tests/golden/<case>/. A missing golden file is created; PLUMBER_BLESS=1
//! rewrites them all.

mod common;

use plumber_analyzer::{
    analyze, analyze_input, render_dot, render_json, render_svg, render_text, Analysis,
    MachineOverrides, Report,
};

fn goldens(case: &str, a: &Analysis) {
    let r = a.report_ref();
    common::check_golden(case, "report.txt", &render_text(r));
    common::check_golden(case, "report.json", &render_json(a).expect("json"));
    common::check_golden(case, "pipeline.svg", &render_svg(r));
    common::check_golden(case, "pipeline.dot", &render_dot(r));
    // report.json parses back into the same report (floats to 1e-12:
    // serde_json's default float parsing may differ in the last bit).
    let json = render_json(a).expect("json");
    let back: Report = serde_json::from_str(&json).expect("parse report.json");
    let again = serde_json::to_value(&back).expect("to value");
    let orig: serde_json::Value = serde_json::from_str(&json).expect("value");
    assert!(same_json(&orig, &again), "report.json does not round-trip");
}

fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => close(x, y, 1e-12),
            _ => x == y,
        },
        (V::Array(x), V::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (V::Object(x), V::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn node<'a>(r: &'a Report, name: &str) -> &'a plumber_analyzer::NodeReport {
    r.nodes
        .iter()
        .find(|n| n.measured.name == name)
        .unwrap_or_else(|| panic!("node {name} in report"))
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * b.abs().max(1.0)
}

#[track_caller]
fn assert_close(a: Option<f64>, b: f64, tol: f64) {
    let a = a.unwrap_or(f64::NAN);
    assert!(close(a, b, tol), "{a} != {b}");
}

#[test]
fn worked_example() {
    let a = analyze(
        &common::worked_example().snapshot(),
        &MachineOverrides::default(),
    )
    .expect("analyze");
    let r = a.report_ref();
    // Per-core rates 200 / 6.25 / 100 / 2000.
    assert_close(node(r, "TFRecordDataset/_1").rate_per_core, 200.0, 1e-9);
    assert_close(node(r, "ParallelMapDatasetV2/_5").rate_per_core, 6.25, 1e-9);
    assert_close(node(r, "BatchDatasetV2/_8").rate_per_core, 100.0, 1e-9);
    assert_close(node(r, "PrefetchDataset/_10").rate_per_core, 2000.0, 1e-9);
    assert_close(
        Some(node(r, "ParallelMapDatasetV2/_5").visit_ratio),
        128.0,
        1e-12,
    );
    // ParallelMap is the bottleneck at 12.5.
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert_eq!(b.name, "ParallelMapDatasetV2/_5");
    assert_eq!(b.reason, "cpu");
    assert_close(b.rate, 12.5, 1e-9);
    assert_close(node(r, "ParallelMapDatasetV2/_5").max_rate, 12.5, 1e-9);
    assert_close(Some(r.observed_rate), 10.0, 1e-9);
    assert_close(r.predicted_rate, 12.5, 1e-9);
    assert_eq!(r.ranking[0], "ParallelMapDatasetV2/_5");
    // LP 45.6 with ParallelMap ≈ 7.29 cores, rounded to 8.
    assert_close(r.lp.rate, 8.0 / 0.1755, 1e-9);
    assert_eq!(r.lp.binding, "cores");
    assert!(close(
        r.lp.allocation["ParallelMapDatasetV2/_5"],
        7.293,
        1e-3
    ));
    assert!(close(r.lp.allocation["BatchDatasetV2/_8"], 0.456, 1e-3));
    assert!(close(r.lp.allocation["TFRecordDataset/_1"], 0.228, 1e-3));
    assert_eq!(r.lp.parallelism["ParallelMapDatasetV2/_5"], 8);
    let rec = &r.recommendations[0];
    assert_eq!(
        (rec.kind.as_str(), rec.node.as_str(), rec.value),
        ("parallelism", "ParallelMapDatasetV2/_5", 8.0)
    );
    assert_close(rec.predicted_rate, 45.58, 1e-3);
    assert_eq!(r.recommendations.len(), 1, "{:#?}", r.recommendations);
    // CPU utilisation 105.3 / (8 · 60) = 0.22; disk 8.45 GB → 140.8 MB/s.
    assert!(close(r.utilisation.cpu, 105.3 / 480.0, 1e-9));
    assert!(close(r.utilisation.disk_throughput, 140.8e6, 1e-3));
    assert!(r.utilisation.disk.is_none(), "no bandwidth: no ratio");
    // Prefetch: N* = 0.1755 × 12.5 = 2.19, N = 110/60 = 1.83, k = 1 — the
    // top op is already a PrefetchDataset, so nothing to change.
    assert!(close(r.prefetch.in_flight_needed, 2.194, 1e-3));
    assert!(close(r.prefetch.in_flight, 110.0 / 60.0, 1e-9));
    assert_eq!(r.prefetch.add, 1);
    // No interleave: the file count, hence the sizes, are unknown.
    assert!(r.cache.node.is_none());
    goldens("worked_example", &a);
}

#[test]
fn worked_example_with_disk_bandwidth() {
    // "with 500 MB/s disk, disk_upper_bounds = 35.5 batches/s".
    let ov = MachineOverrides {
        disk_bandwidth: Some(500e6),
        ..Default::default()
    };
    let a = analyze(&common::worked_example().snapshot(), &ov).expect("analyze");
    let r = a.report_ref();
    assert_close(r.utilisation.disk_bound_rate, 500e6 / (110e3 * 128.0), 1e-9);
    assert!(close(
        r.utilisation.disk.unwrap_or(0.0),
        140.8e6 / 500e6,
        1e-3
    ));
    // Raising the map's parallelism now hits the storage at 35.5/s.
    assert_eq!(r.recommendations[0].kind, "parallelism");
    assert_close(r.recommendations[0].predicted_rate, 35.51, 1e-3);
    assert_eq!(r.recommendations[1].kind, "disk");
    assert_eq!(r.recommendations[1].unit, "bytes/s");
}

#[test]
fn io_bound() {
    let a = analyze(&common::io_bound().snapshot(), &MachineOverrides::default()).expect("analyze");
    let r = a.report_ref();
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert_eq!(
        (b.name.as_str(), b.reason.as_str()),
        ("TFRecordDataset", "io")
    );
    let reader = node(r, "TFRecordDataset");
    assert_eq!(reader.function.as_deref(), Some("read_files"));
    assert_close(reader.rate_per_core, 300.0, 1e-9);
    assert!(
        close(reader.model_parallelism, 2.0, 1e-12),
        "outer parallelism of the interleave"
    );
    assert_close(reader.max_rate, 2.0 * 600.0 / 118.0, 1e-9);
    assert_close(r.predicted_rate, 2.0 * 600.0 / 118.0, 1e-9);
    assert!(close(
        r.utilisation.disk.unwrap_or(0.0),
        128e6 / 500e6,
        1e-3
    ));
    assert_close(r.utilisation.disk_bound_rate, 500e6 / (200e3 * 64.0), 1e-9);
    // First: read more files at once (on the interleave), up to the storage.
    let first = &r.recommendations[0];
    assert_eq!(
        (first.kind.as_str(), first.node.as_str()),
        ("disk", "ParallelInterleaveDatasetV4/_4")
    );
    assert_eq!(first.unit, "parallel reads");
    assert_close(first.predicted_rate, 500e6 / (200e3 * 64.0), 1e-9);
    assert!(r.recommendations.iter().any(|x| x.unit == "bytes/s"));
    goldens("io_bound", &a);
}

#[test]
fn cache_fits() {
    let a = analyze(
        &common::cache_pipeline(false).snapshot(),
        &MachineOverrides::default(),
    )
    .expect("analyze");
    let r = a.report_ref();
    // Sizes of §9's variant: TFRecord 135 GB, 1.31 M records.
    let reader = node(r, "TFRecordDataset");
    assert!(close(
        reader.materialized_bytes.unwrap_or(0.0),
        6.6e9 * 1024.0 / 50.0,
        1e-9
    ));
    assert!(close(
        node(r, "ParallelInterleaveDatasetV4/_3")
            .materialized_bytes
            .unwrap_or(0.0),
        135.168e9,
        1e-9
    ));
    assert!(close(
        node(r, "ParallelMapDatasetV2/_5")
            .materialized_bytes
            .unwrap_or(0.0),
        1024.0 * 1280.0 * 150e3,
        1e-9
    ));
    assert!(close(
        r.cache.budget_bytes.unwrap_or(0.0),
        0.9 * 256e9,
        1e-12
    ));
    assert_eq!(r.cache.node.as_deref(), Some("BatchDatasetV2/_8"));
    assert!(r.cache.blocked_by.is_empty());
    let cache = r
        .recommendations
        .iter()
        .find(|x| x.kind == "cache")
        .expect("cache recommendation");
    assert_eq!(cache.node, "BatchDatasetV2/_8");
    assert_close(cache.predicted_rate, 2000.0, 1e-9);
    goldens("cache_fits", &a);
}

#[test]
fn cache_blocked_by_randomness() {
    let a = analyze(
        &common::cache_pipeline(true).snapshot(),
        &MachineOverrides::default(),
    )
    .expect("analyze");
    let r = a.report_ref();
    // Batch fits but the Shuffle below it (which Plumber misses) is random,
    // and so is the augmenting map's UDF: the cache goes after the decode.
    assert_eq!(r.cache.node.as_deref(), Some("ParallelMapDatasetV2/_5"));
    let blocked: Vec<(&str, &str)> = r
        .cache
        .blocked_by
        .iter()
        .map(|b| (b.node.as_str(), b.random.as_str()))
        .collect();
    assert_eq!(
        blocked,
        vec![
            ("BatchDatasetV2/_8", "ShuffleDatasetV3/_7"),
            ("ShuffleDatasetV3/_7", "ShuffleDatasetV3/_7"),
            ("ParallelMapDatasetV2/_6", "ParallelMapDatasetV2/_6"),
        ]
    );
    assert!(node(r, "ShuffleDatasetV3/_7").random);
    assert!(node(r, "ParallelMapDatasetV2/_6").random);
    assert!(!node(r, "ParallelMapDatasetV2/_5").random);
    let cache = r
        .recommendations
        .iter()
        .find(|x| x.kind == "cache")
        .expect("cache recommendation");
    assert_eq!(cache.node, "ParallelMapDatasetV2/_5");
    goldens("cache_blocked_by_randomness", &a);
}

/// The gil_bound pipeline's bottleneck: its map, on the GIL, at 8 threads
/// of 25% efficiency: S(8) = 2 ⇒ 6.25 × 2 = 12.5.
fn assert_map_gil_bound_at_12_5(r: &Report) {
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert_eq!(
        (b.name.as_str(), b.reason.as_str()),
        ("ParallelMapDatasetV2/_5", "gil")
    );
    assert_close(b.rate, 12.5, 1e-9);
}

#[test]
fn gil_bound() {
    let a = analyze_input(common::gil_input(), &MachineOverrides::default()).expect("analyze");
    let r = a.report_ref();
    assert_map_gil_bound_at_12_5(r);
    let map = node(r, "ParallelMapDatasetV2/_5");
    let c = map.contention.as_ref().expect("contention");
    assert!(close(c.serial_share, 288.0 / (96.0 * 7.0), 1e-12));
    assert_eq!(c.useful_parallelism, Some(4.0));
    // The LP does not give the map more threads (Plumber's linear model
    // would: 16 cores ⇒ 14.6 threads).
    assert_eq!(r.lp.parallelism["ParallelMapDatasetV2/_5"], 8);
    assert_close(r.lp.rate, 12.5, 1e-9);
    // The fix is the GIL; only then does parallelism pay.
    let first = &r.recommendations[0];
    assert_eq!(
        (first.kind.as_str(), first.node.as_str()),
        ("gil", "ParallelMapDatasetV2/_5")
    );
    assert_close(first.predicted_rate, 50.0, 1e-9);
    let second = &r.recommendations[1];
    assert_eq!((second.kind.as_str(), second.value), ("parallelism", 15.0));
    assert_close(second.predicted_rate, 16.0 / 0.1755, 1e-9);
    assert!(render_text(r).contains("S(p) = p/(1+σ(p−1))"));
    goldens("gil_bound", &a);
}

#[test]
fn gil_bound_threads_that_wait_take_no_core() {
    // The same map on 3 cores: its 8 threads wait 75% of their time, so at
    // 12.5/s they burn 2 cores (the other ops 0.19), not 8. The GIL bounds
    // it; charging a core a thread made it "all 3 cores in use".
    let cores = MachineOverrides {
        cores: Some(3.0),
        ..Default::default()
    };
    let a = analyze_input(common::gil_input(), &cores).expect("analyze");
    let r = a.report_ref();
    assert_map_gil_bound_at_12_5(r);
    assert_eq!(r.lp.binding, "cap:ParallelMapDatasetV2/_5");
    assert_close(
        r.lp.allocation.get("ParallelMapDatasetV2/_5").copied(),
        2.0,
        1e-9,
    );
    let first = &r.recommendations[0];
    assert_eq!(
        (first.kind.as_str(), first.node.as_str()),
        ("gil", "ParallelMapDatasetV2/_5")
    );
    // Without the wait, the 3 cores bind: 3 / Σ 1/R1 (0.1755 s a root element).
    assert_close(first.predicted_rate, 3.0 / 0.1755, 1e-9);
}

#[test]
fn render_all_matches_each_renderer() {
    let a = analyze(&common::io_bound().snapshot(), &MachineOverrides::default()).expect("analyze");
    let out = plumber_analyzer::render_all(&a).expect("render");
    let r = a.report_ref();
    assert_eq!(out.report_txt, render_text(r));
    assert_eq!(out.report_json, render_json(&a).expect("json"));
    assert_eq!(out.pipeline_dot, render_dot(r));
    assert_eq!(out.pipeline_svg, render_svg(r));
}

#[test]
fn rendered_files_in_write_order() {
    let a = analyze(
        &common::worked_example().snapshot(),
        &MachineOverrides::default(),
    )
    .expect("analyze");
    let out = plumber_analyzer::render_all(&a).expect("render");
    let names: Vec<&str> = out.files().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        ["report.json", "report.txt", "pipeline.dot", "pipeline.svg"]
    );
    assert_eq!(out.files()[0].1, out.report_json.as_bytes());
    assert!(out.files().iter().all(|(_, b)| !b.is_empty()));
}

#[test]
fn not_measured_closes_the_report_text_and_is_in_report_json() {
    let mut s = common::worked_example().snapshot();
    let full = analyze(&s, &MachineOverrides::default()).expect("analyze");
    assert!(!render_text(full.report_ref()).contains("NOT MEASURED"));
    s.probe_info
        .get_or_insert_with(Default::default)
        .not_measured = vec!["lock waits".to_string()];
    let a = analyze(&s, &MachineOverrides::default()).expect("analyze");
    let text = render_text(a.report_ref());
    assert!(
        text.ends_with(
            "NOT MEASURED by this recording (a 0 there means unknown, not none)\n  - lock waits\n"
        ),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&render_json(&a).expect("json")).expect("parses");
    assert_eq!(json["not_measured"], serde_json::json!(["lock waits"]));
}
