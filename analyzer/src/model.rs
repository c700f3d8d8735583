//! Plumber's operational analysis (plumber-model.md §3) over the pipeline
//! tree: visit ratios, per-core rates, the rate each op sustains at its
//! parallelism, the ranking, and the evaluation of a configuration (what
//! rate the pipeline reaches with given parallelism, cache and disk) that the
//! recommendations are built from.
//!
//! Fixes over Plumber (§8): ops with zero CPU time have an unbounded rate
//! (never the bottleneck, left out of the LP); parallelism is per op, not
//! summed over live instances; visit ratios use each input's own element
//! count (Zip/Concatenate, an interleave's file list); an op's lock or GIL
//! wait bends its scaling (Amdahl, see [`crate::amdahl`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::amdahl;
use crate::guard::finite_pos;
use crate::input::PipelineInput;
use crate::lp::{self, Binding, LpItem, LpSolution};
pub(crate) use crate::machine::Machine;
use crate::node_model::{attach_stats, choose_cpu_source, note_self_time, propagate_top_down};
pub(crate) use crate::node_model::{CpuSource, Limit, NodeModel};
use crate::ops;
use crate::workers::{self, Pool};

/// An op is called contention-bound when the wait slows it by this factor
/// or more at its parallelism.
const CONTENTION_SLOWDOWN: f64 = 1.1;
/// A file reader is called I/O-bound when its wall time exceeds its busy
/// time by this factor.
const IO_WALL_FACTOR: f64 = 1.1;
/// The least share of its time a thread is taken to spend on a core when
/// capping an op's threads: four a core at most. DataLoader workers that
/// sleep 90% of each item (`torch_pyxform.py --item-sleep 2`, two cores)
/// ran 4 and 8 of them at the rate predicted (+1%, +5%), 13 and 15 at
/// 300/s where 336 and 378 were: the training loop's receiving took 2.2
/// ms a batch at 15 against 0.95 at 2, which a recording at 2 does not
/// show.
const MIN_THREAD_SHARE: f64 = 0.25;
/// Threads wait more than they run past this share of their own time off
/// their cores.
pub(crate) const OFF_CORE_MOSTLY: f64 = 0.5;

/// A change to the pipeline whose rate the model predicts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scenario {
    /// Knob node -> new parallelism of one instance.
    pub knobs: BTreeMap<usize, f64>,
    /// Ops whose lock/GIL wait is assumed removed.
    pub clear_wait: BTreeSet<usize>,
    /// Nodes with a cache inserted right above them (they and their inputs
    /// stop working once the cache is filled).
    pub cached: BTreeSet<usize>,
    pub disk_bandwidth: Option<f64>,
}

/// What bounds a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limiter {
    /// An op at its parallelism (CPU, lock or GIL).
    Op(usize),
    /// A file reader's streams (storage wait).
    Io(usize),
    /// The storage bandwidth.
    Disk,
    /// The core budget.
    Cores,
    None,
}

#[derive(Debug, Clone)]
pub(crate) struct Evaluation {
    pub rate: f64,
    pub limiter: Limiter,
    pub cpu_rate: f64,
    /// (node, cores) of the CPU allocation at that rate.
    pub cores: Vec<(usize, f64)>,
    pub p_eff: Vec<f64>,
}

#[derive(Debug, Clone)]
pub(crate) struct Model {
    pub input: PipelineInput,
    pub nodes: Vec<NodeModel>,
    pub cpu_source: CpuSource,
    pub elapsed_s: f64,
    pub machine: Machine,
    /// Ranked ops: lowest max rate first.
    pub ranking: Vec<usize>,
    /// Ops with stats but no bound (zero time).
    pub unbounded: Vec<usize>,
    pub notes: Vec<String>,
    /// A DataLoader's worker pool: its two ops are one parallel stage.
    pub pool: Option<Pool>,
}

