//! Walks TensorFlow's autotune model (the tree of `model::Node`s, one per
//! iterator) in the target's memory. Every object is validated before it is
//! trusted: a plausible name, a positive id, and consistent parent links. A
//! node freed under us fails validation and is skipped, never reported.

use plumber_collector::event::{NodeCounters, NodeObservation};
use thiserror::Error;

use crate::layout::NodeLayout;
use crate::mem::{word_at, MemError, Memory};

/// Ops whose inputs after the first are datasets built by their function
/// (per input element), not their input dataset.
const FUNCTION_OWNERS: &[&str] = &[
    "FlatMap",
    "Interleave",
    "ParallelInterleaveV2",
    "ParallelInterleaveV3",
    "ParallelInterleaveV4",
    "ParallelInterleave",
    "LegacyParallelInterleaveV2",
    "GroupByWindow",
    "ChooseFastestBranch",
];

/// More nodes than this in one pipeline means we are reading garbage.
const MAX_NODES: usize = 4096;
const MAX_DEPTH: usize = 256;

#[derive(Debug, Error)]
pub enum WalkError {
    #[error("node at {addr:#x} is not a valid model node: {why}")]
    Invalid { addr: u64, why: String },
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// One node read from memory.
#[derive(Debug, Clone)]
pub struct RawNode {
    pub addr: u64,
    pub id: i64,
    pub name: String,
    pub parent: u64,
    pub counters: NodeCounters,
}

pub struct ModelReader {
    mem: Memory,
    l: NodeLayout,
    /// The part of a node that holds the fields read, [lo, hi) from its
    /// start (the name's string header is 32 bytes, the rest 8).
    span: (u32, u32),
}

fn plausible_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl ModelReader {
    pub fn new(mem: Memory, layout: NodeLayout) -> Self {
        let l = &layout;
        let words = [
            l.id,
            l.output,
            l.num_elements,
            l.bytes_produced,
            l.bytes_consumed,
            l.processing_time,
            l.buffered_elements,
            l.buffered_bytes,
        ];
        let lo = words.iter().copied().chain([l.name]).min().unwrap_or(0);
        let hi = words
            .iter()
            .map(|o| o + 8)
            .chain([l.name + 32])
            .max()
            .unwrap_or(0);
        ModelReader {
            mem,
            l: layout,
            span: (lo, hi),
        }
    }

    pub fn node(&self, addr: u64) -> Result<RawNode, WalkError> {
        let invalid = |why: &str| WalkError::Invalid {
            addr,
            why: why.to_string(),
        };
        if addr == 0 || !addr.is_multiple_of(8) {
            return Err(invalid("null or misaligned"));
        }
        // The fields in one read, not one each: a poll reads every node,
        // and each read of ours is a system call that takes the target's
        // memory-map lock. One read is also one consistent-ish moment.
        let (lo, hi) = self.span;
        let mut buf = vec![0u8; (hi - lo) as usize];
        self.mem.read(addr + lo as u64, &mut buf)?;
        let rd = |off: u32| word_at(&buf, (off - lo) as usize) as i64;
        let id = rd(self.l.id);
        if !(0..1 << 40).contains(&id) {
            return Err(invalid("id out of range"));
        }
        // libstdc++ std::string {char* p; size_t len; ...}: short names
        // are in the node, already read.
        let header = (rd(self.l.name) as u64, rd(self.l.name + 8) as u64);
        let name = self
            .mem
            .std_string_from(
                addr + self.l.name as u64,
                header,
                64,
                (addr + lo as u64, &buf),
            )
            .map_err(|_| invalid("name is not a string"))?;
        if !plausible_name(&name) {
            return Err(invalid("implausible name"));
        }
        Ok(RawNode {
            addr,
            id,
            name,
            parent: rd(self.l.output) as u64,
            counters: NodeCounters {
                num_elements: rd(self.l.num_elements),
                bytes_produced: rd(self.l.bytes_produced),
                bytes_consumed: rd(self.l.bytes_consumed),
                processing_time_ns: rd(self.l.processing_time),
                buffered_elements: rd(self.l.buffered_elements),
                buffered_bytes: rd(self.l.buffered_bytes),
            },
        })
    }

    /// `std::list<std::shared_ptr<Node>> inputs_`: libstdc++ list header
    /// {next, prev, size}; each list node {next, prev, shared_ptr{ptr, ctrl}}.
    pub fn inputs(&self, addr: u64) -> Result<Vec<u64>, WalkError> {
        let head = addr + self.l.inputs as u64;
        let size = self.mem.u64(head + 16)?;
        if size > 1024 {
            return Err(WalkError::Invalid {
                addr,
                why: format!("{size} inputs"),
            });
        }
        let mut out = Vec::with_capacity(size as usize);
        let mut p = self.mem.u64(head)?;
        while p != head && out.len() < size as usize {
            out.push(self.mem.u64(p + 16)?);
            p = self.mem.u64(p)?;
        }
        Ok(out)
    }

    /// Climbs `output_` links to the root node.
    pub fn root_of(&self, node: u64) -> Result<u64, WalkError> {
        let mut cur = node;
        for _ in 0..MAX_DEPTH {
            let n = self.node(cur)?;
            if n.parent == 0 {
                return Ok(cur);
            }
            cur = n.parent;
        }
        Err(WalkError::Invalid {
            addr: node,
            why: "no root within 256 levels".into(),
        })
    }

    /// Reads the whole tree under `root`, root first. Children that fail
    /// validation (freed while we read) are skipped and counted.
    pub fn walk(&self, root: u64) -> Result<(Vec<NodeObservation>, u64), WalkError> {
        let r = self.node(root)?;
        let mut out = Vec::new();
        let mut skipped = 0u64;
        // (node, parent addr, path of parent, in_function)
        let mut stack: Vec<(RawNode, Option<u64>, String, bool)> =
            vec![(r, None, String::new(), false)];
        while let Some((n, parent, ppath, in_function)) = stack.pop() {
            if out.len() >= MAX_NODES {
                return Err(WalkError::Invalid {
                    addr: root,
                    why: format!("more than {MAX_NODES} nodes"),
                });
            }
            let path = if ppath.is_empty() {
                n.name.clone()
            } else {
                format!("{ppath}::{}", n.name)
            };
            let owner = FUNCTION_OWNERS.contains(&n.name.as_str());
            // An unreadable inputs list loses the subtree: count it.
            let inputs = self.inputs(n.addr).unwrap_or_else(|_| {
                skipped += 1;
                Vec::new()
            });
            let mut kids = Vec::new();
            for (i, c) in inputs.iter().enumerate() {
                match self.node(*c) {
                    // A child whose output_ is not this node is stale.
                    Ok(cn) if cn.parent == n.addr => {
                        kids.push((cn, Some(n.addr), path.clone(), owner && i > 0))
                    }
                    _ => skipped += 1,
                }
            }
            out.push(NodeObservation {
                addr: n.addr,
                id: n.id,
                name: n.name,
                path,
                parent,
                in_function,
                counters: n.counters,
                parallelism: None,
                ratio: None,
                buffer_size: None,
            });
            // Reverse so the first input is walked first (stable order).
            stack.extend(kids.into_iter().rev());
        }
        Ok((out, skipped))
    }
}

/// Turns an iterator prefix (`Iterator::Root::Prefetch::FlatMap[3]::TFRecord`)
/// into a stable op path (`Root::Prefetch::FlatMap::TFRecord`).
pub fn stable_path(prefix: &str) -> String {
    let p = prefix.strip_prefix("Iterator::").unwrap_or(prefix);
    let mut out = String::with_capacity(p.len());
    let mut depth = 0;
    for ch in p.chars() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out
}

/// Fills each observed node's parallelism, and a prefetch's buffer size,
/// from its iterator's `SharedState` knob (`iter_of`: node address ->
/// iterator address), where the layout knows the op and the iterator still
/// owns the node.
pub fn fill_parallelism(
    mem: &Memory,
    obs: &mut [NodeObservation],
    iter_of: &std::collections::HashMap<u64, u64>,
    il: &crate::layout::IteratorLayout,
) {
    for n in obs.iter_mut() {
        let Some(&it) = iter_of.get(&n.addr) else {
            continue;
        };
        // The iterator must still own this node (not freed and reused).
        if mem.u64(it + il.node as u64).ok() != Some(n.addr) {
            continue;
        }
        let knob = |off: Option<&u32>| {
            let off = *off?;
            let v = mem.u64(it + off as u64).and_then(|ss| mem.f64(ss)).ok()?;
            (v.is_finite() && (1.0..=65536.0).contains(&v)).then_some(v)
        };
        if let Some(v) = knob(il.parallelism.get(&n.name)) {
            n.parallelism = Some(v);
        }
        // A buffer size is a whole number of elements; 0 is what a
        // prefetch left to its own (legacy) autotuner holds: unknown.
        if let Some(v) = knob(il.buffer_size.get(&n.name)).filter(|v| v.fract() == 0.0) {
            n.buffer_size = Some(v);
        }
    }
}

/// Model node names of the batch ops: their model node is a known-ratio
/// node whose ratio is the batch size.
const BATCH_NODES: &[&str] = &[
    "Batch",
    "BatchV2",
    "PaddedBatch",
    "PaddedBatchV2",
    "MapAndBatch",
    "ParallelBatch",
];

/// Batches a node must have produced before its ratio is checked against
/// the counts (and so used).
const MIN_BATCHES_CHECKED: i64 = 8;

/// Fills the ratio of batch nodes whose class (`classes`: runtime vptr,
/// offset of the ratio) is known, when the counts agree with it.
pub fn fill_ratios(mem: &Memory, obs: &mut [NodeObservation], classes: &[(u64, u32)]) {
    if classes.is_empty() {
        return;
    }
    for i in 0..obs.len() {
        let n = &obs[i];
        if !BATCH_NODES.contains(&n.name.as_str()) {
            continue;
        }
        let Some(off) = mem
            .u64(n.addr)
            .ok()
            .and_then(|vptr| classes.iter().find(|(v, _)| *v == vptr))
            .map(|(_, off)| *off)
        else {
            continue;
        };
        let Ok(r) = mem.f64(n.addr + off as u64) else {
            continue;
        };
        // The op's input: its first child, walked first.
        let inputs = obs
            .iter()
            .find(|c| c.parent == Some(n.addr) && !c.in_function)
            .map(|c| c.counters.num_elements);
        if ratio_fits(r, n.counters.num_elements, inputs) {
            obs[i].ratio = Some(r);
        }
    }
}

/// A batch size read from the node agrees with its counts: a whole number,
/// at least 8 batches produced, more than (batches - 1) x ratio input
/// elements (at most the last batch of an instance is partial), and an
/// observed ratio within half of it (parallel batch ops run ahead of
/// their consumer, by fewer batches than 8 once enough are produced).
fn ratio_fits(r: f64, batches: i64, inputs: Option<i64>) -> bool {
    let Some(m) = inputs else {
        return false;
    };
    if !(r.is_finite() && r >= 1.0 && r.fract() == 0.0 && r <= f64::from(1u32 << 31))
        || batches < MIN_BATCHES_CHECKED
    {
        return false;
    }
    let (n, m) = (batches as f64, m as f64);
    m > (n - 1.0) * r && (m / n - r).abs() <= r / 2.0
}

/// The pipeline the job waits on among the discovered iterators
/// ((iterator address, GetNext calls)): several pipelines can run in one
/// process (training and validation), and the one whose root saw the most
/// calls is the busiest. Records each iterator with a valid model node in
/// `iter_of` (node -> iterator). Returns that root (None when no iterator
/// has a model node: autotune is off), the number of pipelines seen, and
/// the iterators whose node failed validation.
pub fn busiest_root(
    mem: &Memory,
    reader: &ModelReader,
    il: &crate::layout::IteratorLayout,
    iters: Vec<(u64, u64)>,
    iter_of: &mut std::collections::HashMap<u64, u64>,
) -> (Option<u64>, usize, u64) {
    let mut calls: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut invalid = 0;
    for (it, hits) in iters {
        let Ok(node) = mem.u64(it + il.node as u64) else {
            continue;
        };
        if reader.node(node).is_err() {
            invalid += 1;
            continue;
        }
        iter_of.insert(node, it);
        if let Ok(r) = reader.root_of(node) {
            *calls.entry(r).or_default() += hits;
        }
    }
    let busiest = calls
        .iter()
        .max_by_key(|(r, c)| (**c, **r))
        .map(|(r, _)| *r);
    (busiest, calls.len(), invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_path_strips_indexes() {
        assert_eq!(
            stable_path("Iterator::Root::Prefetch::ForeverRepeat[118]::FlatMap[3]::TFRecord"),
            "Root::Prefetch::ForeverRepeat::FlatMap::TFRecord"
        );
    }

    #[test]
    fn ratio_is_checked_against_counts() {
        // 100 batches of 16 from 1600 (or 1590: a partial last batch).
        assert!(ratio_fits(16.0, 100, Some(1600)));
        assert!(ratio_fits(16.0, 100, Some(1590)));
        // A parallel batch running 4 batches ahead.
        assert!(ratio_fits(16.0, 100, Some(1664)));
        // Too few batches, no input seen, or counts that contradict it.
        assert!(!ratio_fits(16.0, 4, Some(64)));
        assert!(!ratio_fits(16.0, 100, None));
        assert!(!ratio_fits(8.0, 100, Some(1600)));
        assert!(!ratio_fits(32.0, 100, Some(1600)));
        // Not a batch size at all.
        assert!(!ratio_fits(16.5, 100, Some(1650)));
        assert!(!ratio_fits(f64::NAN, 100, Some(1600)));
        assert!(!ratio_fits(0.0, 100, Some(0)));
    }

    #[test]
    fn names() {
        assert!(plausible_name("ParallelMapV2"));
        assert!(!plausible_name("a b"));
        assert!(!plausible_name(""));
    }
}
