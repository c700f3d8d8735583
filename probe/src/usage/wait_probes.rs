//! The lock, condition and GIL slow paths' entry and return probes,
//! attached and detached with the windows (see the module doc of `usage`).

use std::collections::HashMap;

use libbpf_rs::Link;
use tracing::{debug, warn};

use crate::bpf::types as bt;
use crate::bpf::{Bpf, WaitProbe};
use crate::derive::ProbePoint;

/// A lock or GIL slow path to probe.
pub(super) type WaitPoint = (WaitProbe, ProbePoint, &'static str);

pub(super) struct WaitProbes<'a, 'obj> {
    bpf: &'a Bpf<'obj>,
    /// Lock and GIL slow paths, and their (entry, return) links while
    /// attached.
    points: Vec<WaitPoint>,
    links: Vec<(Link, Link)>,
    /// Probes that could not be attached, or counting not switched.
    pub(super) failures: u64,
}

impl<'a, 'obj> WaitProbes<'a, 'obj> {
    pub(super) fn new(bpf: &'a Bpf<'obj>, points: Vec<WaitPoint>) -> Self {
        WaitProbes {
            bpf,
            points,
            links: Vec::new(),
            failures: 0,
        }
    }

    /// No slow path is (left) to probe.
    pub(super) fn none(&self) -> bool {
        self.points.is_empty()
    }

    /// Whether the probes are in.
    pub(super) fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches the lock and GIL probes (a probe that fails is reported
    /// once and left out from then on).
    pub(super) fn attach(&mut self) {
        if self.points.is_empty() {
            return;
        }
        if let Err(e) = self.bpf.settle_waits() {
            warn!("lock and GIL waits not measured: {e}");
            self.points.clear();
            return;
        }
        let mut failed = Vec::new();
        for (i, (kind, p, name)) in self.points.iter().enumerate() {
            match self.bpf.attach_wait(*kind, &p.lib, p.file_offset) {
                Ok(pair) => {
                    debug!(probe = name, "attached");
                    self.links.push(pair);
                }
                Err(e) => {
                    warn!("{name} not probed: {e}");
                    self.failures += 1;
                    failed.push(i);
                }
            }
        }
        for i in failed.into_iter().rev() {
            self.points.remove(i);
        }
        if let Err(e) = self.bpf.waits_attached() {
            warn!("lock and GIL probes: {e}");
        }
    }

    /// Detaches the lock and GIL probes. Probes attach one by one and
    /// detach in no set order, so meanwhile entries are seen without their
    /// returns or the reverse: the BPF side is told first not to count
    /// those as lost (and forgets them at the next attach); `attach`
    /// does the same.
    pub(super) fn detach(&mut self) {
        let links = self.take_links();
        self.bpf.detach(links);
    }

    /// The lock and GIL probes' links, to detach, the BPF side told.
    pub(super) fn take_links(&mut self) -> Vec<Link> {
        if self.links.is_empty() {
            return Vec::new();
        }
        if let Err(e) = self.bpf.settle_waits() {
            warn!("lock and GIL probes: {e}");
        }
        std::mem::take(&mut self.links)
            .into_iter()
            .flat_map(|(enter, exit)| [exit, enter])
            .collect()
    }

    /// Whether the waits count in the totals and sites.
    pub(super) fn count(&mut self, on: bool) {
        if let Err(e) = self.bpf.set_count_waits(on) {
            warn!("lock and GIL waits not counted: {e}");
            self.failures += 1;
        }
    }

    /// The probed function by wait kind: the unwound stacks of the sampled
    /// waits start at the slow path's caller, so it is their leaf.
    pub(super) fn leaf_names(&self) -> HashMap<u32, String> {
        let mut wait_leaf = HashMap::new();
        for (probe, _, name) in &self.points {
            let kinds: &[usize] = match probe {
                WaitProbe::Mutex => &[bt::WAIT_LOCK, bt::WAIT_COND],
                WaitProbe::Gil => &[bt::WAIT_GIL],
            };
            for k in kinds {
                wait_leaf.insert(*k as u32, name.to_string());
            }
        }
        wait_leaf
    }
}
