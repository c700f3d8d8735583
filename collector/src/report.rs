//! The measured part of `report.json`, built from a `PipelineSnapshot` alone
//! (so `plumber-probe analyze stats.pb` rebuilds it). The analyzer adds its
//! fields beside these with `#[serde(flatten)]`; a field here is never
//! renamed once released. Schema: docs/report-json.md.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::proto::pipeline_snapshot::OpStats;
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
    /// Thread CPU time of the op over the window, ns (0: not measured).
    #[serde(default)]
    pub cpu_ns: i64,
    /// `cpu_ns` per element produced, ms (null: no CPU time or no element).
    #[serde(default)]
    pub cpu_ms_per_element: Option<f64>,
    /// No attribution window caught the op: `cpu_ns` is TensorFlow's self
    /// time for it. Written only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cpu_from_self_time: bool,
    /// File bytes read for the op.
    #[serde(default)]
    pub io_bytes_read: i64,
    #[serde(default)]
    pub files_opened: i64,
    /// Time the op's threads waited for a lock, for the GIL and on
    /// condition variables (inputs, buffer space), ns.
    #[serde(default)]
    pub lock_wait_ns: i64,
    #[serde(default)]
    pub gil_wait_ns: i64,
    #[serde(default)]
    pub cond_wait_ns: i64,
}

/// A file read in the window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReportFile {
    pub path: String,
    pub bytes_read: i64,
    /// Node name of the op the reads count for (null: unattributed).
    pub op: Option<String>,
    /// Its op path (empty: unattributed).
    pub op_path: String,
}

/// One thread of the target over the window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReportThread {
    pub tid: i64,
    pub name: String,
    /// `udf_pool`, `pipeline` or `non_pipeline`.
    pub role: String,
    pub cpu_ns: i64,
}

/// Blocking at one call site over the window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReportLockSite {
    /// `mutex`, `condvar`, `gil` or `futex`.
    pub kind: String,
    pub site: String,
    /// Node name of the op on the stack (null: none known).
    pub op: Option<String>,
    pub op_path: String,
    pub waits: i64,
    pub wait_ns: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReportDrop {
    pub what: String,
    pub count: i64,
}

/// The measured report. Its nodes are `N`: the collector's report.json
/// lists them (`Vec<MeasuredNode>`, the default); the analyzer's report
/// embeds each one in its own node entries and keeps the rest as a
/// [`MeasuredSummary`]. One struct for both, so the two cannot drift.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct MeasuredReport<N: NodeList = Vec<MeasuredNode>> {
    pub target: Target,
    /// How the data was obtained: `model` or `uprobes` (empty for a file
    /// written by Plumber's TensorFlow).
    pub mode: String,
    pub window: Window,
    #[serde(skip_serializing_if = "NodeList::is_absent")]
    pub nodes: N,
    pub drops: Vec<ReportDrop>,
    /// CPU time of the whole target over the window, ns (0: unknown).
    #[serde(default)]
    pub process_cpu_ns: i64,
    /// CPU time of pipeline threads whose op is not known, ns.
    #[serde(default)]
    pub unattributed_cpu_ns: i64,
    /// CPU time outside the pipeline (training step, Python), ns.
    #[serde(default)]
    pub non_pipeline_cpu_ns: i64,
    /// Files read in the window, most bytes first.
    #[serde(default)]
    pub files: Vec<ReportFile>,
    /// Threads, most CPU first (empty: no thread data).
    #[serde(default)]
    pub threads: Vec<ReportThread>,
    /// Blocking call sites, longest total wait first.
    #[serde(default)]
    pub lock_sites: Vec<ReportLockSite>,
    /// Measurements the recording's source does not make (`plumber-probe
    /// run`): their fields read 0 for "not measured". Absent when every
    /// one is made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_measured: Vec<String>,
    /// What observing the target cost it over the window; absent when the
    /// recording did not measure it (a file of Plumber's TensorFlow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_overhead: Option<ReportOverhead>,
}

/// `probe_overhead` in report.json: stats.pb's `ProbeOverhead`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReportOverhead {
    /// (bpf_ns + trap_ns + shim_ns + probe_cpu_ns) / target_cpu_ns.
    pub target_share: f64,
    pub target_cpu_ns: i64,
    pub bpf_ns: i64,
    pub trap_hits: i64,
    pub trap_ns: i64,
    pub trap_cost_ns: i64,
    /// The return probes' hits among `trap_hits`, and each one's cost.
    #[serde(default)]
    pub retprobe_hits: i64,
    #[serde(default)]
    pub retprobe_cost_ns: i64,
    pub probe_cpu_ns: i64,
    /// `plumber-probe run`: the shim's time in its hooks (0 under --pid).
    #[serde(default)]
    pub shim_ns: i64,
    pub budget: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<ReportProbeHits>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinned: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReportProbeHits {
    pub name: String,
    pub hits: i64,
    pub bpf_ns: i64,
    pub uprobe: bool,
}

