//! Bad input and faults: each gives a one-line error with the fix, or ends
//! the recording cleanly with outputs written.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

fn stderr_line(o: &std::process::Output) -> String {
    let s = String::from_utf8_lossy(&o.stderr).trim().to_string();
    assert_eq!(
        s.lines().count(),
        1,
        "expected one line of error, got:\n{s}"
    );
    s
}

#[test]
fn pid_that_does_not_exist() {
    require_root();
    let out = tempdir("nopid");
    let dir = out.to_str().expect("utf8");
    // Both spellings: the top-level form and `record`.
    for prefix in [&[][..], &["record"][..]] {
        let mut args = prefix.to_vec();
        args.extend(["--pid", "2147480000", "--duration", "1", "--output", dir]);
        let o = run_probe(&args);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr_line(&o).contains("no process with PID 2147480000"));
        assert!(!out.join("stats.pb").exists());
    }
}

#[test]
fn process_without_tensorflow() {
    require_root();
    let mut sleeper = Command::new("sleep").arg("60").spawn().expect("sleep");
    let pid = sleeper.id().to_string();
    let out = tempdir("notf");
    let o = run_probe(&[
        "--pid",
        &pid,
        "--duration",
        "1",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(o.status.code(), Some(2));
    let line = stderr_line(&o);
    assert!(line.contains("has no TensorFlow loaded"), "{line}");
    assert!(!out.join("stats.pb").exists());
}

#[test]
fn not_root_names_the_fix() {
    require_root();
    let mut sleeper = Command::new("sleep").arg("60").spawn().expect("sleep");
    let pid = sleeper.id().to_string();
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(probe_bin())
        .args(["--pid", &pid, "--duration", "1", "--output", "/tmp"])
        .output()
        .expect("setpriv (util-linux)");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(!o.status.success());
    let line = stderr_line(&o);
    assert!(line.contains("sudo"), "{line}");
    assert!(
        line.contains("CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE"),
        "{line}"
    );
}

#[test]
fn target_exits_mid_recording() {
    let w = Workload::start("sequential_map.py", &["--seconds", "6"]);
    let out = tempdir("exits");
    let pid = w.pid.to_string();
    let o = run_probe(&[
        "--pid",
        &pid,
        "--duration",
        "60",
        "--output",
        out.to_str().expect("utf8"),
        "-q",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("PARTIAL"));
    let s = read_snapshot(&out.join("stats.pb"));
    assert!(s.probe_info.as_ref().expect("probe_info").partial);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json"))
            .expect("json");
    assert_eq!(r["window"]["partial"], true);
    assert!(!r["nodes"].as_array().expect("nodes").is_empty());
}

fn spawn_probe(pid: i32, out: &std::path::Path, extra: &[&str]) -> std::process::Child {
    probe_command()
        .args([
            "--pid",
            &pid.to_string(),
            "--output",
            out.to_str().expect("utf8"),
            "-q",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn probe")
}

#[test]
fn ctrl_c_detaches_and_writes() {
    let w = Workload::start("sequential_map.py", &["--seconds", "60"]);
    let out = tempdir("sigint");
    let child = spawn_probe(w.pid, &out, &[]);
    // Recording once the RemoveNode probe is in (after discovery).
    wait_for_program("node_removed");
    std::thread::sleep(Duration::from_secs(3));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT");
    let o = child.wait_with_output().expect("wait");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = read_snapshot(&out.join("stats.pb"));
    // No --duration: Ctrl-C is the normal end, not a partial recording.
    assert!(!s.probe_info.as_ref().expect("probe_info").partial);
    assert!(s.stats.iter().any(|o| o.elements_produced > 0));
    assert!(bpf_programs()
        .iter()
        .all(|p| !OUR_PROGS.contains(&p.as_str())));
}

const OUR_PROGS: [&str; 4] = [
    "discover_getnex",
    "node_removed",
    "getnext_enter",
    "getnext_exit",
];

/// Waits until a BPF program of that name is loaded (the probe attached).
fn wait_for_program(name: &str) {
    let t0 = Instant::now();
    while !bpf_programs().iter().any(|p| p == name) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{name} never loaded"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Names of loaded BPF programs.
fn bpf_programs() -> Vec<String> {
    let o = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool (scripts/setup.sh installs it)");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bpftool json");
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kill_9_leaves_no_probe_attached() {
    let w = Workload::start("sequential_map.py", &["--seconds", "60"]);
    let out = tempdir("kill9");
    // Per-call uprobes are the mode whose leftovers would hurt the target.
    let mut child = spawn_probe(w.pid, &out, &["--duration", "60", "--mode", "uprobes"]);
    wait_for_program("getnext_enter");
    std::thread::sleep(Duration::from_secs(2));
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // The kernel releases programs and uprobes with the last fd.
    let t0 = Instant::now();
    while bpf_programs()
        .iter()
        .any(|p| OUR_PROGS.contains(&p.as_str()))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "BPF programs still loaded after kill -9"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the target keeps running normally.
    let before = w.snapshot_lines().len();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        w.snapshot_lines().len() > before,
        "target stopped producing after the probe was killed"
    );
    assert!(
        !out.join("stats.pb").exists(),
        "a killed recording must not leave a stats.pb"
    );
}

/// A tmpfs of `size` on a fresh directory, unmounted when dropped (also
/// when the test fails).
struct Tmpfs(TestDir);

impl Tmpfs {
    fn mount(tag: &str, size: &str) -> Tmpfs {
        let dir = tempdir(tag);
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&*dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount -t tmpfs on {}: {st}", dir.display());
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&*self.0).status();
    }
}

/// A recording whose outputs do not fit (a 64 KiB file system; the stack
/// samples' SVGs alone are hundreds of kB) says which were not written on
/// its last line and exits 1; stats.pb, written first, stays.
#[test]
fn full_output_file_system_names_what_was_not_written() {
    require_root();
    let w = Workload::start("demo.py", &["--seconds", "60"]);
    let fs = Tmpfs::mount("fulldisk", "64k");
    let out = fs.0.join("out");
    let pid = w.pid.to_string();
    // Stack sampling is on by default.
    let o = run_probe(&[
        "--pid",
        &pid,
        "--duration",
        "3",
        "--output",
        out.to_str().expect("utf8"),
        "-q",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stderr}\n{stdout}");
    assert!(!stdout.contains("wrote "), "said it wrote: {stdout}");
    let last = stderr.lines().last().expect("a last line");
    let failed_prefix = "plumber-probe: not written (No space left on device): ";
    assert!(last.starts_with(failed_prefix), "{last}");
    assert!(last.contains("; written: stats.pb"), "{last}");
    assert!(last.ends_with("or choose another --output"), "{last}");
    let failed = &last[failed_prefix.len()..last.find(';').expect("a ;")];
    assert!(failed.contains("cpu.svg"), "{last}");
    for f in failed.split(", ") {
        assert!(!out.join(f).exists(), "{f} named as not written exists");
    }
    let s = read_snapshot(&out.join("stats.pb"));
    assert!(!s.stats.is_empty());
}
