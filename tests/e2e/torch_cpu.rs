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

/// Workers that sleep 90% of each item, holding nothing (a read from
/// network storage): with the stages' CPU time the analysis sees them
/// off their cores, names I/O, and gives them more workers than cores
/// (four a core at most), where from wall time alone it took them to
/// fill both cores and advised nothing.
#[test]
fn workers_waiting_off_their_cores_get_workers_past_the_cores() {
    let case = Case {
        script: "torch_pyxform.py",
        args: &[
            "--num-workers",
            "2",
            "--persistent-workers",
            "--batch-size",
            "16",
            "--pyiters",
            "1000",
            "--item-sleep",
            "2",
        ],
        seconds: 8.0,
    };
    let who = "workers asleep 2 ms an item";
    let c = check_all(&case);
    let r = &c.report;
    assert_eq!(
        r["bottleneck"]["reason"], "io",
        "{who}: {}",
        r["bottleneck"]
    );
    let recs = r["recommendations"].as_array().cloned().unwrap_or_default();
    let rec = recs
        .iter()
        .find(|x| x["kind"] == "workers")
        .unwrap_or_else(|| panic!("{who}: no num_workers advice: {recs:?}"));
    let v = rec["value"].as_f64().unwrap_or(0.0);
    let cores = r["machine"]["cores"].as_f64().unwrap_or(0.0);
    assert!(v > cores && v <= (4.0 * cores).ceil(), "{who}: {rec}");
    let now = r["observed_rate"].as_f64().unwrap_or(0.0);
    let rate = rec["predicted_rate"].as_f64().unwrap_or(0.0);
    assert!(rate > 2.0 * now, "{who}: {rate} from {now}");
}
