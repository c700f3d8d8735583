//! Bad stats files give one clear line and exit status 2.

mod common;

use plumber_analyzer::{analyze, load_file, load_snapshot, AnalyzeError, MachineOverrides};
use plumber_collector::proto::PipelineSnapshot;
use prost::Message;

#[track_caller]
fn one_line_exit_2(e: &AnalyzeError, must_contain: &str) {
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "multi-line error: {msg:?}");
    assert!(msg.contains(must_contain), "{msg:?} lacks {must_contain:?}");
    assert_eq!(e.exit_code(), 2, "{msg}");
}

fn valid_bytes() -> Vec<u8> {
    common::worked_example().snapshot().encode_to_vec()
}

#[test]
fn empty_file() {
    let e = load_snapshot(&[]).unwrap_err();
    one_line_exit_2(&e, "empty");
}

#[test]
fn truncated_file() {
    let bytes = valid_bytes();
    // Cut anywhere inside the first (graph) field, and halfway.
    for cut in [1, 2, 10, bytes.len() / 2, bytes.len() - 1] {
        let e = load_snapshot(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(
                e,
                AnalyzeError::Truncated(_) | AnalyzeError::GraphWithoutStats
            ),
            "cut at {cut}: {e}"
        );
        assert_eq!(e.exit_code(), 2);
        assert!(!e.to_string().contains('\n'));
    }
    let e = load_snapshot(&bytes[..bytes.len() / 2]).unwrap_err();
    one_line_exit_2(&e, "truncated");
}

#[test]
fn non_protobuf_files() {
    for bytes in [
        &b"{\"report\": true}"[..],
        b"plumber-probe stats\n",
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
        b"\x1f\x8b\x08\0\0\0\0\0",
    ] {
        let e = load_snapshot(bytes).unwrap_err();
        one_line_exit_2(&e, "not a protobuf PipelineSnapshot");
    }
}

#[test]
fn graph_without_stats() {
    let mut s = common::worked_example().snapshot();
    s.stats.clear();
    let e = load_snapshot(&s.encode_to_vec()).unwrap_err();
    one_line_exit_2(&e, "no per-op stats");
    // analyze() on an in-memory snapshot checks the same.
    let e = analyze(&s, &MachineOverrides::default()).unwrap_err();
    one_line_exit_2(&e, "no per-op stats");
}

#[test]
fn stats_without_graph_and_nothing_at_all() {
    let mut s = common::worked_example().snapshot();
    s.graph = None;
    let e = load_snapshot(&s.encode_to_vec()).unwrap_err();
    one_line_exit_2(&e, "no pipeline graph");
    let e = analyze(&PipelineSnapshot::default(), &MachineOverrides::default()).unwrap_err();
    one_line_exit_2(&e, "neither");
}

#[test]
fn no_time_window() {
    let mut s = common::worked_example().snapshot();
    s.snapshot_info = None;
    let e = analyze(&s, &MachineOverrides::default()).unwrap_err();
    one_line_exit_2(&e, "time window");
}

#[test]
fn bad_overrides() {
    let s = common::worked_example().snapshot();
    for ov in [
        MachineOverrides {
            cores: Some(0.0),
            ..Default::default()
        },
        MachineOverrides {
            cores: Some(f64::NAN),
            ..Default::default()
        },
        MachineOverrides {
            disk_bandwidth: Some(-1.0),
            ..Default::default()
        },
        MachineOverrides {
            memory_bytes: Some(0),
            ..Default::default()
        },
    ] {
        let e = analyze(&s, &ov).unwrap_err();
        one_line_exit_2(&e, "invalid machine figure");
    }
}

#[test]
fn overrides_replace_file_figures() {
    let s = common::worked_example().snapshot();
    let ov = MachineOverrides {
        cores: Some(16.0),
        memory_bytes: Some(1 << 30),
        disk_bandwidth: Some(1e9),
    };
    let r = analyze(&s, &ov).expect("analyze").into_report();
    assert_eq!(r.machine.cores, 16.0);
    assert_eq!(r.machine.cores_from, "override");
    assert_eq!(r.machine.memory_bytes, Some((1u64 << 30) as f64));
    assert_eq!(r.machine.disk_bandwidth, Some(1e9));
    assert!((r.lp.rate.unwrap_or(0.0) - 16.0 / 0.1755).abs() < 1e-6);
}

#[test]
fn missing_file_is_an_io_error() {
    let e = load_file(std::path::Path::new("/nonexistent/stats.pb")).unwrap_err();
    assert!(matches!(e, AnalyzeError::Io { .. }));
    assert!(e.to_string().contains("/nonexistent/stats.pb"));
}

#[test]
fn a_file_that_does_not_decode_is_named() {
    let f = std::env::temp_dir().join(format!("plumber-analyzer-bad-{}.pb", std::process::id()));
    std::fs::write(&f, b"garbage").expect("write");
    let e = load_file(&f).unwrap_err();
    let _ = std::fs::remove_file(&f);
    assert_eq!(e.exit_code(), 2);
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{}: ", f.display())), "{msg}");
    assert!(msg.contains("not a protobuf PipelineSnapshot"), "{msg}");
}

#[test]
fn directory_reads_the_last_dump() {
    let dir = std::env::temp_dir().join(format!("plumber-analyzer-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("stats_0001.pb"), b"garbage").expect("write");
    std::fs::write(dir.join("stats_0002.pb"), valid_bytes()).expect("write");
    let s = load_file(&dir).expect("last dump is valid");
    assert_eq!(s.stats.len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}
