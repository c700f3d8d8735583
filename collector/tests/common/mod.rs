//! Builders for synthetic event streams shared by the integration tests.
#![allow(dead_code)]

use plumber_collector::event::{
    AttributionSample, DropCount, Event, FileIo, LockSite, NodeCounters, NodeObservation,
    NodeRetired, Poll, TargetInfo, ThreadObservation, WaitCounters,
};

pub const MONO0: u64 = 1_000_000_000_000;
pub const WALL0: u64 = 1_700_000_000_000_000_000;
pub const CPU0: u64 = 5_000_000_000;
pub const SEC: u64 = 1_000_000_000;

/// Cumulative counters derived from an element count and processing time
/// (bytes are 100 produced / 10 consumed per element so they are checkable).
pub fn c(elements: i64, processing_time_ns: i64) -> NodeCounters {
    NodeCounters {
        num_elements: elements,
        bytes_produced: elements * 100,
        bytes_consumed: elements * 10,
        processing_time_ns,
        buffered_elements: 0,
        buffered_bytes: 0,
    }
}

pub fn buffered(mut counters: NodeCounters, elements: i64, bytes: i64) -> NodeCounters {
    counters.buffered_elements = elements;
    counters.buffered_bytes = bytes;
    counters
}

pub fn node(
    addr: u64,
    id: i64,
    name: &str,
    path: &str,
    parent: Option<u64>,
    counters: NodeCounters,
) -> NodeObservation {
    NodeObservation {
        addr,
        id,
        name: name.to_string(),
        path: path.to_string(),
        parent,
        in_function: false,
        counters,
        parallelism: None,
        ratio: None,
        buffer_size: None,
    }
}

pub fn fn_node(
    addr: u64,
    id: i64,
    name: &str,
    path: &str,
    parent: Option<u64>,
    counters: NodeCounters,
) -> NodeObservation {
    NodeObservation {
        in_function: true,
        ..node(addr, id, name, path, parent, counters)
    }
}

pub fn with_par(mut n: NodeObservation, p: f64) -> NodeObservation {
    n.parallelism = Some(p);
    n
}

/// A poll `t_ms` milliseconds after the start.
pub fn poll_ms(t_ms: u64, nodes: Vec<NodeObservation>) -> Event {
    Event::Poll(Poll {
        mono_ns: MONO0 + t_ms * 1_000_000,
        wall_ns: WALL0 + t_ms * 1_000_000,
        process_cpu_ns: CPU0 + t_ms * 2_000_000,
        machine_busy_ns: None,
        nodes,
    })
}

pub fn poll(t_s: u64, nodes: Vec<NodeObservation>) -> Event {
    poll_ms(t_s * 1000, nodes)
}

/// A retirement `t_ms` ms after the start (negative: before it).
pub fn retired_ms(
    t_ms: i64,
    addr: u64,
    id: i64,
    name: &str,
    parent: Option<(u64, i64)>,
    counters: NodeCounters,
) -> Event {
    Event::Retired(NodeRetired {
        mono_ns: (MONO0 as i64 + t_ms * 1_000_000) as u64,
        addr,
        id,
        name: name.to_string(),
        parent: parent.map(|p| p.0),
        parent_id: parent.map(|p| p.1),
        counters,
    })
}

pub fn target() -> Event {
    Event::Target(TargetInfo {
        pid: 4242,
        tensorflow_version: "2.21.0".to_string(),
        libraries: vec!["/usr/lib/libtensorflow_framework.so.2".to_string()],
        mode: "model".to_string(),
        num_cores: 16,
        cpu_quota_cores: None,
        memory_total: 64 << 30,
        memory_free: 32 << 30,
        not_measured: Vec::new(),
    })
}

pub fn drops(list: &[(&str, u64)]) -> Event {
    Event::Drops {
        drops: list
            .iter()
            .map(|(w, n)| DropCount {
                what: w.to_string(),
                count: *n,
            })
            .collect(),
    }
}

pub fn end(partial: bool, reason: &str) -> Event {
    Event::End {
        partial,
        reason: reason.to_string(),
    }
}

