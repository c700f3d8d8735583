//! The event model shared by every source (the BPF/memory probe, the
//! LD_PRELOAD shim, a recorded event file). Sources only observe; all
//! arithmetic over the recording window happens in the collector.
//!
//! A recorded event file is JSON lines, one [`Event`] per line.

use serde::{Deserialize, Serialize};

/// Counters TensorFlow keeps in each autotune `model::Node`. All are
/// cumulative over the node's life, except the two `buffered_*` gauges.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounters {
    pub num_elements: i64,
    pub bytes_produced: i64,
    pub bytes_consumed: i64,
    /// Self wall time in ns (`Node::processing_time_`), UDF kernel time included.
    pub processing_time_ns: i64,
    pub buffered_elements: i64,
    pub buffered_bytes: i64,
}

impl NodeCounters {
    /// Adds `fin - base` of each cumulative counter (not the gauges);
    /// returns how many went backwards (each clamped to 0).
    pub fn add_delta(&mut self, base: &NodeCounters, fin: &NodeCounters) -> u64 {
        let mut back = 0u64;
        let mut add = |sum: &mut i64, b: i64, f: i64| {
            let d = f.saturating_sub(b);
            if d < 0 {
                back += 1;
            } else {
                *sum = sum.saturating_add(d);
            }
        };
        add(&mut self.num_elements, base.num_elements, fin.num_elements);
        add(
            &mut self.bytes_produced,
            base.bytes_produced,
            fin.bytes_produced,
        );
        add(
            &mut self.bytes_consumed,
            base.bytes_consumed,
            fin.bytes_consumed,
        );
        add(
            &mut self.processing_time_ns,
            base.processing_time_ns,
            fin.processing_time_ns,
        );
        back
    }
}

/// One pipeline node as seen at one poll.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeObservation {
    /// Address of the object in the target. Together with `id` it identifies
    /// one node instance (addresses are reused after free; ids are not).
    pub addr: u64,
    /// Model node id (unique and increasing within one model).
    pub id: i64,
    /// Model node name, e.g. `ParallelMapV2`, `TFRecord`, `ForeverRepeat`.
    pub name: String,
    /// Stable op path from the root, e.g. `Root::Prefetch::BatchV2`.
    /// Instances re-created per epoch or per file share one path.
    pub path: String,
    /// Address of the parent (`output_`) node, None for the root.
    pub parent: Option<u64>,
    /// True when this node was created by its parent's function (the
    /// dataset an interleave or flat_map builds per input element) rather
    /// than being the parent's input dataset.
    #[serde(default)]
    pub in_function: bool,
    pub counters: NodeCounters,
    /// Current parallelism TensorFlow uses for this op, where known.
    #[serde(default)]
    pub parallelism: Option<f64>,
    /// The fixed element ratio of a known-ratio model node (a batch's
    /// batch size), where read and checked against the counts. Absent in
    /// recordings made before it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// A prefetch's current buffer size (its model parameter), where read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_size: Option<f64>,
}

/// A walk of the whole pipeline tree at one instant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Poll {
    /// CLOCK_MONOTONIC ns (the clock of `bpf_ktime_get_ns`), for ordering
    /// against events from BPF.
    pub mono_ns: u64,
    /// Unix-epoch ns.
    pub wall_ns: u64,
    /// CPU time (user + system) of the whole target process, ns.
    pub process_cpu_ns: u64,
    /// Busy CPU time of the whole machine since boot (every state but idle
    /// and iowait, steal included), ns: over the window, less the target's,
    /// it is what other processes took from the cores. None: not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_busy_ns: Option<u64>,
    /// Nodes in walk order, root first.
    pub nodes: Vec<NodeObservation>,
}

/// A node instance whose iterator was destroyed; its counters are final.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeRetired {
    pub mono_ns: u64,
    pub addr: u64,
    pub id: i64,
    /// Model node name if it could be read (empty otherwise).
    pub name: String,
    /// Parent node, to place an instance that no poll ever saw.
    pub parent: Option<u64>,
    pub parent_id: Option<i64>,
    pub counters: NodeCounters,
}

