//! One recording: attach, poll the pipeline until the duration, Ctrl-C or
//! the target's exit, then hand every observation to the collector.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use plumber_collector::event::{
    DropCount, Event, NodeCounters, NodeObservation, NodeRetired, Poll, TargetInfo,
};
use plumber_collector::opnames;
use tracing::{debug, info, warn};

use crate::bpf::{self, Bpf, RetiredEvent, DROP_NAMES};
use crate::clock::now_ns;
use crate::derive::{self, Derived};
use crate::layout::NodeLayout;
use crate::mem::Memory;
use crate::model::{stable_path, ModelReader};
use crate::progress::Progress;
use crate::sampler::{self, Sampler, StackContext};
use crate::sink::EventSink;
use crate::stop::{self, sleep_interval, STOP};
use crate::target::{self, Target};
use crate::usage::{Attribution, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeChoice {
    /// The autotune model when it can be read, else uprobes.
    Auto,
    /// Only the autotune model (fail if it cannot be read).
    Model,
    /// Per-call uprobes on GetNext (microseconds per call on the target).
    Uprobes,
}

/// Default poll interval while reading the model. Its counters are
/// cumulative and nodes that die between polls are caught as they go
/// (RemoveNode), so more polls add nothing to the result, and each costs
/// ~0.7 ms of CPU on a machine the target may keep busy (four polls a
/// second were two thirds of the probe's CPU between windows).
pub const MODEL_INTERVAL: Duration = Duration::from_millis(1000);
/// Default poll interval of the uprobes fallback: an iterator's counts are
/// only kept once a poll has read its name, so iterators that live less
/// than an interval (one per epoch or file) are lost the more, the longer
/// it is.
pub const UPROBES_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
pub struct RecordOpts {
    pub pid: i32,
    pub duration: Option<Duration>,
    /// Poll interval; None: `MODEL_INTERVAL` reading the model,
    /// `UPROBES_INTERVAL` in the uprobes fallback.
    pub interval: Option<Duration>,
    pub mode: ModeChoice,
    /// How long to wait for the pipeline to produce its first element.
    pub discovery_timeout: Duration,
    pub quiet: bool,
    /// Also write every observation here (JSON lines).
    pub save_events: Option<PathBuf>,
    pub attribution: Attribution,
    pub io_ringbuf_bytes: Option<u32>,
    /// Stack samples per second of each target thread on CPU; 0: none.
    pub sample_hz: u32,
}

pub struct Recording {
    pub sink: EventSink,
    /// Why the recording ended.
    pub reason: String,
    pub mode: &'static str,
    pub partial: bool,
    /// Seconds from start to the first poll with data.
    pub time_to_first_data: f64,
    pub cache_hit: bool,
    /// The stack sampler's result, attributed to threads and ops.
    pub stacks: Option<StackRecording>,
    /// Thread names and ops, from the usage side, for the stacks.
    stack_context: StackContext,
}

/// Stack samples of a recording, ready for the flamegraph outputs.
pub struct StackRecording {
    pub agg: plumber_collector::stacks::StackAggregator,
    /// Op spans of the attribution windows, for trace.json.
    pub spans: Vec<plumber_collector::stacks::Span>,
    pub samples: u64,
    pub complete_pct: f64,
    pub pid: i32,
    pub hz: u32,
    /// When sampling ran, ns since the epoch.
    pub start_wall_ns: u64,
    pub end_wall_ns: u64,
}

/// The pipeline runs but has no autotune model (autotune disabled): its
/// iterators have no model node.
#[derive(Debug, thiserror::Error)]
#[error("{}; retry with --mode uprobes", NO_MODEL)]
struct NoModel;
pub(crate) const NO_MODEL: &str =
    "the pipeline's iterators have no autotune model node (is autotune disabled?)";

/// How many extra discoveries may look for parallel ops' iterators.
const PARALLELISM_TRIES: u32 = 10;

/// Root, BPF and ptrace permissions, checked before any work so the user
/// gets the fix, not an errno from deep inside.
pub fn check_privileges() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_PTRACE: u64 = 19;
    const CAP_PERFMON: u64 = 38;
    const CAP_BPF: u64 = 39;
    let missing: Vec<&str> = [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    ]
    .iter()
    .filter(|(bit, _)| cap_eff & (1 << bit) == 0)
    .map(|(_, n)| *n)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    bail!(
        "plumber-probe needs root to attach to another process: run it with sudo, or grant {} (e.g. sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(which plumber-probe)); without privileges use `plumber-probe run -- python train.py`",
        missing.join(" + ")
    )
}

