//! The attribution evidence: per thread and node instance (address and
//! model id), the CPU, waits and reads the windows booked between two
//! record_stop calls, as last read from the BPF side and named by the node
//! paths known now; a dead node's, once named, summed per thread and op
//! path and deleted from the BPF map.

use std::collections::HashMap;

use plumber_collector::event::AttributionSample;

use super::nodes::{Instance, Nodes};
use super::thread_cpu::ns_tid;
use super::waits::wait_counters;
use crate::bpf::{self, Bpf, BpfError, ThreadState};

#[derive(Default)]
pub(super) struct AttrEvidence {
    /// The attribution map as last read, tids in our namespace. It only
    /// changes while a window's probes are in (record_stop), and so does
    /// the lock-site map (waits count in windows only): between windows
    /// neither is read again. Scanning their 16,384 buckets key by key was
    /// a fifth of the probe's CPU at every poll.
    latest: Vec<bpf::Attr>,
    /// The evidence of dead nodes, final when read: summed per (thread,
    /// op path), "" for a node never named, and deleted from the map. The
    /// map is keyed by node instance, and a pipeline re-created every
    /// epoch would otherwise fill it.
    settled: HashMap<(u32, String), bpf::Attr>,
    /// Dead nodes not yet named (their parent died after the read), and
    /// the reads they waited.
    dead: HashMap<Instance, u32>,
    /// The count of known node paths when the attribution was last sent:
    /// a path learned since names more of it.
    sent_paths: Option<usize>,
}

/// Reads a dead node waits for its name before its evidence is settled
/// unnamed.
const NAME_WAIT_READS: u32 = 2;

impl AttrEvidence {
    /// Reads the attribution map again, its global tids turned into ours
    /// with the thread keys `bpf_threads` of the same poll, and settles
    /// the evidence of the nodes that died.
    pub(super) fn read(
        &mut self,
        bpf: &Bpf<'_>,
        bpf_threads: &[(u32, ThreadState)],
        nodes: &mut Nodes,
    ) -> Result<(), BpfError> {
        let key_to_tid: HashMap<u32, u32> = bpf_threads
            .iter()
            .map(|(k, st)| (*k, ns_tid(*k, st)))
            .collect();
        self.latest = bpf.attribution()?;
        for a in &mut self.latest {
            a.tid = key_to_tid.get(&a.tid).copied().unwrap_or(a.tid);
        }
        self.settle(nodes, |a| bpf.forget_attribution(a));
        Ok(())
    }

    /// Moves the evidence of dead, named nodes (and of dead nodes that
    /// waited `NAME_WAIT_READS` reads for a name) from `latest` into
    /// `settled`, calling `forget` for each entry moved.
    fn settle(&mut self, nodes: &mut Nodes, mut forget: impl FnMut(&bpf::Attr)) {
        for node in nodes.take_retired() {
            self.dead.entry(node).or_insert(0);
        }
        if self.dead.is_empty() {
            return;
        }
        let mut live = Vec::with_capacity(self.latest.len());
        for a in std::mem::take(&mut self.latest) {
            let node = (a.node, a.id);
            let path = match self.dead.get(&node) {
                Some(_) if a.id >= 0 => nodes.instance(node).cloned(),
                _ => {
                    live.push(a);
                    continue;
                }
            };
            let path = match path {
                Some(p) => p,
                None if self.dead.get(&node).is_some_and(|w| *w >= NAME_WAIT_READS) => {
                    String::new()
                }
                None => {
                    live.push(a);
                    continue;
                }
            };
            let sum = self.settled.entry((a.tid, path)).or_insert(bpf::Attr {
                tid: a.tid,
                node: a.node,
                ..Default::default()
            });
            add(sum, &a);
            forget(&a);
        }
        self.latest = live;
        self.dead.retain(|node, waited| {
            if nodes.instance(*node).is_some() || *waited >= NAME_WAIT_READS {
                nodes.forget(*node);
                false
            } else {
                *waited += 1;
                true
            }
        });
    }

    /// The samples to send at this poll, if any. Cumulative: sent again
    /// only when they (`read` again) or the paths that name them changed.
    pub(super) fn due(&mut self, read: bool, nodes: &Nodes) -> Option<Vec<AttributionSample>> {
        if !read && self.sent_paths == Some(nodes.known()) {
            return None;
        }
        self.sent_paths = Some(nodes.known());
        let samples = self.samples(nodes);
        (!samples.is_empty()).then_some(samples)
    }

    /// The attribution evidence as last read, its nodes named by the
    /// paths known now, and that of the dead nodes.
    pub(super) fn samples(&self, nodes: &Nodes) -> Vec<AttributionSample> {
        let live = self.latest.iter().map(|a| {
            let path = nodes.instance((a.node, a.id)).cloned();
            sample(a, path.unwrap_or_default())
        });
        let dead = self
            .settled
            .iter()
            .map(|((_, path), a)| sample(a, path.clone()));
        live.chain(dead).collect()
    }

