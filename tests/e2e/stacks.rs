//! Stack sampling and the flamegraph outputs of a recording:
//! the sampled stacks are unwound through code without frame pointers
//! (TensorFlow, glibc, libjpeg-turbo's SIMD assembly) to the thread's entry
//! point and land under the op the thread works for.

use std::path::Path;

use serde_json::Value;

use crate::harness::*;

/// (stack, count) of every line of a folded file.
fn folded(out: &Path, name: &str) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    text.lines()
        .map(|l| {
            let (s, c) = l.rsplit_once(' ').expect("STACK COUNT");
            (s.to_string(), c.parse().expect("count"))
        })
        .collect()
}

/// The `stacks: N samples, X% complete ...` line of the probe's output.
fn stacks_line(stdout: &str) -> (u64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("stacks: "))
        .unwrap_or_else(|| panic!("no `stacks:` line in:\n{stdout}"));
    let mut w = line.split_whitespace();
    let n = w.nth(1).and_then(|v| v.parse().ok()).expect("sample count");
    let pct = w
        .nth(1)
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .expect("complete %");
    (n, pct)
}

/// Records a workload for `seconds` with stack sampling at 49 Hz; the
/// output directory and the probe's stdout.
fn record_sampled(script: &str, tag: &str, seconds: &str) -> (TestDir, String) {
    require_root();
    let w = Workload::start(script, &[]);
    let out = tempdir(tag);
    let pid = w.pid.to_string();
    let o = run_probe(&[
        "--pid",
        &pid,
        "--duration",
        seconds,
        "--output",
        out.to_str().expect("utf8"),
        "-q",
        "--sample-hz",
        "49",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "plumber-probe failed: {}\n{stdout}",
        String::from_utf8_lossy(&o.stderr)
    );
    (out, stdout)
}

#[test]
fn image_pipeline_stacks_under_the_map_op() {
    let (out, stdout) = record_sampled("tfrecord_image.py", "stacks-image", "6");
    let (samples, complete) = stacks_line(&stdout);
    eprintln!("{samples} samples, {complete:.1}% complete");
    for f in [
        "cpu.svg",
        "profile.pb.gz",
        "trace.json",
        "offcpu.svg",
        "io.svg",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report"))
            .expect("report.json");

    // The pool threads wait for work, the prefetch thread for room.
    let offcpu = folded(&out, "offcpu.folded");
    assert!(
        offcpu
            .iter()
            .any(|(s, _)| s.starts_with("[ParallelMapV2];")),
        "no blocked time under the map op in offcpu.folded"
    );
    check_io_stacks(&out, &report);
    check_cpu_stacks(&out, samples);

    // Stacks unwound with .eh_frame reach a thread entry point.
    assert!(complete >= 95.0, "{complete}% complete stacks");

    check_op_spans(&out);
    check_no_drops(&report);
}

/// Every byte of the recording's file reads, by stack, under the op that
/// read it, the file as the leaf.
fn check_io_stacks(out: &Path, report: &Value) {
    let io = folded(out, "io.folded");
    let io_bytes: u64 = io.iter().map(|(_, c)| c).sum();
    let read: f64 = report["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["bytes_read"].as_f64())
        .sum();
    assert!(io_bytes > 0, "io.folded is empty");
    assert_eq!(
        io_bytes as f64, read,
        "io.folded bytes vs report.json files"
    );
    for (s, _) in &io {
        assert!(
            s.starts_with("[TFRecord];") && s.ends_with(".tfrecord]"),
            "read not under TFRecord: {s}"
        );
    }
}

/// cpu.folded counts `samples` periods at 49 Hz, most of them the map's,
/// and the decode under the map down to libjpeg.
fn check_cpu_stacks(out: &Path, samples: u64) {
    let cpu = folded(out, "cpu.folded");
    let total: u64 = cpu.iter().map(|(_, c)| c).sum();
    let period = 1_000_000_000 / 49;
    assert_eq!(total / period, samples, "cpu.folded counts vs samples");
    // Two cores mostly busy for 6 s: hundreds of samples at 49 Hz.
    assert!(samples >= 200, "{samples} samples");

    // The decode runs on the UDF pool under the map op, with the libjpeg
    // frames (SIMD assembly without CFI) below the TF kernel that called
    // them, and the whole stack down to the thread's start.
    let map: Vec<&(String, u64)> = cpu
        .iter()
        .filter(|(s, _)| s.starts_with("[ParallelMapV2];"))
        .collect();
    let map_ns: u64 = map.iter().map(|(_, c)| c).sum();
    assert!(
        map_ns as f64 > 0.5 * total as f64,
        "map {map_ns} of {total} ns"
    );
    let decode: u64 = map
        .iter()
        .filter(|(s, _)| s.contains("DecodeImageV2Op") || s.contains("DecodeJpeg"))
        .map(|(_, c)| c)
        .sum();
    assert!(
        decode as f64 > 0.3 * map_ns as f64,
        "decode {decode} of the map's {map_ns} ns"
    );
    assert!(
        map.iter().any(|(s, _)| s.contains("DecodeImageV2Op")
            && s.contains("jpeg_read_scanlines")
            && s.contains(";start_thread;")),
        "no complete stack from start_thread through DecodeImageV2Op into libjpeg"
    );
    let resize = map
        .iter()
        .filter(|(s, _)| s.contains("ResizeBilinear") || s.contains("Resize"))
        .count();
    eprintln!("{resize} distinct resize stacks under the map");
}

/// Op spans of the attribution windows: which op each thread worked for,
/// when; one thread's spans never overlap.
fn check_op_spans(out: &Path) {
    let trace: Value =
        serde_json::from_slice(&std::fs::read(out.join("trace.json")).expect("trace.json"))
            .expect("trace.json is JSON");
    let mut by_tid: std::collections::BTreeMap<u64, Vec<(f64, f64)>> = Default::default();
    let mut pool_map_spans = 0;
    let pool: Vec<u64> = trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "M" && e["args"]["name"] == "tf_data_private_threadpool")
        .filter_map(|e| e["tid"].as_u64())
        .collect();
    for e in trace["traceEvents"].as_array().expect("traceEvents") {
        if e["ph"] != "X" {
            continue;
        }
        let (ts, dur, tid) = (
            e["ts"].as_f64().expect("ts"),
            e["dur"].as_f64().expect("dur"),
            e["tid"].as_u64().expect("tid"),
        );
        assert!(ts >= 0.0 && dur > 0.0, "{e}");
        assert!(
            e["args"]["op_path"]
                .as_str()
                .is_some_and(|p| p.starts_with("Root")),
            "{e}"
        );
        if e["name"] == "ParallelMapV2" && pool.contains(&tid) {
            pool_map_spans += 1;
        }
        by_tid.entry(tid).or_default().push((ts, ts + dur));
    }
    let spans: usize = by_tid.values().map(Vec::len).sum();
    eprintln!("{spans} op spans on {} threads", by_tid.len());
    assert!(spans >= 100, "{spans} op spans in trace.json");
    // The UDF pool's work is the map's.
    assert!(pool_map_spans > 0, "no ParallelMapV2 span on the UDF pool");
    for (tid, mut v) in by_tid {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in v.windows(2) {
            // 1 ns of slack: ts and dur are printed in µs with 3 decimals.
            assert!(w[0].1 <= w[1].0 + 0.001, "spans overlap on {tid}: {w:?}");
        }
    }
}

/// Nothing lost in the sampler.
fn check_no_drops(report: &Value) {
    let drops = report["drops"].as_array().expect("drops");
    for what in [
        "sample_ringbuf_full",
        "sample_stack_copy_failed",
        "span_ringbuf_full",
        "spans_over_limit",
    ] {
        let d = drops
            .iter()
            .find(|d| d["what"] == what)
            .unwrap_or_else(|| panic!("{what} not reported"));
        assert_eq!(d["count"].as_f64(), Some(0.0), "{d}");
    }
}

/// The GIL waits that are neither kind the test expects, by root and by
/// the first link they lack, largest first: what a failed check needs to say.
fn missing_links<'a>(other: impl Iterator<Item = &'a (String, u64)>) -> String {
    let mut by: std::collections::BTreeMap<(String, &str), u64> = Default::default();
    for (s, ns) in other {
        let root = s.split(';').next().unwrap_or("").to_string();
        let lacks = if !s.contains(";start_thread;") && !s.contains(";_start;") {
            "an entry point (start_thread, _start)"
        } else if !s.contains("PyFuncOp::Compute") {
            "PyFuncOp::Compute"
        } else if !(s.contains(";take_gil;") || s.contains(";PyEval_RestoreThread;")) {
            "take_gil"
        } else {
            "the map op as root"
        };
        *by.entry((root, lacks)).or_default() += ns;
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    rows.iter()
        .map(|((root, lacks), ns)| format!("  {ns} ns under {root}, lacking {lacks}\n"))
        .collect()
}

#[test]
fn sample_rate_is_checked() {
    let o = run_probe(&["--pid", "1", "--sample-hz", "5000", "--duration", "1"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--sample-hz"));
}

/// locks.svg on the py_function workload: the map function's GIL waits,
/// unwound from a stack copied at the GIL's acquisition (CPython and glibc
/// have no frame pointers), go all the way up through TensorFlow's
/// `PyFuncOp::Compute` to the UDF pool thread's start, under the map op;
/// the training loop's own waits stay under its op, with their own stacks.
#[test]
fn gil_wait_chain_up_to_pyfuncop_under_the_map_op() {
    // Two wait windows (5 s apart for a 7 s recording) at least.
    let (out, _) = record_sampled("py_function.py", "stacks-gil", "7");
    assert!(out.join("locks.svg").exists(), "locks.svg missing");
    let locks = folded(&out, "locks.folded");
    let gil: Vec<&(String, u64)> = locks
        .iter()
        .filter(|(s, _)| s.ends_with(";[lock: gil]"))
        .collect();
    let gil_ns: u64 = gil.iter().map(|(_, c)| c).sum();
    assert!(gil_ns > 0, "no GIL wait in locks.folded");
    let chain = |s: &str| {
        s.starts_with("[ParallelMapV2];")
            && s.contains(";start_thread;")
            && s.contains("PyFuncOp::Compute")
            && (s.contains(";take_gil;") || s.contains(";PyEval_RestoreThread;"))
    };
    // The training loop's own waits (the main thread taking the GIL back
    // after each element): complete, and under its own op, not the map's.
    // (Its interpreter frames, Py_RunMain and on, are its Python frames.)
    let main_loop = |s: &str| {
        !s.starts_with("[ParallelMapV2];")
            && s.contains(";_start;")
            && (s.contains(";Py_RunMain;") || s.contains(" (common.py:"))
    };
    let sum = |f: &dyn Fn(&str) -> bool| -> u64 {
        gil.iter().filter(|(s, _)| f(s)).map(|(_, c)| c).sum()
    };
    let chain_ns = sum(&chain);
    let main_ns = sum(&main_loop);
    let other_ns = gil_ns - chain_ns - main_ns;
    eprintln!(
        "GIL wait {gil_ns} ns: {chain_ns} on complete PyFuncOp chains, {main_ns} in the \
         training loop, {other_ns} other"
    );
    // How the GIL is shared between the map's pool threads and the
    // training loop is up to the workload's scheduling; that every wait
    // has its complete chain under the right op is up to the probe.
    assert!(
        other_ns as f64 <= 0.05 * gil_ns as f64,
        "GIL waits neither on a PyFuncOp chain under the map nor in the training loop: \
         {other_ns} of {gil_ns} ns, by what they lack:\n{}",
        missing_links(
            gil.iter()
                .copied()
                .filter(|(s, _)| !chain(s) && !main_loop(s))
        )
    );
    // A wide frame in locks.svg, not a sliver (the map's share has been
    // 35-87%, the training loop's waits steadier than the map's).
    assert!(
        chain_ns as f64 >= 0.1 * gil_ns as f64,
        "GIL chains up to PyFuncOp::Compute: {chain_ns} of {gil_ns} ns"
    );
    let svg = std::fs::read_to_string(out.join("locks.svg")).expect("locks.svg");
    assert!(
        svg.contains("PyFuncOp::Compute"),
        "locks.svg does not show PyFuncOp::Compute"
    );
    let r: Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report"))
        .expect("report.json");
    let drops = r["drops"].as_array().expect("drops");
    let d = drops
        .iter()
        .find(|d| d["what"] == "wait_stack_copy_failed")
        .expect("wait_stack_copy_failed reported");
    assert_eq!(d["count"].as_f64(), Some(0.0), "{d}");
}

/// report.html of a real recording, opened in headless Chromium with the
/// network cut (tests/html/check_report.py): no console errors, the
/// verdict and the bottleneck visible, a flamegraph that zooms on a click,
/// the table sorts; a screenshot is kept in target/test-artifacts/.
#[test]
fn report_html_of_a_recording_in_headless_chromium() {
    let (out, _) = record_sampled("tfrecord_image.py", "html-image", "6");
    let html = out.join("report.html");
    let size = std::fs::metadata(&html).expect("report.html").len();
    eprintln!("report.html: {size} bytes");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json"))
            .expect("report.json parses");
    let bottleneck = report["bottleneck"]["name"]
        .as_str()
        .expect("a bottleneck")
        .to_string();
    let artifacts = repo().join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifacts dir");
    let shot = artifacts.join("report-image-pipeline.png");
    check_report_html(
        &html,
        &[
            "--expect".as_ref(),
            bottleneck.as_ref(),
            "--screenshot".as_ref(),
            shot.as_os_str(),
        ],
    );
}