impl ReportOverhead {
    fn from_proto(o: &crate::proto::pipeline_snapshot::ProbeOverhead) -> Self {
        ReportOverhead {
            target_share: o.target_share,
            target_cpu_ns: o.target_cpu_ns,
            bpf_ns: o.bpf_ns,
            trap_hits: o.trap_hits,
            trap_ns: o.trap_ns,
            trap_cost_ns: o.trap_cost_ns,
            retprobe_hits: o.retprobe_hits,
            retprobe_cost_ns: o.retprobe_cost_ns,
            probe_cpu_ns: o.probe_cpu_ns,
            shim_ns: o.shim_ns,
            budget: o.budget,
            probes: o
                .probes
                .iter()
                .map(|p| ReportProbeHits {
                    name: p.name.clone(),
                    hits: p.hits,
                    bpf_ns: p.bpf_ns,
                    uprobe: p.uprobe,
                })
                .collect(),
            thinned: o.thinned.clone(),
        }
    }

    /// The line a recording ends with, e.g. `probe cost: 0.6% of the
    /// target's CPU (in-target BPF 0.2%, uprobe traps 0.3%, probe process
    /// 0.1%); budget 1%`. A `run` recording has no BPF and no traps: its
    /// parts are the shim's hooks and the probe process.
    pub fn line(&self) -> String {
        let pct = |ns: i64| {
            if self.target_cpu_ns > 0 {
                100.0 * ns as f64 / self.target_cpu_ns as f64
            } else {
                0.0
            }
        };
        let in_target = if self.shim_ns > 0 && self.bpf_ns == 0 && self.trap_ns == 0 {
            format!("shim hooks {:.2}%", pct(self.shim_ns))
        } else {
            format!(
                "in-target BPF {:.2}%, uprobe traps {:.2}%",
                pct(self.bpf_ns),
                pct(self.trap_ns)
            )
        };
        let mut line = format!(
            "probe cost: {:.2}% of the target's CPU ({in_target}, probe process {:.2}%); budget {}%",
            100.0 * self.target_share,
            pct(self.probe_cpu_ns),
            fmt_pct(100.0 * self.budget),
        );
        if self.budget > 0.0 && self.target_share > self.budget {
            line.push_str(" — OVER BUDGET");
        }
        if !self.thinned.is_empty() {
            line.push_str("; thinned: ");
            line.push_str(&self.thinned.join("; "));
        }
        line
    }
}

/// A percentage without trailing zeros: 1, 0.5, 2.25.
fn fmt_pct(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The top-level measured fields without the nodes: what the analyzer's
/// report.json holds at its top level.
pub type MeasuredSummary = MeasuredReport<NoNodes>;

/// What a [`MeasuredReport`] holds in its `nodes` field.
pub trait NodeList {
    /// True when the field is not written at all.
    fn is_absent(&self) -> bool;
}

impl NodeList for Vec<MeasuredNode> {
    fn is_absent(&self) -> bool {
        false
    }
}

/// No `nodes` field: neither written nor read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NoNodes;

impl NodeList for NoNodes {
    fn is_absent(&self) -> bool {
        true
    }
}

impl Serialize for NoNodes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Never reached: `is_absent` skips the field.
        s.serialize_none()
    }
}

impl<'de> Deserialize<'de> for NoNodes {
    /// Accepts the field missing (serde reads a missing field as `none`)
    /// or present, ignoring what it holds: in the analyzer's report.json
    /// the `nodes` key belongs to the analyzer's own entries.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<serde::de::IgnoredAny>::deserialize(d).map(|_| NoNodes)
    }
}

