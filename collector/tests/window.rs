mod common;

use common::*;
use plumber_collector::event::Event;
use plumber_collector::totals::OpTotals;
use plumber_collector::window::{aggregate, drops as own, WindowError, WindowResult};

fn op<'a>(w: &'a WindowResult, path: &str) -> &'a OpTotals {
    w.ops.iter().find(|o| o.path == path).unwrap_or_else(|| {
        panic!(
            "no op {path} in {:?}",
            w.ops.iter().map(|o| &o.path).collect::<Vec<_>>()
        )
    })
}

fn drop_count(w: &WindowResult, what: &str) -> Option<u64> {
    w.drops.iter().find(|d| d.what == what).map(|d| d.count)
}

#[test]
fn chain_deltas() {
    let w = aggregate(chain_events()).unwrap();
    assert_eq!(w.polls, 3);
    assert_eq!(w.duration_ns(), 10 * SEC);
    assert_eq!(w.start.wall_ns, WALL0);
    assert_eq!(w.end.wall_ns, WALL0 + 10 * SEC);
    assert_eq!(w.start.process_cpu_ns, CPU0);
    assert_eq!(w.end.process_cpu_ns, CPU0 + 20 * SEC);
    let paths: Vec<&str> = w.ops.iter().map(|o| o.path.as_str()).collect();
    assert_eq!(paths, [P_ROOT, P_PREFETCH, P_BATCH, P_PMAP, P_TFREC]);

    let expect = [
        (P_ROOT, 1000, 1_000_000_000, None, 1.0),
        (P_PREFETCH, 1000, 2_000_000_000, Some(P_ROOT), 1.0),
        (P_BATCH, 1000, 3_000_000_000, Some(P_PREFETCH), 32.0),
        (P_PMAP, 32000, 40_000_000_000, Some(P_BATCH), 1.0),
        (P_TFREC, 32000, 50_000_000_000, Some(P_PMAP), -1.0),
    ];
    for (path, elements, pt, parent, ratio) in expect {
        let o = op(&w, path);
        assert_eq!(o.elements, elements, "{path}");
        assert_eq!(o.bytes_produced, elements * 100, "{path}");
        assert_eq!(o.bytes_consumed, elements * 10, "{path}");
        assert_eq!(o.processing_time_ns, pt, "{path}");
        assert_eq!(o.parent_path.as_deref(), parent, "{path}");
        assert_eq!(o.element_ratio, ratio, "{path}");
        assert_eq!(o.instances, 1, "{path}");
        assert_eq!(o.live_instances, 1, "{path}");
        assert!(!o.in_function);
    }
    assert_eq!(op(&w, P_PREFETCH).buffered_elements, 8);
    assert_eq!(op(&w, P_PREFETCH).buffered_bytes, 8000);
    assert_eq!(op(&w, P_PMAP).buffered_elements, 16);
    // Latest value, not the first.
    assert_eq!(op(&w, P_PMAP).parallelism, Some(2.5));
    assert_eq!(op(&w, P_TFREC).parallelism, Some(1.0));
    assert_eq!(op(&w, P_PMAP).model_name, "ParallelMapV2");

    assert_eq!(w.target.as_ref().unwrap().pid, 4242);
    assert!(!w.partial());
    assert_eq!(w.end_event.as_ref().unwrap().reason, "duration reached");
    assert_eq!(drop_count(&w, "ringbuf"), Some(3));
    assert_eq!(
        w.drops.len(),
        1,
        "no collector drops expected: {:?}",
        w.drops
    );
}

#[test]
fn per_file_instances_sum_exactly() {
    let w = aggregate(flatmap_events()).unwrap();
    let t = op(&w, P_FTFREC);
    assert_eq!(t.elements, 500 + 1000 + 1000 + 200);
    assert_eq!(t.bytes_produced, 270_000);
    assert_eq!(
        t.processing_time_ns,
        5_000_000 + 10_000_000 + 10_000_000 + 2_000_000
    );
    assert_eq!(t.instances, 4);
    assert_eq!(t.live_instances, 1);
    assert_eq!(t.buffered_elements, 1);
    assert_eq!(t.buffered_bytes, 100);
    assert!(t.in_function);
    assert_eq!(t.parent_path.as_deref(), Some(P_FLATMAP));
    assert_eq!(t.element_ratio, -1.0);

    let fm = op(&w, P_FLATMAP);
    assert_eq!(fm.elements, 1000);
    // First non-function input is TensorSlice (5 elements), not TFRecord.
    assert_eq!(fm.element_ratio, 5.0 / 1000.0);
    assert_eq!(op(&w, P_PMAP).parallelism, Some(4.0));

    // G had an unknown parent; E and F were outside the window (no drop).
    assert_eq!(drop_count(&w, own::RETIRED_NODE_UNPLACED), Some(1));
    assert_eq!(drop_count(&w, own::COUNTER_WENT_BACKWARDS), None);
    assert_eq!(w.ops.len(), 7);
}

