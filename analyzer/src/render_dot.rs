//! pipeline.dot: the pipeline as Graphviz source, in the spirit of Plumber's
//! `DotPerformanceSummary` (plumber-model.md §7): the bottleneck in red,
//! stale ops gray, sources double-bordered, function datasets in a cluster,
//! each edge labelled with the rate it can carry.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::fmt;
use crate::report::{NodeReport, Report};

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' | '\r' => o.push(' '),
            c if c.is_control() => {}
            c => o.push(c),
        }
    }
    o
}

pub(crate) fn node_label(n: &NodeReport) -> Vec<String> {
    let mut lines = vec![n.measured.name.clone()];
    if n.stale {
        lines.push("stale (cached or file list)".into());
    } else if n.measured.op.is_empty() && n.rate_per_core.is_none() && n.max_rate.is_none() {
        lines.push("no stats".into());
    } else {
        lines.push(format!(
            "max {} · {} per core × {}",
            fmt::rate(n.max_rate),
            fmt::rate(n.rate_per_core),
            fmt::count(n.model_parallelism)
        ));
        lines.push(format!(
            "observed {} · visit {} · {}",
            fmt::rate(Some(n.observed_rate)),
            fmt::count(n.visit_ratio),
            n.limited_by
        ));
    }
    let tags: Vec<&str> = [(n.source, "source"), (n.random, "random")]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, t)| *t)
        .collect();
    if !tags.is_empty() {
        lines.push(tags.join(" · "));
    }
    lines
}

pub fn render_dot(r: &Report) -> String {
    let mut s = String::with_capacity(1024 + r.nodes.len() * 200);
    let bottleneck = r.bottleneck.as_ref().map(|b| b.name.as_str());
    let _ = writeln!(s, "digraph \"PlumberModel\" {{");
    let _ = writeln!(s, "  rankdir=BT;");
    let _ = writeln!(
        s,
        "  node [shape=box, fontname=\"Helvetica\", fontsize=10];"
    );
    let _ = writeln!(s, "  edge [fontname=\"Helvetica\", fontsize=9];");
    // Ids by position: names may repeat or hold anything.
    let ids: HashMap<&str, usize> = r
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.measured.name.as_str(), i))
        .collect();
    let mut clusters: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, n) in r.nodes.iter().enumerate() {
        match &n.function {
            Some(f) => clusters.entry(f.as_str()).or_default().push(i),
            None => {
                let _ = writeln!(s, "  {};", node_stmt(i, n, bottleneck));
            }
        }
    }
    for (ci, (f, members)) in clusters.iter().enumerate() {
        let _ = writeln!(s, "  subgraph \"cluster_{ci}\" {{");
        let _ = writeln!(
            s,
            "    label=\"{} (function)\"; color=blue; style=dashed;",
            esc(f)
        );
        for &i in members {
            let _ = writeln!(s, "    {};", node_stmt(i, &r.nodes[i], bottleneck));
        }
        let _ = writeln!(s, "  }}");
    }
    for (i, n) in r.nodes.iter().enumerate() {
        for (inputs, dashed) in [(&n.inputs, false), (&n.function_inputs, true)] {
            for c in inputs {
                let Some(&j) = ids.get(c.as_str()) else {
                    continue;
                };
                let _ = writeln!(
                    s,
                    "  n{j} -> n{i} [label=\"{}\"{}];",
                    esc(&match r.nodes[j].edge_rate {
                        None if r.nodes[j].stale => "stale".to_string(),
                        e => fmt::rate(e),
                    }),
                    if dashed { ", style=dashed" } else { "" }
                );
            }
        }
    }
    let _ = writeln!(s, "}}");
    s
}

fn node_stmt(i: usize, n: &NodeReport, bottleneck: Option<&str>) -> String {
    let label = node_label(n)
        .iter()
        .map(|l| esc(l))
        .collect::<Vec<_>>()
        .join("\\n");
    let mut attrs = vec![format!("label=\"{label}\"")];
    if bottleneck == Some(n.measured.name.as_str()) {
        attrs.push("color=red, fontcolor=red, penwidth=2".into());
    } else if n.stale {
        attrs.push("color=gray, fontcolor=gray".into());
    }
    if n.source {
        attrs.push("peripheries=2".into());
    }
    format!("n{i} [{}]", attrs.join(", "))
}
