//! The pipeline's nodes as the polls and RemoveNode events name them:
//! model node instance (address, id) -> op path, which names the
//! attribution evidence and the spans; address -> the latest op path there,
//! for a node whose id is not known (the uprobes mode); and op class -> op
//! paths, which name the ops of symbolized stacks.

use std::collections::{HashMap, HashSet};

use plumber_collector::event::NodeObservation;

use crate::frames::op_class_of_model;

/// One model node: its address and its model id. Addresses are reused,
/// ids are not: the ops of a pipeline re-created every epoch swap
/// addresses (a map and the range below it, measured), so only the pair
/// names one op.
pub type Instance = (u64, i64);

#[derive(Default)]
pub(super) struct Nodes {
    /// Node instance -> op path, until its evidence is settled.
    instance_path: HashMap<Instance, String>,
    /// Model node address -> the op path of the latest node there.
    node_path: HashMap<u64, String>,
    /// Normalized op class (`ParallelMap`) -> op paths of that class.
    class_paths: HashMap<String, HashSet<String>>,
    /// Retired nodes whose parent had no path yet, by parent:
    /// (node, model name, the poll count when it retired). TensorFlow
    /// removes an iterator's input's node before the iterator's own (the
    /// input is a member, destroyed before the base that removes the
    /// node), so the nodes of an epoch that no poll saw retire child
    /// first. The parent is named when it retires, right after, or by the
    /// next poll while it lives.
    orphans: HashMap<Instance, Vec<(Instance, String, u64)>>,
    /// Polls learned so far: an orphan left after two is dropped.
    polls: u64,
    /// Names learned so far (it only grows).
    named: usize,
    /// Nodes retired since `take_retired`.
    retired: Vec<Instance>,
    /// Nodes whose names go at the next `take_retired`: their spans,
    /// drained at every poll, may still need them until then.
    forgotten: Vec<Instance>,
}

/// Orphans kept at most: more means parents that are never named.
const MAX_ORPHANS: usize = 4096;
/// Retired nodes kept for the next evidence read at most. Reads follow
/// each attribution window; a recording thinned to no windows for long
/// while per-file nodes come and go would otherwise keep every one.
const MAX_RETIRED: usize = 65_536;

impl Nodes {
    /// A node that died (RemoveNode): its path, from its parent's, names
    /// the spans and the evidence it left; with its parent not named yet,
    /// once the parent is. A parent never named leaves them unnamed
    /// (spans counted in `spans_of_unknown_nodes`, evidence unattributed).
    pub(super) fn learn_retired(&mut self, node: Instance, parent: Instance, name: &str) {
        if self.retired.len() >= MAX_RETIRED {
            // The oldest half: their evidence, if any, counts unnamed.
            for old in self.retired.drain(..MAX_RETIRED / 2) {
                self.instance_path.remove(&old);
            }
        }
        self.retired.push(node);
        match self.instance_path.get(&parent) {
            Some(pp) => {
                let path = format!("{pp}::{name}");
                self.name(node, path);
            }
            None => {
                if self.orphans.values().map(Vec::len).sum::<usize>() >= MAX_ORPHANS {
                    self.orphans.clear();
                }
                let orphan = (node, name.to_string(), self.polls);
                self.orphans.entry(parent).or_default().push(orphan);
            }
        }
    }

    /// Names `node` with `path`, and the orphans under it with theirs.
    fn name(&mut self, node: Instance, path: String) {
        let mut todo = vec![(node, path)];
        while let Some((node, path)) = todo.pop() {
            for (child, name, _) in self.orphans.remove(&node).unwrap_or_default() {
                todo.push((child, format!("{path}::{name}")));
            }
            self.node_path.insert(node.0, path.clone());
            if self.instance_path.insert(node, path).is_none() {
                self.named += 1;
            }
        }
    }

    /// Learns the pipeline's nodes and op classes from a poll.
    pub(super) fn learn(&mut self, nodes: &[NodeObservation]) {
        for n in nodes {
            self.name((n.addr, n.id), n.path.clone());
            let class = op_class_of_model(&n.name);
            self.class_paths
                .entry(class)
                .or_default()
                .insert(n.path.clone());
        }
        self.polls += 1;
        let polls = self.polls;
        self.orphans.retain(|_, v| {
            v.retain(|o| o.2 + 2 > polls);
            !v.is_empty()
        });
    }

    /// The op path of the latest node at `addr`: what names a node whose
    /// id is not known.
    fn path(&self, addr: u64) -> Option<&String> {
        self.node_path.get(&addr)
    }

