//! Prefetching by Little's law (plumber-model.md §6, Plumber's roofline):
//!
//! ```text
//!   N* = R_min · X        elements in flight needed to sustain rate X
//!   N  = W / T            elements in flight now (busy wall time / window)
//!   k  = ⌈max(N* − N, 0)⌉ elements of prefetch to add
//! ```
//!
//! R_min = Σ 1/R1 (the CPU-seconds one root element takes through every
//! op), X = the rate the model predicts for the pipeline as it is. The
//! buffer goes above the first op from the root that does work. Unlike
//! Plumber, an existing PrefetchDataset is never shrunk: one with a buffer is
//! left alone unless more than one element is missing.

use crate::model::Model;
use crate::ops;

#[derive(Debug, Clone, Default)]
pub(crate) struct PrefetchAnalysis {
    pub min_latency_s: f64,
    pub rate: f64,
    pub in_flight_needed: f64,
    pub in_flight: f64,
    /// k.
    pub add: u32,
    /// Op above which the buffer goes (or the existing PrefetchDataset).
    pub at: Option<usize>,
    pub at_is_prefetch: bool,
}

impl PrefetchAnalysis {
    /// Whether a recommendation is worth making.
    pub fn recommend(&self) -> bool {
        self.at.is_some() && (self.add > 1 || (self.add == 1 && !self.at_is_prefetch))
    }
}

pub(crate) fn analyze(model: &Model, rate: f64) -> PrefetchAnalysis {
    let min_latency_s: f64 = model
        .ranking
        .iter()
        // One element's time through each op: off a core too where its
        // threads wait there (a DataLoader stage's reads).
        .filter_map(|&u| model.nodes[u].thread_r1())
        .map(|r| 1.0 / r)
        .filter(|s| s.is_finite())
        .sum();
    let rate = if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        1e-6
    };
    let in_flight_needed = min_latency_s * rate;
    let wall: f64 = model
        .nodes
        .iter()
        .filter(|n| n.in_model)
        .map(|n| n.wall_s)
        .sum();
    let in_flight = wall / model.elapsed_s;
    let gap = in_flight_needed - in_flight;
    let add = if gap.is_finite() && gap > 1e-9 {
        let c = gap.ceil();
        if c >= u32::MAX as f64 {
            u32::MAX
        } else {
            c as u32
        }
    } else {
        0
    };
    // First op from the root, along first inputs, that does work.
    let g = model.graph();
    let mut cur = Some(g.top);
    let mut at = None;
    let mut steps = 0;
    while let Some(u) = cur {
        let n = &model.nodes[u];
        if !ops::is_wrapper(&n.op) && n.in_model && n.time_s > 0.0 {
            at = Some(u);
            break;
        }
        steps += 1;
        if steps > 64 {
            break;
        }
        cur = g.nodes[u].inputs.first().copied();
    }
    PrefetchAnalysis {
        min_latency_s,
        rate,
        in_flight_needed,
        in_flight,
        add,
        at,
        at_is_prefetch: at.is_some_and(|u| ops::is_prefetch(&model.nodes[u].op)),
    }
}
