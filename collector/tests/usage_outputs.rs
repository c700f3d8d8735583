//! CPU, wait and I/O data in stats.pb and report.json.
mod common;

use common::*;
use plumber_collector::collect;
use plumber_collector::proto::pipeline_snapshot::{FileSize, OpStats};
use plumber_collector::proto::PipelineSnapshot;
use plumber_collector::report::{measured, MeasuredNode, ReportThread};
use plumber_collector::snapshot::{read_stats, write_stats};
use prost::Message;

const MS: i64 = 1_000_000;
const S: i64 = 1_000_000_000;

fn by_path<'a>(s: &'a PipelineSnapshot, path: &str) -> &'a OpStats {
    s.stats
        .iter()
        .find(|o| o.probe_path == path)
        .unwrap_or_else(|| panic!("no stats for {path}"))
}

fn node<'a>(nodes: &'a [MeasuredNode], path: &str) -> &'a MeasuredNode {
    nodes
        .iter()
        .find(|n| n.path == path)
        .unwrap_or_else(|| panic!("no node {path}"))
}

#[test]
fn stats_pb_plumber_fields() {
    let s = collect(usage_events()).unwrap().snapshot;
    let pm = by_path(&s, P_UPMAP);
    assert_eq!(pm.aggregate_processing_time_clock, 4_500_000_001);
    assert_eq!(pm.processing_time_clock, 4_500_000_001);
    assert_eq!(pm.aggregate_udf_processing_time_clock, 4_500_000_001);
    assert_eq!(pm.aggregate_wait_time, 0);
    assert_eq!(pm.aggregate_disk_bytes_read, 0);
    // Not a reader: Plumber's field keeps its value.
    assert_eq!(pm.aggregate_elements_consumed, 0);

    let t = by_path(&s, P_UTFREC);
    assert_eq!(t.aggregate_processing_time_clock, 700 * MS);
    assert_eq!(t.aggregate_udf_processing_time_clock, 0);
    // No condition-variable wait: the time inside its reads.
    assert_eq!(t.aggregate_wait_time, 13_000);
    assert_eq!(t.aggregate_disk_bytes_read, 1_300);
    assert_eq!(t.aggregate_elements_consumed, 2);

    let ctx = s.ctx_info.as_ref().expect("ctx_info");
    assert_eq!(ctx.udf_threadpool_size, 2);
    assert_eq!(ctx.shared_threadpool_size, 0);
    let sizes: Vec<(&str, i64)> = ctx
        .file_sizes
        .iter()
        .map(|f| (f.name.as_str(), f.size))
        .collect();
    // st_size where known, else the bytes read.
    assert_eq!(
        sizes,
        [
            ("/data/a.tfrecord", 5_000),
            ("/data/b.tfrecord", 300),
            ("/data/c", 77),
            ("/data/d", 5)
        ]
    );
}

#[test]
fn stats_pb_extension_fields() {
    let s = collect(usage_events()).unwrap().snapshot;
    let pm = by_path(&s, P_UPMAP);
    assert_eq!((pm.probe_gil_wait_ns, pm.probe_gil_waits), (300 * MS, 3));
    let pf = by_path(&s, P_PREFETCH);
    assert_eq!(
        (pf.probe_lock_wait_ns, pf.probe_lock_waits),
        (100 * MS, 100)
    );
    assert_eq!(pf.aggregate_processing_time_clock, 2 * S);
    assert!(!pf.probe_cpu_from_self_time);
    // No window caught TensorSlice: its self time, marked.
    let slice = by_path(&s, P_USLICE);
    assert_eq!(slice.aggregate_processing_time_clock, 10_000);
    assert!(slice.probe_cpu_from_self_time);
    let t = by_path(&s, P_UTFREC);
    assert_eq!(
        (
            t.probe_io_bytes_read,
            t.probe_io_read_ns,
            t.probe_files_opened
        ),
        (1_300, 13_000, 2)
    );
    let files: Vec<(&str, i64, i64)> = t
        .probe_files
        .iter()
        .map(|f| (f.path.as_str(), f.bytes_read, f.size))
        .collect();
    assert_eq!(
        files,
        [
            ("/data/a.tfrecord", 1_000, 5_000),
            ("/data/b.tfrecord", 300, 0)
        ]
    );

    let cpu = s.probe_cpu.as_ref().expect("probe_cpu");
    assert_eq!(
        (
            cpu.process_ns,
            cpu.threads_ns,
            cpu.pipeline_ns,
            cpu.unattributed_ns,
            cpu.non_pipeline_ns
        ),
        // TensorSlice, which no window caught: its 10 µs self time moved
        // from the unattributed.
        (
            20 * S,
            16_200_000_001,
            8_700_010_001,
            S - 10_000,
            6_500_000_000
        )
    );
    assert_eq!(cpu.threads.len(), 6);
    let main = &cpu.threads[0];
    assert_eq!(
        (
            main.tid,
            main.name.as_str(),
            main.role.as_str(),
            main.cpu_ns
        ),
        (1, "python3", "non_pipeline", 8 * S)
    );
    assert_eq!(main.attributed.len(), 1);
    assert_eq!(main.attributed[0].op_path, P_PREFETCH);
    assert_eq!(main.attributed[0].cpu_ns, 2 * S);
    assert_eq!(main.non_pipeline_ns, 6 * S);
    // The main thread takes the root's elements: its outside CPU is the
    // consumer's, and so is the snapshot's (tf_Compute's is not).
    assert_eq!(main.consumer_ns, 6 * S);
    assert_eq!(cpu.consumer_ns, 6 * S);
    assert_eq!(main.waits.as_ref().map(|w| w.gil_wait_ns), Some(S));
    assert_eq!(cpu.threads[1].role, "udf_pool");
    assert_eq!(
        cpu.non_pipeline_waits.as_ref().map(|w| w.gil_wait_ns),
        Some(S)
    );
    assert_eq!(s.probe_files.len(), 4);
    assert_eq!(s.probe_unattributed_io_bytes, 82);
    assert_eq!(s.probe_lock_sites.len(), 2);
    assert_eq!(s.probe_lock_sites[0].kind, "gil");
    assert_eq!(s.probe_lock_sites[1].waits, 5);
}