/// What the target is and how it is observed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct TargetInfo {
    pub pid: i64,
    pub tensorflow_version: String,
    /// Libraries found in the target (paths as the target sees them).
    pub libraries: Vec<String>,
    /// `model` or `uprobes`.
    pub mode: String,
    pub num_cores: i64,
    /// The target's cgroup CPU quota in cores (cpu.max, the tightest on its
    /// path), when one is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_cores: Option<f64>,
    pub memory_total: i64,
    pub memory_free: i64,
    /// Measurements this source does not make (the shim's limits): their
    /// zeros mean "not measured". Empty for `--pid` mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_measured: Vec<String>,
}

/// Lost events or rejected objects, with a short name of what was lost.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DropCount {
    pub what: String,
    pub count: u64,
}

impl DropCount {
    pub fn new(what: impl Into<String>, count: u64) -> Self {
        DropCount {
            what: what.into(),
            count,
        }
    }
}

/// The probe's own cost to the target over the window, by mechanism, as
/// the recording measured it. Every figure is counted, not timed against a
/// baseline: the kernel's BPF run-time statistics, uprobe hits times a
/// per-hit cost calibrated on this machine, the probe process's CPU time.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ProbeCost {
    /// The target's CPU time over the window, ns.
    pub target_cpu_ns: u64,
    /// Run time of the probe's BPF programs, ns (in the target's context,
    /// or run for it: programs on scheduler or syscall tracepoints also run
    /// for other processes, and count in full).
    pub bpf_ns: u64,
    /// Uprobe and uretprobe hits in the target (each is a trap into the
    /// kernel).
    pub trap_hits: u64,
    /// The calibrated cost of the traps without their programs, ns: the
    /// entry probes' hits (`trap_hits - retprobe_hits`) times
    /// `trap_cost_ns`, plus `retprobe_hits` times `retprobe_cost_ns`.
    pub trap_ns: u64,
    /// The calibrated cost of one entry trap, ns (0: not calibrated).
    pub trap_cost_ns: u64,
    /// The hits of return probes among `trap_hits`.
    #[serde(default)]
    pub retprobe_hits: u64,
    /// What a return probe adds to a call its function's entry probe
    /// already traps, ns (calibrated with `trap_cost_ns`).
    #[serde(default)]
    pub retprobe_cost_ns: u64,
    /// The shim's own time in the target, ns (`plumber-probe run`: its
    /// hooks and their clock reads; 0 under `--pid`).
    #[serde(default)]
    pub shim_ns: u64,
    /// The probe process's own CPU time, ns: it competes for the cores.
    pub probe_cpu_ns: u64,
    /// The share of the target's CPU the user allowed (0.01 = 1%).
    pub budget: f64,
    /// Per probe: hits and BPF run time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<ProbeHits>,
    /// What was thinned to stay within the budget, and what that costs in
    /// accuracy; empty when nothing was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinned: Vec<String>,
}

impl ProbeCost {
    /// The cost's parts, summed, ns.
    pub fn total_ns(&self) -> u64 {
        self.bpf_ns
            .saturating_add(self.trap_ns)
            .saturating_add(self.shim_ns)
            .saturating_add(self.probe_cpu_ns)
    }

    /// The cost as a share of the target's CPU over the window (0 when the
    /// target used none).
    pub fn target_share(&self) -> f64 {
        if self.target_cpu_ns == 0 {
            0.0
        } else {
            self.total_ns() as f64 / self.target_cpu_ns as f64
        }
    }
}

/// One probe's part of [`ProbeCost`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ProbeHits {
    pub name: String,
    pub hits: u64,
    pub bpf_ns: u64,
    /// A uprobe (its hits are traps).
    pub uprobe: bool,
}

