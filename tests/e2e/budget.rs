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

/// utime + stime of a process, seconds.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("hog's stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn a_cpu_hog_beside_the_workload_is_taken_off_the_core_budget() {
    // Two map threads: the pipeline wants every core of a 2-core machine.
    let w = Workload::start(
        "tunable.py",
        &["--seconds", "90", "--map-parallel", "2", "--prefetch", "2"],
    );
    let hog = Hog::start();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let out = tempdir("budget-hog");
    let (c0, t0) = (cpu_s(hog.0.id()), std::time::Instant::now());
    let s = record(&w, 6.0, &out, &[]);
    let hog_cores = (cpu_s(hog.0.id()) - c0) / t0.elapsed().as_secs_f64();
    drop(hog);
    let r = report(&out);

    // What the hog took is in the other processes' term (which also holds
    // whatever else the machine ran, and the probe).
    let b = &r["machine"]["budget"];
    let other = num(b, &["other_processes_cores"]);
    assert!(hog_cores > 0.3, "the hog ran {hog_cores} cores");
    assert!(
        other >= 0.9 * hog_cores - 0.05,
        "other processes {other} cores, the hog alone {hog_cores}"
    );
    // The terms add up, and the LP plans with the cores less the others'.
    let cores = num(b, &["cores"]);
    let outside = num(b, &["outside_pipeline_cores"]) + num(b, &["unattributed_cores"]);
    let lp = num(&r, &["machine", "cores"]);
    assert!(
        (lp - (cores - other).max(0.1 * cores)).abs() < 1e-6,
        "LP cores {lp}"
    );
    assert!((num(b, &["pipeline_cores"]) - (lp - outside).max(0.0)).abs() < 1e-6);
    let assumes = r["assumes"].as_str().expect("assumes");
    assert!(assumes.contains("other processes"), "{assumes}");
    let txt = std::fs::read_to_string(out.join("report.txt")).expect("report.txt");
    assert!(
        txt.contains("other processes"),
        "no budget terms in report.txt:\n{txt}"
    );

    // The model's rate for the pipeline as it ran, against what the
    // workload counted: with the hog's core taken off, the prediction
    // follows the slower pipeline (on 2 idle cores it would be about twice).
    let gt = w.counted_in_window(&s, "root") / num(&r, &["elapsed_s"]);
    assert_close(
        "predicted vs counted",
        num(&r, &["predicted_rate"]),
        gt,
        0.2,
    );
}
