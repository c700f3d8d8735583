//! plumber-probe: attach to a running training job and find what holds its
//! input pipeline back (TensorFlow's tf.data, PyTorch's DataLoader).

mod bpf;
mod clock;
mod cost;
mod derive;
mod errors;
mod flamegraph_cmd;
mod frames;
mod framework;
mod layout;
mod mem;
mod model;
mod output;
mod progress;
mod pyobjects_cmd;
mod python;
mod record;
mod record_torch;
mod recording;
mod run;
mod sampler;
mod sched;
/// The shared-memory layout of the LD_PRELOAD shim; the shim compiles the
/// same file, so the two cannot drift.
// The reader side uses only part of it (the rest is the writer's).
#[allow(dead_code)]
#[path = "../../shim/src/abi.rs"]
mod shim_abi;
mod sink;
mod sources;
mod stacks_cmd;
mod stop;
mod symbolize;
mod symbols;
mod target;
mod threads;
mod top;
mod torch;
mod usage;
mod xol;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::framework::Framework;
use crate::record::{ModeChoice, RecordOpts};
use crate::usage::Attribution;

/// On-CPU stack samples per second when `--sample-hz` is not given.
const DEFAULT_SAMPLE_HZ: u32 = 49;

#[derive(Parser, Debug)]
#[command(
    name = "plumber-probe",
    version,
    about = "Find what holds a running training job's input pipeline back: TensorFlow's tf.data or PyTorch's DataLoader",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  sudo plumber-probe --pid 4242 --duration 30 --output out/\n  plumber-probe analyze out/stats.pb"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    record: Option<RecordArgs>,
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Attach to a running process and record its tf.data pipeline or
    /// PyTorch DataLoader (the same as the top-level --pid form).
    Record(RecordArgs),
    /// Start a command without root (LD_PRELOAD shim) and record its
    /// tf.data pipeline, or its PyTorch DataLoader, while it runs; exits
    /// with the command's status.
    Run(RunArgs),
    /// A live terminal view of a running pipeline (per-op rates, the
    /// current bottleneck) until `q`: `top --pid PID` attaches as `--pid`
    /// does; `top -- CMD` starts CMD as `run` does. --output writes the
    /// recording's outputs on exit.
    #[command(
        override_usage = "sudo plumber-probe top --pid PID [OPTIONS]\n       plumber-probe top [OPTIONS] -- CMD..."
    )]
    Top(top::TopArgs),
    /// Analyze a stats.pb written by plumber-probe or by Plumber's TensorFlow.
    Analyze(output::AnalyzeArgs),
    /// Rebuild stats.pb and the reports from an events.jsonl saved with
    /// --save-events (no target, no privileges).
    Replay {
        /// events.jsonl of a recording.
        events: PathBuf,
        /// Output directory.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Render saved folded stacks (cpu.folded, offcpu.folded, locks.folded)
    /// as a flamegraph SVG.
    Flamegraph(flamegraph_cmd::FlamegraphArgs),
    /// Sample any process's on-CPU stacks, Python frames included, for a
    /// while and print them folded per thread (no TensorFlow needed).
    Stacks(stacks_cmd::StacksArgs),
    /// Read Python objects of a live process (for tests and by hand).
    #[command(hide = true)]
    PyObjects(pyobjects_cmd::PyObjectsArgs),
    /// Show what plumber-probe derives from a process's TensorFlow build
    /// (libraries, version, object layout, probe points) as JSON, without
    /// attaching anything.
    Inspect {
        /// PID of a process that has TensorFlow loaded.
        #[arg(short, long)]
        pid: i32,
    },
}