    /// Each thread's main op: the one its windows booked most CPU to.
    pub(super) fn main_ops(&self, nodes: &Nodes) -> HashMap<u32, String> {
        let mut op_cpu: HashMap<u32, HashMap<String, u64>> = HashMap::new();
        for a in self.samples(nodes) {
            if !a.op_path.is_empty() {
                *op_cpu
                    .entry(a.tid)
                    .or_default()
                    .entry(a.op_path)
                    .or_default() += a.cpu_ns.max(1);
            }
        }
        op_cpu
            .iter()
            .filter_map(|(tid, ops)| {
                let (path, _) = ops.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
                Some((*tid, path.clone()))
            })
            .collect()
    }
}

/// One entry as an event's sample.
fn sample(a: &bpf::Attr, op_path: String) -> AttributionSample {
    AttributionSample {
        tid: a.tid,
        node: a.node,
        op_path,
        cpu_ns: a.cpu_ns,
        // Ratios within the windows: nothing to scale.
        waits: wait_counters(&a.waits, 1.0, 1.0),
        io_bytes: a.io_bytes,
        stops: a.stops,
    }
}

/// Adds `b`'s counts to `a`.
fn add(a: &mut bpf::Attr, b: &bpf::Attr) {
    a.cpu_ns = a.cpu_ns.saturating_add(b.cpu_ns);
    a.io_bytes = a.io_bytes.saturating_add(b.io_bytes);
    a.stops = a.stops.saturating_add(b.stops);
    for (x, y) in a.waits.ns.iter_mut().zip(b.waits.ns) {
        *x = x.saturating_add(y);
    }
    for (x, y) in a.waits.n.iter_mut().zip(b.waits.n) {
        *x = x.saturating_add(y);
    }
}

#[cfg(test)]
mod tests {
    use super::super::nodes::tests::polled;
    use super::*;

    fn attr(tid: u32, node: u64, id: i64, cpu_ns: u64) -> bpf::Attr {
        bpf::Attr {
            tid,
            key_tid: tid,
            node,
            id,
            cpu_ns,
            stops: 1,
            ..Default::default()
        }
    }

    fn cpu_by_path(e: &AttrEvidence, nodes: &Nodes) -> Vec<(String, u64)> {
        let mut by: HashMap<String, u64> = HashMap::new();
        for s in e.samples(nodes) {
            *by.entry(s.op_path).or_default() += s.cpu_ns;
        }
        let mut v: Vec<_> = by.into_iter().collect();
        v.sort();
        v
    }

    const MAP: &str = "Root::ParallelMapV2";
    const RANGE: &str = "Root::ParallelMapV2::Range";

    #[test]
    fn dead_nodes_are_settled_by_name_though_their_addresses_swap() {
        let mut nodes = Nodes::default();
        let mut e = AttrEvidence::default();
        nodes.learn(&[
            polled(1, 1, "Root"),
            polled(30, 8, MAP),
            polled(40, 9, RANGE),
        ]);
        // The epoch dies child first; the next one swaps the addresses.
        nodes.learn_retired((40, 9), (30, 8), "Range");
        nodes.learn_retired((30, 8), (1, 1), "ParallelMapV2");
        nodes.learn(&[polled(40, 12, MAP), polled(30, 13, RANGE)]);
        e.latest = vec![
            attr(7, 30, 8, 900),
            attr(7, 40, 9, 10),
            attr(7, 40, 12, 800),
            attr(7, 30, 13, 20),
        ];
        let mut forgotten = Vec::new();
        e.settle(&mut nodes, |a| forgotten.push((a.node, a.id)));
        assert_eq!(forgotten, [(30, 8), (40, 9)]);
        assert_eq!(e.latest.len(), 2);
        assert_eq!(
            cpu_by_path(&e, &nodes),
            [(MAP.to_string(), 1_700), (RANGE.to_string(), 30)]
        );
        // Settled names go at the next read.
        assert!(nodes.instance((40, 9)).is_some());
        e.settle(&mut nodes, |_| {});
        assert_eq!(nodes.instance((40, 9)), None);
    }

    #[test]
    fn a_dead_node_waits_for_its_name_then_counts_unnamed() {
        let mut nodes = Nodes::default();
        let mut e = AttrEvidence::default();
        // Its parent never named.
        nodes.learn_retired((40, 9), (30, 8), "Range");
        e.latest = vec![attr(7, 40, 9, 10)];
        let mut forgotten = 0;
        for _ in 0..NAME_WAIT_READS {
            e.settle(&mut nodes, |_| forgotten += 1);
            assert_eq!((forgotten, e.latest.len()), (0, 1));
        }
        e.settle(&mut nodes, |_| forgotten += 1);
        assert_eq!((forgotten, e.latest.len()), (1, 0));
        assert_eq!(cpu_by_path(&e, &nodes), [(String::new(), 10)]);
    }
}
