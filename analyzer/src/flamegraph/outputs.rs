//! Every stack output of a recording, rendered from its aggregated samples
//! and op spans in one call. Writing them is the caller's job (plumber-probe
//! writes every output through one atomic writer).

use plumber_collector::stacks::{
    build_profile, encode_profile_gz, folded_lines, render_trace_json, FoldedKind, PprofOptions,
    Span, StackAggregator, TraceOptions, TraceSummary,
};

use super::{render_lines, FlameError, FlameOptions};

/// Informational fields of profile.pb.gz and trace.json.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackOutputOptions {
    pub pprof: PprofOptions,
    pub trace: TraceOptions,
}

/// One output file: its name in the output directory and its contents, or
/// why they could not be rendered.
#[derive(Debug)]
pub struct OutputFile {
    pub name: String,
    pub contents: Result<Vec<u8>, FlameError>,
}

/// What [`render_stack_outputs`] rendered.
#[derive(Debug, Default)]
pub struct StackOutputs {
    /// In the order they are written: cpu.folded, offcpu.folded,
    /// locks.folded, io.folded (always, empty when the recording has no
    /// weight of that kind), the SVG of each kind that has weight (no
    /// locks.svg without lock waits: inferno has nothing to draw),
    /// profile.pb.gz, trace.json.
    pub files: Vec<OutputFile>,
    /// Zero when trace.json could not be rendered.
    pub trace_summary: TraceSummary,
}

/// Renders the folded stacks and flamegraph of each [`FoldedKind`] (`cpu`,
/// `offcpu`, `locks`, `io`), profile.pb.gz and trace.json. The SVGs are
/// rendered on their own threads (inferno takes seconds on a large
/// recording); inline when a thread cannot start.
pub fn render_stack_outputs(
    agg: &StackAggregator,
    spans: &[Span],
    opts: &StackOutputOptions,
) -> StackOutputs {
    let folded: Vec<(FoldedKind, Vec<String>)> = FoldedKind::ALL
        .into_iter()
        .map(|k| (k, folded_lines(agg, k)))
        .collect();
    let svgs = render_svgs(&folded);
    let mut out = StackOutputs::default();
    for (k, lines) in &folded {
        let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        out.files.push(OutputFile {
            name: k.folded_file(),
            contents: Ok(text.into_bytes()),
        });
    }
    for (k, svg) in svgs {
        out.files.push(OutputFile {
            name: k.svg_file(),
            contents: svg.map(String::into_bytes),
        });
    }
    out.files.push(OutputFile {
        name: "profile.pb.gz".into(),
        contents: encode_profile_gz(&build_profile(agg, &opts.pprof)).map_err(FlameError::from),
    });
    let trace = render_trace_json(spans, &opts.trace).map_err(FlameError::from);
    let trace = trace.map(|(text, summary)| {
        out.trace_summary = summary;
        text.into_bytes()
    });
    out.files.push(OutputFile {
        name: "trace.json".into(),
        contents: trace,
    });
    tracing::debug!(
        stacks = agg.len(),
        spans = out.trace_summary.spans,
        "rendered stack outputs"
    );
    out
}

/// The SVG of each kind that has weight, in [`FoldedKind::ALL`] order.
fn render_svgs(
    folded: &[(FoldedKind, Vec<String>)],
) -> Vec<(FoldedKind, Result<String, FlameError>)> {
    std::thread::scope(|scope| {
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
    })
}
