//! Every stack output of a recording, from its aggregated samples and op
//! spans, in one call.

use std::path::{Path, PathBuf};

use plumber_collector::stacks::{
    folded_lines, write_atomic, write_pprof, write_trace_json, FoldedKind, PprofOptions, Span,
    StackAggregator, StacksError, TraceOptions, TraceSummary,
};

use super::{render_lines, FlameError, FlameOptions};

/// Informational fields of profile.pb.gz and trace.json.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackOutputOptions {
    pub pprof: PprofOptions,
    pub trace: TraceOptions,
}

/// What [`write_stack_outputs`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackOutputs {
    /// cpu.folded, offcpu.folded, locks.folded, io.folded: always written,
    /// empty when the recording has no weight of that kind.
    pub folded: Vec<PathBuf>,
    /// The SVG of each kind that has weight (no locks.svg without lock
    /// waits: inferno has nothing to draw).
    pub svg: Vec<PathBuf>,
    pub profile: PathBuf,
    pub trace: PathBuf,
    pub trace_summary: TraceSummary,
}

/// Writes into `dir` (created if missing) the folded stacks and flamegraph
/// of each [`FoldedKind`] (`cpu`, `offcpu`, `locks`, `io`), profile.pb.gz
/// and trace.json. The SVGs are rendered on their own threads (inferno
/// takes seconds on a large recording); inline when a thread cannot start.
pub fn write_stack_outputs(
    dir: &Path,
    agg: &StackAggregator,
    spans: &[Span],
    opts: &StackOutputOptions,
) -> Result<StackOutputs, FlameError> {
    std::fs::create_dir_all(dir).map_err(|source| {
        StacksError::Write(plumber_collector::atomic::WriteError {
            path: dir.to_path_buf(),
            source,
        })
    })?;
    let folded: Vec<(FoldedKind, Vec<String>)> = FoldedKind::ALL
        .into_iter()
        .map(|k| (k, folded_lines(agg, k)))
        .collect();
    let rendered: Vec<(FoldedKind, Result<String, FlameError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = folded
            .iter()
            .filter(|(_, lines)| !lines.is_empty())
            .map(|(k, lines)| {
                let render = move || {
                    render_lines(
                        lines.iter().map(String::as_str),
                        &FlameOptions::for_kind(*k),
                    )
                };
                let h = std::thread::Builder::new()
                    .name("plumber-flame".into())
                    .spawn_scoped(scope, render);
                (*k, lines, h.ok())
            })
            .collect();
        handles
            .into_iter()
            .map(|(k, lines, h)| {
                let svg = h.and_then(|h| h.join().ok()).unwrap_or_else(|| {
                    render_lines(lines.iter().map(String::as_str), &FlameOptions::for_kind(k))
                });
                (k, svg)
            })
            .collect()
    });

    let mut out = StackOutputs::default();
    for (k, lines) in &folded {
        let path = dir.join(k.folded_file());
        let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        write_atomic(&path, text.as_bytes()).map_err(StacksError::from)?;
        out.folded.push(path);
    }
    for (k, svg) in rendered {
        let path = dir.join(k.svg_file());
        write_atomic(&path, svg?.as_bytes()).map_err(StacksError::from)?;
        out.svg.push(path);
    }
    out.profile = dir.join("profile.pb.gz");
    write_pprof(&out.profile, agg, &opts.pprof)?;
    out.trace = dir.join("trace.json");
    out.trace_summary = write_trace_json(&out.trace, spans, &opts.trace)?;
    tracing::debug!(
        stacks = agg.len(),
        svgs = out.svg.len(),
        spans = out.trace_summary.spans,
        "wrote stack outputs"
    );
    Ok(out)
}
