//! The model's nodes: one per op of the pipeline graph, with the op's
//! recorded stats, its visit ratio, parallelism and per-core rates, before
//! any configuration is evaluated ([`crate::model`] evaluates them).

use crate::amdahl;
use crate::guard::finite_pos;
use crate::input::OpInput;
use crate::ops;

/// Which per-op time the rates are computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuSource {
    /// `aggregate_processing_time_clock`: thread CPU time (Plumber's model).
    CpuClock,
    /// `aggregate_processing_time`: wall time (Plumber's "naive" mode), used
    /// when no op has CPU time.
    Wallclock,
}

impl CpuSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuSource::CpuClock => "cpu_clock",
            CpuSource::Wallclock => "wallclock",
        }
    }
}

/// What limits an op's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Cpu,
    Io,
    Lock,
    Gil,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Cpu => "cpu",
            Limit::Io => "io",
            Limit::Lock => "lock",
            Limit::Gil => "gil",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct NodeModel {
    pub name: String,
    pub op: String,
    pub stats: Option<OpInput>,
    /// Reachable from the top, not the `_Retval`, and has stats.
    pub in_model: bool,
    pub visit: f64,
    /// Cache, TensorSlice, or below one: excluded from ranking and LP.
    pub stale: bool,
    /// Parallelism of one instance.
    pub p_instance: f64,
    /// Parallelism of the op as it runs (instance × enclosing interleave).
    pub p_eff: f64,
    /// Node whose parallelism knob scales this op (itself, or the interleave
    /// whose function builds it).
    pub knob: Option<usize>,
    pub interleave_owner: Option<usize>,
    pub disk: bool,
    pub source: bool,
    pub random: bool,
    /// CPU (or wall, in wallclock mode) seconds.
    pub time_s: f64,
    pub wall_s: f64,
    /// Lock and GIL wait, seconds.
    pub lock_s: f64,
    pub gil_s: f64,
    /// Time on a core (CPU, or wall less the waits in wallclock mode).
    pub busy_s: f64,
    /// A DataLoader stage's time off its cores that no lock or GIL
    /// serialises (a read, the network, a sleep, a core to run on), with
    /// its CPU time measured: more workers overlap it. 0 otherwise.
    pub offcpu_s: f64,
    pub minibatches: f64,
    /// Per-core rate R1 (root elements/s); None: no time (unbounded) or no
    /// elements (nothing to measure).
    pub r1: Option<f64>,
    pub sigma: f64,
    /// R1 times the single-thread efficiency (only < R1 for a waiting
    /// single-threaded op).
    pub r1_eff: f64,
    /// File readers: rate of one read stream including storage wait.
    pub io1: Option<f64>,
    pub cpu_rate: Option<f64>,
    pub io_rate: Option<f64>,
    pub max_rate: Option<f64>,
    pub limit: Limit,
    pub observed_rate: f64,
    pub cores_used: f64,
    pub busy: f64,
    /// Disk payload bytes per root element.
    pub disk_bytes_per_root: f64,
    pub rank: Option<usize>,
}

/// Which per-op time the rates come from: CPU time when any op has it.
pub(crate) fn choose_cpu_source(
    ops: &std::collections::HashMap<String, OpInput>,
    notes: &mut Vec<String>,
) -> CpuSource {
    if ops.values().any(|o| o.cpu_ns > 0) {
        CpuSource::CpuClock
    } else {
        notes.push(
            "no op has CPU time (aggregate_processing_time_clock): rates use wall time (Plumber's naive mode)"
                .into(),
        );
        CpuSource::Wallclock
    }
}

/// Names the ops whose CPU time is TensorFlow's self time for them: no
/// attribution window caught them (a plumber-probe recording).
pub(crate) fn note_self_time(
    ops: &std::collections::HashMap<String, OpInput>,
    notes: &mut Vec<String>,
) {
    let mut names: Vec<&str> = ops
        .iter()
        .filter(|(_, o)| o.cpu_from_self_time)
        .map(|(name, _)| name.as_str())
        .collect();
    if names.is_empty() {
        return;
    }
    names.sort_unstable();
    notes.push(format!(
        "no attribution window caught {}: CPU time is TensorFlow's own self time for {} (wall, inputs excluded), moved from the time of the threads that ran it",
        names.join(", "),
        if names.len() == 1 { "it" } else { "them" }
    ));
}

