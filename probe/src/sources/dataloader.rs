//! A PyTorch training process (`--pid`, or `run`'s own command): its
//! DataLoader as a pipeline. Nothing is attached to the target's code: the
//! loader's iterator object is found in the training loop's frames and
//! read at every sampler tick (`crate::torch::loader`), the stage sampler
//! reads every thread's Python stack in the training process and its
//! workers (`crate::torch::sampler`), and each poll turns what they saw
//! into the pipeline's nodes (the stages, docs/stats-format.md "PyTorch")
//! and a `DataLoader` event. The job's file reads, when their BPF side
//! loaded (`crate::usage::proc_io`: file syscall tracepoints), go into
//! that event per process and into an `Io` event per file, the workers'
//! (and, without workers, the training loop's) as the GetItem stage's.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use plumber_collector::dataloader::{DataLoaderObservation, ProcessIo, Role, WorkerObservation};
use plumber_collector::event::{
    DropCount, Event, FileIo, NodeCounters, NodeObservation, TargetInfo,
};
use plumber_collector::loader_ops::{
    COLLATE_OP, GET_ITEM_OP, PIN_MEMORY_OP, SAMPLER_OP, WORKER_QUEUE_OP,
};
use plumber_collector::stacks::{LabelValue, LabeledStack};
use tracing::debug;

use crate::clock::now_ns;
use crate::cost::Thin;
use crate::python::PyProcess;
use crate::recording::{Prepared, Round, Source, StageRecording, Stop};
use crate::sink::EventSink;
use crate::stop::STOP;
use crate::target::{self, Target};
use crate::torch::frames::frame_label;
use crate::torch::sampler::{Observed, Recorded, StageNs, StageSampler, StageStack};
use crate::torch::stage::Stage;
use crate::torch::{loader, Torch};
use crate::usage::proc_io::ProcIo;

/// Polls: each one only copies what the sampler counted.
const INTERVAL: Duration = Duration::from_millis(500);
/// How often the sampler reads the stacks when `--sample-hz` is 0. A tick
/// costs a few calls to the kernel per process of the job (its thread
/// states, their frames, the pages of their stacks, each read for all
/// threads at once) and two per count. With one worker (the job at ~1.1
/// cores) the probe's whole cost was 1.28% of the job's CPU at 50 a
/// second and 0.97% at 25 (release build, BENCHMARKS.md); 30 s at 25 give
/// a data stall share to within ~2 points.
pub const SAMPLE_HZ: u32 = 25;
/// Between two looks for the loader while none is found.
const LOOK_AGAIN: Duration = Duration::from_millis(200);
/// Failed looks in a row before the recording fails.
const MAX_FAILURES: u32 = 10;
/// How long the reads of a process the loader has not named wait to be
/// told a worker's: the loader's workers are read every 0.5 s.
const HOLD: Duration = Duration::from_secs(3);

/// Who started the job, which says how long to look for its loader and
/// what its exit means.
#[derive(Debug, Clone, Copy)]
pub enum Job {
    /// `--pid`: a running process, whose loop should already iterate its
    /// loader. Not found within the timeout, or the target gone or the
    /// user stopping first, fails the recording; the target's exit cuts
    /// a recording short (partial).
    Attached { discovery_timeout: Duration },
    /// `run -- CMD`: our own child, which may take long to start training
    /// (as `run` waits for a tf.data pipeline). Looked for as long as it
    /// runs; its exit, or a stop, before the loader is found ends the
    /// recording with nothing recorded, and its exit is the recording's
    /// end (partial only when a duration was asked for).
    Started,
}

/// The job's file reads, or why they are not measured.
pub enum FileReads<'obj> {
    Measured(Box<ProcIo<'obj>>),
    NotMeasured(String),
}

/// Reads of a process not named yet, kept back from their poll's `Io`
/// event until the loader names it (or `HOLD` passes).
struct Held {
    mono_ns: u64,
    pid: i32,
    since: Instant,
    files: Vec<FileIo>,
}

