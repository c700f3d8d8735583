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
use crate::recording::Recording;

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

/// The files a command writes into its output directory: each one is
/// tried (atomically) even after another failed, so that what can be
/// written is, and [`Outputs::finish`] names what was not.
pub struct Outputs<'a> {
    dir: &'a Path,
    written: Vec<String>,
    /// File name and why it was not written.
    failed: Vec<(String, String)>,
    /// A failure was the file system being full (or a quota reached).
    full: bool,
}

impl<'a> Outputs<'a> {
    pub fn new(dir: &'a Path) -> Self {
        Outputs {
            dir,
            written: Vec::new(),
            failed: Vec::new(),
            full: false,
        }
    }

    /// Writes `name` in the directory; a failure is kept for
    /// [`Outputs::finish`].
    pub fn write(&mut self, name: &str, bytes: &[u8]) {
        match write_atomic(&self.dir.join(name), bytes) {
            Ok(()) => self.written.push(name.to_string()),
            Err(e) => {
                let os = e.source.raw_os_error();
                self.full |= os == Some(libc::ENOSPC) || os == Some(libc::EDQUOT);
                // "No space left on device", less " (os error 28)".
                let why = e.source.to_string();
                let why = why.split(" (os error").next().unwrap_or(&why).to_string();
                self.not_written(name, why);
            }
        }
    }

    /// `name` could not be made (`why`), so it is not written.
    pub fn not_written(&mut self, name: &str, why: String) {
        tracing::debug!(file = name, why = %why, "not written");
        self.failed.push((name.to_string(), why));
    }

    /// Ok when every output was written, else the error that names them.
    pub fn finish(self) -> Result<(), NotWritten> {
        if self.failed.is_empty() {
            return Ok(());
        }
        Err(NotWritten {
            dir: self.dir.to_path_buf(),
            written: self.written,
            failed: self.failed,
            full: self.full,
        })
    }
}

/// Some outputs were not written: which, why, which were, and the fix; one
/// line, e.g. `not written (No space left on device): cpu.svg, io.svg;
/// written: stats.pb, report.json; free space on the file system of out/
/// or choose another --output`.
#[derive(Debug, thiserror::Error)]
pub struct NotWritten {
    pub dir: PathBuf,
    pub written: Vec<String>,
    pub failed: Vec<(String, String)>,
    pub full: bool,
}

impl std::fmt::Display for NotWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // One group per reason, in the order the failures came.
        let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
        for (name, why) in &self.failed {
            match groups.iter_mut().find(|(w, _)| w == why) {
                Some((_, names)) => names.push(name),
                None => groups.push((why, vec![name])),
            }
        }
        for (why, names) in groups {
            write!(f, "not written ({why}): {}; ", names.join(", "))?;
        }
        if self.written.is_empty() {
            write!(f, "nothing written; ")?;
        } else {
            write!(f, "written: {}; ", self.written.join(", "))?;
        }
        let dir = self.dir.display();
        if self.full {
            write!(
                f,
                "free space on the file system of {dir} or choose another --output"
            )
        } else {
            write!(f, "check that {dir} is writable or choose another --output")
        }
    }
}

/// The flamegraph outputs of a recording's stack samples (cpu.folded,
/// cpu.svg, ..., profile.pb.gz, trace.json), after the others.
fn write_stacks(
    files: &mut Outputs,
    st: &crate::recording::StackRecording,
) -> Vec<(String, String)> {
    use plumber_analyzer::flamegraph::{render_stack_outputs, StackOutputOptions};
    let mut opts = StackOutputOptions::default();
    opts.pprof.time_nanos = st.start_wall_ns as i64;
    opts.pprof.duration_nanos = st.end_wall_ns.saturating_sub(st.start_wall_ns) as i64;
    opts.pprof.comments = vec![format!(
        "plumber-probe: pid {}, on-CPU stacks at {} Hz, {:.1}% complete",
        st.pid, st.hz, st.complete_pct
    )];
    opts.trace.pid = st.pid as u32;
    let flamegraphs = write_rendered(files, render_stack_outputs(&st.agg, &st.spans, &opts));
    println!(
        "stacks: {} samples, {:.1}% complete (reaching a thread entry point)",
        st.samples, st.complete_pct
    );
    if !st.python.is_empty() {
        println!("{}", st.python);
    }
    flamegraphs
}

