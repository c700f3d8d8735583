//! Targets the way containers present them: libraries at paths that exist
//! only in the target's mount namespace, and the probe in its own PID
//! namespace.

use crate::harness::*;

/// The target runs from a bind mount that only its mount namespace has:
/// its library paths do not exist on the host, only through
/// /proc/PID/root.
#[test]
fn libraries_resolved_through_the_targets_root() {
    let venv = repo().join(".venv");
    let (w, inside, py) = Workload::start_behind_bind_mount(
        &venv,
        "nsvenv",
        "bin/python",
        "sequential_map.py",
        &["--seconds", "60"],
    );
    // On the host the mount point is empty.
    assert!(!py.exists());
    let out = tempdir("mntns");
    let s = record(&w, 3.0, &out, &[]);
    let lib = &s.probe_info.as_ref().expect("probe_info").libraries[0];
    assert!(lib.starts_with(inside.to_str().expect("utf8")), "{lib}");
    let g = Graph::of(&s);
    assert_eq!(g.chain()[2], "MapDataset");
    assert!(stat(&s, &g.by_op("MapDataset")[0].0).elements_produced > 0);
    drop(w);
    let _ = std::fs::remove_dir(inside);
}

/// plumber-probe inside a PID namespace, given the target's PID as that
/// namespace sees it (as in a container running both).
#[test]
fn probe_in_its_own_pid_namespace() {
    require_root();
    let out = tempdir("pidns");
    let script = format!(
        "{py} {wl} --seconds 60 >{out}/workload.log 2>/dev/null & WP=$!; \
         for i in $(seq 1 600); do grep -q READY {out}/workload.log && break; sleep 0.2; done; \
         echo \"pid in namespace: $WP\"; \
         {probe} --pid $WP --duration 3 --output {out} -q; rc=$?; kill $WP; exit $rc",
        py = python().display(),
        wl = repo().join("tests/workloads/sequential_map.py").display(),
        out = out.display(),
        probe = probe_bin().display(),
    );
    let stdout = run_in_pid_namespace(&script);
    // Inside the namespace the workload is a low PID, not its global one.
    let ns_pid: i32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pid in namespace: ")?.trim().parse().ok())
        .expect("pid line");
    assert!(ns_pid < 100, "{ns_pid}");
    let s = read_snapshot(&out.join("stats.pb"));
    assert_eq!(
        s.probe_info.as_ref().expect("probe_info").pid,
        ns_pid as i64
    );
    let g = Graph::of(&s);
    assert!(stat(&s, &g.by_op("MapDataset")[0].0).elements_produced > 0);
}