#[derive(Args, Debug)]
struct RecordArgs {
    /// PID of the Python process that runs the pipeline (a PyTorch job:
    /// its training process, not a worker).
    #[arg(short, long)]
    pid: i32,
    /// Seconds to record; without it, until Ctrl-C or the target exits.
    #[arg(short, long)]
    duration: Option<f64>,
    /// Output directory (created if needed).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Poll interval, in milliseconds [default: 1000 reading the autotune
    /// model, 250 in the uprobes fallback].
    #[arg(long)]
    interval_ms: Option<u64>,
    /// How to observe the pipeline.
    #[arg(long, value_enum, default_value_t = ModeChoice::Auto)]
    mode: ModeChoice,
    /// Seconds to wait for the pipeline to produce its first element.
    #[arg(long, default_value_t = 60.0)]
    wait: f64,
    /// Also save every observation as JSON lines (events.jsonl), replayable
    /// without the target.
    #[arg(long)]
    save_events: bool,
    /// No progress line.
    #[arg(short, long)]
    quiet: bool,
    /// Attribute CPU to ops continuously (a probe on every op transition,
    /// about a microsecond each) instead of in short windows.
    #[arg(long)]
    precise: bool,
    /// Size of the file-event ring buffer in bytes (a power of two, at
    /// least a page); tiny sizes are for testing that losses are reported.
    #[arg(long, hide = true)]
    io_ringbuf_bytes: Option<u32>,
    /// Stack samples per second of each target thread while on CPU, for
    /// the flamegraphs (cpu.folded, cpu.svg, profile.pb.gz); 0 disables
    /// them. At 49 Hz, the default, a sample costs the target ~7 us
    /// (BENCHMARKS.md). For a PyTorch DataLoader: the stage sampler's reads
    /// of every stack per second (default 25, at most 100).
    #[arg(long)]
    sample_hz: Option<u32>,
    /// The most the recording may cost the target, in % of its CPU time
    /// (measured while recording); past it, attribution windows and stack
    /// sampling stop early (a PyTorch DataLoader's stage sampler reads the
    /// stacks a quarter as often), and the output says so. --precise and
    /// --mode uprobes are reported against it but not thinned.
    #[arg(long, default_value_t = 1.0, value_name = "PCT")]
    max_overhead: f64,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Seconds to record; without it, until the command exits or Ctrl-C.
    #[arg(short, long)]
    duration: Option<f64>,
    /// Output directory (created if needed); default plumber-run-PID.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Poll interval in milliseconds (default 250 reading the autotune
    /// model, 500 for a DataLoader).
    #[arg(long)]
    interval_ms: Option<u64>,
    /// No progress line and no notes on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// The most the recording may cost the command, in % of its CPU time,
    /// as for --pid (the shim's time in its hooks, the probe process's
    /// CPU); past it, a PyTorch DataLoader's stage sampler reads the
    /// stacks a quarter as often, and the output says so.
    #[arg(long, default_value_t = 1.0, value_name = "PCT")]
    max_overhead: f64,
    /// The command, after `--` (e.g. -- python train.py).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<std::ffi::OsString>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "plumber={0},plumber_probe={0},plumber_collector={0},plumber_analyzer={0}",
            cli.log
        ))
    });
    let fmt = tracing_subscriber::fmt().with_env_filter(filter);
    // The live view owns the terminal: its log lines wait until it closes.
    let held = top::HeldLog::default();
    if matches!(cli.command, Some(Command::Top(_))) {
        let h = held.clone();
        fmt.with_writer(move || h.clone()).init();
    } else {
        fmt.with_writer(std::io::stderr).init();
    }
    let result = match (cli.command, cli.record) {
        (Some(Command::Record(r)), _) | (None, Some(r)) => run_record(r),
        (Some(Command::Run(r)), _) => run_run(r),
        (Some(Command::Top(t)), _) => top::run(t, held),
        (Some(Command::Analyze(a)), _) => output::run_analyze(&a),
        (Some(Command::Inspect { pid }), _) => run_inspect(pid),
        (Some(Command::PyObjects(a)), _) => pyobjects_cmd::run(&a),
        (Some(Command::Stacks(a)), _) => stacks_cmd::run(&a),
        (Some(Command::Flamegraph(f)), _) => flamegraph_cmd::run(&f),
        (Some(Command::Replay { events, output }), _) => output::run_replay(&events, &output),
        (None, None) => {
            eprintln!("plumber-probe: nothing to do; try `sudo plumber-probe --pid PID` or `plumber-probe --help`");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes, joined.
            eprintln!("plumber-probe: {}", errors::one_line(&e));
            ExitCode::from(if errors::is_usage_error(&e) { 2 } else { 1 })
        }
    }
}

