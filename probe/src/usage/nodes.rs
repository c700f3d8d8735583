//! The pipeline's nodes as the polls name them: model node address -> op
//! path, and op class -> op paths, which name the spans, the attribution
//! evidence and the ops of symbolized stacks.

use std::collections::{HashMap, HashSet};

use plumber_collector::event::NodeObservation;

use crate::frames::op_class_of_model;

#[derive(Default)]
pub(super) struct Nodes {
    /// Model node address -> op path, from every poll so far.
    node_path: HashMap<u64, String>,
    /// Normalized op class (`ParallelMap`) -> op paths of that class.
    class_paths: HashMap<String, HashSet<String>>,
    /// Retired nodes whose parent had no path yet, by parent address:
    /// (node, model name, the poll count when it retired). TensorFlow
    /// removes an iterator's input's node before the iterator's own (the
    /// input is a member, destroyed before the base that removes the
    /// node), so the nodes of an epoch that no poll saw retire child
    /// first. The parent is named when it retires, right after, or by the
    /// next poll while it lives.
    orphans: HashMap<u64, Vec<(u64, String, u64)>>,
    /// Polls learned so far: an orphan left after two is dropped, lest a
    /// later node at its parent's address name it.
    polls: u64,
}

/// Orphans kept at most: more means parents that are never named.
const MAX_ORPHANS: usize = 4096;

impl Nodes {
    /// A node that died between two polls (RemoveNode): its path, from
    /// its parent's, names the spans and the evidence it left; with its
    /// parent not named yet, once the parent is. A parent never named
    /// leaves them unnamed, counted in `spans_of_unknown_nodes`.
    pub(super) fn learn_retired(&mut self, node: u64, parent: u64, name: &str) {
        match self.node_path.get(&parent) {
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
    fn name(&mut self, node: u64, path: String) {
        let mut todo = vec![(node, path)];
        while let Some((node, path)) = todo.pop() {
            for (child, name, _) in self.orphans.remove(&node).unwrap_or_default() {
                todo.push((child, format!("{path}::{name}")));
            }
            self.node_path.insert(node, path);
        }
    }

    /// Learns the pipeline's node addresses and op classes from a poll.
    pub(super) fn learn(&mut self, nodes: &[NodeObservation]) {
        for n in nodes {
            self.name(n.addr, n.path.clone());
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

    /// The op path of the node at `addr`, if a poll or RemoveNode named it.
    pub(super) fn path(&self, addr: u64) -> Option<&String> {
        self.node_path.get(&addr)
    }

    /// How many node addresses are named: it grows when a path is learned.
    pub(super) fn known(&self) -> usize {
        self.node_path.len()
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
mod tests {
    use super::*;

    fn polled(addr: u64, name: &str, path: &str) -> NodeObservation {
        NodeObservation {
            addr,
            id: addr as i64,
            name: name.into(),
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
        n.learn(&[polled(1, "Repeat", "Root::Repeat")]);
        // As TensorFlow tears an epoch down: Range, its map, the batch,
        // then the prefetch under the repeat that a poll saw.
        n.learn_retired(40, 30, "Range");
        n.learn_retired(30, 20, "ParallelMapV2");
        n.learn_retired(20, 10, "BatchV2");
        assert_eq!(n.path(40), None);
        n.learn_retired(10, 1, "Prefetch");
        let range = "Root::Repeat::Prefetch::BatchV2::ParallelMapV2::Range";
        assert_eq!(n.path(40).map(String::as_str), Some(range));
        assert_eq!(
            n.path(20).map(String::as_str),
            Some("Root::Repeat::Prefetch::BatchV2")
        );
    }

    #[test]
    fn an_orphan_is_named_by_the_next_poll_of_its_parent_or_dropped() {
        let mut n = Nodes::default();
        n.learn_retired(40, 30, "Range");
        n.learn(&[polled(30, "ParallelMapV2", "Root::ParallelMapV2")]);
        assert_eq!(
            n.path(40).map(String::as_str),
            Some("Root::ParallelMapV2::Range")
        );
        // A parent no poll names: after two polls, a later node at its
        // address does not adopt the orphan.
        n.learn_retired(41, 31, "Range");
        n.learn(&[]);
        n.learn(&[]);
        n.learn(&[polled(31, "BatchV2", "Root::BatchV2")]);
        assert_eq!(n.path(41), None);
    }
}