/// Time a thread spent blocked, by cause. Cumulative since the probe
/// attached (not since the thread started).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCounters {
    /// `absl::Mutex` slow path (another thread holds the lock): contention.
    pub lock_wait_ns: u64,
    pub lock_waits: u64,
    /// Blocked for any other reason: an op waiting for input or for buffer
    /// space (condition variables), an idle pool waiting for work, a sleep;
    /// starvation or back-pressure, not contention. Timed from context
    /// switches (voluntary switch-out to switch-in) during the attribution
    /// windows and scaled to the whole recording by the probe.
    pub cond_wait_ns: u64,
    pub cond_waits: u64,
    /// CPython GIL acquisition (`take_gil`, else `PyEval_RestoreThread`).
    pub gil_wait_ns: u64,
    pub gil_waits: u64,
    /// Reserved: futex waits outside the lock and GIL slow paths are part
    /// of `cond_wait_ns`; not measured separately (0).
    pub futex_wait_ns: u64,
    pub futex_waits: u64,
    /// Time inside read/pread64/readv/preadv syscalls on tracked files.
    pub io_wait_ns: u64,
}

/// One thread of the target at one instant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ThreadObservation {
    pub tid: u32,
    /// TensorFlow's own name for the thread where it has one (its thread
    /// name registry: `tf_data_private_threadpool`, ...), else /proc comm.
    pub name: String,
    /// On-CPU ns since the thread started (the kernel's sum_exec_runtime):
    /// cumulative, so the window's share is `last - first`.
    pub cpu_ns: u64,
    #[serde(default)]
    pub waits: WaitCounters,
    /// The thread has exited; these are its final values.
    #[serde(default)]
    pub exited: bool,
}

/// Evidence of which op a thread works for: on-CPU time and waits of one
/// thread, split at TensorFlow's `model::Node::record_stop(node)` calls
/// (each call ends a stretch of work done for `node`), measured during
/// short attribution windows. Cumulative since the probe attached; used as
/// ratios, never as absolute times.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct AttributionSample {
    pub tid: u32,
    /// Model node address (the `record_stop` argument).
    pub node: u64,
    /// Stable op path of that node; empty when the node was never seen in
    /// the pipeline being recorded (another pipeline, or a dead node).
    pub op_path: String,
    pub cpu_ns: u64,
    #[serde(default)]
    pub waits: WaitCounters,
    #[serde(default)]
    pub io_bytes: u64,
    /// Number of record_stop calls seen.
    pub stops: u64,
}

/// File I/O of one thread on one file since the previous `Io` event.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct FileIo {
    /// Path as the target sees it.
    pub path: String,
    /// The process that read, where a recording follows several (a
    /// PyTorch job's training process and workers); absent: the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Op the reads were made for (innermost `GetNextInternal` frame on the
    /// user stack, matched to the pipeline); empty when unknown.
    pub op_path: String,
    pub tid: u32,
    pub bytes_read: u64,
    pub reads: u64,
    pub opens: u64,
    /// ns spent inside the read syscalls.
    pub read_ns: u64,
    /// File size (st_size) when it could be read.
    #[serde(default)]
    pub size: Option<u64>,
    /// Open-to-close sessions that ended here and began during the
    /// recording, and the bytes read in them: a file read once from its
    /// start to its close (Plumber records a file's size the same way, when
    /// a reader reaches its end).
    #[serde(default)]
    pub complete_sessions: u64,
    #[serde(default)]
    pub complete_bytes: u64,
}

/// Blocking at one call site since the previous `LockSites` event.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct LockSite {
    /// `mutex`, `condvar`, `gil` or `futex`.
    pub kind: String,
    /// The waiting function: the innermost frame outside the lock
    /// implementation, symbolized (`tensorflow::data::...::GetNextInternal`).
    pub site: String,
    /// Op of the innermost `GetNextInternal` frame on the stack, else empty.
    pub op_path: String,
    pub tid: u32,
    pub waits: u64,
    pub wait_ns: u64,
}