#[test]
fn usage_fields_survive_the_file() {
    let s = collect(usage_events()).unwrap().snapshot;
    let dir = scratch_dir("usage_pb");
    let path = dir.join("stats.pb");
    write_stats(&path, &s).unwrap();
    let back = read_stats(&path).unwrap();
    assert_eq!(back, s);
    // The report is rebuilt from the file alone.
    assert_eq!(measured(&back), measured(&s));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_thread_data_still_carries_the_machines_busy_cpu() {
    use plumber_collector::event::Event;
    let events: Vec<Event> = chain_events()
        .into_iter()
        .map(|e| match e {
            Event::Poll(mut p) => {
                p.machine_busy_ns = Some(p.mono_ns);
                Event::Poll(p)
            }
            e => e,
        })
        .collect();
    let s = collect(events).unwrap().snapshot;
    let cpu = s.probe_cpu.as_ref().expect("probe_cpu");
    assert!(cpu.machine_busy_ns > 0);
    // Nothing per thread or per process: the analyzer reads that as not
    // measured.
    assert!(cpu.threads.is_empty() && cpu.process_ns == 0 && cpu.non_pipeline_ns == 0);
}

#[test]
fn no_thread_data_leaves_the_fields_unset() {
    for events in [chain_events(), flatmap_events()] {
        let s = collect(events).unwrap().snapshot;
        assert!(s.probe_cpu.is_none());
        assert!(s.ctx_info.is_none());
        assert!(s.probe_files.is_empty() && s.probe_lock_sites.is_empty());
        assert_eq!(s.probe_unattributed_io_bytes, 0);
        for st in &s.stats {
            let cleared = OpStats {
                name: st.name.clone(),
                probe_model_name: st.probe_model_name.clone(),
                probe_path: st.probe_path.clone(),
                ..OpStats::default()
            };
            // Every usage field is at its default, so nothing new is encoded.
            let usage = OpStats {
                processing_time_clock: st.processing_time_clock,
                aggregate_processing_time_clock: st.aggregate_processing_time_clock,
                aggregate_udf_processing_time_clock: st.aggregate_udf_processing_time_clock,
                aggregate_wait_time: st.aggregate_wait_time,
                aggregate_disk_bytes_read: st.aggregate_disk_bytes_read,
                aggregate_elements_consumed: st.aggregate_elements_consumed,
                probe_lock_wait_ns: st.probe_lock_wait_ns,
                probe_lock_waits: st.probe_lock_waits,
                probe_gil_wait_ns: st.probe_gil_wait_ns,
                probe_gil_waits: st.probe_gil_waits,
                probe_cond_wait_ns: st.probe_cond_wait_ns,
                probe_cond_waits: st.probe_cond_waits,
                probe_futex_wait_ns: st.probe_futex_wait_ns,
                probe_futex_waits: st.probe_futex_waits,
                probe_io_bytes_read: st.probe_io_bytes_read,
                probe_io_read_ns: st.probe_io_read_ns,
                probe_files_opened: st.probe_files_opened,
                probe_files: st.probe_files.clone(),
                probe_io_wait_ns: st.probe_io_wait_ns,
                ..cleared.clone()
            };
            assert_eq!(
                usage.encode_to_vec(),
                cleared.encode_to_vec(),
                "{}",
                st.name
            );
        }
    }
}

#[test]
fn file_sizes_from_complete_reads() {
    let mut events = usage_events();
    let extra = io_ms(
        9_000,
        vec![plumber_collector::event::FileIo {
            complete_sessions: 2,
            complete_bytes: 600,
            ..file_io("/data/e", P_UTFREC, T_READER, 700)
        }],
    );
    let at = events.len() - 4;
    events.insert(at, extra);
    let s = collect(events).unwrap().snapshot;
    let ctx = s.ctx_info.unwrap();
    // No st_size: one complete read's bytes rather than all bytes read.
    assert!(ctx.file_sizes.contains(&FileSize {
        name: "/data/e".to_string(),
        size: 300
    }));
}

#[test]
fn report_json_usage_fields() {
    let got = collect(usage_events()).unwrap();
    let r = got.report();
    let t = node(&r.nodes, P_UTFREC);
    assert_eq!(t.cpu_ns, 700 * MS);
    // 0.7 s over 100 elements.
    assert_eq!(t.cpu_ms_per_element, Some(7.0));
    assert_eq!((t.io_bytes_read, t.files_opened), (1_300, 2));
    let pm = node(&r.nodes, P_UPMAP);
    assert_eq!(pm.gil_wait_ns, 300 * MS);
    assert_eq!(node(&r.nodes, P_PREFETCH).lock_wait_ns, 100 * MS);
    // No window caught TensorSlice: 10 µs of self time over 10 elements.
    let slice = node(&r.nodes, P_USLICE);
    assert_eq!(slice.cpu_ms_per_element, Some(0.001));
    assert!(slice.cpu_from_self_time);
    assert!(!t.cpu_from_self_time);
    assert_eq!(r.process_cpu_ns, 20 * S);
    assert_eq!(r.unattributed_cpu_ns, S - 10_000);
    assert_eq!(r.non_pipeline_cpu_ns, 6_500_000_000);
    let files: Vec<(&str, i64, Option<&str>)> = r
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.bytes_read, f.op.as_deref()))
        .collect();
    let tfrec = t.name.as_str();
    // Most bytes first.
    assert_eq!(
        files,
        [
            ("/data/a.tfrecord", 1_000, Some(tfrec)),
            ("/data/b.tfrecord", 300, Some(tfrec)),
            ("/data/c", 77, None),
            ("/data/d", 5, None)
        ]
    );
    assert_eq!(
        r.threads[0],
        ReportThread {
            tid: 1,
            name: "python3".to_string(),
            role: "non_pipeline".to_string(),
            cpu_ns: 8 * S
        }
    );
    assert_eq!(r.lock_sites.len(), 2);
    assert_eq!(r.lock_sites[1].op.as_deref(), Some(pm.name.as_str()));
    assert_eq!(r.lock_sites[0].op, None);

    let json = serde_json::to_value(&r).unwrap();
    for key in [
        "process_cpu_ns",
        "unattributed_cpu_ns",
        "non_pipeline_cpu_ns",
        "files",
        "threads",
        "lock_sites",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }
    let n = &json["nodes"][0];
    for key in [
        "cpu_ns",
        "cpu_ms_per_element",
        "io_bytes_read",
        "files_opened",
        "lock_wait_ns",
        "gil_wait_ns",
        "cond_wait_ns",
    ] {
        assert!(n.get(key).is_some(), "{key}");
    }
}

