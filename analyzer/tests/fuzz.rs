//! Bounded fuzzing that runs in CI with `cargo test`: arbitrary bytes,
//! mutated valid stats files, and structurally valid snapshots with hostile
//! numbers (NaN, infinities, negatives, i64 extremes, zero everything) go
//! through load + analyze + every renderer. Nothing may panic; errors must
//! be one line.

mod common;

use plumber_analyzer::synth::{long_chain, SynthPipeline};
use plumber_analyzer::{
    analyze, load_snapshot, render_dot, render_json, render_svg, render_text, MachineOverrides,
};
use plumber_collector::proto::pipeline_snapshot::OpStats;
use plumber_collector::proto::PipelineSnapshot;
use proptest::prelude::*;
use prost::Message;

// Inputs that got through to a full analysis (the fuzz must not only
// exercise error paths).
thread_local! {
    static ANALYSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn seeds() -> Vec<SynthPipeline> {
    vec![
        common::worked_example(),
        common::io_bound(),
        common::cache_pipeline(false),
        common::cache_pipeline(true),
        common::gil_bound(),
        long_chain(12),
    ]
}

/// Runs everything a user runs on a file; only checks that it does not
/// panic and that errors are one line.
fn exercise_bytes(bytes: &[u8], ov: &MachineOverrides) {
    match load_snapshot(bytes) {
        Ok(s) => exercise_snapshot(&s, ov),
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
}

fn exercise_snapshot(s: &PipelineSnapshot, ov: &MachineOverrides) {
    match analyze(s, ov) {
        Ok(a) => {
            ANALYSED.with(|c| c.set(c.get() + 1));
            let r = a.report_ref();
            let _ = render_text(r);
            let _ = render_dot(r);
            let _ = render_svg(r);
            let json = render_json(&a).expect("report serialises");
            let _: serde_json::Value = serde_json::from_str(&json).expect("report.json is JSON");
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
}

fn wild_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(-1.0),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
        -1e6f64..1e6,
    ]
}

fn wild_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(-1),
        Just(-2),
        Just(i64::MAX),
        Just(i64::MIN),
        Just(1),
        0i64..1_000_000_000_000,
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Truncate(i) => bytes.truncate(i % bytes.len()),
        Mutation::Flip(i, b) => {
            let n = bytes.len();
            bytes[i % n] ^= b | 1;
        }
        Mutation::Insert(i, v) => {
            let at = i % bytes.len();
            for (k, b) in v.iter().enumerate() {
                bytes.insert(at + k, *b);
            }
        }
        Mutation::Remove(i, n) => {
            let at = i % bytes.len();
            let end = (at + n).min(bytes.len());
            bytes.drain(at..end);
        }
    }
}

fn overrides() -> impl Strategy<Value = MachineOverrides> {
    (
        prop::option::weighted(0.2, wild_f64()),
        prop::option::weighted(
            0.2,
            prop_oneof![Just(0u64), Just(1u64), Just(u64::MAX), 1u64..1 << 40],
        ),
        prop::option::weighted(0.2, wild_f64()),
    )
        .prop_map(|(cores, memory_bytes, disk_bandwidth)| MachineOverrides {
            cores,
            memory_bytes,
            disk_bandwidth,
        })
}