pub const P_ROOT: &str = "Root";
pub const P_PREFETCH: &str = "Root::Prefetch";
pub const P_BATCH: &str = "Root::Prefetch::BatchV2";
pub const P_PMAP: &str = "Root::Prefetch::BatchV2::ParallelMapV2";
pub const P_TFREC: &str = "Root::Prefetch::BatchV2::ParallelMapV2::TFRecord";

/// Root, Prefetch, BatchV2, ParallelMapV2, TFRecord over 10 s.
/// Window deltas: Root/Prefetch/Batch 1000 elements, ParallelMap and
/// TFRecord 32000; processing times 1, 2, 3, 40, 50 s.
pub fn chain_at(t: u64, k: i64) -> Vec<NodeObservation> {
    vec![
        node(
            0x10,
            1,
            "Root",
            P_ROOT,
            None,
            c(100 + 100 * k, 100_000_000 * k),
        ),
        node(
            0x20,
            2,
            "Prefetch",
            P_PREFETCH,
            Some(0x10),
            buffered(
                c(100 + 100 * k, 200_000_000 * k),
                if t == 10 { 8 } else { 2 },
                8_000,
            ),
        ),
        node(
            0x30,
            3,
            "BatchV2",
            P_BATCH,
            Some(0x20),
            c(100 + 100 * k, 300_000_000 * k),
        ),
        with_par(
            node(
                0x40,
                4,
                "ParallelMapV2",
                P_PMAP,
                Some(0x30),
                buffered(c(3200 + 3200 * k, 4_000_000_000 * k), 16, 1600),
            ),
            if t == 10 { 2.5 } else { 2.0 },
        ),
        node(
            0x50,
            5,
            "TFRecord",
            P_TFREC,
            Some(0x40),
            c(3200 + 3200 * k, 5_000_000_000 * k),
        ),
    ]
}

pub fn chain_events() -> Vec<Event> {
    vec![
        target(),
        poll(0, chain_at(0, 0)),
        poll(5, chain_at(5, 5)),
        poll(10, chain_at(10, 10)),
        drops(&[("ringbuf", 3)]),
        end(false, "duration reached"),
    ]
}

pub const P_FLATMAP: &str = "Root::Prefetch::BatchV2::ParallelMapV2::FlatMap";
pub const P_SLICE: &str = "Root::Prefetch::BatchV2::ParallelMapV2::FlatMap::TensorSlice";
pub const P_FTFREC: &str = "Root::Prefetch::BatchV2::ParallelMapV2::FlatMap::TFRecord";

fn top4(k: i64) -> Vec<NodeObservation> {
    vec![
        node(0x10, 1, "Root", P_ROOT, None, c(10 * k, 1_000_000 * k)),
        node(
            0x20,
            2,
            "Prefetch",
            P_PREFETCH,
            Some(0x10),
            c(10 * k, 1_000_000 * k),
        ),
        node(
            0x30,
            3,
            "BatchV2",
            P_BATCH,
            Some(0x20),
            c(10 * k, 1_000_000 * k),
        ),
        with_par(
            node(
                0x40,
                4,
                "ParallelMapV2",
                P_PMAP,
                Some(0x30),
                c(100 * k, 10_000_000 * k),
            ),
            4.0,
        ),
        node(
            0x60,
            6,
            "FlatMap",
            P_FLATMAP,
            Some(0x40),
            c(100 * k, 1_000_000 * k),
        ),
        node(
            0x70,
            7,
            "TensorSlice",
            P_SLICE,
            Some(0x60),
            c(k / 2, 1_000 * k),
        ),
    ]
}

