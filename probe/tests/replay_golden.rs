//! `plumber-probe replay` of a real recording (the demo workload, 3 s,
//! saved with --save-events) compared byte for byte with the committed
//! outputs under tests/golden/replay/: stats.pb, the analysis files and
//! what it prints. A refactor of the collector, the analyzer or the output
//! edge that changes any byte fails here. PLUMBER_BLESS=1 rewrites the
//! golden files (only when an output is meant to change); a missing one
//! fails, so that a golden file is never created unnoticed. No root needed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files a replay writes, in no particular order.
const OUTPUTS: [&str; 6] = [
    "stats.pb",
    "report.json",
    "report.txt",
    "report.html",
    "pipeline.dot",
    "pipeline.svg",
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/replay")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("plumber-replay-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn check(file: &str, actual: &[u8]) {
    let path = golden_dir().join(file);
    if std::env::var("PLUMBER_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, actual).expect("write golden file");
        eprintln!("golden file written: {}", path.display());
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (PLUMBER_BLESS=1 writes it from this build)",
            path.display()
        )
    });
    if expected != actual {
        let at = expected
            .iter()
            .zip(actual)
            .position(|(a, b)| a != b)
            .unwrap_or(expected.len().min(actual.len()));
        let line = |b: &[u8]| {
            let start = b[..at.min(b.len())]
                .iter()
                .rposition(|&c| c == b'\n')
                .map_or(0, |p| p + 1);
            let end = b[start..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| start + p);
            String::from_utf8_lossy(&b[start..end]).into_owned()
        };
        panic!(
            "{} differs from the output at byte {at} ({} vs {} bytes; PLUMBER_BLESS=1 to accept):\n  golden: {:?}\n  actual: {:?}",
            path.display(),
            expected.len(),
            actual.len(),
            line(&expected),
            line(actual)
        );
    }
}

#[test]
fn replay_of_a_real_recording_is_byte_identical() {
    let out = tmp("golden");
    let events = golden_dir().join("events.jsonl");
    let run = Command::new(env!("CARGO_BIN_EXE_plumber-probe"))
        .arg("replay")
        .arg(&events)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run plumber-probe");
    assert!(
        run.status.success(),
        "replay failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.stderr.is_empty(),
        "replay wrote to stderr: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    // The output directory is a temporary one: the golden says OUT.
    let stdout = String::from_utf8(run.stdout).expect("UTF-8 stdout");
    let stdout = stdout.replace(&out.display().to_string(), "OUT");
    check("stdout.txt", stdout.as_bytes());

    let mut written: Vec<String> = std::fs::read_dir(&out)
        .expect("output dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    written.sort();
    let mut expected: Vec<String> = OUTPUTS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(written, expected, "the files a replay writes");
    for f in OUTPUTS {
        check(f, &std::fs::read(out.join(f)).expect("read output"));
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[path = "../../tests/e2e/plumber_ref.rs"]
mod plumber_ref;

/// Plumber's own analysis loads the golden stats.pb (which the test above
/// keeps equal to what a replay writes) and agrees with our report.json of
/// it: bottleneck and per-core rates. Needs the venv of scripts/setup.sh
/// (TensorFlow, cvxpy) and Plumber's reference beside the repository.
#[test]
fn plumbers_analysis_loads_the_golden_stats() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = repo.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} missing: run scripts/setup.sh",
        python.display()
    );
    let agreed = plumber_ref::plumber_agrees(
        &python,
        &repo,
        &golden_dir().join("stats.pb"),
        &golden_dir().join("report.json"),
        "replay golden",
    );
    eprintln!("{agreed}");
}
