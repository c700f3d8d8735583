//! Plumber's own analysis (`analysis_lib.py` of the Plumber paper's
//! TensorFlow fork, run unmodified by `plumber_reference.py` from the
//! `shared/plumber/` directory beside the repository) on a stats.pb, against
//! our report.json of the same file: the model is built, the bottleneck is
//! the same op and the per-core rates agree. Self-contained (std and
//! serde_json) so that the replay golden test includes it too.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Per-core rates of the two models may differ by this much.
const RATE_TOLERANCE: f64 = 0.10;

/// `plumber_reference.py` beside the repository, as CI lays it out.
pub fn reference_script(repo: &Path) -> PathBuf {
    let p = repo.join("../shared/plumber/plumber_reference.py");
    assert!(
        p.exists(),
        "{} missing: Plumber's reference analysis belongs beside the repository (shared/plumber/)",
        p.display()
    );
    p
}

fn number(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

/// Plumber's interleave ops (`INTERLEAVE_DATASET_OP_NODES`).
const INTERLEAVES: &[&str] = &["ParallelInterleaveDatasetV4", "InterleaveDataset"];

/// Whether `node` is an input of an interleave op, or below one. Plumber
/// gives an interleave's inputs the interleave's own visit ratio ("Interleave
/// propagates junk to child, so copy"); ours scales it by the op's element
/// ratio (the file list is visited once per file, not once per record), so
/// their per-core rates differ there by that ratio, on purpose.
fn under_interleave_input(nodes: &[Value], node: &Value) -> bool {
    let mut cur = node;
    for _ in 0..nodes.len() {
        let Some(parent) = nodes.iter().find(|m| m["name"] == cur["parent"]) else {
            return false;
        };
        let is_interleave = INTERLEAVES.iter().any(|op| parent["op"] == *op);
        // Same function (or both top-level): an input, not a function dataset.
        if is_interleave && parent["function"] == cur["function"] {
            return true;
        }
        cur = parent;
    }
    false
}

/// Runs Plumber's analysis on `stats` and checks it against `report`
/// (our report.json of the same file). Returns one line per compared op,
/// `who` first, for the test's output.
pub fn plumber_agrees(
    python: &Path,
    repo: &Path,
    stats: &Path,
    report: &Path,
    who: &str,
) -> String {
    let started = std::time::Instant::now();
    let o = Command::new(python)
        .arg(reference_script(repo))
        .arg(stats)
        .arg("--compact")
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .expect("run plumber_reference.py");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{who}: Plumber's analysis failed on {} (exit {:?}): {}\n{}",
        stats.display(),
        o.status.code(),
        stdout.chars().take(4000).collect::<String>(),
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let theirs: Value = serde_json::from_str(&stdout).expect("plumber_reference.py JSON");
    let ours: Value =
        serde_json::from_slice(&std::fs::read(report).expect("report.json")).expect("report.json");
    assert!(
        theirs["LP_upper_bounds"].is_object(),
        "{who}: Plumber's LP did not run (cvxpy {}): {}",
        theirs["cvxpy"],
        theirs["errors"]
    );
    assert_eq!(
        theirs["bottleneck"]["name"], ours["bottleneck"]["name"],
        "{who}: Plumber's bottleneck vs ours ({})",
        theirs["errors"]
    );
    let mut lines = vec![format!(
        "{who}: Plumber's analysis in {:.1} s; bottleneck {} (both); per-core rate, Plumber vs ours:",
        started.elapsed().as_secs_f64(),
        ours["bottleneck"]["name"]
    )];
    let our_nodes = ours["nodes"].as_array().expect("report.json nodes");
    let mut compared = 0;
    for n in theirs["nodes"].as_array().expect("Plumber's nodes") {
        let name = n["name"].as_str().unwrap_or_default();
        // Plumber rates a function's datasets per element of the function's
        // input (its visit ratio stops at the owner); ours are per element
        // the training loop receives, so they differ by that ratio.
        if name == "dataset" || !n["function_of"].is_null() {
            continue;
        }
        let mine = our_nodes
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{who}: Plumber's {name} is not in our report"));
        if under_interleave_input(our_nodes, mine) {
            lines.push(format!(
                "  {name}: not compared (under an interleave's input)"
            ));
            continue;
        }
        let (p, m) = (&n["expected_per_core_max_rate"], &mine["rate_per_core"]);
        lines.push(format!("  {name}: {p} vs {m}"));
        match (number(p), number(m)) {
            (Some(p), Some(m)) => {
                assert!(
                    (p - m).abs() <= RATE_TOLERANCE * m.abs().max(p.abs()),
                    "{who}: {name} per-core rate, Plumber {p:.4} vs ours {m:.4}"
                );
                compared += 1;
            }
            // An op that used no CPU: unbounded for both.
            (None, None) => {}
            _ => panic!("{who}: {name} per-core rate, Plumber {p} vs ours {m}"),
        }
    }
    assert!(compared > 0, "{who}: no per-core rate compared");
    lines.join("\n")
}
