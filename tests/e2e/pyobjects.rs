//! Python objects read from outside, against the interpreter's own view:
//! tests/workloads/py_objects.py builds instances whose attributes sit in
//! every layout its version has (values beside the object, split and
//! combined dicts, a dict made real by `vars()`, one replaced), prints
//! their id()s with the values it set, and waits inside a `for` loop.
//! `plumber-probe py-objects` reads them back on every CPython from 3.9 to
//! 3.13 (pyenv's, and a static /usr/bin/python3.11 where there is one):
//! every value must match exactly, and the iterators the workload's frames
//! hold (a local, the loop's value stack, an attribute of a local) must be
//! found where it says.

use std::path::Path;

use serde_json::Value;

use crate::harness::*;
use crate::python::{pyenv_python, VERSIONS};

fn json_lines(lines: &[String], tag: &str) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(tag))
        .map(|l| serde_json::from_str(l).expect("workload JSON"))
        .collect()
}

fn check(python: &Path, what: &str) -> Vec<String> {
    let w = Workload::start_in(&[], python, "py_objects.py", &[]);
    let lines = w.snapshot_lines();
    let checks = json_lines(&lines, "CHECK ");
    let finds = json_lines(&lines, "FIND ");
    assert!(checks.len() >= 30 && finds.len() == 3, "{what}: {lines:?}");
    let pid = w.pid.to_string();
    let mut args = vec!["py-objects".to_string(), "--pid".into(), pid];
    for c in &checks {
        let spec = format!(
            "{}:{}",
            c["id"].as_str().unwrap_or(""),
            c["path"].as_str().unwrap_or("")
        );
        args.extend(["--read".to_string(), spec]);
    }
    for t in ["LoopIter", "LocalIter", "HeldIter"] {
        args.extend(["--find".to_string(), t.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run_probe(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what}: py-objects failed: {stderr}");
    let out: Value = serde_json::from_slice(&o.stdout).expect("py-objects JSON");
    let reads = out["reads"].as_array().expect("reads");
    assert_eq!(reads.len(), checks.len(), "{what}");
    let mut storages = Vec::new();
    for (c, r) in checks.iter().zip(reads) {
        let want = c["value"].as_object().expect("value");
        for (k, v) in want {
            assert_eq!(
                &r["value"][k], v,
                "{what}: {} {} read {r}",
                c["id"], c["path"]
            );
        }
        if let Some(s) = r["storage"].as_str() {
            if !storages.iter().any(|x| x == s) {
                storages.push(s.to_string());
            }
        }
    }
    let found = out["found"].as_array().expect("found");
    for f in &finds {
        let via = match f["via"].as_str() {
            Some("local") => "local it",
            Some("attr") => "local loader._iterator",
            _ => "stack 0",
        };
        assert!(
            found.iter().any(|g| g["addr"] == f["id"]
                && g["type"] == f["type"]
                && g["via"] == via
                && g["function"] == "main"),
            "{what}: {f} not found as {via} in {found:?}"
        );
    }
    storages
}

#[test]
fn pyobjects_read_from_outside_3_9_to_3_13() {
    require_root();
    for v in VERSIONS {
        let storages = check(&pyenv_python(v), &format!("CPython {v}"));
        // Both kinds of dict everywhere; values without a dict from 3.11.
        let mut want = vec!["split dict", "combined dict"];
        if !v.starts_with("3.9.") && !v.starts_with("3.10.") {
            want.push("values");
        }
        for s in want {
            assert!(
                storages.iter().any(|x| x == s),
                "CPython {v}: no {s} in {storages:?}"
            );
        }
    }
}

#[test]
fn pyobjects_of_a_static_interpreter() {
    require_root();
    let p = Path::new("/usr/bin/python3.11");
    if !p.exists() {
        eprintln!("no /usr/bin/python3.11: the static build is not available here");
        return;
    }
    let storages = check(p, "/usr/bin/python3.11 (static)");
    assert!(storages.len() == 3, "{storages:?}");
}
