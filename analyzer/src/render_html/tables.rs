//! The per-op table (sortable in the page: each sortable cell carries its
//! raw value in `data-v`), the CPU split, files read and lock sites.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::{esc, model_name, op_anchor};
use crate::fmt;
use crate::report::{NodeReport, Report};

/// Rows of the op table; a 10,000-op pipeline's table would dwarf the rest
/// of the page (report.json has every op).
const MAX_OPS: usize = 400;
/// Rows of the files and lock-site tables (both come most-first).
const MAX_FILES: usize = 25;
const MAX_LOCKS: usize = 25;

/// A numeric cell: shown text, sort value.
fn num_cell(s: &mut String, shown: &str, v: Option<f64>) {
    match v.filter(|x| x.is_finite()) {
        Some(v) => {
            let _ = write!(s, "<td data-v=\"{v}\">{}</td>", esc(shown));
        }
        // Unbounded and unknown sort after every number.
        None => {
            let _ = write!(s, "<td data-v=\"Infinity\">{}</td>", esc(shown));
        }
    }
}

/// A time in s, ms or µs (lock waits span nine orders of magnitude).
fn secs(ns: i64) -> String {
    fmt::duration(ns as f64, false)
}

/// Ranked ops first (the bottleneck at the top), then the rest in report
/// order.
fn table_order(r: &Report) -> Vec<usize> {
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(r.nodes.len());
    for (i, n) in r.nodes.iter().enumerate() {
        ids.entry(n.measured.name.as_str()).or_insert(i);
    }
    let mut order: Vec<usize> = r
        .ranking
        .iter()
        .filter_map(|n| ids.get(n.as_str()).copied())
        .collect();
    let mut seen = vec![false; r.nodes.len()];
    for &i in &order {
        seen[i] = true;
    }
    order.extend((0..r.nodes.len()).filter(|&i| !seen[i]));
    order
}

pub(super) fn ops_table(s: &mut String, r: &Report) {
    s.push_str("<section id=\"ops\"><h2>Ops</h2>\n<p class=\"hint\">Click a column header to sort. Rates are root elements per second; “stacks” shows the op’s stacks in the flamegraphs below.</p>\n<div class=\"scroll\"><table class=\"ops sortable\">\n<thead><tr>");
    for (h, title) in [
        ("#", "rank: 1 = bottleneck"),
        ("op", "node name and model op"),
        ("limit", "what limits the op"),
        ("visit", "op elements per root element"),
        (
            "per core",
            "root elements/s one core running only this op sustains",
        ),
        ("threads", "parallelism the model uses"),
        ("max rate", "rate at that parallelism"),
        ("observed", "rate observed"),
        ("cores", "cores used"),
        ("CPU/el", "CPU ms per element produced"),
        ("I/O", "file bytes read"),
        ("lock wait", "time waiting for locks"),
        ("GIL wait", "time waiting for Python's GIL"),
        ("", ""),
    ] {
        let _ = write!(s, "<th title=\"{}\">{}</th>", esc(title), esc(h));
    }
    s.push_str("</tr></thead>\n<tbody>\n");
    let order = table_order(r);
    let bottleneck = r.bottleneck.as_ref().map(|b| b.name.as_str());
    for &i in order.iter().take(MAX_OPS) {
        op_row(s, i, &r.nodes[i], bottleneck);
    }
    s.push_str("</tbody></table></div>\n");
    if order.len() > MAX_OPS {
        let _ = writeln!(
            s,
            "<p class=\"hint\">… {} more op(s) in report.json.</p>",
            order.len() - MAX_OPS
        );
    }
    s.push_str("</section>\n");
}

fn op_row(s: &mut String, i: usize, n: &NodeReport, bottleneck: Option<&str>) {
    let m = &n.measured;
    let class = if bottleneck == Some(m.name.as_str()) {
        " class=\"bottleneck\""
    } else if n.stale {
        " class=\"stale\""
    } else {
        ""
    };
    let _ = write!(s, "<tr id=\"{}\"{class}>", op_anchor(i));
    match n.rank {
        Some(k) => num_cell(s, &k.to_string(), Some(k as f64)),
        None => num_cell(s, "–", None),
    }
    let model = model_name(n);
    let _ = write!(
        s,
        "<td data-v=\"{}\"><b>{}</b> <small>{}</small></td><td>{}</td>",
        esc(&m.name),
        esc(&m.name),
        esc(&model),
        esc(&n.limited_by)
    );
    num_cell(s, &fmt::count(n.visit_ratio), Some(n.visit_ratio));
    num_cell(s, &fmt::rate(n.rate_per_core), n.rate_per_core);
    num_cell(
        s,
        &fmt::count(n.model_parallelism),
        Some(n.model_parallelism),
    );
    num_cell(s, &fmt::rate(n.max_rate), n.max_rate);
    num_cell(s, &fmt::rate(Some(n.observed_rate)), Some(n.observed_rate));
    num_cell(s, &fmt::num(n.cores_used), Some(n.cores_used));
    match m.cpu_ms_per_element {
        Some(v) => num_cell(s, &format!("{} ms", fmt::num(v)), Some(v)),
        None => num_cell(s, "–", None),
    }
    let io = m.io_bytes_read as f64;
    num_cell(
        s,
        &if m.io_bytes_read > 0 {
            fmt::bytes(io)
        } else {
            "0".into()
        },
        Some(io),
    );
    num_cell(s, &secs(m.lock_wait_ns), Some(m.lock_wait_ns as f64));
    num_cell(s, &secs(m.gil_wait_ns), Some(m.gil_wait_ns as f64));
    match super::stack_root(n) {
        Some(root) => {
            let _ = writeln!(
                s,
                "<td><button class=\"stacks\" data-root=\"{}\">stacks</button></td></tr>",
                esc(&root)
            );
        }
        None => s.push_str("<td></td></tr>\n"),
    }
}