pub(crate) fn target_info(t: &Target, mode: &str) -> TargetInfo {
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kb = |key: &str| {
        mem.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
            * 1024
    };
    TargetInfo {
        pid: t.pid as i64,
        tensorflow_version: t.tensorflow_version.clone(),
        libraries: t.libraries(),
        mode: mode.to_string(),
        num_cores: std::thread::available_parallelism()
            .map(|n| n.get() as i64)
            .unwrap_or(1),
        memory_total: kb("MemTotal:"),
        memory_free: kb("MemAvailable:"),
        not_measured: Vec::new(),
    }
}

fn retired_to_event(e: &RetiredEvent) -> NodeRetired {
    NodeRetired {
        mono_ns: e.mono_ns,
        addr: e.node,
        id: e.id,
        name: e.name.clone(),
        parent: (e.parent != 0).then_some(e.parent),
        parent_id: (e.parent != 0).then_some(e.parent_id),
        counters: NodeCounters {
            num_elements: e.num_elements,
            bytes_produced: e.bytes_produced,
            bytes_consumed: e.bytes_consumed,
            processing_time_ns: e.processing_time,
            buffered_elements: e.buffered_elements,
            buffered_bytes: e.buffered_bytes,
        },
    }
}

/// Moves retired-node events into the event list; an event whose node could
/// not be read in BPF has no trustworthy counters and is counted instead.
/// The usage side learns the dead nodes' paths (for their spans).
fn push_retired(
    sink: &mut EventSink,
    retired: &RefCell<Vec<RetiredEvent>>,
    mut usage: Option<&mut Usage<'_, '_>>,
) -> Result<u64> {
    let mut unreadable = 0;
    for e in retired.borrow_mut().drain(..) {
        if e.flags & bpf::types::FLAG_READ_FAILED != 0 {
            unreadable += 1;
        } else {
            if let Some(u) = usage.as_deref_mut() {
                u.learn_retired(e.node, e.parent, &e.name);
            }
            sink.push(Event::Retired(retired_to_event(&e)))?;
        }
    }
    Ok(unreadable)
}

/// Our threads wake several times a second on a machine the target may
/// keep busy, and on 2 saturated cores a wakeup that preempts a pipeline
/// thread was measured to cost the pipeline 150-200 us, far more than the
/// work it does (BENCHMARKS.md). A waking SCHED_BATCH thread does not
/// preempt the one running (the fair class's wakeup preemption skips it):
/// it runs when that thread's slice ends, with the same share of the CPU
/// as before, so it is not starved while it holds the kernel's uprobe
/// locks. Threads started after this inherit it; `run` does not use it,
/// as its child, the training job, would inherit it too.
fn batch_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a
    // valid, initialised sched_param, which it only reads.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        debug!(
            "keeping the default scheduling policy: {}",
            std::io::Error::last_os_error()
        );
    }
}

