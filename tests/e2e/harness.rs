//! Shared machinery of the end-to-end tests: real TensorFlow workloads from
//! tests/workloads (run in the project's virtualenv), the real probe binary,
//! and the workloads' own ground truth.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plumber_collector::proto::PipelineSnapshot;
use prost::Message;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Opens `html` in headless Chromium with tests/html/check_report.py
/// (its checks, and `args` for more) and fails with its output if it
/// does.
pub fn check_report_html(html: &Path, args: &[&std::ffi::OsStr]) {
    let o = std::process::Command::new("python3")
        .arg(repo().join("tests/html/check_report.py"))
        .arg(html)
        .args(args)
        .output()
        .expect("run check_report.py");
    assert!(
        o.status.success(),
        "check_report.py failed ({:?}):\n{}\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

pub fn probe_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_plumber-probe"))
}

pub fn python() -> PathBuf {
    let p = repo().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} missing: run scripts/setup.sh (it installs the pinned tensorflow-cpu)",
        p.display()
    );
    p
}

/// The PyTorch test bed's Python (scripts/torch.sh).
pub fn torch_python() -> PathBuf {
    let p = repo().join(".venv-torch/bin/python");
    assert!(
        p.exists(),
        "{} missing: run scripts/setup.sh (it installs the pinned torch and torchvision)",
        p.display()
    );
    p
}

/// These tests attach BPF programs and read another process's memory.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "end-to-end tests need root (BPF, process_vm_readv): run them with sudo, as CI does"
    );
}

