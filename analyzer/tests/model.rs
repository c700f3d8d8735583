//! Model behaviour beyond the golden cases: Plumber's bugs fixed, the
//! wallclock fallback, lock contention, parallelism per op.

mod common;

use plumber_analyzer::synth::{SynthOp, SynthPipeline};
use plumber_analyzer::{analyze, analyze_input, MachineOverrides, PipelineInput, Report};

fn report(p: &SynthPipeline) -> Report {
    analyze(&p.snapshot(), &MachineOverrides::default())
        .expect("analyze")
        .into_report()
}

/// The report of `pipeline` with `op`'s lock and GIL wait set (ns).
fn with_wait(pipeline: SynthPipeline, op: &str, lock_wait_ns: u64, gil_wait_ns: u64) -> Report {
    let mut input = PipelineInput::from_snapshot(&pipeline.snapshot()).expect("input");
    let o = input.op_mut(op).expect("op");
    o.lock_wait_ns = lock_wait_ns;
    o.gil_wait_ns = gil_wait_ns;
    analyze_input(input, &MachineOverrides::default())
        .expect("analyze")
        .into_report()
}

fn node<'a>(r: &'a Report, name: &str) -> &'a plumber_analyzer::NodeReport {
    r.nodes
        .iter()
        .find(|n| n.measured.name == name)
        .unwrap_or_else(|| panic!("node {name}"))
}

#[test]
fn zero_cpu_op_is_neither_bottleneck_nor_lp_killer() {
    // Plumber: R1 = 0 for an op without CPU time ⇒ it becomes the
    // bottleneck and the LP rate is 0 (plumber-model.md §8.2).
    let mut p = common::worked_example();
    p.ops[3] = SynthOp::new("PrefetchDataset/_10", "PrefetchDataset")
        .input("BatchDatasetV2/_8")
        .elements(600)
        .ratio(1.0)
        .cpu(0.0)
        .wall(0.0);
    let r = report(&p);
    assert_eq!(
        r.bottleneck.as_ref().map(|b| b.name.as_str()),
        Some("ParallelMapDatasetV2/_5")
    );
    let prefetch = node(&r, "PrefetchDataset/_10");
    assert_eq!(prefetch.rate_per_core, None);
    assert_eq!(prefetch.max_rate, None);
    assert_eq!(prefetch.rank, None);
    assert_eq!(prefetch.limited_by, "none");
    let lp = r.lp.rate.expect("LP rate");
    assert!(
        (lp - 8.0 / (1.0 / 100.0 + 1.0 / 6.25 + 1.0 / 200.0)).abs() < 1e-9,
        "{lp}"
    );
    assert!(!r.lp.allocation.contains_key("PrefetchDataset/_10"));
}

#[test]
fn parallelism_is_per_op_not_summed_over_instances() {
    // Two live instances of a map with num_parallel_calls = 4: Plumber's
    // OpStats.parallelism says 8.
    let mut p = common::worked_example();
    p.ops[1] = SynthOp::new("ParallelMapDatasetV2/_5", "ParallelMapDatasetV2")
        .input("TFRecordDataset/_1")
        .elements(76_800)
        .ratio(1.0)
        .cpu(96.0)
        .wall(100.0)
        .par(4)
        .count(2);
    let r = report(&p);
    let map = node(&r, "ParallelMapDatasetV2/_5");
    assert_eq!(
        map.measured.parallelism, 8.0,
        "the measured field stays as written"
    );
    assert_eq!(map.model_parallelism, 4.0);
    assert!((map.max_rate.unwrap_or(0.0) - 25.0).abs() < 1e-9);
}

#[test]
fn wallclock_fallback_without_cpu_time() {
    // plumber-probe's current files: wall time only, parallelism as a real
    // number in the extension field, no element_ratio.
    let mut s = common::worked_example().snapshot();
    for st in &mut s.stats {
        st.aggregate_processing_time_clock = 0;
        st.processing_time_clock = 0;
        st.element_ratio = 0.0;
        st.probe_parallelism = if st.name.starts_with("ParallelMap") {
            2.0
        } else {
            1.0
        };
        st.parallelism = 0;
    }
    let r = analyze(&s, &MachineOverrides::default())
        .expect("analyze")
        .into_report();
    assert_eq!(r.cpu_source, "wallclock");
    assert!(r.notes.iter().any(|n| n.contains("wall time")));
    let map = node(&r, "ParallelMapDatasetV2/_5");
    // 600 root elements over 100 s of wall time ⇒ 6 per core, × 2.
    assert!((map.rate_per_core.unwrap_or(0.0) - 6.0).abs() < 1e-9);
    assert_eq!(
        r.bottleneck.as_ref().map(|b| b.name.as_str()),
        Some("ParallelMapDatasetV2/_5")
    );
    assert!(plumber_analyzer::render_text(&r).contains("wall time"));
}

