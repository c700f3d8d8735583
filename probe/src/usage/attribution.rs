//! The attribution evidence: per thread and node, the CPU, waits and reads
//! the windows booked between two record_stop calls, as last read from the
//! BPF side and named by the node paths known now.

use std::collections::HashMap;

use plumber_collector::event::AttributionSample;

use super::nodes::Nodes;
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
    /// The count of known node paths when the attribution was last sent:
    /// a path learned since names more of it.
    sent_paths: Option<usize>,
}

impl AttrEvidence {
    /// Reads the attribution map again, its global tids turned into ours
    /// with the thread keys `bpf_threads` of the same poll.
    pub(super) fn read(
        &mut self,
        bpf: &Bpf<'_>,
        bpf_threads: &[(u32, ThreadState)],
    ) -> Result<(), BpfError> {
        let key_to_tid: HashMap<u32, u32> = bpf_threads
            .iter()
            .map(|(k, st)| (*k, ns_tid(*k, st)))
            .collect();
        self.latest = bpf.attribution()?;
        for a in &mut self.latest {
            a.tid = key_to_tid.get(&a.tid).copied().unwrap_or(a.tid);
        }
        Ok(())
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
    /// paths known now.
    pub(super) fn samples(&self, nodes: &Nodes) -> Vec<AttributionSample> {
        self.latest
            .iter()
            .map(|a| AttributionSample {
                tid: a.tid,
                node: a.node,
                op_path: nodes.path(a.node).cloned().unwrap_or_default(),
                cpu_ns: a.cpu_ns,
                // Ratios within the windows: nothing to scale.
                waits: wait_counters(&a.waits, 1.0, 1.0),
                io_bytes: a.io_bytes,
                stops: a.stops,
            })
            .collect()
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
