//! `plumber-probe stacks --pid PID`: the stack sampler alone, on any
//! process (no TensorFlow needed): on-CPU stacks with their Python frames
//! for a while, printed folded (`tid N;outermost;...;leaf count`), and the
//! line on the interpreter. What the tests of Python frames run against
//! pure-Python programs, and a quick look at a process.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cost::Thin;
use crate::python::PyProcess;
use crate::sampler::Sampler;

#[derive(clap::Args, Debug)]
pub struct StacksArgs {
    /// PID of the process to sample.
    #[arg(short, long)]
    pid: i32,
    /// Seconds to sample.
    #[arg(short, long, default_value_t = 3.0)]
    duration: f64,
    /// Samples per second of each thread on CPU.
    #[arg(long, default_value_t = 99)]
    sample_hz: u32,
    /// Read Python frames with deliberately wrong offsets (tests the
    /// validation that must refuse them).
    #[arg(long, hide = true)]
    skew_python_offsets: bool,
    /// Native frames only, as without an interpreter (to measure what the
    /// Python frames cost).
    #[arg(long)]
    no_python: bool,
}

pub fn run(a: &StacksArgs) -> Result<ExitCode> {
    crate::record::check_privileges()?;
    if !(a.duration.is_finite() && a.duration > 0.0) || a.sample_hz == 0 {
        return Err(crate::errors::usage(
            "--duration and --sample-hz must be positive".to_string(),
        ));
    }
    let py = match a.skew_python_offsets {
        false => PyProcess::attach(a.pid),
        true => PyProcess::attach(a.pid)
            .and_then(|p| PyProcess::attach_with(a.pid, Some(crate::python::skewed(p.offsets)))),
    };
    let (py, note) = match py {
        _ if a.no_python => (None, "python: native frames only (--no-python)".to_string()),
        Ok(p) => (Some(p.clone()), p.note()),
        Err(e) => (None, format!("python: native frames only ({e})")),
    };
    // The sampling program's own run time, as the recording's cost meter
    // reads it (the kernel's BPF statistics).
    let stats_on = crate::bpf::stats::enable_run_time_stats().ok();
    let sampler = Sampler::spawn(a.pid, a.sample_hz, Thin::default(), py)?
        .ready()
        .context("starting the stack sampler")?;
    let prog = sampler
        .program_id()
        .and_then(crate::bpf::stats::open_program);
    let run = |p: &Option<std::os::fd::OwnedFd>| {
        p.as_ref()
            .and_then(|fd| crate::bpf::stats::run_stats(std::os::fd::AsFd::as_fd(fd)))
    };
    let before = run(&prog);
    std::thread::sleep(Duration::from_secs_f64(a.duration));
    let after = run(&prog);
    let s = sampler.finish();
    drop(stats_on);
    let mut lines: Vec<String> = s
        .stacks
        .iter()
        .map(|((tid, frames), n)| {
            let mut l = format!("tid {tid}");
            for f in frames {
                l.push(';');
                l.push_str(&f.replace(';', ":"));
            }
            format!("{l} {n}")
        })
        .collect();
    lines.sort();
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}")?;
    }
    eprintln!("{note}");
    if let (Some((n0, t0)), Some((n1, t1))) = (before, after) {
        let samples = s.samples.max(1);
        eprintln!(
            "sampler BPF: {} runs, {} ns in all, {} ns per sample of the target",
            n1 - n0,
            t1 - t0,
            (t1 - t0) / samples
        );
    }
    if let Some(p) = &s.python {
        eprintln!(
            "python: {} of {} samples with Python frames, {} frames unnamed, \
             {} code objects; BPF walk {} ns per sample ({} walks, {:.1} frames each)",
            p.samples,
            s.samples,
            p.unnamed_frames,
            p.code_objects,
            p.ns_per_walk(),
            p.walks,
            p.walk_frames as f64 / p.walks.max(1) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}
