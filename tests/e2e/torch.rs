//! PyTorch DataLoader jobs (tests/workloads/torch_*.py, torch from PyPI in
//! .venv-torch): the probe attached by PID, or starting the job with
//! `plumber-probe run` as an unprivileged user, finds the loader and its
//! workers, and its batches, samples and data stall agree with what the
//! training loop counted itself.

use std::collections::BTreeMap;
use std::path::Path;

use plumber_collector::proto::PipelineSnapshot;
use serde_json::Value;

use crate::harness::{
    gt_at_lines, python, read_snapshot, record_out, repo, run_probe, tempdir, torch_python,
    Workload,
};
use crate::shim::{lines as stdout_lines, run_as_nobody, shared_dir, workload};
use crate::torch_io::{check_file_reads, data_dir};

/// What one recording of a workload is checked against.
pub(crate) struct Case<'a> {
    pub script: &'a str,
    pub args: &'a [&'a str],
    pub seconds: f64,
}

/// The budget the accuracy checks record under. The tests run the debug
/// binary, whose own process costs about four times a release build's
/// (BENCHMARKS.md): 2.2-2.9% of these jobs' CPU, which the default 1%
/// thins from 2 s on (the stage sampler at a quarter of its ticks). 4% on
/// it stands for the default on a release build: 0.94-1.04% of these jobs
/// over 8 s (BENCHMARKS.md), and the two stall checks the debug binary
/// failed slowed passed with the release binary slowed (within 3.7
/// points).
pub(crate) const BUDGET: [&str; 2] = ["--max-overhead", "4"];

/// Epochs of 64 batches: the count misses at most what the loop takes in
/// one sampler tick at each epoch's end (docs/pytorch.md), 1.6% of a
/// 64-batch epoch at worst.
const EPOCH_SAMPLES: &str = "1024";

impl Case<'_> {
    pub(crate) fn who(&self) -> String {
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

pub(crate) fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("dataloader.json has no number {key}: {v}"))
}

/// The workload's WORKERS lines in order: when each was printed
/// (`wall_ns`) and the pids it names, by their index in the loader.
pub(crate) fn worker_sets(lines: &[String]) -> Vec<(Option<i64>, Vec<i64>)> {
    lines
        .iter()
        .filter(|l| l.starts_with("WORKERS "))
        .map(|l| {
            let field = |key: &str| {
                l.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(key).map(str::to_string))
            };
            let wall = field("wall_ns=").and_then(|t| t.parse::<i64>().ok());
            let pids = field("pids=").unwrap_or_default();
            (
                wall,
                pids.split(',').filter_map(|x| x.parse().ok()).collect(),
            )
        })
        .collect()
}

/// Every worker the workload announced up to `t_ns` (pid, its index in
/// the loader), the last set last.
fn workers_until(lines: &[String], t_ns: i64) -> Vec<(i64, usize)> {
    worker_sets(lines)
        .into_iter()
        .filter(|(wall, _)| *wall <= Some(t_ns))
        .flat_map(|(_, pids)| pids.into_iter().zip(0..))
        .collect()
}

/// The worker pids the workload announced last before `t_ns`.
fn announced_workers(lines: &[String], t_ns: i64) -> Vec<i64> {
    worker_sets(lines)
        .into_iter()
        .rfind(|(wall, _)| *wall <= Some(t_ns))
        .map(|(_, pids)| pids)
        .unwrap_or_default()
}

