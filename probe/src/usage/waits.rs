//! Lock, condition and GIL waits: each thread's counters scaled to the
//! recording, and the lock call sites with their (sampled) waits, named
//! after the recording.

use std::collections::HashMap;

use anyhow::Result;
use plumber_collector::event::{Event, LockSite, WaitCounters};

use super::nodes::Nodes;
use super::stacks::Stacks;
use crate::bpf::types::{self as bt, lock_kind, wait_kind_name, Waits as RawWaits};
use crate::bpf::SiteKey;
use crate::sampler::LockStack;
use crate::sink::EventSink;

/// A lock site's (waits, wait ns) since the previous poll.
type SiteDelta = (SiteKey, u64, u64);

/// What the counts of the windows are multiplied by to stand for the
/// recording so far (see `Windows::scales`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scales {
    /// Blocks, timed in the attribution parts of the windows.
    pub(super) block: f64,
    /// Lock, condition and GIL slow paths, counted in their wait parts.
    pub(super) wait: f64,
}

impl Scales {
    /// What a lock site's counts are multiplied by: call sites are sampled
    /// (PP_WAIT_SAMPLE, PP_BLOCK_SAMPLE), and blocks are timed in the
    /// windows only.
    fn site(&self, kind: u32) -> f64 {
        if kind as usize == bt::WAIT_BLOCK {
            bt::BLOCK_SAMPLE as f64 * self.block
        } else {
            bt::WAIT_SAMPLE as f64 * self.wait
        }
    }
}

#[derive(Default)]
pub(super) struct WaitTotals {
    /// Per lock site, the cumulative (waits, wait ns) last read.
    sites_prev: HashMap<SiteKey, (u64, u64)>,
    /// Per poll (its instant), lock-site deltas whose stacks are named
    /// after the recording.
    pending_sites: Vec<(u64, Vec<SiteDelta>)>,
    /// Per thread, the wait counters last emitted: see `emit`.
    emitted: HashMap<u32, WaitCounters>,
}

impl WaitTotals {
    /// A thread's scaled wait counters as emitted: never below the last
    /// ones. The scales move both ways (the recording's time over the
    /// time observed, which grows fastest while a window is open), so a
    /// counter scaled at one poll can come out below the same counter
    /// scaled at the poll before; counters are cumulative, and a reader
    /// takes a decrease for a broken counter.
    pub(super) fn emit(&mut self, tid: u32, now: WaitCounters) -> WaitCounters {
        let out = match self.emitted.get(&tid) {
            Some(prev) => prev.max_each(&now),
            None => now,
        };
        self.emitted.insert(tid, out);
        out
    }

    /// Forgets an exited thread's last counters.
    pub(super) fn forget(&mut self, tid: u32) {
        self.emitted.remove(&tid);
    }

    /// Keeps the lock sites' growth since the last poll, for the poll at
    /// `mono_ns` (`sites`: the cumulative totals, empty when not read).
    pub(super) fn on_poll(&mut self, mono_ns: u64, sites: Vec<(SiteKey, (u64, u64))>) {
        let mut deltas = Vec::new();
        for (key, (waits, ns)) in sites {
            let (w0, n0) = self.sites_prev.insert(key, (waits, ns)).unwrap_or((0, 0));
            if waits > w0 {
                deltas.push((key, waits - w0, ns.saturating_sub(n0)));
            }
        }
        self.pending_sites.push((mono_ns, deltas));
    }

    /// Names the stacks of the recording's lock sites and emits them as
    /// `LockSites` events at their polls' instants.
    pub(super) fn emit_sites(
        &mut self,
        sink: &mut EventSink,
        stacks: &mut Stacks<'_, '_>,
        nodes: &Nodes,
        scales: impl Fn() -> Scales,
    ) -> Result<()> {
        for (mono_ns, deltas) in std::mem::take(&mut self.pending_sites) {
            let mut sites = Vec::new();
            for (key, waits, ns) in deltas {
                let scale = scales().site(key.kind);
                let info = stacks.info(key.stack_id, nodes);
                sites.push(LockSite {
                    kind: wait_kind_name(key.kind).to_string(),
                    site: info.site.clone(),
                    op_path: info.op.clone(),
                    tid: key.ns_tid,
                    waits: scale_u64(waits, scale),
                    wait_ns: scale_u64(ns, scale),
                });
            }
            sink.push(Event::LockSites { mono_ns, sites })?;
        }
        Ok(())
    }

    /// Lock waits by site, since attach, with the frame-pointer stacks
    /// BPF took at the wait: a first version of locks.folded (glibc has
    /// no frame pointers, so these stacks can be short).
    pub(super) fn lock_stacks(
        &self,
        stacks: &mut Stacks<'_, '_>,
        nodes: &Nodes,
        scales: impl Fn() -> Scales,
    ) -> Vec<LockStack> {
        let sites: Vec<(SiteKey, u64)> = self
            .sites_prev
            .iter()
            .filter(|(_, (_, ns))| *ns > 0)
            .map(|(key, (_, ns))| (*key, *ns))
            .collect();
        sites
            .into_iter()
            .map(|(key, ns)| {
                let scale = scales().site(key.kind);
                let mut frames = stacks.info(key.stack_id, nodes).frames.clone();
                frames.reverse();
                LockStack {
                    tid: key.ns_tid,
                    wait_kind: key.kind,
                    kind: lock_kind(key.kind),
                    frames,
                    ns: scale_u64(ns, scale),
                }
            })
            .collect()
    }
}

/// Condition waits are the condition slow path's and the blocks'; slow
/// paths are counted in the windows' wait parts (scaled by `wait_scale`),
/// blocks in their attribution parts (`block_scale`).
pub(super) fn wait_counters(w: &RawWaits, block_scale: f64, wait_scale: f64) -> WaitCounters {
    let slow = |kind: usize| {
        (
            scale_u64(w.ns[kind], wait_scale),
            scale_u64(w.n[kind], wait_scale),
        )
    };
    let (lock_wait_ns, lock_waits) = slow(bt::WAIT_LOCK);
    let (cond_ns, cond_n) = slow(bt::WAIT_COND);
    let (gil_wait_ns, gil_waits) = slow(bt::WAIT_GIL);
    WaitCounters {
        lock_wait_ns,
        lock_waits,
        cond_wait_ns: cond_ns.saturating_add(scale_u64(w.ns[bt::WAIT_BLOCK], block_scale)),
        cond_waits: cond_n.saturating_add(scale_u64(w.n[bt::WAIT_BLOCK], block_scale)),
        gil_wait_ns,
        gil_waits,
        futex_wait_ns: 0,
        futex_waits: 0,
        io_wait_ns: w.ns[bt::WAIT_IO],
    }
}

fn scale_u64(v: u64, scale: f64) -> u64 {
    (v as f64 * scale).round() as u64
}
