//! The report (report.json): the measured fields (owned by the collector,
//! embedded unchanged with `#[serde(flatten)]`) plus the analyzer's.
//! Documented field by field in docs/report-json-analyzer.md.

use std::collections::BTreeMap;

use plumber_collector::report::MeasuredNode;
pub use plumber_collector::report::MeasuredSummary;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Report {
    #[serde(flatten)]
    pub measured: MeasuredSummary,
    /// "cpu_clock" (thread CPU time, Plumber's model) or "wallclock" (wall
    /// time, when the file has no CPU time).
    pub cpu_source: String,
    /// Window length the counters cover, seconds.
    pub elapsed_s: f64,
    pub machine: MachineReport,
    /// Root elements per second the pipeline delivered.
    pub observed_rate: f64,
    /// Root elements per second the model predicts for the pipeline as it
    /// is (null: nothing bounds it).
    pub predicted_rate: Option<f64>,
    /// The assumption every prediction rests on, in one line (the cores
    /// free as during the window).
    pub assumes: String,
    /// Set when the pipeline delivered well below what the model says it
    /// can: what else holds it back (more parallelism would not help).
    pub limited_elsewhere: Option<Elsewhere>,
    pub bottleneck: Option<Bottleneck>,
    pub utilisation: Utilisation,
    pub lp: LpReport,
    pub cache: CacheReport,
    pub prefetch: PrefetchReport,
    /// What to change, in order; each `predicted_rate` assumes this and
    /// every earlier recommendation applied.
    pub recommendations: Vec<Recommendation>,
    /// A DataLoader's recommendations predict the model's rate times
    /// this: the share of `predicted_rate` it delivered as recorded, when
    /// less (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predictions_scaled_by: Option<f64>,
    /// Op names, lowest max rate first.
    pub ranking: Vec<String>,
    /// Assumptions and fallbacks the analysis made.
    pub notes: Vec<String>,
    pub nodes: Vec<NodeReport>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct MachineReport {
    pub cores: f64,
    /// "file", "override", "threadpool" or "assumed".
    pub cores_from: String,
    /// Memory the cache budget is taken from, bytes.
    pub memory_bytes: Option<f64>,
    pub memory_from: String,
    /// Storage bandwidth, bytes/s (null: unknown).
    pub disk_bandwidth: Option<f64>,
    pub disk_bandwidth_from: String,
    pub budget: BudgetReport,
}

/// The core budget's terms over the window, cores.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct BudgetReport {
    /// The machine's cores (the file's count, or `--cores`).
    pub cores: f64,
    /// The target's cgroup CPU quota (null: none set or not known).
    pub quota_cores: Option<f64>,
    /// CPU other processes took (the probe's included); null: not measured.
    pub other_processes_cores: Option<f64>,
    /// The target's CPU outside the pipeline (training step, Python,
    /// TensorFlow's own pools).
    pub outside_pipeline_cores: f64,
    /// The part of it fixed per second (threads that neither take the
    /// root's elements nor wake once per element): off the LP's cores
    /// rather than charged per element.
    #[serde(default)]
    pub fixed_outside_cores: f64,
    /// Pipeline threads' CPU that no op claims.
    pub unattributed_cores: f64,
    /// What the pipeline's ops had: min(cores, quota) − the three above.
    pub pipeline_cores: f64,
    /// (outside_pipeline − fixed_outside) + unattributed CPU-seconds per
    /// root element, charged beside the ops as the rate grows.
    pub overhead_s_per_element: f64,
}