/// The workload's lines once one of its GT lines is past `t_ns` (it
/// prints one every 0.1 s).
pub(crate) fn lines_past(w: &Workload, t_ns: i64) -> Vec<String> {
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

/// What a checked recording leaves to look at further.
pub(crate) struct Checked {
    /// dataloader.json.
    pub d: Value,
    /// The workload's stdout, up to a second past the window's end.
    pub lines: Vec<String>,
    pub snapshot: PipelineSnapshot,
    /// report.json.
    pub report: Value,
    /// The probe's stdout (its summary); empty where the caller read the
    /// recording itself.
    pub stdout: String,
}

/// Records the case by PID and compares dataloader.json with the loop's
/// own counts over the same window; returns the summary.
fn check(case: &Case) -> Value {
    check_all(case).d
}

pub(crate) fn check_all(case: &Case) -> Checked {
    case.check_running(&case.start())
}

impl Case<'_> {
    /// Starts the case's workload (epochs of `EPOCH_SAMPLES`), READY.
    pub(crate) fn start(&self) -> Workload {
        let mut args = vec!["--seconds", "600", "--epoch-samples", EPOCH_SAMPLES];
        args.extend_from_slice(self.args);
        Workload::start_in(&[], &torch_python(), self.script, &args)
    }

    /// Records the running workload `w` by PID and compares
    /// dataloader.json with the loop's own counts over the same window.
    pub(crate) fn check_running(&self, w: &Workload) -> Checked {
        let dir = tempdir(&self.tag());
        let out = record_out(w, self.seconds, &dir, &BUDGET);
        let stdout = String::from_utf8_lossy(&out.stdout);
        agrees_with_loop(self, &dir, &stdout, |t1| lines_past(w, t1))
    }
}

/// Compares the recording in `dir` (dataloader.json, stages.folded) and
/// the probe's `stdout` with the loop's own counts over the same window;
/// `lines(t)`: the workload's lines once they cover the instant t.
/// Returns what was checked.
pub(crate) fn agrees_with_loop(
    case: &Case,
    dir: &Path,
    stdout: &str,
    lines: impl FnOnce(i64) -> Vec<String>,
) -> Checked {
    let text = std::fs::read_to_string(dir.join("dataloader.json"))
        .unwrap_or_else(|e| panic!("no dataloader.json ({e}); stdout:\n{stdout}"));
    let d: Value = serde_json::from_str(&text).expect("dataloader.json");
    let (t0, t1) = (
        d["start_wall_ns"].as_i64().expect("start_wall_ns"),
        d["end_wall_ns"].as_i64().expect("end_wall_ns"),
    );
    // A second past the end: the workers' last IO lines before the end
    // are in (an item takes milliseconds).
    let lines = lines(t1 + 1_000_000_000);
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
                    && l.contains(";Images.__getitem__ (torch_image.py)")),
            "{who}: no [get item] stack with the dataset's Images.__getitem__ (its qualified name, Python 3.11) in stages.folded"
        );
        assert!(dir.join("stages.svg").exists(), "{who}: no stages.svg");
        if announced.is_empty() {
            // The loop loads its own batches and bounds itself: the
            // analysis names where loading goes (the decode, the resize).
            let report = std::fs::read_to_string(dir.join("report.txt")).expect("report.txt");
            assert!(
                report.lines().any(|l| l.contains("goes mostly to")
                    && (l.contains("(PIL/") || l.contains("(torchvision/"))),
                "{who}: no note on the hot spots of loading:\n{report}"
            );
        }
        let all = workers_until(&lines, t1);
        check_trace(dir, &who, ready_pid(&lines), &announced, &all, &d);
        check_profile(dir, &who, &folded, !announced.is_empty());
    }
    check_analyze(dir, &who);
    Checked {
        stdout: stdout.to_string(),
        ..Checked::read(dir, d, lines)
    }
}

