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
}

impl Nodes {
    /// A node that died between two polls (RemoveNode): its path, from
    /// its parent's, names the spans it left. A parent no poll saw either
    /// (interleave's per-file inputs) leaves its spans unnamed, counted in
    /// `spans_of_unknown_nodes`.
    pub(super) fn learn_retired(&mut self, node: u64, parent: u64, name: &str) {
        if let Some(pp) = self.node_path.get(&parent) {
            let path = format!("{pp}::{name}");
            self.node_path.insert(node, path);
        }
    }

    /// Learns the pipeline's node addresses and op classes from a poll.
    pub(super) fn learn(&mut self, nodes: &[NodeObservation]) {
        for n in nodes {
            self.node_path.insert(n.addr, n.path.clone());
            let class = op_class_of_model(&n.name);
            self.class_paths
                .entry(class)
                .or_default()
                .insert(n.path.clone());
        }
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