/// A test's scratch directory: removed when the test passes, kept (and its
/// path printed) when it fails, so the outputs can be looked at.
pub struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TestDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("outputs kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn tempdir(tag: &str) -> TestDir {
    let d = std::env::temp_dir().join(format!("plumber-e2e-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    TestDir(d)
}

/// A running workload; killed when dropped.
pub struct Workload {
    pub child: Child,
    pub pid: i32,
    pub lines: Arc<Mutex<Vec<String>>>,
    err_path: PathBuf,
}

impl Workload {
    pub fn start(script: &str, args: &[&str]) -> Workload {
        Self::start_in(&[], &python(), script, args)
    }

    /// Starts the workload in a mount namespace of its own, where `dir` is
    /// bind-mounted on an empty directory (`plumber-e2e-{tag}-PID` under the
    /// temp dir), and runs `python` (a path relative to `dir`) from there:
    /// a container's view, whose files exist only through /proc/PID/root.
    /// Returns the mount point (empty on the host; remove it after the
    /// workload) and the Python's path inside.
    pub fn start_behind_bind_mount(
        dir: &Path,
        tag: &str,
        python: &str,
        script: &str,
        args: &[&str],
    ) -> (Workload, PathBuf, PathBuf) {
        let inside = std::env::temp_dir().join(format!("plumber-e2e-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&inside).expect("mount point");
        let mount = format!(
            "mount --bind {} {} && exec \"$0\" \"$@\"",
            dir.display(),
            inside.display()
        );
        let py = inside.join(python);
        let wrapper = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &mount,
        ];
        let w = Self::start_in(&wrapper, &py, script, args);
        (w, inside, py)
    }

    /// Starts the workload through `wrapper` (e.g. `unshare ... --`) with
    /// the given Python. The PID is the one the workload prints (as the
    /// wrapper's namespaces see it when it has its own PID namespace, else
    /// the global one).
    pub fn start_in(wrapper: &[&str], python: &Path, script: &str, args: &[&str]) -> Workload {
        Self::start_until(wrapper, python, script, args, "READY")
    }

    /// As [`Workload::start_in`], returning once a line starts with
    /// `until` (READY: its first batch); the PID is that line's `pid=`.
    pub fn start_until(
        wrapper: &[&str],
        python: &Path,
        script: &str,
        args: &[&str],
        until: &str,
    ) -> Workload {
        require_root();
        // TensorFlow's start-up chatter goes to a file, shown if it fails.
        let err_path = std::env::temp_dir().join(format!(
            "plumber-e2e-{}-{script}.stderr",
            std::process::id()
        ));
        let err_file = std::fs::File::create(&err_path).expect("stderr file");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(python);
                c
            }
            None => Command::new(python),
        };
        // Its own process group, killed whole at the end: a training
        // process killed alone leaves forkserver workers behind (each
        // holds the forkserver's liveness pipe, and torch's worker
        // watchdog watches the forkserver, its parent), taking CPU from
        // every later test.
        let mut child = std::os::unix::process::CommandExt::process_group(&mut cmd, 0)
            .arg(repo().join("tests/workloads").join(script))
            .args(args)
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .env("PYTHONUNBUFFERED", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err_file))
            .spawn()
            .expect("start workload");
        let pid = child.id() as i32;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("stdout");
        let sink = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().expect("lock").push(l);
            }
        });
        let mut w = Workload {
            child,
            pid,
            lines,
            err_path: err_path.clone(),
        };
        let t0 = Instant::now();
        while !w.snapshot_lines().iter().any(|l| l.starts_with(until)) {
            if let Ok(Some(status)) = w.child.try_wait() {
                panic!(
                    "{script} exited ({status}) before {until}; its stderr:\n{}",
                    std::fs::read_to_string(&err_path).unwrap_or_default()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(240),
                "{script} did not print {until}; its stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let ready = w
            .snapshot_lines()
            .into_iter()
            .find(|l| l.starts_with(until))
            .unwrap_or_default();
        if let Some(p) = ready
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("pid=")?.parse().ok())
        {
            w.pid = p;
        }
        w
    }

    pub fn snapshot_lines(&self) -> Vec<String> {
        self.lines.lock().expect("lock").clone()
    }

    /// Interpolated cumulative `key` (root or elems) at a Unix-ns instant.
    fn gt_at(&self, t_ns: i64, key: &str) -> f64 {
        gt_at_lines(&self.snapshot_lines(), t_ns, key)
    }

    /// What the workload itself counted (`key`: root or elems) over the
    /// recording window of `s`.
    pub fn counted_in_window(&self, s: &PipelineSnapshot, key: &str) -> f64 {
        let info = s.snapshot_info.as_ref().expect("snapshot_info");
        let (t0, t1) = (info.start_time, info.current_time);
        assert!(t1 > t0, "window");
        self.wait_gt_past(t1);
        self.gt_at(t1, key) - self.gt_at(t0, key)
    }

    /// Waits until the workload's ground truth covers `t_ns`.
    fn wait_gt_past(&self, t_ns: i64) {
        let t0 = Instant::now();
        loop {
            let last = self
                .snapshot_lines()
                .iter()
                .rev()
                .find(|l| l.starts_with("GT "))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)?
                        .strip_prefix("wall_ns=")?
                        .parse::<i64>()
                        .ok()
                });
            if last.is_some_and(|t| t >= t_ns) || t0.elapsed() > Duration::from_secs(10) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.err_path);
        }
    }
}

/// Interpolated cumulative `key` (root or elems) at a Unix-ns instant, from
/// a workload's stdout lines.
pub fn gt_at_lines(lines: &[String], t_ns: i64, key: &str) -> f64 {
    let pts: Vec<(i64, f64)> = lines
        .iter()
        .filter(|l| l.starts_with("GT "))
        .filter_map(|l| {
            let mut ts = None;
            let mut v = None;
            for kv in l.split_whitespace().skip(1) {
                let (k, val) = kv.split_once('=')?;
                if k == "wall_ns" {
                    ts = val.parse::<i64>().ok();
                } else if k == key {
                    v = val.parse::<f64>().ok();
                }
            }
            Some((ts?, v?))
        })
        .collect();
    assert!(pts.len() >= 2, "too few GT lines");
    assert!(
        pts[0].0 <= t_ns && t_ns <= pts[pts.len() - 1].0,
        "instant {t_ns} outside the workload's ground truth [{}, {}]",
        pts[0].0,
        pts[pts.len() - 1].0
    );
    let i = pts
        .partition_point(|p| p.0 <= t_ns)
        .max(1)
        .min(pts.len() - 1);
    let (t0, v0) = pts[i - 1];
    let (t1, v1) = pts[i];
    if t1 == t0 {
        return v1;
    }
    v0 + (v1 - v0) * (t_ns - t0) as f64 / (t1 - t0) as f64
}

