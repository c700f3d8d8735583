//! The stage sampler: a thread of the probe that, `hz` times a second,
//! reads the Python stack of every thread of the training process and of
//! each DataLoader worker (`frames.rs`), says which stage each is in
//! (`stage.rs`) and adds the time since its last tick to that stage; its
//! sleeps are jittered around the period. It also reads the loader's
//! batch count (`count.rs`), more often than the ticks while the loop
//! takes more than a batch a tick and may reach an epoch's end before the
//! next one (`pace.rs`), and at such reads the training loop's own stage
//! too (one process's stacks: the data stall's samples, its spans and its
//! stage stacks, as a tick's).
//! Stages take wall time: a worker blocked reading a file is in GetItem,
//! the training loop blocked on the result queue is stalled. Each
//! thread's CPU time goes to its stage beside it (`thread_cpu.rs`).
//! Each thread's tick also goes to its stage stack (stages.folded,
//! profile.pb.gz) and to its track's spans (trace.json, `spans.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::debug;

use super::count::Count;
use super::frames::{Frames, SharedNames, Stack};
use super::gil::Wait;
pub use super::observed::{LoaderState, Observed, StageNs};
use super::pace::{Jitter, LossWait, Schedule, COUNTS_PER_TICK};
use super::recorder::Recorder;
pub use super::recorder::{Recorded, StageStack};
use super::spans::Role;
use super::stage::{classify, inner_loader_frames, loader_entry, sharing_strategy, Frame, Stage};
use super::tally::{add_cpu, add_loop, count_wait, seen, WorkerTicks};
use super::thread_cpu::ThreadCpu;
use super::worker_ticks::{start_up_holds_the_loop, wait_of, worker_stages, WorkerThread};
use crate::bpf::procio::FutexWaits;
use crate::clock::now_ns;
use crate::cost::Thin;
use crate::python::PyProcess;

/// Reads the loader's iterator in the training process.
pub trait LoaderReader: Send {
    /// The iterator object and its counts now (every tick).
    fn yielded(&mut self) -> Option<Count>;
    /// Everything (about once a second).
    fn state(&mut self) -> Option<LoaderState>;
    /// Whether the loader call whose frame is at `frame` (the loop's
    /// outermost in dataloader.py) is the followed loader's; None when
    /// that cannot be told.
    fn serves(&mut self, _frame: u64) -> Option<bool> {
        None
    }
    /// Whether `serves` told a loader object of another loader for the
    /// first time since the last call.
    fn another_loader_began(&mut self) -> bool {
        false
    }
    /// Whether `serves` saw the loop in a new iterator of the followed
    /// loader, which the next state read takes without a look.
    fn hinted(&self) -> bool {
        false
    }
    /// Whether the last look through the frames was cut short by a read
    /// (the frames changed while read): the next read looks again at
    /// once, not after a look's wait. A loader made anew every 8 batches
    /// (~120 ms) otherwise lost the whole epoch in that wait.
    fn look_again(&self) -> bool {
        false
    }
}

pub struct StageSampler {
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Observed>>,
    handle: Option<JoinHandle<Recorder>>,
}