/// What holds the pipeline back when it is not its own ops.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Elsewhere {
    /// "consumer", "other_processes" or "gil".
    pub by: String,
    pub why: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Bottleneck {
    pub name: String,
    pub op: String,
    /// "cpu", "io", "lock" or "gil".
    pub reason: String,
    /// What bounds the pipeline: "op" (the op at its parallelism), "io"
    /// (its read streams), "disk" (storage bandwidth) or "cores" (the core
    /// budget).
    pub bound: String,
    pub rate: Option<f64>,
    pub why: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Utilisation {
    /// CPU time of the pipeline's ops / (cores × window), a ratio.
    pub cpu: f64,
    pub cores_used: f64,
    /// Process CPU time / (cores × window), when the file has it.
    pub process_cpu: Option<f64>,
    /// Disk throughput / bandwidth, a ratio (null: bandwidth unknown).
    pub disk: Option<f64>,
    pub disk_throughput: f64,
    pub disk_bytes_read: f64,
    pub disk_bytes_per_root_element: f64,
    /// Rate the storage bandwidth allows (null: unknown).
    pub disk_bound_rate: Option<f64>,
    /// 1 − free/total, when the file has both.
    pub memory: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct LpReport {
    /// X*, the LP optimum (CPU only), root elements/s; null: unbounded.
    pub rate: Option<f64>,
    pub cores: f64,
    /// `cores` (the budget binds) or `cap:NODE` (that op's cap binds).
    pub binding: String,
    /// Node name -> cores at the LP rate (threads θ for an op that does
    /// not wait; fewer for one whose threads wait).
    pub allocation: BTreeMap<String, f64>,
    /// Knob node -> integer parallelism (θ rounded up), for ops that take
    /// parallelism.
    pub parallelism: BTreeMap<String, u32>,
    /// Rate with the rounded parallelism (CPU only).
    pub rounded_rate: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CacheBlock {
    /// Op whose output fits but cannot be cached.
    pub node: String,
    /// The random op below it.
    pub random: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CacheReport {
    pub budget_bytes: Option<f64>,
    pub working_set_bytes: Option<f64>,
    /// Op to cache after (the one closest to the root that fits).
    pub node: Option<String>,
    pub size_bytes: Option<f64>,
    pub blocked_by: Vec<CacheBlock>,
    pub existing: Option<String>,
    /// Why there is no candidate.
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct PrefetchReport {
    /// Σ 1/R1: CPU seconds one root element takes through every op.
    pub min_latency_s: f64,
    pub rate: f64,
    pub in_flight_needed: f64,
    pub in_flight: f64,
    pub add: u32,
    /// Op above which the buffer goes.
    pub at: Option<String>,
    /// `at` is already a PrefetchDataset (its buffer is raised, never
    /// shrunk).
    pub at_is_prefetch: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Recommendation {
    /// "parallelism", "gil", "lock", "disk", "prefetch" or "cache"; for a
    /// DataLoader "workers", "prefetch" or "persistent_workers".
    pub kind: String,
    pub node: String,
    pub value: f64,
    /// Unit of `value`: "threads", "serial share", "parallel reads",
    /// "bytes/s", "elements" or "bytes"; for a DataLoader "workers",
    /// "prefetch_factor" or "persistent_workers" (1: on).
    pub unit: String,
    /// Root elements/s after this and every earlier recommendation (null:
    /// unbounded).
    pub predicted_rate: Option<f64>,
    pub why: String,
    /// What the prediction assumes, in one line.
    pub assumes: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Contention {
    pub lock_wait_s: f64,
    pub gil_wait_s: f64,
    /// Share of the op's thread time spent waiting.
    pub wait_share: f64,
    /// Amdahl serial share σ.
    pub serial_share: f64,
    /// 1/σ.
    pub max_speedup: Option<f64>,
    /// Threads past which another adds < 10% of one thread's rate.
    pub useful_parallelism: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct NodeReport {
    #[serde(flatten)]
    pub measured: MeasuredNode,
    /// Dataset inputs (names).
    pub inputs: Vec<String>,
    /// Top datasets built by this op's functions.
    pub function_inputs: Vec<String>,
    /// FunctionDef the op lives in (null: top-level graph).
    pub function: Option<String>,
    pub source: bool,
    pub stale: bool,
    pub random: bool,
    /// This op's output elements per root element.
    pub visit_ratio: f64,
    /// R1: root elements/s one core running only this op sustains.
    pub rate_per_core: Option<f64>,
    /// Parallelism the model uses (per op; × the enclosing interleave's).
    pub model_parallelism: f64,
    /// Rate at that parallelism, root elements/s (null: unbounded).
    pub max_rate: Option<f64>,
    pub observed_rate: f64,
    /// Rate the edge out of this op can carry: lowest max rate in its
    /// subtree.
    pub edge_rate: Option<f64>,
    /// "cpu", "io", "lock" or "gil"; "none" when the op has no rate (no
    /// stats, no time or no elements).
    pub limited_by: String,
    /// Position in the ranking (1 = bottleneck op).
    pub rank: Option<usize>,
    /// Seconds of the chosen time (cpu_source) over the window.
    pub time_s: f64,
    pub cores_used: f64,
    /// Busy share per thread (Plumber's p_busy).
    pub busy: f64,
    /// File readers: rate including storage wait at the op's parallelism.
    pub io_rate: Option<f64>,
    pub contention: Option<Contention>,
    /// Estimated bytes of the op's output over one pass.
    pub materialized_bytes: Option<f64>,
    /// Cores the LP gives the op.
    pub lp_cores: Option<f64>,
}