impl NodeModel {
    /// A graph node before stats, visit ratios and rates are known.
    pub(crate) fn new(n: &crate::graph::GNode) -> NodeModel {
        NodeModel {
            name: n.name.clone(),
            op: n.op.clone(),
            stats: None,
            in_model: false,
            visit: 1.0,
            stale: false,
            p_instance: 1.0,
            p_eff: 1.0,
            knob: None,
            interleave_owner: None,
            disk: ops::is_disk(&n.op),
            source: n.inputs.is_empty() && n.fn_roots.is_empty(),
            random: n.random,
            time_s: 0.0,
            wall_s: 0.0,
            lock_s: 0.0,
            busy_s: 0.0,
            offcpu_s: 0.0,
            gil_s: 0.0,
            minibatches: 0.0,
            r1: None,
            sigma: 0.0,
            r1_eff: 0.0,
            io1: None,
            cpu_rate: None,
            io_rate: None,
            max_rate: None,
            limit: Limit::Cpu,
            observed_rate: 0.0,
            cores_used: 0.0,
            busy: 0.0,
            disk_bytes_per_root: 0.0,
            rank: None,
        }
    }

    /// The share of its threads' time they waited on locks and the GIL:
    /// W/(C+W), C the time on a core (in wallclock mode the wall time
    /// holds the waits).
    pub(crate) fn wait_share(&self) -> f64 {
        let wait = self.lock_s + self.gil_s;
        let all = self.busy_s.max(0.0) + wait;
        if all > 0.0 {
            wait / all
        } else {
            0.0
        }
    }

    /// The share of a thread's own time (lock and GIL waits aside) it is
    /// on a core: 1 but for a DataLoader stage whose threads wait off
    /// their cores.
    pub(crate) fn thread_share(&self) -> f64 {
        let t = self.busy_s + self.offcpu_s;
        if t > 0.0 {
            self.busy_s / t
        } else {
            1.0
        }
    }

    /// One thread's rate, root elements/s: R1 (per core) times the share
    /// of its time the thread is on a core.
    pub(crate) fn thread_r1(&self) -> Option<f64> {
        self.r1.map(|r| r * self.thread_share())
    }

    /// Times, observed rate, per-core rate R1 and the read-stream rate of an
    /// op with stats, from its counters over the window.
    pub(crate) fn measure(&mut self, cpu_source: CpuSource, elapsed_s: f64) {
        let Some(st) = self.stats.as_ref() else {
            return;
        };
        let (elements, cpu_ns, wall_ns, disk_read) =
            (st.elements, st.cpu_ns, st.wall_ns, st.disk_bytes_read);
        let (lock_ns, gil_ns) = (st.lock_wait_ns, st.gil_wait_ns);
        let wall_s = wall_ns as f64 / 1e9;
        let lock_s = lock_ns as f64 / 1e9;
        let gil_s = gil_ns as f64 / 1e9;
        let wait_s = lock_s + gil_s;
        let time_s = match cpu_source {
            CpuSource::CpuClock => cpu_ns as f64 / 1e9,
            CpuSource::Wallclock => wall_s,
        };
        // In wallclock mode the lock/GIL wait sits inside the wall time.
        let busy_s = match cpu_source {
            CpuSource::Wallclock if time_s > wait_s => time_s - wait_s,
            _ => time_s,
        };
        // A DataLoader stage's CPU and wall time come from the same ticks
        // of the same threads: what its wall time holds beyond its CPU and
        // its lock and GIL waits, its threads spent off their cores.
        let offcpu_s = if cpu_source == CpuSource::CpuClock && ops::is_dataloader(&self.op) {
            (wall_s - time_s - wait_s).max(0.0)
        } else {
            0.0
        };
        self.offcpu_s = offcpu_s;
        self.wall_s = wall_s;
        self.time_s = time_s;
        self.lock_s = lock_s;
        self.gil_s = gil_s;
        self.busy_s = busy_s;
        self.minibatches = elements as f64 / self.visit;
        self.observed_rate = elements as f64 / elapsed_s / self.visit;
        self.cores_used = time_s / elapsed_s;
        self.busy = time_s / self.p_eff / elapsed_s;
        if self.disk && elements > 0 {
            self.disk_bytes_per_root = disk_read as f64 / elements as f64 * self.visit;
        }
        if elements > 0 && busy_s > 0.0 {
            let r1 = self.minibatches / busy_s;
            if r1.is_finite() && r1 > 0.0 {
                // A thread's own time: on a core, or off it where nothing
                // serialises it.
                let thread_s = busy_s + offcpu_s;
                self.r1 = Some(r1);
                self.sigma = amdahl::serial_share(thread_s, wait_s, self.p_eff);
                self.r1_eff = r1
                    * self.thread_share()
                    * amdahl::single_thread_efficiency(thread_s, wait_s, self.p_eff);
            }
        }
        if self.disk && elements > 0 {
            self.io1 = finite_pos(self.minibatches / wall_s);
        }
    }
}

