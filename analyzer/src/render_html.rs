//! report.html: one self-contained page a person opens instead of eighteen
//! files. The verdict first (the bottleneck, why, the observed rate, what
//! to change with the predicted rates), then the pipeline graph (each op
//! linked to its table row), the sortable per-op table, the CPU split,
//! files and lock sites, the flamegraphs (inferno's, still interactive),
//! a timeline of which op ran on which thread, and the recording's facts.
//!
//! Nothing outside the file is referenced: the CSS and JS are inlined from
//! `render_html/*.css|js`, each flamegraph SVG travels as a JSON string and
//! is shown in an `<iframe srcdoc>` (see `flames.rs` for why), and every
//! string that comes from the target (op names, file paths, function and
//! thread names) is HTML-escaped with [`esc`]. Output is deterministic for
//! the golden test: no timestamps, no hash-map order.

mod flames;
mod tables;
mod timeline;

use std::fmt::Write as _;

use plumber_collector::stacks::Span;

use crate::fmt;
use crate::render_svg::render_svg_linked;
use crate::render_text::{reason_word, render_text, value_text};
use crate::report::Report;

pub use timeline::{Timeline, TimelineBar, TimelineThread, MAX_BARS};

const CSS: &str = include_str!("render_html/report.css");
const JS: &str = include_str!("render_html/report.js");

/// What report.html is built from: everything a recording (or `analyze`,
/// `replay`) has at hand.
#[derive(Clone, Copy, Debug)]
pub struct HtmlInput<'a> {
    /// The report (what report.json serializes).
    pub report: &'a Report,
    /// Flamegraphs, in the order to show them: `(kind, SVG)` with kind
    /// `cpu`, `offcpu`, `locks` or `io` and the SVG as inferno rendered it
    /// (cpu.svg, ...). Kinds without weight are simply left out.
    pub flamegraphs: &'a [(&'a str, &'a str)],
    /// The op spans trace.json is written from (thread names included);
    /// empty: no timeline section.
    pub spans: &'a [Span],
    /// The probe's own cost and other facts about the recording that
    /// report.json does not carry, as (label, value) lines, e.g.
    /// `("probe CPU", "0.21 s (0.7% of one core)")`.
    pub recording: &'a [(String, String)],
}

/// Renders report.html.
pub fn render_html(input: &HtmlInput<'_>) -> String {
    let r = input.report;
    let flames_len: usize = input.flamegraphs.iter().map(|(_, s)| s.len()).sum();
    let mut s = String::with_capacity(64 * 1024 + flames_len * 11 / 10 + r.nodes.len() * 2048);
    head(&mut s, r);
    verdict(&mut s, r);
    pipeline(&mut s, r);
    tables::ops_table(&mut s, r);
    tables::cpu_files_locks(&mut s, r);
    flames::flamegraphs(&mut s, r, input.flamegraphs);
    if !input.spans.is_empty() {
        let t = Timeline::from_spans(input.spans, MAX_BARS);
        timeline::section(&mut s, &t, crate::render_text::is_dataloader(r));
    }
    recording(&mut s, r, input.recording);
    s.push_str("<script>\n");
    s.push_str(JS);
    s.push_str("</script>\n</body>\n</html>\n");
    s
}

/// `s` escaped for HTML text and attribute values (control characters
/// other than tab and newline dropped).
pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 8);
    push_esc(&mut o, s);
    o
}

/// Appends `s` escaped, as [`esc`].
pub(crate) fn push_esc(o: &mut String, s: &str) {
    crate::escape::push_escaped(o, s, true);
}

/// The id of op `i`'s table row (index into `report.nodes`): an index, not
/// the name, so no escaping is needed in `href="#..."`.
pub(crate) fn op_anchor(i: usize) -> String {
    format!("op-{i}")
}

