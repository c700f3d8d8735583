//! Flamegraph SVGs (cpu.svg, offcpu.svg, locks.svg, io.svg) from folded
//! stacks, rendered with inferno, and [`render_stack_outputs`], which
//! renders every stack output of a recording (folded, SVG, profile.pb.gz,
//! trace.json) from its aggregated samples and op spans, for the caller to
//! write.
//!
//! Output is deterministic: inferno picks colours from a hash of the frame
//! name (its `deterministic` option) instead of its random generator, the
//! SVG has no timestamp or generated id, and with `colors_by_op` every
//! frame takes the hue of its `[op]` root frame (the same hue for the same
//! op in every graph, see `colors.rs`).

mod colors;
mod outputs;

use std::collections::HashMap;

use inferno::flamegraph::color::{BasicPalette, Palette};
use plumber_collector::stacks::{folded_lines, FoldedKind, StackAggregator, StacksError};

pub use outputs::{
    render_labeled_outputs, render_stack_outputs, LabeledOutputOptions, OutputFile,
    StackOutputOptions, StackOutputs,
};

/// How to draw one flamegraph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlameOptions {
    pub title: String,
    pub subtitle: Option<String>,
    /// The unit of the counts in the tooltips: `ns`, `bytes`, `samples`.
    pub count_name: String,
    /// Colour every frame by its root frame (`[ParallelMapV2]`, ...): one
    /// hue per op, shades per function; `[outside pipeline]` in greys.
    /// Otherwise inferno's `hot` palette.
    pub colors_by_op: bool,
    /// Draw GIL frames (`take_gil`, `PyEval_RestoreThread`,
    /// `PyGILState_Ensure`, `[lock: gil]`, ...) in magenta.
    pub highlight_gil: bool,
}

impl Default for FlameOptions {
    fn default() -> Self {
        FlameOptions {
            title: "Flame Graph".into(),
            subtitle: None,
            count_name: "samples".into(),
            colors_by_op: false,
            highlight_gil: false,
        }
    }
}

