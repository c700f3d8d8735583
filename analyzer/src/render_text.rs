//! report.txt: the verdict first, then the ranked ops with the numbers
//! behind the ranking, then what to change with the predicted rate after
//! each change. Meant to be read in ten seconds.

use std::fmt::Write as _;

use crate::fmt;
use crate::report::{NodeReport, Recommendation, Report};

/// Rows of the ranked-ops table before "... N more".
const MAX_ROWS: usize = 12;

pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    verdict(&mut s, r);
    ranked_table(&mut s, r);
    let _ = writeln!(s);
    what_to_change(&mut s, r);
    lp_lines(&mut s, r);
    utilisation_line(&mut s, r);
    if is_dataloader(r) {
        // A DataLoader has no cache to add, and its prefetch is its queue.
        dataloader_prefetch_line(&mut s, r);
    } else {
        cache_lines(&mut s, r);
        prefetch_line(&mut s, r);
    }
    notes(&mut s, r);
    s
}

/// The window and machine, then the bottleneck with observed and model rates.
fn verdict(s: &mut String, r: &Report) {
    let cpu = match r.cpu_source.as_str() {
        "cpu_clock" => "thread CPU time",
        _ => "wall time (no CPU time in the file)",
    };
    let cores = if r.machine.budget.other_processes_cores.is_some() {
        format!(
            "{} of {} cores free",
            fmt::num(r.machine.cores),
            fmt::count(r.machine.budget.cores)
        )
    } else {
        format!("{} cores", fmt::count(r.machine.cores))
    };
    let _ = writeln!(
        s,
        "plumber-probe analysis: {} s window, {cores} ({}), rates from {cpu}",
        fmt::num(r.elapsed_s),
        r.machine.cores_from
    );
    let _ = writeln!(
        s,
        "Rates are root elements per second (what the training loop receives)."
    );
    budget_line(s, r);
    let _ = writeln!(s);

    match &r.bottleneck {
        Some(b) => {
            let _ = writeln!(
                s,
                "BOTTLENECK  {} bounds the pipeline at {} — {}",
                b.name,
                fmt::rate(b.rate),
                reason_word(&b.reason, &b.bound)
            );
            let _ = writeln!(s, "            {}", b.why);
        }
        None => {
            let _ = writeln!(s, "BOTTLENECK  none found: no op has measured time");
        }
    }
    let _ = writeln!(
        s,
        "            observed {} · model {}",
        fmt::rate(Some(r.observed_rate)),
        fmt::rate(r.predicted_rate)
    );
    let _ = writeln!(s);
}

/// A file without the process's CPU figures (Plumber's own) has no budget
/// terms to show: its cores are the budget.
fn has_terms(r: &Report) -> bool {
    let b = &r.machine.budget;
    b.other_processes_cores.is_some() || b.quota_cores.is_some() || b.outside_pipeline_cores > 0.0
}

/// The core budget's terms: what the pipeline could get during the window.
fn budget_line(s: &mut String, r: &Report) {
    let b = &r.machine.budget;
    if !has_terms(r) {
        return;
    }
    let mut parts = vec![format!("{} cores", fmt::count(b.cores))];
    if let Some(q) = b.quota_cores {
        parts.push(format!("quota {}", fmt::num(q)));
    }
    match b.other_processes_cores {
        Some(o) => parts.push(format!("− {} other processes", fmt::num(o))),
        None => parts.push("other processes not measured".into()),
    }
    let fixed = if b.fixed_outside_cores > 0.0 {
        format!(
            " ({} of it fixed per second)",
            fmt::num(b.fixed_outside_cores)
        )
    } else {
        String::new()
    };
    parts.push(format!(
        "− {} outside the pipeline{fixed}",
        fmt::num(b.outside_pipeline_cores)
    ));
    if b.unattributed_cores >= 0.005 {
        parts.push(format!(
            "− {} pipeline threads without an op",
            fmt::num(b.unattributed_cores)
        ));
    }
    let _ = writeln!(
        s,
        "CORES       {} = {} for the pipeline's ops",
        parts.join(" "),
        fmt::num(b.pipeline_cores)
    );
}

/// The recommendations, numbered, each with its predicted rate and why.
fn what_to_change(s: &mut String, r: &Report) {
    let _ = writeln!(s, "WHAT TO CHANGE");
    if let Some(e) = &r.limited_elsewhere {
        let _ = writeln!(s, "  not the pipeline ({}): {}", e.by, e.why);
    }
    if r.recommendations.is_empty() {
        let _ = writeln!(s, "  nothing the model can improve");
    } else if has_terms(r) {
        let _ = writeln!(s, "  predictions {}", r.assumes);
    }
    for (i, rec) in r.recommendations.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {}. {:<11} {} {}  ⇒ {}",
            i + 1,
            rec.kind,
            rec.node,
            value_text(rec),
            fmt::rate(rec.predicted_rate)
        );
        let _ = writeln!(s, "     {}", rec.why);
        if let Some(extra) = extra_assumption(r, rec) {
            let _ = writeln!(s, "     note: {extra}");
        }
    }
    let _ = writeln!(s);
}

