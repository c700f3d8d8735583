//! `plumber-probe --pid PID`: attach to a running process, record its
//! pipeline through the one recording loop (reading the autotune model, or
//! per-call uprobes when it cannot be read), and sample its stacks beside.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use plumber_collector::event::{DropCount, Event};
use tracing::{info, warn};

use crate::bpf::Bpf;
use crate::cost::{CostOpts, Lever, Meter, Pace, Thin};
use crate::derive;
use crate::framework::{self, Framework};
use crate::mem::Memory;
use crate::recording::{
    self, LoopOpts, NoModel, OtherPipeline, Recording, StackRecording, NO_MODEL,
};
use crate::sampler::{self, Sampler, StackContext};
use crate::sink::EventSink;
use crate::sources::attached::Attached;
use crate::sources::model::ModelSource;
use crate::sources::uprobes::UprobesSource;
use crate::stop;
use crate::usage::Attribution;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeChoice {
    /// The autotune model when it can be read, else uprobes.
    Auto,
    /// Only the autotune model (fail if it cannot be read).
    Model,
    /// Per-call uprobes on GetNext (microseconds per call on the target).
    Uprobes,
}

#[derive(Debug, Clone)]
pub struct RecordOpts {
    pub pid: i32,
    pub duration: Option<Duration>,
    /// Poll interval; None: `MODEL_INTERVAL` reading the model,
    /// `UPROBES_INTERVAL` in the uprobes fallback.
    pub interval: Option<Duration>,
    pub mode: ModeChoice,
    /// How long to wait for the pipeline to produce its first element.
    pub discovery_timeout: Duration,
    pub quiet: bool,
    /// Also write every observation here (JSON lines).
    pub save_events: Option<PathBuf>,
    pub attribution: Attribution,
    pub io_ringbuf_bytes: Option<u32>,
    /// Stack samples per second of each target thread on CPU; 0: none.
    pub sample_hz: u32,
    /// The DataLoader stage sampler's ticks per second; 0: its default
    /// (`sources::dataloader::SAMPLE_HZ`).
    pub stage_hz: u32,
    /// A copy of every event goes here as it is recorded (`top`).
    pub tap: Option<Sender<Event>>,
    /// The share of the target's CPU the recording may cost (0.01 = 1%).
    pub budget: f64,
}

/// Root, BPF and ptrace permissions, checked before any work so the user
/// gets the fix, not an errno from deep inside.
pub fn check_privileges() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_PTRACE: u64 = 19;
    const CAP_PERFMON: u64 = 38;
    const CAP_BPF: u64 = 39;
    let missing: Vec<&str> = [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    ]
    .iter()
    .filter(|(bit, _)| cap_eff & (1 << bit) == 0)
    .map(|(_, n)| *n)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    bail!(
        "plumber-probe needs root to attach to another process: run it with sudo, or grant {} (e.g. sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(which plumber-probe)); without privileges use `plumber-probe run -- python train.py`",
        missing.join(" + ")
    )
}

/// Records the process's PyTorch DataLoader (`record_torch`).
fn record_dataloader(
    opts: &RecordOpts,
    torch: crate::torch::Torch,
    started: Instant,
) -> Result<Recording> {
    // tf.data's ways of recording: a DataLoader is read from outside,
    // its counts as they are, with no per-call probe to ask for.
    let asked = match (opts.mode, opts.attribution) {
        (ModeChoice::Uprobes, _) => Some("--mode uprobes"),
        (ModeChoice::Model, _) => Some("--mode model"),
        (_, Attribution::Continuous) => Some("--precise"),
        _ => None,
    };
    if let Some(what) = asked {
        warn!("{what} is for tf.data pipelines: a PyTorch DataLoader is recorded from its own counts, with no probe in its calls, whatever the mode");
    }
    stop::install_signal_handlers(stop::on_signal)?;
    crate::record_torch::record(&torch_opts(opts), torch, started)?
        .ok_or_else(|| anyhow!("the recording ended before the DataLoader was found"))
}