/// The DataLoader's stage sampler's stacks over a recording (stages.folded,
/// profile.pb.gz): wall ns per stack of one process in one stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct StageStacks {
    /// The training process.
    pub pid: i32,
    /// The sampler's ticks per second.
    pub hz: u32,
    /// When sampling ran, ns since the epoch.
    pub start_wall_ns: u64,
    pub end_wall_ns: u64,
    pub stacks: Vec<StageStack>,
    /// trace.json's spans: one per stretch of ticks of one thread in one
    /// stage and function.
    #[serde(default)]
    pub spans: Vec<crate::stacks::Span>,
}

/// One stage stack: rooted at `[stage]` and the process (`frames`, as in
/// stages.folded), with the labels of its profile sample.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct StageStack {
    pub frames: Vec<String>,
    /// The stage's key (`get_item`, `wait`, ...).
    pub stage: String,
    /// `training loop (pid N)`, `worker K (pid M)`.
    pub process: String,
    pub pid: i64,
    pub value: u64,
}

impl StageStack {
    /// As the outputs take it: the stage, process and pid as labels.
    pub fn labeled(&self) -> crate::stacks::LabeledStack {
        use crate::stacks::LabelValue;
        crate::stacks::LabeledStack {
            frames: self.frames.clone(),
            labels: vec![
                ("stage", LabelValue::Str(self.stage.clone())),
                ("process", LabelValue::Str(self.process.clone())),
                ("pid", LabelValue::Num(self.pid)),
            ],
            value: self.value,
        }
    }

    /// Back from [`StageStack::labeled`]'s form.
    pub fn from_labeled(s: &crate::stacks::LabeledStack) -> StageStack {
        use crate::stacks::LabelValue;
        let text = |key: &str| match s.labels.iter().find(|(k, _)| *k == key) {
            Some((_, LabelValue::Str(v))) => v.clone(),
            _ => String::new(),
        };
        let pid = s
            .labels
            .iter()
            .find_map(|(k, v)| match (*k, v) {
                ("pid", LabelValue::Num(n)) => Some(*n),
                _ => None,
            })
            .unwrap_or(0);
        StageStack {
            frames: s.frames.clone(),
            stage: text("stage"),
            process: text("process"),
            pid,
            value: s.value,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Target(TargetInfo),
    Poll(Poll),
    Retired(NodeRetired),
    /// Every thread of the target known at one instant (live ones from
    /// /proc, exited ones with their final values). Emitted at each poll.
    Threads {
        mono_ns: u64,
        threads: Vec<ThreadObservation>,
    },
    /// Cumulative attribution evidence; a later event replaces an earlier.
    Attribution {
        mono_ns: u64,
        samples: Vec<AttributionSample>,
    },
    /// File I/O since the previous `Io` event, up to `mono_ns`. Counted in
    /// the window when `start < mono_ns <= end`.
    Io {
        mono_ns: u64,
        files: Vec<FileIo>,
    },
    /// Lock, condition-variable, GIL and futex waits by call site since the
    /// previous `LockSites` event, counted like `Io`.
    LockSites {
        mono_ns: u64,
        sites: Vec<LockSite>,
    },
    /// Cumulative drop counts (a later Drops for the same `what` replaces
    /// the earlier value).
    Drops {
        drops: Vec<DropCount>,
    },
    /// What observing the target cost it over the window so far; a later
    /// event replaces an earlier.
    ProbeCost(ProbeCost),
    /// A PyTorch DataLoader's stages, cumulative, at a poll.
    DataLoader(Box<crate::dataloader::DataLoaderObservation>),
    /// A DataLoader recording's stage stacks, known once its stage sampler
    /// has finished: saved after `End`, so that a replay finds the Python
    /// functions and hot spots the recording found.
    StageStacks(Box<StageStacks>),
    /// End of the recording. `partial` is set when it ended before the
    /// requested duration (target exited, interrupted).
    End {
        partial: bool,
        reason: String,
    },
}
