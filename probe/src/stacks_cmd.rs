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
        Ok(p) => (Some(p.clone()), p.note()),
        Err(e) => (None, format!("python: native frames only ({e})")),
    };
    let sampler = Sampler::spawn(a.pid, a.sample_hz, Thin::default(), py)?
        .ready()
        .context("starting the stack sampler")?;
    std::thread::sleep(Duration::from_secs_f64(a.duration));
    let s = sampler.finish();
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
    if let Some(p) = &s.python {
        eprintln!(
            "python: {} of {} samples with Python frames, {} frames unnamed",
            p.samples, s.samples, p.unnamed_frames
        );
    }
    Ok(ExitCode::SUCCESS)
}