pub fn record(opts: &RecordOpts) -> Result<Recording> {
    let started = Instant::now();
    check_privileges()?;
    crate::sched::batch_scheduling();
    let target = match framework::find(opts.pid)? {
        Framework::Torch(torch) => return record_dataloader(opts, torch, started),
        // A PyTorch job may load TensorFlow too (tensorboard, tf.io, a
        // dataset library): the DataLoader it holds is its pipeline.
        Framework::TensorFlow(t) => {
            match crate::torch::with_a_dataloader(opts.pid) {
                Some(torch) => {
                    info!(pid = opts.pid, "TensorFlow and PyTorch loaded, a DataLoader held: recording the DataLoader");
                    return record_dataloader(opts, torch, started);
                }
                None => t,
            }
        }
    };
    record_tf_data(opts, &target, started)
}

/// A TensorFlow job's tf.data pipeline; or its DataLoader, when it holds
/// one before a tf.data iterator runs.
fn record_tf_data(
    opts: &RecordOpts,
    target: &crate::target::Target,
    started: Instant,
) -> Result<Recording> {
    stop::install_signal_handlers(stop::on_signal)?;
    info!(pid = opts.pid, tf = %target.tensorflow_version, "target found");
    // The sampler gets ready (loads its program, maps the libraries for
    // unwinding, reads the kernel's symbols) while the layout is derived
    // and the BPF programs load.
    let thin = Thin::default();
    let (sampler, py_config, python_note) = spawn_sampler(opts, &thin);
    let (derived, cache_hit) = derive::derive(target)?;
    let use_model = reads_the_model(opts, &derived)?;
    let layout = derived.node.unwrap_or_default();
    let mut obj = MaybeUninit::uninit();
    let bpf = Bpf::load(
        &mut obj,
        opts.pid,
        &layout,
        opts.io_ringbuf_bytes,
        opts.sample_hz > 0,
        py_config.as_ref(),
    )?;
    // Sampling is an extra: a recording without it still has everything
    // else, so a failure to start is reported, not fatal.
    let (sampler, sampler_failed) = match sampler.map(|s| s.and_then(Sampler::ready)) {
        None => (None, false),
        Some(Ok(s)) => (Some(s), false),
        Some(Err(e)) => {
            warn!("stack sampling disabled: {e}");
            (None, true)
        }
    };
    // A job that loaded TensorFlow may yet run a DataLoader instead (a
    // PyTorch job that imported tensorboard or tf.io, still starting):
    // looked for while the discovery waits for tf.data's first element.
    let watch = crate::torch::dataloader_watch(opts.pid);
    let other = RefCell::new(None);
    let gives_way = || {
        let found = watch();
        let held = found.is_some();
        *other.borrow_mut() = found;
        held
    };
    let at = Attached {
        gives_way: Some(&gives_way),
        target,
        derived: &derived,
        bpf: &bpf,
        mem: Memory::new(opts.pid),
        attribution: opts.attribution,
        duration: opts.duration,
        wait_stacks: sampler.as_ref().map(Sampler::wait_sender),
        thin: thin.clone(),
    };
    let cost = cost_opts(opts, use_model, sampler.is_some(), thin);
    let loop_opts = LoopOpts {
        duration: opts.duration,
        interval: opts.interval,
        quiet: opts.quiet,
        started,
        cost: Some(Meter::attach(
            &bpf,
            sampler.as_ref().and_then(Sampler::program_id),
            cost,
        )),
    };
    let mut sink = EventSink::new(opts.save_events.as_deref())?.with_tap(opts.tap.clone());
    let recorded = if use_model {
        match record_model(&at, &layout, opts, &mut sink, &loop_opts) {
            Err(e) if opts.mode == ModeChoice::Auto && e.is::<NoModel>() => {
                warn!("{NO_MODEL}: falling back to GetNext uprobes");
                sink = EventSink::new(opts.save_events.as_deref())?.with_tap(opts.tap.clone());
                record_uprobes(&at, opts, &mut sink, &loop_opts)
            }
            other => other,
        }
    } else {
        record_uprobes(&at, opts, &mut sink, &loop_opts)
    };
    // The DataLoader came first: TensorFlow's side is released before it
    // is recorded.
    if let (Err(e), Some(torch)) = (&recorded, other.take()) {
        if e.is::<OtherPipeline>() {
            info!(
                pid = opts.pid,
                "a DataLoader held while no tf.data pipeline ran: recording the DataLoader"
            );
            drop((at, loop_opts, sink, sampler));
            drop(bpf);
            return record_dataloader(opts, torch, started);
        }
    }
    // The BPF links and programs are released when `bpf` drops, on success
    // and on error alike. On error nothing is written: a recording that
    // failed is not presented as a result.
    let (mode, ended, mut stack_context) = recorded?;
    if sampler_failed {
        sink.push(Event::Drops {
            drops: vec![DropCount::new("stack_sampling_unavailable", 1)],
        })?;
    }
    let stacks = match sampler {
        Some(s) => Some(finish_sampler(
            s,
            opts,
            &mut sink,
            &mut stack_context,
            python_note,
        )?),
        None => None,
    };
    Ok(Recording {
        sink,
        reason: ended.reason.to_string(),
        mode,
        partial: ended.partial,
        time_to_first_data: ended.time_to_first_data.unwrap_or(0.0),
        cache_hit,
        stacks,
        stages: None,
    })
}

