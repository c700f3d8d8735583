//! Per-op CPU time, waits and I/O from thread-level events.
mod common;

use common::*;
use plumber_collector::event::{Event, WaitCounters};
use plumber_collector::totals::{CpuTotals, OpTotals, ThreadRole, ThreadTotals};
use plumber_collector::window::{aggregate, drops as own, WindowResult};

const MS: u64 = 1_000_000;

fn op<'a>(w: &'a WindowResult, path: &str) -> &'a OpTotals {
    w.ops
        .iter()
        .find(|o| o.path == path)
        .unwrap_or_else(|| panic!("no op {path}"))
}

fn thread_row(w: &WindowResult, tid: u32) -> &ThreadTotals {
    w.threads
        .iter()
        .find(|t| t.tid == tid)
        .unwrap_or_else(|| panic!("no thread {tid}"))
}

/// Σ op CPU + unattributed + outside the pipeline == Σ threads, exactly,
/// and every thread's parts sum to its CPU time.
fn check_invariants(w: &WindowResult) {
    let c = &w.cpu;
    let ops: u64 = w.ops.iter().map(|o| o.cpu_ns).sum();
    assert_eq!(ops, c.pipeline_cpu_ns);
    assert_eq!(
        c.pipeline_cpu_ns + c.unattributed_cpu_ns + c.non_pipeline_cpu_ns,
        c.threads_cpu_ns,
        "{c:?}"
    );
    assert_eq!(
        w.threads.iter().map(|t| t.cpu_ns).sum::<u64>(),
        c.threads_cpu_ns
    );
    for t in &w.threads {
        let parts: u64 = t.attributed.iter().map(|(_, ns)| ns).sum::<u64>()
            + t.unattributed_cpu_ns
            + t.non_pipeline_cpu_ns;
        assert_eq!(parts, t.cpu_ns, "thread {}", t.tid);
    }
    // Waits too, kind by kind.
    let sum = |f: fn(&WaitCounters) -> u64| {
        (
            w.ops.iter().map(|o| f(&o.waits)).sum::<u64>()
                + f(&w.unattributed_waits)
                + f(&w.non_pipeline_waits),
            w.threads.iter().map(|t| f(&t.waits)).sum::<u64>(),
        )
    };
    for f in [
        (|w: &WaitCounters| w.lock_wait_ns) as fn(&WaitCounters) -> u64,
        |w| w.lock_waits,
        |w| w.cond_wait_ns,
        |w| w.gil_wait_ns,
        |w| w.gil_waits,
        |w| w.futex_wait_ns,
        |w| w.io_wait_ns,
    ] {
        let (parts, whole) = sum(f);
        assert_eq!(parts, whole);
    }
    for o in &w.ops {
        assert!(o.udf_cpu_ns <= o.cpu_ns, "{}", o.path);
    }
}

#[test]
fn usage_totals() {
    let w = aggregate(usage_events()).unwrap();
    check_invariants(&w);
    assert_eq!(
        w.cpu,
        CpuTotals {
            process_cpu_ns: 20 * SEC,
            threads_cpu_ns: 16_200_000_001,
            // TensorSlice, which no window caught, has its self time
            // (10 µs) from the unattributed.
            pipeline_cpu_ns: 8_700_010_001,
            unattributed_cpu_ns: SEC - 10_000,
            non_pipeline_cpu_ns: 6_500_000_000,
            // The main thread's 6 s on Root; tf_Compute's 0.5 s is not
            // known to take elements.
            consumer_cpu_ns: 6 * SEC,
        }
    );
    assert!(w.has_thread_data());
    assert!(w.drops.is_empty(), "{:?}", w.drops);
    // Most CPU first.
    let order: Vec<u32> = w.threads.iter().map(|t| t.tid).collect();
    assert_eq!(
        order,
        [T_MAIN, T_POOL1, T_POOL2, T_GETNEXT, T_READER, T_COMPUTE]
    );
    let roles: Vec<ThreadRole> = w.threads.iter().map(|t| t.role).collect();
    assert_eq!(
        roles,
        [
            ThreadRole::NonPipeline,
            ThreadRole::UdfPool,
            ThreadRole::UdfPool,
            ThreadRole::Pipeline,
            ThreadRole::Pipeline,
            ThreadRole::NonPipeline,
        ]
    );
}

