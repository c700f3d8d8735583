//! Per-op CPU time, waits and file I/O over the window, from the probe's
//! `Threads`, `Attribution`, `Io` and `LockSites` events (see the doc
//! comments in `event.rs`, the contract with the probe).
//!
//! The kernel counts CPU time per thread, not per op, so each thread's
//! window CPU is split among ops:
//!
//! - UDF-pool threads (`tf_data_private_threadpool`) run the user functions
//!   of every function-running op, away from the op's `GetNext`, so nothing
//!   on the thread tells the ops apart: the thread is split among those ops
//!   in proportion to their processing time, which includes the functions'
//!   kernel time.
//! - Any other thread with attribution evidence (CPU time between
//!   `record_stop` calls) is split in proportion to the evidence. Evidence
//!   on the root iterator is the consumer (the training loop between two
//!   `next()` calls): outside the pipeline, and counted apart as the
//!   consumer's (the analyzer charges it per element; other CPU outside the
//!   pipeline may be fixed per second).
//! - Pipeline threads without evidence are unattributed; other threads
//!   without evidence are outside the pipeline (training step, Python).
//! - An op that produced elements but that no window caught gets its
//!   TensorFlow self time, moved from the unattributed or from its parent
//!   (`unmeasured.rs`).
//!
//! Splits are exact, so ops + unattributed + outside the pipeline equals
//! the threads' total.

use std::collections::{BTreeMap, HashMap};

use crate::event::{AttributionSample, Event, FileIo, LockSite, ThreadObservation, WaitCounters};
use crate::fileio::{IoTracker, LockTracker};
use crate::opnames;
use crate::split::{split_exact, WaitKind};
use crate::threads::{ThreadTracker, ThreadWindow};
use crate::totals::{
    CpuTotals, FileTotals, LockSiteTotals, OpTotals, Stamp, ThreadRole, ThreadTotals,
};
use crate::unmeasured;

/// Model node name of the root iterator.
const ROOT_MODEL_NAME: &str = "Root";

/// What the attribution adds to a window result.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct AttributionResult {
    pub cpu: CpuTotals,
    pub threads: Vec<ThreadTotals>,
    pub files: Vec<FileTotals>,
    pub lock_sites: Vec<LockSiteTotals>,
    pub unattributed_waits: WaitCounters,
    pub non_pipeline_waits: WaitCounters,
    pub unattributed_io_bytes: u64,
    /// What each process read, per file, where the reads name their
    /// process (a PyTorch job's).
    pub files_by_pid: crate::process_files::PidFiles,
    /// Cumulative thread counters that went backwards (clamped to 0).
    pub backwards: u64,
}

/// An event whose window membership is known only once the poll at or
/// after its instant has arrived.
#[derive(Debug)]
enum Timed {
    Threads(Vec<ThreadObservation>),
    Io(Vec<FileIo>),
    Locks(Vec<LockSite>),
}

/// Streaming state, fed by the window's `Aggregator`.
#[derive(Debug, Default)]
pub(crate) struct Attributor {
    first_poll: Option<u64>,
    last_poll: Option<u64>,
    /// Events later than the last poll so far, in arrival order.
    pending: Vec<(u64, Timed)>,
    threads: ThreadTracker,
    /// Latest cumulative evidence (mono_ns, samples).
    evidence: Option<(u64, Vec<AttributionSample>)>,
    io: IoTracker,
    locks: LockTracker,
}

impl Attributor {
    /// One `Threads`, `Attribution`, `Io` or `LockSites` event (others are
    /// ignored).
    pub(crate) fn push(&mut self, event: Event) {
        let (mono, timed) = match event {
            Event::Threads { mono_ns, threads } => (mono_ns, Timed::Threads(threads)),
            Event::Io { mono_ns, files } => (mono_ns, Timed::Io(files)),
            Event::LockSites { mono_ns, sites } => (mono_ns, Timed::Locks(sites)),
            Event::Attribution { mono_ns, samples } => {
                // Cumulative: the newest replaces the rest.
                if self.evidence.as_ref().is_none_or(|(m, _)| *m <= mono_ns) {
                    self.evidence = Some((mono_ns, samples));
                }
                return;
            }
            _ => return,
        };
        match self.last_poll {
            Some(last) if mono <= last => self.apply(mono, timed),
            _ => self.pending.push((mono, timed)),
        }
    }