fn torch_opts(o: &RecordOpts) -> crate::record_torch::TorchOpts {
    crate::record_torch::TorchOpts {
        pid: o.pid,
        duration: o.duration,
        interval: o.interval,
        job: crate::sources::dataloader::Job::Attached {
            discovery_timeout: o.discovery_timeout,
        },
        quiet: o.quiet,
        save_events: o.save_events.clone(),
        sample_hz: o.stage_hz,
        tap: o.tap.clone(),
        budget: o.budget,
    }
}

/// Whether the recording reads the autotune model (else per-call
/// uprobes), as asked and as the build allows.
fn reads_the_model(opts: &RecordOpts, derived: &derive::Derived) -> Result<bool> {
    Ok(match (opts.mode, &derived.node) {
        (ModeChoice::Uprobes, _) => false,
        (_, Some(_)) => true,
        (ModeChoice::Model, None) => bail!(
            "cannot read TensorFlow's autotune model in this build: {}; retry with --mode uprobes",
            derived.model_error.as_deref().unwrap_or("unknown reason")
        ),
        (ModeChoice::Auto, None) => {
            warn!(
                "autotune model layout not derivable ({}); falling back to GetNext uprobes",
                derived.model_error.as_deref().unwrap_or("unknown")
            );
            false
        }
    })
}

/// What the cost meter may thin: the attribution windows and stack
/// sampling. Nothing when the user asked for more (--precise, --mode
/// uprobes): their cost is reported and warned about, and the recording
/// keeps what they asked for. The per-call probes of the uprobes fallback
/// are never thinned either (without them it has no data).
fn cost_opts(opts: &RecordOpts, use_model: bool, sampling: bool, thin: Thin) -> CostOpts {
    let precise = opts.attribution == Attribution::Continuous;
    let asked = precise || opts.mode == ModeChoice::Uprobes;
    let explicit = match (precise, use_model) {
        (true, _) => Some("--precise"),
        (false, false) if asked => Some("--mode uprobes"),
        (false, false) => Some("the uprobes fallback"),
        (false, true) => None,
    };
    let mut levers = Vec::new();
    if !asked {
        levers.push(Lever::Windows);
        if sampling {
            levers.push(Lever::Sampling);
        }
    }
    CostOpts {
        budget: opts.budget,
        levers,
        thin,
        explicit,
        duration: opts.duration,
        pace: Pace::AFTER_START_UP,
    }
}

