//! Builds a Plumber-compatible `PipelineSnapshot` (stats.pb) from a
//! [`WindowResult`].
//!
//! The graph imitates what Plumber's TensorFlow serializes: NodeDefs named
//! `<Op>/_<n>` listed inputs first, a final `_Retval` named `dataset`, and
//! datasets built inside an interleave/flat_map function placed in a
//! FunctionDef referenced by the owner's `f` attr. Each dataset op's scalar
//! and vector arguments follow its dataset inputs (`graphargs.rs`). Plumber
//! joins stats to the graph by NodeDef name and ignores edges to nodes
//! listed later, so the listing order matters.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::graphargs;
use crate::opnames;
use crate::proto::attr_value;
use crate::proto::pipeline_snapshot::{
    data_loader_info, DataLoaderInfo, Drop as ProtoDrop, IteratorStats, MachineInfo, OpStats,
    ProbeHits, ProbeInfo, ProbeOverhead, SnapshotInfo,
};
use crate::proto::{
    AttrValue, FunctionDef, FunctionDefLibrary, GraphDef, NameAttrList, NodeDef, OpDef,
    PipelineSnapshot,
};
use crate::totals::{sat_i64, FileTotals, OpTotals};
use crate::usage;
use crate::window::WindowResult;

pub use crate::statsfile::{read_stats, write_stats, StatsError};

/// Name of the `_Retval` node Plumber's analysis starts from.
pub const RETVAL_NAME: &str = "dataset";
/// Attr an owner node uses to reference its function.
pub const FUNCTION_ATTR: &str = "f";

/// Where emitted nodes go.
#[derive(Clone, Copy)]
enum Dest {
    Main,
    Function(usize),
}

struct Builder<'a> {
    ops: &'a [OpTotals],
    /// GraphDef op per op index (None: transparent, e.g. `Root`).
    graph_op: Vec<Option<String>>,
    children: Vec<Vec<usize>>,
    /// Consumer op per op index.
    parent: Vec<Option<usize>>,
    /// NodeDef name once emitted.
    names: Vec<Option<String>>,
    visited: Vec<bool>,
    next_n: u64,
    main: Vec<NodeDef>,
    functions: Vec<FunctionDef>,
    stats: Vec<OpStats>,
    /// (owner op, function index) still to fill.
    queue: VecDeque<(usize, usize)>,
    window_ns: i64,
    /// Files read, by op path.
    files: BTreeMap<&'a str, Vec<&'a FileTotals>>,
}

impl<'a> Builder<'a> {
    fn new(w: &'a WindowResult) -> Self {
        let ops = w.ops.as_slice();
        let index: HashMap<&str, usize> = ops
            .iter()
            .enumerate()
            .map(|(i, o)| (o.path.as_str(), i))
            .collect();
        let mut children = vec![Vec::new(); ops.len()];
        let mut parent = vec![None; ops.len()];
        for (i, o) in ops.iter().enumerate() {
            if let Some(p) = o.parent_path.as_deref().and_then(|p| index.get(p)) {
                if *p != i {
                    children[*p].push(i);
                    parent[i] = Some(*p);
                }
            }
        }
        Builder {
            ops,
            graph_op: ops
                .iter()
                .map(|o| opnames::graph_op_name(&o.model_name))
                .collect(),
            children,
            parent,
            names: vec![None; ops.len()],
            visited: vec![false; ops.len()],
            next_n: 0,
            main: Vec::new(),
            functions: Vec::new(),
            stats: Vec::new(),
            queue: VecDeque::new(),
            window_ns: sat_i64(w.duration_ns()),
            files: usage::files_by_op(&w.files),
        }
    }

    /// Included ops standing for `i`: itself, or for a transparent op its
    /// inputs (so `Root`'s child is what `_Retval` consumes).
    fn standing_for(&self, i: usize, out: &mut Vec<usize>) {
        let mut stack = vec![i];
        let mut seen = vec![false; self.ops.len()];
        while let Some(j) = stack.pop() {
            if std::mem::replace(&mut seen[j], true) {
                continue;
            }
            if self.graph_op[j].is_some() {
                out.push(j);
            } else {
                // Reverse so that the first child comes out first.
                for &c in self.children[j].iter().rev() {
                    stack.push(c);
                }
            }
        }
    }