pub struct DataLoaderSource<'obj> {
    target: Target,
    torch: Torch,
    py: PyProcess,
    sampler: Option<StageSampler>,
    job: Job,
    started: Instant,
    hz: u32,
    thin: Thin,
    failures: u32,
    /// The stage sampler's stacks and spans, once it finished.
    recorded: Recorded,
    /// When the stage sampler started and stopped, ns since the epoch.
    sampled_wall_ns: (u64, u64),
    /// Each worker's CPU when last read, ns.
    worker_cpu: std::collections::HashMap<i32, u64>,
    /// The job's CPU as the poll read it (`cpu_ns`), for the poll's
    /// observation: one walk of the process tree in /proc a poll.
    job_cpu_ns: std::cell::Cell<Option<u64>>,
    io: FileReads<'obj>,
    held: Vec<Held>,
    /// The GetItem node's path, as the last poll's nodes had it.
    get_item_path: String,
}

impl<'obj> DataLoaderSource<'obj> {
    pub fn new(
        target: Target,
        torch: Torch,
        py: PyProcess,
        job: Job,
        hz: u32,
        thin: Thin,
        io: FileReads<'obj>,
    ) -> Self {
        DataLoaderSource {
            target,
            torch,
            py,
            sampler: None,
            job,
            started: Instant::now(),
            hz,
            thin,
            failures: 0,
            recorded: Recorded::default(),
            sampled_wall_ns: (0, 0),
            worker_cpu: Default::default(),
            job_cpu_ns: Default::default(),
            io,
            held: Vec::new(),
            get_item_path: String::new(),
        }
    }

    /// The stage stacks and spans, once the recording finished, handed
    /// over.
    pub fn stage_recording(&mut self) -> StageRecording {
        let r = std::mem::take(&mut self.recorded);
        let mut stacks: Vec<LabeledStack> = r
            .stacks
            .into_iter()
            .filter(|(_, ns)| *ns > 0)
            .map(|(k, ns)| labeled(k, ns))
            .collect();
        stacks.sort_unstable_by(|a, b| a.frames.cmp(&b.frames));
        StageRecording {
            stacks,
            spans: r.spans,
            pid: self.target.pid,
            hz: self.hz,
            start_wall_ns: self.sampled_wall_ns.0,
            end_wall_ns: self.sampled_wall_ns.1,
        }
    }

    /// `wall_ns`: the instant the file reads were cut at; the job's CPU is
    /// the poll's.
    fn observation(
        &mut self,
        o: &Observed,
        mono_ns: u64,
        wall_ns: u64,
    ) -> Option<DataLoaderObservation> {
        // A worker that ended keeps the CPU it had when last read.
        for &pid in o.workers.keys() {
            if let Some(ns) = target::process_cpu_ns(pid) {
                self.worker_cpu.insert(pid, ns);
            }
        }
        let st = o.state.as_ref()?;
        let names = |m: &StageNs| {
            m.iter()
                .map(|(s, v)| (stage_key(*s).to_string(), *v))
                .collect()
        };
        let workers: Vec<WorkerObservation> = o
            .workers
            .iter()
            .map(|(&pid, stages)| WorkerObservation {
                pid,
                stages: names(stages),
                cpu_ns: self.worker_cpu.get(&pid).copied().unwrap_or(0),
                gil: o.workers_gil.get(&pid).map(names).unwrap_or_default(),
                lock: o.workers_lock.get(&pid).map(names).unwrap_or_default(),
                stage_cpu: o.workers_cpu.get(&pid).map(names).unwrap_or_default(),
            })
            .collect();
        Some(DataLoaderObservation {
            mono_ns,
            wall_ns,
            torch_version: self.torch.version.clone(),
            dataset_type: st.dataset_type.clone(),
            num_workers: st.num_workers,
            prefetch_factor: st.prefetch_factor,
            pin_memory: st.pin_memory,
            persistent_workers: st.persistent_workers,
            batch_size: st.batch_size,
            drop_last: st.drop_last,
            batches: o.batches.total(),
            epochs: o.batches.epochs,
            loaders_replaced: st.replaced,
            tasks_outstanding: st.tasks_outstanding,
            covered_ns: o.covered_ns,
            ticks: o.ticks,
            training: names(&o.training),
            training_unknown_ns: o.training_unknown_ns,
            pin_memory_stages: names(&o.pin_memory),
            workers,
            job_cpu_ns: self.job_cpu_ns.get().unwrap_or(0),
            sharing_strategy: o.sharing_strategy.map(str::to_string),
            io: None,
            training_gil: names(&o.training_gil),
            training_lock: names(&o.training_lock),
            training_cpu: names(&o.training_cpu),
            pin_memory_cpu: names(&o.pin_memory_cpu),
            gil_told: o.gil_told,
            gil_untold: o.gil_untold,
        })
    }