/// Moves each reachable node's stats into it (the `_Retval` has none) and
/// notes the nodes without stats and the stats without a node.
pub(crate) fn attach_stats(
    nodes: &mut [NodeModel],
    g: &crate::graph::PipelineGraph,
    ops: &mut std::collections::HashMap<String, OpInput>,
    notes: &mut Vec<String>,
) {
    for &u in &g.order {
        if nodes[u].op == ops::RETVAL {
            continue;
        }
        if let Some(st) = ops.remove(&nodes[u].name) {
            nodes[u].stats = Some(st);
            nodes[u].in_model = true;
        }
    }
    let missing = g
        .order
        .iter()
        .filter(|&&u| !nodes[u].in_model && nodes[u].op != ops::RETVAL)
        .count();
    if missing > 0 {
        notes.push(format!(
            "{missing} pipeline node(s) have no stats and are left out of the model"
        ));
    }
    // What is left matches no reachable node (the _Retval has no stats).
    let orphans = ops.len();
    if orphans > 0 {
        notes.push(format!(
            "{orphans} stats entr(ies) match no node of the pipeline graph and are left out"
        ));
    }
}

/// Parallelism of one instance of a node: its stats' value for a parallel op,
/// else 1.
fn instance_parallelism(node: &NodeModel, op: &str) -> f64 {
    match &node.stats {
        Some(st) if ops::is_parallel(op) && st.parallelism.is_finite() && st.parallelism > 0.0 => {
            st.parallelism.max(1.0)
        }
        _ => 1.0,
    }
}

/// Top-down: visit ratios, staleness, parallelism, knobs.
pub(crate) fn propagate_top_down(
    nodes: &mut [NodeModel],
    g: &crate::graph::PipelineGraph,
    notes: &mut Vec<String>,
) {
    let mut outer = vec![1.0_f64; nodes.len()];
    let mut bad_ratio = 0usize;
    for &u in &g.order {
        let un = &g.nodes[u];
        let consumer = un.consumer;
        if let Some(c) = consumer {
            nodes[u].stale = nodes[u].stale || nodes[c].stale;
        }
        if ops::is_cache(&un.op) || ops::is_tensor_slice(&un.op) {
            nodes[u].stale = true;
        }
        let p_inst = instance_parallelism(&nodes[u], &un.op);
        nodes[u].p_instance = p_inst;
        nodes[u].p_eff = p_inst * outer[u];
        nodes[u].knob = if ops::takes_parallelism(&un.op) {
            Some(u)
        } else {
            nodes[u].interleave_owner
        };
        let v = nodes[u].visit;
        let el_u = nodes[u].stats.as_ref().map_or(0, |s| s.elements);
        let ratio_u = nodes[u].stats.as_ref().map_or(-1.0, |s| s.element_ratio);
        for &c in &un.inputs {
            let el_c = nodes[c].stats.as_ref().map_or(0, |s| s.elements);
            // Each input's own count first: exact for every input of a
            // Zip/Concatenate and for an interleave's file list (Plumber
            // takes the first input's ratio, and passes an interleave's V
            // unchanged to its inputs).
            let r = if el_u > 0 && el_c > 0 {
                el_c as f64 / el_u as f64
            } else if ratio_u.is_finite() && ratio_u > 0.0 {
                ratio_u
            } else {
                1.0
            };
            let vc = v * r;
            nodes[c].visit = if vc.is_finite() && vc > 0.0 {
                vc
            } else {
                bad_ratio += 1;
                v
            };
            outer[c] = outer[u];
            nodes[c].interleave_owner = nodes[u].interleave_owner;
        }
        for &f in &un.fn_roots {
            // A function's datasets produce the owner's output elements
            // (interleave, flat_map, group_by_window's reduce: Plumber
            // passes GroupByWindow's functions 1.0).
            nodes[f].visit = v;
            if ops::is_interleave(&un.op) {
                outer[f] = nodes[u].p_eff;
                nodes[f].interleave_owner = Some(u);
            } else {
                outer[f] = outer[u];
                nodes[f].interleave_owner = nodes[u].interleave_owner;
            }
        }
    }
    if bad_ratio > 0 {
        notes.push(format!(
            "{bad_ratio} element ratio(s) were not usable; visit ratio 1 assumed there"
        ));
    }
}
