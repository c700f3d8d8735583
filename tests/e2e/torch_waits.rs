//! GIL and lock waits of a DataLoader's stages: what the probe tells from
//! outside (each thread's state at the stage sampler's ticks) against
//! what the job measured itself: for the GIL, the training loop inside
//! the loader's `next()`, its wall time less its thread's CPU time and
//! its wait for a CPU (a pure-Python loader that reads no file spends the
//! rest waiting for the GIL); for a lock, the workers' time inside its
//! `acquire`.

use serde_json::Value;

use crate::torch::{check_all, Case, Checked};

/// The share of the loop's stalled time it waited for the GIL: the
/// probe's, and the loop's own.
fn stall_gil(c: &Checked, who: &str) -> (f64, f64) {
    let d = &c.d;
    let share = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    assert!(
        !d["gil_wait"].is_null(),
        "{who}: dataloader.json has no gil_wait: {d}"
    );
    let probe = share(&d["gil_wait"], "stall");
    let (wall, cpu, runq) = (
        c.gt("stall_ns"),
        c.gt("stall_cpu_ns"),
        c.gt("stall_runq_ns"),
    );
    assert!(wall > 0.0, "{who}: the loop stalled for no time");
    let want = (1.0 - (cpu + runq) / wall).max(0.0);
    eprintln!(
        "{who}: GIL waits {:.1}% of the loop's stall; the loop's own wall less CPU and run queue {:.1}% (run queue {:.1}%); told at {:.0}% of the ticks",
        100.0 * probe,
        100.0 * want,
        100.0 * runq / wall,
        100.0 * share(&d["gil_wait"], "told")
    );
    (probe, want)
}

/// The probe's share is that of its ticks (25 a second) that found the
/// thread inside a futex wait on the GIL; the loop's own figure counts
/// all its time neither on a CPU nor waiting for one. Asked of /proc, the
/// probe (debug build) read 11-14 points under it (8 runs): a tick's own
/// burst of CPU keeps a loop thread woken right then off the two cores,
/// and /proc calls it runnable, no longer asleep. The BPF side holds a
/// wait until the call returns: −8 to +7 points (4 runs), the spread of
/// ~200 ticks of a thread waiting half its time. Hence 20 points.
///
/// Without workers, a thread of the training process that runs Python
/// without end makes the loader wait for the GIL: the probe's share of
/// the loop's stall within 20 points of the loop's own; without that
/// thread, nothing.
#[test]
fn dataloader_gil_waits_match_the_loop_s_own() {
    let case = Case {
        script: "torch_pyxform.py",
        args: &[
            "--num-workers",
            "0",
            "--batch-size",
            "16",
            "--gil-threads",
            "1",
            "--stall-detail",
        ],
        seconds: 8.0,
    };
    let who = "a Python thread beside the loader";
    let c = check_all(&case);
    let (probe, want) = stall_gil(&c, who);
    assert!(want > 0.25, "{who}: the loop waited only {want:.3}");
    assert!(
        (probe - want).abs() <= 0.20,
        "{who}: the probe {probe:.3}, the loop {want:.3}\n{}",
        c.d
    );
    let case = Case {
        args: &["--num-workers", "0", "--batch-size", "16", "--stall-detail"],
        ..case
    };
    let who = "the loader alone";
    let (probe, want) = stall_gil(&check_all(&case), who);
    assert!(
        probe < 0.03 && want < 0.06,
        "{who}: the probe {probe:.3}, the loop {want:.3}"
    );
}

/// Two workers whose `__getitem__` holds a `multiprocessing.Lock` they
/// share for 2 ms (a read through a shared handle) after a short Python
/// loop: the probe's share of get-item's time waiting on a lock within 10
/// points of the workers' own (their time inside `acquire` over their
/// time in `__getitem__`, summed in shared memory), and the analysis
/// names the lock, not the workers' count.
#[test]
fn dataloader_lock_waits_match_the_workers_own() {
    let case = Case {
        script: "torch_pyxform.py",
        args: &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--pyiters",
            "1000",
            "--shared-lock",
            "2",
        ],
        seconds: 8.0,
    };
    let who = "workers sharing a lock";
    let c = check_all(&case);
    let d = &c.d;
    let probe = d["lock_wait"]["workers"]["get_item"]
        .as_f64()
        .unwrap_or_else(|| panic!("{who}: no lock_wait in dataloader.json: {d}"));
    let (wait, item) = (c.gt("lock_wait_ns"), c.gt("lock_item_ns"));
    assert!(
        item > 0.0,
        "{who}: the workers spent no time in __getitem__"
    );
    let want = wait / item;
    eprintln!(
        "{who}: lock waits {:.1}% of get-item's time; the workers' own {:.1}%",
        100.0 * probe,
        100.0 * want
    );
    assert!(want > 0.25, "{who}: the workers waited only {want:.3}");
    assert!(
        (probe - want).abs() <= 0.10,
        "{who}: the probe {probe:.3}, the workers {want:.3}\n{d}"
    );
    let r = &c.report;
    assert_eq!(
        r["bottleneck"]["reason"], "lock",
        "{who}: {}",
        r["bottleneck"]
    );
    let first = &r["recommendations"][0];
    assert_eq!(first["kind"], "lock", "{who}: {}", r["recommendations"]);
    assert!(
        first["why"]
            .as_str()
            .is_some_and(|w| w.contains("__getitem__")),
        "{who}: {first}"
    );
}