#[test]
fn pool_threads_split_by_processing_time() {
    let w = aggregate(usage_events()).unwrap();
    // 101: 4 s + 1 ns split 3:1, the rounding remainder to the larger share;
    // 102, born at 5 s: all of its 2 s, split 3:1.
    let pool1 = thread_row(&w, T_POOL1);
    assert_eq!(
        pool1.attributed,
        [
            (P_UPMAP.to_string(), 3_000_000_001),
            (P_UFLATMAP.to_string(), SEC)
        ]
    );
    let pm = op(&w, P_UPMAP);
    let fm = op(&w, P_UFLATMAP);
    assert_eq!((pm.cpu_ns, pm.udf_cpu_ns), (4_500_000_001, 4_500_000_001));
    assert_eq!((fm.cpu_ns, fm.udf_cpu_ns), (1_500_000_000, 1_500_000_000));
    // The pool's GIL wait follows the same split.
    assert_eq!((pm.waits.gil_wait_ns, pm.waits.gil_waits), (300 * MS, 3));
    assert_eq!((fm.waits.gil_wait_ns, fm.waits.gil_waits), (100 * MS, 1));
    // Not function-running ops: nothing from the pool.
    assert_eq!(op(&w, P_USLICE).udf_cpu_ns, 0);
    assert_eq!(op(&w, P_UTFREC).udf_cpu_ns, 0);
}

#[test]
fn root_evidence_is_outside_the_pipeline() {
    let w = aggregate(usage_events()).unwrap();
    let main = thread_row(&w, T_MAIN);
    assert_eq!(main.cpu_ns, 8 * SEC);
    // The 9 s evidence (3:1 Root:Prefetch) replaced the 2 s one.
    assert_eq!(main.attributed, [(P_PREFETCH.to_string(), 2 * SEC)]);
    assert_eq!(main.non_pipeline_cpu_ns, 6 * SEC);
    // All of it the consumer's: the thread takes the root's elements.
    assert_eq!(main.consumer_cpu_ns, 6 * SEC);
    assert_eq!(main.unattributed_cpu_ns, 0);
    let pf = op(&w, P_PREFETCH);
    assert_eq!((pf.cpu_ns, pf.udf_cpu_ns), (2 * SEC, 0));
    // GIL wait has its own evidence (all on Root); lock wait has none and
    // follows the CPU split.
    assert_eq!(pf.waits.gil_wait_ns, 0);
    assert_eq!(
        (pf.waits.lock_wait_ns, pf.waits.lock_waits),
        (100 * MS, 100)
    );
    assert_eq!(w.non_pipeline_waits.gil_wait_ns, SEC);
    assert_eq!(w.non_pipeline_waits.gil_waits, 1000);
    assert_eq!(w.non_pipeline_waits.lock_wait_ns, 300 * MS);
    // The root iterator itself gets no CPU.
    assert_eq!(op(&w, P_ROOT).cpu_ns, 0);
    // Without evidence: a pipeline thread is unattributed (less what an
    // op no window caught takes), another thread is outside the pipeline.
    assert_eq!(thread_row(&w, T_GETNEXT).unattributed_cpu_ns, SEC - 10_000);
    let compute = thread_row(&w, T_COMPUTE);
    assert_eq!(compute.non_pipeline_cpu_ns, 500 * MS);
    assert_eq!(compute.consumer_cpu_ns, 0);
}

#[test]
fn an_op_no_window_caught_gets_its_self_time_from_the_unattributed() {
    let w = aggregate(usage_events()).unwrap();
    check_invariants(&w);
    // TensorSlice produced elements, took 10 µs of TensorFlow's self time
    // over the window, and no evidence names it.
    let slice = op(&w, P_USLICE);
    assert_eq!((slice.cpu_ns, slice.cpu_from_self_time), (10_000, true));
    let getnext = thread_row(&w, T_GETNEXT);
    assert_eq!(getnext.attributed, [(P_USLICE.to_string(), 10_000)]);
    // Ops the windows or the pool's split caught keep what they had.
    for p in [P_PREFETCH, P_UPMAP, P_UFLATMAP, P_UTFREC] {
        assert!(!op(&w, p).cpu_from_self_time, "{p}");
    }
    // The root is the consumer's, never given time.
    assert_eq!(op(&w, P_ROOT).cpu_ns, 0);
}

