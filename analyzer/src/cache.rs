//! Where a `.cache()` fits (plumber-model.md §5): the materialised size of
//! each op's output over one pass, the memory budget, the randomness rule and
//! the op closest to the root that fits.
//!
//! Sizes, bottom-up (never recursive on depth):
//! * a file reader: bytes of the files read to the end, scaled to all files
//!   (`Σ file_sizes / (files_seen / num_files)`), records =
//!   `num_files × records per file opened`; num_files is the cardinality of
//!   the file list feeding the enclosing interleave;
//!   when the list's cardinality is unknown, a reader that reopened a file
//!   in the window has wrapped around its list: the files read are all of
//!   them (the probe's I/O tracking knows each one and its size);
//! * an op with infinite cardinality (-1), or a repeat whose count is not
//!   known: infinite, no cache above it;
//! * an op with a known cardinality: records = cardinality;
//! * otherwise records = input records × outputs per input, and bytes =
//!   records × average output bytes (or the input's bytes scaled, when the op
//!   has no byte counts).
//!
//! Randomness: caching above a random op (Shuffle, a random source, a UDF
//! with a random kernel or a seed attribute) would freeze its output, so a
//! candidate is rejected when anything in its subtree is random. Plumber
//! misses Shuffle (its seed is a tensor); here it counts.

use crate::guard::finite_pos;
use crate::model::Model;
use crate::ops;

/// Share of memory a cache may take (Plumber's FRACTION_CACHEABLE_MEMORY).
pub const CACHEABLE_MEMORY_FRACTION: f64 = 0.9;

#[derive(Debug, Clone, Default)]
pub(crate) struct CacheAnalysis {
    /// Materialised bytes of each node's output (None: unknown or infinite).
    pub bytes: Vec<Option<f64>>,
    pub records: Vec<Option<f64>>,
    pub budget: Option<f64>,
    /// Estimated size of the data read from storage.
    pub working_set: Option<f64>,
    /// Node to insert a cache right above.
    pub candidate: Option<usize>,
    /// (op that fits the budget, random op below it) for candidates rejected
    /// by the randomness rule, closest to the root first.
    pub blocked: Vec<(usize, usize)>,
    /// An existing cache in the pipeline.
    pub existing: Option<usize>,
    /// Why there is no candidate.
    pub reason: Option<String>,
}

pub(crate) fn analyze(model: &Model) -> CacheAnalysis {
    let g = model.graph();
    let n = model.nodes.len();
    let mut out = CacheAnalysis {
        bytes: vec![None; n],
        records: vec![None; n],
        ..Default::default()
    };
    let size_seen: f64 = model.input.file_sizes.iter().map(|(_, s)| *s as f64).sum();
    let files_seen = model.input.file_sizes.len() as f64;
    let below = Below::of(model);
    estimate_sizes(model, &mut out, size_seen, files_seen);

    out.working_set = g
        .order
        .iter()
        .filter(|&&u| model.nodes[u].disk)
        .filter_map(|&u| out.bytes[u])
        .reduce(f64::max)
        .or_else(|| (size_seen > 0.0).then_some(size_seen));
    out.budget = model
        .machine
        .memory
        .map(|m| m * CACHEABLE_MEMORY_FRACTION)
        .and_then(finite_pos);
    out.existing = g
        .order
        .iter()
        .copied()
        .find(|&u| ops::is_cache(&model.nodes[u].op));
    if let Some(e) = out.existing {
        out.reason = Some(format!(
            "the pipeline already caches ({})",
            model.nodes[e].name
        ));
        return out;
    }
    let Some(budget) = out.budget else {
        out.reason = Some("memory size unknown (pass --memory)".into());
        return out;
    };
    pick_candidate(model, &mut out, &below, budget);
    out
}

/// What each node's subtree (inputs and function datasets) holds.
struct Below {
    /// A random op in the subtree (the node itself first).
    random: Vec<Option<usize>>,
    /// Some op in the subtree does work a cache would save.
    work: Vec<bool>,
}

impl Below {
    /// Bottom-up over the graph order.
    fn of(model: &Model) -> Below {
        let g = model.graph();
        let n = model.nodes.len();
        let mut random_below: Vec<Option<usize>> = vec![None; n];
        let mut work_below = vec![false; n];
        for &u in g.order.iter().rev() {
            let node = &model.nodes[u];
            let gn = &g.nodes[u];
            random_below[u] = if node.random {
                Some(u)
            } else {
                gn.inputs
                    .iter()
                    .chain(gn.fn_roots.iter())
                    .find_map(|&c| random_below[c])
            };
            work_below[u] = (node.in_model
                && (node.time_s > 0.0 || node.disk_bytes_per_root > 0.0))
                || gn
                    .inputs
                    .iter()
                    .chain(gn.fn_roots.iter())
                    .any(|&c| work_below[c]);
        }
        Below {
            random: random_below,
            work: work_below,
        }
    }
}

