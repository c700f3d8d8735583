//! The collector's value types: what one recording window holds per op,
//! per thread, per file and per lock site, and the clocks at a poll. They
//! live apart from the trackers that fill them (`window.rs`,
//! `attribution.rs`, `threads.rs`, `fileio.rs`) so that those import this
//! file and not each other.

use crate::event::WaitCounters;

/// A u64 total as stats.pb's int64 fields hold it, saturated rather than
/// wrapped to a negative count.
pub(crate) fn sat_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The clocks at one poll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub mono_ns: u64,
    pub wall_ns: u64,
    pub process_cpu_ns: u64,
    /// The machine's busy CPU time since boot, ns (None: not read).
    pub machine_busy_ns: Option<u64>,
}

/// Totals of one op (all instances sharing one path) over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpTotals {
    /// Model node name, e.g. `ParallelMapV2`.
    pub model_name: String,
    /// Stable op path, e.g. `Root::Prefetch::BatchV2`.
    pub path: String,
    /// Path of the consumer op; None for the root of the tree.
    pub parent_path: Option<String>,
    /// Built by the parent's function rather than being its input.
    pub in_function: bool,
    /// Instances that contributed to the window (born and retired inside it
    /// included).
    pub instances: i64,
    /// Instances live at the last poll.
    pub live_instances: i64,
    pub elements: i64,
    pub bytes_produced: i64,
    pub bytes_consumed: i64,
    pub processing_time_ns: i64,
    /// At the last poll, summed over live instances.
    pub buffered_elements: i64,
    pub buffered_bytes: i64,
    /// Latest known value; None when the op has a parallelism knob whose
    /// value was never read.
    pub parallelism: Option<f64>,
    /// Latest fixed element ratio TensorFlow's model holds for the op (a
    /// batch's batch size), where read.
    pub ratio: Option<f64>,
    /// Latest buffer size of a prefetch, where read.
    pub buffer_size: Option<f64>,
    /// Elements of the first non-function input / own elements; -1 without
    /// such an input or when it produced nothing, +inf when this op produced
    /// nothing (Plumber's `ElementRatio`).
    pub element_ratio: f64,
    /// Thread CPU time attributed to the op, ns (0 without thread data).
    pub cpu_ns: u64,
    /// No attribution window caught the op: `cpu_ns` is TensorFlow's self
    /// time for it, moved from where its thread's time went
    /// (`unmeasured.rs`).
    pub cpu_from_self_time: bool,
    /// The part of `cpu_ns` from the UDF pool's threads.
    pub udf_cpu_ns: u64,
    /// Waits attributed to the op.
    pub waits: WaitCounters,
    /// File bytes read for the op and time inside those reads.
    pub io_bytes_read: u64,
    pub io_read_ns: u64,
    /// Files opened for the op (opens, not distinct files).
    pub files_opened: u64,
    /// Distinct paths the op read, sorted.
    pub files: Vec<String>,
}

/// What a thread does, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThreadRole {
    /// `tf_data_private_threadpool`: runs the user functions of the
    /// function-running ops.
    UdfPool,
    /// Other tf.data threads (`tf_data_*`, `dataset*`).
    Pipeline,
    /// Everything else: training step, Python, `tf_Compute`, Eigen, ...
    NonPipeline,
}

impl ThreadRole {
    pub fn from_name(name: &str) -> ThreadRole {
        if name.starts_with("tf_data_private_threadpool") {
            ThreadRole::UdfPool
        } else if name.starts_with("tf_data") || name.starts_with("dataset") {
            ThreadRole::Pipeline
        } else {
            ThreadRole::NonPipeline
        }
    }

    /// Name used in stats.pb and report.json.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadRole::UdfPool => "udf_pool",
            ThreadRole::Pipeline => "pipeline",
            ThreadRole::NonPipeline => "non_pipeline",
        }
    }
}

/// Where the CPU time of the target's threads went over the window, ns.
/// All zero when the recording has no thread data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTotals {
    /// The whole process (end - start of the polls' process CPU time).
    pub process_cpu_ns: u64,
    /// Σ over the threads seen.
    pub threads_cpu_ns: u64,
    /// Σ over the ops (`OpTotals::cpu_ns`).
    pub pipeline_cpu_ns: u64,
    /// Pipeline threads whose op is not known.
    pub unattributed_cpu_ns: u64,
    /// Outside the pipeline: the training step, Python, the consumer.
    pub non_pipeline_cpu_ns: u64,
    /// The part of `non_pipeline_cpu_ns` the consumer spent between two
    /// `GetNext` calls on the root iterator (attribution evidence on the
    /// root): the work it does per element it takes.
    pub consumer_cpu_ns: u64,
}

/// One thread over the window.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadTotals {
    pub tid: u32,
    pub name: String,
    pub role: ThreadRole,
    pub cpu_ns: u64,
    pub waits: WaitCounters,
    /// CPU ns per op path, largest first; with the two fields below it sums
    /// to `cpu_ns`.
    pub attributed: Vec<(String, u64)>,
    pub unattributed_cpu_ns: u64,
    pub non_pipeline_cpu_ns: u64,
    /// The part of `non_pipeline_cpu_ns` booked to the root iterator: this
    /// thread takes the root's elements (the consumer).
    pub consumer_cpu_ns: u64,
}

/// One file over the window, summed over threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileTotals {
    pub path: String,
    /// Op the reads count for (empty: unattributed).
    pub op_path: String,
    pub bytes_read: u64,
    pub reads: u64,
    pub opens: u64,
    pub read_ns: u64,
    /// st_size, when the probe could read it.
    pub size: Option<u64>,
    /// Open-to-close reads that began and ended in the recording, and the
    /// bytes read in them.
    pub complete_sessions: u64,
    pub complete_bytes: u64,
}

/// Blocking at one call site over the window, summed over threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockSiteTotals {
    /// `mutex`, `condvar`, `gil` or `futex`.
    pub kind: String,
    pub site: String,
    /// Op of the innermost `GetNextInternal` frame (empty: none).
    pub op_path: String,
    pub waits: u64,
    pub wait_ns: u64,
}
