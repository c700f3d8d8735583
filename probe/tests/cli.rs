//! The command line without a target: `analyze` on stats files (good and
//! bad) and argument errors. No root needed.

use std::path::PathBuf;
use std::process::{Command, Output};

use plumber_analyzer::synth::{SynthOp, SynthPipeline};
use prost::Message;

fn probe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plumber-probe"))
        .args(args)
        .output()
        .expect("run plumber-probe")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("plumber-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp");
    d
}

/// plumber-model.md §9.
fn worked_example() -> Vec<u8> {
    SynthPipeline {
        ops: vec![
            SynthOp::new("TFRecordDataset/_1", "TFRecordDataset")
                .elements(76_800)
                .ratio(-1.0)
                .cpu(3.0),
            SynthOp::new("ParallelMapDatasetV2/_5", "ParallelMapDatasetV2")
                .input("TFRecordDataset/_1")
                .elements(76_800)
                .ratio(1.0)
                .cpu(96.0)
                .par(2),
            SynthOp::new("BatchDatasetV2/_8", "BatchDatasetV2")
                .input("ParallelMapDatasetV2/_5")
                .elements(600)
                .ratio(128.0)
                .cpu(6.0),
            SynthOp::new("PrefetchDataset/_10", "PrefetchDataset")
                .input("BatchDatasetV2/_8")
                .elements(600)
                .ratio(1.0)
                .cpu(0.3),
        ],
        cores: 8,
        memory_total: 256_000_000_000,
        memory_free: 200_000_000_000,
        elapsed_s: 60.0,
        ..Default::default()
    }
    .snapshot()
    .encode_to_vec()
}

#[test]
fn analyze_json_and_outputs() {
    let d = tmp("analyze");
    let f = d.join("stats.pb");
    std::fs::write(&f, worked_example()).expect("write");
    let out = d.join("out");
    let o = probe(&[
        "analyze",
        f.to_str().expect("utf8"),
        "--json",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["bottleneck"]["name"], "ParallelMapDatasetV2/_5");
    let lp = v["lp"]["rate"].as_f64().expect("lp rate");
    assert!((lp - 45.58).abs() < 0.01, "{lp}");
    for f in [
        "report.txt",
        "report.json",
        "report.html",
        "pipeline.dot",
        "pipeline.svg",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    // The machine figures can be overridden: twice the cores, twice the LP.
    let o = probe(&[
        "analyze",
        f.to_str().expect("utf8"),
        "--json",
        "--cores",
        "16",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let lp16 = v["lp"]["rate"].as_f64().expect("lp rate");
    assert!((lp16 / lp - 2.0).abs() < 0.01, "{lp16}");
    // The text report names the bottleneck first.
    let o = probe(&["analyze", f.to_str().expect("utf8")]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("BOTTLENECK  ParallelMapDatasetV2/_5"),
        "{text}"
    );
}

#[test]
fn bad_stats_files_exit_2_with_one_line() {
    let d = tmp("bad");
    let good = worked_example();
    let mut no_stats =
        plumber_collector::proto::PipelineSnapshot::decode(good.as_slice()).expect("decode");
    no_stats.stats.clear();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("truncated", good[..good.len() / 2].to_vec()),
        (
            "garbage",
            b"this is not a protobuf \xff\xfe\x00\x01".to_vec(),
        ),
        ("graph-without-stats", no_stats.encode_to_vec()),
    ];
    for (name, bytes) in cases {
        let f = d.join(format!("{name}.pb"));
        std::fs::write(&f, bytes).expect("write");
        let o = probe(&["analyze", f.to_str().expect("utf8")]);
        assert_eq!(o.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(err.starts_with("plumber-probe: "), "{name}: {err}");
        // Which file, said once.
        assert_eq!(err.matches(&format!("{name}.pb")).count(), 1, "{err}");
    }
    let o = probe(&["analyze", d.join("missing.pb").to_str().expect("utf8")]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1);
    // The cause once, not again after the path's message.
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
}

#[test]
fn argument_errors_exit_2() {
    assert_eq!(probe(&[]).status.code(), Some(2));
    assert_eq!(probe(&["--pid", "notanumber"]).status.code(), Some(2));
    let o = probe(&["--pid", "1", "--duration", "-3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(probe(&["--help"]).status.success());
}

#[test]
fn output_that_is_a_file_exits_2_naming_it() {
    let d = tmp("outfile");
    let stats = d.join("stats.pb");
    std::fs::write(&stats, worked_example()).expect("write");
    let not_dir = d.join("report");
    std::fs::write(&not_dir, b"").expect("write");
    let o = probe(&[
        "analyze",
        stats.to_str().expect("utf8"),
        "--output",
        not_dir.to_str().expect("utf8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("is a file, not a directory"), "{err}");
    assert!(o.stdout.is_empty(), "no report before the error");
}
