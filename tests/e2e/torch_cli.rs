//! The command line on a PyTorch job beyond a recording's figures: a
//! worker's PID refused with the training process named, a saved
//! recording replayed to the same outputs, a job that loaded TensorFlow
//! too, by `--pid` and under `run`.

use crate::harness::{
    check_report_html, python, record_out, require_root, run_probe, tempdir, torch_python, Workload,
};
use crate::shim::{lines as stdout_lines, workload};
use crate::torch::{agrees_with_loop, lines_past, worker_sets, Case, BUDGET};

/// A recording saved with --save-events replays to the same outputs:
/// the stage stacks and spans are saved after the recording's end (the
/// stage sampler finishes after the window), and before they were, a
/// replay lost the Python functions, the hot-spot advice, stages.folded,
/// profile.pb.gz and trace.json.
#[test]
fn a_saved_dataloader_recording_replays_to_the_same_outputs() {
    require_root();
    let w = Case {
        script: "torch_pyxform.py",
        args: &["--num-workers", "2", "--batch-size", "16"],
        seconds: 0.0,
    }
    .start();
    let dir = tempdir("torch-replay-rec");
    let mut extra = BUDGET.to_vec();
    extra.push("--save-events");
    record_out(&w, 4.0, &dir, &extra);
    let again = tempdir("torch-replay");
    let events = dir.join("events.jsonl");
    let o = run_probe(&[
        "replay",
        events.to_str().expect("utf8"),
        "--output",
        again.to_str().expect("utf8"),
    ]);
    assert!(
        o.status.success(),
        "replay: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for f in [
        "stats.pb",
        "report.txt",
        "report.json",
        "dataloader.json",
        "stages.folded",
        "profile.pb.gz",
        "trace.json",
    ] {
        let (a, b) = (std::fs::read(dir.join(f)), std::fs::read(again.join(f)));
        assert!(
            a.is_ok() && b.is_ok(),
            "{f}: missing from the recording or its replay"
        );
        assert!(
            a.ok() == b.ok(),
            "{f} differs between the recording and its replay"
        );
    }
    let d = std::fs::read_to_string(again.join("dataloader.json")).expect("dataloader.json");
    assert!(
        d.contains("py_loop"),
        "no Python function in the replay: {d}"
    );
    // The replay's report.html in headless Chromium: the bottleneck's
    // "stacks" button shows its stage's stacks (their root frame is the
    // stage's, `[collate]`, not the op's model name).
    check_report_html(&again.join("report.html"), &["--filter-finds".as_ref()]);
}