fn opt_min(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl Model {
    /// The op names of the nodes, in node order.
    pub fn op_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.op.as_str())
    }

    pub fn build(mut input: PipelineInput, machine: Machine, mut notes: Vec<String>) -> Model {
        // The per-op inputs move into the nodes (no copy of 10,000 entries).
        let mut ops = std::mem::take(&mut input.ops);
        let g = &input.graph;
        let elapsed_s = input.elapsed_ns as f64 / 1e9;
        let cpu_source = choose_cpu_source(&ops, &mut notes);
        note_self_time(&ops, &mut notes);
        let mut nodes: Vec<NodeModel> = g.nodes.iter().map(NodeModel::new).collect();
        attach_stats(&mut nodes, g, &mut ops, &mut notes);
        propagate_top_down(&mut nodes, g, &mut notes);
        let pool = workers::find(|u| nodes[u].op.as_str(), g);
        if let Some(p) = pool {
            nodes[p.collate].knob = Some(p.collate);
            nodes[p.get_item].knob = Some(p.collate);
        }

        // Per-op rates.
        for &u in &g.order {
            if nodes[u].in_model {
                nodes[u].measure(cpu_source, elapsed_s);
            }
        }
        let mut model = Model {
            input,
            nodes,
            cpu_source,
            elapsed_s,
            machine,
            ranking: Vec::new(),
            unbounded: Vec::new(),
            notes,
            pool,
        };
        model.set_max_rates();
        model.rank_ops();
        model
    }

    /// Each op's CPU and I/O rate at its current parallelism, and what limits it.
    fn set_max_rates(&mut self) {
        let p_eff: Vec<f64> = self.nodes.iter().map(|n| n.p_eff).collect();
        for u in self.order() {
            let (cpu, io) = self.op_rates(u, &p_eff, &Scenario::default());
            let limit = self.op_limit(u, cpu, io, false, p_eff[u]);
            let n = &mut self.nodes[u];
            n.cpu_rate = cpu;
            n.io_rate = io;
            n.max_rate = opt_min(cpu, io);
            n.limit = limit;
        }
    }

    /// The ranking (lowest max rate first, graph order on ties), the ops
    /// that bound nothing, and a note naming those.
    fn rank_ops(&mut self) {
        let mut ranked: Vec<(f64, usize, usize)> = Vec::new();
        for (pos, u) in self.order().into_iter().enumerate() {
            let n = &self.nodes[u];
            if !n.in_model || n.stale {
                continue;
            }
            match n.max_rate {
                Some(r) => ranked.push((r, pos, u)),
                None => self.unbounded.push(u),
            }
        }
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        self.ranking = ranked.into_iter().map(|(_, _, u)| u).collect();
        for (i, &u) in self.ranking.clone().iter().enumerate() {
            self.nodes[u].rank = Some(i + 1);
        }
        if !self.unbounded.is_empty() {
            let names: Vec<&str> = self
                .unbounded
                .iter()
                .take(5)
                .map(|&u| self.nodes[u].name.as_str())
                .collect();
            self.notes.push(format!(
                "{} op(s) have no measured time or no elements and bound nothing ({}{})",
                self.unbounded.len(),
                names.join(", "),
                if self.unbounded.len() > 5 {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
    }

    pub fn order(&self) -> Vec<usize> {
        self.input.graph.order.clone()
    }

    pub fn graph(&self) -> &crate::graph::PipelineGraph {
        &self.input.graph
    }

    /// Serial share in a scenario (0 once the wait is removed).
    fn sigma(&self, u: usize, sc: &Scenario) -> f64 {
        if sc.clear_wait.contains(&u) {
            0.0
        } else {
            self.nodes[u].sigma
        }
    }

    /// The job's CPU over the window, in cores (0 when not recorded).
    pub(crate) fn process_cores(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.input.process_cpu_ns as f64 / 1e9 / self.elapsed_s
        } else {
            0.0
        }
    }

    fn r_eff(&self, u: usize, sc: &Scenario) -> f64 {
        let n = &self.nodes[u];
        if sc.clear_wait.contains(&u) {
            n.thread_r1().unwrap_or(0.0)
        } else {
            n.r1_eff
        }
    }

    /// CPU-side and I/O-side rate of an op at parallelism `p_eff[u]`.
    fn op_rates(&self, u: usize, p_eff: &[f64], sc: &Scenario) -> (Option<f64>, Option<f64>) {
        let n = &self.nodes[u];
        if !n.in_model {
            return (None, None);
        }
        let p = p_eff[u];
        let cpu =
            n.r1.map(|_| amdahl::rate(self.r_eff(u, sc), self.sigma(u, sc), p))
                .and_then(finite_pos);
        let io = n.io1.map(|r| r * p).and_then(finite_pos);
        (cpu, io)
    }

    pub fn op_limit(
        &self,
        u: usize,
        cpu: Option<f64>,
        io: Option<f64>,
        cleared: bool,
        p: f64,
    ) -> Limit {
        let n = &self.nodes[u];
        if let Some(io) = io {
            let io_bound = match cpu {
                None => true,
                Some(c) => io * IO_WALL_FACTOR < c,
            };
            if io_bound {
                return Limit::Io;
            }
        }
        if !cleared && n.sigma > 0.0 {
            if let (Some(c), Some(r)) = (cpu, n.thread_r1()) {
                if r * p >= c * CONTENTION_SLOWDOWN {
                    return if n.gil_s >= n.lock_s {
                        Limit::Gil
                    } else {
                        Limit::Lock
                    };
                }
            }
        }
        if self.cpu_source == CpuSource::Wallclock && n.disk {
            if let Some(st) = &n.stats {
                if st.wall_ns > 0 && st.wait_ns as f64 >= 0.5 * st.wall_ns as f64 {
                    return Limit::Io;
                }
            }
        }
        Limit::Cpu
    }

    /// Limit of an op in a scenario (its wait may have been removed).
    pub fn limit_in(&self, u: usize, sc: &Scenario, p_eff: &[f64]) -> Limit {
        let (cpu, io) = self.op_rates(u, p_eff, sc);
        self.op_limit(u, cpu, io, sc.clear_wait.contains(&u), p_eff[u])
    }

    /// Parallelism of every op under a scenario's knob settings.
    pub fn p_eff_in(&self, sc: &Scenario) -> Vec<f64> {
        if sc.knobs.is_empty() {
            return self.nodes.iter().map(|n| n.p_eff).collect();
        }
        let g = self.graph();
        let mut p_eff = vec![1.0; self.nodes.len()];
        let mut outer = vec![1.0; self.nodes.len()];
        for &u in &g.order {
            let key = self.pool.map_or(u, |p| p.knob_key(u));
            let inst = sc
                .knobs
                .get(&key)
                .copied()
                .unwrap_or(self.nodes[u].p_instance);
            p_eff[u] = inst * outer[u];
            for &c in &g.nodes[u].inputs {
                outer[c] = outer[u];
            }
            for &f in &g.nodes[u].fn_roots {
                outer[f] = if ops::is_interleave(&g.nodes[u].op) {
                    p_eff[u]
                } else {
                    outer[u]
                };
            }
        }
        p_eff
    }

    /// Nodes that stop working under the scenario's caches.
    pub fn removed_in(&self, sc: &Scenario) -> Vec<bool> {
        let mut removed = vec![false; self.nodes.len()];
        if sc.cached.is_empty() {
            return removed;
        }
        let g = self.graph();
        for &u in &g.order {
            if sc.cached.contains(&u) || g.nodes[u].consumer.is_some_and(|c| removed[c]) {
                removed[u] = true;
            }
        }
        removed
    }

    /// Ops the LP and the evaluation work on: in the model, not stale, not
    /// cached away, with a finite per-core rate.
    fn active(&self, removed: &[bool]) -> Vec<usize> {
        let mut active = self
            .graph()
            .order
            .iter()
            .copied()
            .filter(|&u| {
                let n = &self.nodes[u];
                n.in_model && !n.stale && !removed[u] && n.r1.is_some()
            })
            .collect();
        workers::fold_active(self.pool, &mut active);
        active
    }

    /// The most threads the LP may give an op: the core count for ops that
    /// take parallelism; for an op that waits, the useful point (it never
    /// gets parallelism that cannot help) or its current parallelism, not
    /// bounded by the cores (its threads sleep while they wait, and the
    /// LP's budget counts the CPU they use); one thread otherwise.
    pub fn lp_cap(&self, u: usize, sc: &Scenario, p_eff: &[f64]) -> f64 {
        let n = &self.nodes[u];
        let cores = self.machine.cores.max(1.0);
        if n.knob.is_none() {
            return 1.0;
        }
        // Threads that spend most of their time off a core (a DataLoader's
        // workers waiting on the network) fill the cores at more than one
        // each. Not threads that mostly run: forkserver workers new each
        // epoch, a quarter of their time off their cores in their first
        // reads, were given a third worker on two cores that ran 0.69x as
        // fast, its start-up at every edge not in the model.
        let share = n.thread_share();
        let cores = if share < 1.0 - OFF_CORE_MOSTLY {
            cores / share.max(MIN_THREAD_SHARE)
        } else {
            cores
        };
        let sigma = self.sigma(u, sc);
        if sigma > 0.0 {
            amdahl::useful_parallelism(sigma).max(p_eff[u]).max(1.0)
        } else {
            cores
        }
    }

    /// The LP items of the `active` ops under a scenario, each op's cores
    /// capped by `cap(op)`.
    /// A DataLoader's worker pool is one item, on its Collate node.
    fn lp_items(&self, sc: &Scenario, active: &[usize], cap: impl Fn(usize) -> f64) -> Vec<LpItem> {
        let item = |u: usize| LpItem {
            rate_per_core: self.r_eff(u, sc),
            // Per CPU-second: what the op's threads do while on a core.
            cpu_rate: self.nodes[u].r1.unwrap_or(0.0),
            serial_share: self.sigma(u, sc),
            cap: cap(u),
        };
        active
            .iter()
            .map(|&u| match self.pool {
                Some(p) if u == p.collate && self.folds_get_item(p, active) => {
                    workers::merge(item(u), item(p.get_item))
                }
                _ => item(u),
            })
            .collect()
    }

    /// GetItem's work is in Collate's item: it was left out of `active` for
    /// it and has a rate (it sits below Collate, so no cache removes only it).
    fn folds_get_item(&self, p: Pool, active: &[usize]) -> bool {
        let g = &self.nodes[p.get_item];
        !active.contains(&p.get_item) && g.in_model && !g.stale && g.r1.is_some()
    }

    /// The LP optimum under a scenario: (solution, node of each item).
    pub fn solve_lp(&self, sc: &Scenario) -> (LpSolution, Vec<usize>) {
        let p_eff = self.p_eff_in(sc);
        let active = self.active(&self.removed_in(sc));
        let items = self.lp_items(sc, &active, |u| self.lp_cap(u, sc, &p_eff));
        (
            lp::solve_with_overhead(
                &items,
                self.machine.cores,
                self.machine.budget.overhead_s_per_root,
            ),
            active,
        )
    }

    /// Integer parallelism per knob from an LP allocation: each op controlled
    /// by a knob needs θ/p_eff times the knob's instance parallelism; the
    /// knob takes the largest need, rounded up.
    pub fn round_knobs(
        &self,
        sol: &LpSolution,
        items: &[usize],
        sc: &Scenario,
    ) -> BTreeMap<usize, u32> {
        let p_eff = self.p_eff_in(sc);
        let mut out: BTreeMap<usize, u32> = BTreeMap::new();
        for (&u, &theta) in items.iter().zip(&sol.theta) {
            let Some(k) = self.nodes[u].knob else {
                continue;
            };
            let inst = sc
                .knobs
                .get(&k)
                .copied()
                .unwrap_or(self.nodes[k].p_instance);
            let need = if p_eff[u] > 0.0 {
                theta * inst / p_eff[u]
            } else {
                theta
            };
            let v = lp::round_up(need);
            let e = out.entry(k).or_insert(1);
            *e = (*e).max(v);
        }
        out
    }

    /// Storage-bandwidth bound on the root rate, with the active readers'
    /// bytes per root element.
    pub fn disk_bound(&self, removed: &[bool], bandwidth: Option<f64>) -> (Option<f64>, f64) {
        let bytes: f64 = self
            .graph()
            .order
            .iter()
            .filter(|&&u| {
                let n = &self.nodes[u];
                n.in_model && n.disk && !n.stale && !removed[u]
            })
            .map(|&u| self.nodes[u].disk_bytes_per_root)
            .sum();
        let bound = match bandwidth {
            Some(bw) if bytes > 0.0 => finite_pos(bw / bytes),
            _ => None,
        };
        (bound, bytes)
    }

    /// Rate of the pipeline under a scenario: the LP with each op capped at
    /// its parallelism (so ops share the cores), the read streams, and the
    /// storage bandwidth.
    pub fn evaluate(&self, sc: &Scenario) -> Evaluation {
        let p_eff = self.p_eff_in(sc);
        let removed = self.removed_in(sc);
        let active = self.active(&removed);
        let items = self.lp_items(sc, &active, |u| p_eff[u]);
        let sol = lp::solve_with_overhead(
            &items,
            self.machine.cores,
            self.machine.budget.overhead_s_per_root,
        );
        let mut rate = sol.rate;
        let mut limiter = match sol.binding {
            Binding::Cap(i) => Limiter::Op(active[i]),
            Binding::Budget => Limiter::Cores,
            Binding::Unbounded => Limiter::None,
        };
        for &u in &self.graph().order {
            let n = &self.nodes[u];
            if !n.in_model || n.stale || removed[u] {
                continue;
            }
            if let Some(io) = n.io1.map(|r| r * p_eff[u]).and_then(finite_pos) {
                if io < rate {
                    rate = io;
                    limiter = Limiter::Io(u);
                }
            }
        }
        let bw = sc.disk_bandwidth.or(self.machine.disk_bandwidth);
        if let (Some(d), _) = self.disk_bound(&removed, bw) {
            if d < rate {
                rate = d;
                limiter = Limiter::Disk;
            }
        }
        Evaluation {
            rate,
            limiter,
            cpu_rate: sol.rate,
            cores: active
                .iter()
                .copied()
                .zip(sol.cores.iter().copied())
                .collect(),
            p_eff,
        }
    }
}
