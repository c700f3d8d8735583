//! Aggregates a stream of [`Event`]s into per-op totals over the recording
//! window (first poll to last poll), the way Plumber's `aggregate_*` fields
//! are totals over every iterator instance of an op, destroyed ones included.
//!
//! Counters are cumulative per node instance, so each instance contributes
//! `final - baseline`: the baseline is what it had at the first poll (zero
//! when it was born inside the window), the final value comes from its
//! `Retired` event when that falls inside the window, else from the last poll
//! that saw it. Instances sharing an op path (one per epoch, one per file) are
//! summed.
//!
//! CPU time, waits and file I/O per op come from thread-level events and
//! are split among the ops by `attribution.rs`.

use std::collections::{BTreeMap, HashMap};

use thiserror::Error;

use crate::attribution::Attributor;
use crate::dataloader::{DataLoaderObservation, DataLoaderSummary};
use crate::event::{self, Event, NodeCounters, NodeRetired, Poll, TargetInfo, WaitCounters};
use crate::opnames;
use crate::totals::{CpuTotals, FileTotals, LockSiteTotals, OpTotals, Stamp, ThreadTotals};

/// Drop names the collector itself reports (beside the probe's).
pub mod drops {
    /// A cumulative counter was lower at the end than at the start.
    pub const COUNTER_WENT_BACKWARDS: &str = "counter_went_backwards";
    /// A retired instance that no poll saw and whose parent is unknown.
    pub const RETIRED_NODE_UNPLACED: &str = "retired_node_unplaced";
    /// A poll older than the previous one (ignored).
    pub const POLL_OUT_OF_ORDER: &str = "poll_out_of_order";
    /// A parallelism value that is not a finite non-negative number (ignored).
    pub const PARALLELISM_INVALID: &str = "parallelism_invalid";
    /// A thread's cumulative CPU time or wait counter was lower at the end
    /// than at the start.
    pub const THREAD_COUNTER_WENT_BACKWARDS: &str = "thread_counter_went_backwards";
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WindowError {
    #[error("no data: the event stream contains no poll of the pipeline")]
    NoData,
    #[error(
        "zero-length window: {polls} poll(s), all at the same instant; \
         at least two polls at different times are needed to measure rates"
    )]
    ZeroLengthWindow { polls: usize },
    #[error("empty pipeline: {polls} polls, but none saw a pipeline node")]
    EmptyPipeline { polls: usize },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndInfo {
    pub partial: bool,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WindowResult {
    pub start: Stamp,
    pub end: Stamp,
    pub polls: usize,
    /// In order of first appearance (poll walk order: consumers first).
    pub ops: Vec<OpTotals>,
    pub target: Option<TargetInfo>,
    pub end_event: Option<EndInfo>,
    /// Probe drops (latest count per `what`) and the collector's own, sorted
    /// by `what`.
    pub drops: Vec<event::DropCount>,
    /// Where the threads' CPU time went; all zero without thread data.
    pub cpu: CpuTotals,
    /// Every thread seen in the window, most CPU first.
    pub threads: Vec<ThreadTotals>,
    /// Files read in the window, sorted by path (then op).
    pub files: Vec<FileTotals>,
    /// Blocking call sites, longest total wait first.
    pub lock_sites: Vec<LockSiteTotals>,
    /// Waits of threads whose op is not known, and outside the pipeline.
    pub unattributed_waits: WaitCounters,
    pub non_pipeline_waits: WaitCounters,
    /// File bytes read for no known op.
    pub unattributed_io_bytes: u64,
    /// What observing the target cost it, when the recording measured it.
    pub probe_cost: Option<event::ProbeCost>,
    /// A PyTorch DataLoader recording's own figures.
    pub dataloader: Option<DataLoaderSummary>,
}

impl WindowResult {
    pub fn duration_ns(&self) -> u64 {
        self.end.mono_ns.saturating_sub(self.start.mono_ns)
    }

    /// The recording has per-thread CPU data (`Threads` events).
    pub fn has_thread_data(&self) -> bool {
        !self.threads.is_empty()
    }

    /// A stream without an `End` event was cut off (a writer always ends with
    /// one), so it counts as partial.
    pub fn partial(&self) -> bool {
        self.end_event.as_ref().is_none_or(|e| e.partial)
    }

    /// Index of the op with this path.
    pub fn op_index(&self, path: &str) -> Option<usize> {
        self.ops.iter().position(|o| o.path == path)
    }

    /// Indices of the ops whose consumer is `ops[i]`, in order of appearance.
    pub fn children(&self, i: usize) -> Vec<usize> {
        let Some(parent) = self.ops.get(i) else {
            return Vec::new();
        };
        self.ops
            .iter()
            .enumerate()
            .filter(|(_, o)| o.parent_path.as_deref() == Some(parent.path.as_str()))
            .map(|(j, _)| j)
            .collect()
    }
}

/// (addr, id): one node instance.
type Key = (u64, i64);

#[derive(Debug)]
struct Instance {
    path: String,
    baseline: NodeCounters,
    last: NodeCounters,
    last_poll: usize,
}

#[derive(Debug)]
struct OpMeta {
    model_name: String,
    path: String,
    parent_path: Option<String>,
    in_function: bool,
    parallelism: Option<f64>,
    ratio: Option<f64>,
    buffer_size: Option<f64>,
}

/// Incremental aggregation: feed events with [`Aggregator::push`] in arrival
/// order, then [`Aggregator::finish`].
#[derive(Debug, Default)]
pub struct Aggregator {
    polls: usize,
    first: Option<Stamp>,
    last: Option<Stamp>,
    instances: HashMap<Key, Instance>,
    ops: Vec<OpMeta>,
    op_index: HashMap<String, usize>,
    retired: HashMap<Key, NodeRetired>,
    target: Option<TargetInfo>,
    end: Option<EndInfo>,
    probe_drops: BTreeMap<String, u64>,
    own_drops: BTreeMap<&'static str, u64>,
    attribution: Attributor,
    probe_cost: Option<event::ProbeCost>,
    /// The first and the latest DataLoader observation.
    dataloader: Option<(DataLoaderObservation, DataLoaderObservation)>,
}

impl Aggregator {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, event: Event) {
        match event {
            Event::Target(t) => self.target = Some(t),
            Event::Poll(p) => self.push_poll(p),
            Event::Retired(r) => self.push_retired(r),
            Event::Drops { drops } => {
                for d in drops {
                    self.probe_drops.insert(d.what, d.count);
                }
            }
            Event::ProbeCost(c) => self.probe_cost = Some(c),
            Event::DataLoader(d) => match &mut self.dataloader {
                Some((_, last)) => *last = *d,
                None => self.dataloader = Some(((*d).clone(), *d)),
            },
            Event::End { partial, reason } => self.end = Some(EndInfo { partial, reason }),
            // Not window totals: `collect` takes them (`Collected::stages`).
            Event::StageStacks(_) => {}
            e @ (Event::Threads { .. }
            | Event::Attribution { .. }
            | Event::Io { .. }
            | Event::LockSites { .. }) => self.attribution.push(e),
        }
    }

    fn drop_own(&mut self, what: &'static str, n: u64) {
        *self.own_drops.entry(what).or_default() += n;
    }

    fn op_for(&mut self, path: &str, make: impl FnOnce() -> OpMeta) -> usize {
        if let Some(&i) = self.op_index.get(path) {
            return i;
        }
        let i = self.ops.len();
        self.ops.push(make());
        self.op_index.insert(path.to_string(), i);
        i
    }

    fn push_poll(&mut self, poll: Poll) {
        if let Some(last) = self.last {
            if poll.mono_ns < last.mono_ns {
                tracing::warn!(
                    poll_mono_ns = poll.mono_ns,
                    previous_mono_ns = last.mono_ns,
                    "ignoring a poll older than the previous one"
                );
                self.drop_own(drops::POLL_OUT_OF_ORDER, 1);
                return;
            }
        }
        let idx = self.polls;
        self.polls += 1;
        let stamp = Stamp {
            mono_ns: poll.mono_ns,
            wall_ns: poll.wall_ns,
            process_cpu_ns: poll.process_cpu_ns,
            machine_busy_ns: poll.machine_busy_ns,
        };
        self.first.get_or_insert(stamp);
        self.last = Some(stamp);
        self.attribution.on_poll(poll.mono_ns);

        // Parents are given by address only; within one poll an address
        // names exactly one live instance.
        let by_addr: HashMap<u64, &str> = poll
            .nodes
            .iter()
            .map(|n| (n.addr, n.path.as_str()))
            .collect();

        for node in &poll.nodes {
            let parent_path = node
                .parent
                .and_then(|p| by_addr.get(&p))
                .map(|s| s.to_string());
            let op = self.op_for(&node.path, || OpMeta {
                model_name: node.name.clone(),
                path: node.path.clone(),
                parent_path: parent_path.clone(),
                in_function: node.in_function,
                parallelism: None,
                ratio: None,
                buffer_size: None,
            });
            if let Some(meta) = self.ops.get_mut(op) {
                if meta.parent_path.is_none() {
                    meta.parent_path = parent_path;
                }
            }
            match node.parallelism {
                Some(p) if p.is_finite() && p >= 0.0 => {
                    if let Some(meta) = self.ops.get_mut(op) {
                        meta.parallelism = Some(p);
                    }
                }
                Some(p) => {
                    tracing::debug!(path = %node.path, value = p, "ignoring invalid parallelism");
                    self.drop_own(drops::PARALLELISM_INVALID, 1);
                }
                None => {}
            }
            if let Some(meta) = self.ops.get_mut(op) {
                // The probe sends only values it checked; the latest wins,
                // as for parallelism.
                let valid = |v: &Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0);
                meta.ratio = valid(&node.ratio).or(meta.ratio);
                meta.buffer_size = valid(&node.buffer_size).or(meta.buffer_size);
            }
            let inst = self
                .instances
                .entry((node.addr, node.id))
                .or_insert_with(|| Instance {
                    path: node.path.clone(),
                    // Seen first after the first poll: born inside the window.
                    baseline: if idx == 0 {
                        node.counters
                    } else {
                        NodeCounters::default()
                    },
                    last: node.counters,
                    last_poll: idx,
                });
            inst.last = node.counters;
            inst.last_poll = idx;
        }
    }

    fn push_retired(&mut self, r: NodeRetired) {
        let key = (r.addr, r.id);
        match self.retired.get(&key) {
            Some(old) if old.mono_ns > r.mono_ns => {
                tracing::debug!(
                    addr = r.addr,
                    id = r.id,
                    "ignoring an older duplicate Retired event"
                );
            }
            _ => {
                self.retired.insert(key, r);
            }
        }
    }

    pub fn finish(mut self) -> Result<WindowResult, WindowError> {
        let (Some(start), Some(end)) = (self.first, self.last) else {
            return Err(WindowError::NoData);
        };
        if end.mono_ns <= start.mono_ns {
            return Err(WindowError::ZeroLengthWindow { polls: self.polls });
        }
        let window = (start.mono_ns, end.mono_ns);
        // Per op accumulation; index = op index.
        let mut acc: Vec<Acc> = Vec::new();
        let (mut backwards, unseen) = self.add_seen_instances(window, &mut acc);
        backwards += self.add_unseen_instances(unseen, window, &mut acc);
        if backwards > 0 {
            tracing::warn!(
                count = backwards,
                "cumulative counters went backwards; clamped to 0"
            );
            self.drop_own(drops::COUNTER_WENT_BACKWARDS, backwards);
        }

        if self.ops.is_empty() {
            return Err(WindowError::EmptyPipeline { polls: self.polls });
        }

        let mut ops = self.op_totals(&acc);
        let attributed = std::mem::take(&mut self.attribution).finish(&mut ops, start, end);
        if attributed.backwards > 0 {
            tracing::warn!(
                count = attributed.backwards,
                "thread CPU or wait counters went backwards; clamped to 0"
            );
            self.drop_own(drops::THREAD_COUNTER_WENT_BACKWARDS, attributed.backwards);
        }

        let dataloader = self.dataloader.and_then(|(first, last)| {
            crate::dataloader::summarise(&first, &last, &attributed.files_by_pid)
        });
        if let Some(d) = &dataloader {
            crate::loader_ops::charge_locks(d, &mut ops);
            crate::loader_ops::charge_cpu(d, &mut ops);
        }

        let mut drops: BTreeMap<String, u64> = self.probe_drops;
        for (what, n) in self.own_drops {
            let e = drops.entry(what.to_string()).or_default();
            *e = e.saturating_add(n);
        }
        Ok(WindowResult {
            start,
            end,
            polls: self.polls,
            ops,
            target: self.target,
            end_event: self.end,
            drops: drops
                .into_iter()
                .map(|(what, count)| event::DropCount { what, count })
                .collect(),
            cpu: attributed.cpu,
            threads: attributed.threads,
            files: attributed.files,
            lock_sites: attributed.lock_sites,
            unattributed_waits: attributed.unattributed_waits,
            non_pipeline_waits: attributed.non_pipeline_waits,
            unattributed_io_bytes: attributed.unattributed_io_bytes,
            probe_cost: self.probe_cost,
            dataloader,
        })
    }

    /// Adds each instance a poll saw: its final counters (from its Retired
    /// event inside the window, else the last poll) less its baseline.
    /// Returns the counters that went backwards and the retired instances
    /// no poll saw.
    fn add_seen_instances(
        &mut self,
        (lo, hi): (u64, u64),
        acc: &mut Vec<Acc>,
    ) -> (u64, Vec<NodeRetired>) {
        let in_window = |mono: u64| lo <= mono && mono <= hi;
        let last_poll = self.polls.saturating_sub(1);
        let mut backwards = 0u64;
        // Instances seen by polls.
        let mut finals: HashMap<Key, NodeCounters> = HashMap::new();
        let mut unseen: Vec<NodeRetired> = Vec::new();
        let retired = std::mem::take(&mut self.retired);
        for (key, r) in retired {
            if self.instances.contains_key(&key) {
                if in_window(r.mono_ns) {
                    finals.insert(key, r.counters);
                }
            } else {
                unseen.push(r);
            }
        }
        for (key, inst) in &self.instances {
            let Some(&op) = self.op_index.get(&inst.path) else {
                continue;
            };
            let fin = finals.get(key).copied().unwrap_or(inst.last);
            let a = acc_at(acc, op);
            a.instances += 1;
            backwards += a.add_delta(&inst.baseline, &fin);
            if inst.last_poll == last_poll {
                a.live += 1;
                a.buffered_elements = a
                    .buffered_elements
                    .saturating_add(inst.last.buffered_elements);
                a.buffered_bytes = a.buffered_bytes.saturating_add(inst.last.buffered_bytes);
            }
        }
        (backwards, unseen)
    }

    /// Instances born and retired between polls: placed under their parent.
    /// Out-of-window ones still help to place their children. Returns the
    /// counters that went backwards.
    fn add_unseen_instances(
        &mut self,
        mut unseen: Vec<NodeRetired>,
        (lo, hi): (u64, u64),
        acc: &mut Vec<Acc>,
    ) -> u64 {
        let in_window = |mono: u64| lo <= mono && mono <= hi;
        let mut backwards = 0u64;
        unseen.sort_by_key(|r| (r.mono_ns, r.addr, r.id));
        let mut paths = KnownPaths::default();
        for (k, i) in &self.instances {
            paths.insert(*k, &i.path);
        }
        let mut pending: Vec<NodeRetired> = unseen;
        loop {
            let before = pending.len();
            let mut still = Vec::new();
            for r in pending {
                match self.place(&r, &paths) {
                    Some((parent_path, path)) => {
                        paths.insert((r.addr, r.id), &path);
                        if in_window(r.mono_ns) {
                            let op = self.op_for_retired(&r, &parent_path, &path);
                            let a = acc_at(acc, op);
                            a.instances += 1;
                            backwards += a.add_delta(&NodeCounters::default(), &r.counters);
                        }
                    }
                    None => still.push(r),
                }
            }
            pending = still;
            if pending.len() == before || pending.is_empty() {
                break;
            }
        }
        let unplaced = pending.iter().filter(|r| in_window(r.mono_ns)).count() as u64;
        if unplaced > 0 {
            tracing::warn!(
                count = unplaced,
                "retired node instances with no known parent"
            );
            self.drop_own(drops::RETIRED_NODE_UNPLACED, unplaced);
        }
        backwards
    }

    /// Each op's totals from its accumulation, with its element ratio.
    fn op_totals(&self, acc: &[Acc]) -> Vec<OpTotals> {
        let mut ops: Vec<OpTotals> = self
            .ops
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let a = acc.get(i).cloned().unwrap_or_default();
                let parallelism = match m.parallelism {
                    Some(p) => Some(p),
                    None if !opnames::has_parallelism_knob(&m.model_name) => Some(1.0),
                    None => None,
                };
                OpTotals {
                    model_name: m.model_name.clone(),
                    path: m.path.clone(),
                    parent_path: m.parent_path.clone(),
                    in_function: m.in_function,
                    instances: a.instances,
                    live_instances: a.live,
                    elements: a.d.num_elements,
                    bytes_produced: a.d.bytes_produced,
                    bytes_consumed: a.d.bytes_consumed,
                    processing_time_ns: a.d.processing_time_ns,
                    buffered_elements: a.buffered_elements,
                    buffered_bytes: a.buffered_bytes,
                    parallelism,
                    ratio: m.ratio,
                    buffer_size: m.buffer_size,
                    element_ratio: -1.0,
                    cpu_ns: 0,
                    cpu_from_self_time: false,
                    udf_cpu_ns: 0,
                    waits: WaitCounters::default(),
                    io_bytes_read: 0,
                    io_read_ns: 0,
                    files_opened: 0,
                    files: Vec::new(),
                }
            })
            .collect();
        let ratios: Vec<f64> = (0..ops.len())
            .map(|i| {
                let input = ops.iter().find(|c| {
                    !c.in_function && c.parent_path.as_deref() == Some(ops[i].path.as_str())
                });
                element_ratio(input.map(|c| c.elements), ops[i].elements)
            })
            .collect();
        for (op, r) in ops.iter_mut().zip(ratios) {
            op.element_ratio = r;
        }
        ops
    }

    /// (parent path, own path) of a retired instance no poll saw.
    fn place(&self, r: &NodeRetired, paths: &KnownPaths) -> Option<(String, String)> {
        if r.name.is_empty() {
            return None;
        }
        let parent_addr = r.parent?;
        let parent_path = match r.parent_id {
            Some(pid) => paths.by_key.get(&(parent_addr, pid))?.clone(),
            None => paths.by_addr.get(&parent_addr)?.clone()?,
        };
        let path = format!("{parent_path}::{}", r.name);
        Some((parent_path, path))
    }

    fn op_for_retired(&mut self, r: &NodeRetired, parent_path: &str, path: &str) -> usize {
        if let Some(&i) = self.op_index.get(path) {
            return i;
        }
        // An op no poll ever saw: under a function-owning parent that already
        // has its input dataset, it can only be a function dataset.
        let parent = self
            .op_index
            .get(parent_path)
            .and_then(|&i| self.ops.get(i));
        let in_function = parent.is_some_and(|p| {
            opnames::owns_functions(&p.model_name)
                && self
                    .ops
                    .iter()
                    .any(|o| !o.in_function && o.parent_path.as_deref() == Some(parent_path))
        });
        tracing::debug!(path, in_function, "op known only from retired instances");
        self.op_for(path, || OpMeta {
            model_name: r.name.clone(),
            path: path.to_string(),
            parent_path: Some(parent_path.to_string()),
            in_function,
            parallelism: None,
            ratio: None,
            buffer_size: None,
        })
    }
}