/// Materialised records and bytes of each op's output over one pass,
/// bottom-up (see the module doc).
fn estimate_sizes(model: &Model, out: &mut CacheAnalysis, size_seen: f64, files_seen: f64) {
    let g = model.graph();
    for &u in g.order.iter().rev() {
        let node = &model.nodes[u];
        let gn = &g.nodes[u];
        let Some(st) = &node.stats else { continue };
        let avg_out = if st.elements > 0 && st.bytes_produced > 0 {
            Some(st.bytes_produced as f64 / st.elements as f64)
        } else {
            None
        };
        if node.disk {
            let num_files = file_count(model, u).or_else(|| {
                // The list wrapped around: every file was read in the window.
                (files_seen > 0.0 && st.files_opened as f64 > files_seen).then_some(files_seen)
            });
            if let (Some(nf), true) = (num_files, files_seen > 0.0) {
                let seen_ratio = files_seen / nf;
                out.bytes[u] = finite_pos(size_seen / seen_ratio);
                if st.files_opened > 0 {
                    out.records[u] = finite_pos(nf * st.elements as f64 / st.files_opened as f64);
                }
            }
            continue;
        }
        if st.cardinality == -1 || (ops::is_repeat(&node.op) && st.cardinality <= 0) {
            continue; // infinite: nothing above it can be cached
        }
        if st.cardinality > 0 {
            let r = st.cardinality as f64;
            out.records[u] = Some(r);
            out.bytes[u] = avg_out.map(|a| a * r);
            continue;
        }
        // From the input: a function's top dataset for an interleave or
        // flat_map (the largest), else the first input.
        let child = if gn.fn_roots.is_empty() {
            gn.inputs.first().copied()
        } else {
            gn.fn_roots.iter().copied().max_by(|&a, &b| {
                out.records[a]
                    .unwrap_or(-1.0)
                    .total_cmp(&out.records[b].unwrap_or(-1.0))
            })
        };
        let Some(c) = child else { continue };
        let (Some(cr), cb) = (out.records[c], out.bytes[c]) else {
            continue;
        };
        let el_c = model.nodes[c].stats.as_ref().map_or(0, |s| s.elements);
        let per_input = if st.elements > 0 && el_c > 0 {
            st.elements as f64 / el_c as f64
        } else {
            1.0
        };
        let r = cr * per_input;
        out.records[u] = finite_pos(r);
        out.bytes[u] = avg_out
            .map(|a| a * r)
            .or_else(|| cb.map(|b| b * per_input))
            .and_then(finite_pos);
    }
}

/// The op closest to the root whose output fits the budget, saves work and
/// has nothing random below it; the ones rejected for randomness on the
/// way, or why there is none.
fn pick_candidate(model: &Model, out: &mut CacheAnalysis, below: &Below, budget: f64) {
    let g = model.graph();
    let mut any_size = false;
    for &u in &g.order {
        let node = &model.nodes[u];
        if g.nodes[u].function.is_some()
            || node.stale
            || !node.in_model
            || !ops::can_cache_after(&node.op)
        {
            continue;
        }
        let Some(b) = out.bytes[u] else { continue };
        any_size = true;
        if b > budget || !below.work[u] {
            continue;
        }
        if let Some(r) = below.random[u] {
            out.blocked.push((u, r));
            continue;
        }
        out.candidate = Some(u);
        break;
    }
    if out.candidate.is_none() {
        out.reason = Some(if !any_size {
            "no op's materialised size could be estimated (needs the file list's length, or a recording long enough for the reader to go through every file)".into()
        } else if !out.blocked.is_empty() {
            "every op that fits is above a random op".into()
        } else {
            "no op's output fits the memory budget".into()
        });
    }
}

/// Number of files a reader goes through per pass: the cardinality of the
/// file list feeding the interleave (or flat_map) whose function builds the
/// reader.
fn file_count(model: &Model, u: usize) -> Option<f64> {
    let g = model.graph();
    let owner = model.nodes[u].interleave_owner.or_else(|| {
        g.order
            .iter()
            .copied()
            .find(|&o| g.nodes[o].fn_roots.contains(&u))
    })?;
    let mut cur = g.nodes[owner].inputs.first().copied();
    let mut steps = 0;
    while let Some(c) = cur {
        if let Some(st) = &model.nodes[c].stats {
            if st.cardinality > 0 {
                return Some(st.cardinality as f64);
            }
        }
        steps += 1;
        if steps > 64 {
            break;
        }
        cur = g.nodes[c].inputs.first().copied();
    }
    None
}
