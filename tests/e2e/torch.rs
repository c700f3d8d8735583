//! PyTorch DataLoader jobs (tests/workloads/torch_*.py, torch from PyPI in
//! .venv-torch): the probe attached by PID, or starting the job with
//! `plumber-probe run` as an unprivileged user, finds the loader and its
//! workers, and its batches, samples and data stall agree with what the
//! training loop counted itself.

use std::path::Path;

use serde_json::Value;

use crate::harness::{gt_at_lines, record_out, tempdir, torch_python, Workload};
use crate::shim::{lines as stdout_lines, run_as_nobody, shared_dir, workload};

/// What one recording of a workload is checked against.
struct Case<'a> {
    script: &'a str,
    args: &'a [&'a str],
    seconds: f64,
}

/// Epochs of 64 batches: the count misses at most what the loop takes in
/// one sampler tick at each epoch's end (docs/pytorch.md), 1.6% of a
/// 64-batch epoch at worst.
const EPOCH_SAMPLES: &str = "1024";

impl Case<'_> {
    fn who(&self) -> String {
        format!("{} {}", self.script, self.args.join(" "))
    }

    /// A directory name for the case.
    fn tag(&self) -> String {
        format!(
            "torch-{}-{}",
            self.script.trim_end_matches(".py"),
            self.args.join("-")
        )
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
    }
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("dataloader.json has no number {key}: {v}"))
}

/// The worker pids the workload announced last before `t_ns`.
fn announced_workers(lines: &[String], t_ns: i64) -> Vec<i64> {
    let field = |l: &str, key: &str| {
        l.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key).map(str::to_string))
    };
    lines
        .iter()
        .filter(|l| l.starts_with("WORKERS "))
        .rfind(|l| field(l, "wall_ns=").and_then(|t| t.parse::<i64>().ok()) <= Some(t_ns))
        .and_then(|l| field(l, "pids="))
        .map(|p| p.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}