/// CPU split (ops / unattributed / outside the pipeline), files read, lock
/// sites.
pub(super) fn cpu_files_locks(s: &mut String, r: &Report) {
    s.push_str("<section id=\"cpu\"><h2>CPU, files and locks</h2>\n");
    cpu_split(s, r);
    files(s, r);
    locks(s, r);
    s.push_str("</section>\n");
}

fn cpu_split(s: &mut String, r: &Report) {
    let m = &r.measured;
    let ops: i64 = r.nodes.iter().map(|n| n.measured.cpu_ns.max(0)).sum();
    let parts = [
        ("ops", ops, "c-ops"),
        (
            "unattributed (pipeline threads, op unknown)",
            m.unattributed_cpu_ns.max(0),
            "c-un",
        ),
        (
            "outside the pipeline (training step, Python)",
            m.non_pipeline_cpu_ns.max(0),
            "c-out",
        ),
    ];
    let total: i64 = parts.iter().map(|p| p.1).sum::<i64>().max(m.process_cpu_ns);
    s.push_str("<h3>CPU time</h3>\n");
    if total <= 0 {
        s.push_str("<p>No CPU split in this recording.</p>\n");
        return;
    }
    s.push_str("<div class=\"split\">");
    for (label, ns, class) in parts {
        if ns > 0 {
            let share = ns as f64 / total as f64;
            let _ = write!(
                s,
                "<span class=\"{class}\" style=\"width:{:.2}%\" title=\"{}: {}\"></span>",
                share * 100.0,
                esc(label),
                fmt::pct(share)
            );
        }
    }
    s.push_str("</div>\n<ul class=\"legend\">");
    for (label, ns, class) in parts {
        let _ = write!(
            s,
            "<li><i class=\"{class}\"></i>{}: {} ({})</li>",
            esc(label),
            secs(ns),
            fmt::pct(ns as f64 / total as f64)
        );
    }
    let _ = writeln!(
        s,
        "</ul>\n<p class=\"hint\">Process CPU time: {}.</p>",
        if m.process_cpu_ns > 0 {
            secs(m.process_cpu_ns)
        } else {
            "not measured".into()
        }
    );
}

fn files(s: &mut String, r: &Report) {
    let files = &r.measured.files;
    s.push_str("<h3>Files read</h3>\n");
    if files.is_empty() {
        s.push_str("<p>No file reads recorded.</p>\n");
        return;
    }
    s.push_str("<table class=\"sortable small\"><thead><tr><th>file</th><th>bytes read</th><th class=\"l\">op</th></tr></thead><tbody>\n");
    for f in files.iter().take(MAX_FILES) {
        let _ = write!(s, "<tr><td class=\"path\">{}</td>", esc(&f.path));
        num_cell(
            s,
            &fmt::bytes(f.bytes_read as f64),
            Some(f.bytes_read as f64),
        );
        let _ = writeln!(
            s,
            "<td class=\"l\">{}</td></tr>",
            esc(f.op.as_deref().unwrap_or("unattributed"))
        );
    }
    s.push_str("</tbody></table>\n");
    if files.len() > MAX_FILES {
        let _ = writeln!(
            s,
            "<p class=\"hint\">… {} more file(s) in report.json.</p>",
            files.len() - MAX_FILES
        );
    }
}

fn locks(s: &mut String, r: &Report) {
    let sites = &r.measured.lock_sites;
    s.push_str("<h3>Lock sites</h3>\n");
    if sites.is_empty() {
        s.push_str("<p>No lock waits recorded.</p>\n");
        return;
    }
    s.push_str("<table class=\"sortable small\"><thead><tr><th>kind</th><th>site</th><th class=\"l\">op</th><th>waits</th><th>wait</th></tr></thead><tbody>\n");
    for l in sites.iter().take(MAX_LOCKS) {
        let _ = write!(
            s,
            "<tr><td>{}</td><td class=\"path\">{}</td><td class=\"l\">{}</td>",
            esc(&l.kind),
            esc(&l.site),
            esc(l.op.as_deref().unwrap_or("–"))
        );
        num_cell(s, &l.waits.to_string(), Some(l.waits as f64));
        num_cell(s, &secs(l.wait_ns), Some(l.wait_ns as f64));
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>\n");
    if sites.len() > MAX_LOCKS {
        let _ = writeln!(
            s,
            "<p class=\"hint\">… {} more lock site(s) in report.json.</p>",
            sites.len() - MAX_LOCKS
        );
    }
}