/// The model name of an op (`ParallelMapV2`), which roots its stacks as
/// `[ParallelMapV2]` in the folded files: the last element of its path,
/// else its GraphDef op without `Dataset` (`ParallelMapDatasetV2`).
pub(crate) fn model_name(n: &crate::report::NodeReport) -> String {
    let path = n.measured.path.trim();
    if !path.is_empty() {
        return plumber_collector::opnames::model_name_of_path(path).to_string();
    }
    n.measured.op.replacen("Dataset", "", 1)
}

/// The root frame of a node's stacks in the flamegraphs: `[Model]` for a
/// tf.data op, its stage's for a DataLoader op (`[get item]`); None for a
/// DataLoader op of no stage.
pub(crate) fn stack_root(n: &crate::report::NodeReport) -> Option<String> {
    if crate::ops::is_dataloader(&n.measured.op) {
        return crate::ops::dataloader_stack_root(&n.measured.op).map(str::to_string);
    }
    let m = model_name(n);
    (!m.is_empty()).then(|| format!("[{m}]"))
}

fn head(s: &mut String, r: &Report) {
    let title = match &r.bottleneck {
        Some(b) => format!("plumber-probe: {} bounds the pipeline", b.name),
        None => "plumber-probe: no bottleneck found".to_string(),
    };
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n",
        esc(&title)
    );
    let cpu = match r.cpu_source.as_str() {
        "cpu_clock" => "thread CPU time",
        _ => "wall time (no CPU time in the file)",
    };
    let mode = if r.measured.mode.is_empty() {
        String::new()
    } else {
        format!(" · mode {}", esc(&r.measured.mode))
    };
    let b = &r.machine.budget;
    let cores = match b.other_processes_cores {
        Some(o) => format!(
            "{} of {} cores free ({} to other processes, {} outside the pipeline)",
            fmt::num(r.machine.cores),
            fmt::count(b.cores),
            fmt::num(o),
            fmt::num(b.outside_pipeline_cores)
        ),
        None => format!("{} cores", fmt::count(r.machine.cores)),
    };
    let _ = writeln!(
        s,
        "<header><h1>plumber-probe report</h1><p class=\"sub\">{} s window · {} ({}) · rates from {cpu}{mode} · rates are root elements per second (what the training loop receives)</p>",
        fmt::num(r.elapsed_s),
        esc(&cores),
        esc(&r.machine.cores_from),
    );
    s.push_str(
        "<nav><a href=\"#verdict\">Verdict</a><a href=\"#pipeline\">Pipeline</a><a href=\"#ops\">Ops</a>\
         <a href=\"#cpu\">CPU, files, locks</a><a href=\"#stacks\">Stacks</a><a href=\"#timeline\">Timeline</a>\
         <a href=\"#recording\">Recording</a></nav></header>\n<main>\n",
    );
}

