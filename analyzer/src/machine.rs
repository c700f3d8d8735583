//! The machine the model plans for: cores, memory and disk bandwidth from
//! the stats file, unless the user overrides them, each with where it came
//! from (the report shows it).
//!
//! The core budget is what the pipeline could get during the window, not
//! the machine's core count: the cores (or the cgroup quota, if tighter),
//! less what other processes took (the machine's busy CPU less the
//! target's), less what the target spent outside the pipeline (the training
//! step, Python, TensorFlow's own pools). Only part of the last grows with
//! the rate, and the recording's thread rows tell which:
//!
//! - the consumer, the threads the probe saw take the root's elements
//!   (CPU between two `GetNext` calls on the root), works per element;
//! - a thread outside the pipeline that slept until handed work
//!   (condition variable, futex) at least about once per root element
//!   works in step with the consumer (the training step's
//!   inter- and intra-op pools): per element too;
//! - any other thread outside the pipeline (the autotune optimiser, idle
//!   pools, Python's periodic work) wakes on its own clock: its CPU is fixed
//!   per second and comes off the cores like other processes' CPU.
//!
//! The per-element part is charged per root element beside the ops: a
//! faster pipeline leaves the consumer fewer spare cycles, and the
//! prediction says so. A file that does not say which threads consume
//! (older recordings, a window without attribution evidence) charges all
//! of it per element, as before: the pessimistic reading.

use crate::error::AnalyzeError;
use crate::fmt;
use crate::guard::finite_pos;
use crate::input::PipelineInput;
use crate::ops;

/// Machine figures that replace what the stats file says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineOverrides {
    /// Cores available to the input pipeline.
    pub cores: Option<f64>,
    /// Memory the cache budget is taken from (90% of it), bytes.
    pub memory_bytes: Option<u64>,
    /// Storage bandwidth, bytes/s (0: unknown).
    pub disk_bandwidth: Option<f64>,
}

/// The terms of the core budget over the window, cores (CPU-s per second).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CoreBudget {
    /// The terms below were measured (a recording's CPU figures); false:
    /// the cores are the budget as the file or `--cores` states them.
    pub measured: bool,
    /// The machine's cores (the file's count or `--cores`).
    pub machine: f64,
    /// The target's cgroup quota, when set.
    pub quota: Option<f64>,
    /// What other processes (the probe included) took; None: not measured.
    pub other_processes: Option<f64>,
    /// The target's CPU outside the pipeline (the consumer and the rest).
    pub outside_pipeline: f64,
    /// The part of `outside_pipeline` fixed per second (threads that
    /// neither consume nor wake per element): off the LP's cores.
    pub fixed_outside: f64,
    /// The consumer's own CPU per root element, CPU-s (0: not known).
    pub consumer_s_per_root: f64,
    /// Times the consumer slept (condition variable, futex) per root
    /// element it took (0: not known): near 1, it waited for the pipeline
    /// at nearly every element.
    pub consumer_waits_per_root: f64,
    /// Root elements per second over the window (0: not known).
    pub observed_rate: f64,
    /// Pipeline threads' CPU that no op claims.
    pub unattributed: f64,
    /// `outside_pipeline − fixed_outside + unattributed` per root element,
    /// CPU-s: charged to the LP beside the ops.
    pub overhead_s_per_root: f64,
}

/// A thread outside the pipeline that slept until handed work at least
/// this many times per root element keeps pace with the consumer. Such a
/// thread sleeps about once per element or more (the training loop waits
/// for each step's result, the step's pools for each op); half leaves room
/// for a window's edges and steps that did not block, and stays far above
/// a periodic thread's wake-ups at any rate worth predicting (below, a
/// periodic thread counts per element: the pessimistic side).
const PACED_WAKEUPS: f64 = 0.5;
/// Extrapolating this many times the observed rate or more, a prediction
/// that the consumer's charge decides says so.
const FAR: f64 = 2.0;
/// The consumer's charge decides a prediction when it takes at least this
/// share of the cores at the predicted rate.
const CONSUMER_SHARE: f64 = 0.5;