/// Paths of the instances known so far, to place retired instances under
/// their parent.
#[derive(Default)]
struct KnownPaths {
    by_key: HashMap<Key, String>,
    /// For a parent given without an id: the path, or None when instances
    /// with different paths were seen at that address (reused), which makes
    /// it ambiguous.
    by_addr: HashMap<u64, Option<String>>,
}

impl KnownPaths {
    fn insert(&mut self, key: Key, path: &str) {
        self.by_key.insert(key, path.to_string());
        self.by_addr
            .entry(key.0)
            .and_modify(|p| {
                if p.as_deref() != Some(path) {
                    *p = None;
                }
            })
            .or_insert_with(|| Some(path.to_string()));
    }
}

fn element_ratio(input_elements: Option<i64>, own: i64) -> f64 {
    match input_elements {
        None | Some(0) => -1.0,
        Some(_) if own == 0 => f64::INFINITY,
        Some(inp) => inp as f64 / own as f64,
    }
}

#[derive(Clone, Debug, Default)]
struct Acc {
    instances: i64,
    live: i64,
    d: NodeCounters,
    buffered_elements: i64,
    buffered_bytes: i64,
}

impl Acc {
    /// Adds `fin - base` of every cumulative counter; returns how many went
    /// backwards (each clamped to 0).
    fn add_delta(&mut self, base: &NodeCounters, fin: &NodeCounters) -> u64 {
        self.d.add_delta(base, fin)
    }
}

fn acc_at(acc: &mut Vec<Acc>, i: usize) -> &mut Acc {
    if acc.len() <= i {
        acc.resize(i + 1, Acc::default());
    }
    &mut acc[i]
}

/// Aggregates a whole event stream.
pub fn aggregate(events: impl IntoIterator<Item = Event>) -> Result<WindowResult, WindowError> {
    let mut agg = Aggregator::new();
    for e in events {
        agg.push(e);
    }
    agg.finish()
}
