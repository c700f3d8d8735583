//! The stage sampler: a thread of the probe that, `hz` times a second,
//! reads the Python stack of every thread of the training process and of
//! each DataLoader worker (`frames.rs`), says which stage each is in
//! (`stage.rs`) and adds the time since its last tick to that stage. It
//! also reads the loader's batch count `COUNTS_PER_TICK` times a tick, so
//! an epoch's last count is seen at most a quarter tick before the count
//! restarts (`count.rs`).
//! Wall time, not CPU time: a worker blocked reading a file is in GetItem,
//! and the training loop blocked on the result queue is stalled.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::debug;

use super::count::{Count, EpochTotal};
use super::frames::{Frames, Stack};
use super::stage::{classify, sharing_strategy, Stage};
use crate::cost::Thin;
use crate::python::{short_file, PyProcess};

/// What the loader says of itself, read from its iterator object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoaderState {
    /// The iterator object (a new one per epoch without persistent
    /// workers).
    pub iter: u64,
    pub num_yielded: u64,
    /// `_send_idx` of a map-style iterator with workers.
    pub sent: Option<u64>,
    pub num_workers: u32,
    pub prefetch_factor: Option<u32>,
    pub pin_memory: bool,
    pub persistent_workers: bool,
    pub batch_size: Option<u64>,
    pub drop_last: bool,
    /// Batches sent to workers and not yet yielded.
    pub tasks_outstanding: Option<u64>,
    pub worker_pids: Vec<i32>,
}

/// Reads the loader's iterator in the training process.
pub trait LoaderReader: Send {
    /// The iterator object and its counts now (every tick).
    fn yielded(&mut self) -> Option<Count>;
    /// Everything (about once a second).
    fn state(&mut self) -> Option<LoaderState>;
}

/// Wall time per stage of one thread role, ns.
pub type StageNs = BTreeMap<Stage, u64>;

/// What the sampler saw so far (cumulative).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub ticks: u64,
    /// Wall time covered by the ticks, ns.
    pub covered_ns: u64,
    /// The training loop's thread (the one seen in the loader's `next()`).
    pub training: StageNs,
    /// Ticks before the training loop's thread was known.
    pub training_unknown_ns: u64,
    /// Per worker process: its main thread, and its result queue's feeder
    /// thread (Send while it pickles and writes).
    pub workers: BTreeMap<i32, StageNs>,
    pub pin_memory: StageNs,
    pub batches: EpochTotal,
    pub state: Option<LoaderState>,
    /// Workers whose interpreter could not be read (pid, why).
    pub unreadable_workers: Vec<(i32, String)>,
    pub bad_frames: u64,
    /// The tensor sharing strategy the training loop's receiving frames
    /// showed (`file_descriptor`, `file_system`), once seen.
    pub sharing_strategy: Option<&'static str>,
    /// The sampler's thread ended by a panic: what it saw stops there.
    pub failed: bool,
}

pub struct StageSampler {
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Observed>>,
    handle: Option<JoinHandle<Folded>>,
}

/// Wall ns per folded stack: `[Stage];process;function (file);...`, the
/// stage sampler's stacks for a flamegraph (stages.folded).
pub type Folded = HashMap<String, u64>;