impl CoreBudget {
    /// Cores the pipeline's ops had to themselves, as during the window;
    /// `lp_cores` already has the fixed outside CPU taken off.
    pub fn pipeline(&self, lp_cores: f64) -> f64 {
        (lp_cores - (self.outside_pipeline - self.fixed_outside) - self.unattributed).max(0.0)
    }
}

impl Machine {
    /// What every prediction assumes about the cores, in one line.
    pub fn assumption(&self) -> String {
        let b = &self.budget;
        if !b.measured {
            return format!(
                "with the {} cores {} all free to the pipeline",
                fmt::count(self.cores),
                if self.cores_from == "override" {
                    "given"
                } else {
                    "stated"
                }
            );
        }
        let total = b.quota.map_or(b.machine, |q| q.min(b.machine));
        // Fixed outside CPU comes off the cores like other processes'.
        let fixed = if b.fixed_outside > 0.0 {
            format!(
                ", {} to the target's threads that neither take elements nor keep pace with them",
                fmt::num(b.fixed_outside)
            )
        } else {
            String::new()
        };
        let mut s = match b.other_processes {
            Some(o) => format!(
                "with {} of {} cores free as during the window ({} to other processes{fixed})",
                fmt::num(self.cores),
                fmt::count(total),
                fmt::num(o)
            ),
            None => format!(
                "with {} cores (what other processes took was not measured{fixed})",
                fmt::count(total)
            ),
        };
        if b.overhead_s_per_root > 0.0 {
            s.push_str(&format!(
                ", and {} CPU-ms per element outside the pipeline (the consumer) growing with the rate",
                fmt::num(b.overhead_s_per_root * 1e3)
            ));
        }
        s
    }

    /// The assumption of a prediction of `rate`: [`Machine::assumption`],
    /// and, where the rate lies far beyond the observed one and the
    /// consumer's charge takes most of the cores there, that this charge,
    /// measured at the observed rate, decides it.
    pub fn assumption_at(&self, rate: Option<f64>) -> String {
        let mut s = self.assumption();
        let b = &self.budget;
        let Some(rate) = rate.filter(|r| r.is_finite()) else {
            return s;
        };
        let charge = b.overhead_s_per_root * rate;
        if b.observed_rate <= 0.0
            || rate < FAR * b.observed_rate
            || charge < CONSUMER_SHARE * self.cores
        {
            return s;
        }
        // The whole per-element charge decides; the consumer's own part is
        // named when the training step's pools or unclaimed pipeline CPU
        // add to it.
        let own = b.consumer_s_per_root;
        let part = if own > 0.0 && own < 0.95 * b.overhead_s_per_root {
            format!(" ({} of it the consumer's own)", fmt::num(own * 1e3))
        } else {
            String::new()
        };
        s.push_str(&format!(
            "; the consumer's {} CPU-ms per element{part}, measured at {}, decides this prediction",
            fmt::num(b.overhead_s_per_root * 1e3),
            fmt::rate(Some(b.observed_rate))
        ));
        if b.consumer_waits_per_root >= 0.5 {
            s.push_str(&format!(
                " (it slept {} times per element it took: what an element costs it when it no longer waits for the pipeline was not measured)",
                fmt::num(b.consumer_waits_per_root)
            ));
        }
        s
    }
}

/// The machine's figures after the user's overrides.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    /// The LP's budget: the cores (or quota) less other processes.
    pub cores: f64,
    pub cores_from: &'static str,
    pub budget: CoreBudget,
    pub memory: Option<f64>,
    pub memory_from: &'static str,
    pub disk_bandwidth: Option<f64>,
    pub disk_bandwidth_from: &'static str,
}