    /// The op path of one node; by its address alone when its id is not
    /// known (-1: no node layout).
    pub(super) fn instance(&self, node: Instance) -> Option<&String> {
        if node.1 < 0 {
            self.path(node.0)
        } else {
            self.instance_path.get(&node)
        }
    }

    /// The nodes retired since the last call; the names forgotten before
    /// it go.
    pub(super) fn take_retired(&mut self) -> Vec<Instance> {
        for node in std::mem::take(&mut self.forgotten) {
            self.instance_path.remove(&node);
        }
        std::mem::take(&mut self.retired)
    }

    /// A dead node's evidence is settled: its name goes at the next
    /// `take_retired`.
    pub(super) fn forget(&mut self, node: Instance) {
        self.forgotten.push(node);
    }

    /// How many names were learned: it grows when a path is learned.
    pub(super) fn known(&self) -> usize {
        self.named
    }

    /// The one op path of op class `class`, if exactly one op has it.
    pub(super) fn only_path_of_class(&self, class: &str) -> Option<String> {
        let paths = self.class_paths.get(class)?;
        (paths.len() == 1)
            .then(|| paths.iter().next().cloned())
            .flatten()
    }

    pub(super) fn class_paths(&self) -> &HashMap<String, HashSet<String>> {
        &self.class_paths
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A node as a poll names it, its model name the path's last part.
    pub(in crate::usage) fn polled(addr: u64, id: i64, path: &str) -> NodeObservation {
        NodeObservation {
            addr,
            id,
            name: path.rsplit("::").next().unwrap_or(path).into(),
            path: path.into(),
            parent: None,
            in_function: false,
            counters: Default::default(),
            parallelism: None,
            ratio: None,
            buffer_size: None,
        }
    }

    #[test]
    fn an_epoch_no_poll_saw_is_named_though_it_retires_child_first() {
        let mut n = Nodes::default();
        n.learn(&[polled(1, 1, "Root::Repeat")]);
        // As TensorFlow tears an epoch down: Range, its map, the batch,
        // then the prefetch under the repeat that a poll saw.
        n.learn_retired((40, 9), (30, 8), "Range");
        n.learn_retired((30, 8), (20, 7), "ParallelMapV2");
        n.learn_retired((20, 7), (10, 6), "BatchV2");
        assert_eq!(n.instance((40, 9)), None);
        n.learn_retired((10, 6), (1, 1), "Prefetch");
        let range = "Root::Repeat::Prefetch::BatchV2::ParallelMapV2::Range";
        assert_eq!(n.instance((40, 9)).map(String::as_str), Some(range));
        assert_eq!(
            n.instance((20, 7)).map(String::as_str),
            Some("Root::Repeat::Prefetch::BatchV2")
        );
        assert_eq!(n.take_retired(), [(40, 9), (30, 8), (20, 7), (10, 6)]);
        assert!(n.take_retired().is_empty());
    }

    #[test]
    fn swapped_addresses_keep_each_node_its_name() {
        let mut n = Nodes::default();
        n.learn(&[
            polled(30, 8, "Root::ParallelMapV2"),
            polled(40, 9, "Root::ParallelMapV2::Range"),
        ]);
        // The next epoch's map where the range was, and the other way.
        n.learn(&[
            polled(40, 12, "Root::ParallelMapV2"),
            polled(30, 13, "Root::ParallelMapV2::Range"),
        ]);
        let name = |i| n.instance(i).map(String::as_str);
        assert_eq!(name((40, 9)), Some("Root::ParallelMapV2::Range"));
        assert_eq!(name((40, 12)), Some("Root::ParallelMapV2"));
        // Without an id, the latest node at the address.
        assert_eq!(name((40, -1)), Some("Root::ParallelMapV2"));
        n.forget((40, 9));
        assert!(n.instance((40, 9)).is_some());
        n.take_retired();
        assert_eq!(n.instance((40, 9)), None);
    }

    #[test]
    fn an_orphan_is_named_by_the_next_poll_of_its_parent_or_dropped() {
        let mut n = Nodes::default();
        n.learn_retired((40, 9), (30, 8), "Range");
        n.learn(&[polled(30, 8, "Root::ParallelMapV2")]);
        assert_eq!(
            n.instance((40, 9)).map(String::as_str),
            Some("Root::ParallelMapV2::Range")
        );
        // A parent no poll names: after two polls, it is dropped.
        n.learn_retired((41, 10), (31, 11), "Range");
        n.learn(&[]);
        n.learn(&[]);
        n.learn(&[polled(31, 11, "Root::BatchV2")]);
        assert_eq!(n.instance((41, 10)), None);
    }
}