impl StageSampler {
    /// Starts sampling the training process `py` at `hz`.
    pub fn start(
        py: &PyProcess,
        reader: Box<dyn LoaderReader>,
        hz: u32,
        thin: Thin,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Observed::default()));
        let mut run = Run {
            training: Frames::new(py),
            parent: py.clone(),
            workers: HashMap::new(),
            reader,
            loop_thread: None,
            folded: Folded::new(),
            shared: shared.clone(),
            period: Duration::from_secs_f64(1.0 / f64::from(hz.max(1))),
            thin,
        };
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("stage-sampler".into())
            .spawn(move || {
                run.run(&s);
                run.folded
            })?;
        Ok(StageSampler {
            stop,
            shared,
            handle: Some(handle),
        })
    }

    /// A copy of what was seen so far.
    pub fn observed(&self) -> Observed {
        // A panic while the lock was held poisons it; what was counted
        // before is still right.
        match self.shared.lock() {
            Ok(o) => o.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Stops the thread and returns the final observation and the folded
    /// stacks.
    pub fn finish(mut self) -> (Observed, Folded) {
        self.stop.store(true, Ordering::Relaxed);
        let joined = self.handle.take().map(JoinHandle::join);
        let mut o = self.observed();
        o.failed = matches!(joined, Some(Err(_)));
        (o, joined.and_then(Result::ok).unwrap_or_default())
    }
}

impl Drop for StageSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Run {
    training: Frames,
    /// The training process's interpreter: forked workers share its
    /// layout, so attaching to one needs no symbol lookup.
    parent: PyProcess,
    workers: HashMap<i32, Option<Frames>>,
    reader: Box<dyn LoaderReader>,
    loop_thread: Option<u64>,
    folded: Folded,
    shared: Arc<Mutex<Observed>>,
    period: Duration,
    /// The cost meter's say: a quarter of the rate once it slows us.
    thin: Thin,
}

/// Reads of the loader's counts per read of the stacks. A count costs
/// three reads, a tick of the stacks a few per thread: counts read four
/// times as often lose a quarter of what an epoch's end can lose between
/// two reads (a loop yields an epoch's last batch and starts the next
/// epoch within a millisecond).
const COUNTS_PER_TICK: u32 = 4;
/// Between two full reads of the loader's state.
const STATE_EVERY: Duration = Duration::from_millis(500);
/// Between two full reads while the iterator is lost.
const STATE_AFTER_LOSS: Duration = Duration::from_millis(100);

impl Run {
    fn run(&mut self, stop: &AtomicBool) {
        let mut last_stacks = Instant::now();
        let mut last_state: Option<Instant> = None;
        let mut lost = false;
        let mut reads = 0u32;
        while !stop.load(Ordering::Relaxed) {
            let slow = if self.thin.stages_slowed() { 4 } else { 1 };
            std::thread::sleep(self.period * slow / COUNTS_PER_TICK);
            let now = Instant::now();
            // A full read every STATE_EVERY, and soon after the iterator
            // was lost (an epoch ended: the next one's is to be found).
            let due = |every| last_state.is_none_or(|t| now.duration_since(t) >= every);
            let state = if due(STATE_EVERY) || (lost && due(STATE_AFTER_LOSS)) {
                last_state = Some(now);
                self.reader.state()
            } else {
                None
            };
            if let Some(s) = &state {
                self.follow_workers(&s.worker_pids);
            }
            let count = match &state {
                Some(s) => Some(Count {
                    iter: s.iter,
                    yielded: s.num_yielded,
                    sent: s.sent,
                }),
                None => self.reader.yielded(),
            };
            lost = count.is_none();
            self.counted(count, state);
            reads += 1;
            if reads.is_multiple_of(COUNTS_PER_TICK) {
                let dt = now.duration_since(last_stacks).as_nanos() as u64;
                last_stacks = now;
                self.tick(dt);
            }
        }
    }

    /// A read of the loader's counts (and, now and then, of its state).
    fn counted(&mut self, count: Option<Count>, state: Option<LoaderState>) {
        let Ok(mut o) = self.shared.lock() else {
            return;
        };
        if let Some(c) = count {
            tracing::trace!(c.iter, c.yielded, c.sent, "batch count read");
            o.batches.see(c);
        }
        if state.is_some() {
            o.state = state;
        }
    }

    /// Attaches to new workers and forgets the ones gone.
    fn follow_workers(&mut self, pids: &[i32]) {
        self.workers.retain(|pid, _| pids.contains(pid));
        for &pid in pids {
            if self.workers.contains_key(&pid) {
                continue;
            }
            let attached = match self.parent.forked(pid) {
                Some(py) => Ok(py),
                None => PyProcess::attach(pid),
            };
            let frames = match attached {
                Ok(py) => Some(Frames::new(&py)),
                Err(e) => {
                    debug!(pid, "worker's interpreter not readable: {e}");
                    if let Ok(mut o) = self.shared.lock() {
                        o.unreadable_workers.push((pid, e.to_string()));
                    }
                    None
                }
            };
            self.workers.insert(pid, frames);
        }
    }

    /// Reads every stack and adds `dt` to each thread's stage.
    fn tick(&mut self, dt: u64) {
        let training = self.training.stacks().unwrap_or_default();
        let (loop_stage, pin) = self.training_stages(&training);
        let mut strategy = None;
        if let (Some(st), Some(t)) = (loop_stage, self.loop_thread) {
            if let Some(s) = training.iter().find(|s| s.thread_id == t) {
                fold(&mut self.folded, st, "training loop", s, dt);
                if st == Stage::Receive {
                    strategy = sharing_strategy(&s.frames);
                }
            }
        }
        let mut workers = Vec::new();
        for (&pid, f) in self.workers.iter_mut() {
            if let Some(stacks) = f.as_mut().and_then(Frames::stacks) {
                let stages = worker_stages(&stacks);
                for (st, s) in &stages {
                    fold(&mut self.folded, *st, &format!("worker {pid}"), s, dt);
                }
                workers.push((
                    pid,
                    stages.into_iter().map(|(st, _)| st).collect::<Vec<_>>(),
                ));
            }
        }
        let bad = self.training.bad_frames
            + self
                .workers
                .values()
                .flatten()
                .map(|f| f.bad_frames)
                .sum::<u64>();
        let Ok(mut o) = self.shared.lock() else {
            return;
        };
        o.ticks += 1;
        o.covered_ns += dt;
        o.bad_frames = bad;
        if strategy.is_some() {
            o.sharing_strategy = strategy;
        }
        match loop_stage {
            Some(s) => *o.training.entry(s).or_default() += dt,
            None => o.training_unknown_ns += dt,
        }
        if let Some(p) = pin {
            *o.pin_memory.entry(p).or_default() += dt;
        }
        for (pid, stages) in workers {
            let w = o.workers.entry(pid).or_default();
            for s in stages {
                *w.entry(s).or_default() += dt;
            }
        }
    }

    /// The training loop's stage (once its thread is known: the one seen
    /// in the loader's `next()`) and the pin-memory thread's.
    fn training_stages(&mut self, stacks: &[Stack]) -> (Option<Stage>, Option<Stage>) {
        let mut pin = None;
        let mut stages = Vec::with_capacity(stacks.len());
        // A partial stack says no stage: its thread's tick is not counted.
        for s in stacks.iter().filter(|s| s.complete) {
            let st = classify(&s.frames);
            if matches!(st, Stage::PinMemory) || (st == Stage::Idle && is_pin_thread(s)) {
                pin = Some(st);
                continue;
            }
            if st.stalls() && self.loop_thread.is_none() {
                self.loop_thread = Some(s.thread_id);
            }
            stages.push((s.thread_id, st));
        }
        let loop_stage = self
            .loop_thread
            .and_then(|t| stages.iter().find(|(id, _)| *id == t).map(|(_, st)| *st));
        (loop_stage, pin)
    }
}

fn is_pin_thread(s: &Stack) -> bool {
    s.frames.iter().any(|f| f.0.as_ref() == "_pin_memory_loop")
}

/// A worker's stages this tick, with the stacks that are in them: its
/// main thread's (the one in `_worker_loop`), and Send when its result
/// queue's feeder is busy.
fn worker_stages(stacks: &[Stack]) -> Vec<(Stage, &Stack)> {
    let mut out = Vec::with_capacity(2);
    for s in stacks.iter().filter(|s| s.complete) {
        let st = classify(&s.frames);
        let in_loop = s.frames.iter().any(|f| f.0.as_ref() == "_worker_loop");
        if in_loop || st == Stage::Send {
            out.push((st, s));
        }
    }
    out
}

/// Adds `dt` to the folded stack of `s`, rooted at its stage and process.
/// Idle time is left out: a flamegraph of where the time went, not of
/// waiting for work.
fn fold(folded: &mut Folded, stage: Stage, process: &str, s: &Stack, dt: u64) {
    if stage == Stage::Idle {
        return;
    }
    let mut line = format!("[{}];{process}", stage.title());
    for (name, file) in &s.frames {
        line.push(';');
        // `;` separates frames in the folded format.
        line.push_str(&format!("{name} ({})", short_file(file)).replace(';', ":"));
    }
    *folded.entry(line).or_default() += dt;
}