/// Machine figures after the user's overrides.
pub(crate) fn resolve_machine(
    input: &PipelineInput,
    ov: &MachineOverrides,
    notes: &mut Vec<String>,
) -> Result<Machine, AnalyzeError> {
    let (cores, cores_from) = match ov.cores {
        Some(c) if c.is_finite() && c > 0.0 => (c, "override"),
        Some(c) => {
            return Err(AnalyzeError::InvalidOverride(format!(
                "cores must be a positive number, got {c}"
            )))
        }
        None if input.machine.cores > 0.0 => (input.machine.cores, "file"),
        None if input.machine.threadpool_size > 0 => {
            notes.push(format!(
                "the file states no core count; assumed the tf.data thread pool size, {} (pass --cores)",
                input.machine.threadpool_size
            ));
            (input.machine.threadpool_size as f64, "threadpool")
        }
        None => {
            notes.push("the file states no core count; assumed 1 (pass --cores)".into());
            (1.0, "assumed")
        }
    };
    let (memory, memory_from) = match ov.memory_bytes {
        Some(0) => {
            return Err(AnalyzeError::InvalidOverride(
                "memory must be more than 0 bytes".into(),
            ))
        }
        Some(m) => (Some(m as f64), "override"),
        None if input.machine.memory_total > 0 => (Some(input.machine.memory_total as f64), "file"),
        None if input.machine.memory_free > 0 => {
            (Some(input.machine.memory_free as f64), "file_free")
        }
        None => (None, "unknown"),
    };
    let (disk_bandwidth, disk_bandwidth_from) = match ov.disk_bandwidth {
        Some(b) if b.is_finite() && b > 0.0 => (Some(b), "override"),
        Some(0.0) => (None, "unknown"),
        Some(b) => {
            return Err(AnalyzeError::InvalidOverride(format!(
                "disk bandwidth must be a positive number of bytes/s, got {b}"
            )))
        }
        None => match finite_pos(input.machine.disk_bandwidth) {
            Some(b) => (Some(b), "file"),
            None => (None, "unknown"),
        },
    };
    let budget = core_budget(input, cores, cores_from == "override");
    let lp_cores = budget
        .quota
        .map_or(budget.machine, |q| q.min(budget.machine));
    // Never below a tenth of the cores: a busy minute elsewhere must not
    // make the model plan for nothing.
    let lp_cores = (lp_cores - budget.other_processes.unwrap_or(0.0) - budget.fixed_outside)
        .max(0.1 * lp_cores);
    Ok(Machine {
        cores: lp_cores,
        cores_from,
        budget,
        memory,
        memory_from,
        disk_bandwidth,
        disk_bandwidth_from,
    })
}

/// The core budget's terms from the recording's CPU figures; with
/// `--cores` the user states the pipeline's cores, and nothing is taken off.
fn core_budget(input: &PipelineInput, cores: f64, overridden: bool) -> CoreBudget {
    let mut b = CoreBudget {
        machine: cores,
        ..Default::default()
    };
    if overridden {
        return b;
    }
    let t = input.elapsed_ns as f64 / 1e9;
    let c = &input.cpu;
    if t.is_nan() || t <= 0.0 {
        return b;
    }
    b.quota = (c.quota_cores > 0.0 && c.quota_cores < cores).then_some(c.quota_cores);
    if c.machine_busy_ns > 0 && input.process_cpu_ns > 0 {
        let other = c.machine_busy_ns.saturating_sub(input.process_cpu_ns) as f64 / 1e9 / t;
        b.other_processes = finite_pos(other).or(Some(0.0));
    }
    if !c.measured {
        return loop_budget(input, b, t);
    }
    b.measured = true;
    b.outside_pipeline = c.non_pipeline_ns as f64 / 1e9 / t;
    b.unattributed = c.unattributed_ns as f64 / 1e9 / t;
    let root = input
        .graph
        .nodes
        .get(input.graph.top)
        .map(|n| n.name.as_str());
    let roots = root
        .and_then(|r| input.ops.get(r))
        .map_or(0, |o| o.elements);
    if roots > 0 {
        let split = split_outside(c, roots);
        b.fixed_outside = split.fixed_ns as f64 / 1e9 / t;
        b.observed_rate = roots as f64 / t;
        b.consumer_s_per_root = split.consumer_ns as f64 / 1e9 / roots as f64;
        b.consumer_waits_per_root = split.consumer_wakeups as f64 / roots as f64;
        let per_element = c
            .non_pipeline_ns
            .saturating_sub(split.fixed_ns)
            .saturating_add(c.unattributed_ns) as f64
            / 1e9;
        b.overhead_s_per_root = per_element / roots as f64;
    }
    b
}

