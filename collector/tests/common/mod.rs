//! Builders for synthetic event streams shared by the integration tests.
#![allow(dead_code)]

use plumber_collector::event::{
    Drop, Event, NodeCounters, NodeObservation, NodeRetired, Poll, TargetInfo,
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
        memory_total: 64 << 30,
        memory_free: 32 << 30,
    })
}

pub fn drops(list: &[(&str, u64)]) -> Event {
    Event::Drops {
        drops: list
            .iter()
            .map(|(w, n)| Drop {
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

/// A unique scratch directory for one test.
pub fn scratch_dir(test: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("plumber-collector-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