    /// A poll was accepted at `mono`.
    pub(crate) fn on_poll(&mut self, mono: u64) {
        self.first_poll.get_or_insert(mono);
        self.last_poll = Some(mono);
        if self.pending.iter().all(|(m, _)| *m > mono) {
            return;
        }
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(m, _)| *m <= mono);
        self.pending = later;
        for (m, t) in now {
            self.apply(m, t);
        }
    }

    /// Applies an event known to be at or before the last poll.
    fn apply(&mut self, mono: u64, timed: Timed) {
        let Some(start) = self.first_poll else {
            return;
        };
        match timed {
            // The snapshot taken at the first poll is the baseline.
            Timed::Threads(t) if mono >= start => self.threads.observe(mono, &t),
            // Deltas up to `mono`: the one at the first poll covers time
            // before the window.
            Timed::Io(f) if mono > start => self.io.add(f),
            Timed::Locks(s) if mono > start => self.locks.add(s),
            _ => tracing::trace!(mono_ns = mono, "event before the window ignored"),
        }
    }

    /// Splits the threads' CPU time and waits among `ops` and fills their
    /// CPU, wait and I/O fields.
    pub(crate) fn finish(
        self,
        ops: &mut [OpTotals],
        start: Stamp,
        end: Stamp,
    ) -> AttributionResult {
        if !self.pending.is_empty() {
            tracing::debug!(
                count = self.pending.len(),
                "events after the last poll ignored"
            );
        }
        let (threads, backwards) = self.threads.finish();
        let ctx = OpContext::new(ops);
        let evidence = Evidence::new(self.evidence.map(|(_, s)| s).unwrap_or_default(), &ctx);
        let mut acc = vec![OpCpu::default(); ops.len()];
        let mut out = AttributionResult {
            backwards,
            ..Default::default()
        };
        // tid -> the one op its split names (None: several or none).
        let mut single_op: HashMap<u32, Option<usize>> = HashMap::new();
        for t in &threads {
            let plan = ctx.plan(t, &evidence);
            let named = plan.single_op();
            single_op
                .entry(t.tid)
                .and_modify(|s| {
                    if *s != named {
                        *s = None;
                    }
                })
                .or_insert(named);
            let row = apply_plan(t, &plan, &ctx, &mut acc, &mut out);
            out.threads.push(row);
        }
        out.cpu.threads_cpu_ns = threads.iter().fold(0u64, |a, t| a.saturating_add(t.cpu_ns));
        if !threads.is_empty() {
            out.cpu.process_cpu_ns = end.process_cpu_ns.saturating_sub(start.process_cpu_ns);
        }
        out.threads
            .sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.tid.cmp(&b.tid)));
        let mut cpu: Vec<u64> = acc.iter().map(|a| a.cpu_ns).collect();
        let given = unmeasured::fill(
            ops,
            |i| ctx.roots.contains(&i),
            |path| ctx.op(path),
            &mut cpu,
            &mut out.cpu.unattributed_cpu_ns,
            &mut out.threads,
        );
        for (a, c) in acc.iter_mut().zip(cpu) {
            a.cpu_ns = c;
        }
        for i in given {
            if let Some(op) = ops.get_mut(i) {
                op.cpu_from_self_time = true;
            }
        }

        let io = self.io.finish(
            ops.len(),
            |op_path, tid| {
                if op_path.is_empty() {
                    single_op.get(&tid).copied().flatten()
                } else {
                    ctx.op(op_path)
                }
            },
            |i| ctx.paths.get(i).map_or("", String::as_str),
        );
        out.files = io.files;
        out.unattributed_io_bytes = io.unattributed_bytes;
        out.files_by_pid = io.by_pid;
        out.lock_sites = self.locks.finish();

        for ((op, cpu), io) in ops.iter_mut().zip(acc).zip(io.per_op) {
            out.cpu.pipeline_cpu_ns = out.cpu.pipeline_cpu_ns.saturating_add(cpu.cpu_ns);
            op.cpu_ns = cpu.cpu_ns;
            op.udf_cpu_ns = cpu.udf_cpu_ns;
            op.waits = cpu.waits;
            op.io_bytes_read = io.bytes_read;
            op.io_read_ns = io.read_ns;
            op.files_opened = io.opens;
            op.files = io.files.into_iter().collect();
        }
        out
    }
}