    /// What process `pid` is to the loader now.
    fn role(&self, o: &Observed, pid: i32) -> Role {
        let named = |p: &i32| *p == pid;
        if pid == self.target.pid {
            Role::Training
        } else if o.workers.keys().any(named)
            || o.state
                .iter()
                .flat_map(|s| &s.workers)
                .any(|(_, p)| named(p))
        {
            Role::Worker
        } else {
            Role::Other
        }
    }

    /// The op the reads of a process count for: GetItem for a worker's
    /// (`__getitem__` reads), and for the training loop's when it loads
    /// its own batches; none for the training loop beside workers, or
    /// another process.
    fn op_of(&self, o: &Observed, role: Role) -> String {
        let loads = o.state.as_ref().is_some_and(|s| s.num_workers == 0);
        match role {
            Role::Worker => self.get_item_path.clone(),
            Role::Training if loads => self.get_item_path.clone(),
            _ => String::new(),
        }
    }

    /// Cuts the job's file reads at `cut_mono`: each process's counts,
    /// for the observation, and the files read since the last cut, as
    /// the `Io` event of the poll at `poll_mono` (the reads of processes
    /// not named yet are held back).
    fn poll_io(
        &mut self,
        sink: &mut EventSink,
        o: &Observed,
        poll_mono: u64,
        cut_mono: u64,
    ) -> Result<Option<Vec<ProcessIo>>> {
        let FileReads::Measured(io) = &mut self.io else {
            return Ok(None);
        };
        if let Some(st) = &o.state {
            let pids: Vec<i32> = st.workers.iter().map(|&(_, p)| p).collect();
            io.follow(&pids);
        }
        let cut = io.cut(cut_mono)?;
        let mut now = Vec::new();
        for f in cut.files {
            let pid = f.pid.unwrap_or(0);
            match self.role(o, pid) {
                Role::Other => match self
                    .held
                    .iter_mut()
                    .find(|h| h.mono_ns == poll_mono && h.pid == pid)
                {
                    Some(h) => h.files.push(f),
                    None => self.held.push(Held {
                        mono_ns: poll_mono,
                        pid,
                        since: Instant::now(),
                        files: vec![f],
                    }),
                },
                role => now.push(FileIo {
                    op_path: self.op_of(o, role),
                    ..f
                }),
            }
        }
        sink.push(Event::Io {
            mono_ns: poll_mono,
            files: now,
        })?;
        self.release_held(sink, o, false)?;
        let processes = cut
            .processes
            .iter()
            .map(|p| ProcessIo {
                pid: p.pid,
                role: self.role(o, p.pid),
                bytes: p.counters.bytes,
                reads: p.counters.reads,
                read_ns: p.counters.read_ns,
            })
            .collect();
        Ok(Some(processes))
    }

    /// Sends the held reads of processes named since, and of those that
    /// waited `HOLD` (`all`: every one) as another process's, each in an
    /// `Io` event at its own poll's instant.
    fn release_held(&mut self, sink: &mut EventSink, o: &Observed, all: bool) -> Result<()> {
        let mut keep = Vec::new();
        for h in std::mem::take(&mut self.held) {
            let role = self.role(o, h.pid);
            if role == Role::Other && !all && h.since.elapsed() < HOLD {
                keep.push(h);
                continue;
            }
            let op_path = self.op_of(o, role);
            let files = h
                .files
                .into_iter()
                .map(|f| FileIo {
                    op_path: op_path.clone(),
                    ..f
                })
                .collect();
            sink.push(Event::Io {
                mono_ns: h.mono_ns,
                files,
            })?;
        }
        self.held = keep;
        Ok(())
    }

    fn drain_io(&mut self) {
        if let FileReads::Measured(io) = &mut self.io {
            io.drain();
        }
    }
}

