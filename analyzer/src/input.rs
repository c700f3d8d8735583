//! The model's input: the snapshot's per-op counters normalised into
//! [`OpInput`] (units fixed, per-op parallelism, Plumber's sums undone), the
//! machine figures and the time window, plus the pipeline graph.
//!
//! `lock_wait_ns`/`gil_wait_ns` come from plumber-probe's extension fields
//! (`probe_lock_wait_ns`, `probe_gil_wait_ns`); Plumber's own files lack
//! them (0), and a caller that knows them can set them here before
//! [`crate::analyze_input`].

use std::collections::HashMap;

use plumber_collector::proto::pipeline_snapshot::OpStats;
use plumber_collector::proto::PipelineSnapshot;
use plumber_collector::report::MeasuredReport;

use crate::error::AnalyzeError;
use crate::graph::PipelineGraph;
use crate::load;
use crate::measured::measured_report;

/// One op's counters over the window, as the model uses them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpInput {
    /// NodeDef name (OpStats.name).
    pub name: String,
    /// Elements produced (aggregate over every iterator instance).
    pub elements: u64,
    /// Self thread-CPU time, ns (`aggregate_processing_time_clock`).
    pub cpu_ns: u64,
    /// No attribution window caught the op: `cpu_ns` is TensorFlow's self
    /// time for it (`probe_cpu_from_self_time`).
    pub cpu_from_self_time: bool,
    /// Self wall time, ns (`aggregate_processing_time`); for file readers it
    /// includes waiting for the storage.
    pub wall_ns: u64,
    /// Time blocked in inputs or, for file readers, in open/read, ns
    /// (`aggregate_wait_time`).
    pub wait_ns: u64,
    /// Parallelism of one instance of the op (threads); 0 = unknown. Not
    /// summed over instances (Plumber's OpStats.parallelism is).
    pub parallelism: f64,
    /// `element_ratio` as written: inputs consumed per output of the first
    /// live instance; -1 or inf when unknown.
    pub element_ratio: f64,
    /// -1 infinite, -2 unknown.
    pub cardinality: i64,
    pub bytes_produced: u64,
    /// File readers: payload bytes read.
    pub disk_bytes_read: u64,
    /// File readers: files opened.
    pub files_opened: u64,
    /// Time the op's threads waited for a lock, ns (summed over threads).
    pub lock_wait_ns: u64,
    /// Time the op's threads waited for Python's GIL, ns (summed over threads).
    pub gil_wait_ns: u64,
}

/// Machine figures as the file states them (0 = not stated).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineFigures {
    pub cores: f64,
    pub memory_total: u64,
    pub memory_free: u64,
    /// Bytes per second; Plumber's TensorFlow always writes 0.
    pub disk_bandwidth: f64,
    /// tf.data's shared thread pool size (a fallback for the core count).
    pub threadpool_size: u64,
}

/// Where the process's and the machine's CPU went over the window, as a
/// plumber-probe recording measured it (Plumber's own files have none: all
/// zero), ns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuContext {
    /// The file has these figures (a plumber-probe recording with thread
    /// data); false: every figure below but `machine_busy_ns` and
    /// `quota_cores` is 0 as unknown.
    pub measured: bool,
    /// The target's CPU spent outside the pipeline: the training step,
    /// Python, the consumer of the pipeline.
    pub non_pipeline_ns: u64,
    /// Pipeline threads' CPU that no op claims.
    pub unattributed_ns: u64,
    /// The consumer's threads' wait for the GIL.
    pub non_pipeline_gil_wait_ns: u64,
    /// Busy CPU of the whole machine (0: not measured).
    pub machine_busy_ns: u64,
    /// The target's cgroup CPU quota, cores (0: none).
    pub quota_cores: f64,
    /// The threads that spent CPU outside the pipeline, as the recording
    /// saw them (empty in files written before per-thread rows).
    pub outside_threads: Vec<OutsideThread>,
}

/// One thread's CPU outside the pipeline over the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutsideThread {
    /// Its CPU outside the pipeline, ns.
    pub non_pipeline_ns: u64,
    /// The part the thread spent between two `GetNext` calls on the root
    /// iterator, ns: it takes the root's elements (0 in older files).
    pub consumer_ns: u64,
    /// Times it slept until another thread handed it something (condition
    /// variable and futex waits) over the window. Lock and GIL waits are
    /// contention, not pacing: left out.
    pub wakeups: u64,
}

/// Everything the model reads, built from a snapshot; editable before
/// analysis (e.g. to supply lock/GIL wait per op).
#[derive(Debug, Clone)]
pub struct PipelineInput {
    /// Per-op counters by OpStats name.
    pub ops: HashMap<String, OpInput>,
    pub machine: MachineFigures,
    /// Window length, ns (`current_time - start_time`).
    pub elapsed_ns: u64,
    /// Payload bytes of each file read to the end.
    pub file_sizes: Vec<(String, u64)>,
    /// Process CPU time over the window, ns (0 = unknown).
    pub process_cpu_ns: u64,
    /// The CPU outside the pipeline (the core budget's terms).
    pub cpu: CpuContext,
    /// A DataLoader recording's loader facts (stats.pb `dataloader`).
    pub dataloader: Option<DataLoaderFacts>,
    pub(crate) graph: PipelineGraph,
    pub(crate) measured: MeasuredReport,
    pub(crate) notes: Vec<String>,
}