/// A multi-file TFRecordDataset: FlatMap over TensorSlice, one TFRecord per
/// file built by the FlatMap function. TFRecord instances:
/// A (0x80,10) seen at 0 s with 500, retired at 2 s with 1000 -> 500;
/// B (0x80,11) never polled, retired at 4 s with 1000 -> 1000;
/// C (0x90,12) seen at 5 s with 300, retired at 7 s with 1000 -> 1000;
/// D (0x80,13) seen at 10 s with 200, live at the end -> 200;
/// E (0xa0,14) retired after the window, F (0xb0,15) before it: ignored;
/// G (0xc0,16) retired in the window under an unknown parent: dropped.
/// Total 2700 elements over 4 instances.
pub fn flatmap_events() -> Vec<Event> {
    let fm = Some((0x60, 6));
    let mut p0 = top4(0);
    p0.push(fn_node(
        0x80,
        10,
        "TFRecord",
        P_FTFREC,
        Some(0x60),
        c(500, 5_000_000),
    ));
    let mut p5 = top4(5);
    p5.push(fn_node(
        0x90,
        12,
        "TFRecord",
        P_FTFREC,
        Some(0x60),
        c(300, 3_000_000),
    ));
    let mut p10 = top4(10);
    p10.push(fn_node(
        0x80,
        13,
        "TFRecord",
        P_FTFREC,
        Some(0x60),
        buffered(c(200, 2_000_000), 1, 100),
    ));
    vec![
        target(),
        retired_ms(-1000, 0xb0, 15, "TFRecord", fm, c(999, 1)),
        poll(0, p0),
        retired_ms(2000, 0x80, 10, "TFRecord", fm, c(1000, 10_000_000)),
        poll(5, p5),
        // Arrives after the 5 s poll but happened at 4 s.
        retired_ms(4000, 0x80, 11, "TFRecord", fm, c(1000, 10_000_000)),
        retired_ms(6000, 0xc0, 16, "TFRecord", Some((0xdead, 99)), c(777, 1)),
        retired_ms(7000, 0x90, 12, "TFRecord", fm, c(1000, 10_000_000)),
        poll(10, p10),
        retired_ms(11000, 0xa0, 14, "TFRecord", fm, c(888, 1)),
        // D retires after the window: its last poll counts.
        retired_ms(12000, 0x80, 13, "TFRecord", fm, c(400, 4_000_000)),
        end(false, "duration reached"),
    ]
}

/// CLOCK_MONOTONIC ns `t_ms` after the start (negative: before it).
pub fn mono_ms(t_ms: i64) -> u64 {
    (MONO0 as i64 + t_ms * 1_000_000) as u64
}

pub fn thread(tid: u32, name: &str, cpu_ns: u64) -> ThreadObservation {
    ThreadObservation {
        tid,
        name: name.to_string(),
        cpu_ns,
        waits: WaitCounters::default(),
        exited: false,
    }
}

pub fn with_waits(mut t: ThreadObservation, waits: WaitCounters) -> ThreadObservation {
    t.waits = waits;
    t
}

pub fn exited(mut t: ThreadObservation) -> ThreadObservation {
    t.exited = true;
    t
}

pub fn threads_ms(t_ms: i64, threads: Vec<ThreadObservation>) -> Event {
    Event::Threads {
        mono_ns: mono_ms(t_ms),
        threads,
    }
}

/// Evidence of `cpu_ns` on `op_path` for `tid`.
pub fn sample(tid: u32, op_path: &str, cpu_ns: u64) -> AttributionSample {
    AttributionSample {
        tid,
        node: 0xabc,
        op_path: op_path.to_string(),
        cpu_ns,
        waits: WaitCounters::default(),
        io_bytes: 0,
        stops: 1,
    }
}

pub fn attribution_ms(t_ms: i64, samples: Vec<AttributionSample>) -> Event {
    Event::Attribution {
        mono_ns: mono_ms(t_ms),
        samples,
    }
}

pub fn file_io(path: &str, op_path: &str, tid: u32, bytes_read: u64) -> FileIo {
    FileIo {
        path: path.to_string(),
        op_path: op_path.to_string(),
        tid,
        bytes_read,
        reads: bytes_read.div_ceil(100),
        opens: 1,
        read_ns: bytes_read * 10,
        ..Default::default()
    }
}

pub fn io_ms(t_ms: i64, files: Vec<FileIo>) -> Event {
    Event::Io {
        mono_ns: mono_ms(t_ms),
        files,
    }
}