/// The workload's lines once one of its GT lines is past `t_ns` (it
/// prints one every 0.1 s).
fn lines_past(w: &Workload, t_ns: i64) -> Vec<String> {
    let t0 = std::time::Instant::now();
    loop {
        let lines = w.snapshot_lines();
        let past = lines
            .iter()
            .rev()
            .filter(|l| l.starts_with("GT "))
            .any(|l| {
                l.split_whitespace()
                    .find_map(|kv| kv.strip_prefix("wall_ns="))
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|t| t >= t_ns)
            });
        if past || t0.elapsed() > std::time::Duration::from_secs(10) {
            return lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Records the case by PID and compares dataloader.json with the loop's
/// own counts over the same window; returns the summary.
fn check(case: &Case) -> Value {
    let mut args = vec!["--seconds", "600", "--epoch-samples", EPOCH_SAMPLES];
    args.extend_from_slice(case.args);
    let w = Workload::start_in(&[], &torch_python(), case.script, &args);
    let dir = tempdir(&case.tag());
    let out = record_out(&w, case.seconds, &dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    agrees_with_loop(case, &dir, &stdout, |t1| lines_past(&w, t1))
}

/// Compares the recording in `dir` (dataloader.json, stages.folded) and
/// the probe's `stdout` with the loop's own counts over the same window;
/// `lines(t)`: the workload's lines once they cover the instant t.
/// Returns the summary.
fn agrees_with_loop(
    case: &Case,
    dir: &Path,
    stdout: &str,
    lines: impl FnOnce(i64) -> Vec<String>,
) -> Value {
    let text = std::fs::read_to_string(dir.join("dataloader.json"))
        .unwrap_or_else(|e| panic!("no dataloader.json ({e}); stdout:\n{stdout}"));
    let d: Value = serde_json::from_str(&text).expect("dataloader.json");
    let (t0, t1) = (
        d["start_wall_ns"].as_i64().expect("start_wall_ns"),
        d["end_wall_ns"].as_i64().expect("end_wall_ns"),
    );
    let lines = lines(t1);
    let gt = |key: &str| gt_at_lines(&lines, t1, key) - gt_at_lines(&lines, t0, key);
    let who = case.who();
    let (batches, want) = (num(&d, "batches"), gt("root"));
    eprintln!("{who}: batches {batches} vs the loop's {want:.1}");
    assert!(
        want > 20.0,
        "{who}: too few batches in the window ({want:.1}) to compare"
    );
    assert!(
        (batches - want).abs() <= 0.03 * want + 1.0,
        "{who}: {batches} batches, the loop counted {want:.1}\n{stdout}"
    );
    let (samples, want_samples) = (num(&d, "samples"), gt("elems"));
    eprintln!("{who}: samples {samples} vs the loop's {want_samples:.1}");
    assert!(
        (samples - want_samples).abs() <= 0.03 * want_samples + num(&d, "batch_size"),
        "{who}: {samples} samples, the loop counted {want_samples:.1}"
    );
    let stall = num(&d, "stall_share");
    let want_stall = gt("stall_ns") / (t1 - t0) as f64;
    eprintln!("{who}: stall {stall:.3} vs the loop's {want_stall:.3}");
    assert!(
        (stall - want_stall).abs() <= 0.05,
        "{who}: data stall {:.1}%, the loop measured {:.1}%\n{stdout}",
        100.0 * stall,
        100.0 * want_stall
    );
    let workers: Vec<i64> = d["workers"]
        .as_array()
        .map(|a| a.iter().filter_map(|w| w["pid"].as_i64()).collect())
        .unwrap_or_default();
    // Workers that started in the window's last second may not have been
    // looked at yet (the loader's worker list is read twice a second);
    // short epochs without persistent workers start a set every ~0.5 s.
    let announced = announced_workers(&lines, t1 - 1_000_000_000);
    assert_eq!(
        num(&d, "num_workers") as usize,
        announced.len(),
        "{who}: num_workers"
    );
    for pid in &announced {
        assert!(
            workers.contains(pid),
            "{who}: worker {pid} not found (found {workers:?})"
        );
    }
    assert!(
        stdout.contains("DataLoader (torch "),
        "{who}: no DataLoader summary:\n{stdout}"
    );
    if case.script == "torch_image.py" {
        // The dataset's own function, in the process that runs it, under
        // its stage.
        let folded = std::fs::read_to_string(dir.join("stages.folded")).expect("stages.folded");
        let process = if announced.is_empty() {
            "training loop"
        } else {
            "worker "
        };
        assert!(
            folded
                .lines()
                .any(|l| l.starts_with(&format!("[get item];{process}"))
                    && l.contains(";__getitem__ (torch_image.py)")),
            "{who}: no [get item] stack with the dataset's __getitem__ in stages.folded"
        );
        assert!(dir.join("stages.svg").exists(), "{who}: no stages.svg");
    }
    d
}

#[test]
fn dataloader_image_folder_without_workers() {
    let d = check(&Case {
        script: "torch_image.py",
        args: &["--num-workers", "0", "--batch-size", "16"],
        seconds: 8.0,
    });
    // The loop fetches every batch itself: it is stalled nearly always.
    assert!(num(&d, "stall_share") > 0.8, "{d}");
}

#[test]
fn dataloader_image_folder_with_one_and_four_workers() {
    for nw in ["1", "4"] {
        let d = check(&Case {
            script: "torch_image.py",
            args: &["--num-workers", nw, "--batch-size", "16"],
            seconds: 8.0,
        });
        // The workers' time is mostly the dataset's items (JPEG decode
        // and transforms), seen in their own Python frames.
        let get_item = d["workers_stages"]["get_item"].as_f64().unwrap_or(0.0);
        assert!(get_item > 0.3, "workers' time in get_item: {d}");
    }
}

#[test]
fn dataloader_training_step_bound() {
    // A 150 ms step per batch against ~60 ms of loading on two workers:
    // the loop waits for data little of its time.
    let d = check(&Case {
        script: "torch_image.py",
        args: &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--step-ms",
            "150",
        ],
        seconds: 10.0,
    });
    assert!(num(&d, "stall_share") < 0.5, "{d}");
}

#[test]
fn dataloader_spawned_persistent_workers() {
    check(&Case {
        script: "torch_image.py",
        args: &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--start-method",
            "spawn",
            "--persistent-workers",
        ],
        seconds: 8.0,
    });
}

/// `plumber-probe run` as an unprivileged user (uid 65534, no
/// capabilities but file reads where the interpreter needs them) starts
/// the image folder job, with two workers and without: the same counts
/// against the loop's own as by PID. The job writes its images where that
/// user may, once for both runs.
#[test]
fn dataloader_under_run_unprivileged() {
    let dir = shared_dir("torch-run");
    let py = torch_python();
    let data = dir.join("images");
    let script = workload("torch_image.py");
    for nw in ["2", "0"] {
        let case = Case {
            script: "torch_image.py",
            args: &["--num-workers", nw, "--batch-size", "16"],
            seconds: 8.0,
        };
        let out = dir.join(case.tag());
        // The job runs on past the window: its lines then cover it.
        let seconds = (case.seconds + 6.0).to_string();
        let mut cmd = vec![
            py.to_str().expect("utf-8"),
            &script,
            "--seconds",
            &seconds,
            "--epoch-samples",
            EPOCH_SAMPLES,
            "--data",
            data.to_str().expect("utf-8"),
        ];
        cmd.extend_from_slice(case.args);
        let duration = case.seconds.to_string();
        let probe_args = [
            "--duration",
            &duration,
            "-q",
            "-o",
            out.to_str().expect("utf-8"),
        ];
        let o = run_as_nobody(&dir, &py, Some(&probe_args), &cmd);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        let who = format!("run {}", case.who());
        assert_eq!(o.status.code(), Some(0), "{who}: {stderr}");
        let info = crate::harness::read_snapshot(&out.join("stats.pb"))
            .probe_info
            .expect("probe_info");
        assert_eq!(info.mode, "dataloader", "{who}");
        assert!(!info.partial, "{who}: the window ended before the job");
        let lines = stdout_lines(&o);
        agrees_with_loop(&case, &out, &stdout, |_| lines);
        // What the recording cost: the probe process against the job's
        // processes (no BPF, no shim in the job).
        let cost = stdout
            .lines()
            .find(|l| l.starts_with("probe cost:"))
            .unwrap_or_else(|| panic!("{who}: no probe cost line:\n{stdout}"));
        eprintln!("{who}: {cost}");
        assert!(cost.contains("probe process"), "{who}: {cost}");
    }
}

#[test]
fn dataloader_python_transform_and_iterable_dataset() {
    // A pure-Python transform in the training process (its GIL), and an
    // IterableDataset split across two workers.
    check(&Case {
        script: "torch_pyxform.py",
        args: &["--num-workers", "0", "--batch-size", "16"],
        seconds: 8.0,
    });
    check(&Case {
        script: "torch_iterable.py",
        args: &["--num-workers", "2", "--batch-size", "16"],
        seconds: 8.0,
    });
}

/// The CHECKSUM line of a workload that ran to its end.
fn checksum_after_exit(mut w: Workload) -> String {
    let status = w.child.wait().expect("wait for the workload");
    assert!(status.success(), "the workload failed: {status}");
    // Its stdout is read on a thread of ours: the last lines may lag.
    let t0 = std::time::Instant::now();
    while !w.snapshot_lines().iter().any(|l| l.starts_with("DONE"))
        && t0.elapsed() < std::time::Duration::from_secs(5)
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let lines = w.snapshot_lines();
    lines
        .iter()
        .find(|l| l.starts_with("CHECKSUM "))
        .cloned()
        .unwrap_or_else(|| panic!("no CHECKSUM line: {lines:?}"))
}

#[test]
fn dataloader_results_are_unchanged_under_the_probe() {
    // Reading the job changes nothing it computes: the same batches, bit
    // for bit, with the probe attached as without it.
    let args = [
        "--seconds",
        "600",
        "--max-batches",
        "150",
        "--checksum",
        "--num-workers",
        "2",
        "--batch-size",
        "16",
    ];
    let plain = checksum_after_exit(Workload::start_in(
        &[],
        &torch_python(),
        "torch_image.py",
        &args,
    ));
    let w = Workload::start_in(&[], &torch_python(), "torch_image.py", &args);
    let dir = tempdir("torch-checksum");
    let out = record_out(&w, 4.0, &dir, &[]);
    let cost = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("probe cost:"))
        .map(str::to_string)
        .expect("a probe cost line");
    eprintln!("{cost}");
    assert_eq!(
        checksum_after_exit(w),
        plain,
        "the job's batches changed under the probe"
    );
}