/// `plumber-probe analyze stats.pb` reads the recording's stats.pb back
/// and reaches report.txt's analysis: the file carries all it rests on.
/// It once refused every recording with file reads outside the stages
/// (a top-level integer field, `probe_unattributed_io_bytes`).
fn check_analyze(dir: &Path, who: &str) {
    let stats = dir.join("stats.pb");
    let o = run_probe(&["analyze", stats.to_str().expect("utf8")]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{who}: analyze stats.pb: {err}");
    let report = std::fs::read_to_string(dir.join("report.txt")).expect("report.txt");
    let analysis = |t: &str| t.find("BOTTLENECK").map(|i| t[i..].trim_end().to_string());
    assert_eq!(
        analysis(&out),
        analysis(&report),
        "{who}: analyze stats.pb differs from report.txt"
    );
}

impl Checked {
    /// What was checked of the recording in `dir`: its dataloader.json
    /// `d`, the workload's `lines`, and its stats.pb and report.json.
    pub(crate) fn read(dir: &Path, d: Value, lines: Vec<String>) -> Checked {
        let report = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
        Checked {
            d,
            lines,
            snapshot: read_snapshot(&dir.join("stats.pb")),
            report: serde_json::from_str(&report).expect("report.json"),
            stdout: String::new(),
        }
    }

    /// What the workload counted (`key` of its GT lines) over
    /// dataloader.json's window.
    pub(crate) fn gt(&self, key: &str) -> f64 {
        let at = |k: &str| self.d[k].as_i64().unwrap_or_else(|| panic!("no {k}"));
        let (t0, t1) = (at("start_wall_ns"), at("end_wall_ns"));
        gt_at_lines(&self.lines, t1, key) - gt_at_lines(&self.lines, t0, key)
    }
}

/// The training process's pid, from the workload's READY line.
fn ready_pid(lines: &[String]) -> i32 {
    lines
        .iter()
        .find(|l| l.starts_with("READY "))
        .and_then(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix("pid=")))
        .and_then(|p| p.parse().ok())
        .expect("the workload's READY line names its pid")
}

/// dataloader.json's stage keys and the names trace.json's spans have.
const STAGES: &[(&str, &str)] = &[
    ("wait", "waiting for data"),
    ("receive", "receive"),
    ("startup", "worker start-up"),
    ("get_item", "get item"),
    ("collate", "collate"),
    ("send", "send"),
    ("idle", "idle"),
    ("pin_memory", "pin memory"),
    ("other", "training step"),
];