pub fn record(opts: &RecordOpts) -> Result<Recording> {
    let started = Instant::now();
    check_privileges()?;
    batch_scheduling();
    let target = Target::open(opts.pid)?;
    stop::install_signal_handlers(stop::on_signal)?;
    info!(pid = opts.pid, tf = %target.tensorflow_version, "target found");
    // The sampler gets ready (loads its program, maps the libraries for
    // unwinding, reads the kernel's symbols) while the layout is derived
    // and the BPF programs load.
    let sampler = match opts.sample_hz {
        0 => None,
        hz => Some(Sampler::spawn(opts.pid, hz)),
    };
    let (derived, cache_hit) = derive::derive(&target)?;
    let use_model = match (opts.mode, &derived.node) {
        (ModeChoice::Uprobes, _) => false,
        (_, Some(_)) => true,
        (ModeChoice::Model, None) => bail!(
            "cannot read TensorFlow's autotune model in this build: {}; retry with --mode uprobes",
            derived.model_error.as_deref().unwrap_or("unknown reason")
        ),
        (ModeChoice::Auto, None) => {
            warn!(
                "autotune model layout not derivable ({}); falling back to GetNext uprobes",
                derived.model_error.as_deref().unwrap_or("unknown")
            );
            false
        }
    };
    let layout = derived.node.unwrap_or_default();
    let mut obj = MaybeUninit::uninit();
    let bpf = Bpf::load(
        &mut obj,
        opts.pid,
        &layout,
        opts.io_ringbuf_bytes,
        opts.sample_hz > 0,
    )?;
    let mut rec = Recording {
        sink: EventSink::new(opts.save_events.as_deref())?,
        reason: String::new(),
        mode: if use_model { "model" } else { "uprobes" },
        partial: false,
        time_to_first_data: 0.0,
        cache_hit,
        stacks: None,
        stack_context: StackContext::default(),
    };
    // Sampling is an extra: a recording without it still has everything
    // else, so a failure to start is reported, not fatal.
    let (sampler, sampler_failed) = match sampler.map(|s| s.and_then(Sampler::ready)) {
        None => (None, false),
        Some(Ok(s)) => (Some(s), false),
        Some(Err(e)) => {
            warn!("stack sampling disabled: {e}");
            (None, true)
        }
    };
    let ctx = Ctx {
        opts,
        target: &target,
        derived: &derived,
        bpf: &bpf,
        mem: Memory::new(opts.pid),
        started,
        wait_stacks: sampler.as_ref().map(Sampler::wait_sender),
    };
    let outcome = if use_model {
        match ctx.run_model(&layout, &mut rec) {
            Err(e) if opts.mode == ModeChoice::Auto && e.is::<NoModel>() => {
                warn!("{NO_MODEL}: falling back to GetNext uprobes");
                rec.sink = EventSink::new(opts.save_events.as_deref())?;
                rec.mode = "uprobes";
                ctx.run_uprobes(&mut rec)
            }
            other => other,
        }
    } else {
        ctx.run_uprobes(&mut rec)
    };
    // The BPF links and programs are released when `bpf` drops, on success
    // and on error alike. On error nothing is written: a recording that
    // failed is not presented as a result.
    outcome?;
    if sampler_failed {
        rec.sink.push(Event::Drops {
            drops: vec![DropCount::new("stack_sampling_unavailable", 1)],
        })?;
    }
    if let Some(s) = sampler {
        let sampled = s.finish();
        rec.sink.push(Event::Drops {
            drops: sampled.drops.clone(),
        })?;
        let agg = sampler::attribute(&sampled, &rec.stack_context);
        info!(
            samples = sampled.samples,
            complete = sampled.complete,
            out_of_stack = sampled.out_of_stack,
            unwind_failed = sampled.unwind_failed,
            in_kernel = sampled.in_kernel,
            wait_samples = sampled.wait_samples,
            wait_complete = sampled.wait_complete,
            symbol_lookups = sampled.symbol_lookups,
            worker_cpu_ms = sampled.worker_cpu_ns / 1_000_000,
            unwind_ms = sampled.unwind_ns / 1_000_000,
            symbolize_ms = sampled.symbolize_ns / 1_000_000,
            stacks = agg.len(),
            "stack samples"
        );
        rec.stacks = Some(StackRecording {
            agg,
            spans: std::mem::take(&mut rec.stack_context.spans),
            samples: sampled.samples,
            complete_pct: sampled.complete_pct(),
            pid: opts.pid,
            hz: opts.sample_hz,
            start_wall_ns: sampled.start_wall_ns,
            end_wall_ns: sampled.end_wall_ns,
        });
    }
    Ok(rec)
}

struct Ctx<'a, 'obj> {
    opts: &'a RecordOpts,
    target: &'a Target,
    derived: &'a Derived,
    bpf: &'a Bpf<'obj>,
    mem: Memory,
    started: Instant,
    /// The stack sampler's intake of sampled waits' stacks, when it runs.
    wait_stacks: Option<std::sync::mpsc::Sender<Vec<crate::bpf::sample::RawSample>>>,
}