/// What a DataLoader recording says of the loader beyond its graph: its
/// configuration and where the training loop's time went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DataLoaderFacts {
    pub num_workers: u32,
    pub persistent_workers: bool,
    pub pin_memory: bool,
    /// Epochs that ended in the window.
    pub epochs: u64,
    /// Times in the window the job replaced its loader by one it made
    /// anew.
    pub loaders_replaced: u64,
    /// Share of the training loop's wall time per stage (`wait`,
    /// `receive`, `startup`, `get_item`, `collate`, `other`).
    pub training: std::collections::BTreeMap<String, f64>,
    /// torch's tensor sharing strategy, where seen.
    pub sharing_strategy: Option<String>,
    /// Per stage of the training loop: the share of its time the loop
    /// waited for the training process's GIL (empty: not told).
    pub training_gil: std::collections::BTreeMap<String, f64>,
    /// The same for the workers' stages, all workers together (`send`:
    /// their feeders and resource sharers handing batches over).
    pub workers_gil: std::collections::BTreeMap<String, f64>,
    /// Per stage of the training loop: the share of its time it waited on
    /// a lock, a condition or a semaphore (empty: not told).
    pub training_lock: std::collections::BTreeMap<String, f64>,
    /// The same for the workers' stages, all workers together.
    pub workers_lock: std::collections::BTreeMap<String, f64>,
    /// Per stage, its hot spots, most time first: the Python function
    /// (`function (file.py)`) and its share of the stage's time with its
    /// callees.
    pub hot_spots: std::collections::BTreeMap<String, Vec<(String, f64)>>,
    /// The workers' wall time starting (imports, seeding,
    /// `worker_init_fn`), all workers together, s.
    pub workers_startup_s: f64,
}

impl DataLoaderFacts {
    /// The training loop's share of the window in `stage`.
    pub fn share(&self, stage: &str) -> f64 {
        self.training
            .get(stage)
            .copied()
            .filter(|x| x.is_finite())
            .unwrap_or(0.0)
    }

    fn from_proto(d: &plumber_collector::proto::pipeline_snapshot::DataLoaderInfo) -> Self {
        DataLoaderFacts {
            num_workers: d.num_workers,
            persistent_workers: d.persistent_workers,
            pin_memory: d.pin_memory,
            epochs: d.epochs,
            loaders_replaced: d.loaders_replaced,
            training: d
                .training_shares
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            sharing_strategy: Some(d.sharing_strategy.clone()).filter(|s| !s.is_empty()),
            training_gil: shares(&d.training_gil_shares),
            workers_gil: shares(&d.workers_gil_shares),
            training_lock: shares(&d.training_lock_shares),
            workers_lock: shares(&d.workers_lock_shares),
            hot_spots: d.hot_spots.iter().fold(Default::default(), |mut m, h| {
                if h.total.is_finite() && (0.0..=1.0).contains(&h.total) {
                    m.entry(h.stage.clone())
                        .or_insert_with(Vec::new)
                        .push((h.function.clone(), h.total));
                }
                m
            }),
            workers_startup_s: Some(d.workers_startup_s)
                .filter(|x| x.is_finite() && *x > 0.0)
                .unwrap_or(0.0),
        }
    }

    /// The share of the training loop's time in `stage` that it waited
    /// for its process's GIL (0: none, or not told).
    pub fn gil(&self, stage: &str) -> f64 {
        self.training_gil.get(stage).copied().unwrap_or(0.0)
    }
}

/// A map of shares as read: finite, within [0, 1].
fn shares(m: &std::collections::BTreeMap<String, f64>) -> std::collections::BTreeMap<String, f64> {
    m.iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(k, v)| (k.clone(), v.clamp(0.0, 1.0)))
        .collect()
}

fn nonneg(x: i64) -> u64 {
    u64::try_from(x).unwrap_or(0)
}

fn first_nonzero(a: i64, b: i64) -> u64 {
    if a > 0 {
        nonneg(a)
    } else {
        nonneg(b)
    }
}