/// A stage stack for the outputs: rooted at `[stage]` and its process,
/// as stages.folded has it, with the stage, the process and its pid as
/// labels too (profile.pb.gz).
fn labeled(k: StageStack, ns: u64) -> LabeledStack {
    let mut frames = Vec::with_capacity(k.frames.len() + 2);
    frames.push(format!("[{}]", k.stage.title()));
    frames.push(k.process.to_string());
    frames.extend(k.frames.iter().map(frame_label));
    LabeledStack {
        frames,
        labels: vec![
            ("stage", LabelValue::Str(stage_key(k.stage).into())),
            ("process", LabelValue::Str(k.process.to_string())),
            ("pid", LabelValue::Num(i64::from(k.pid))),
        ],
        value: ns,
    }
}

/// The stage's key in the outputs.
pub fn stage_key(s: Stage) -> &'static str {
    match s {
        Stage::Wait => "wait",
        Stage::Receive => "receive",
        Stage::Startup => "startup",
        Stage::GetItem => "get_item",
        Stage::Collate => "collate",
        Stage::Send => "send",
        Stage::Idle => "idle",
        Stage::PinMemory => "pin_memory",
        Stage::OtherLoader => "other_loader",
        Stage::Other => "other",
    }
}

fn ns(m: &StageNs, s: Stage) -> u64 {
    m.get(&s).copied().unwrap_or(0)
}

/// The loader as a chain of stages, consumer first: what reaches the
/// training loop (through pin memory when on, the worker queue when there
/// are workers), the collate, the dataset's items, the sampler.
fn nodes_of(o: &Observed) -> Vec<NodeObservation> {
    let Some(st) = &o.state else {
        return Vec::new();
    };
    let batches = o.batches.total() as i64;
    let samples = batches * st.batch_size.unwrap_or(1) as i64;
    let workers = st.num_workers.max(1) as f64;
    // Where the items and the collate run: the workers, or the training
    // loop itself without them.
    let (get_item, collate) = if st.num_workers > 0 {
        o.workers.values().fold((0, 0), |(g, c), w| {
            (g + ns(w, Stage::GetItem), c + ns(w, Stage::Collate))
        })
    } else {
        // The loop pins each batch itself after collating it (pin_memory
        // without workers): one after the other in its thread, so the
        // pinning is charged with the collate.
        (
            ns(&o.training, Stage::GetItem),
            ns(&o.training, Stage::Collate) + ns(&o.training, Stage::PinMemory),
        )
    };
    let link = |name, elements: i64, time: u64, buffered: i64| Link {
        name,
        counters: NodeCounters {
            num_elements: elements,
            processing_time_ns: time as i64,
            buffered_elements: buffered,
            ..Default::default()
        },
        parallelism: None,
        ratio: None,
        buffer_size: None,
    };
    let mut chain = Vec::new();
    if st.pin_memory && st.num_workers > 0 {
        chain.push(link(
            PIN_MEMORY_OP,
            batches,
            ns(&o.pin_memory, Stage::PinMemory),
            0,
        ));
    }
    if st.num_workers > 0 {
        let outstanding = st.tasks_outstanding.unwrap_or(0) as i64;
        // No time of its own: the training loop's receiving is mostly
        // waiting (for the workers' resource-sharer threads), not CPU the
        // core budget should charge; stats.pb's `dataloader` carries it.
        chain.push(Link {
            buffer_size: st
                .prefetch_factor
                .map(|p| f64::from(p) * f64::from(st.num_workers)),
            ..link(WORKER_QUEUE_OP, batches, 0, outstanding)
        });
    }
    chain.push(Link {
        parallelism: Some(workers),
        ratio: st.batch_size.map(|b| b as f64),
        ..link(COLLATE_OP, batches, collate, 0)
    });
    chain.push(Link {
        parallelism: Some(workers),
        ..link(GET_ITEM_OP, samples, get_item, 0)
    });
    chain.push(link(SAMPLER_OP, samples, 0, 0));
    let mut path = String::from("Root");
    let mut parent = None;
    chain
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            path = format!("{path}::{}", l.name);
            // Stable identities: one node per stage for the whole
            // recording (the counts are the loader's across epochs).
            let addr = 0x1000 + i as u64;
            let n = NodeObservation {
                addr,
                id: i as i64 + 1,
                name: l.name.to_string(),
                path: path.clone(),
                parent,
                in_function: false,
                counters: l.counters,
                parallelism: l.parallelism,
                ratio: l.ratio,
                buffer_size: l.buffer_size,
            };
            parent = Some(addr);
            n
        })
        .collect()
}