enum Stop {
    Duration,
    Signal,
    TargetExited,
}

impl<'a, 'obj> Ctx<'a, 'obj> {
    fn should_stop(&self, window_start: Option<Instant>) -> Option<Stop> {
        if STOP.load(Ordering::SeqCst) {
            return Some(Stop::Signal);
        }
        if !target::alive(self.target.pid) {
            return Some(Stop::TargetExited);
        }
        match (self.opts.duration, window_start) {
            (Some(d), Some(s)) if s.elapsed() >= d => Some(Stop::Duration),
            _ => None,
        }
    }

    /// Attaches the GetNext probe until the pipeline runs, then detaches it.
    /// Returns the iterator pointers seen, with their GetNext call counts.
    fn discover(&self) -> Result<Vec<(u64, u64)>> {
        self.bpf.clear_seen_iterators();
        let link = self
            .bpf
            .attach_discovery(&self.derived.getnext.lib, self.derived.getnext.file_offset)?;
        let t0 = Instant::now();
        let mut first_hit: Option<Instant> = None;
        loop {
            std::thread::sleep(Duration::from_millis(20));
            if let Some(stop) = self.should_stop(None) {
                self.bpf.detach([link]);
                match stop {
                    Stop::TargetExited => bail!(
                        "target process {} exited before its pipeline produced an element",
                        self.target.pid
                    ),
                    _ => bail!("interrupted before the pipeline produced an element"),
                }
            }
            let seen = self.bpf.seen_iterators()?;
            if !seen.is_empty() && first_hit.is_none() {
                first_hit = Some(Instant::now());
            }
            // A short while after the first hit every busy iterator has
            // been called; the probe costs about a microsecond per call.
            if first_hit.is_some_and(|t| t.elapsed() >= Duration::from_millis(150)) {
                self.bpf.detach([link]);
                return Ok(seen);
            }
            if t0.elapsed() > self.opts.discovery_timeout {
                self.bpf.detach([link]);
                bail!(
                    "no tf.data iterator of process {} produced an element within {:.0} s: is the training loop running? (plumber-probe sees a pipeline once it is iterated)",
                    self.target.pid,
                    self.opts.discovery_timeout.as_secs_f64()
                );
            }
        }
    }

