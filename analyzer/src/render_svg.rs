//! pipeline.svg, drawn here (no graphviz needed): a layered tree with the
//! pipeline's output at the top and the sources at the bottom. Leaves take
//! consecutive columns in depth-first order and a consumer sits centred over
//! its inputs, so the drawing is deterministic (golden-testable) and linear
//! in the number of ops. The bottleneck is red, sources carry a diamond,
//! function datasets are dashed, stale ops gray, and each edge is labelled
//! with the rate it can carry.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::fmt;
use crate::render_dot::node_label;
use crate::report::Report;

// Integer pixels throughout: formatting floats dominates the time of a
// 10,000-op drawing.
const BOX_W: i64 = 250;
const BOX_H: i64 = 64;
const COL_W: i64 = 280;
const ROW_H: i64 = 120;
const MARGIN: i64 = 20;
const HEADER: i64 = 56;
const MAX_CHARS: usize = 40;

fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    push_xml(&mut o, s);
    o
}

/// Appends `s` XML-escaped (control characters dropped).
fn push_xml(o: &mut String, s: &str) {
    crate::escape::push_escaped(o, s, false);
}

/// `s` cut to MAX_CHARS characters (an ellipsis marks the cut).
fn clip(s: &str) -> (&str, bool) {
    match s.char_indices().nth(MAX_CHARS - 1) {
        Some((i, _)) if s[i..].chars().nth(1).is_some() => (&s[..i], true),
        _ => (s, false),
    }
}

fn edge_text(child: &crate::report::NodeReport) -> String {
    match child.edge_rate {
        None if child.stale => "stale".into(),
        e => fmt::rate(e),
    }
}

/// Column (x slot) and depth of every node.
fn layout(r: &Report) -> (Vec<f64>, Vec<usize>, usize) {
    let n = r.nodes.len();
    let ids = name_index(r);
    let children: Vec<Vec<usize>> = r
        .nodes
        .iter()
        .map(|x| {
            x.inputs
                .iter()
                .chain(x.function_inputs.iter())
                .filter_map(|c| ids.get(c.as_str()).copied())
                .collect()
        })
        .collect();
    let mut col = vec![0.0; n];
    let mut depth = vec![0usize; n];
    let mut seen = vec![false; n];
    let mut next_slot = 0.0;
    for root in 0..n {
        if seen[root] {
            continue;
        }
        // Iterative post-order: (node, next child index).
        seen[root] = true;
        depth[root] = 0;
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        // Placed children of each node on the stack.
        let mut placed: Vec<Vec<usize>> = vec![Vec::new()];
        while let Some(&mut (u, ref mut k)) = stack.last_mut() {
            if *k < children[u].len() {
                let c = children[u][*k];
                *k += 1;
                if !seen[c] {
                    seen[c] = true;
                    depth[c] = depth[u] + 1;
                    stack.push((c, 0));
                    placed.push(Vec::new());
                }
                continue;
            }
            stack.pop();
            let kids = placed.pop().unwrap_or_default();
            col[u] = match (kids.first(), kids.last()) {
                (Some(&a), Some(&b)) => (col[a] + col[b]) / 2.0,
                _ => {
                    let s = next_slot;
                    next_slot += 1.0;
                    s
                }
            };
            if let Some(parent_kids) = placed.last_mut() {
                parent_kids.push(u);
            }
        }
    }
    let max_depth = depth.iter().copied().max().unwrap_or(0);
    (col, depth, max_depth)
}

/// Where the layout puts each node's box.
struct Placement {
    col: Vec<f64>,
    depth: Vec<usize>,
}

impl Placement {
    /// Top-left corner of node `i`'s box.
    fn pos(&self, i: usize) -> (i64, i64) {
        (
            MARGIN + (self.col[i] * COL_W as f64).round() as i64 + (COL_W - BOX_W) / 2,
            MARGIN + HEADER + self.depth[i] as i64 * ROW_H,
        )
    }
}

pub fn render_svg(r: &Report) -> String {
    render_svg_linked(r, None)
}