fn run_record(r: RecordArgs) -> anyhow::Result<ExitCode> {
    if let Some(d) = r.duration {
        if !(d.is_finite() && d > 0.0) {
            return Err(errors::usage(format!(
                "--duration must be a positive number of seconds, not {d}"
            )));
        }
    }
    let opts = RecordOpts {
        pid: r.pid,
        duration: r.duration.map(Duration::from_secs_f64),
        interval: r.interval_ms.map(|ms| Duration::from_millis(ms.max(10))),
        mode: r.mode,
        discovery_timeout: Duration::from_secs_f64(r.wait.max(0.1)),
        quiet: r.quiet,
        save_events: None,
        attribution: if r.precise {
            Attribution::Continuous
        } else {
            Attribution::Sampled
        },
        io_ringbuf_bytes: r.io_ringbuf_bytes,
        sample_hz: r.sample_hz.unwrap_or(DEFAULT_SAMPLE_HZ),
        stage_hz: r.sample_hz.unwrap_or(0),
        tap: None,
        budget: r.max_overhead / 100.0,
    };
    if !(r.max_overhead.is_finite() && r.max_overhead > 0.0) {
        return Err(errors::usage(format!(
            "--max-overhead must be a positive percentage, not {}",
            r.max_overhead
        )));
    }
    if let Some(hz) = r.sample_hz.filter(|&hz| hz > 1000) {
        return Err(errors::usage(format!(
            "--sample-hz must be at most 1000, not {hz}"
        )));
    }
    if let Some(n) = r.io_ringbuf_bytes {
        if !n.is_power_of_two() || n < 4096 {
            return Err(errors::usage(format!(
                "--io-ringbuf-bytes must be a power of two of at least 4096, not {n}"
            )));
        }
    }
    let out = r.output.unwrap_or_else(|| record::default_output(r.pid));
    output::prepare_dir(&out)?;
    let opts = RecordOpts {
        save_events: r.save_events.then(|| out.join("events.jsonl")),
        ..opts
    };
    let rec = record::record(&opts)?;
    output::write_recording(&out, rec)
}

fn run_run(r: RunArgs) -> anyhow::Result<ExitCode> {
    if let Some(d) = r.duration {
        if !(d.is_finite() && d > 0.0) {
            return Err(errors::usage(format!(
                "--duration must be a positive number of seconds, not {d}"
            )));
        }
    }
    if !(r.max_overhead.is_finite() && r.max_overhead > 0.0) {
        return Err(errors::usage(format!(
            "--max-overhead must be a positive percentage, not {}",
            r.max_overhead
        )));
    }
    let output = r
        .output
        .unwrap_or_else(|| PathBuf::from(format!("plumber-run-{}", std::process::id())));
    run::run(&run::RunOpts {
        command: r.command,
        duration: r.duration.map(Duration::from_secs_f64),
        interval: r.interval_ms.map(|ms| Duration::from_millis(ms.max(10))),
        quiet: r.quiet,
        output,
        budget: r.max_overhead / 100.0,
        live: None,
    })
}

fn run_inspect(pid: i32) -> anyhow::Result<ExitCode> {
    let target = match framework::find(pid)? {
        Framework::TensorFlow(t) => t,
        Framework::Torch(_) => {
            return Err(errors::usage(format!(
                "process {pid} runs PyTorch, not TensorFlow: inspect shows what is derived from a TensorFlow build; record the job with --pid {pid}"
            )));
        }
    };
    let (derived, cache_hit) = derive::derive(&target)?;
    let v = serde_json::json!({
        "pid": pid,
        "tensorflow_version": target.tensorflow_version,
        "libraries": target.libraries(),
        "layout_cache_hit": cache_hit,
        "model_readable": derived.node.is_some(),
        "derived": derived,
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(ExitCode::SUCCESS)
}