#[test]
fn live_at_start_retired_mid_window() {
    let w = aggregate([
        poll(
            0,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 2, "Range", "Root::Range", Some(1), c(40, 400)),
            ],
        ),
        retired_ms(3000, 2, 2, "Range", Some((1, 1)), c(100, 1000)),
        poll(10, vec![node(1, 1, "Root", "Root", None, c(60, 0))]),
        end(true, "target exited"),
    ])
    .unwrap();
    let r = op(&w, "Root::Range");
    assert_eq!(
        (
            r.elements,
            r.processing_time_ns,
            r.instances,
            r.live_instances
        ),
        (60, 600, 1, 0)
    );
    assert_eq!(r.buffered_elements, 0);
    assert!(w.partial());
}

#[test]
fn retired_outside_window_is_ignored() {
    let w = aggregate([
        retired_ms(-5, 2, 2, "Range", Some((1, 1)), c(1_000, 1)),
        poll(
            0,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 3, "Range", "Root::Range", Some(1), c(10, 0)),
            ],
        ),
        poll(
            1,
            vec![
                node(1, 1, "Root", "Root", None, c(5, 0)),
                node(2, 3, "Range", "Root::Range", Some(1), c(15, 0)),
            ],
        ),
        // After the last poll: the last poll's counters count.
        retired_ms(1001, 2, 3, "Range", Some((1, 1)), c(1_000, 1)),
        retired_ms(1002, 9, 9, "Range", Some((1, 1)), c(1_000, 1)),
    ])
    .unwrap();
    assert_eq!(op(&w, "Root::Range").elements, 5);
    assert_eq!(op(&w, "Root::Range").instances, 1);
    assert!(w.drops.is_empty(), "{:?}", w.drops);
    // No End event: the stream was cut off.
    assert!(w.partial());
}

#[test]
fn addr_reuse_with_new_id() {
    // The same address holds id 2 (counters high) then id 3 (counters low):
    // treated as two instances, nothing goes backwards.
    let w = aggregate([
        poll(
            0,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 2, "Range", "Root::Range", Some(1), c(900, 9)),
            ],
        ),
        poll(
            1,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 3, "Range", "Root::Range", Some(1), c(30, 3)),
            ],
        ),
        poll(
            2,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 3, "Range", "Root::Range", Some(1), c(50, 5)),
            ],
        ),
    ])
    .unwrap();
    let r = op(&w, "Root::Range");
    // id 2: 900 -> 900 (no retire seen), id 3: born inside, 0 -> 50.
    assert_eq!((r.elements, r.instances, r.live_instances), (50, 2, 1));
    assert_eq!(drop_count(&w, own::COUNTER_WENT_BACKWARDS), None);
}

#[test]
fn retired_child_of_retired_parent_is_placed() {
    // An interleave-style op whose per-element dataset (and its input) lived
    // between two polls: the grandchild is placed through the child.
    let w = aggregate([
        poll(
            0,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 2, "Interleave", "Root::Interleave", Some(1), c(0, 0)),
                node(3, 3, "Range", "Root::Interleave::Range", Some(2), c(0, 0)),
            ],
        ),
        retired_ms(500, 5, 21, "Take", Some((4, 20)), c(7, 70)),
        retired_ms(600, 4, 20, "Map", Some((2, 2)), c(7, 700)),
        poll(
            1,
            vec![
                node(1, 1, "Root", "Root", None, c(7, 0)),
                node(2, 2, "Interleave", "Root::Interleave", Some(1), c(7, 0)),
                node(3, 3, "Range", "Root::Interleave::Range", Some(2), c(1, 0)),
            ],
        ),
    ])
    .unwrap();
    let map = op(&w, "Root::Interleave::Map");
    assert_eq!((map.elements, map.processing_time_ns), (7, 700));
    // Interleave already had its input (Range): Map is a function dataset.
    assert!(map.in_function);
    let take = op(&w, "Root::Interleave::Map::Take");
    assert_eq!(take.elements, 7);
    assert!(!take.in_function);
    assert_eq!(take.parent_path.as_deref(), Some("Root::Interleave::Map"));
    assert_eq!(op(&w, "Root::Interleave").element_ratio, 1.0 / 7.0);
    assert!(w.drops.is_empty(), "{:?}", w.drops);
}

