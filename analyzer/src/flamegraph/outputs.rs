//! Every stack output of a recording, rendered from its aggregated samples
//! and op spans in one call ([`render_stack_outputs`]), or from the stacks
//! of a sampler with one kind of value and its spans
//! ([`render_labeled_outputs`]: the DataLoader's stages). Writing them is
//! the caller's job (plumber-probe writes every output through one atomic
//! writer).

use plumber_collector::stacks::pprof::proto;
use plumber_collector::stacks::{
    build_labeled_profile, build_profile, encode_profile_gz, folded_lines, labeled_folded_lines,
    render_trace_json, FoldedKind, LabeledStack, PprofOptions, Span, StackAggregator, TraceOptions,
    TraceSummary,
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
        out.files.push(folded_file(k.folded_file(), lines));
    }
    for (k, svg) in svgs {
        out.files.push(OutputFile {
            name: k.svg_file(),
            contents: svg.map(String::into_bytes),
        });
    }
    out.profile_and_trace(&build_profile(agg, &opts.pprof), spans, &opts.trace);
    tracing::debug!(
        stacks = agg.len(),
        spans = out.trace_summary.spans,
        "rendered stack outputs"
    );
    out
}

/// How [`render_labeled_outputs`] names and draws its stacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabeledOutputOptions {
    /// The folded file and flamegraph are `{name}.folded`, `{name}.svg`.
    pub name: String,
    /// The profile's one sample type, e.g. `("wall", "nanoseconds")`.
    pub sample_type: (String, String),
    pub flame: FlameOptions,
    pub stack: StackOutputOptions,
}

/// Renders `{name}.folded`, `{name}.svg` (when a stack has a value),
/// profile.pb.gz with the one sample type and trace.json, from stacks that
/// carry their own labels and one value each (the DataLoader's stage
/// stacks, wall time) and their spans.
pub fn render_labeled_outputs(
    stacks: &[LabeledStack],
    spans: &[Span],
    opts: &LabeledOutputOptions,
) -> StackOutputs {
    let lines = labeled_folded_lines(stacks);
    let mut out = StackOutputs::default();
    out.files
        .push(folded_file(format!("{}.folded", opts.name), &lines));
    if !lines.is_empty() {
        out.files.push(OutputFile {
            name: format!("{}.svg", opts.name),
            contents: render_lines(lines.iter().map(String::as_str), &opts.flame)
                .map(String::into_bytes),
        });
    }
    let (t, u) = &opts.sample_type;
    let profile = build_labeled_profile((t, u), stacks, &opts.stack.pprof);
    out.profile_and_trace(&profile, spans, &opts.stack.trace);
    tracing::debug!(
        stacks = stacks.len(),
        spans = out.trace_summary.spans,
        "rendered labeled stack outputs"
    );
    out
}

/// A folded file: its lines, each ending in `\n`.
fn folded_file(name: String, lines: &[String]) -> OutputFile {
    let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    OutputFile {
        name,
        contents: Ok(text.into_bytes()),
    }
}

impl StackOutputs {
    /// Adds profile.pb.gz and trace.json, and the trace's summary.
    fn profile_and_trace(&mut self, profile: &proto::Profile, spans: &[Span], opts: &TraceOptions) {
        self.files.push(OutputFile {
            name: "profile.pb.gz".into(),
            contents: encode_profile_gz(profile).map_err(FlameError::from),
        });
        let trace = render_trace_json(spans, opts).map_err(FlameError::from);
        let trace = trace.map(|(text, summary)| {
            self.trace_summary = summary;
            text.into_bytes()
        });
        self.files.push(OutputFile {
            name: "trace.json".into(),
            contents: trace,
        });
    }
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