    fn run_model(&self, layout: &NodeLayout, rec: &mut Recording) -> Result<()> {
        let reader = ModelReader::new(self.mem, *layout);
        let iter_layout = self.derived.iter.clone().unwrap_or_default();
        let remove_link = match &self.derived.remove_node {
            Some(p) => Some(self.bpf.attach_remove_node(&p.lib, p.file_offset)?),
            None => {
                warn!(
                    "Model::RemoveNode not found: counts of nodes that die between polls are lost"
                );
                None
            }
        };
        let retired = Rc::new(RefCell::new(Vec::new()));
        let bad = Rc::new(RefCell::new(0u64));
        let rb = self.bpf.retired_reader(retired.clone(), bad.clone())?;
        let mut usage = self.start_usage();
        rec.sink
            .push(Event::Target(target_info(self.target, "model")))?;

        // The recorded pipeline's root node (address, id): the id tells a
        // freed-and-reused address from the node we found.
        let mut root: Option<(u64, i64)> = None;
        // Model node -> its iterator, for the parallelism knob.
        let mut iter_of: HashMap<u64, u64> = HashMap::new();
        // Op paths with a parallelism knob, and those whose value was read.
        let mut par_ops: HashSet<String> = HashSet::new();
        let mut par_known: HashSet<String> = HashSet::new();
        let mut par_tries = 0u32;
        let mut last_par_try: Option<Instant> = None;
        let mut invalid_nodes = 0u64;
        let mut unreadable = 0u64;
        let mut window_start = None;
        let mut progress = Progress::new(self.opts.quiet);
        let stop = loop {
            if root.is_none() {
                let iters = match self.discover() {
                    Ok(i) => i,
                    Err(e) if window_start.is_some() => {
                        warn!(
                            "pipeline gone and not found again: {}",
                            crate::errors::one_line(&e)
                        );
                        break if STOP.load(Ordering::SeqCst) {
                            Stop::Signal
                        } else {
                            Stop::TargetExited
                        };
                    }
                    Err(e) => return Err(e),
                };
                let (busiest, pipelines, invalid) = crate::model::busiest_root(
                    &self.mem,
                    &reader,
                    &iter_layout,
                    iters,
                    &mut iter_of,
                );
                invalid_nodes += invalid;
                let Some(busiest) = busiest else {
                    return Err(NoModel.into());
                };
                if pipelines > 1 {
                    info!(
                        pipelines,
                        "several pipelines run in the target; recording the busiest"
                    );
                }
                root = reader.node(busiest).ok().map(|n| (busiest, n.id));
                debug!(?root, iterators = iter_of.len(), "discovered pipelines");
            }
            // On Ctrl-C or at the deadline take one last poll, so the
            // window ends where the user asked; a dead target cannot be read.
            let stopping = self.should_stop(window_start);
            if let Some(Stop::TargetExited) = stopping {
                break Stop::TargetExited;
            }
            let mut nodes = Vec::new();
            if let Some((addr, id)) = root {
                match reader.walk(addr) {
                    Ok((mut obs, skipped))
                        if obs
                            .first()
                            .is_some_and(|n| n.parent.is_none() && n.id == id) =>
                    {
                        invalid_nodes += skipped;
                        crate::model::fill_parallelism(&self.mem, &mut obs, &iter_of, &iter_layout);
                        nodes = obs;
                    }
                    _ => {
                        debug!(root = addr, "pipeline root gone");
                        root = None;
                    }
                }
            }
            if nodes.is_empty() {
                if let Some(stop) = stopping {
                    break stop;
                }
                // Every pipeline ended (e.g. a new iterator per epoch):
                // rediscover on the next round.
                iter_of.clear();
                continue;
            }
            for n in nodes
                .iter()
                .filter(|n| iter_layout.parallelism.contains_key(&n.name))
            {
                par_ops.insert(n.path.clone());
                if n.parallelism.is_some() {
                    par_known.insert(n.path.clone());
                }
            }
            let par_missing = par_ops.len() > par_known.len();
            iter_of.retain(|node, _| nodes.iter().any(|n| n.addr == *node));
            bpf::drain(&rb);
            unreadable += push_retired(&mut rec.sink, &retired, usage.as_mut())?;
            self.push_poll(rec, &mut progress, &mut window_start, nodes, usage.as_mut())?;
            if let Some(stop) = stopping {
                break stop;
            }
            // A parallel op re-created every epoch (under a repeat) has an
            // iterator the first discovery never saw. Look again, briefly,
            // at most once a second and a bounded number of times, until
            // each such op's parallelism was read once; then poll at once,
            // while the iterators just seen are alive.
            if par_missing
                && par_tries < PARALLELISM_TRIES
                && last_par_try.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
            {
                par_tries += 1;
                last_par_try = Some(Instant::now());
                // The GetNext probe is back for a while: bench/windows.py
                // lines throughput up on these too.
                debug!(try_ = par_tries, "looking for parallel ops' iterators");
                match self.discover() {
                    Ok(iters) => {
                        for (it, _) in iters {
                            let Ok(node) = self.mem.u64(it + iter_layout.node as u64) else {
                                continue;
                            };
                            if reader.node(node).is_ok() {
                                iter_of.insert(node, it);
                            }
                        }
                    }
                    Err(e) => debug!(
                        "looking for parallel ops' iterators: {}",
                        crate::errors::one_line(&e)
                    ),
                }
                continue;
            }
            self.sleep_interval(MODEL_INTERVAL, window_start, usage.as_mut());
        };
        progress.done();
        bpf::drain(&rb);
        unreadable += push_retired(&mut rec.sink, &retired, usage.as_mut())?;
        self.bpf.detach(remove_link);
        let mut drops = self.bpf_drops()?;
        if let Some(u) = usage.as_mut() {
            rec.stack_context = u.stack_context();
        }
        drops.extend(finish_usage(usage, &mut rec.sink)?);
        drops.push(DropCount::new("invalid_model_nodes_skipped", invalid_nodes));
        drops.push(DropCount::new(
            "parallelism_unknown_ops",
            (par_ops.len() - par_known.len()) as u64,
        ));
        drops.push(DropCount::new("retired_node_unreadable", unreadable));
        drops.push(DropCount::new("malformed_ringbuf_records", *bad.borrow()));
        rec.sink.push(Event::Drops { drops })?;
        self.finish(stop, rec)
    }