/// A worker's PID (`top` shows the workers busy, the training process
/// waiting) is bad input: one line naming the training process's PID, the
/// forkserver between them skipped, and nothing recorded.
#[test]
fn a_worker_pid_names_the_training_process() {
    require_root();
    let w = Case {
        script: "torch_pyxform.py",
        args: &[
            "--num-workers",
            "2",
            "--start-method",
            "forkserver",
            "--persistent-workers",
        ],
        seconds: 0.0,
    }
    .start();
    let t0 = std::time::Instant::now();
    let worker = loop {
        if let Some(&p) = worker_sets(&w.snapshot_lines())
            .first()
            .and_then(|(_, pids)| pids.first())
        {
            break p;
        }
        assert!(t0.elapsed().as_secs() < 60, "no WORKERS line");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let out = tempdir("worker-pid");
    let o = run_probe(&[
        "--pid",
        &worker.to_string(),
        "--duration",
        "2",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("DataLoader worker") && err.ends_with(&format!("--pid {}", w.pid)),
        "{err}"
    );
    assert!(!out.join("dataloader.json").exists());
}

/// A PyTorch job that loaded TensorFlow too (tensorboard, tf.io, a dataset
/// library) is recorded as the DataLoader job it is. Before, the probe
/// took it for a TensorFlow job and failed after --wait: "no tf.data
/// iterator of process N produced an element".
#[test]
fn a_pytorch_job_that_loaded_tensorflow_records_its_dataloader() {
    require_root();
    let site = tf_site();
    let case = Case {
        script: "torch_and_tf.py",
        args: &[
            "--tf-site",
            &site,
            "--num-workers",
            "2",
            "--batch-size",
            "16",
        ],
        seconds: 4.0,
    };
    let w = case.start();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", w.pid)).expect("maps");
    assert!(
        maps.contains("libtensorflow_framework") && maps.contains("libtorch_python"),
        "the workload did not load both frameworks"
    );
    let c = case.check_running(&w);
    assert!(c.stdout.contains("DataLoader ("), "{}", c.stdout);
}

/// The same job under `run`: TensorFlow is mapped first, and the probe
/// waits for a tf.data iterator or a DataLoader, whichever runs. Before,
/// it waited for a tf.data pipeline until the job ended, then said the
/// job ran neither.
#[test]
fn a_pytorch_job_that_loaded_tensorflow_under_run_records_its_dataloader() {
    require_root();
    let site = tf_site();
    let out = tempdir("run-torch-and-tf");
    let (py, script) = (torch_python(), workload(TORCH_AND_TF.script));
    // The job runs on past the window: its lines then cover it.
    let mut job = vec![
        "--",
        py.to_str().expect("utf-8"),
        &script,
        "--tf-site",
        &site,
        "--seconds",
        "12",
    ];
    job.extend_from_slice(TORCH_AND_TF.args);
    recorded_agrees(&out, &["run"], &job, |o, _| stdout_lines(o));
}

/// The same job attached while it starts: TensorFlow imported, torch not
/// yet, no DataLoader. The probe waits for tf.data's first element, finds
/// the DataLoader meanwhile and records it. Before, it waited out --wait
/// and failed: "no tf.data iterator of process N produced an element".
#[test]
fn a_pytorch_job_that_loaded_tensorflow_attached_while_starting_records_its_dataloader() {
    require_root();
    let site = tf_site();
    let mut job = vec!["--tf-site", &site, "--delay", "3", "--seconds", "30"];
    job.extend_from_slice(TORCH_AND_TF.args);
    let w = Workload::start_until(&[], &torch_python(), TORCH_AND_TF.script, &job, "TF ");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", w.pid)).expect("maps");
    assert!(
        maps.contains("libtensorflow_framework") && !maps.contains("libtorch_python"),
        "the workload had not loaded TensorFlow alone when the probe started"
    );
    let out = tempdir("torch-and-tf-starting");
    let pid = w.pid.to_string();
    recorded_agrees(&out, &["--pid", &pid], &[], |_, t1| lines_past(&w, t1));
}

/// torch_and_tf.py's own options in the two cases that start it
/// themselves, and the 4 s window they record.
const TORCH_AND_TF: Case = Case {
    script: "torch_and_tf.py",
    args: &["--num-workers", "2", "--batch-size", "16"],
    seconds: 4.0,
};

/// Runs the probe with `head`, the case's window and budget and `out`,
/// then `tail`, which must exit 0, and compares the recording with the
/// loop's own counts; `lines`: the job's lines once they cover an
/// instant, given the probe's output.
fn recorded_agrees(
    out: &std::path::Path,
    head: &[&str],
    tail: &[&str],
    lines: impl FnOnce(&std::process::Output, i64) -> Vec<String>,
) {
    let seconds = TORCH_AND_TF.seconds.to_string();
    let window = [
        "--duration",
        &seconds,
        BUDGET[0],
        BUDGET[1],
        "-o",
        out.to_str().expect("utf-8"),
    ];
    let args: Vec<&str> = [head, &window, tail].concat();
    let o = run_probe(&args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    agrees_with_loop(&TORCH_AND_TF, out, &stdout, |t1| lines(&o, t1));
}

/// The TensorFlow venv's site-packages, which torch_and_tf.py imports
/// TensorFlow from (both venvs run the same CPython).
fn tf_site() -> String {
    let o = std::process::Command::new(python())
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .expect("the TensorFlow venv's python");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}