/// Where a share of a thread's time goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Op(usize),
    Unattributed,
    NonPipeline,
    /// Evidence on a root iterator: the consumer between two `GetNext`
    /// calls (outside the pipeline, but known to take the root's elements).
    Consumer,
}

/// How one thread's time is split: CPU weights and, per wait kind, the
/// weights of that kind (None: as the CPU).
struct Plan {
    cpu: Vec<(Target, u64)>,
    waits: [Option<Vec<(Target, u64)>>; 5],
}

impl Plan {
    fn all_to(t: Target) -> Plan {
        Plan {
            cpu: vec![(t, 1)],
            waits: Default::default(),
        }
    }

    /// The op the split names when it names exactly one and nothing else
    /// (a thread that also works outside the pipeline, e.g. the training
    /// loop between two `next()` calls, reads files for it too).
    fn single_op(&self) -> Option<usize> {
        let mut named = self.cpu.iter().filter(|(_, w)| *w > 0).map(|(t, _)| *t);
        match (named.next(), named.next()) {
            (Some(Target::Op(i)), None) => Some(i),
            _ => None,
        }
    }
}

/// The window's ops as the attribution needs them.
struct OpContext {
    paths: Vec<String>,
    index: HashMap<String, usize>,
    /// Root iterators: their evidence is the consumer's.
    roots: Vec<usize>,
    /// Ops that run user functions on the UDF pool, with their processing
    /// time over the window.
    function_ops: Vec<(usize, u64)>,
}

impl OpContext {
    fn new(ops: &[OpTotals]) -> Self {
        OpContext {
            paths: ops.iter().map(|o| o.path.clone()).collect(),
            index: ops
                .iter()
                .enumerate()
                .map(|(i, o)| (o.path.clone(), i))
                .collect(),
            roots: ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.parent_path.is_none() && o.model_name == ROOT_MODEL_NAME)
                .map(|(i, _)| i)
                .collect(),
            function_ops: ops
                .iter()
                .enumerate()
                .filter(|(_, o)| opnames::runs_user_functions(&o.model_name))
                .map(|(i, o)| (i, u64::try_from(o.processing_time_ns).unwrap_or(0)))
                .collect(),
        }
    }

    /// The pipeline op (not a root) with this path.
    fn op(&self, path: &str) -> Option<usize> {
        self.index
            .get(path)
            .copied()
            .filter(|i| !self.roots.contains(i))
    }

    fn target(&self, op_path: &str) -> Target {
        match self.index.get(op_path) {
            Some(i) if self.roots.contains(i) => Target::Consumer,
            Some(&i) => Target::Op(i),
            None => Target::Unattributed,
        }
    }

    fn plan(&self, t: &ThreadWindow, evidence: &Evidence) -> Plan {
        if t.role == ThreadRole::UdfPool {
            return match self.function_ops.as_slice() {
                [] => Plan::all_to(Target::Unattributed),
                [(i, _)] => Plan::all_to(Target::Op(*i)),
                many if many.iter().any(|(_, w)| *w > 0) => Plan {
                    cpu: many.iter().map(|&(i, w)| (Target::Op(i), w)).collect(),
                    waits: Default::default(),
                },
                _ => Plan::all_to(Target::Unattributed),
            };
        }
        if let Some(e) = evidence.by_tid.get(&t.tid) {
            if e.cpu.values().any(|w| *w > 0) {
                let waits = e
                    .waits
                    .clone()
                    .map(|w| w.values().any(|v| *v > 0).then(|| w.into_iter().collect()));
                return Plan {
                    cpu: e.cpu.iter().map(|(t, w)| (*t, *w)).collect(),
                    waits,
                };
            }
        }
        match t.role {
            ThreadRole::NonPipeline => Plan::all_to(Target::NonPipeline),
            _ => Plan::all_to(Target::Unattributed),
        }
    }
}

/// Attribution evidence summed per thread and target.
struct Evidence {
    by_tid: HashMap<u32, TidEvidence>,
}

#[derive(Default)]
struct TidEvidence {
    cpu: BTreeMap<Target, u64>,
    /// Per [`WaitKind::ALL`] entry.
    waits: [BTreeMap<Target, u64>; 5],
}

