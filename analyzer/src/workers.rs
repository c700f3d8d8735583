//! A PyTorch DataLoader's worker pool in the model.
//!
//! With `num_workers = W` the loader runs W processes. Each takes a
//! batch's indices, runs the dataset's `__getitem__` for every sample of
//! it (GetItemDataset) and then the collate function (CollateDataset), one
//! after the other, in the same process. Without workers the training loop
//! does the same itself, on its one thread. So the two ops are not two
//! thread pools: a worker busy getting items is not collating, and one
//! knob, `num_workers`, sets the parallelism of both.
//!
//! At a rate of X batches/s the pool needs X·(1/r_g + 1/r_c) workers, r_g
//! and r_c being one worker's rate (batches/s) on each stage. Two LP items
//! of W threads each would instead predict min(W·r_g, W·r_c), as if every
//! worker did both at once, and ask for the larger of the two thread counts
//! only, up to half the workers needed. The simplest honest treatment is
//! one parallel stage: the LP and the evaluation see one item, anchored on
//! CollateDataset (the knob), whose per-thread time per batch is the sum
//! of both stages', whose CPU per batch is the sum too, and whose serial
//! share is the time-weighted mean of theirs (exact under Amdahl, both
//! stages running at the same W). GetItemDataset keeps its own row in the
//! ranking (its rate alone); its knob is CollateDataset's, so a
//! recommendation gives one `num_workers`, the stage's, which is at least
//! what either op would want alone.

use crate::amdahl;
use crate::lp::LpItem;
use crate::ops;

/// The two ops the workers run, by node index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pool {
    pub collate: usize,
    pub get_item: usize,
}

impl Pool {
    /// The node whose knob value sets `u`'s parallelism: the pool's knob for
    /// its two ops, `u` itself otherwise.
    pub fn knob_key(self, u: usize) -> usize {
        if u == self.get_item {
            self.collate
        } else {
            u
        }
    }
}

/// The pool of a DataLoader chain: a CollateDataset whose input is a
/// GetItemDataset (`op(u)`: node u's op). Both take Collate's knob
/// ([`Pool::knob_key`]).
pub(crate) fn find<'a>(
    op: impl Fn(usize) -> &'a str,
    g: &crate::graph::PipelineGraph,
) -> Option<Pool> {
    let collate = g
        .order
        .iter()
        .copied()
        .find(|&u| op(u) == ops::DL_COLLATE)?;
    let get_item = g.nodes[collate]
        .inputs
        .iter()
        .copied()
        .find(|&c| op(c) == ops::DL_GET_ITEM)?;
    Some(Pool { collate, get_item })
}

/// Drops GetItem from the LP's ops when Collate is there too: its work is
/// in Collate's item ([`merge`]).
pub(crate) fn fold_active(pool: Option<Pool>, active: &mut Vec<usize>) {
    if let Some(p) = pool {
        if active.contains(&p.collate) {
            active.retain(|&u| u != p.get_item);
        }
    }
}

/// One item for both stages: times per batch add up.
pub(crate) fn merge(c: LpItem, g: LpItem) -> LpItem {
    let inv = |r: f64| if r > 0.0 { 1.0 / r } else { 0.0 };
    let (tc, tg) = (inv(c.rate_per_core), inv(g.rate_per_core));
    let t = tc + tg;
    let cpu = inv(c.cpu_rate) + inv(g.cpu_rate);
    let serial_share = if t > 0.0 {
        (c.serial_share * tc + g.serial_share * tg) / t
    } else {
        0.0
    };
    // Each cap is the useful point of a stage that waits (never under its
    // workers now), else the cores. The stage's own useful point rules
    // where it waits: a stage that cannot be scaled past it (workers that
    // serialise on a lock in `__getitem__`) is not given more workers
    // for the part that could.
    let most = c.cap.max(g.cap);
    let cap = if serial_share > 0.0 {
        amdahl::useful_parallelism(serial_share)
            .max(c.cap.min(g.cap))
            .min(most)
    } else {
        most
    };
    LpItem {
        rate_per_core: inv(t),
        cpu_rate: inv(cpu),
        serial_share,
        cap,
    }
}

/// Whether the chain has started workers: a WorkerQueueDataset is written
/// only with `num_workers > 0` (parallelism 1 stands for both 0 and 1).
/// `ops`: the chain's op names.
pub(crate) fn started<'a>(mut ops: impl Iterator<Item = &'a str>) -> bool {
    ops.any(|o| o == ops::DL_QUEUE)
}

/// The pipeline is a DataLoader chain (`ops`: its op names).
pub(crate) fn is_chain<'a>(mut ops: impl Iterator<Item = &'a str>) -> bool {
    ops.any(ops::is_dataloader)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_stage_adds_times() {
        let c = LpItem {
            rate_per_core: 10.0,
            cpu_rate: 10.0,
            serial_share: 0.0,
            cap: 4.0,
        };
        let g = LpItem {
            rate_per_core: 10.0,
            cpu_rate: 20.0,
            serial_share: 0.2,
            cap: 4.0,
        };
        let m = merge(c, g);
        assert!((m.rate_per_core - 5.0).abs() < 1e-12);
        assert!((m.cpu_rate - 1.0 / 0.15).abs() < 1e-9);
        assert!((m.serial_share - 0.1).abs() < 1e-12);
        assert_eq!(m.cap, 4.0);
        // A stage that waits most of its time: the merged stage's useful
        // point (σ = 0.45: 3), not the cores the other stage could use.
        let g = LpItem {
            serial_share: 0.9,
            cap: 2.0,
            ..g
        };
        let c = LpItem { cap: 8.0, ..c };
        let m = merge(c, g);
        assert_eq!(m.cap, 3.0);
        // Neither waits: the cores.
        let g = LpItem {
            serial_share: 0.0,
            ..g
        };
        let m = merge(
            LpItem {
                serial_share: 0.0,
                ..c
            },
            g,
        );
        assert_eq!(m.cap, 8.0);
    }
}
