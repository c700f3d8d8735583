//! A PyTorch training process through the one recording loop: the
//! DataLoader source, for `--pid` (record.rs) and for `run`'s own command
//! (run.rs) alike. The stages are read with process_vm_readv and /proc;
//! the job's file reads with one BPF object (bpf/procio.bpf.c), which
//! follows the training process and every process it starts. Without it
//! (no privileges for BPF, as under `run`) the recording goes on and says
//! the reads were not measured. Its cost is the probe process's own CPU
//! and the BPF programs' run time, which the meter counts against the
//! job's CPU across its processes.

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use plumber_collector::event::{Event, StageStack, StageStacks};

use anyhow::{anyhow, Result};
use tracing::{info, warn};

use crate::cost::{CostOpts, Lever, Meter, Pace, Thin};
use crate::python::PyProcess;
use crate::recording::{self, LoopOpts, Recording};
use crate::sink::EventSink;
use crate::sources::dataloader::{DataLoaderSource, FileReads, Job, SAMPLE_HZ};
use crate::target::Target;
use crate::torch::stage::in_worker_loop;
use crate::torch::Torch;
use crate::usage::proc_io::ProcIo;

/// What a recording of a PyTorch job takes of the recording's options
/// (`record::RecordOpts` has the BPF ones besides).
pub struct TorchOpts {
    pub pid: i32,
    pub duration: Option<Duration>,
    pub interval: Option<Duration>,
    /// Who started the job: how long to look for the loader, what its
    /// exit means.
    pub job: Job,
    pub quiet: bool,
    pub save_events: Option<PathBuf>,
    /// The stage sampler's ticks per second; 0: its default.
    pub sample_hz: u32,
    pub tap: Option<Sender<Event>>,
    pub budget: f64,
}

/// What can be told of a PyTorch target before it is recorded, for `top`
/// before it takes the screen: it is no DataLoader worker. An interpreter
/// that cannot be read is left to the recording to report.
pub fn check_target(pid: i32) -> Result<()> {
    match PyProcess::attach(pid) {
        Ok(py) => not_a_worker(pid, &py),
        Err(_) => Ok(()),
    }
}

/// A worker's PID is bad input: the error names the training process.
fn not_a_worker(pid: i32, py: &PyProcess) -> Result<()> {
    if !is_worker(py) {
        return Ok(());
    }
    let fix = match training_process_of(pid) {
        Some(p) => format!("record the training process that started it: --pid {p}"),
        None => "record the training process that started it".into(),
    };
    Err(crate::errors::usage(format!(
        "process {pid} is a PyTorch DataLoader worker, not the training process: {fix}"
    )))
}

/// Whether the process is a DataLoader worker: a thread in
/// `_worker_loop`. A few walks, 5 ms apart: the threads run while they are
/// read, and a walk that meets a frame popped meanwhile stops short.
fn is_worker(py: &PyProcess) -> bool {
    let mut frames = crate::torch::frames::Frames::new(py);
    for i in 0..3 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let Some(stacks) = frames.stacks() else {
            return false;
        };
        if stacks.iter().any(|s| in_worker_loop(&s.frames)) {
            return true;
        }
        if stacks.iter().all(|s| s.complete) {
            return false;
        }
    }
    false
}

/// The training process a DataLoader worker belongs to: its parent, or,
/// for a forkserver worker, its parent's parent (the forkserver is a
/// process of its own, started by the training process).
fn training_process_of(worker: i32) -> Option<i32> {
    let mut p = crate::usage::proc_io::parent_of(worker)?;
    let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
    if String::from_utf8_lossy(&cmdline).contains("multiprocessing.forkserver") {
        p = crate::usage::proc_io::parent_of(p)?;
    }
    (p > 1).then_some(p)
}

/// Records the job's DataLoader; the caller has installed the signal
/// handlers. `None` when the window never opened: `run`'s command ended,
/// or we were stopped, before its loader was found (an attached target
/// fails the recording then).
pub fn record(opts: &TorchOpts, torch: Torch, started: Instant) -> Result<Option<Recording>> {
    let pid = opts.pid;
    let target = Target::other_framework(pid, &torch.lib)?;
    info!(pid, torch = %torch.version, "PyTorch target found");
    let py = PyProcess::attach(pid).map_err(|e| {
        anyhow!(
            "process {pid} runs torch {} but its Python interpreter cannot be read: {e}",
            torch.version
        )
    })?;
    not_a_worker(pid, &py)?;
    let hz = if opts.sample_hz > 0 {
        opts.sample_hz.min(SAMPLE_HZ * 4)
    } else {
        SAMPLE_HZ
    };
    let thin = Thin::default();
    let mut obj = MaybeUninit::uninit();
    let io = match ProcIo::start(&mut obj, pid) {
        Ok(io) => FileReads::Measured(Box::new(io)),
        Err(e) => {
            warn!("the job's file reads are not measured: {e}");
            FileReads::NotMeasured(crate::errors::one_line(&anyhow!(e)))
        }
    };
    let cost = CostOpts {
        budget: opts.budget,
        levers: vec![Lever::StageSampler],
        thin: thin.clone(),
        explicit: None,
        duration: opts.duration,
        pace: Pace::STEADY,
    };
    let meter = match &io {
        FileReads::Measured(io) => Meter::with_programs(io.programs(), cost),
        FileReads::NotMeasured(_) => Meter::without_bpf(cost),
    };
    let mut source = DataLoaderSource::new(target, torch, py, opts.job, hz, thin, io);
    let loop_opts = LoopOpts {
        duration: opts.duration,
        interval: opts.interval,
        quiet: opts.quiet,
        started,
        cost: Some(meter),
    };
    let mut sink = EventSink::new(opts.save_events.as_deref())?.with_tap(opts.tap.clone());
    let ended = recording::run(&mut source, &mut sink, &loop_opts)?;
    let Some(time_to_first_data) = ended.time_to_first_data else {
        return Ok(None);
    };
    let stages = source.stage_recording();
    // Saved for a replay (after End: the sampler has just finished).
    if opts.save_events.is_some() {
        sink.push(Event::StageStacks(Box::new(StageStacks {
            pid: stages.pid,
            hz: stages.hz,
            start_wall_ns: stages.start_wall_ns,
            end_wall_ns: stages.end_wall_ns,
            stacks: stages.stacks.iter().map(StageStack::from_labeled).collect(),
            spans: stages.spans.clone(),
        })))?;
    }
    Ok(Some(Recording {
        sink,
        reason: ended.reason.to_string(),
        mode: "dataloader",
        partial: ended.partial,
        time_to_first_data,
        cache_hit: false,
        stacks: None,
        stages: Some(stages),
    }))
}
