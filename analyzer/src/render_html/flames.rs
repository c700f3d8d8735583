//! The flamegraphs, inline and as interactive as inferno made them.
//!
//! Each SVG is shown in its own `<iframe srcdoc>`: inferno's script works
//! on globals (`svg = document.getElementsByTagName("svg")[0]`, ids such as
//! `frames`, `details`, `unzoom`, window-wide click and keydown listeners),
//! so two graphs inlined into one document would fight over them, while a
//! srcdoc document gives each graph its own window and DOM, and stays
//! same-origin with the page (no network, works from `file://`). The SVG
//! travels as a JSON string in a `<script type="application/json">` (about
//! 5% larger than the SVG; as a srcdoc attribute every `"` would become
//! `&quot;`, about 20%) and the page's script sets `srcdoc` from it.
//!
//! A small glue script goes in front of each graph: it starts inferno's
//! script only once the frame has a width (one that starts hidden would
//! otherwise draw at width -20), makes `history.replaceState` (which inferno calls on every zoom and search to
//! keep the state in the URL) harmless in an `about:srcdoc` document, where
//! Chromium refuses it with a SecurityError, and takes messages from the
//! page: `{op}` zooms on the op's root frame `[OpName]` (showing that op's
//! stacks only), `{search}` runs inferno's search.

use std::fmt::Write as _;

use super::{esc, model_name, stack_root};
use crate::report::Report;

const GLUE: &str = include_str!("flame_glue.js");

fn caption(kind: &str) -> String {
    match kind {
        "cpu" => "On-CPU time (cpu.svg)".into(),
        "offcpu" => "Off-CPU time, lock waits aside (offcpu.svg)".into(),
        "locks" => "Lock and GIL waits (locks.svg)".into(),
        "io" => "File I/O (io.svg)".into(),
        other => format!("{other} ({other}.svg)"),
    }
}

/// The SVG element itself: inferno's XML prologue and DOCTYPE dropped (an
/// HTML document has no use for them).
fn svg_element(svg: &str) -> &str {
    match svg.find("<svg") {
        Some(i) => &svg[i..],
        None => svg,
    }
}

/// The SVG with its `onload="init(evt)"` (inferno's start) calling the
/// glue's `plumberInit`, which starts inferno once the frame has a width.
fn deferred_init(svg: &str) -> std::borrow::Cow<'_, str> {
    const INFERNO: &str = "onload=\"init(evt)\"";
    match svg.find('>') {
        Some(end) if svg[..end].contains(INFERNO) => svg
            .replacen(INFERNO, "onload=\"plumberInit(evt)\"", 1)
            .into(),
        _ => svg.into(),
    }
}

/// The `height` of the outer `<svg>` (inferno writes a fixed one; the width
/// follows the frame), for the iframe's height.
fn svg_height(svg: &str) -> Option<u32> {
    let tag_end = svg.find('>')?;
    let tag = &svg[..tag_end];
    let at = tag.find(" height=\"")? + " height=\"".len();
    let end = tag[at..].find('"')?;
    tag[at..at + end]
        .trim()
        .parse::<f64>()
        .ok()
        .map(|h| h.ceil() as u32)
}

/// `text` as a JSON string safe inside `<script>`: `</` and `<!` escaped so
/// that neither `</script>` nor `<!--` in the SVG ends or confuses the
/// script element.
fn script_json(text: &str) -> String {
    let json = serde_json::Value::String(text.to_string()).to_string();
    json.replace("</", "<\\/").replace("<!", "<\\u0021")
}

