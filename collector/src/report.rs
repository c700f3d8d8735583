//! The measured part of `report.json`, built from a `PipelineSnapshot` alone
//! (so `plumber-probe analyze stats.pb` rebuilds it). The analyzer adds its
//! fields beside these with `#[serde(flatten)]`; a field here is never
//! renamed once released. Schema: docs/report-json.md.

use serde::{Deserialize, Serialize};

use crate::proto::PipelineSnapshot;
use crate::topology::Topology;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Target {
    pub pid: i64,
    pub tensorflow_version: String,
    pub libraries: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Window {
    pub start_ns: i64,
    pub end_ns: i64,
    /// True when the recording ended before the requested duration.
    pub partial: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct MeasuredNode {
    /// Node name in stats.pb, e.g. `ParallelMapDatasetV2/_3`.
    pub name: String,
    /// GraphDef op, e.g. `ParallelMapDatasetV2`.
    pub op: String,
    /// Stable op path, e.g. `Root::Prefetch::BatchV2::ParallelMapV2`.
    pub path: String,
    /// Name of the consumer node (`dataset` for the top op).
    pub parent: Option<String>,
    pub elements_produced: i64,
    /// Self wall time over the window (TensorFlow's processing time), ns.
    pub wall_ns: i64,
    pub parallelism: f64,
    pub buffered_elements: i64,
    pub bytes_produced: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReportDrop {
    pub what: String,
    pub count: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct MeasuredReport {
    pub target: Target,
    /// How the data was obtained: `model` or `uprobes` (empty for a file
    /// written by Plumber's TensorFlow).
    pub mode: String,
    pub window: Window,
    pub nodes: Vec<MeasuredNode>,
    pub drops: Vec<ReportDrop>,
}

/// The measured report of a snapshot, ours or one written by Plumber's
/// TensorFlow (then target fields are zero/empty and paths are empty).
pub fn measured(snapshot: &PipelineSnapshot) -> MeasuredReport {
    let topo = snapshot
        .graph
        .as_ref()
        .map(Topology::from_graph)
        .unwrap_or_default();
    let probe = snapshot.probe_info.clone().unwrap_or_default();
    let info = snapshot.snapshot_info.unwrap_or_default();
    let nodes = snapshot
        .stats
        .iter()
        .map(|s| {
            let node = topo.nodes.get(&s.name);
            MeasuredNode {
                name: s.name.clone(),
                op: node.map(|n| n.op.clone()).unwrap_or_default(),
                path: s.probe_path.clone(),
                parent: node.and_then(|n| n.parent.clone()),
                elements_produced: s.aggregate_elements_produced,
                wall_ns: s.aggregate_processing_time,
                parallelism: if s.probe_parallelism > 0.0 {
                    s.probe_parallelism
                } else {
                    s.parallelism as f64
                },
                buffered_elements: if s.probe_buffered_elements != 0 {
                    s.probe_buffered_elements
                } else {
                    s.aggregate_max_buffer_size
                },
                bytes_produced: s.aggregate_bytes_produced,
            }
        })
        .collect();
    MeasuredReport {
        target: Target {
            pid: probe.pid,
            tensorflow_version: probe.tensorflow_version,
            libraries: probe.libraries,
        },
        mode: probe.mode,
        window: Window {
            start_ns: info.start_time,
            end_ns: info.current_time,
            partial: probe.partial,
        },
        nodes,
        drops: snapshot
            .probe_drops
            .iter()
            .map(|d| ReportDrop {
                what: d.what.clone(),
                count: d.count,
            })
            .collect(),
    }
}