impl Evidence {
    fn new(samples: Vec<AttributionSample>, ctx: &OpContext) -> Self {
        let mut by_tid: HashMap<u32, TidEvidence> = HashMap::new();
        for s in samples {
            let target = if s.op_path.is_empty() {
                Target::Unattributed
            } else {
                ctx.target(&s.op_path)
            };
            let e = by_tid.entry(s.tid).or_default();
            let c = e.cpu.entry(target).or_default();
            *c = c.saturating_add(s.cpu_ns);
            for (k, m) in WaitKind::ALL.iter().zip(e.waits.iter_mut()) {
                let w = m.entry(target).or_default();
                *w = w.saturating_add(k.ns(&s.waits));
            }
        }
        Evidence { by_tid }
    }
}

#[derive(Clone, Debug, Default)]
struct OpCpu {
    cpu_ns: u64,
    udf_cpu_ns: u64,
    waits: WaitCounters,
}

/// Splits one thread by `plan` into the per-op accumulators and the
/// window totals; returns the thread's row.
fn apply_plan(
    t: &ThreadWindow,
    plan: &Plan,
    ctx: &OpContext,
    acc: &mut [OpCpu],
    out: &mut AttributionResult,
) -> ThreadTotals {
    let mut row = ThreadTotals {
        tid: t.tid,
        name: t.name.clone(),
        role: t.role,
        cpu_ns: t.cpu_ns,
        waits: t.waits,
        attributed: Vec::new(),
        unattributed_cpu_ns: 0,
        non_pipeline_cpu_ns: 0,
        consumer_cpu_ns: 0,
    };
    let cpu = split_exact(t.cpu_ns, &plan.cpu).unwrap_or_default();
    for (target, ns) in cpu {
        match target {
            Target::Op(i) => {
                if let Some(a) = acc.get_mut(i) {
                    a.cpu_ns = a.cpu_ns.saturating_add(ns);
                    if t.role == ThreadRole::UdfPool {
                        a.udf_cpu_ns = a.udf_cpu_ns.saturating_add(ns);
                    }
                }
                if ns > 0 {
                    let path = ctx.paths.get(i).cloned().unwrap_or_default();
                    row.attributed.push((path, ns));
                }
            }
            Target::Unattributed => {
                row.unattributed_cpu_ns = row.unattributed_cpu_ns.saturating_add(ns);
                out.cpu.unattributed_cpu_ns = out.cpu.unattributed_cpu_ns.saturating_add(ns);
            }
            Target::NonPipeline => {
                row.non_pipeline_cpu_ns = row.non_pipeline_cpu_ns.saturating_add(ns);
                out.cpu.non_pipeline_cpu_ns = out.cpu.non_pipeline_cpu_ns.saturating_add(ns);
            }
            Target::Consumer => {
                row.non_pipeline_cpu_ns = row.non_pipeline_cpu_ns.saturating_add(ns);
                row.consumer_cpu_ns = row.consumer_cpu_ns.saturating_add(ns);
                out.cpu.non_pipeline_cpu_ns = out.cpu.non_pipeline_cpu_ns.saturating_add(ns);
                out.cpu.consumer_cpu_ns = out.cpu.consumer_cpu_ns.saturating_add(ns);
            }
        }
    }
    row.attributed
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));

    for (k, kind_weights) in WaitKind::ALL.iter().zip(&plan.waits) {
        let weights = kind_weights.as_deref().unwrap_or(&plan.cpu);
        let ns = split_exact(k.ns(&t.waits), weights).unwrap_or_default();
        let counts = split_exact(k.count(&t.waits), weights).unwrap_or_default();
        for ((target, ns), (_, count)) in ns.into_iter().zip(counts) {
            let dest = match target {
                Target::Op(i) => match acc.get_mut(i) {
                    Some(a) => &mut a.waits,
                    None => continue,
                },
                Target::Unattributed => &mut out.unattributed_waits,
                Target::NonPipeline | Target::Consumer => &mut out.non_pipeline_waits,
            };
            k.add(dest, ns, count);
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_names() {
        for (name, role) in [
            ("tf_data_private_threadpool", ThreadRole::UdfPool),
            ("tf_data_parallel_map", ThreadRole::Pipeline),
            ("tf_data_iterator_get_next", ThreadRole::Pipeline),
            ("dataset_op_thread", ThreadRole::Pipeline),
            ("python3", ThreadRole::NonPipeline),
            ("tf_Compute", ThreadRole::NonPipeline),
            ("", ThreadRole::NonPipeline),
        ] {
            assert_eq!(ThreadRole::from_name(name), role, "{name}");
        }
        assert_eq!(ThreadRole::UdfPool.as_str(), "udf_pool");
    }
}
