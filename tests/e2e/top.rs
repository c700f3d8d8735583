//! `plumber-probe top --pid` driven in tmux against the live demo
//! workload, read back with `capture-pane` as a person would see it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{probe_bin, python, repo, tempdir, torch_python, Workload};

/// A detached tmux session running one command; killed when dropped.
struct Tmux {
    name: String,
}

impl Tmux {
    fn start(name: &str, width: u16, height: u16, command: &str) -> Tmux {
        assert!(
            Command::new("tmux").arg("-V").output().is_ok(),
            "tmux missing: run scripts/setup.sh (it installs it)"
        );
        let _ = tmux(&["kill-session", "-t", name]);
        let (w, h) = (width.to_string(), height.to_string());
        let o = tmux(&["new-session", "-d", "-s", name, "-x", &w, "-y", &h, command]);
        assert!(
            o.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Tmux { name: name.into() }
    }

    fn capture(&self) -> String {
        let o = tmux(&["capture-pane", "-p", "-t", &self.name]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        assert!(tmux(&["send-keys", "-t", &self.name, keys])
            .status
            .success());
    }

    /// Waits for a screen that `ok` accepts; panics with the last one.
    fn wait_for(&self, what: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let screen = self.capture();
            if ok(&screen) {
                return screen;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "no {what} within {secs} s; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &self.name]);
    }
}

fn tmux(args: &[&str]) -> std::process::Output {
    Command::new("tmux").args(args).output().expect("run tmux")
}

/// The root rate the view shows (`┌ root 35.1/s | ...`), as text.
fn root_rate(screen: &str) -> Option<String> {
    screen.lines().find_map(|l| {
        let mut words = l.split_whitespace().skip_while(|w| *w != "root");
        words.next()?;
        let rate = words.next()?.strip_suffix("/s")?;
        Some(rate.to_string())
    })
}

/// The row index of an op in the table, by its name.
fn row_of(screen: &str, name: &str) -> Option<usize> {
    screen.lines().position(|l| {
        l.split_whitespace()
            .any(|w| w.trim_start_matches('>') == name)
    })
}

fn wait_status(path: &Path, secs: u64) -> String {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.contains('\n') {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the probe did not exit within {secs} s of q");
}

/// `plumber-probe top ARGS` in a tmux session of `width` x `height` named
/// by `tag`; its exit status goes to `status`, and the session stays open
/// after it, showing what `top` printed on the normal screen.
fn top_in_tmux(tag: &str, (width, height): (u16, u16), args: &str, status: &Path) -> Tmux {
    let command = format!(
        "{} top {args}; echo \"EXIT=$?\" > {}; sleep 600",
        probe_bin().display(),
        status.display()
    );
    let name = format!("plumber-top-{tag}-{}", std::process::id());
    Tmux::start(&name, width, height, &command)
}

/// Quits the view with q; `top` then exits 0.
fn quit(t: &Tmux, status: &Path) {
    t.keys("q");
    let st = wait_status(status, 60);
    assert_eq!(st.trim(), "EXIT=0", "{}", t.capture());
}

#[test]
fn top_live_view_in_tmux() {
    let mut w = Workload::start("demo.py", &["--seconds", "120"]);
    let out = tempdir("top");
    let status = out.join("status");
    let outputs = out.join("out");
    let args = format!("--pid {} --output {}", w.pid, outputs.display());
    let t = top_in_tmux("pid", (120, 40), &args, &status);

    // The op names and a root rate that changes from poll to poll.
    let first = t.wait_for("op rows and a root rate", 90, |s| {
        s.contains("ParallelMapV2") && s.contains("TFRecord") && root_rate(s).is_some()
    });
    assert!(
        first.contains("plumber-probe top") && first.contains("rate/s"),
        "{first}"
    );
    let rate0 = root_rate(&first);
    t.wait_for("a changed root rate", 30, |s| root_rate(s) != rate0);
    let screen = t.wait_for("the bottleneck line", 30, |s| s.contains("bottleneck "));
    assert!(screen.contains("ParallelMapV2"), "{screen}");

    // Pipeline order first (Root above BatchV2), then by name.
    let by_pipeline = t.capture();
    assert!(
        row_of(&by_pipeline, "Root") < row_of(&by_pipeline, "BatchV2"),
        "{by_pipeline}"
    );
    t.keys("n");
    let by_name = t.wait_for("the name order", 10, |s| s.contains("sort: name"));
    assert!(
        row_of(&by_name, "BatchV2") < row_of(&by_name, "Root"),
        "{by_name}"
    );
    assert!(
        row_of(&by_name, "FlatMap") < row_of(&by_name, "TFRecord"),
        "{by_name}"
    );

    // 80 columns: still the header, the columns and the op names.
    assert!(
        tmux(&["resize-window", "-t", &t.name, "-x", "80", "-y", "30"])
            .status
            .success()
    );
    // tmux cuts the old frame at 80 columns by itself: wait for the
    // view's own redraw, whose boxes close at column 80.
    let narrow = t.wait_for("an 80-column frame", 10, |s| {
        s.lines()
            .any(|l| l.chars().count() == 80 && l.ends_with('┐'))
    });
    for want in [
        "plumber-probe top",
        "rate/s",
        "ParallelMapV2",
        "TFRecord",
        "bottleneck",
        "q quit",
    ] {
        assert!(
            narrow.contains(want),
            "{want} missing at 80 columns:\n{narrow}"
        );
    }
    assert!(narrow.lines().all(|l| l.chars().count() <= 80), "{narrow}");

    // The target's exit is reported, and the last frame stays until q.
    w.child.kill().expect("kill the workload");
    let _ = w.child.wait();
    let exited = t.wait_for("the target's exit", 20, |s| {
        s.to_lowercase().contains("target exited")
    });
    assert!(exited.contains("ParallelMapV2"), "{exited}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!status.exists(), "the view closed before q");
    assert!(t.capture().contains("ParallelMapV2"), "last frame not kept");

    quit(&t, &status);
    for f in ["stats.pb", "report.txt", "report.json"] {
        assert!(outputs.join(f).is_file(), "{f} not written");
    }
    // The terminal was given back: the summary is on the normal screen.
    let after = t.capture();
    assert!(after.contains("wrote"), "{after}");
}

/// `top --pid` on a PyTorch job: the DataLoader's stages as the ops, with
/// a live root rate. It once refused every such job before taking the
/// screen ("no TensorFlow loaded ... nor PyTorch"), as its early check
/// knew TensorFlow only.
#[test]
fn top_on_a_pytorch_job_in_tmux() {
    let w = Workload::start_in(
        &[],
        &torch_python(),
        "torch_pyxform.py",
        &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--seconds",
            "120",
        ],
    );
    let out = tempdir("top-torch");
    let status = out.join("status");
    let t = top_in_tmux("torch", (120, 30), &format!("--pid {}", w.pid), &status);
    let screen = t.wait_for("the DataLoader's stages and a root rate", 60, |s| {
        s.contains("mode dataloader")
            && s.contains("GetItem")
            && s.contains("Collate")
            && root_rate(s).is_some()
    });
    assert!(screen.contains("bottleneck"), "{screen}");
    quit(&t, &status);
}

/// `top -- CMD`: the same view for a command started under the shim; its
/// output goes to command.log, its end is reported, q writes the outputs
/// and the exit status is the command's.
#[test]
fn top_command_in_tmux() {
    crate::shim::build_shim();
    let out = tempdir("top-cmd");
    let status = out.join("status");
    let outputs = out.join("out");
    let args = format!(
        "--output {} -- {} {} --seconds 15",
        outputs.display(),
        python().display(),
        repo().join("tests/workloads/demo.py").display(),
    );
    let t = top_in_tmux("cmd", (100, 30), &args, &status);
    t.wait_for("op rows and a root rate", 120, |s| {
        s.contains("ParallelMapV2") && root_rate(s).is_some()
    });
    let ended = t.wait_for("the command's exit", 60, |s| {
        s.to_lowercase().contains("exited")
    });
    assert!(ended.contains("ParallelMapV2"), "{ended}");
    quit(&t, &status);
    assert!(outputs.join("stats.pb").is_file(), "stats.pb not written");
    let log = std::fs::read_to_string(outputs.join("command.log")).expect("command.log");
    assert!(
        log.contains("READY"),
        "the command's output is not in command.log: {log}"
    );
}

/// Closing the terminal (here the tmux session) ends the view and the
/// recording, and leaves the target running: no probe left behind
/// spinning on a hung-up terminal.
#[test]
fn top_ends_when_its_terminal_closes() {
    let w = Workload::start("demo.py", &["--seconds", "120"]);
    let out = tempdir("top-hup");
    let outputs = out.join("out");
    let command = format!(
        "{} top --pid {} --output {}",
        probe_bin().display(),
        w.pid,
        outputs.display()
    );
    let t = Tmux::start(
        &format!("plumber-top-hup-{}", std::process::id()),
        100,
        30,
        &command,
    );
    t.wait_for("op rows", 90, |s| s.contains("ParallelMapV2"));
    let probe = Command::new("pgrep")
        // Anchored: the tmux server's and the shell's command lines hold
        // the same words.
        .args([
            "-f",
            &format!("^{} top --pid {} ", probe_bin().display(), w.pid),
        ])
        .output()
        .expect("pgrep");
    let probe_pid = String::from_utf8_lossy(&probe.stdout).trim().to_string();
    assert!(
        !probe_pid.is_empty() && !probe_pid.contains('\n'),
        "not one probe process: {probe_pid:?}"
    );
    drop(t);
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{probe_pid}")).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the probe ({probe_pid}) still runs 30 s after its terminal closed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        Path::new(&format!("/proc/{}", w.pid)).exists(),
        "the target died with the probe's terminal"
    );
}