#[test]
fn lock_contention_is_named_and_capped() {
    let r = with_wait(
        common::gil_bound(),
        "ParallelMapDatasetV2/_5",
        200_000_000_000,
        0,
    );
    let b = r.bottleneck.expect("bottleneck");
    assert_eq!(b.reason, "lock");
    assert_eq!(r.recommendations[0].kind, "lock");
    assert!(r.recommendations[0].why.contains("serialise"));
}

#[test]
fn single_threaded_op_waiting_on_the_gil() {
    // p₀ = 1: σ = W/(C+W) and the measured rate is reproduced.
    let r = with_wait(
        common::worked_example(),
        "BatchDatasetV2/_8",
        0,
        18_000_000_000,
    );
    let batch = node(&r, "BatchDatasetV2/_8");
    let c = batch.contention.as_ref().expect("contention");
    assert!((c.serial_share - 0.75).abs() < 1e-12);
    // 100/s per core × 6/(6+18) efficiency.
    assert!((batch.max_rate.unwrap_or(0.0) - 25.0).abs() < 1e-9);
}

#[test]
fn visit_ratios_follow_each_input_of_a_zip() {
    // Zip(a, b): Plumber gives both inputs the first input's ratio.
    let p = SynthPipeline {
        ops: vec![
            SynthOp::new("RangeDataset/_1", "RangeDataset")
                .elements(1000)
                .cpu(0.1)
                .wall(0.1),
            SynthOp::new("BatchDatasetV2/_2", "BatchDatasetV2")
                .input("RangeDataset/_1")
                .elements(100)
                .ratio(10.0)
                .cpu(1.0)
                .wall(1.0),
            SynthOp::new("RangeDataset/_3", "RangeDataset")
                .elements(100)
                .cpu(0.1)
                .wall(0.1),
            SynthOp::new("ZipDataset/_4", "ZipDataset")
                .input("BatchDatasetV2/_2")
                .input("RangeDataset/_3")
                .elements(100)
                .ratio(1.0)
                .cpu(0.5)
                .wall(0.5),
        ],
        ..Default::default()
    };
    let r = report(&p);
    assert_eq!(node(&r, "BatchDatasetV2/_2").visit_ratio, 1.0);
    assert_eq!(node(&r, "RangeDataset/_3").visit_ratio, 1.0);
    assert_eq!(node(&r, "RangeDataset/_1").visit_ratio, 10.0);
}

#[test]
fn inputs_listed_after_their_consumer_still_connect() {
    // Plumber drops an edge when the input's NodeDef comes later (§8.6).
    let mut p = common::worked_example();
    p.ops.swap(0, 1);
    let r = report(&p);
    assert_eq!(
        node(&r, "ParallelMapDatasetV2/_5").inputs,
        vec!["TFRecordDataset/_1".to_string()]
    );
    assert_eq!(
        r.bottleneck.as_ref().map(|b| b.name.as_str()),
        Some("ParallelMapDatasetV2/_5")
    );
}

#[test]
fn existing_cache_and_tensor_slices_are_stale() {
    let mut p = common::worked_example();
    p.ops.insert(
        2,
        SynthOp::new("CacheDatasetV2/_7", "CacheDatasetV2")
            .input("ParallelMapDatasetV2/_5")
            .elements(76_800)
            .ratio(1.0)
            .cpu(0.5)
            .wall(0.5),
    );
    p.ops[3] = p.ops[3].clone();
    p.ops[3].inputs = vec!["CacheDatasetV2/_7".into()];
    let r = report(&p);
    assert!(node(&r, "ParallelMapDatasetV2/_5").stale);
    assert!(node(&r, "TFRecordDataset/_1").stale);
    assert_ne!(
        r.bottleneck.as_ref().map(|b| b.name.as_str()),
        Some("ParallelMapDatasetV2/_5")
    );
    assert_eq!(r.cache.existing.as_deref(), Some("CacheDatasetV2/_7"));
}