impl MeasuredReport {
    /// The summary and the nodes, apart. The summary is built field by
    /// field (the two types are one struct), so a field added to the
    /// report is a compile error here until it is carried over.
    pub fn split_nodes(self) -> (MeasuredSummary, Vec<MeasuredNode>) {
        let summary = MeasuredReport {
            target: self.target,
            mode: self.mode,
            window: self.window,
            nodes: NoNodes,
            drops: self.drops,
            process_cpu_ns: self.process_cpu_ns,
            unattributed_cpu_ns: self.unattributed_cpu_ns,
            non_pipeline_cpu_ns: self.non_pipeline_cpu_ns,
            files: self.files,
            threads: self.threads,
            lock_sites: self.lock_sites,
            not_measured: self.not_measured,
            probe_overhead: self.probe_overhead,
        };
        (summary, self.nodes)
    }
}

/// The report text's note on what was not measured (empty when nothing
/// is missing), said where the numbers are read so that an absent
/// measurement is not taken for a zero.
pub fn not_measured_note(not_measured: &[String]) -> String {
    if not_measured.is_empty() {
        return String::new();
    }
    let mut s =
        String::from("NOT MEASURED by this recording (a 0 there means unknown, not none)\n");
    for m in not_measured {
        s.push_str("  - ");
        s.push_str(m);
        s.push('\n');
    }
    s
}

fn cpu_ns(s: &OpStats) -> i64 {
    if s.aggregate_processing_time_clock > 0 {
        s.aggregate_processing_time_clock
    } else {
        s.processing_time_clock.max(0)
    }
}

fn cpu_ms_per_element(cpu_ns: i64, elements: i64) -> Option<f64> {
    (cpu_ns > 0 && elements > 0).then(|| cpu_ns as f64 / elements as f64 / 1e6)
}

/// Files opened: ours, else Plumber's file-name count of a file reader.
fn files_opened(s: &OpStats) -> i64 {
    if s.probe_files_opened > 0 {
        s.probe_files_opened
    } else if s.aggregate_disk_bytes_read > 0 {
        s.aggregate_elements_consumed.max(0)
    } else {
        0
    }
}

/// One op's measured entry, from its stats and the graph.
fn measured_node(s: &OpStats, topo: &Topology) -> MeasuredNode {
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
        cpu_ns: cpu_ns(s),
        cpu_ms_per_element: cpu_ms_per_element(cpu_ns(s), s.aggregate_elements_produced),
        cpu_from_self_time: s.probe_cpu_from_self_time,
        io_bytes_read: s.aggregate_disk_bytes_read,
        files_opened: files_opened(s),
        lock_wait_ns: s.probe_lock_wait_ns,
        gil_wait_ns: s.probe_gil_wait_ns,
        cond_wait_ns: s.probe_cond_wait_ns,
    }
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
        .map(|s| measured_node(s, &topo))
        .collect();
    // Op path -> node name (the first node of a path, as the stats join).
    let mut by_path: HashMap<&str, &str> = HashMap::new();
    for s in snapshot.stats.iter().filter(|s| !s.probe_path.is_empty()) {
        by_path
            .entry(s.probe_path.as_str())
            .or_insert(s.name.as_str());
    }
    let op_name = |p: &str| by_path.get(p).map(|n| n.to_string());
    let cpu = snapshot.probe_cpu.clone().unwrap_or_default();
    let mut files: Vec<ReportFile> = snapshot
        .probe_files
        .iter()
        .map(|f| ReportFile {
            path: f.path.clone(),
            bytes_read: f.bytes_read,
            op: op_name(&f.op_path),
            op_path: f.op_path.clone(),
        })
        .collect();
    files.sort_by(|a, b| {
        b.bytes_read
            .cmp(&a.bytes_read)
            .then_with(|| a.path.cmp(&b.path))
            .then_with(|| a.op_path.cmp(&b.op_path))
    });
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
        process_cpu_ns: info
            .process_current_time
            .saturating_sub(info.process_start_time)
            .max(0),
        unattributed_cpu_ns: cpu.unattributed_ns,
        non_pipeline_cpu_ns: cpu.non_pipeline_ns,
        files,
        threads: cpu
            .threads
            .iter()
            .map(|t| ReportThread {
                tid: t.tid,
                name: t.name.clone(),
                role: t.role.clone(),
                cpu_ns: t.cpu_ns,
            })
            .collect(),
        lock_sites: snapshot
            .probe_lock_sites
            .iter()
            .map(|l| ReportLockSite {
                kind: l.kind.clone(),
                site: l.site.clone(),
                op: op_name(&l.op_path),
                op_path: l.op_path.clone(),
                waits: l.waits,
                wait_ns: l.wait_ns,
            })
            .collect(),
        not_measured: probe.not_measured,
        probe_overhead: snapshot
            .probe_overhead
            .as_ref()
            .map(ReportOverhead::from_proto),
    }
}