impl FlameOptions {
    /// A recording's graph of one kind: its title and unit, coloured by op,
    /// GIL frames highlighted in locks.svg.
    pub fn for_kind(kind: FoldedKind) -> Self {
        FlameOptions {
            title: kind.title().into(),
            subtitle: None,
            count_name: kind.count_name().into(),
            colors_by_op: true,
            highlight_gil: kind == FoldedKind::Locks,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FlameError {
    #[error("no stack samples: nothing to draw")]
    NoSamples,
    #[error("line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("not UTF-8 text (invalid byte at offset {0})")]
    NotUtf8(usize),
    #[error("rendering the flamegraph failed: {0}")]
    Render(String),
    #[error(transparent)]
    Stacks(#[from] StacksError),
}

impl FlameError {
    /// Exit status for the CLI: 2 for bad input, 1 for failures to render
    /// or write.
    pub fn exit_code(&self) -> i32 {
        match self {
            FlameError::NoSamples | FlameError::BadLine { .. } | FlameError::NotUtf8(_) => 2,
            FlameError::Render(_) | FlameError::Stacks(_) => 1,
        }
    }
}

/// Reads folded-stack bytes: every line that is not blank (or a `# `
/// comment, which inferno skips) must be `STACK COUNT` with a non-empty
/// stack and an integer count. Identical stacks are merged (inferno's cost
/// grows with distinct lines); the result is sorted.
pub fn parse_folded(bytes: &[u8]) -> Result<Vec<String>, FlameError> {
    let text = std::str::from_utf8(bytes).map_err(|e| FlameError::NotUtf8(e.valid_up_to()))?;
    let mut merged: HashMap<&str, u64> = HashMap::new();
    let mut total = 0u64;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with("# ") {
            continue;
        }
        let bad = |reason: &str| FlameError::BadLine {
            line: i + 1,
            reason: reason.to_string(),
        };
        let (stack, count) = line
            .rsplit_once(' ')
            .ok_or_else(|| bad("expected `frame;frame;... COUNT`, found no count"))?;
        let count: u64 = count.parse().map_err(|_| {
            bad(&format!(
                "expected `frame;frame;... COUNT`, the count {count:?} is not a non-negative integer"
            ))
        })?;
        let stack = stack.trim_end();
        if stack.is_empty() {
            return Err(bad("empty stack before the count"));
        }
        let c = merged.entry(stack).or_default();
        *c = c.saturating_add(count);
        total = total.saturating_add(count);
    }
    if total == 0 {
        return Err(FlameError::NoSamples);
    }
    let mut lines: Vec<String> = merged
        .into_iter()
        .filter(|(_, c)| *c > 0)
        .map(|(s, c)| format!("{s} {c}"))
        .collect();
    lines.sort_unstable();
    Ok(lines)
}

/// Renders valid folded lines (from [`parse_folded`] or
/// `plumber_collector::stacks::folded_lines`) as an SVG.
pub fn render_lines<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    opts: &FlameOptions,
) -> Result<String, FlameError> {
    let mut o = inferno::flamegraph::Options::default();
    o.title = opts.title.clone();
    o.subtitle = opts.subtitle.clone();
    o.count_name = opts.count_name.clone();
    o.colors = Palette::Basic(BasicPalette::Hot);
    // Colours from an FNV hash of the name: without it inferno draws them
    // from a thread-local generator, and two graphs rendered on one thread
    // would differ from the same graphs rendered on two.
    o.deterministic = true;
    o.hash = false;
    let mut buf = Vec::with_capacity(256 * 1024);
    inferno::flamegraph::from_lines(&mut o, lines, &mut buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData && e.to_string().contains("No stack counts")
        {
            FlameError::NoSamples
        } else {
            FlameError::Render(e.to_string())
        }
    })?;
    let svg = String::from_utf8(buf).map_err(|e| FlameError::Render(e.to_string()))?;
    if opts.colors_by_op || opts.highlight_gil {
        Ok(colors::recolour(&svg, opts))
    } else {
        Ok(svg)
    }
}

/// [`parse_folded`] then [`render_lines`]: what `plumber-probe flamegraph`
/// does with a saved .folded file.
pub fn render_folded(bytes: &[u8], opts: &FlameOptions) -> Result<String, FlameError> {
    let lines = parse_folded(bytes)?;
    render_lines(lines.iter().map(String::as_str), opts)
}

/// The flamegraph of one kind of an aggregation; `None` when it has no
/// weight of that kind (no lock waits, say).
pub fn render_stacks(
    agg: &StackAggregator,
    kind: FoldedKind,
    opts: &FlameOptions,
) -> Result<Option<String>, FlameError> {
    let lines = folded_lines(agg, kind);
    if lines.is_empty() {
        return Ok(None);
    }
    render_lines(lines.iter().map(String::as_str), opts).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_merges_and_sorts() {
        let lines = parse_folded(b"b;c 2\n\n# comment\na 1\nb;c 3\r\nz 0\n").expect("parse");
        assert_eq!(lines, vec!["a 1", "b;c 5"]);
    }

    #[test]
    fn parse_rejects_bad_lines() {
        for (input, line) in [
            (&b"a;b 1\nno count here\n"[..], 2),
            (b"a;b -3\n", 1),
            (b"a;b 1.5\n", 1),
            (b" 5\n", 1),
            (b"justaword\n", 1),
        ] {
            match parse_folded(input) {
                Err(FlameError::BadLine { line: l, .. }) => assert_eq!(l, line, "{input:?}"),
                other => panic!("{input:?}: {other:?}"),
            }
        }
        assert!(matches!(parse_folded(b""), Err(FlameError::NoSamples)));
        assert!(matches!(parse_folded(b"a 0\n"), Err(FlameError::NoSamples)));
        assert!(matches!(
            parse_folded(b"a\xff 1\n"),
            Err(FlameError::NotUtf8(1))
        ));
    }

    #[test]
    fn same_svg_on_one_thread_or_two() {
        let lines = ["a;b 3", "a;c 1", "d 2"];
        let o = FlameOptions::default();
        let first = render_lines(lines, &o).expect("svg");
        let again = render_lines(lines, &o).expect("svg");
        let other = std::thread::spawn(move || render_lines(lines, &FlameOptions::default()))
            .join()
            .expect("thread")
            .expect("svg");
        assert_eq!(first, again);
        assert_eq!(first, other);
    }
}