impl OpInput {
    pub fn from_stats(s: &OpStats) -> Self {
        let parallelism = if s.probe_parallelism.is_finite() && s.probe_parallelism > 0.0 {
            s.probe_parallelism
        } else if s.parallelism > 0 {
            // Plumber sums Parallelism() over live instances (model §8.3):
            // divide by the instance count to get one op's parallelism.
            s.parallelism as f64 / s.count.max(1) as f64
        } else {
            0.0
        };
        OpInput {
            name: s.name.clone(),
            elements: first_nonzero(s.aggregate_elements_produced, s.elements_produced),
            cpu_ns: first_nonzero(s.aggregate_processing_time_clock, s.processing_time_clock),
            cpu_from_self_time: s.probe_cpu_from_self_time,
            wall_ns: first_nonzero(s.aggregate_processing_time, s.processing_time),
            wait_ns: nonneg(s.aggregate_wait_time),
            parallelism,
            element_ratio: s.element_ratio,
            cardinality: s.cardinality,
            bytes_produced: first_nonzero(s.aggregate_bytes_produced, s.bytes_produced),
            disk_bytes_read: nonneg(s.aggregate_disk_bytes_read),
            files_opened: nonneg(s.aggregate_elements_consumed),
            lock_wait_ns: nonneg(s.probe_lock_wait_ns),
            gil_wait_ns: nonneg(s.probe_gil_wait_ns),
        }
    }
}

impl PipelineInput {
    pub fn from_snapshot(s: &PipelineSnapshot) -> Result<Self, AnalyzeError> {
        load::validate(s)?;
        let graph_def = s.graph.as_ref().ok_or(AnalyzeError::StatsWithoutGraph)?;
        // The collector's measured report is independent of the model's
        // graph: build both at once (inline if no thread can be started).
        let (graph, measured) = std::thread::scope(|scope| {
            let handle = std::thread::Builder::new()
                .name("plumber-measured".into())
                .spawn_scoped(scope, || measured_report(s))
                .ok();
            let graph = PipelineGraph::build(graph_def);
            let measured = match handle {
                Some(h) => h.join().unwrap_or_default(),
                None => measured_report(s),
            };
            (graph, measured)
        });
        let graph = graph?;
        let mut notes = graph.notes.clone();
        let mut ops = HashMap::with_capacity(s.stats.len());
        for st in &s.stats {
            if ops.contains_key(&st.name) {
                notes.push(format!("duplicate stats for {} ignored", st.name));
                continue;
            }
            ops.insert(st.name.clone(), OpInput::from_stats(st));
        }
        let info = s.snapshot_info.unwrap_or_default();
        let elapsed = info.current_time.saturating_sub(info.start_time);
        if elapsed <= 0 {
            return Err(AnalyzeError::NoWindow);
        }
        let mi = s.machine_info.clone().unwrap_or_default();
        let ctx = s.ctx_info.clone().unwrap_or_default();
        let machine = MachineFigures {
            cores: mi.num_cores.max(0) as f64,
            memory_total: nonneg(mi.memory_total),
            memory_free: nonneg(mi.memory_free),
            disk_bandwidth: if mi.estimated_disk_bandwidth.is_finite()
                && mi.estimated_disk_bandwidth > 0.0
            {
                mi.estimated_disk_bandwidth
            } else {
                0.0
            },
            threadpool_size: nonneg(ctx.shared_threadpool_size),
        };
        let file_sizes = ctx
            .file_sizes
            .iter()
            .map(|f| (f.name.clone(), nonneg(f.size)))
            .collect();
        let process_cpu_ns = nonneg(
            info.process_current_time
                .saturating_sub(info.process_start_time),
        );
        let cpu = s
            .probe_cpu
            .as_ref()
            .map_or_else(CpuContext::default, |c| CpuContext {
                // A recording without per-thread rows still has the
                // machine's busy CPU and the quota, and nothing else
                // (no process figure).
                measured: c.process_ns > 0 || !c.threads.is_empty(),
                non_pipeline_ns: nonneg(c.non_pipeline_ns),
                unattributed_ns: nonneg(c.unattributed_ns),
                non_pipeline_gil_wait_ns: c
                    .non_pipeline_waits
                    .as_ref()
                    .map_or(0, |w| nonneg(w.gil_wait_ns)),
                machine_busy_ns: nonneg(c.machine_busy_ns),
                quota_cores: if c.cpu_quota_cores.is_finite() && c.cpu_quota_cores > 0.0 {
                    c.cpu_quota_cores
                } else {
                    0.0
                },
                outside_threads: c
                    .threads
                    .iter()
                    .filter(|t| t.non_pipeline_ns > 0)
                    .map(|t| OutsideThread {
                        non_pipeline_ns: nonneg(t.non_pipeline_ns),
                        consumer_ns: nonneg(t.consumer_ns).min(nonneg(t.non_pipeline_ns)),
                        wakeups: t.waits.as_ref().map_or(0, |w| {
                            nonneg(w.cond_waits).saturating_add(nonneg(w.futex_waits))
                        }),
                    })
                    .collect(),
            });
        Ok(PipelineInput {
            ops,
            machine,
            elapsed_ns: nonneg(elapsed),
            file_sizes,
            process_cpu_ns,
            cpu,
            dataloader: s.dataloader.as_ref().map(DataLoaderFacts::from_proto),
            graph,
            measured,
            notes,
        })
    }

    /// The counters of one op, to supply what the file lacks (lock or GIL
    /// wait).
    pub fn op_mut(&mut self, name: &str) -> Option<&mut OpInput> {
        self.ops.get_mut(name)
    }
}
