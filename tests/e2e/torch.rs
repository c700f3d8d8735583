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
    gt_at_lines, python, read_snapshot, record_out, repo, tempdir, torch_python, Workload,
};
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

/// What a checked recording leaves to look at further.
struct Checked {
    /// dataloader.json.
    d: Value,
    /// The workload's stdout, up to a second past the window's end.
    lines: Vec<String>,
    snapshot: PipelineSnapshot,
}

/// Records the case by PID and compares dataloader.json with the loop's
/// own counts over the same window; returns the summary.
fn check(case: &Case) -> Value {
    check_all(case).d
}

fn check_all(case: &Case) -> Checked {
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
/// Returns what was checked.
fn agrees_with_loop(
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
                    && l.contains(";__getitem__ (torch_image.py)")),
            "{who}: no [get item] stack with the dataset's __getitem__ in stages.folded"
        );
        assert!(dir.join("stages.svg").exists(), "{who}: no stages.svg");
        check_trace(dir, &who, ready_pid(&lines), &announced, &d);
        check_profile(dir, &who, &folded, !announced.is_empty());
    }
    Checked {
        d,
        lines,
        snapshot: read_snapshot(&dir.join("stats.pb")),
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

/// trace.json: a process for the training loop and one for each worker
/// the workload announced, named as Perfetto shows them, each with spans
/// named by stage that never overlap on one thread, and whose time per
/// stage is what dataloader.json (`d`) counted.
fn check_trace(dir: &Path, who: &str, training: i32, workers: &[i64], d: &Value) {
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
    for (i, pid) in workers.iter().enumerate() {
        assert_eq!(
            processes.get(pid).copied(),
            Some(format!("worker {i} (pid {pid})").as_str()),
            "{who}: worker {i}'s process in trace.json: {processes:?}"
        );
        assert!(
            stages.get(pid).is_some_and(|s| s.contains(&"get item")),
            "{who}: no get item span of worker {pid}: {:?}",
            stages.get(pid)
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
            && frames.contains(&"__getitem__ (torch_image.py)")
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

/// The IO lines of one process: (wall_ns, bytes, reads), in order.
fn io_lines(lines: &[String], pid: i64) -> Vec<(i64, u64, u64)> {
    lines
        .iter()
        .filter(|l| l.starts_with("IO "))
        .filter_map(|l| {
            let f = |k: &str| {
                l.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(k)?.parse::<i64>().ok())
            };
            (f("pid=")? == pid).then_some((
                f("wall_ns=")?,
                f("bytes=")? as u64,
                f("reads=")? as u64,
            ))
        })
        .collect()
}

/// Bounds of what a process had read of the dataset at instant `t`, by
/// `key` (0: bytes, 1: reads): its last IO line at or before `t`, its first
/// at or after (none after: nothing read since its last; none before:
/// nothing read yet, a worker's first line being its zeros).
fn io_bounds(pts: &[(i64, u64, u64)], t: i64, key: usize) -> (u64, u64) {
    let v = |p: &(i64, u64, u64)| if key == 0 { p.1 } else { p.2 };
    let lo = pts.iter().rfind(|p| p.0 <= t).map_or(0, v);
    let hi = pts.iter().find(|p| p.0 >= t).or(pts.last()).map_or(0, v);
    (lo, hi)
}

/// Bounds of what a process read of the dataset between `t0` and `t1`.
fn io_window(pts: &[(i64, u64, u64)], t0: i64, t1: i64, key: usize) -> (u64, u64) {
    let (lo0, hi0) = io_bounds(pts, t0, key);
    let (lo1, hi1) = io_bounds(pts, t1, key);
    (lo1.saturating_sub(hi0), hi1 - lo0)
}

/// (bytes, reads) a process's entry of dataloader.json says it read from
/// files under `dir`.
fn read_under(p: &Value, dir: &str) -> (u64, u64) {
    p["io_dirs"]
        .as_array()
        .expect("io_dirs")
        .iter()
        .filter(|d| {
            d["dir"]
                .as_str()
                .is_some_and(|x| x == dir || x.starts_with(&format!("{dir}/")))
        })
        .fold((0, 0), |(b, r), d| {
            (
                b + d["bytes"].as_u64().unwrap_or(0),
                r + d["reads"].as_u64().unwrap_or(0),
            )
        })
}

/// The probe's file reads against the workload's own counts (its IO
/// lines: what each process's read() syscalls on the dataset's files
/// returned), per process, over the window. The probe cuts its counts at
/// the window's two instants; the workload prints a count after each item,
/// so at each instant a process's true count is known to within the item
/// it was reading then: the probe must fall inside those bounds, and equal
/// the count exactly for a process that started and ended inside the
/// window. Returns how many processes were compared exactly.
fn check_file_reads(c: &Checked, data: &str, who: &str) -> usize {
    let (t0, t1) = (
        c.d["start_wall_ns"].as_i64().expect("start"),
        c.d["end_wall_ns"].as_i64().expect("end"),
    );
    let io = &c.d["io"];
    assert!(io.is_object(), "{who}: no file reads in dataloader.json");
    let training_pid = c
        .lines
        .iter()
        .find(|l| l.starts_with("READY "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix("pid=")?.parse::<i64>().ok())
        })
        .expect("READY pid");
    let mut procs: Vec<(i64, &Value)> = c.d["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| (w["pid"].as_i64().expect("pid"), w))
        .collect();
    procs.push((training_pid, &io["training"]));
    let mut exact = 0;
    let mut total = (0u64, 0u64, 0u64);
    for (pid, p) in &procs {
        let pts = io_lines(&c.lines, *pid);
        let (bytes, reads) = read_under(p, data);
        let (lo, hi) = io_window(&pts, t0, t1, 0);
        let (rlo, rhi) = io_window(&pts, t0, t1, 1);
        eprintln!(
            "{who}: process {pid}: {bytes} bytes in {reads} reads of the dataset; its own count {lo}..={hi} bytes, {rlo}..={rhi} reads"
        );
        assert!(
            lo <= bytes && bytes <= hi && rlo <= reads && reads <= rhi,
            "{who}: process {pid} read {bytes} bytes in {reads} reads of {data}, its own count says {lo}..={hi} bytes, {rlo}..={rhi} reads"
        );
        if lo == hi && lo > 0 {
            exact += 1;
        }
        total = (total.0 + bytes, total.1 + lo, total.2 + hi);
        // Every byte the probe counted is in the process's total.
        assert!(
            p["io_bytes"].as_u64().unwrap_or(0) >= bytes,
            "{who}: process {pid}: io_bytes below its dataset bytes: {p}"
        );
    }
    eprintln!(
        "{who}: the dataset's bytes in the window: probe {}, the job's own count {}..={}",
        total.0, total.1, total.2
    );
    // The stage that reads: its node in stats.pb has the bytes too.
    let get_item = c
        .snapshot
        .stats
        .iter()
        .find(|s| s.name.starts_with("GetItemDataset"))
        .expect("GetItem's stats");
    assert!(
        get_item.probe_io_bytes_read as u64 >= total.0 && get_item.probe_files_opened > 0,
        "{who}: GetItem's file reads in stats.pb, {} bytes from {} files, miss the {} bytes of the dataset",
        get_item.probe_io_bytes_read,
        get_item.probe_files_opened,
        total.0
    );
    exact
}

/// The dataset directory, as the workload is given it.
fn data_dir() -> String {
    repo()
        .canonicalize()
        .expect("repo")
        .join("tests/data/torch_images")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn dataloader_file_reads_match_the_job_per_process() {
    let data = data_dir();
    // Without workers: the training loop reads every file itself, over the
    // whole window (bounds of one item at each end).
    let c = check_all(&Case {
        script: "torch_image.py",
        args: &["--num-workers", "0", "--batch-size", "16", "--data", &data],
        seconds: 8.0,
    });
    check_file_reads(&c, &data, "no workers");
    // Two forked workers, a new pair every epoch of 16 batches (short
    // epochs without persistent workers: a new iterator about every 0.7 s,
    // often where the last one was freed): the batch count still agrees
    // with the loop's, and the pairs that started and ended inside the
    // window are counted exactly.
    let c = check_all(&Case {
        script: "torch_image.py",
        args: &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--epoch-samples",
            "256",
            "--data",
            &data,
        ],
        seconds: 10.0,
    });
    let exact = check_file_reads(&c, &data, "2 workers");
    assert!(
        exact >= 1,
        "no worker lived inside the window: nothing compared exactly"
    );
    // The training process reads none of the dataset beside its workers.
    assert_eq!(read_under(&c.d["io"]["training"], &data), (0, 0));
}

#[test]
fn dataloader_file_reads_with_the_probe_in_its_own_pid_namespace() {
    // The job and the probe in a PID namespace of their own (a container
    // running both): processes are followed by their PIDs there, workers
    // forked from the training process included, and still compared
    // exactly with what each one counted itself (it prints the PID it
    // sees).
    let data = data_dir();
    let out = tempdir("torch-pidns");
    let script = format!(
        "{py} {wl} --seconds 600 --num-workers 2 --batch-size 16 --epoch-samples 256 --data {data} \
           >{out}/workload.log 2>/dev/null & WP=$!; \
         for i in $(seq 1 1200); do grep -q READY {out}/workload.log && break; sleep 0.2; done; \
         {probe} --pid $WP --duration 8 --output {out} -q; rc=$?; sleep 1; kill $WP; wait $WP; exit $rc",
        py = torch_python().display(),
        wl = repo().join("tests/workloads/torch_image.py").display(),
        out = out.display(),
        probe = crate::harness::probe_bin().display(),
    );
    let o = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("dataloader.json")).expect("dataloader.json"),
    )
    .expect("json");
    let lines: Vec<String> = std::fs::read_to_string(out.join("workload.log"))
        .expect("workload.log")
        .lines()
        .map(str::to_string)
        .collect();
    let c = Checked {
        d,
        lines,
        snapshot: read_snapshot(&out.join("stats.pb")),
    };
    // Inside the namespace the training process is a low PID.
    assert!(
        c.lines.iter().any(|l| l.starts_with("READY pid=")
            && l["READY pid=".len()..]
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<i32>().ok())
                .is_some_and(|p| p < 100)),
        "{:?}",
        c.lines.iter().find(|l| l.starts_with("READY"))
    );
    let exact = check_file_reads(&c, &data, "PID namespace");
    assert!(exact >= 1, "no worker lived inside the window");
}

#[test]
fn dataloader_without_bpf_says_file_reads_are_not_measured() {
    // Root without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (a container's
    // root, say) reads the loader but cannot load BPF: the recording goes
    // on and says what it did not measure.
    let w = Workload::start_in(
        &[],
        &torch_python(),
        "torch_image.py",
        &[
            "--seconds",
            "600",
            "--num-workers",
            "1",
            "--batch-size",
            "16",
        ],
    );
    let dir = tempdir("torch-no-bpf");
    let o = std::process::Command::new("setpriv")
        .args([
            "--bounding-set=-bpf,-perfmon,-sys_admin",
            "--inh-caps=-bpf,-perfmon,-sys_admin",
        ])
        .arg(crate::harness::probe_bin())
        .args(["--pid", &w.pid.to_string(), "--duration", "3", "-q"])
        .arg("--output")
        .arg(&*dir)
        .output()
        .expect("setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("  file reads: not measured"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("  - file reads (loading BPF programs")),
        "{stdout}"
    );
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("dataloader.json")).expect("dataloader.json"),
    )
    .expect("json");
    assert!(d.get("io").is_none(), "{d}");
    assert!(d["batches"].as_u64().unwrap_or(0) > 0, "{d}");
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
