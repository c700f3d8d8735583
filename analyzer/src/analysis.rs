//! Runs the model end to end and assembles the [`Report`].

use std::collections::{BTreeMap, HashMap};

use plumber_collector::proto::PipelineSnapshot;
use plumber_collector::report::MeasuredNode;

use crate::amdahl;
use crate::cache::{self, CacheAnalysis};
use crate::elsewhere;
use crate::error::AnalyzeError;
use crate::fmt;
use crate::input::PipelineInput;
use crate::lp::Binding;
use crate::machine::resolve_machine;
pub use crate::machine::MachineOverrides;
use crate::model::{Evaluation, Limit, Limiter, Model, Scenario};
use crate::ops;
use crate::prefetch::{self, PrefetchAnalysis};
use crate::recommend;
use crate::report::*;

/// The result of an analysis.
#[derive(Debug, Clone)]
pub struct Analysis {
    report: Report,
}

impl Analysis {
    /// The report (what report.json holds).
    pub fn report(&self) -> Report {
        self.report.clone()
    }

    pub fn report_ref(&self) -> &Report {
        &self.report
    }

    pub fn into_report(self) -> Report {
        self.report
    }
}

/// Analyses a snapshot (plumber-probe's or Plumber's own stats.pb).
pub fn analyze(
    snapshot: &PipelineSnapshot,
    overrides: &MachineOverrides,
) -> Result<Analysis, AnalyzeError> {
    let input = PipelineInput::from_snapshot(snapshot)?;
    analyze_input(input, overrides)
}

/// Analyses a prepared input (e.g. with lock/GIL wait supplied per op).
pub fn analyze_input(
    input: PipelineInput,
    overrides: &MachineOverrides,
) -> Result<Analysis, AnalyzeError> {
    let mut notes = input.notes.clone();
    let machine = resolve_machine(&input, overrides, &mut notes)?;
    let mut model = Model::build(input, machine, notes);
    let measured = std::mem::take(&mut model.input.measured);
    let base = model.evaluate(&Scenario::default());
    let cache = cache::analyze(&model);
    let prefetch = prefetch::analyze(&model, base.rate);
    let observed = observed_rate(&model);
    let outcome = recommend::recommend(&model, &base, &cache, &prefetch, observed);
    let report = build_report(&model, measured, &base, &cache, &prefetch, outcome);
    tracing::debug!(
        nodes = report.nodes.len(),
        recommendations = report.recommendations.len(),
        "analysis done"
    );
    Ok(Analysis { report })
}