fn hostile_stats(s: &mut OpStats, f: &[f64], i: &[i64]) {
    s.element_ratio = f[0];
    s.probe_parallelism = f[1];
    s.aggregate_avg_number_active_threads = f[2];
    s.aggregate_elements_produced = i[0];
    s.aggregate_processing_time_clock = i[1];
    s.aggregate_processing_time = i[2];
    s.parallelism = i[3];
    s.count = i[4];
    s.cardinality = i[5];
    s.aggregate_bytes_produced = i[6];
    s.aggregate_disk_bytes_read = i[7];
    s.aggregate_elements_consumed = i[0].wrapping_sub(i[1]);
    s.aggregate_wait_time = i[3].wrapping_mul(3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        exercise_bytes(&bytes, &MachineOverrides::default());
    }

    #[test]
    fn mutated_valid_files(seed in 0usize..6, muts in prop::collection::vec(mutation(), 1..6)) {
        let mut bytes = seeds()[seed].snapshot().encode_to_vec();
        for m in &muts {
            apply(&mut bytes, m);
        }
        exercise_bytes(&bytes, &MachineOverrides::default());
    }

    #[test]
    fn hostile_numbers(
        seed in 0usize..6,
        which in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        f in prop::collection::vec(wild_f64(), 3),
        i in prop::collection::vec(wild_i64(), 8),
        window in prop::option::weighted(0.25, (wild_i64(), wild_i64())),
        cores in wild_i64(),
        bw in wild_f64(),
        ov in overrides(),
    ) {
        let mut s = seeds()[seed].snapshot();
        for w in &which {
            let n = s.stats.len();
            if n > 0 {
                let k = w.index(n);
                hostile_stats(&mut s.stats[k], &f, &i);
            }
        }
        if let (Some(info), Some((start, end))) = (s.snapshot_info.as_mut(), window) {
            info.start_time = start;
            info.current_time = end;
        }
        if let Some(m) = s.machine_info.as_mut() {
            m.num_cores = cores;
            m.estimated_disk_bandwidth = bw;
            m.memory_total = i[6];
            m.memory_free = i[7];
        }
        exercise_snapshot(&s, &ov);
    }

    #[test]
    fn hostile_graphs(
        seed in 0usize..6,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u8..5), 1..6),
    ) {
        // Rewire inputs: cycles, self-loops, dangling names, control inputs,
        // dropped _Retval.
        let mut s = seeds()[seed].snapshot();
        let Some(g) = s.graph.as_mut() else { return Ok(()) };
        let names: Vec<String> = g.node.iter().map(|n| n.name.clone()).collect();
        for (a, b, kind) in &edits {
            let n = g.node.len();
            if n == 0 { break; }
            let (ia, ib) = (a.index(n), b.index(n));
            match kind {
                0 => g.node[ia].input = vec![names[ib].clone()],
                1 => g.node[ia].input.push(format!("^{}", names[ib])),
                2 => g.node[ia].input.push(format!("{}:handle:0", names[ib])),
                3 => g.node[ia].input.push("no_such_node".into()),
                _ => { g.node.remove(ia); }
            }
        }
        exercise_snapshot(&s, &MachineOverrides::default());
    }
}

#[test]
fn hostile_numbers_reach_the_model() {
    // A deterministic pass over hostile values on every seed: most must be
    // analysed, not rejected.
    let before = ANALYSED.with(|c| c.get());
    let values = [f64::NAN, f64::INFINITY, -1.0, 0.0, 1e300];
    let ints = [0i64, -1, i64::MAX, i64::MIN, 7];
    let mut total = 0;
    for seed in seeds() {
        for (k, (&f, &i)) in values.iter().zip(&ints).enumerate() {
            let mut s = seed.snapshot();
            let n = s.stats.len();
            hostile_stats(&mut s.stats[k % n], &[f, f, f], &[i; 8]);
            exercise_snapshot(&s, &MachineOverrides::default());
            total += 1;
        }
    }
    let analysed = ANALYSED.with(|c| c.get()) - before;
    assert!(analysed * 2 >= total, "only {analysed} of {total} analysed");
}

#[test]
fn recursive_function_library_terminates() {
    // A function whose dataset op calls the same function again.
    let mut p = common::io_bound();
    p.functions[0].ops[0].function = Some("read_files".into());
    exercise_snapshot(&p.snapshot(), &MachineOverrides::default());
}

#[test]
fn deep_chain_does_not_overflow_the_stack() {
    let s = long_chain(20_000).snapshot();
    let a = analyze(&s, &MachineOverrides::default()).expect("analyze");
    assert_eq!(a.report_ref().nodes.len(), 20_000);
    let _ = render_svg(a.report_ref());
}