#[test]
fn report_json_reads_older_reports() {
    // A report.json written before these fields existed still parses.
    let mut json = serde_json::to_value(collect(chain_events()).unwrap().report()).unwrap();
    let obj = json.as_object_mut().unwrap();
    for key in ["process_cpu_ns", "files", "threads", "lock_sites"] {
        obj.remove(key);
    }
    if let Some(nodes) = obj.get_mut("nodes").and_then(|n| n.as_array_mut()) {
        for n in nodes {
            n.as_object_mut().unwrap().remove("cpu_ns");
        }
    }
    let r: plumber_collector::report::MeasuredReport = serde_json::from_value(json).unwrap();
    assert!(r.threads.is_empty());
    assert_eq!(r.nodes[0].cpu_ns, 0);
}

/// The machine's busy CPU over the window (first to last poll) and the
/// cgroup quota: the analyzer's core budget takes other processes and the
/// quota from them.
#[test]
fn machine_busy_cpu_and_quota_reach_stats_pb() {
    use plumber_collector::event::Event;
    let events: Vec<Event> = usage_events()
        .into_iter()
        .map(|e| match e {
            Event::Poll(mut p) => {
                // 1.5 cores busy on the machine from an arbitrary start.
                p.machine_busy_ns = Some(7 * S as u64 + p.mono_ns / 2 * 3);
                Event::Poll(p)
            }
            Event::Target(mut t) => {
                t.cpu_quota_cores = Some(1.5);
                Event::Target(t)
            }
            e => e,
        })
        .collect();
    let s = collect(events).unwrap().snapshot;
    let info = s.snapshot_info.as_ref().expect("snapshot_info");
    let window = (info.current_time - info.start_time) as f64;
    let cpu = s.probe_cpu.as_ref().expect("probe_cpu");
    assert!(
        (cpu.machine_busy_ns as f64 - 1.5 * window).abs() <= 2.0,
        "{} over {window}",
        cpu.machine_busy_ns
    );
    assert_eq!(cpu.cpu_quota_cores, 1.5);
    // Without them: 0, "not measured".
    let s = collect(usage_events()).unwrap().snapshot;
    let cpu = s.probe_cpu.as_ref().expect("probe_cpu");
    assert_eq!((cpu.machine_busy_ns, cpu.cpu_quota_cores), (0, 0.0));
}