/// What a recommendation assumes beyond the report's common line (that
/// the consumer's charge, measured far below the predicted rate, decides
/// it); None when nothing.
pub(crate) fn extra_assumption<'a>(r: &Report, rec: &'a Recommendation) -> Option<&'a str> {
    rec.assumes
        .strip_prefix(r.assumes.as_str())
        .map(|x| x.trim_start_matches("; ").trim())
        .filter(|x| !x.is_empty())
}

/// The LP's rate and largest allocations, then its rounded parallelism.
fn lp_lines(s: &mut String, r: &Report) {
    let lp = &r.lp;
    // The six largest allocations, without sorting them all.
    let mut top: Vec<(&String, f64)> = Vec::with_capacity(7);
    for (n, &t) in &lp.allocation {
        if top.len() < 6 || top.last().is_some_and(|l| t > l.1) {
            top.push((n, t));
            top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
            top.truncate(6);
        }
    }
    let shown: Vec<String> = top
        .iter()
        .map(|(n, t)| format!("{n} {}", fmt::num(*t)))
        .collect();
    let more = if lp.allocation.len() > 6 {
        format!(", ... {} more", lp.allocation.len() - 6)
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "LP          {} with {} cores (bound by {}): {}{more}",
        fmt::rate(lp.rate),
        fmt::count(lp.cores),
        binding_text(&lp.binding),
        if shown.is_empty() {
            "no op to allocate".to_string()
        } else {
            shown.join(", ")
        }
    );
    rounded_line(s, r);
}

/// Rounded parallelism where it differs from the current one.
fn rounded_line(s: &mut String, r: &Report) {
    let lp = &r.lp;
    let current: std::collections::HashMap<&str, f64> = r
        .nodes
        .iter()
        .filter(|n| lp.parallelism.contains_key(&n.measured.name))
        .map(|n| (n.measured.name.as_str(), n.model_parallelism))
        .collect();
    let changed: Vec<String> = lp
        .parallelism
        .iter()
        .filter_map(|(n, v)| {
            let cur = current.get(n.as_str()).copied().unwrap_or(1.0);
            ((f64::from(*v) - cur).abs() > 1e-9).then(|| format!("{n} {} → {v}", fmt::count(cur)))
        })
        .collect();
    if !changed.is_empty() {
        let _ = writeln!(
            s,
            "            rounded: {}{} ⇒ {} (CPU only)",
            changed
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if changed.len() > 8 { ", ..." } else { "" },
            fmt::rate(lp.rounded_rate)
        );
    }
}

/// CPU and disk use over the window.
fn utilisation_line(s: &mut String, r: &Report) {
    let u = &r.utilisation;
    let disk = match (u.disk, r.machine.disk_bandwidth) {
        (Some(d), Some(bw)) => format!(
            "disk {}/s = {} of {}/s (allows {})",
            fmt::bytes(u.disk_throughput),
            fmt::pct(d),
            fmt::bytes(bw),
            fmt::rate(u.disk_bound_rate)
        ),
        _ if u.disk_bytes_read > 0.0 => format!(
            "disk {}/s (bandwidth unknown)",
            fmt::bytes(u.disk_throughput)
        ),
        _ => "no disk reads".to_string(),
    };
    let _ = writeln!(
        s,
        "UTILISATION CPU {} ({} of {} cores) · {disk}",
        fmt::pct(u.cpu),
        fmt::num(u.cores_used),
        fmt::count(r.machine.cores)
    );
}

/// Where a cache fits, or why none does, and the first ops it may not follow.
fn cache_lines(s: &mut String, r: &Report) {
    let c = &r.cache;
    let cache_line = match (&c.node, c.size_bytes) {
        (Some(n), Some(b)) => format!(
            "after {n}: about {} of a {} budget",
            fmt::bytes(b),
            fmt::bytes(c.budget_bytes.unwrap_or(0.0))
        ),
        _ => format!(
            "no candidate: {}",
            c.reason.clone().unwrap_or_else(|| "none".into())
        ),
    };
    let _ = writeln!(s, "CACHE       {cache_line}");
    for b in c.blocked_by.iter().take(3) {
        if b.node == b.random {
            let _ = writeln!(
                s,
                "            not after {}: it fits, but is random itself",
                b.node
            );
        } else {
            let _ = writeln!(
                s,
                "            not after {}: it fits, but {} below it is random",
                b.node, b.random
            );
        }
    }
}

/// Elements in flight needed (Little's law) against those there now.
fn prefetch_line(s: &mut String, r: &Report) {
    let p = &r.prefetch;
    let _ = writeln!(
        s,
        "PREFETCH    {} in flight needed at {} (Σ 1/R1 = {} s), {} now{}",
        fmt::num(p.in_flight_needed),
        fmt::rate(Some(p.rate)),
        fmt::num(p.min_latency_s),
        fmt::num(p.in_flight),
        match (p.add, &p.at) {
            (0, _) => String::new(),
            (1, Some(at)) if p.at_is_prefetch => format!(": add 1, which {at} covers"),
            (k, _) => format!(": add {k}"),
        }
    );
}