/// [`render_svg`] with each op's box wrapped in a link to `#{anchor(i)}`
/// (`i`: its index in `r.nodes`), for report.html, where the graph links
/// every op to its table row. `None` draws pipeline.svg as it is.
pub(crate) fn render_svg_linked(r: &Report, anchor: Option<fn(usize) -> String>) -> String {
    let (col, depth, max_depth) = layout(r);
    let columns = col.iter().copied().fold(0.0_f64, f64::max) + 1.0;
    let width = (MARGIN * 2 + (columns * COL_W as f64).round() as i64).max(960);
    let height = MARGIN * 2 + HEADER + (max_depth as i64 + 1) * ROW_H;
    let at = Placement { col, depth };
    let bottleneck = r.bottleneck.as_ref().map(|b| b.name.as_str());
    let mut s = String::with_capacity(r.nodes.len() * 700 + 2048);
    svg_header(&mut s, r, width, height);
    // Edges first, under the boxes.
    edges(&mut s, r, &at);
    for (i, n) in r.nodes.iter().enumerate() {
        if let Some(anchor) = anchor {
            let _ = write!(s, "<a href=\"#{}\" class=\"op-link\">", anchor(i));
        }
        node_box(&mut s, r, n, at.pos(i), bottleneck);
        if anchor.is_some() {
            // node_box ends its group with a newline: the link closes
            // before it.
            s.pop();
            s.push_str("</a>\n");
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The `<svg>` element, the arrow marker, the background, the title and
/// the legend.
fn svg_header(s: &mut String, r: &Report, width: i64, height: i64) {
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(
        s,
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#555\"/></marker></defs>"
    );
    let _ = writeln!(
        s,
        "<rect x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\" fill=\"white\"/>"
    );
    let title = match &r.bottleneck {
        Some(b) => format!(
            "Bottleneck: {} at {} ({}) · observed {} · model {}",
            b.name,
            fmt::rate(b.rate),
            b.reason,
            fmt::rate(Some(r.observed_rate)),
            fmt::rate(r.predicted_rate)
        ),
        None => format!(
            "No bottleneck found · observed {}",
            fmt::rate(Some(r.observed_rate))
        ),
    };
    let _ = writeln!(
        s,
        "<text x=\"{MARGIN}\" y=\"{}\" font-size=\"14\" font-weight=\"bold\">{}</text>",
        MARGIN + 14,
        xml(&title)
    );
    let _ = writeln!(
        s,
        "<text x=\"{MARGIN}\" y=\"{}\" fill=\"#555\">red: bottleneck · ◆ source · dashed: inside a function · gray: stale · green: cache after this op · edges: rate the input can carry (root elements/s)</text>",
        MARGIN + 34
    );
}

/// An arrow from each input's box to its consumer's, labelled with the rate
/// the input can carry; function inputs dashed.
fn edges(s: &mut String, r: &Report, at: &Placement) {
    let ids = name_index(r);
    for (i, n) in r.nodes.iter().enumerate() {
        let (px, py) = at.pos(i);
        for (list, dashed) in [(&n.inputs, false), (&n.function_inputs, true)] {
            for c in list {
                let Some(&j) = ids.get(c.as_str()) else {
                    continue;
                };
                let (cx, cy) = at.pos(j);
                let (x1, y1) = (cx + BOX_W / 2, cy);
                let (x2, y2) = (px + BOX_W / 2, py + BOX_H);
                let _ = writeln!(
                    s,
                    "<line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" stroke=\"#555\" stroke-width=\"1.2\"{} marker-end=\"url(#arrow)\"/>",
                    if dashed { " stroke-dasharray=\"5,3\"" } else { "" }
                );
                let _ = write!(
                    s,
                    "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#333\" stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">",
                    (x1 + x2) / 2,
                    (y1 + y2) / 2 + 4,
                );
                push_xml(s, &edge_text(&r.nodes[j]));
                s.push_str("</text>\n");
            }
        }
    }
}

/// One op's box at `(x, y)`: coloured by bottleneck or staleness, with the
/// cache mark, the source diamond and up to four label lines.
fn node_box(
    s: &mut String,
    r: &Report,
    n: &crate::report::NodeReport,
    (x, y): (i64, i64),
    bottleneck: Option<&str>,
) {
    let is_b = bottleneck == Some(n.measured.name.as_str());
    let (stroke, fill, text, sw) = if is_b {
        ("#d00000", "#ffe5e5", "#900000", "3")
    } else if n.stale {
        ("#999999", "#f2f2f2", "#888888", "1")
    } else {
        ("#333333", "#f7fbff", "#111111", "1.2")
    };
    let dash = if n.function.is_some() {
        " stroke-dasharray=\"6,3\""
    } else {
        ""
    };
    let _ = writeln!(
        s,
        "<g><rect x=\"{x}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"6\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"{sw}\"{dash}/>"
    );
    if r.cache.node.as_deref() == Some(n.measured.name.as_str()) {
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"8\" fill=\"none\" stroke=\"#2f855a\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\" fill=\"#2f855a\" text-anchor=\"end\" font-weight=\"bold\">cache after this op</text>",
            x - 4,
            y - 4,
            BOX_W + 8,
            BOX_H + 8,
            x + BOX_W - 4,
            y - 8
        );
    }
    if n.source {
        let (dx, dy) = (x + BOX_W - 14, y + 12);
        let _ = writeln!(
            s,
            "<polygon points=\"{},{} {},{} {},{} {},{}\" fill=\"#2b6cb0\"/>",
            dx,
            dy - 7,
            dx + 7,
            dy,
            dx,
            dy + 7,
            dx - 7,
            dy
        );
    }
    for (li, line) in node_label(n).iter().take(4).enumerate() {
        let weight = if li == 0 { " font-weight=\"bold\"" } else { "" };
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{text}\"{weight}>",
            x + 8,
            y + 15 + li as i64 * 14,
        );
        let (shown, cut) = clip(line);
        push_xml(s, shown);
        if cut {
            s.push('…');
        }
        s.push_str("</text>\n");
    }
    s.push_str("</g>\n");
}

/// Node index by name; the first node of a name wins.
fn name_index(r: &Report) -> HashMap<&str, usize> {
    let mut ids = HashMap::with_capacity(r.nodes.len());
    for (i, x) in r.nodes.iter().enumerate() {
        ids.entry(x.measured.name.as_str()).or_insert(i);
    }
    ids
}