#[test]
fn counter_going_backwards_is_clamped_and_counted() {
    let w = aggregate([
        poll(0, vec![node(1, 1, "Root", "Root", None, c(100, 50))]),
        poll(1, vec![node(1, 1, "Root", "Root", None, c(40, 60))]),
    ])
    .unwrap();
    let r = op(&w, "Root");
    assert_eq!((r.elements, r.processing_time_ns), (0, 10));
    // num_elements, bytes_produced and bytes_consumed went backwards.
    assert_eq!(drop_count(&w, own::COUNTER_WENT_BACKWARDS), Some(3));
}

#[test]
fn drops_keep_latest_and_parallelism_is_not_summed() {
    let par = |addr, id, p| {
        with_par(
            node(
                addr,
                id,
                "ParallelMapV2",
                "Root::PI::ParallelMapV2",
                Some(2),
                c(0, 0),
            ),
            p,
        )
    };
    let w = aggregate([
        drops(&[("ringbuf", 1), ("bad_vptr", 4)]),
        poll(
            0,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 2, "ParallelInterleaveV4", "Root::PI", Some(1), c(0, 0)),
                par(3, 3, 4.0),
                par(4, 4, 4.0),
            ],
        ),
        drops(&[("ringbuf", 7)]),
        poll(
            1,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 2, "ParallelInterleaveV4", "Root::PI", Some(1), c(0, 0)),
                par(3, 3, 4.0),
                par(4, 4, 4.0),
            ],
        ),
    ])
    .unwrap();
    assert_eq!(op(&w, "Root::PI::ParallelMapV2").parallelism, Some(4.0));
    assert_eq!(op(&w, "Root::PI::ParallelMapV2").instances, 2);
    // A knob never read stays unknown; a knob-less op is 1.
    assert_eq!(op(&w, "Root::PI").parallelism, None);
    assert_eq!(op(&w, "Root").parallelism, Some(1.0));
    assert_eq!(drop_count(&w, "ringbuf"), Some(7));
    assert_eq!(drop_count(&w, "bad_vptr"), Some(4));
}

#[test]
fn out_of_order_poll_is_dropped() {
    let w = aggregate([
        poll(0, vec![node(1, 1, "Root", "Root", None, c(0, 0))]),
        poll(2, vec![node(1, 1, "Root", "Root", None, c(20, 0))]),
        poll(1, vec![node(1, 1, "Root", "Root", None, c(10, 0))]),
    ])
    .unwrap();
    assert_eq!(op(&w, "Root").elements, 20);
    assert_eq!(w.polls, 2);
    assert_eq!(drop_count(&w, own::POLL_OUT_OF_ORDER), Some(1));
}

#[test]
fn errors() {
    assert_eq!(aggregate(Vec::<Event>::new()), Err(WindowError::NoData));
    assert_eq!(
        aggregate([target(), end(false, "x")]),
        Err(WindowError::NoData)
    );
    let one = aggregate([poll(0, chain_at(0, 0))]).unwrap_err();
    assert_eq!(one, WindowError::ZeroLengthWindow { polls: 1 });
    assert!(one.to_string().contains("zero-length window"), "{one}");
    assert!(one.to_string().contains("1 poll"), "{one}");
    assert_eq!(
        aggregate([poll(3, chain_at(0, 0)), poll(3, chain_at(0, 0))]),
        Err(WindowError::ZeroLengthWindow { polls: 2 })
    );
    assert_eq!(
        aggregate([poll(0, vec![]), poll(1, vec![])]),
        Err(WindowError::EmptyPipeline { polls: 2 })
    );
}

#[test]
fn retired_parent_without_id() {
    let mut r1 = retired_ms(500, 9, 90, "Range", Some((2, 0)), c(4, 0));
    let mut r2 = retired_ms(600, 8, 80, "Range", Some((3, 0)), c(4, 0));
    for r in [&mut r1, &mut r2] {
        if let Event::Retired(r) = r {
            r.parent_id = None;
        }
    }
    let w = aggregate([
        poll(
            0,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 2, "Interleave", "Root::Interleave", Some(1), c(0, 0)),
                node(3, 3, "Zip", "Root::Zip", Some(1), c(0, 0)),
            ],
        ),
        r1,
        r2,
        // Address 3 now holds a different op: a parent given as address 3
        // alone is ambiguous.
        poll(
            1,
            vec![
                node(1, 1, "Root", "Root", None, c(0, 0)),
                node(2, 2, "Interleave", "Root::Interleave", Some(1), c(0, 0)),
                node(3, 4, "Take", "Root::Take", Some(1), c(0, 0)),
            ],
        ),
    ])
    .unwrap();
    assert_eq!(op(&w, "Root::Interleave::Range").elements, 4);
    assert!(w.op_index("Root::Zip::Range").is_none());
    assert_eq!(drop_count(&w, own::RETIRED_NODE_UNPLACED), Some(1));
}