#[test]
fn sequential_source_gets_an_interleave_recommendation() {
    // A lone TFRecordDataset waiting on storage: read files in parallel
    // (Plumber's disk pass asserts on this shape, §8.10).
    let mut p = common::worked_example();
    p.ops[0] = SynthOp::new("TFRecordDataset/_1", "TFRecordDataset")
        .elements(76_800)
        .ratio(-1.0)
        .cpu(3.0)
        .wall(59.0)
        .wait(56.0)
        .disk(76_800 * 110_000, 60);
    p.ops[1] = SynthOp::new("ParallelMapDatasetV2/_5", "ParallelMapDatasetV2")
        .input("TFRecordDataset/_1")
        .elements(76_800)
        .ratio(1.0)
        .cpu(96.0)
        .wall(100.0)
        .par(8);
    p.cores = 16;
    let r = report(&p);
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert_eq!(
        (b.name.as_str(), b.reason.as_str()),
        ("TFRecordDataset/_1", "io")
    );
    let rec = &r.recommendations[0];
    assert_eq!(
        (rec.kind.as_str(), rec.node.as_str()),
        ("disk", "TFRecordDataset/_1")
    );
    assert!(rec.why.contains("interleave"));
}

#[test]
fn mild_contention_still_gets_parallelism_up_to_where_it_helps() {
    // σ = 0.05 at 2 threads: more threads still pay, but less than linearly.
    let r = with_wait(
        common::worked_example(),
        "ParallelMapDatasetV2/_5",
        4_800_000_000,
        0,
    );
    let map = node(&r, "ParallelMapDatasetV2/_5");
    let c = map.contention.as_ref().expect("contention");
    assert!((c.serial_share - 0.05).abs() < 1e-12);
    assert_eq!(
        map.limited_by, "cpu",
        "a 5% slowdown is not called lock-bound"
    );
    let rec = &r.recommendations[0];
    assert_eq!(
        (rec.kind.as_str(), rec.node.as_str()),
        ("parallelism", "ParallelMapDatasetV2/_5")
    );
    let linear = 8.0 / 0.1755;
    let predicted = rec.predicted_rate.expect("rate");
    assert!(
        predicted < linear && predicted > 0.7 * linear,
        "{predicted}"
    );
}

#[test]
fn contention_past_the_useful_point_gets_no_parallelism() {
    // The GIL case: 8 threads, useful up to 4. The LP keeps 8 and the
    // first recommendation is the GIL, not threads.
    let r = analyze_input(common::gil_input(), &MachineOverrides::default())
        .expect("analyze")
        .into_report();
    let first_parallelism = r
        .recommendations
        .iter()
        .position(|x| x.kind == "parallelism");
    let gil = r.recommendations.iter().position(|x| x.kind == "gil");
    assert!(gil.is_some());
    assert!(first_parallelism.is_none_or(|p| p > gil.unwrap_or(0)));
}

#[test]
fn lock_and_gil_wait_come_from_the_stats_file() {
    // The GIL-bound case with its wait in stats.pb's extension fields
    // instead of set on the input: the same analysis.
    let mut snap = common::gil_bound().snapshot();
    let map = snap
        .stats
        .iter_mut()
        .find(|s| s.name == "ParallelMapDatasetV2/_5")
        .expect("map stats");
    map.probe_gil_wait_ns = 288_000_000_000;
    map.probe_lock_wait_ns = 1_000;
    let input = PipelineInput::from_snapshot(&snap).expect("input");
    let o = &input.ops["ParallelMapDatasetV2/_5"];
    assert_eq!((o.gil_wait_ns, o.lock_wait_ns), (288_000_000_000, 1_000));
    let r = analyze(&snap, &MachineOverrides::default())
        .expect("analyze")
        .into_report();
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert_eq!(b.reason, "gil");
    let n = node(&r, "ParallelMapDatasetV2/_5");
    assert_eq!(n.measured.gil_wait_ns, 288_000_000_000);
    assert_eq!(n.measured.lock_wait_ns, 1_000);
    let c = n.contention.as_ref().expect("contention");
    assert_eq!(c.gil_wait_s, 288.0);
}