/// A DataLoader recording's stage outputs: stages.folded and stages.svg
/// (where the training loop's and the workers' wall time went, by stage,
/// process and Python function), profile.pb.gz (the same stacks, wall
/// time) and trace.json (a track per thread, a process per worker); the
/// flamegraph, for report.html.
fn write_stage_outputs(
    files: &mut Outputs,
    st: &crate::recording::StageRecording,
) -> Vec<(String, String)> {
    use plumber_analyzer::flamegraph::{
        render_labeled_outputs, FlameOptions, LabeledOutputOptions,
    };
    let mut opts = LabeledOutputOptions {
        name: "stages".into(),
        sample_type: ("wall".into(), "nanoseconds".into()),
        flame: FlameOptions {
            title: "DataLoader stages (wall time)".into(),
            subtitle: Some(
                "the training loop and each worker, by stage and Python function".into(),
            ),
            count_name: "ns".into(),
            colors_by_op: true,
            highlight_gil: false,
        },
        stack: Default::default(),
    };
    opts.stack.pprof.time_nanos = st.start_wall_ns as i64;
    opts.stack.pprof.duration_nanos = st.end_wall_ns.saturating_sub(st.start_wall_ns) as i64;
    opts.stack.pprof.comments = vec![format!(
        "plumber-probe: pid {}, DataLoader stage stacks (Python) at {} Hz, wall time; idle workers left out",
        st.pid, st.hz
    )];
    opts.stack.trace.pid = st.pid as u32;
    opts.stack.trace.category = "dataloader".into();
    opts.stack.trace.path_arg = "function".into();
    write_rendered(files, render_labeled_outputs(&st.stacks, &st.spans, &opts))
}

/// Writes rendered stack outputs (or says why one was not); returns the
/// flamegraphs, `(kind, SVG)`, which report.html shows too.
fn write_rendered(
    files: &mut Outputs,
    rendered: plumber_analyzer::flamegraph::StackOutputs,
) -> Vec<(String, String)> {
    let mut flamegraphs = Vec::new();
    for f in rendered.files {
        match f.contents {
            Ok(bytes) => {
                files.write(&f.name, &bytes);
                if let Some(kind) = f.name.strip_suffix(".svg") {
                    flamegraphs.push((
                        kind.to_string(),
                        String::from_utf8_lossy(&bytes).into_owned(),
                    ));
                }
            }
            Err(e) => files.not_written(&f.name, e.to_string()),
        }
    }
    flamegraphs
}

/// report.html: the analysis, the flamegraphs and the timeline on one
/// self-contained page. Without an analysis there is no verdict to show,
/// and no page.
fn write_html(
    files: &mut Outputs,
    analysis: Option<&plumber_analyzer::Analysis>,
    flamegraphs: &[(String, String)],
    spans: &[plumber_collector::stacks::Span],
    recording: &[(String, String)],
) {
    let Some(a) = analysis else {
        return;
    };
    let flames: Vec<(&str, &str)> = flamegraphs
        .iter()
        .map(|(k, svg)| (k.as_str(), svg.as_str()))
        .collect();
    let html = plumber_analyzer::render_html(&plumber_analyzer::HtmlInput {
        report: a.report_ref(),
        flamegraphs: &flames,
        spans,
        recording,
    });
    files.write("report.html", html.as_bytes());
}