fn fin(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

fn opt(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn bottleneck(m: &Model, base: &Evaluation) -> Option<Bottleneck> {
    let make = |u: usize, reason: Limit, bound: &str, why: String| Bottleneck {
        name: m.nodes[u].name.clone(),
        op: m.nodes[u].op.clone(),
        reason: reason.as_str().into(),
        bound: bound.into(),
        rate: opt(base.rate),
        why,
    };
    match base.limiter {
        Limiter::Op(u) => {
            if let Some((v, why, limit)) = crate::dl_advice::pool_bottleneck(m, base, u) {
                return Some(make(v, limit, "op", why));
            }
            let n = &m.nodes[u];
            let p = base.p_eff[u];
            let why = match n.limit {
                Limit::Gil | Limit::Lock => {
                    let what = if n.limit == Limit::Gil { "the GIL" } else { "a lock" };
                    let share = n.wait_share();
                    let ceiling = if n.sigma > 0.0 { n.r1_eff / n.sigma } else { f64::INFINITY };
                    format!(
                        "its {} thread(s) wait on {what} {} of their time (serial share σ = {}): {} now, at most {} at any parallelism (Amdahl: S(p) = p/(1+σ(p−1)))",
                        fmt::count(p),
                        fmt::pct(share),
                        fmt::num(n.sigma),
                        fmt::rate(opt(base.rate)),
                        fmt::rate(opt(ceiling))
                    )
                }
                _ => format!(
                    "it needs {} CPU-s per root element ({} per core) and runs {} thread(s) ⇒ at most {}",
                    fmt::num(1.0 / n.r1.unwrap_or(f64::INFINITY)),
                    fmt::rate(n.r1),
                    fmt::count(p),
                    fmt::rate(opt(base.rate))
                ),
            };
            let reason = if n.limit == Limit::Io {
                Limit::Cpu
            } else {
                n.limit
            };
            Some(make(u, reason, "op", why))
        }
        Limiter::Io(u) => {
            let n = &m.nodes[u];
            let share = if n.wall_s > 0.0 {
                (1.0 - n.time_s / n.wall_s).clamp(0.0, 1.0)
            } else {
                0.0
            };
            let why = format!(
                "it waits on storage {} of its time; {} read stream(s) deliver at most {}",
                fmt::pct(share),
                fmt::count(base.p_eff[u]),
                fmt::rate(opt(base.rate))
            );
            let reason = if n.limit == Limit::Cpu && share < 0.5 {
                Limit::Cpu
            } else {
                Limit::Io
            };
            Some(make(u, reason, "io", why))
        }
        Limiter::Disk => {
            let reader = m
                .graph()
                .order
                .iter()
                .copied()
                .filter(|&u| m.nodes[u].in_model && m.nodes[u].disk && !m.nodes[u].stale)
                .max_by(|&a, &b| {
                    m.nodes[a]
                        .disk_bytes_per_root
                        .total_cmp(&m.nodes[b].disk_bytes_per_root)
                })?;
            let (_, bytes) = m.disk_bound(&vec![false; m.nodes.len()], m.machine.disk_bandwidth);
            let why = format!(
                "the storage's {}/s at {} per root element allows at most {}",
                fmt::bytes(m.machine.disk_bandwidth.unwrap_or(0.0)),
                fmt::bytes(bytes),
                fmt::rate(opt(base.rate))
            );
            Some(make(reader, Limit::Io, "disk", why))
        }
        Limiter::Cores => {
            let (u, cores) = base
                .cores
                .iter()
                .copied()
                .max_by(|a, b| a.1.total_cmp(&b.1))?;
            let why = format!(
                "the ops together need all {} cores at {}; {} takes the most ({} cores)",
                fmt::count(m.machine.cores),
                fmt::rate(opt(base.rate)),
                m.nodes[u].name,
                fmt::num(cores)
            );
            Some(make(u, Limit::Cpu, "cores", why))
        }
        Limiter::None => None,
    }
}

fn build_report(
    m: &Model,
    measured: plumber_collector::report::MeasuredReport,
    base: &Evaluation,
    cache: &CacheAnalysis,
    pf: &PrefetchAnalysis,
    outcome: recommend::Outcome,
) -> Report {
    let t = m.elapsed_s;
    let cores = m.machine.cores;
    let (summary, measured_nodes) = measured.split_nodes();
    let (slot, orphans) = place_measured(m, measured_nodes);
    let (lp, lp_cores) = lp_report(m);
    let utilisation = utilisation(m);
    let nodes = node_reports(m, slot, orphans, cache, &lp_cores);
    let observed_rate = observed_rate(m);
    let mut notes = report_notes(m, outcome.notes);
    // A DataLoader whose epoch edges (workers starting) take more of the
    // loop's time than its step: the `persistent_workers` advice says so.
    if outcome.elsewhere.is_none()
        && !crate::dl_advice::edges_hold_it(m)
        && observed_rate < 0.5 * base.rate
        && observed_rate > 0.0
    {
        notes.push(format!(
            "the pipeline delivered {} while the model allows {}: the consumer (the training step) may be what sets the pace",
            fmt::rate(Some(observed_rate)),
            fmt::rate(opt(base.rate))
        ));
    }
    let name_of = |i: usize| m.nodes[i].name.clone();
    Report {
        measured: summary,
        cpu_source: m.cpu_source.as_str().into(),
        elapsed_s: t,
        machine: MachineReport {
            cores,
            cores_from: m.machine.cores_from.into(),
            memory_bytes: m.machine.memory,
            memory_from: m.machine.memory_from.into(),
            disk_bandwidth: m.machine.disk_bandwidth,
            disk_bandwidth_from: m.machine.disk_bandwidth_from.into(),
            budget: elsewhere::budget_report(m),
        },
        observed_rate: fin(observed_rate),
        predicted_rate: opt(base.rate),
        assumes: m.machine.assumption(),
        limited_elsewhere: outcome.elsewhere.clone(),
        bottleneck: bottleneck(m, base),
        utilisation,
        lp,
        cache: CacheReport {
            budget_bytes: cache.budget,
            working_set_bytes: cache.working_set,
            node: cache.candidate.map(name_of),
            size_bytes: cache.candidate.and_then(|c| cache.bytes[c]),
            blocked_by: cache
                .blocked
                .iter()
                .map(|&(b, r)| CacheBlock {
                    node: name_of(b),
                    random: name_of(r),
                })
                .collect(),
            existing: cache.existing.map(name_of),
            reason: cache.reason.clone(),
        },
        prefetch: PrefetchReport {
            min_latency_s: fin(pf.min_latency_s),
            rate: fin(pf.rate),
            in_flight_needed: fin(pf.in_flight_needed),
            in_flight: fin(pf.in_flight),
            add: pf.add,
            at: pf.at.map(name_of),
            at_is_prefetch: pf.at_is_prefetch,
        },
        recommendations: outcome.recommendations,
        predictions_scaled_by: outcome.scaled_by,
        ranking: m.ranking.iter().map(|&u| name_of(u)).collect(),
        notes,
        nodes,
    }
}

/// Moves each measured entry to the model node of its name (the first
/// entry of a name wins); the rest match no node.
fn place_measured(
    m: &Model,
    measured_nodes: Vec<MeasuredNode>,
) -> (Vec<Option<MeasuredNode>>, Vec<MeasuredNode>) {
    let g = m.graph();
    let index: HashMap<&str, usize> = g
        .order
        .iter()
        .map(|&u| (m.nodes[u].name.as_str(), u))
        .collect();
    let mut slot: Vec<Option<MeasuredNode>> = vec![None; m.nodes.len()];
    let mut orphans: Vec<MeasuredNode> = Vec::new();
    for mn in measured_nodes {
        match index.get(mn.name.as_str()) {
            Some(&u) if slot[u].is_none() => slot[u] = Some(mn),
            Some(_) => {}
            None => orphans.push(mn),
        }
    }
    (slot, orphans)
}

/// The LP optimum on the pipeline as it is, and each node's LP cores.
fn lp_report(m: &Model) -> (LpReport, Vec<Option<f64>>) {
    let cores = m.machine.cores;
    let sc0 = Scenario::default();
    let (sol, items) = m.solve_lp(&sc0);
    let knobs = m.round_knobs(&sol, &items, &sc0);
    let rounded = Scenario {
        knobs: knobs.iter().map(|(&k, &v)| (k, f64::from(v))).collect(),
        ..Default::default()
    };
    let rounded_rate = m.evaluate(&rounded).cpu_rate;
    let mut lp_cores: Vec<Option<f64>> = vec![None; m.nodes.len()];
    for (&u, &c) in items.iter().zip(&sol.cores) {
        lp_cores[u] = Some(fin(c));
    }
    // Collected (sorted, then built in bulk) rather than inserted one by one.
    let allocation: BTreeMap<String, f64> = items
        .iter()
        .zip(&sol.cores)
        .map(|(&u, &c)| (m.nodes[u].name.clone(), fin(c)))
        .collect();
    let lp = LpReport {
        rate: opt(sol.rate),
        cores,
        binding: match sol.binding {
            Binding::Budget => "cores".into(),
            Binding::Cap(i) => format!("cap:{}", m.nodes[items[i]].name),
            Binding::Unbounded => "none".into(),
        },
        allocation,
        parallelism: knobs
            .iter()
            .map(|(&k, &v)| (m.nodes[k].name.clone(), v))
            .collect(),
        rounded_rate: opt(rounded_rate),
    };
    (lp, lp_cores)
}

fn utilisation(m: &Model) -> Utilisation {
    let (t, cores) = (m.elapsed_s, m.machine.cores);
    let in_model = || m.nodes.iter().filter(|n| n.in_model);
    let time: f64 = in_model().map(|n| n.time_s).sum();
    // A DataLoader's get-item stage reads files too (a PyTorch
    // recording's reads), though it is no file-reading source.
    let disk_bytes: f64 = in_model()
        .filter(|n| n.disk || n.op == ops::DL_GET_ITEM)
        .filter_map(|n| n.stats.as_ref())
        .map(|s| s.disk_bytes_read as f64)
        .sum();
    let (disk_bound, bytes_per_root) =
        m.disk_bound(&vec![false; m.nodes.len()], m.machine.disk_bandwidth);
    let throughput = disk_bytes / t;
    let mf = &m.input.machine;
    Utilisation {
        cpu: fin(time / (cores * t)),
        cores_used: fin(time / t),
        process_cpu: (m.input.process_cpu_ns > 0)
            .then(|| m.input.process_cpu_ns as f64 / 1e9 / (cores * t))
            .and_then(opt),
        disk: m
            .machine
            .disk_bandwidth
            .map(|bw| throughput / bw)
            .and_then(opt),
        disk_throughput: fin(throughput),
        disk_bytes_read: fin(disk_bytes),
        disk_bytes_per_root_element: fin(bytes_per_root),
        disk_bound_rate: disk_bound,
        memory: (mf.memory_total > 0 && mf.memory_free <= mf.memory_total)
            .then(|| 1.0 - mf.memory_free as f64 / mf.memory_total as f64),
    }
}

/// Per-node entries, consumers before inputs; then the stats that match no
/// reachable node, with their measured fields.
fn node_reports(
    m: &Model,
    mut slot: Vec<Option<MeasuredNode>>,
    orphans: Vec<MeasuredNode>,
    cache: &CacheAnalysis,
    lp_cores: &[Option<f64>],
) -> Vec<NodeReport> {
    let g = m.graph();
    let mut edge: Vec<Option<f64>> = vec![None; m.nodes.len()];
    for &u in g.order.iter().rev() {
        let n = &m.nodes[u];
        let own = if n.in_model && !n.stale {
            n.max_rate
        } else {
            None
        };
        edge[u] = g.children(u).fold(own, |acc, c| match (acc, edge[c]) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        });
    }
    let name_of = |i: usize| m.nodes[i].name.clone();
    let mut nodes = Vec::with_capacity(g.order.len());
    for &u in &g.order {
        let n = &m.nodes[u];
        if n.op == ops::RETVAL {
            continue;
        }
        let gn = &g.nodes[u];
        let mn = slot[u].take().unwrap_or_else(|| MeasuredNode {
            name: n.name.clone(),
            op: n.op.clone(),
            parent: gn
                .consumer
                .map(name_of)
                .or_else(|| (u == g.top).then(|| "dataset".into())),
            ..Default::default()
        });
        let contention = (n.lock_s + n.gil_s > 0.0).then(|| Contention {
            lock_wait_s: fin(n.lock_s),
            gil_wait_s: fin(n.gil_s),
            wait_share: fin(n.wait_share()),
            serial_share: fin(n.sigma),
            max_speedup: (n.sigma > 0.0).then(|| 1.0 / n.sigma),
            useful_parallelism: opt(amdahl::useful_parallelism(n.sigma)),
        });
        nodes.push(NodeReport {
            measured: mn,
            inputs: gn.inputs.iter().map(|&c| name_of(c)).collect(),
            function_inputs: gn.fn_roots.iter().map(|&c| name_of(c)).collect(),
            function: gn.function.clone(),
            source: n.source,
            stale: n.stale,
            random: n.random,
            visit_ratio: fin(n.visit),
            rate_per_core: n.r1,
            model_parallelism: fin(n.p_eff),
            max_rate: n.max_rate,
            observed_rate: fin(n.observed_rate),
            edge_rate: edge[u],
            limited_by: if n.max_rate.is_some() {
                n.limit.as_str()
            } else {
                "none"
            }
            .into(),
            rank: n.rank,
            time_s: fin(n.time_s),
            cores_used: fin(n.cores_used),
            busy: fin(n.busy),
            io_rate: n.io_rate,
            contention,
            materialized_bytes: cache.bytes[u],
            lp_cores: lp_cores[u],
        });
    }
    for mn in orphans {
        nodes.push(NodeReport {
            measured: mn,
            limited_by: "none".into(),
            ..Default::default()
        });
    }
    nodes
}

/// The root's rate over the window; without root stats, the slowest op's.
fn observed_rate(m: &Model) -> f64 {
    let (g, t) = (m.graph(), m.elapsed_s);
    m.nodes[g.top]
        .stats
        .as_ref()
        .map(|s| s.elements as f64 / t)
        .unwrap_or_else(|| {
            m.ranking
                .iter()
                .map(|&u| m.nodes[u].observed_rate)
                .reduce(f64::min)
                .unwrap_or(0.0)
        })
}

fn report_notes(m: &Model, outcome_notes: Vec<String>) -> Vec<String> {
    let mut notes = m.notes.clone();
    notes.extend(outcome_notes);
    if m.nodes.iter().any(|n| n.sigma > 0.0) {
        notes.push(
            "ops that wait on a lock or the GIL scale as S(p) = p/(1+σ(p−1)), σ = W/(C·(p₀−1)) from wait W and busy time C at p₀ threads (Karp–Flatt), not linearly"
                .into(),
        );
    }
    notes
}