/// The report is of a PyTorch DataLoader chain.
pub(crate) fn is_dataloader(r: &Report) -> bool {
    r.nodes
        .iter()
        .any(|n| crate::ops::is_dataloader(&n.measured.op))
}

/// Batches in flight needed (Little's law): what the workers and their
/// queue (`prefetch_factor × num_workers`) must hold.
fn dataloader_prefetch_line(s: &mut String, r: &Report) {
    let p = &r.prefetch;
    let _ = writeln!(
        s,
        "PREFETCH    {} batches in flight needed at {} (Σ 1/R1 = {} s); the DataLoader holds up to prefetch_factor × num_workers",
        fmt::num(p.in_flight_needed),
        fmt::rate(Some(p.rate)),
        fmt::num(p.min_latency_s),
    );
}

/// The analysis notes, then what the recording did not measure.
fn notes(s: &mut String, r: &Report) {
    if !r.notes.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "NOTES");
        for n in &r.notes {
            let _ = writeln!(s, "  - {n}");
        }
    }
    let missing = plumber_collector::report::not_measured_note(&r.measured.not_measured);
    if !missing.is_empty() {
        let _ = writeln!(s);
        s.push_str(&missing);
    }
}

fn visit(v: f64) -> String {
    fmt::count(v)
}

pub(crate) fn binding_text(b: &str) -> String {
    match b.strip_prefix("cap:") {
        Some(n) => format!("{n}'s parallelism cap"),
        None if b == "cores" => "the core budget".into(),
        None => b.into(),
    }
}

pub(crate) fn reason_word(reason: &str, bound: &str) -> String {
    let r = match reason {
        "cpu" => "CPU",
        "io" => "I/O",
        "lock" => "lock",
        "gil" => "GIL",
        other => other,
    };
    match bound {
        "cores" => format!("{r} (all cores busy)"),
        "disk" => format!("{r} (storage bandwidth)"),
        _ => r.to_string(),
    }
}

pub(crate) fn value_text(rec: &Recommendation) -> String {
    match rec.unit.as_str() {
        "threads" => format!("→ {} threads", fmt::count(rec.value)),
        "workers" => format!("→ num_workers={}", fmt::count(rec.value)),
        "prefetch_factor" => format!("→ prefetch_factor={}", fmt::count(rec.value)),
        "parallel reads" => format!("→ {} parallel reads", fmt::count(rec.value)),
        "bytes/s" => format!("needs {}/s", fmt::bytes(rec.value)),
        "serial share" => format!("(σ = {})", fmt::num(rec.value)),
        "elements" => format!("buffer {}", fmt::count(rec.value)),
        "bytes" => format!("≈ {}", fmt::bytes(rec.value)),
        _ => fmt::num(rec.value),
    }
}

fn ranked_table(s: &mut String, r: &Report) {
    let _ = writeln!(s, "RANKED OPS (lowest max rate first)");
    let shown: std::collections::HashSet<&str> = r
        .ranking
        .iter()
        .take(MAX_ROWS)
        .map(String::as_str)
        .collect();
    let by_name: std::collections::HashMap<&str, &NodeReport> = r
        .nodes
        .iter()
        .filter(|n| shown.contains(n.measured.name.as_str()))
        .map(|n| (n.measured.name.as_str(), n))
        .collect();
    let header = [
        "#", "op", "limit", "visit", "per core", "threads", "max rate", "observed", "cores",
    ];
    let mut rows: Vec<[String; 9]> = Vec::new();
    for (i, name) in r.ranking.iter().take(MAX_ROWS).enumerate() {
        let Some(n) = by_name.get(name.as_str()) else {
            continue;
        };
        rows.push([
            (i + 1).to_string(),
            name.clone(),
            n.limited_by.clone(),
            visit(n.visit_ratio),
            fmt::rate(n.rate_per_core),
            fmt::count(n.model_parallelism),
            fmt::rate(n.max_rate),
            fmt::rate(Some(n.observed_rate)),
            fmt::num(n.cores_used),
        ]);
    }
    let mut w = header.map(|h| h.chars().count());
    for row in &rows {
        for (i, c) in row.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut l = String::from(" ");
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            l.push(' ');
            l.push_str(c);
            if i + 1 < cells.len() {
                l.push_str(&" ".repeat(pad + 1));
            }
        }
        l
    };
    let _ = writeln!(s, "{}", line(&header.map(String::from)));
    for row in &rows {
        let _ = writeln!(s, "{}", line(row));
    }
    if r.ranking.len() > MAX_ROWS {
        let _ = writeln!(
            s,
            "   ... {} more op(s) in report.json",
            r.ranking.len() - MAX_ROWS
        );
    }
    let unbounded: Vec<&str> = r
        .nodes
        .iter()
        .filter(|n| {
            n.rank.is_none() && !n.stale && n.max_rate.is_none() && !n.measured.op.is_empty()
        })
        .map(|n| n.measured.name.as_str())
        .take(6)
        .collect();
    if !unbounded.is_empty() {
        let _ = writeln!(
            s,
            "   not ranked (no time measured or no stats): {}",
            unbounded.join(", ")
        );
    }
}