type Recorded = (&'static str, recording::Ended, StackContext);

fn record_model(
    at: &Attached<'_, '_>,
    layout: &crate::layout::NodeLayout,
    opts: &RecordOpts,
    sink: &mut EventSink,
    loop_opts: &LoopOpts,
) -> Result<Recorded> {
    let mut source = ModelSource::start(at, layout, opts.discovery_timeout)?;
    let ended = recording::run(&mut source, sink, loop_opts)?;
    Ok(("model", ended, std::mem::take(&mut source.stack_context)))
}

fn record_uprobes(
    at: &Attached<'_, '_>,
    opts: &RecordOpts,
    sink: &mut EventSink,
    loop_opts: &LoopOpts,
) -> Result<Recorded> {
    let mut source = UprobesSource::start(at, opts.discovery_timeout)?;
    let ended = recording::run(&mut source, sink, loop_opts)?;
    Ok(("uprobes", ended, std::mem::take(&mut source.stack_context)))
}

/// Stops the sampler and attributes its stacks to threads and ops.
fn finish_sampler(
    s: Sampler,
    opts: &RecordOpts,
    sink: &mut EventSink,
    ctx: &mut StackContext,
    python_note: String,
) -> Result<StackRecording> {
    let sampled = s.finish();
    let python = match &sampled.python {
        Some(p) => {
            sink.push(Event::Drops {
                drops: vec![
                    DropCount::new("python_walk_truncated", p.truncated),
                    DropCount::new("python_frame_read_failed", p.read_failed),
                    DropCount::new("python_frames_unnamed", p.unnamed_frames),
                ],
            })?;
            format!(
                "{}: {} of {} samples, {} ns each in the target",
                p.note,
                p.samples,
                sampled.samples + sampled.wait_samples,
                p.ns_per_walk()
            )
        }
        None => python_note,
    };
    sink.push(Event::Drops {
        drops: sampled.drops.clone(),
    })?;
    let agg = sampler::attribute(&sampled, ctx);
    info!(
        samples = sampled.samples,
        complete = sampled.complete,
        out_of_stack = sampled.out_of_stack,
        unwind_failed = sampled.unwind_failed,
        in_kernel = sampled.in_kernel,
        wait_samples = sampled.wait_samples,
        wait_complete = sampled.wait_complete,
        symbol_lookups = sampled.symbol_lookups,
        worker_cpu_ms = sampled.worker_cpu_ns / 1_000_000,
        unwind_ms = sampled.unwind_ns / 1_000_000,
        symbolize_ms = sampled.symbolize_ns / 1_000_000,
        stacks = agg.len(),
        "stack samples"
    );
    Ok(StackRecording {
        agg,
        spans: std::mem::take(&mut ctx.spans),
        samples: sampled.samples,
        complete_pct: sampled.complete_pct(),
        pid: opts.pid,
        hz: opts.sample_hz,
        start_wall_ns: sampled.start_wall_ns,
        end_wall_ns: sampled.end_wall_ns,
        python,
    })
}

/// The sampler (when sampling), with the target's interpreter for its
/// Python frames: the configuration the probe object's wait stacks need
/// too, and the line on it.
type Spawned = (
    Option<Result<Sampler, sampler::SamplerError>>,
    Option<crate::python::PyConfig>,
    String,
);

fn spawn_sampler(opts: &RecordOpts, thin: &Thin) -> Spawned {
    if opts.sample_hz == 0 {
        return (None, None, String::new());
    }
    let mut note = String::new();
    let py = attach_python(opts.pid, &mut note);
    let config = py.as_ref().map(|p| p.config);
    let s = Sampler::spawn(opts.pid, opts.sample_hz, thin.clone(), py);
    (Some(s), config, note)
}

/// The target's interpreter for Python frames in stacks; None, with the
/// one-line note that says why, when it cannot be read safely (the
/// stacks are then native only, as without it).
fn attach_python(pid: i32, note: &mut String) -> Option<crate::python::PyProcess> {
    match crate::python::PyProcess::attach(pid) {
        Ok(py) => {
            info!("{}", py.note());
            Some(py)
        }
        Err(e) => {
            *note = format!("python: native frames only ({e})");
            warn!("{note}");
            None
        }
    }
}

/// Where outputs go.
pub fn default_output(pid: i32) -> PathBuf {
    PathBuf::from(format!("plumber-{pid}"))
}