    fn inputs(&self, i: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for &c in &self.children[i] {
            if !self.ops[c].in_function {
                self.standing_for(c, &mut out);
            }
        }
        out
    }

    fn function_tops(&self, i: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for &c in &self.children[i] {
            if self.ops[c].in_function {
                self.standing_for(c, &mut out);
            }
        }
        out
    }

    /// Emits the tree under `root` (inputs only) in post-order.
    fn emit_tree(&mut self, root: usize, dest: Dest) {
        let mut stack = vec![(root, false)];
        while let Some((i, expanded)) = stack.pop() {
            if expanded {
                self.emit_node(i, dest);
                continue;
            }
            if self.visited[i] {
                continue;
            }
            self.visited[i] = true;
            stack.push((i, true));
            for c in self.inputs(i).into_iter().rev() {
                if !self.visited[c] {
                    stack.push((c, false));
                }
            }
        }
    }

    fn emit_node(&mut self, i: usize, dest: Dest) {
        let Some(op) = self.graph_op[i].clone() else {
            return;
        };
        let n = self.next_n;
        self.next_n += 1;
        let name = format!("{op}/_{n}");
        let input: Vec<String> = self
            .inputs(i)
            .into_iter()
            .filter_map(|c| self.names[c].clone())
            .collect();
        let mut node = NodeDef {
            name: name.clone(),
            op: op.clone(),
            input,
            ..Default::default()
        };
        if !self.function_tops(i).is_empty() {
            let fname = format!("{op}_{n}_fn");
            node.attr.insert(
                FUNCTION_ATTR.to_string(),
                AttrValue {
                    value: Some(attr_value::Value::Func(NameAttrList {
                        name: fname.clone(),
                        attr: BTreeMap::new(),
                    })),
                },
            );
            self.functions.push(FunctionDef {
                signature: Some(OpDef { name: fname }),
                ..Default::default()
            });
            self.queue.push_back((i, self.functions.len() - 1));
        }
        let known = graphargs::Known {
            model_name: &self.ops[i].model_name,
            parallelism: self.ops[i].parallelism,
            ratio: self.ops[i].ratio,
            buffer_size: self.ops[i].buffer_size,
            files: &self.ops[i].files,
            slice_files: self.slice_files(i),
        };
        let args = graphargs::add_args(&mut node, &known);
        let list = match dest {
            Dest::Main => Some(&mut self.main),
            Dest::Function(f) => self.functions.get_mut(f).map(|f| &mut f.node_def),
        };
        if let Some(list) = list {
            list.extend(args);
            list.push(node);
        }
        let mut stats = op_stats(&self.ops[i], &name, self.window_ns);
        let files = self
            .files
            .get(self.ops[i].path.as_str())
            .map_or(&[][..], Vec::as_slice);
        usage::fill_op(&mut stats, &self.ops[i], files);
        self.stats.push(stats);
        self.names[i] = Some(name);
    }

    /// The files read inside the functions of the op that `i` feeds, when
    /// `i` is a TensorSliceDataset feeding a function-owning op (directly
    /// or through a shuffle, as Plumber looks for it): the file names it
    /// slices. Sorted; empty when unknown.
    fn slice_files(&self, i: usize) -> Vec<String> {
        if self.graph_op[i].as_deref() != Some("TensorSliceDataset") || self.ops[i].in_function {
            return Vec::new();
        }
        let mut owner = self.parent[i];
        if let Some(p) = owner.filter(|&p| self.ops[p].model_name.starts_with("Shuffle")) {
            owner = self.parent[p].filter(|_| !self.ops[p].in_function);
        }
        let Some(owner) = owner.filter(|&o| opnames::owns_functions(&self.ops[o].model_name))
        else {
            return Vec::new();
        };
        let mut files = std::collections::BTreeSet::new();
        let mut stack: Vec<usize> = self.children[owner]
            .iter()
            .copied()
            .filter(|&c| self.ops[c].in_function)
            .collect();
        let mut seen = vec![false; self.ops.len()];
        while let Some(j) = stack.pop() {
            if std::mem::replace(&mut seen[j], true) {
                continue;
            }
            files.extend(self.ops[j].files.iter().cloned());
            stack.extend(self.children[j].iter().copied());
        }
        files.into_iter().collect()
    }