/// trace.json: a process for the training loop and for the workers the
/// workload announced last, named as Perfetto shows them, with spans
/// named by stage that never overlap on one thread, and whose time per
/// stage is what dataloader.json (`d`) counted; any other worker of the
/// window (`all`, short epochs) named as well where it has spans.
fn check_trace(
    dir: &Path,
    who: &str,
    training: i32,
    workers: &[i64],
    all: &[(i64, usize)],
    d: &Value,
) {
    let trace: Value =
        serde_json::from_slice(&std::fs::read(dir.join("trace.json")).expect("trace.json"))
            .expect("trace.json is JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let processes: BTreeMap<i64, &str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter_map(|e| Some((e["pid"].as_i64()?, e["args"]["name"].as_str()?)))
        .collect();
    let mut spans: BTreeMap<(i64, i64), Vec<(f64, f64)>> = BTreeMap::new();
    let mut stages: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
    // Span time per stage key: the training loop's, the workers'.
    let mut time: [BTreeMap<&str, f64>; 2] = Default::default();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let name = e["name"].as_str().expect("name");
        let key = STAGES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(k, _)| *k)
            .unwrap_or_else(|| panic!("{who}: span of no stage: {e}"));
        assert_eq!(e["cat"], "dataloader", "{who}: {e}");
        assert!(
            e["args"]["function"]
                .as_str()
                .is_some_and(|f| (f.contains(" (") && f.ends_with(')'))
                    || f == "[no Python frame]"),
            "{who}: span without its Python function: {e}"
        );
        let (pid, tid) = (
            e["pid"].as_i64().expect("pid"),
            e["tid"].as_i64().expect("tid"),
        );
        let (ts, dur) = (
            e["ts"].as_f64().expect("ts"),
            e["dur"].as_f64().expect("dur"),
        );
        spans.entry((pid, tid)).or_default().push((ts, ts + dur));
        stages.entry(pid).or_default().push(name);
        // The training loop's thread (its tid is the pid), the workers'
        // threads; not the pin-memory thread, which dataloader.json keeps
        // apart.
        let t = i64::from(training);
        if pid != t || tid == t {
            *time[usize::from(pid != t)].entry(key).or_default() += dur;
        }
    }
    // A tick's time goes to the thread's stage and to its span alike; the
    // spans cover the sampler's whole run, dataloader.json the window.
    for (t, summary) in time.iter().zip(["training", "workers_stages"]) {
        let total: f64 = t.values().sum();
        for (key, _) in STAGES {
            let share = t.get(key).map_or(0.0, |v| v / total);
            let want = d[summary][key].as_f64().unwrap_or(0.0);
            assert!(
                (share - want).abs() <= 0.05,
                "{who}: {key}: {share:.3} of the {summary} spans' time, dataloader.json says {want:.3}"
            );
        }
    }
    let n: usize = spans.values().map(Vec::len).sum();
    eprintln!(
        "{who}: trace.json: {n} spans on {} threads of {} processes",
        spans.len(),
        processes.len()
    );
    let training = i64::from(training);
    assert_eq!(
        processes.get(&training).copied(),
        Some(format!("training loop (pid {training})").as_str()),
        "{who}: the training loop's process in trace.json: {processes:?}"
    );
    assert!(
        stages.get(&training).is_some_and(|s| !s.is_empty()),
        "{who}: no span of the training loop"
    );
    for (pid, i) in all.iter().filter(|(p, _)| processes.contains_key(p)) {
        assert_eq!(
            processes.get(pid).copied(),
            Some(format!("worker {i} (pid {pid})").as_str()),
            "{who}: worker {i}'s process in trace.json: {processes:?}"
        );
    }
    // Each worker with its track and get-item spans where the workers
    // live through the window; with epochs of a few batches a worker
    // lives ~0.5 s, a few ticks of a slowed sampler, which may miss it or
    // fall in its other stages: most of those seen then.
    let getting = |p: &i64| stages.get(p).is_some_and(|s| s.contains(&"get item"));
    if all.len() <= workers.len() {
        for pid in workers {
            assert!(
                getting(pid),
                "{who}: no get item span of worker {pid}: {:?}",
                stages.get(pid)
            );
        }
    } else {
        let seen: Vec<i64> = all
            .iter()
            .map(|&(p, _)| p)
            .filter(|p| processes.contains_key(p))
            .collect();
        let n = seen.iter().filter(|p| getting(p)).count();
        assert!(
            n > 0 && 2 * n >= seen.len(),
            "{who}: get item spans on {n} of the {} workers in trace.json",
            seen.len()
        );
    }
    for (thread, mut v) in spans {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in v.windows(2) {
            // ts and dur are printed in µs with 3 decimals.
            assert!(
                w[0].1 <= w[1].0 + 0.001,
                "{who}: spans overlap on {thread:?}: {w:?}"
            );
        }
    }
}

