//! The core budget against a CPU hog beside the workload: the recording
//! sees what the hog takes from the cores, the report shows it as a term of
//! the budget, and the model's rate for the pipeline as it runs accounts for
//! it (it matches what the workload counted, not what an idle machine gives).

use std::process::{Child, Command, Stdio};

use crate::harness::*;

/// One busy-looping shell: a core's worth of demand, in its own session
/// (its own autogroup, as another job on the machine would be).
struct Hog(Child);

impl Hog {
    fn start() -> Hog {
        let child = Command::new("setsid")
            .args(["sh", "-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start the CPU hog");
        Hog(child)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn report(out: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json"))
        .expect("report.json parses")
}

fn num(j: &serde_json::Value, path: &[&str]) -> f64 {
    let mut v = j;
    for k in path {
        v = &v[*k];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{} not a number: {v}", path.join(".")))
}

#[test]
fn a_cpu_hog_beside_the_workload_is_taken_off_the_core_budget() {
    // Two map threads: the pipeline wants every core of a 2-core machine.
    let w = Workload::start(
        "tunable.py",
        &["--seconds", "120", "--map-parallel", "2", "--prefetch", "2"],
    );
    let quiet_dir = tempdir("budget-quiet");
    let quiet_s = record(&w, 6.0, &quiet_dir, &[]);
    let quiet = report(&quiet_dir);
    let hog = Hog::start();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let busy_dir = tempdir("budget-hog");
    let busy_s = record(&w, 6.0, &busy_dir, &[]);
    drop(hog);
    let busy = report(&busy_dir);

    let other = |j: &serde_json::Value| num(j, &["machine", "budget", "other_processes_cores"]);
    let (o_quiet, o_busy) = (other(&quiet), other(&busy));
    // The hog keeps most of a core whatever else the machine runs.
    assert!(
        o_busy >= o_quiet + 0.5,
        "other processes: {o_busy} cores with the hog, {o_quiet} without"
    );
    // The terms add up, and the LP plans with the cores less the hog's.
    let b = &busy["machine"]["budget"];
    let cores = num(b, &["cores"]);
    let outside = num(b, &["outside_pipeline_cores"]) + num(b, &["unattributed_cores"]);
    let lp = num(&busy, &["machine", "cores"]);
    assert!(
        (lp - (cores - o_busy).max(0.1 * cores)).abs() < 1e-6,
        "LP cores {lp}"
    );
    assert!((num(b, &["pipeline_cores"]) - (lp - outside).max(0.0)).abs() < 1e-6);
    let assumes = busy["assumes"].as_str().expect("assumes");
    assert!(assumes.contains("other processes"), "{assumes}");
    let txt = std::fs::read_to_string(busy_dir.join("report.txt")).expect("report.txt");
    assert!(
        txt.contains("other processes"),
        "no budget terms in report.txt:\n{txt}"
    );

    // The model's rate for the pipeline as it ran, against the workload's
    // own count over each window: with the hog's core taken off, the
    // prediction follows the slower pipeline.
    for (who, j, s) in [("quiet", &quiet, &quiet_s), ("hog", &busy, &busy_s)] {
        let t = num(j, &["elapsed_s"]);
        let gt = w.counted_in_window(s, "root") / t;
        let pred = num(j, &["predicted_rate"]);
        assert_close(&format!("{who}: predicted vs counted"), pred, gt, 0.2);
    }
}