#[test]
fn born_and_exited_threads() {
    let w = aggregate(usage_events()).unwrap();
    // Not in the baseline: all of its CPU time is in the window.
    assert_eq!(thread_row(&w, T_POOL2).cpu_ns, 2 * SEC);
    // Exited at 5 s: final value minus the baseline.
    let reader = thread_row(&w, T_READER);
    assert_eq!(reader.cpu_ns, 700 * MS);
    assert_eq!(reader.attributed, [(P_UTFREC.to_string(), 700 * MS)]);
    assert_eq!(op(&w, P_UTFREC).cpu_ns, 700 * MS);
}

#[test]
fn io_by_op_path_and_by_single_op_thread() {
    let w = aggregate(usage_events()).unwrap();
    let t = op(&w, P_UTFREC);
    // a.tfrecord by op path, b.tfrecord through the reader thread's split.
    assert_eq!(t.io_bytes_read, 1_300);
    assert_eq!(t.io_read_ns, 13_000);
    assert_eq!(t.files_opened, 2);
    assert_eq!(t.files, ["/data/a.tfrecord", "/data/b.tfrecord"]);
    // c: a pool thread splits between two ops; d: an op not in the window.
    assert_eq!(w.unattributed_io_bytes, 82);
    let files: Vec<(&str, &str, u64)> = w
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.op_path.as_str(), f.bytes_read))
        .collect();
    // Before the first poll, at it and after the last: not counted.
    assert_eq!(
        files,
        [
            ("/data/a.tfrecord", P_UTFREC, 1_000),
            ("/data/b.tfrecord", P_UTFREC, 300),
            ("/data/c", "", 77),
            ("/data/d", "", 5),
        ]
    );
    assert_eq!(w.files[0].size, Some(5_000));
    assert_eq!((w.files[0].reads, w.files[0].opens), (10, 1));
    for p in [P_UPMAP, P_UFLATMAP, P_PREFETCH] {
        assert_eq!(op(&w, p).io_bytes_read, 0, "{p}");
    }
}

#[test]
fn lock_sites_summed_in_the_window() {
    let w = aggregate(usage_events()).unwrap();
    let sites: Vec<(&str, &str, &str, u64, u64)> = w
        .lock_sites
        .iter()
        .map(|l| {
            (
                l.kind.as_str(),
                l.site.as_str(),
                l.op_path.as_str(),
                l.waits,
                l.wait_ns,
            )
        })
        .collect();
    assert_eq!(
        sites,
        [
            ("gil", "take_gil", "", 10, 1_000),
            (
                "mutex",
                "ParallelMapIterator::GetNextInternal",
                P_UPMAP,
                5,
                500
            ),
        ]
    );
}

/// Two polls of Root -> Range with the given events in between.
fn small(events: Vec<Event>) -> WindowResult {
    let p = |t, k| {
        poll(
            t,
            vec![
                node(1, 1, "Root", P_ROOT, None, c(k, 0)),
                node(
                    2,
                    2,
                    "ParallelMapV2",
                    "Root::ParallelMapV2",
                    Some(1),
                    c(k, 0),
                ),
            ],
        )
    };
    let mut all = vec![p(0, 0)];
    let (before, after): (Vec<_>, Vec<_>) = events.into_iter().partition(|e| match e {
        Event::Threads { mono_ns, .. } => *mono_ns <= MONO0,
        _ => false,
    });
    all.extend(before);
    all.push(p(1, 10));
    all.extend(after);
    aggregate(all).unwrap()
}

#[test]
fn single_function_op_gets_the_whole_pool_even_without_time() {
    let w = small(vec![
        threads_ms(0, vec![thread(7, POOL, 0)]),
        threads_ms(1000, vec![thread(7, POOL, 999)]),
    ]);
    check_invariants(&w);
    assert_eq!(op(&w, "Root::ParallelMapV2").cpu_ns, 999);
    assert_eq!(op(&w, "Root::ParallelMapV2").udf_cpu_ns, 999);
}