    /// Records one poll; the first one starts the window.
    /// The poll's instant is taken here, after the nodes were read: a node
    /// that died while we read (and so was not read) then has its
    /// RemoveNode event inside the window, and its final counts are kept.
    fn push_poll(
        &self,
        rec: &mut Recording,
        progress: &mut Progress,
        window_start: &mut Option<Instant>,
        nodes: Vec<NodeObservation>,
        usage: Option<&mut Usage<'_, '_>>,
    ) -> Result<()> {
        let (mono_ns, wall_ns) = now_ns();
        let root_elems = nodes.first().map(|n| n.counters.num_elements);
        let process_cpu_ns = target::process_cpu_ns(self.target.pid).unwrap_or(0);
        let mut usage = usage;
        if let Some(u) = usage.as_deref_mut() {
            u.learn_nodes(&nodes);
        }
        rec.sink.push(Event::Poll(Poll {
            mono_ns,
            wall_ns,
            process_cpu_ns,
            nodes,
        }))?;
        let start = *window_start.get_or_insert_with(|| {
            rec.time_to_first_data = self.started.elapsed().as_secs_f64();
            Instant::now()
        });
        if let Some(u) = usage {
            u.on_poll(&mut rec.sink, mono_ns)?;
        }
        progress.tick(
            start.elapsed().as_secs_f64(),
            self.opts.duration.map(|d| d.as_secs_f64()),
            root_elems,
        );
        Ok(())
    }

    /// Sleeps until the next poll: `default` unless --interval-ms was given.
    fn sleep_interval(
        &self,
        default: Duration,
        window_start: Option<Instant>,
        mut usage: Option<&mut Usage<'_, '_>>,
    ) {
        let interval = self.opts.interval.unwrap_or(default);
        sleep_interval(interval, self.opts.duration, window_start, || {
            usage.as_deref_mut().and_then(|u| u.tick())
        });
    }

    /// CPU, waits and I/O. Without them the recording still has the
    /// pipeline's counts, so a failure here is reported, not fatal.
    fn start_usage(&self) -> Option<Usage<'a, 'obj>> {
        let mut derived = self.derived.clone();
        if self.derived.node.is_none() {
            // record_stop's argument is a model node, which the uprobe
            // fallback cannot place in the pipeline.
            derived.record_stop = None;
        }
        match Usage::start(
            self.bpf,
            self.target,
            &derived,
            self.opts.attribution,
            self.opts.duration,
        ) {
            Ok(mut u) => {
                if let Some(tx) = &self.wait_stacks {
                    u.send_wait_stacks(tx.clone());
                    u.trace_spans();
                }
                Some(u)
            }
            Err(e) => {
                warn!(
                    "per-thread CPU, waits and I/O are not measured: {}",
                    crate::errors::one_line(&e)
                );
                None
            }
        }
    }

    fn bpf_drops(&self) -> Result<Vec<DropCount>> {
        Ok(self
            .bpf
            .drops()?
            .into_iter()
            .zip(DROP_NAMES)
            .map(|(count, what)| DropCount::new(what, count))
            .collect())
    }

    fn finish(&self, stop: Stop, rec: &mut Recording) -> Result<()> {
        let (partial, reason) = match stop {
            Stop::Duration => (false, "duration reached"),
            Stop::Signal => (self.opts.duration.is_some(), "interrupted"),
            Stop::TargetExited => (true, "target exited"),
        };
        rec.partial = partial;
        rec.reason = reason.to_string();
        rec.sink.push(Event::End {
            partial,
            reason: reason.into(),
        })
    }

