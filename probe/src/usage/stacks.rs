//! The user stacks BPF took at lock waits and file I/O, named after the
//! recording: stack id -> symbolized frames, the op they run and the
//! waiting call site.

use std::collections::HashMap;

use tracing::debug;

use super::nodes::Nodes;
use crate::bpf::Bpf;
use crate::frames::{getnext_class, is_wait_machinery, strip_params};
use crate::symbolize::{AddrNames, UNKNOWN};

/// No stack (a file open before we attached).
pub(super) const NO_STACK: i64 = i64::MIN;

pub(super) struct StackInfo {
    /// Symbolized frames, innermost first.
    pub(super) frames: Vec<String>,
    /// Op of the innermost GetNextInternal frame, if it names one op.
    pub(super) op: String,
    /// The waiting function.
    pub(super) site: String,
}

pub(super) struct Stacks<'a, 'obj> {
    bpf: &'a Bpf<'obj>,
    symbolizer: AddrNames,
    /// Stacks are left unnamed (PLUMBER_PROBE_SKIP=symbolize).
    no_symbolize: bool,
    stacks: HashMap<i64, StackInfo>,
}

impl<'a, 'obj> Stacks<'a, 'obj> {
    pub(super) fn new(bpf: &'a Bpf<'obj>, pid: i32, no_symbolize: bool) -> Self {
        Stacks {
            bpf,
            symbolizer: AddrNames::new(pid),
            no_symbolize,
            stacks: HashMap::new(),
        }
    }

    /// Op and call site of a user stack.
    pub(super) fn info(&mut self, id: i64, nodes: &Nodes) -> &StackInfo {
        if !self.stacks.contains_key(&id) {
            let info = self.resolve(id, nodes);
            self.stacks.insert(id, info);
        }
        self.stacks.entry(id).or_insert_with(|| StackInfo {
            frames: Vec::new(),
            op: String::new(),
            site: UNKNOWN.into(),
        })
    }

    /// The op a stack names, or empty.
    pub(super) fn op(&mut self, id: i64, nodes: &Nodes) -> String {
        if id == NO_STACK {
            return String::new();
        }
        self.info(id, nodes).op.clone()
    }

    fn resolve(&self, id: i64, nodes: &Nodes) -> StackInfo {
        let names = if self.no_symbolize {
            Vec::new()
        } else {
            self.symbolize(&self.bpf.stack(id))
        };
        let op = names
            .iter()
            .find_map(|n| getnext_class(n))
            .and_then(|class| nodes.only_path_of_class(&class))
            .unwrap_or_default();
        let site = names
            .iter()
            .find(|n| !is_wait_machinery(n))
            .map(|n| strip_params(n))
            .unwrap_or_else(|| UNKNOWN.into());
        StackInfo {
            frames: names,
            op,
            site,
        }
    }

    fn symbolize(&self, addrs: &[u64]) -> Vec<String> {
        if addrs.is_empty() {
            return Vec::new();
        }
        match self.symbolizer.user(addrs) {
            Ok(names) => names,
            Err(e) => {
                debug!("symbolizing a stack: {e}");
                Vec::new()
            }
        }
    }
}