/// Writes a recording's outputs (stats.pb first) and prints its summary;
/// the last line says where they went, or which were not written (then
/// the result is that error, exit status 1, and what was written stays).
pub fn write_recording(out: &Path, rec: Recording) -> Result<ExitCode> {
    let (mode, ttfd, cache_hit, partial, reason) = (
        rec.mode,
        rec.time_to_first_data,
        rec.cache_hit,
        rec.partial,
        rec.reason.clone(),
    );
    let stacks = rec.stacks;
    let mut collected = rec.sink.finish()?;
    if let Some(st) = &rec.stages {
        collected.set_stage_stacks(&st.stacks);
    }
    let mut files = Outputs::new(out);
    let analysis = write_collected_to(&mut files, &collected)?;
    let mut flamegraphs = match &stacks {
        Some(st) => write_stacks(&mut files, st),
        None => Vec::new(),
    };
    if let Some(st) = &rec.stages {
        flamegraphs.extend(write_stage_outputs(&mut files, st));
    }
    let spans = match (&stacks, &rec.stages) {
        (Some(st), _) => &st.spans[..],
        (None, Some(st)) => &st.spans[..],
        (None, None) => &[][..],
    };
    // The last line of the summary, and a fact of report.html.
    let cost_line = plumber_collector::report::measured(&collected.snapshot)
        .probe_overhead
        .map(|c| c.line())
        .unwrap_or_else(|| "probe cost: not measured (no two polls in the window)".to_string());
    let facts = vec![
        (
            "probe cost".to_string(),
            cost_line
                .strip_prefix("probe cost: ")
                .unwrap_or(&cost_line)
                .to_string(),
        ),
        ("time to first data".to_string(), format!("{ttfd:.2} s")),
        (
            "layout".to_string(),
            if cache_hit {
                "from the cache"
            } else {
                "derived at attach"
            }
            .to_string(),
        ),
    ];
    write_html(&mut files, analysis.as_ref(), &flamegraphs, spans, &facts);
    println!(
        "mode: {} | window {:.1} s | time to first data {:.2} s{}",
        mode,
        collected.window.duration_ns() as f64 / 1e9,
        ttfd,
        if cache_hit { " (layout cache hit)" } else { "" }
    );
    println!("{cost_line}");
    if partial {
        println!(
            "PARTIAL: the recording ended early ({reason}); the window covers what was observed"
        );
    }
    files.finish()?;
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
    let mut files = Outputs::new(out);
    let analysis = write_collected_to(&mut files, &collected)?;
    // A DataLoader recording's stage stacks and spans, where they were
    // saved: its stage flamegraph, profile and trace.
    let stages = collected.stages.as_ref();
    let flamegraphs = match stages {
        Some(s) => write_stage_outputs(
            &mut files,
            &crate::recording::StageRecording {
                stacks: s.stacks.iter().map(|k| k.labeled()).collect(),
                spans: s.spans.clone(),
                pid: s.pid,
                hz: s.hz,
                start_wall_ns: s.start_wall_ns,
                end_wall_ns: s.end_wall_ns,
            },
        ),
        None => Vec::new(),
    };
    let spans = stages.map_or(&[][..], |s| &s.spans[..]);
    write_html(&mut files, analysis.as_ref(), &flamegraphs, spans, &[]);
    files.finish()?;
    println!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// stats.pb, the analysis outputs (or the measured report.json when the
/// analysis is not possible), the table, the report text and any drops.
/// Returns the analysis, when there is one.
fn write_collected_to(
    files: &mut Outputs,
    collected: &plumber_collector::Collected,
) -> Result<Option<plumber_analyzer::Analysis>> {
    files.write("stats.pb", &statsfile::encode_stats(&collected.snapshot));
    // The analysis runs on what stats.pb holds, exactly as `analyze` would.
    let analysis = plumber_analyzer::analyze(
        &collected.snapshot,
        &plumber_analyzer::MachineOverrides::default(),
    );
    let text = match &analysis {
        Ok(a) => {
            let rendered = plumber_analyzer::render_all(a)?;
            for (name, bytes) in rendered.files() {
                files.write(name, bytes);
            }
            Some(rendered.report_txt)
        }
        Err(e) => {
            // Still a useful recording: keep the measured report.
            warn!("no analysis of this recording: {e}");
            let report = collected.report();
            files.write(
                "report.json",
                serde_json::to_string_pretty(&report)?.as_bytes(),
            );
            // The analysis text says it otherwise.
            Some(plumber_collector::report::not_measured_note(
                &report.not_measured,
            ))
            .filter(|n| !n.is_empty())
        }
    };
    println!("{}", collected.table());
    if let Some(d) = &collected.window.dataloader {
        files.write(
            "dataloader.json",
            serde_json::to_string_pretty(d)?.as_bytes(),
        );
        for l in d.lines() {
            println!("{l}");
        }
    }
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
    Ok(analysis.ok())
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
    /// Also write report.txt, report.json, report.html, pipeline.dot and
    /// pipeline.svg here.
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
    let Some(dir) = &a.output else {
        if a.json {
            println!("{}", plumber_analyzer::render_json(&analysis)?);
        } else {
            println!("{}", plumber_analyzer::render_text(analysis.report_ref()));
        }
        return Ok(ExitCode::SUCCESS);
    };
    prepare_dir(dir)?;
    let rendered = plumber_analyzer::render_all(&analysis)?;
    if a.json {
        println!("{}", rendered.report_json);
    } else {
        println!("{}", rendered.report_txt);
    }
    let mut files = Outputs::new(dir);
    for (name, bytes) in rendered.files() {
        files.write(name, bytes);
    }
    write_html(&mut files, Some(&analysis), &[], &[], &[]);
    files.finish()?;
    Ok(ExitCode::SUCCESS)
}