/// profile.pb.gz, read by the independent decoder: wall time, the same
/// total as stages.folded, and the dataset's items under their stage and
/// the process that ran them, as frames and as labels.
fn check_profile(dir: &Path, who: &str, folded: &str, with_workers: bool) {
    let o = std::process::Command::new(python())
        .arg(repo().join("tests/python/decode_pprof.py"))
        .arg(dir.join("profile.pb.gz"))
        .arg("--stacks")
        .output()
        .expect("run decode_pprof.py");
    assert!(
        o.status.success(),
        "{who}: profile.pb.gz: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("decode_pprof.py's JSON");
    assert_eq!(
        v["sample_types"],
        serde_json::json!([["wall", "nanoseconds"]]),
        "{who}"
    );
    let folded_ns: u64 = folded
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert_eq!(
        v["totals"]["wall"].as_u64(),
        Some(folded_ns),
        "{who}: profile.pb.gz's wall time against stages.folded's"
    );
    let process = if with_workers {
        "worker "
    } else {
        "training loop (pid "
    };
    let stacks = v["stacks"].as_array().expect("stacks");
    let under_stage = stacks.iter().any(|st| {
        let frames: Vec<&str> = st["frames"]
            .as_array()
            .map(|f| f.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        frames.first() == Some(&"[get item]")
            && frames.get(1).is_some_and(|p| p.starts_with(process))
            && frames.contains(&"Images.__getitem__ (torch_image.py)")
            && st["labels"]["stage"] == "get_item"
            && st["labels"]["process"].as_str() == frames.get(1).copied()
    });
    assert!(
        under_stage,
        "{who}: no get item sample with the dataset's __getitem__ under {process:?} in profile.pb.gz"
    );
    eprintln!(
        "{who}: profile.pb.gz: {} samples, {} functions",
        v["num_samples"], v["num_functions"]
    );
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
        // The functions that take it: the image decode and torchvision's
        // transforms, by own time, their shares within the stage's.
        let f = d["functions"]["get_item"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            f.iter().any(|x| x["function"]
                .as_str()
                .is_some_and(|n| n.contains("(PIL/") || n.contains("(torchvision/"))),
            "no PIL or torchvision function in get_item's: {f:?}"
        );
        let own: f64 = f.iter().filter_map(|x| x["own"].as_f64()).sum();
        assert!(
            own > 0.0 && own <= 1.0 + 1e-9,
            "get_item's own shares sum to {own}"
        );
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
    // Spawned workers are the training process's children too: their
    // reads are followed, within one item at each end of the window.
    let data = data_dir();
    let c = check_all(&Case {
        script: "torch_image.py",
        args: &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--start-method",
            "spawn",
            "--persistent-workers",
            "--data",
            &data,
        ],
        seconds: 8.0,
    });
    check_file_reads(&c, &data, "spawn");
}

#[test]
fn dataloader_forkserver_workers_new_each_epoch() {
    // Forkserver workers are the forkserver's children, not the training
    // process's: they are found all the same, though they come and go at
    // each 32-batch epoch's edges. A worker that started just before the
    // window's end has read thousands of module files and a few of the
    // dataset: its dataset directories are listed all the same, their
    // bytes exact against its own count.
    let data = data_dir();
    let c = check_all(&Case {
        script: "torch_image.py",
        args: &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--epoch-samples",
            "512",
            "--start-method",
            "forkserver",
            "--data",
            &data,
            // Batches come in bursts between start-ups: a GT line per
            // batch, or interpolating between lines 0.1 s apart misses
            // up to two batches at each end of the window.
            "--gt-interval",
            "0.005",
        ],
        seconds: 10.0,
    });
    // Each epoch's workers import torch before their first item: the
    // loop waits for that, which is start-up, not the workers' pace, and
    // their CPU is the job's though the forkserver reaps them.
    let d = &c.d;
    assert!(num(d, "job_cores") > 0.5, "the job's CPU: {d}");
    let starting = d["workers_stages"]["startup"].as_f64().unwrap_or(0.0);
    assert!(starting > 0.3, "the workers' start-up: {d}");
    assert!(
        d["training"]["startup"].as_f64().unwrap_or(0.0) > 0.3,
        "{d}"
    );
    let r = &c.report;
    assert!(
        r["limited_elsewhere"].is_null(),
        "{}",
        r["limited_elsewhere"]
    );
    assert_eq!(
        r["recommendations"][0]["kind"], "persistent_workers",
        "{}",
        r["recommendations"]
    );
    check_file_reads(&c, &data, "forkserver");
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
            BUDGET[0],
            BUDGET[1],
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

/// The IO lines of one process: (wall_ns, bytes, reads), in order.
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
    // Its cost, as for TensorFlow (cost.rs): the same in stats.pb and
    // report.json, its parts summing to the total, and never silently
    // over the default budget (this debug binary's 2.2-2.9% is slowed
    // from 2 s on, and the line says so).
    let s = read_snapshot(&dir.join("stats.pb"));
    crate::cost::check_consistent("torch_image.py", &s, &crate::cost::overhead(&dir));
    let c = s.probe_overhead.expect("checked");
    assert!(
        c.target_share <= c.budget
            || (cost.contains("OVER BUDGET")
                && c.thinned.iter().any(|t| t.contains("stage sampler slowed"))),
        "over the budget silently: {cost}\n{:?}",
        c.thinned
    );
    assert_eq!(
        checksum_after_exit(w),
        plain,
        "the job's batches changed under the probe"
    );
}
