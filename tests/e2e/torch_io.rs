//! File reads of PyTorch DataLoader jobs: what the probe counts each
//! process reading from the dataset's files, against what each process
//! counted itself, by PID, inside a PID namespace of the probe's own, and
//! what a recording without BPF says it did not measure.

use serde_json::Value;

use crate::harness::{repo, tempdir, torch_python, Workload};
use crate::torch::{check_all, Case, Checked};

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
pub(crate) fn check_file_reads(c: &Checked, data: &str, who: &str) -> usize {
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
pub(crate) fn data_dir() -> String {
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
    crate::harness::run_in_pid_namespace(&script);
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("dataloader.json")).expect("dataloader.json"),
    )
    .expect("json");
    let lines: Vec<String> = std::fs::read_to_string(out.join("workload.log"))
        .expect("workload.log")
        .lines()
        .map(str::to_string)
        .collect();
    let c = Checked::read(&out, d, lines);
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