/// What a finished workload counted (`key`: root or elems) over the
/// recording window of `s`, from its stdout lines.
pub fn counted_in_lines(lines: &[String], s: &PipelineSnapshot, key: &str) -> f64 {
    let info = s.snapshot_info.as_ref().expect("snapshot_info");
    let (t0, t1) = (info.start_time, info.current_time);
    assert!(t1 > t0, "window");
    gt_at_lines(lines, t1, key) - gt_at_lines(lines, t0, key)
}

/// plumber-probe with the tests' layout cache.
pub fn probe_command() -> Command {
    let mut c = Command::new(probe_bin());
    c.env(
        "PLUMBER_PROBE_CACHE",
        std::env::temp_dir().join("plumber-e2e-cache"),
    );
    c
}

/// Runs the shell `script` as the first process of a new PID namespace
/// (`unshare --pid --fork --mount-proc`, as a container running the job
/// and the probe would), with the probe's cache as `probe_command` sets
/// it; asserts it succeeded and returns its stdout.
pub fn run_in_pid_namespace(script: &str) -> String {
    let o = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", script])
        .env(
            "PLUMBER_PROBE_CACHE",
            std::env::temp_dir().join("plumber-e2e-cache"),
        )
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

pub fn run_probe(args: &[&str]) -> Output {
    probe_command()
        .args(args)
        .output()
        .expect("run plumber-probe")
}

/// The arguments of a quiet `--pid` recording of `w` into `out`.
fn record_args(w: &Workload, seconds: f64, out: &Path) -> Vec<String> {
    vec![
        "--pid".into(),
        w.pid.to_string(),
        "--duration".into(),
        seconds.to_string(),
        "--output".into(),
        out.to_str().expect("utf8").into(),
        "-q".into(),
    ]
}

/// A `--pid` recording of `w` with `extra` arguments that must succeed;
/// its output (stdout: the cost line, the python line, ...) kept.
pub fn record_out(w: &Workload, seconds: f64, out: &Path, extra: &[&str]) -> Output {
    let base = record_args(w, seconds, out);
    let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    let o = run_probe(&args);
    assert!(
        o.status.success(),
        "plumber-probe failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    o
}

pub fn record(w: &Workload, seconds: f64, out: &Path, extra: &[&str]) -> PipelineSnapshot {
    record_out(w, seconds, out, extra);
    read_snapshot(&out.join("stats.pb"))
}

/// `record`, calling `at_close` as soon as the probe's recording window
/// closes (its "recording window closed" log line), before it writes its
/// outputs: something recorded beside it can then end on the same instant.
pub fn record_and_then(
    w: &Workload,
    seconds: f64,
    out: &Path,
    at_close: impl FnOnce(),
) -> PipelineSnapshot {
    let mut child = probe_command()
        .args(record_args(w, seconds, out))
        .args(["--log", "info"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run plumber-probe");
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("recording window closed") {
                let _ = tx.send(());
            }
            lines.push(line);
        }
        lines
    });
    let closed = rx.recv_timeout(Duration::from_secs_f64(seconds + 120.0));
    at_close();
    let status = child.wait().expect("wait for plumber-probe");
    let lines = reader.join().expect("stderr reader");
    assert!(
        closed.is_ok() && status.success(),
        "plumber-probe: {status}, window closed: {}\n{}",
        closed.is_ok(),
        lines.join("\n")
    );
    read_snapshot(&out.join("stats.pb"))
}

pub fn read_snapshot(p: &Path) -> PipelineSnapshot {
    let b = std::fs::read(p).expect("stats.pb written");
    PipelineSnapshot::decode(b.as_slice()).expect("stats.pb decodes")
}

/// (name, op, inputs) of every node, main graph and function library.
pub struct Graph {
    pub nodes: Vec<(String, String, Vec<String>, bool)>,
}

impl Graph {
    pub fn of(s: &PipelineSnapshot) -> Graph {
        let g = s.graph.as_ref().expect("graph");
        let mut nodes: Vec<(String, String, Vec<String>, bool)> = g
            .node
            .iter()
            .map(|n| (n.name.clone(), n.op.clone(), n.input.clone(), false))
            .collect();
        if let Some(lib) = &g.library {
            for f in &lib.function {
                for n in &f.node_def {
                    nodes.push((n.name.clone(), n.op.clone(), n.input.clone(), true));
                }
            }
        }
        Graph { nodes }
    }

    pub fn by_op(&self, op: &str) -> Vec<&(String, String, Vec<String>, bool)> {
        self.nodes.iter().filter(|n| n.1 == op).collect()
    }

    /// Whether main-graph node `to` is an input of `from`, directly or
    /// further down.
    pub fn reaches(&self, from: &str, to: &str) -> bool {
        let mut todo = vec![from.to_string()];
        let mut seen = std::collections::HashSet::new();
        while let Some(cur) = todo.pop() {
            if !seen.insert(cur.clone()) {
                continue;
            }
            let Some(n) = self.nodes.iter().find(|n| n.0 == cur && !n.3) else {
                continue;
            };
            for i in &n.2 {
                if i == to {
                    return true;
                }
                todo.push(i.clone());
            }
        }
        false
    }

    /// Main-graph chain from `dataset` down through first inputs, as ops;
    /// it ends at a source, whose first input is an argument (`Const` or
    /// `Placeholder`), not a dataset.
    pub fn chain(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = "dataset".to_string();
        for _ in 0..64 {
            let Some(n) = self
                .nodes
                .iter()
                .find(|n| n.0 == cur && !n.3 && (n.1.contains("Dataset") || n.1 == "_Retval"))
            else {
                break;
            };
            if n.0 != "dataset" {
                out.push(n.1.clone());
            }
            match n.2.first() {
                Some(i) => cur = i.clone(),
                None => break,
            }
        }
        out
    }
}

pub fn stat<'a>(
    s: &'a PipelineSnapshot,
    name: &str,
) -> &'a plumber_collector::proto::pipeline_snapshot::OpStats {
    s.stats
        .iter()
        .find(|o| o.name == name)
        .expect("stats for node")
}

/// Asserts |a-b|/b <= tol.
pub fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    let rel = (got - want).abs() / want.abs().max(1e-9);
    // The margin, for `cargo test -- --nocapture`.
    eprintln!(
        "{what}: {got:.0} vs {want:.1} ({:+.2}%)",
        (got - want) / want.abs().max(1e-9) * 100.0
    );
    assert!(
        rel <= tol,
        "{what}: got {got:.1}, workload counted {want:.1} ({:.2}% off, limit {:.1}%)",
        rel * 100.0,
        tol * 100.0
    );
}

/// Every file of `s` read from its open to its close inside the window
/// gave exactly its size, each time; returns how many such reads there
/// were. `who` names the recording in messages.
pub fn assert_whole_reads_exact(s: &PipelineSnapshot, who: &str) -> i64 {
    let mut whole = 0;
    for f in &s.probe_files {
        let real = std::fs::metadata(&f.path).expect("input file").len() as i64;
        eprintln!(
            "{who}: {}: {} complete reads, {} bytes",
            f.path, f.complete_sessions, f.complete_bytes
        );
        assert_eq!(
            f.complete_bytes,
            f.complete_sessions * real,
            "{who}: {}",
            f.path
        );
        whole += f.complete_sessions;
    }
    whole
}