pub(super) fn flamegraphs(s: &mut String, r: &Report, graphs: &[(&str, &str)]) {
    s.push_str("<section id=\"stacks\"><h2>Stacks</h2>\n");
    if graphs.is_empty() {
        s.push_str("<p>No stack samples in this recording.</p>\n</section>\n");
        return;
    }
    op_filter(s, r);
    for (i, (kind, svg)) in graphs.iter().enumerate() {
        let svg = deferred_init(svg_element(svg));
        let height = svg_height(&svg).unwrap_or(400);
        let doc = format!(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>html,body{{margin:0;padding:0}}svg{{display:block;width:100%}}</style><script>{GLUE}</script></head><body>{svg}</body></html>"
        );
        let _ = writeln!(
            s,
            "<figure class=\"flame\"><figcaption>{} <span class=\"status\" id=\"flame-status-{i}\"></span></figcaption>\
             <iframe class=\"flame\" id=\"flame-{i}\" data-kind=\"{}\" data-src=\"flame-src-{i}\" title=\"{}\" height=\"{height}\"></iframe>\
             <script type=\"application/json\" id=\"flame-src-{i}\">{}</script></figure>",
            esc(&caption(kind)),
            esc(kind),
            esc(&caption(kind)),
            script_json(&doc)
        );
    }
    s.push_str("</section>\n");
}

/// The op picker (one op's stacks) and a search box for every graph.
fn op_filter(s: &mut String, r: &Report) {
    // A DataLoader's stacks are rooted at its stages (stages.svg).
    let dataloader = r
        .nodes
        .iter()
        .any(|n| crate::ops::is_dataloader(&n.measured.op));
    let (one, all) = if dataloader {
        ("Show one stage’s stacks", "all stages")
    } else {
        ("Show one op’s stacks", "all ops")
    };
    let _ = write!(
        s,
        "<div class=\"controls\"><label>{one}: <select id=\"op-filter\"><option value=\"\">{all}</option>"
    );
    let mut seen: Vec<String> = Vec::new();
    let ranked = r
        .ranking
        .iter()
        .filter_map(|name| r.nodes.iter().find(|n| &n.measured.name == name));
    for n in ranked.chain(r.nodes.iter()) {
        let (m, Some(root)) = (model_name(n), stack_root(n)) else {
            continue;
        };
        if m.is_empty() || seen.contains(&root) {
            continue;
        }
        let _ = write!(s, "<option value=\"{}\">{}</option>", esc(&root), esc(&m));
        seen.push(root);
        if seen.len() >= 200 {
            break;
        }
    }
    if dataloader {
        for (root, label) in crate::ops::DATALOADER_OTHER_STACK_ROOTS {
            let _ = write!(s, "<option value=\"{root}\">{label}</option>");
        }
    } else {
        s.push_str("<option value=\"[outside pipeline]\">outside the pipeline</option>");
    }
    s.push_str("</select></label>\
        <label>Search frames: <input id=\"flame-search\" type=\"search\" placeholder=\"regexp, e.g. jpeg|take_gil\"></label>\
        <span class=\"hint\">Click a frame to zoom, “Reset Zoom” (top left of a graph) to go back.</span></div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn height_and_prologue() {
        let svg = "<?xml version=\"1.0\"?><!DOCTYPE svg><svg version=\"1.1\" width=\"1200\" height=\"246\" onload=\"init(evt)\"><g/></svg>";
        let el = svg_element(svg);
        assert!(el.starts_with("<svg version"));
        assert_eq!(svg_height(el), Some(246));
        assert_eq!(svg_height("<svg width=\"3\">"), None);
        let deferred = deferred_init(el);
        assert!(deferred.starts_with(
            "<svg version=\"1.1\" width=\"1200\" height=\"246\" onload=\"plumberInit(evt)\">"
        ));
        assert_eq!(
            deferred_init("<svg><g onload=\"init(evt)\"/></svg>"),
            "<svg><g onload=\"init(evt)\"/></svg>"
        );
    }

    #[test]
    fn json_cannot_close_the_script() {
        let j = script_json("<!--x--><script>a</script>\"");
        assert!(!j.contains("</"), "{j}");
        assert!(!j.contains("<!"), "{j}");
        let back: String = serde_json::from_str(&j).expect("still JSON");
        assert_eq!(back, "<!--x--><script>a</script>\"");
    }
}