/// The bottleneck and what to change, worded as report.txt words them.
fn verdict(s: &mut String, r: &Report) {
    s.push_str("<section id=\"verdict\" class=\"verdict\">\n");
    match &r.bottleneck {
        Some(b) => {
            let row = r
                .nodes
                .iter()
                .position(|n| n.measured.name == b.name)
                .map(op_anchor)
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "<p class=\"label\">Bottleneck</p><h2><a class=\"bn\" href=\"#{row}\">{}</a> bounds the pipeline at {} <span class=\"reason reason-{}\">{}</span></h2>",
                esc(&b.name),
                fmt::rate(b.rate),
                esc(&b.reason),
                esc(&reason_word(&b.reason, &b.bound)),
            );
            let _ = writeln!(s, "<p class=\"why\">{}</p>", esc(&b.why));
        }
        None => s.push_str(
            "<p class=\"label\">Bottleneck</p><h2>none found: no op has measured time</h2>\n",
        ),
    }
    let _ = writeln!(
        s,
        "<p class=\"rates\"><span>observed <b>{}</b></span><span>model <b>{}</b></span></p>",
        fmt::rate(Some(r.observed_rate)),
        fmt::rate(r.predicted_rate)
    );
    s.push_str("<h3>What to change</h3>\n");
    if let Some(e) = &r.limited_elsewhere {
        let _ = writeln!(
            s,
            "<p class=\"why\"><b>Not the pipeline ({})</b>: {}</p>",
            esc(&e.by),
            esc(&e.why)
        );
    }
    if r.recommendations.is_empty() {
        s.push_str("<p>Nothing the model can improve.</p>\n");
    } else {
        s.push_str("<ol class=\"recs\">\n");
        for rec in &r.recommendations {
            let extra = crate::render_text::extra_assumption(r, rec)
                .map(|x| format!("<br><span class=\"why\">Note: {}</span>", esc(x)))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "<li><span class=\"kind\">{}</span> <b>{}</b> {} <span class=\"pred\">⇒ {}</span><br><span class=\"why\">{}</span>{extra}</li>",
                esc(&rec.kind),
                esc(&rec.node),
                esc(&value_text(rec)),
                fmt::rate(rec.predicted_rate),
                esc(&rec.why)
            );
        }
        let _ = writeln!(
            s,
            "</ol>\n<p class=\"note\">Each predicted rate assumes that change and every one above it applied, {}.</p>",
            esc(&r.assumes)
        );
    }
    if !r.notes.is_empty() {
        s.push_str(
            "<details class=\"assume\"><summary>Assumptions the analysis made</summary><ul>\n",
        );
        for n in &r.notes {
            let _ = writeln!(s, "<li>{}</li>", esc(n));
        }
        s.push_str("</ul></details>\n");
    }
    let missing = plumber_collector::report::not_measured_note(&r.measured.not_measured);
    if !missing.is_empty() {
        let _ = writeln!(
            s,
            "<pre class=\"missing\">{}</pre>",
            esc(missing.trim_end())
        );
    }
    s.push_str("</section>\n");
}

fn pipeline(s: &mut String, r: &Report) {
    s.push_str(
        "<section id=\"pipeline\"><h2>Pipeline</h2>\n<p class=\"hint\">Click an op to see its row in the table.</p>\n<div class=\"scroll\">\n",
    );
    s.push_str(&render_svg_linked(r, Some(op_anchor)));
    s.push_str("</div></section>\n");
}

/// Mode, window, drops, the probe's own cost, then report.txt in full (the
/// LP, cache and prefetch lines included) for whoever wants every number.
fn recording(s: &mut String, r: &Report, facts: &[(String, String)]) {
    let m = &r.measured;
    s.push_str("<section id=\"recording\"><h2>Recording</h2>\n<table class=\"facts\">\n");
    let mut row = |k: &str, v: &str| {
        let _ = writeln!(s, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    };
    if !m.mode.is_empty() {
        row("mode", &m.mode);
    }
    if m.target.pid != 0 {
        row("target pid", &m.target.pid.to_string());
    }
    if !m.target.tensorflow_version.is_empty() {
        row("TensorFlow", &m.target.tensorflow_version);
    }
    let w = &m.window;
    if w.end_ns > w.start_ns {
        let secs = (w.end_ns - w.start_ns) as f64 / 1e9;
        let partial = if w.partial {
            " (partial: ended before the requested duration)"
        } else {
            ""
        };
        row("window", &format!("{} s{partial}", fmt::num(secs)));
    }
    let drops: Vec<String> = m
        .drops
        .iter()
        .filter(|d| d.count > 0)
        .map(|d| format!("{} {}", d.count, d.what))
        .collect();
    row(
        "drops",
        &if drops.is_empty() {
            "none".to_string()
        } else {
            drops.join(", ")
        },
    );
    for (k, v) in facts {
        row(k, v);
    }
    s.push_str("</table>\n<details><summary>report.txt</summary><pre>");
    push_esc(s, &render_text(r));
    s.push_str("</pre></details>\n</section>\n</main>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_drops_controls() {
        assert_eq!(
            esc("<script>\"a\" & 'b'</script>\u{7}"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
    }
}