/// The outside CPU's split over the window, ns.
#[derive(Debug, Default, PartialEq)]
struct OutsideSplit {
    /// CPU of the threads that take the root's elements (all of it outside
    /// the pipeline: what they do between elements is theirs).
    consumer_ns: u64,
    /// Times those threads slept until handed something.
    consumer_wakeups: u64,
    /// CPU of the threads that neither consume nor wake once per element.
    fixed_ns: u64,
}

/// Splits the CPU outside the pipeline by what each thread was seen doing
/// (see the module's comment). Without a consumer among the threads the
/// file cannot tell fixed from per-element CPU: none is fixed.
fn split_outside(c: &crate::input::CpuContext, roots: u64) -> OutsideSplit {
    let mut s = OutsideSplit::default();
    if !c.outside_threads.iter().any(|t| t.consumer_ns > 0) {
        return s;
    }
    for t in &c.outside_threads {
        if t.consumer_ns > 0 {
            s.consumer_ns = s.consumer_ns.saturating_add(t.non_pipeline_ns);
            s.consumer_wakeups = s.consumer_wakeups.saturating_add(t.wakeups);
        } else if (t.wakeups as f64) < PACED_WAKEUPS * roots as f64 {
            s.fixed_ns = s.fixed_ns.saturating_add(t.non_pipeline_ns);
        }
    }
    // Rows that do not add up to the total (a thread seen only in part)
    // leave the rest per element.
    s.fixed_ns = s.fixed_ns.min(c.non_pipeline_ns);
    s
}

/// The core budget of a DataLoader recording. It has no per-thread CPU
/// (no BPF: no `probe_cpu`), only the job's CPU over the window: the
/// training process and every process below it (a forkserver, the
/// workers), with those they reaped. What the loader's stages and its
/// epoch edges did not take of it is the training loop's own work (its
/// step), which grows with the rate as a consumer's does, so it is
/// charged per batch beside the ops. The stages' times are their CPU
/// times where measured, else wall times, at least their CPU: the charge
/// is then a lower bound, never more than the loop took.
/// Without the job's CPU (0) or for a tf.data pipeline: `b` unchanged.
fn loop_budget(input: &PipelineInput, mut b: CoreBudget, t: f64) -> CoreBudget {
    let dl = || {
        input
            .graph
            .nodes
            .iter()
            .filter(|n| ops::is_dataloader(&n.op))
    };
    if input.process_cpu_ns == 0 || dl().next().is_none() {
        return b;
    }
    // With the stages' CPU time measured the ops are charged it, and the
    // rest of the job's CPU is the loop's; else their wall time.
    let measured = dl()
        .filter_map(|n| input.ops.get(&n.name))
        .any(|o| o.cpu_ns > 0);
    let stages: u64 = dl()
        .filter_map(|n| input.ops.get(&n.name))
        .map(|o| {
            if measured {
                o.cpu_ns
            } else {
                o.wall_ns.max(o.cpu_ns)
            }
        })
        .fold(0, u64::saturating_add);
    let top = input.graph.nodes.get(input.graph.top);
    let batches = top
        .and_then(|n| input.ops.get(&n.name))
        .map_or(0, |o| o.elements);
    if batches == 0 {
        return b;
    }
    // Epoch edges take CPU that `persistent_workers=True` saves, not per
    // batch: workers starting (importing the job's modules under spawn or
    // forkserver) and the loop starting and joining them, with what the
    // kernel spends making and tearing down their processes. Left out of
    // the step's charge, at most their wall time, as the stages are. On
    // forkserver workers new each 16-batch epoch (86% of the loop's time
    // at edges) the workers' start-up alone left 25 CPU-ms a batch
    // charged to a loop whose step took 1 ms.
    let startup = input.dataloader.as_ref().map_or(0, |d| {
        ((d.workers_startup_s + d.share("startup") * t) * 1e9) as u64
    });
    let outside = input
        .process_cpu_ns
        .saturating_sub(stages)
        .saturating_sub(startup) as f64
        / 1e9;
    b.measured = true;
    b.outside_pipeline = outside / t;
    b.observed_rate = batches as f64 / t;
    b.consumer_s_per_root = outside / batches as f64;
    b.overhead_s_per_root = b.consumer_s_per_root;
    b
}
