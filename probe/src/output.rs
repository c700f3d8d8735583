//! Writing a recording's outputs, and the `analyze` subcommand.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use plumber_collector::atomic::write_atomic;
use plumber_collector::statsfile;
use tracing::warn;

use crate::errors::usage;
use crate::record::Recording;

pub fn prepare_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(usage(format!(
            "--output {} is a file, not a directory: name a directory (it is created if needed)",
            dir.display()
        )));
    }
    fs::create_dir_all(dir)
        .with_context(|| format!("creating output directory {}", dir.display()))?;
    // Fail now, not after a 30 s recording.
    let probe = dir.join(".plumber-probe-write-test");
    fs::write(&probe, b"")
        .with_context(|| format!("output directory {} is not writable", dir.display()))?;
    let _ = fs::remove_file(probe);
    Ok(())
}

/// The flamegraph outputs of a recording's stack samples (cpu.folded,
/// cpu.svg, ..., profile.pb.gz, trace.json). A failure here loses only
/// these files, so it is reported and the recording's other outputs stand.
fn write_stacks(out: &Path, st: &crate::record::StackRecording) {
    use plumber_analyzer::flamegraph::{write_stack_outputs, StackOutputOptions};
    let mut opts = StackOutputOptions::default();
    opts.pprof.time_nanos = st.start_wall_ns as i64;
    opts.pprof.duration_nanos = st.end_wall_ns.saturating_sub(st.start_wall_ns) as i64;
    opts.pprof.comments = vec![format!(
        "plumber-probe: pid {}, on-CPU stacks at {} Hz, {:.1}% complete",
        st.pid, st.hz, st.complete_pct
    )];
    opts.trace.pid = st.pid as u32;
    if let Err(e) = write_stack_outputs(out, &st.agg, &st.spans, &opts) {
        warn!("flamegraph outputs not written: {e}");
    }
    println!(
        "stacks: {} samples, {:.1}% complete (reaching a thread entry point)",
        st.samples, st.complete_pct
    );
}

pub fn write_recording(out: &Path, rec: Recording) -> Result<ExitCode> {
    let (mode, ttfd, cache_hit, partial, reason) = (
        rec.mode,
        rec.time_to_first_data,
        rec.cache_hit,
        rec.partial,
        rec.reason.clone(),
    );
    let stacks = rec.stacks;
    let collected = rec.sink.finish()?;
    write_collected(out, &collected)?;
    if let Some(st) = &stacks {
        write_stacks(out, st);
    }
    println!(
        "mode: {} | window {:.1} s | time to first data {:.2} s{}",
        mode,
        collected.window.duration_ns() as f64 / 1e9,
        ttfd,
        if cache_hit { " (layout cache hit)" } else { "" }
    );
    if partial {
        println!(
            "PARTIAL: the recording ended early ({reason}); the window covers what was observed"
        );
    }
    println!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// `replay`: a saved events.jsonl through the collector and the analyzer,
/// with no target and no privileges.
pub fn run_replay(events: &Path, out: &Path) -> Result<ExitCode> {
    let evs =
        plumber_collector::eventfile::read_events(events).map_err(|e| usage(e.to_string()))?;
    let collected =
        plumber_collector::collect(evs).map_err(|e| usage(format!("{}: {e}", events.display())))?;
    prepare_dir(out)?;
    write_collected(out, &collected)?;
    println!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// stats.pb, the analysis outputs (or the measured report.json when the
/// analysis is not possible), the table, the report text and any drops.
pub(crate) fn write_collected(out: &Path, collected: &plumber_collector::Collected) -> Result<()> {
    statsfile::write_stats(out.join("stats.pb"), &collected.snapshot)?;
    // The analysis runs on what stats.pb holds, exactly as `analyze` would.
    let analysis = plumber_analyzer::analyze(
        &collected.snapshot,
        &plumber_analyzer::MachineOverrides::default(),
    );
    let text = match &analysis {
        Ok(a) => {
            plumber_analyzer::write_outputs(out, a)?;
            Some(plumber_analyzer::render_text(a.report_ref()))
        }
        Err(e) => {
            // Still a useful recording: keep the measured report.
            warn!("no analysis of this recording: {e}");
            let report = collected.report();
            write_atomic(
                &out.join("report.json"),
                serde_json::to_string_pretty(&report)?.as_bytes(),
            )?;
            // The analysis text says it otherwise.
            Some(plumber_collector::report::not_measured_note(
                &report.not_measured,
            ))
            .filter(|n| !n.is_empty())
        }
    };
    println!("{}", collected.table());
    if let Some(t) = text {
        println!("{t}");
    }
    let dropped: Vec<String> = collected
        .snapshot
        .probe_drops
        .iter()
        .filter(|d| d.count > 0)
        .map(|d| format!("{}={}", d.what, d.count))
        .collect();
    if !dropped.is_empty() {
        println!("dropped: {}", dropped.join(", "));
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// stats.pb written by plumber-probe or Plumber's TensorFlow.
    pub stats: PathBuf,
    /// Cores available to the pipeline (default: from the file).
    #[arg(long)]
    pub cores: Option<f64>,
    /// Memory budget, e.g. 64G, 512M or bytes (default: from the file).
    #[arg(long)]
    pub memory: Option<String>,
    /// Disk bandwidth in bytes per second.
    #[arg(long)]
    pub disk_bandwidth: Option<f64>,
    /// Print report.json instead of the text report.
    #[arg(long)]
    pub json: bool,
    /// Also write report.txt, report.json, pipeline.dot and pipeline.svg here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run_analyze(a: &AnalyzeArgs) -> Result<ExitCode> {
    let snapshot = plumber_analyzer::load_file(&a.stats)?;
    let memory_bytes = match &a.memory {
        Some(m) => Some(plumber_analyzer::parse_size(m)?),
        None => None,
    };
    let overrides = plumber_analyzer::MachineOverrides {
        cores: a.cores,
        memory_bytes,
        disk_bandwidth: a.disk_bandwidth,
    };
    let analysis = plumber_analyzer::analyze(&snapshot, &overrides)?;
    // A bad --output fails before anything is printed.
    if let Some(dir) = &a.output {
        prepare_dir(dir)?;
    }
    if a.json {
        println!("{}", plumber_analyzer::render_json(&analysis)?);
    } else {
        println!("{}", plumber_analyzer::render_text(analysis.report_ref()));
    }
    if let Some(dir) = &a.output {
        plumber_analyzer::write_outputs(dir, &analysis)?;
    }
    Ok(ExitCode::SUCCESS)
}
