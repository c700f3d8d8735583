//! CPU time per stage of a DataLoader: what the probe puts on each stage
//! (each counted thread's CPU time between two of the stage sampler's
//! reads, on the stage seen at the second) against what the job measured
//! itself: its threads' CPU clocks inside the dataset's `__getitem__`.

use crate::torch::{check_all, Case};

/// The get-item stage's CPU time over the window, within 10% of the
/// job's own thread CPU time inside `__getitem__`: without workers the
/// training loop's, with two persistent workers theirs together. Both
/// spend ~90% of their time in it, so the 10% is the sampler's reach
/// (~25 reads a second of threads that change stage every item), not the
/// stage's edges.
#[test]
fn dataloader_stage_cpu_matches_the_job_s_own() {
    for (who, workers, side, key) in [
        ("no workers", "0", "training", "item_cpu_ns"),
        ("two workers", "2", "workers", "workers_item_cpu_ns"),
    ] {
        let case = Case {
            script: "torch_pyxform.py",
            args: &[
                "--num-workers",
                workers,
                "--batch-size",
                "16",
                "--persistent-workers",
                "--item-cpu",
            ],
            seconds: 8.0,
        };
        let c = check_all(&case);
        let d = &c.d;
        let cores = d["cpu"][side]["get_item"]
            .as_f64()
            .unwrap_or_else(|| panic!("{who}: no get-item CPU in dataloader.json: {d}"));
        let window = d["window_s"].as_f64().expect("window_s");
        let probe = cores * window * 1e9;
        let want = c.gt(key);
        assert!(want > 1e9, "{who}: the job ran {want} ns in __getitem__");
        let err = probe / want - 1.0;
        eprintln!(
            "{who}: get-item CPU {:.3} s; the job's own {:.3} s ({:+.1}%); CPU: {}",
            probe / 1e9,
            want / 1e9,
            100.0 * err,
            d["cpu"]
        );
        assert!(err.abs() <= 0.10, "{who}: {err:+.3}\n{d}");
        // Each worker's CPU at least what its get-item took.
        let all: f64 = d["workers"]
            .as_array()
            .map_or(0.0, |w| w.iter().filter_map(|w| w["cores"].as_f64()).sum());
        if workers != "0" {
            assert!(
                all >= 0.95 * cores,
                "{who}: workers {all} < get-item {cores}"
            );
        }
    }
}