    fn build(mut self) -> (GraphDef, Vec<OpStats>) {
        let index: HashMap<&str, usize> = self
            .ops
            .iter()
            .enumerate()
            .map(|(i, o)| (o.path.as_str(), i))
            .collect();
        let roots: Vec<usize> = (0..self.ops.len())
            .filter(|&i| {
                self.ops[i]
                    .parent_path
                    .as_deref()
                    .and_then(|p| index.get(p))
                    .is_none_or(|&p| p == i)
            })
            .collect();
        let mut tops = Vec::new();
        for r in roots {
            self.standing_for(r, &mut tops);
        }
        if tops.len() > 1 {
            tracing::warn!(count = tops.len(), "pipeline has more than one top op");
        }
        for &t in &tops {
            self.emit_tree(t, Dest::Main);
        }
        // Functions after the main graph, nested ones after their parents.
        while let Some((owner, f)) = self.queue.pop_front() {
            for t in self.function_tops(owner) {
                self.emit_tree(t, Dest::Function(f));
            }
        }
        // Never lose an op's counts, even if the tree was malformed (a
        // parent cycle from bad input): list stragglers in the main graph.
        for i in 0..self.ops.len() {
            if !self.visited[i] && self.graph_op[i].is_some() {
                tracing::warn!(path = %self.ops[i].path, "op not reachable from the top; listed alone");
                self.emit_tree(i, Dest::Main);
                while let Some((owner, f)) = self.queue.pop_front() {
                    for t in self.function_tops(owner) {
                        self.emit_tree(t, Dest::Function(f));
                    }
                }
            }
        }
        let retval_inputs: Vec<String> =
            tops.iter().filter_map(|&t| self.names[t].clone()).collect();
        self.main.push(NodeDef {
            name: RETVAL_NAME.to_string(),
            op: "_Retval".to_string(),
            input: retval_inputs,
            ..Default::default()
        });
        let library = if self.functions.is_empty() {
            None
        } else {
            Some(FunctionDefLibrary {
                function: self.functions,
            })
        };
        (
            GraphDef {
                node: self.main,
                library,
                versions: None,
            },
            self.stats,
        )
    }
}

fn op_stats(o: &OpTotals, name: &str, window_ns: i64) -> OpStats {
    let probe_parallelism = o.parallelism.unwrap_or(0.0);
    // Plumber's field is an integer; `as` saturates, so any finite value
    // maps into range.
    let parallelism = o.parallelism.map_or(1, |p| (p.round() as i64).max(1));
    OpStats {
        name: name.to_string(),
        elements_produced: o.elements,
        aggregate_elements_produced: o.elements,
        processing_time: o.processing_time_ns,
        aggregate_processing_time: o.processing_time_ns,
        bytes_produced: o.bytes_produced,
        aggregate_bytes_produced: o.bytes_produced,
        bytes_consumed: o.bytes_consumed,
        aggregate_bytes_consumed: o.bytes_consumed,
        parallelism,
        probe_parallelism,
        element_ratio: o.element_ratio,
        count: o.instances,
        cardinality: -2,
        aggregate_max_buffer_size: o.buffered_elements,
        // Plumber: Σ over live instances of (now - node start); the window
        // is the part of each life we observed.
        wallclock_time: window_ns.saturating_mul(o.live_instances),
        probe_model_name: o.model_name.clone(),
        probe_path: o.path.clone(),
        probe_buffered_elements: o.buffered_elements,
        probe_buffered_bytes: o.buffered_bytes,
        probe_instances: o.instances,
        ..Default::default()
    }
}