    /// Fallback: per-call GetNext probes, per-iterator counts; structure from
    /// the iterators' prefixes.
    fn run_uprobes(&self, rec: &mut Recording) -> Result<()> {
        let prefix_off = self.derived.iter.as_ref().map(|i| i.prefix);
        let Some(prefix_off) = prefix_off else {
            bail!("cannot derive the iterator prefix offset of this TensorFlow build; no mode can name the ops");
        };
        let _links = self
            .bpf
            .attach_getnext_counting(&self.derived.getnext.lib, self.derived.getnext.file_offset)?;
        let mut usage = self.start_usage();
        rec.sink
            .push(Event::Target(target_info(self.target, "uprobes")))?;
        // Only prefixes read are kept: a failed read (an iterator caught
        // while built or torn down, its address soon reused) is tried again
        // at the next poll, not remembered for the rest of the recording.
        let mut prefixes: HashMap<u64, String> = HashMap::new();
        let mut window_start = None;
        let mut progress = Progress::new(self.opts.quiet);
        let t0 = Instant::now();
        let stop = loop {
            let stopping = self.should_stop(window_start);
            if let Some(Stop::TargetExited) = stopping {
                break Stop::TargetExited;
            }
            let stats = self.bpf.iter_stats()?;
            let mut by_path: BTreeMap<String, Vec<(u64, crate::bpf::IterStats)>> = BTreeMap::new();
            for (it, s) in stats {
                let p = match prefixes.get(&it) {
                    Some(p) => Some(p.clone()),
                    None => self
                        .mem
                        .std_string(it + prefix_off as u64, 4096)
                        .ok()
                        .filter(|p| p.starts_with("Iterator::"))
                        .map(|p| stable_path(&p))
                        .inspect(|p| {
                            prefixes.insert(it, p.clone());
                        }),
                };
                if let Some(p) = p {
                    by_path.entry(p).or_default().push((it, s));
                }
            }
            if by_path.is_empty() {
                if let Some(stop) = stopping {
                    break stop;
                }
                if window_start.is_none() && t0.elapsed() > self.opts.discovery_timeout {
                    bail!(
                        "no tf.data iterator of process {} produced an element within {:.0} s",
                        self.target.pid,
                        self.opts.discovery_timeout.as_secs_f64()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let first_addr: HashMap<&str, u64> =
                by_path.iter().map(|(p, v)| (p.as_str(), v[0].0)).collect();
            let mut nodes = Vec::new();
            for (path, its) in &by_path {
                let name = opnames::model_name_of_path(path).to_string();
                let parent = path
                    .rsplit_once("::")
                    .and_then(|(pp, _)| first_addr.get(pp).copied());
                for (it, s) in its {
                    nodes.push(NodeObservation {
                        addr: *it,
                        id: 0,
                        name: name.clone(),
                        path: path.clone(),
                        parent,
                        in_function: false,
                        counters: NodeCounters {
                            num_elements: s.elements as i64,
                            processing_time_ns: s.self_ns as i64,
                            ..Default::default()
                        },
                        parallelism: None,
                    });
                }
            }
            // Root first, as the model walk does.
            nodes.sort_by_key(|n| n.path.matches("::").count());
            self.push_poll(rec, &mut progress, &mut window_start, nodes, usage.as_mut())?;
            if let Some(stop) = stopping {
                break stop;
            }
            self.sleep_interval(UPROBES_INTERVAL, window_start, usage.as_mut());
        };
        progress.done();
        let mut drops = self.bpf_drops()?;
        if let Some(u) = usage.as_mut() {
            rec.stack_context = u.stack_context();
        }
        drops.extend(finish_usage(usage, &mut rec.sink)?);
        rec.sink.push(Event::Drops { drops })?;
        self.finish(stop, rec)
    }
}

fn finish_usage(usage: Option<Usage<'_, '_>>, sink: &mut EventSink) -> Result<Vec<DropCount>> {
    match usage {
        Some(u) => u.finish(sink),
        None => Ok(vec![DropCount::new("usage_unavailable", 1)]),
    }
}

/// Where outputs go.
pub fn default_output(pid: i32) -> PathBuf {
    PathBuf::from(format!("plumber-{pid}"))
}