/// One stage as a node of the chain.
struct Link {
    name: &'static str,
    counters: NodeCounters,
    parallelism: Option<f64>,
    ratio: Option<f64>,
    buffer_size: Option<f64>,
}

impl Source for DataLoaderSource<'_> {
    fn target(&self) -> &Target {
        &self.target
    }

    fn target_info(&self) -> TargetInfo {
        let mut t = self.target.info(self.mode());
        if let FileReads::NotMeasured(why) = &self.io {
            t.not_measured.push(format!("file reads ({why})"));
        }
        t
    }

    fn mode(&self) -> &'static str {
        "dataloader"
    }

    /// The training process, every process below it (a forkserver and
    /// the workers it forks), and the workers the loader names: those
    /// alive, and those gone (reaped, they are in their reaper's children
    /// times). The processes below it are those the BPF side follows,
    /// where it loaded, else found in /proc.
    fn cpu_ns(&self) -> Option<u64> {
        let named: Vec<i32> = self
            .sampler
            .as_ref()
            .and_then(|s| s.observed().state)
            .map(|st| st.workers.iter().map(|&(_, p)| p).collect())
            .unwrap_or_default();
        let followed = match &self.io {
            FileReads::Measured(io) => io.followed(),
            FileReads::NotMeasured(_) => None,
        };
        let ns = match followed {
            Some(mut pids) => {
                pids.extend(named);
                target::job_cpu_ns(self.target.pid, &pids)
            }
            None => target::job_tree_cpu_ns(self.target.pid, &named),
        };
        self.job_cpu_ns.set(ns);
        ns
    }

    fn prepare(&mut self, _round: &Round) -> Result<Prepared> {
        if self
            .sampler
            .as_ref()
            .is_some_and(|s| s.observed().state.is_some())
        {
            return Ok(Prepared::Ready);
        }
        if self.sampler.is_none() {
            // The interpreter is read while it runs: a thread may leave the
            // frame being read. A few failures in a row are that; more are
            // a real error.
            match loader::find(&self.py) {
                Ok(Some(reader)) => {
                    let futex = match &self.io {
                        FileReads::Measured(io) => io.futex_waits(),
                        FileReads::NotMeasured(_) => None,
                    };
                    self.sampler = Some(StageSampler::start(
                        &self.py,
                        Box::new(reader),
                        self.hz,
                        self.thin.clone(),
                        futex,
                    )?);
                    self.sampled_wall_ns.0 = now_ns().1;
                }
                Ok(None) => self.failures = 0,
                Err(e) if self.failures < MAX_FAILURES => {
                    debug!("looking for the DataLoader: {e:#}");
                    self.failures += 1;
                }
                Err(e) => return Err(e),
            }
        }
        let pid = self.target.pid;
        let gone = !target::alive(pid);
        let stopped = STOP.load(std::sync::atomic::Ordering::SeqCst);
        match self.job {
            Job::Started if stopped => return Ok(Prepared::End(Stop::Signal)),
            Job::Started if gone => return Ok(Prepared::End(Stop::TargetExited)),
            Job::Started => {}
            Job::Attached { .. } if stopped => bail!("interrupted before the DataLoader was found"),
            Job::Attached { discovery_timeout } if self.started.elapsed() > discovery_timeout => bail!(
                "no DataLoader iterator found in process {pid} within {:.0} s: is its training loop iterating a torch.utils.data.DataLoader? (plumber-probe finds the loader in the loop's frames once it runs)",
                discovery_timeout.as_secs_f64()
            ),
            Job::Attached { .. } if gone => {
                bail!("target process {pid} exited before its DataLoader was found")
            }
            Job::Attached { .. } => {}
        }
        self.drain_io();
        std::thread::sleep(LOOK_AGAIN);
        Ok(Prepared::Again)
    }

    fn nodes(&mut self) -> Result<Vec<NodeObservation>> {
        Ok(self
            .sampler
            .as_ref()
            .map(|s| nodes_of(&s.observed()))
            .unwrap_or_default())
    }

    fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        if let Some(n) = nodes.iter().find(|n| n.name == GET_ITEM_OP) {
            self.get_item_path.clone_from(&n.path);
        }
    }

    fn after_poll(&mut self, sink: &mut EventSink, mono_ns: u64, _first: bool) -> Result<()> {
        let Some(o) = self.sampler.as_ref().map(StageSampler::observed) else {
            return Ok(());
        };
        // One instant for the file reads' counts, their events and the
        // observation's wall time.
        let (cut_mono, cut_wall) = crate::clock::now_ns();
        let io = self.poll_io(sink, &o, mono_ns, cut_mono)?;
        if let Some(obs) = self.observation(&o, mono_ns, cut_wall) {
            sink.push(Event::DataLoader(Box::new(DataLoaderObservation {
                io,
                ..obs
            })))?;
        }
        Ok(())
    }

    fn default_interval(&self) -> Duration {
        INTERVAL
    }

    fn awaited(&self) -> &'static str {
        "its training loop to iterate a DataLoader"
    }

    fn exit_end(&self, has_duration: bool) -> (bool, &'static str) {
        match self.job {
            Job::Attached { .. } => (true, "target exited"),
            Job::Started => (has_duration, "command exited"),
        }
    }

    fn finish(&mut self, sink: &mut EventSink) -> Result<Vec<DropCount>> {
        let (o, recorded) = self
            .sampler
            .take()
            .map(StageSampler::finish)
            .unwrap_or_default();
        self.sampled_wall_ns.1 = now_ns().1;
        let over_limit = recorded.spans_over_limit;
        self.recorded = recorded;
        self.release_held(sink, &o, true)?;
        let mut drops = vec![
            DropCount::new("python_frame_unreadable", o.bad_frames),
            DropCount::new("worker_unreadable", o.unreadable_workers.len() as u64),
            DropCount::new("stage_sampler_failed", u64::from(o.failed)),
            DropCount::new("spans_over_limit", over_limit),
        ];
        if let FileReads::Measured(io) = &self.io {
            drops.extend(io.drops());
        }
        Ok(drops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::sampler::LoaderState;

    fn observed(num_workers: u32, pin_memory: bool) -> Observed {
        let mut o = Observed::default();
        o.batches.see(crate::torch::count::Count {
            iter: 0x10,
            yielded: 10,
            sent: None,
            first_worker: None,
        });
        o.training.insert(Stage::GetItem, 700);
        o.training.insert(Stage::Collate, 100);
        o.workers
            .insert(42, [(Stage::GetItem, 5_000), (Stage::Collate, 300)].into());
        o.state = Some(LoaderState {
            num_workers,
            pin_memory,
            prefetch_factor: (num_workers > 0).then_some(2),
            batch_size: Some(8),
            tasks_outstanding: Some(3),
            ..Default::default()
        });
        o
    }

    fn names(nodes: &[NodeObservation]) -> Vec<&str> {
        nodes.iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn the_chain_follows_the_configuration() {
        let n = nodes_of(&observed(0, false));
        assert_eq!(names(&n), ["Collate", "GetItem", "Sampler"]);
        // Without workers the loop's own stages hold the time.
        assert_eq!(n[1].counters.processing_time_ns, 700);
        assert_eq!(n[1].counters.num_elements, 80);
        assert_eq!(n[0].ratio, Some(8.0));
        assert_eq!(n[2].path, "Root::Collate::GetItem::Sampler");
        assert_eq!(n[2].parent, Some(n[1].addr));
        // Pinning without workers: the loop's, after its collate.
        let mut pinned = observed(0, true);
        pinned.training.insert(Stage::PinMemory, 40);
        let n = nodes_of(&pinned);
        assert_eq!(names(&n), ["Collate", "GetItem", "Sampler"]);
        assert_eq!(n[0].counters.processing_time_ns, 140);

        let n = nodes_of(&observed(4, true));
        assert_eq!(
            names(&n),
            ["PinMemory", "WorkerQueue", "Collate", "GetItem", "Sampler"]
        );
        assert_eq!(n[1].buffer_size, Some(8.0));
        assert_eq!(n[1].counters.buffered_elements, 3);
        assert_eq!(n[3].counters.processing_time_ns, 5_000);
        assert_eq!(n[3].parallelism, Some(4.0));
        assert!(nodes_of(&Observed::default()).is_empty());
    }
}