impl StageSampler {
    /// Starts sampling the training process `py` at `hz`; the threads'
    /// lock and GIL waits from `futex` where the BPF side loaded, else
    /// from /proc (`crate::torch::gil`).
    pub fn start(
        py: &PyProcess,
        reader: Box<dyn LoaderReader>,
        hz: u32,
        thin: Thin,
        futex: Option<FutexWaits>,
    ) -> std::io::Result<Self> {
        let futex = futex.map(Arc::new);
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Observed::default()));
        let mut run = Run {
            training: Frames::new(py).with_futex_waits(futex.clone()),
            training_name: format!("training loop (pid {})", py.pid).into(),
            parent: py.clone(),
            workers: HashMap::new(),
            forked_names: SharedNames::default(),
            forkserver: None,
            reader,
            loop_thread: None,
            loop_stage: None,
            iter_lost: false,
            workers_starting: false,
            last_loop_ns: 0,
            recorder: Recorder::default(),
            shared: shared.clone(),
            period: Duration::from_secs_f64(1.0 / f64::from(hz.max(1))),
            thin,
            futex,
            cpu: ThreadCpu::default(),
        };
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("stage-sampler".into())
            .spawn(move || {
                crate::sched::prompt_wakeups();
                run.run(&s);
                run.recorder
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

    /// Stops the thread and returns the final observation, the stage
    /// stacks and the spans.
    pub fn finish(mut self) -> (Observed, Recorded) {
        self.stop.store(true, Ordering::Relaxed);
        let joined = self.handle.take().map(JoinHandle::join);
        let mut o = self.observed();
        o.failed = matches!(joined, Some(Err(_)));
        let r = joined.and_then(Result::ok).unwrap_or_default();
        let (spans, spans_over_limit) = r.spans.finish();
        (
            o,
            Recorded {
                stacks: r.stacks,
                spans,
                spans_over_limit,
            },
        )
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

/// A worker process followed.
struct Worker {
    /// Its id in the loader (`_workers` index).
    id: u32,
    /// `worker K (pid M)`.
    name: Arc<str>,
    /// None: its interpreter could not be read.
    frames: Option<Frames>,
}

struct Run {
    training: Frames,
    /// `training loop (pid N)`.
    training_name: Arc<str>,
    /// The training process's interpreter: forked workers share its
    /// layout, so attaching to one needs no symbol lookup.
    parent: PyProcess,
    workers: HashMap<i32, Worker>,
    /// Code names of the workers forked from the training process.
    forked_names: SharedNames,
    /// The last worker attached on its own (not forked from the training
    /// process: a forkserver's, or a spawned one).
    forkserver: Option<PyProcess>,
    reader: Box<dyn LoaderReader>,
    loop_thread: Option<u64>,
    /// The loop's stage at its last read that told one.
    loop_stage: Option<Stage>,
    /// No count of the followed iterator could be read at the last read:
    /// it is gone (an epoch ended), and the next one is looked for.
    iter_lost: bool,
    /// At the last tick a worker was starting and none worked on a batch
    /// (`Run::starting_wait`).
    workers_starting: bool,
    /// When the training loop's stage was last read (a tick or a count
    /// read between two), CLOCK_MONOTONIC ns.
    last_loop_ns: u64,
    recorder: Recorder,
    shared: Arc<Mutex<Observed>>,
    period: Duration,
    /// The cost meter's say: a quarter of the ticks once it slows us.
    thin: Thin,
    /// The BPF side's futex waits, for every process's `Frames`.
    futex: Option<Arc<FutexWaits>>,
    /// The counted threads' CPU time between two reads.
    cpu: ThreadCpu,
}

/// Reads of the training process again for one partial loop stack.
const REREADS: usize = 2;
/// Count reads between two ticks read the loop's stage too, at most this
/// many a period (every 10 ms at 25 Hz: ~1,000 samples in a 10 s window,
/// a stall of 95% within ±0.7 points), or one once the cost meter slows
/// the sampler (±1.4 points).
const LOOP_READS_PER_PERIOD: u32 = COUNTS_PER_TICK;
/// Frames in dataloader.py inside the loop's outermost one whose `self`
/// is read for a new iterator, at most (`which_loader`): `__iter__`,
/// `_get_iterator` and the iterator's `__init__` come first.
const INNER_FRAMES_TRIED: usize = 3;
/// Between two full reads of the loader's state.
const STATE_EVERY: Duration = Duration::from_millis(500);
/// Between two full reads while the loop is in another loader's calls.
const STATE_ELSEWHERE: Duration = Duration::from_secs(2);

impl Run {
    fn run(&mut self, stop: &AtomicBool) {
        // CLOCK_MONOTONIC, as the recording's other events.
        let mut last_stacks = now_ns().0;
        self.last_loop_ns = last_stacks;
        let mut last_state: Option<Instant> = None;
        self.iter_lost = false;
        // The wait between two looks while the iterator stays lost.
        let mut loss = LossWait::default();
        let mut renewed = false;
        // Count reads per period (1, `COUNTS_PER_TICK` or more: `pace`) and
        // the periods between two ticks: 1, or `SLOWED` once the cost meter
        // slows us.
        let mut schedule = Schedule::default();
        let mut last_count: Option<Count> = None;
        let mut jitter = Jitter::seeded(last_stacks);
        // The loop was just seen in a new iterator of the loader while the
        // last one is lost: it is read now, not a count read's wait later.
        let mut hinted = false;
        // The iterator read last had not started all its workers, or its
        // batch size was not set: it was taken in its constructor. Read
        // again every period until it has, not at the next full read half
        // a second on: an epoch's workers may be done by then, never
        // followed.
        let mut starting = false;
        while !stop.load(Ordering::Relaxed) {
            // Jittered (0.5 to 1.5 times the period, 1 on average): a loop
            // whose own period divides the sampler's would otherwise be
            // caught at the same point of it tick after tick.
            if !std::mem::take(&mut hinted) {
                std::thread::sleep((self.period / schedule.per_period()).mul_f64(jitter.next()));
            }
            let now = Instant::now();
            // A full read every STATE_EVERY, and soon after the iterator
            // was lost (an epoch ended: the next one's is to be found): as
            // soon as the loop is seen in the next one's calls (a hint,
            // below: a read by name), else by a look through the frames
            // (hundreds of reads, ~770 for one that finds nothing) every
            // 100 ms, and after half a second of them at twice the wait
            // each time up to STATE_EVERY (`LossWait`): a job long
            // between two epochs (a checkpoint, an evaluation without a
            // DataLoader) was looked through every 100 ms.
            let due = |every| last_state.is_none_or(|t| now.duration_since(t) >= every);
            // While the loop is in another loader's pass (validation), this
            // one's iterator is gone until the pass ends: a look through
            // the frames for it (thousands of reads) as the other loader
            // is first seen, then every STATE_ELSEWHERE, not every 100 ms
            // of a pass that may last minutes. Another loader first seen
            // forces a look, lost or not: a pass of another loader began,
            // or a loader the job made anew replaced this one (its epoch
            // may be over before a look 100 ms later, and this one's last
            // iterator may read as alive until the GC frees it); the look
            // tells which (`IterReader::state`).
            let began = self.reader.another_loader_began();
            let elsewhere = self.iter_lost && self.loop_stage == Some(Stage::OtherLoader);
            // The loop seen in a new iterator of this loader: taken now, at
            // the cost of a read by name, not of a look.
            let read = began
                || renewed
                || (starting && due(self.period))
                || (self.iter_lost && (self.reader.hinted() || self.reader.look_again()))
                || if elsewhere {
                    due(STATE_ELSEWHERE)
                } else if self.iter_lost {
                    due(loss.wait())
                } else {
                    due(STATE_EVERY)
                };
            let state = if read {
                if self.iter_lost {
                    loss.read(STATE_EVERY);
                }
                last_state = Some(now);
                self.reader.state()
            } else {
                None
            };
            if let Some(s) = &state {
                starting = !s.complete();
                self.follow_workers(&s.workers);
                // The thread whose frames hold the iterator is the loop's,
                // known from the first read: a loop that seldom waits (a
                // long training step) is seldom caught in `next()`.
                if s.held_by.is_some() {
                    self.loop_thread = s.held_by;
                }
            }
            let count = match &state {
                Some(s) => Some(Count {
                    iter: s.iter,
                    yielded: s.num_yielded,
                    sent: s.sent,
                    first_worker: s.first_worker,
                }),
                None => self.reader.yielded(),
            };
            let was_lost = std::mem::replace(&mut self.iter_lost, count.is_none());
            let lost = self.iter_lost;
            if !lost {
                loss = LossWait::default();
            } else if !was_lost && !read {
                // Lost at a count read (the epoch ended): the first look
                // waits `LossWait`'s first wait, the loop read meanwhile
                // (a hint finds the next iterator without a look; another
                // loader's pass waits STATE_ELSEWHERE). A Lightning job's
                // every epoch end was two deep looks that found nothing
                // yet: its validation pass comes first.
                last_state = Some(now);
            }
            // A new iterator (an epoch's, without persistent workers)
            // starts new workers: the next read finds them, rather than
            // one up to STATE_EVERY later (their start-up, seconds under
            // spawn or forkserver, would go unseen meanwhile). So does a
            // count that fell: an iterator reset, or a new one where the
            // last one was freed.
            renewed = matches!((count, &last_count),
                (Some(c), Some(l)) if c.iter != l.iter || c.yielded < l.yielded);
            if lost {
                schedule.lost();
            }
            last_count = count.or(last_count);
            self.counted(count, state);
            if !schedule.read(last_count, || self.epoch_end()) {
                let n = if schedule.periods() > 1 {
                    1
                } else {
                    LOOP_READS_PER_PERIOD
                };
                let gap = u64::try_from((self.period / n).as_nanos());
                let mono = now_ns().0;
                if mono.saturating_sub(self.last_loop_ns) >= gap.unwrap_or(0) {
                    self.loop_read(mono);
                }
            } else {
                let mono = now_ns().0;
                self.tick(last_stacks, mono, count.is_some());
                last_stacks = mono;
                schedule.ticked(self.thin.stages_slowed());
            }
            // An epoch of a few batches can end within a wait: a loader
            // whose 8-batch epochs took 0.1 s each, one worker new each
            // epoch, counted 9-17% short when its iterators were taken
            // at the wakeup after the one that saw the loop in them.
            hinted = lost && self.reader.hinted();
        }
    }

    /// Where the running epoch will end, where the last one did, and where
    /// its sampler will run out, where one seen drained did: a map-style
    /// loader's sampler keeps its length. Neither for an iterable dataset,
    /// whose epochs may differ.
    fn epoch_end(&self) -> (Option<u64>, Option<u64>) {
        let Ok(o) = self.shared.lock() else {
            return (None, None);
        };
        if !o.state.as_ref().is_some_and(|s| s.map_style) {
            return (None, None);
        }
        (o.batches.ended_at(), o.batches.ran_out())
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
        if let Some(mut s) = state {
            // The loader's settings do not change from one iterator to the
            // next: one read while its iterator is being built keeps those
            // the last read had (a window that ended in an epoch's first
            // milliseconds said no batch size).
            if let Some(was) = o
                .state
                .as_ref()
                .filter(|w| w.dataset_type == s.dataset_type)
            {
                s.batch_size = s.batch_size.or(was.batch_size);
                s.prefetch_factor = s.prefetch_factor.or(was.prefetch_factor);
            }
            o.state = Some(s);
        }
    }

    /// The training loop's stage alone, between two ticks: its process's
    /// stacks (a few µs), not every worker's. The data stall and the
    /// loop's stages rest on the count reads too, not on the ticks alone:
    /// a slowed sampler ticks ~80 times in 10 s, and the stall of a loop
    /// that waits 95% of its time then moved ±2.5 points from run to run.
    /// `now`: CLOCK_MONOTONIC ns, read just before.
    fn loop_read(&mut self, now: u64) {
        let stacks = self.training_stacks();
        if stacks.is_empty() {
            return;
        }
        let (loop_stage, _) = self.training_stages(&stacks);
        let loop_stage = loop_stage.map(|st| self.starting_wait(st));
        let start = self.last_loop_ns;
        let dt = now.saturating_sub(start);
        let mut cpu = None;
        if let Some((st, s)) = loop_stage.zip(self.loop_stack(&stacks)) {
            let (pid, name) = (self.training.pid, &self.training_name);
            let seen = seen(pid, name, Role::TrainingLoop, st, s);
            self.recorder.record(&seen, s, start, now);
            cpu = self.cpu.since_last(pid, s.tid, dt, st);
        }
        self.last_loop_ns = now;
        if let Ok(mut o) = self.shared.lock() {
            add_loop(&mut o, loop_stage, dt, cpu);
        }
    }

    /// The loop thread's stack among its process's `stacks`: the complete
    /// one (a thread being started has a thread state with its parent's
    /// id until it runs).
    fn loop_stack<'s>(&self, stacks: &'s [Stack]) -> Option<&'s Stack> {
        let t = self.loop_thread?;
        stacks.iter().find(|s| s.thread_id == t && s.complete)
    }

    /// The training process's stacks (none when it cannot be read), read
    /// again while the loop's thread was caught changing frames: it runs
    /// while it is read, and a partial stack says no stage. It runs
    /// Python in its step and while it receives a batch, not while it
    /// waits: left out, those reads leaned the data stall up (1-2% of a
    /// loop's reads were partial).
    fn training_stacks(&mut self) -> Vec<Stack> {
        let mut stacks = self.training.stacks().unwrap_or_default();
        for _ in 0..REREADS {
            let Some(t) = self.loop_thread else {
                break;
            };
            let mut mine = stacks.iter().filter(|s| s.thread_id == t).peekable();
            if mine.peek().is_none() || mine.any(|s| s.complete) {
                break;
            }
            match self.training.stacks() {
                Some(s) => stacks = s,
                None => break,
            }
        }
        stacks
    }

    /// Attaches to new workers and forgets the ones gone.
    fn follow_workers(&mut self, workers: &[(u32, i32)]) {
        let cpu = &mut self.cpu;
        self.workers.retain(|pid, _| {
            let kept = workers.iter().any(|(_, p)| p == pid);
            if !kept {
                cpu.forget(*pid);
            }
            kept
        });
        for &(id, pid) in workers {
            if self.workers.contains_key(&pid) {
                continue;
            }
            // A forked worker shares its code names with the others. The
            // workers a forkserver forks share their interpreter's layout
            // with each other: the first is attached (its symbols read),
            // the rest, every epoch's, take its layout. Not its code
            // names: each imports the job's modules after the fork, its
            // code objects its own.
            let sibling = self.forkserver.as_ref().and_then(|py| py.forked(pid));
            let attached = match (self.parent.forked(pid), sibling) {
                (Some(py), _) => Ok(Frames::sharing(&py, self.forked_names.clone())),
                (None, Some(py)) => Ok(Frames::new(&py)),
                (None, None) => PyProcess::attach(pid).map(|py| {
                    let frames = Frames::new(&py);
                    self.forkserver = Some(py);
                    frames
                }),
            };
            let frames = match attached {
                Ok(f) => Some(f.with_futex_waits(self.futex.clone())),
                Err(e) => {
                    debug!(pid, "worker's interpreter not readable: {e}");
                    if let Ok(mut o) = self.shared.lock() {
                        o.unreadable_workers.push((pid, e.to_string()));
                    }
                    None
                }
            };
            self.workers.insert(
                pid,
                Worker {
                    id,
                    name: format!("worker {id} (pid {pid})").into(),
                    frames,
                },
            );
            // Found, whether or not a tick sees it in a stage: a worker
            // of a short epoch lives ~0.5 s, a few ticks of a slowed
            // sampler, and its CPU and reads are its own all the same.
            if let Ok(mut o) = self.shared.lock() {
                o.workers.entry(pid).or_default();
            }
        }
    }

    /// Reads every stack and adds the time since the last tick,
    /// `[start_ns, end_ns]`, to each thread's stage. `counted`: the count
    /// read just before it found the iterator.
    fn tick(&mut self, start_ns: u64, end_ns: u64, counted: bool) {
        let dt = end_ns.saturating_sub(start_ns);
        let training = self.training_stacks();
        let (loop_stage, pin) = self.training_stages(&training);
        let workers = self.worker_ticks(start_ns, end_ns);
        // Until the next tick.
        self.workers_starting = start_up_holds_the_loop(workers.iter().flat_map(|(_, ts, _)| ts));
        let loop_stage = loop_stage.map(|st| self.starting_wait(st));
        let (pid, name) = (self.training.pid, &self.training_name);
        let mut strategy = None;
        let mut loop_gil = None;
        let loop_dt = end_ns.saturating_sub(self.last_loop_ns);
        let mut loop_cpu = None;
        if let Some(st) = loop_stage {
            if let Some(s) = self.loop_stack(&training) {
                loop_cpu = self.cpu.since_last(pid, s.tid, loop_dt, st);
                // Since the loop's last read, as its stage's time.
                let seen = seen(pid, name, Role::TrainingLoop, st, s);
                self.recorder.record(&seen, s, self.last_loop_ns, end_ns);
                if st == Stage::Receive {
                    strategy = sharing_strategy(&s.frames);
                }
                loop_gil = Some(wait_of(&self.training, st, s));
            }
        }
        let mut pin_cpu = None;
        if let Some((st, s)) = pin {
            let seen = seen(pid, name, Role::PinMemory, st, s);
            self.recorder.record(&seen, s, start_ns, end_ns);
            pin_cpu = self.cpu.since_last(pid, s.tid, dt, st);
        }
        let bad = self.training.bad_frames
            + self
                .workers
                .values()
                .filter_map(|w| w.frames.as_ref())
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
        self.last_loop_ns = end_ns;
        add_loop(&mut o, loop_stage, loop_dt, loop_cpu);
        // Building a batch itself, after this tick's count read: the loop
        // will yield it, though the epoch may end before the next read.
        // Not when that read found no iterator: the epoch it read last may
        // be over, and the batch the next one's (the old iterator freed
        // as the new one took its place, the new one not found yet: +1.2%
        // on a slow loop, and a wrong epoch length learned from it).
        let builds = o
            .state
            .as_ref()
            .is_some_and(|s| s.num_workers == 0 && s.map_style);
        if builds
            && counted
            && matches!(
                loop_stage,
                Some(Stage::GetItem | Stage::Collate | Stage::PinMemory)
            )
        {
            o.batches.building();
        }
        if let (Some(st), Some(waits)) = (loop_stage, loop_gil) {
            match count_wait(&mut o, waits) {
                Wait::Gil => *o.training_gil.entry(st).or_default() += dt,
                Wait::Lock => *o.training_lock.entry(st).or_default() += dt,
                Wait::Not => {}
            }
        }
        if let Some((p, _)) = pin {
            *o.pin_memory.entry(p).or_default() += dt;
            add_cpu(&mut o.pin_memory_cpu, pin_cpu);
        }
        for (pid, stages, cpu) in workers {
            for ((s, waits, _), cpu) in stages.into_iter().zip(cpu) {
                *o.workers.entry(pid).or_default().entry(s).or_default() += dt;
                add_cpu(o.workers_cpu.entry(pid).or_default(), cpu);
                let by = match count_wait(&mut o, waits) {
                    Wait::Gil => &mut o.workers_gil,
                    Wait::Lock => &mut o.workers_lock,
                    Wait::Not => continue,
                };
                *by.entry(pid).or_default().entry(s).or_default() += dt;
            }
        }
    }

    /// The loop waiting for a batch while its loader's workers start
    /// (spawned or forkserver workers import the job's modules first, for
    /// seconds an epoch) and none works on one: start-up, not the
    /// workers' pace.
    fn starting_wait(&self, st: Stage) -> Stage {
        if st == Stage::Wait && self.workers_starting {
            Stage::Startup
        } else {
            st
        }
    }

    /// Reads every worker's stacks: per worker process, each of its
    /// threads' stage this tick, what it waited for, and which thread;
    /// and each thread's CPU time since it was last read.
    fn worker_ticks(&mut self, start_ns: u64, end_ns: u64) -> Vec<WorkerTicks> {
        let dt = end_ns.saturating_sub(start_ns);
        let mut workers = Vec::new();
        for (&pid, w) in self.workers.iter_mut() {
            if let Some(stacks) = w.frames.as_mut().and_then(Frames::stacks) {
                let Some(frames) = w.frames.as_ref() else {
                    continue;
                };
                let stages = worker_stages(&stacks, frames);
                for t in &stages {
                    let role = match t.thread {
                        WorkerThread::Loop => Role::WorkerLoop(w.id),
                        WorkerThread::Feeder => Role::Feeder(w.id),
                        WorkerThread::Sharer => Role::Sharer(w.id),
                    };
                    let seen = seen(pid, &w.name, role, t.stage, t.stack);
                    self.recorder.record(&seen, t.stack, start_ns, end_ns);
                }
                let cpu = stages
                    .iter()
                    .map(|t| self.cpu.since_last(pid, t.stack.tid, dt, t.stage))
                    .collect();
                workers.push((
                    pid,
                    stages
                        .into_iter()
                        .map(|t| (t.stage, t.wait, t.thread))
                        .collect::<Vec<_>>(),
                    cpu,
                ));
            }
        }
        workers
    }

    /// The training loop's stage (once its thread is known: the one whose
    /// frames hold the loader's iterator, else the first seen in its
    /// `next()`) and the pin-memory thread's, with its stack.
    fn training_stages<'s>(
        &mut self,
        stacks: &'s [Stack],
    ) -> (Option<Stage>, Option<(Stage, &'s Stack)>) {
        let mut pin = None;
        let mut stages = Vec::with_capacity(stacks.len());
        // A partial stack says no stage: its thread's tick is not counted.
        for s in stacks.iter().filter(|s| s.complete) {
            let st = classify(&s.frames);
            if is_pin_thread(s) {
                pin = Some((st, s));
                continue;
            }
            if st.stalls() && self.loop_thread.is_none() {
                self.loop_thread = Some(s.thread_id);
            }
            stages.push((s.thread_id, st));
        }
        let loop_stage = self
            .loop_thread
            .and_then(|t| stages.iter().find(|(id, _)| *id == t).map(|(_, st)| *st))
            .map(|st| self.which_loader(st, stacks));
        self.loop_stage = loop_stage.or(self.loop_stage);
        (loop_stage, pin)
    }

    /// The loop's stage `st`, or [`Stage::OtherLoader`] when its call into
    /// dataloader.py is another loader's than the one followed.
    fn which_loader(&mut self, st: Stage, stacks: &[Stack]) -> Stage {
        if st == Stage::Other {
            return st;
        }
        let Some(s) = self.loop_stack(stacks) else {
            return st;
        };
        let frame = loader_entry(&s.frames).and_then(|e| s.addrs.get(e).copied());
        let serves = frame.and_then(|f| self.reader.serves(f));
        // While the iterator is lost, the loop may be in the next one's
        // constructor (its workers starting, tens of milliseconds), under
        // the loader's `__iter__`: the `self` of a frame inside it is the
        // iterator. Taken then, an epoch of a few batches is read from its
        // start, not found by a look after it ended.
        if self.iter_lost && serves == Some(true) && !self.reader.hinted() {
            for i in inner_loader_frames(&s.frames).take(INNER_FRAMES_TRIED) {
                if let Some(&f) = s.addrs.get(i) {
                    self.reader.serves(f);
                }
                if self.reader.hinted() {
                    break;
                }
            }
        }
        match serves {
            Some(false) => Stage::OtherLoader,
            _ => st,
        }
    }
}

/// The pin-memory thread: it runs `_pin_memory_loop`. Without workers
/// there is none, and the training loop pins each batch itself, under the
/// same `pin_memory` function: that is the loop's stage, a stall.
fn is_pin_thread(s: &Stack) -> bool {
    s.frames
        .iter()
        .any(|f| Frame::name(f) == "_pin_memory_loop")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(frames: &[&str]) -> Stack {
        let pin = "/t/torch/utils/data/_utils/pin_memory.py";
        Stack {
            thread_id: 1,
            tid: 1,
            frames: frames
                .iter()
                .map(|f| (Arc::from(*f), Arc::from(pin)))
                .collect(),
            addrs: vec![0; frames.len()],
            complete: true,
        }
    }

    #[test]
    fn the_pin_thread_is_the_one_in_its_loop() {
        let thread = stack(&["_pin_memory_loop", "do_one_step", "pin_memory"]);
        assert!(is_pin_thread(&thread));
        // Without workers the loop pins its own batches: not the thread.
        let own = stack(&["_next_data", "pin_memory"]);
        assert!(!is_pin_thread(&own));
        assert_eq!(classify(&own.frames), Stage::PinMemory);
    }
}
