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
    pub memory_total: i64,
    pub memory_free: i64,
}

/// Lost events or rejected objects, with a short name of what was lost.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Drop {
    pub what: String,
    pub count: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Target(TargetInfo),
    Poll(Poll),
    Retired(NodeRetired),
    /// Cumulative drop counts (a later Drops for the same `what` replaces
    /// the earlier value).
    Drops {
        drops: Vec<Drop>,
    },
    /// End of the recording. `partial` is set when it ended before the
    /// requested duration (target exited, interrupted).
    End {
        partial: bool,
        reason: String,
    },
}