/// The stats.pb content for one recording window.
pub fn build_snapshot(w: &WindowResult) -> PipelineSnapshot {
    let (graph, stats) = Builder::new(w).build();
    let target = w.target.clone().unwrap_or_default();
    let mut snapshot = PipelineSnapshot {
        graph: Some(graph),
        stats,
        machine_info: w.target.as_ref().map(|t| MachineInfo {
            num_cores: t.num_cores,
            memory_total: t.memory_total,
            memory_free: t.memory_free,
            ..Default::default()
        }),
        ctx_info: None,
        // RootDataset never sets the durations (-1); we have no autotune
        // output time.
        iter_stats: Some(IteratorStats {
            avg_duration: -1.0,
            var_duration: -1.0,
            avg_wallclock_duration: -1.0,
            autotune_output_time: 0.0,
        }),
        snapshot_info: Some(SnapshotInfo {
            start_time: sat_i64(w.start.wall_ns),
            current_time: sat_i64(w.end.wall_ns),
            process_start_time: sat_i64(w.start.process_cpu_ns),
            process_current_time: sat_i64(w.end.process_cpu_ns),
        }),
        spans_context_snapshot: None,
        probe_info: Some(ProbeInfo {
            mode: target.mode,
            pid: target.pid,
            tensorflow_version: target.tensorflow_version,
            libraries: target.libraries,
            partial: w.partial(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            not_measured: target.not_measured,
        }),
        probe_drops: w
            .drops
            .iter()
            .map(|d| ProtoDrop {
                what: d.what.clone(),
                count: sat_i64(d.count),
            })
            .collect(),
        probe_overhead: w.probe_cost.as_ref().map(overhead_proto),
        dataloader: w.dataloader.as_ref().map(dataloader_proto),
        ..Default::default()
    };
    usage::fill_snapshot(&mut snapshot, w);
    snapshot
}

fn dataloader_proto(d: &crate::dataloader::DataLoaderSummary) -> DataLoaderInfo {
    DataLoaderInfo {
        num_workers: d.num_workers,
        persistent_workers: d.persistent_workers,
        pin_memory: d.pin_memory,
        prefetch_factor: d.prefetch_factor.unwrap_or(0),
        batch_size: d.batch_size.unwrap_or(0),
        epochs: d.epochs,
        loaders_replaced: d.loaders_replaced,
        training_shares: d.training.clone().into_iter().collect(),
        sharing_strategy: d.sharing_strategy.clone().unwrap_or_default(),
        window_s: d.window_s,
        batches: d.batches,
        training_gil_shares: shares(d.gil_wait.as_ref().map(|g| &g.training)),
        workers_gil_shares: shares(d.gil_wait.as_ref().map(|g| &g.workers)),
        training_lock_shares: shares(d.lock_wait.as_ref().map(|l| &l.training)),
        workers_lock_shares: shares(d.lock_wait.as_ref().map(|l| &l.workers)),
        hot_spots: hot_spots_proto(&d.hot_spots),
        workers_startup_s: d.workers_startup_s,
        training_cpu_cores: shares(d.cpu.as_ref().map(|c| &c.training)),
        workers_cpu_cores: shares(d.cpu.as_ref().map(|c| &c.workers)),
        pin_memory_cpu_cores: shares(d.cpu.as_ref().map(|c| &c.pin_memory)),
    }
}

/// Per-stage shares for the proto's map; empty when not told.
fn shares(
    m: Option<&std::collections::BTreeMap<String, f64>>,
) -> std::collections::BTreeMap<String, f64> {
    m.cloned().unwrap_or_default()
}

pub(crate) fn hot_spots_proto(
    h: &std::collections::BTreeMap<String, Vec<crate::stage_functions::FunctionShare>>,
) -> Vec<data_loader_info::HotSpot> {
    h.iter()
        .flat_map(|(stage, v)| {
            v.iter().map(move |f| data_loader_info::HotSpot {
                stage: stage.clone(),
                function: f.function.clone(),
                own: f.own,
                total: f.total,
            })
        })
        .collect()
}

fn overhead_proto(c: &crate::event::ProbeCost) -> ProbeOverhead {
    ProbeOverhead {
        target_share: c.target_share(),
        target_cpu_ns: sat_i64(c.target_cpu_ns),
        bpf_ns: sat_i64(c.bpf_ns),
        trap_hits: sat_i64(c.trap_hits),
        trap_ns: sat_i64(c.trap_ns),
        trap_cost_ns: sat_i64(c.trap_cost_ns),
        retprobe_hits: sat_i64(c.retprobe_hits),
        retprobe_cost_ns: sat_i64(c.retprobe_cost_ns),
        probe_cpu_ns: sat_i64(c.probe_cpu_ns),
        shim_ns: sat_i64(c.shim_ns),
        budget: c.budget,
        probes: c
            .probes
            .iter()
            .map(|p| ProbeHits {
                name: p.name.clone(),
                hits: sat_i64(p.hits),
                bpf_ns: sat_i64(p.bpf_ns),
                uprobe: p.uprobe,
            })
            .collect(),
        thinned: c.thinned.clone(),
    }
}