#[test]
fn counters_going_backwards_are_clamped_and_counted() {
    let w = small(vec![
        threads_ms(
            0,
            vec![with_waits(
                thread(7, "tf_data_x", 500),
                WaitCounters {
                    futex_wait_ns: 10,
                    ..Default::default()
                },
            )],
        ),
        threads_ms(1000, vec![thread(7, "tf_data_x", 400)]),
    ]);
    check_invariants(&w);
    assert_eq!(w.cpu.threads_cpu_ns, 0);
    let n = w
        .drops
        .iter()
        .find(|d| d.what == own::THREAD_COUNTER_WENT_BACKWARDS)
        .map(|d| d.count);
    assert_eq!(n, Some(2));
}

#[test]
fn reused_tid_is_a_new_thread() {
    let w = small(vec![
        threads_ms(0, vec![thread(7, "python3", 1_000)]),
        threads_ms(500, vec![exited(thread(7, "python3", 1_300))]),
        threads_ms(1000, vec![thread(7, "tf_data_y", 50)]),
    ]);
    check_invariants(&w);
    let rows: Vec<(u32, &str, u64)> = w
        .threads
        .iter()
        .map(|t| (t.tid, t.name.as_str(), t.cpu_ns))
        .collect();
    assert_eq!(rows, [(7, "python3", 300), (7, "tf_data_y", 50)]);
    assert!(w.drops.is_empty(), "{:?}", w.drops);
}

#[test]
fn pseudo_random_streams_keep_the_exact_sum() {
    // A fixed LCG: reproducible, no dependency.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |m: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % m
    };
    let paths = [P_ROOT, "Root::ParallelMapV2", "", "Root::Nope"];
    let names = [POOL, "tf_data_a", "python3", "dataset_b"];
    for _ in 0..200 {
        let n = 1 + next(6) as u32;
        let base: Vec<_> = (0..n)
            .map(|t| thread(t, names[next(4) as usize], next(1_000_000)))
            .collect();
        let fin: Vec<_> = base
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t.cpu_ns += next(1 << 40);
                t.waits.lock_wait_ns = next(1 << 30);
                t.waits.lock_waits = next(1000);
                t.waits.gil_wait_ns = next(1 << 30);
                t
            })
            .collect();
        let samples = (0..next(8))
            .map(|_| {
                let mut s = sample(
                    next(u64::from(n)) as u32,
                    paths[next(4) as usize],
                    next(1 << 20),
                );
                s.waits.gil_wait_ns = next(3);
                s
            })
            .collect();
        let w = small(vec![
            threads_ms(0, base),
            attribution_ms(500, samples),
            threads_ms(1000, fin),
        ]);
        check_invariants(&w);
    }
}

#[test]
fn streams_without_thread_events_are_unchanged() {
    for events in [chain_events(), flatmap_events()] {
        let w = aggregate(events).unwrap();
        assert!(!w.has_thread_data());
        assert_eq!(w.cpu, CpuTotals::default());
        assert!(w.threads.is_empty() && w.files.is_empty() && w.lock_sites.is_empty());
        assert_eq!(w.unattributed_io_bytes, 0);
        for o in &w.ops {
            assert_eq!(
                (o.cpu_ns, o.udf_cpu_ns, o.io_bytes_read, o.files_opened),
                (0, 0, 0, 0)
            );
            assert_eq!(o.waits, WaitCounters::default());
            assert!(o.files.is_empty());
        }
    }
}

#[test]
fn io_without_thread_data_is_still_counted() {
    let w = small(vec![io_ms(
        500,
        vec![
            file_io("/x", "Root::ParallelMapV2", 9, 10),
            file_io("/y", "", 9, 20),
        ],
    )]);
    assert!(!w.has_thread_data());
    assert_eq!(w.cpu, CpuTotals::default());
    assert_eq!(op(&w, "Root::ParallelMapV2").io_bytes_read, 10);
    assert_eq!(w.unattributed_io_bytes, 20);
}