pub fn lock_site(kind: &str, site: &str, op_path: &str, tid: u32, waits: u64, ns: u64) -> LockSite {
    LockSite {
        kind: kind.to_string(),
        site: site.to_string(),
        op_path: op_path.to_string(),
        tid,
        waits,
        wait_ns: ns,
    }
}

pub fn locks_ms(t_ms: i64, sites: Vec<LockSite>) -> Event {
    Event::LockSites {
        mono_ns: mono_ms(t_ms),
        sites,
    }
}

pub const T_MAIN: u32 = 1;
pub const T_POOL1: u32 = 101;
pub const T_POOL2: u32 = 102;
pub const T_GETNEXT: u32 = 201;
pub const T_READER: u32 = 202;
pub const T_COMPUTE: u32 = 301;
pub const POOL: &str = "tf_data_private_threadpool";

/// Root, Prefetch, ParallelMapV2 over a FlatMap whose function builds a
/// TFRecord, polled at 0, 5 and 10 s. Window processing times:
/// ParallelMapV2 3 s, FlatMap 1 s (the two function-running ops).
/// Threads (window CPU):
/// - two UDF-pool threads: 101 with 4 s + 1 ns and 0.4 s of GIL wait,
///   102 born at 5 s with 2 s;
/// - the main Python thread (1), 8 s, evidence 3:1 on Root and Prefetch,
///   1 s GIL wait (evidence: all on Root) and 0.4 s lock wait (no evidence);
/// - a pipeline thread without evidence (201), 1 s;
/// - a reader thread (202) with evidence on TFRecord only, exited at 5 s
///   after 0.7 s;
/// - `tf_Compute` (301), 0.5 s, no evidence.
///
/// Threads events before the first poll and after the last are ignored.
pub fn usage_events() -> Vec<Event> {
    let pipeline = |k: i64| {
        vec![
            node(0x10, 1, "Root", P_ROOT, None, c(10 * k, 1_000_000 * k)),
            node(
                0x20,
                2,
                "Prefetch",
                P_PREFETCH,
                Some(0x10),
                c(10 * k, 1_000_000 * k),
            ),
            with_par(
                node(
                    0x30,
                    3,
                    "ParallelMapV2",
                    P_UPMAP,
                    Some(0x20),
                    c(10 * k, 300_000_000 * k),
                ),
                2.0,
            ),
            node(
                0x40,
                4,
                "FlatMap",
                P_UFLATMAP,
                Some(0x30),
                c(10 * k, 100_000_000 * k),
            ),
            node(
                0x50,
                5,
                "TensorSlice",
                P_USLICE,
                Some(0x40),
                c(k, 1_000 * k),
            ),
            fn_node(
                0x60,
                6,
                "TFRecord",
                P_UTFREC,
                Some(0x40),
                c(10 * k, 2_000_000 * k),
            ),
        ]
    };
    let main_waits = |gil: u64, lock: u64| WaitCounters {
        gil_wait_ns: gil,
        gil_waits: gil / 1_000_000,
        lock_wait_ns: lock,
        lock_waits: lock / 1_000_000,
        ..Default::default()
    };
    let pool_waits = |gil: u64| WaitCounters {
        gil_wait_ns: gil,
        gil_waits: gil / 100_000_000,
        ..Default::default()
    };
    let mut root_waits = sample(T_MAIN, P_ROOT, 6_000);
    root_waits.waits.gil_wait_ns = 50;
    vec![
        target(),
        // Before the window: neither the baseline nor counted.
        threads_ms(-1000, vec![thread(T_MAIN, "python3", 1)]),
        io_ms(-500, vec![file_io("/data/early", P_UTFREC, T_READER, 999)]),
        poll(0, pipeline(0)),
        threads_ms(
            0,
            vec![
                with_waits(thread(T_MAIN, "python3", 100 * SEC), main_waits(SEC, SEC)),
                with_waits(thread(T_POOL1, POOL, 10 * SEC), pool_waits(0)),
                thread(T_GETNEXT, "tf_data_iterator_get_next", 3 * SEC),
                thread(T_READER, "tf_data_reader", SEC),
                thread(T_COMPUTE, "tf_Compute", 0),
            ],
        ),
        // Covers time before the first poll.
        io_ms(0, vec![file_io("/data/early", P_UTFREC, T_READER, 999)]),
        locks_ms(0, vec![lock_site("mutex", "early", P_UPMAP, T_POOL1, 1, 1)]),
        attribution_ms(2000, vec![sample(T_MAIN, P_PREFETCH, 1)]),
        io_ms(
            3000,
            vec![FileIo {
                size: Some(5_000),
                ..file_io("/data/a.tfrecord", P_UTFREC, T_READER, 1_000)
            }],
        ),
        locks_ms(
            4000,
            vec![
                lock_site(
                    "mutex",
                    "ParallelMapIterator::GetNextInternal",
                    P_UPMAP,
                    T_POOL1,
                    3,
                    300,
                ),
                lock_site(
                    "mutex",
                    "ParallelMapIterator::GetNextInternal",
                    P_UPMAP,
                    T_POOL2,
                    2,
                    200,
                ),
                lock_site("gil", "take_gil", "", T_MAIN, 10, 1_000),
            ],
        ),
        poll(5, pipeline(5)),
        threads_ms(
            5000,
            vec![
                with_waits(thread(T_MAIN, "python3", 104 * SEC), main_waits(SEC, SEC)),
                with_waits(thread(T_POOL1, POOL, 12 * SEC), pool_waits(0)),
                thread(T_POOL2, POOL, 0),
                thread(T_GETNEXT, "tf_data_iterator_get_next", 3 * SEC),
                exited(thread(T_READER, "tf_data_reader", 1_700_000_000)),
                thread(T_COMPUTE, "tf_Compute", 0),
            ],
        ),
        io_ms(
            8000,
            vec![
                // Unknown op: the reader's split names TFRecord alone.
                file_io("/data/b.tfrecord", "", T_READER, 300),
                // Unknown op: a pool thread's split names two ops.
                file_io("/data/c", "", T_POOL1, 77),
                // An op path that is not in the pipeline.
                file_io("/data/d", "Root::Gone", T_READER, 5),
            ],
        ),
        attribution_ms(
            9000,
            vec![
                root_waits,
                sample(T_MAIN, P_PREFETCH, 2_000),
                sample(T_READER, P_UTFREC, 500),
                // Another pipeline's node, not ours: no evidence.
                sample(T_GETNEXT, "", 0),
            ],
        ),
        poll(10, pipeline(10)),
        threads_ms(
            10_000,
            vec![
                with_waits(
                    thread(T_MAIN, "python3", 108 * SEC),
                    main_waits(2 * SEC, SEC + 400_000_000),
                ),
                with_waits(thread(T_POOL1, POOL, 14 * SEC + 1), pool_waits(400_000_000)),
                thread(T_POOL2, POOL, 2 * SEC),
                thread(T_GETNEXT, "tf_data_iterator_get_next", 4 * SEC),
                exited(thread(T_READER, "tf_data_reader", 1_700_000_000)),
                thread(T_COMPUTE, "tf_Compute", 500_000_000),
            ],
        ),
        // After the window: ignored.
        threads_ms(11_000, vec![thread(T_MAIN, "python3", 999 * SEC)]),
        io_ms(11_000, vec![file_io("/data/late", P_UTFREC, T_READER, 999)]),
        end(false, "duration reached"),
    ]
}

pub const P_UPMAP: &str = "Root::Prefetch::ParallelMapV2";
pub const P_UFLATMAP: &str = "Root::Prefetch::ParallelMapV2::FlatMap";
pub const P_USLICE: &str = "Root::Prefetch::ParallelMapV2::FlatMap::TensorSlice";
pub const P_UTFREC: &str = "Root::Prefetch::ParallelMapV2::FlatMap::TFRecord";

/// A unique scratch directory for one test.
pub fn scratch_dir(test: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("plumber-collector-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
