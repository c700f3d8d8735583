//! The one recording loop. A source (the BPF attach of `--pid`, its uprobes
//! fallback, the LD_PRELOAD shim of `run`, the next framework) says what
//! the pipeline looks like at each poll; the loop decides when to poll,
//! when to stop, and hands every observation to the sink in one order:
//! the target, then per poll the nodes that died since the last one, the
//! poll, and the source's own per-poll events, then what the recording
//! cost the target, the drops and the end.

mod walk;

use std::time::{Duration, Instant};

use anyhow::Result;
use plumber_collector::event::{DropCount, Event, NodeObservation, Poll, TargetInfo};
use plumber_collector::stacks::{LabeledStack, Span, StackAggregator};

use crate::clock::now_ns;
use crate::cost::Meter;
use crate::progress::Progress;
use crate::sink::EventSink;
use crate::stop::{sleep_interval, STOP};
use crate::target::{self, Target};

pub use walk::{await_iterators, Discovery, ModelWalk, NoModel, OtherPipeline, NO_MODEL};

/// A finished recording: the observations and how the window ended.
pub struct Recording {
    pub sink: EventSink,
    /// Why the recording ended.
    pub reason: String,
    /// How the pipeline was read, as the summary line says it.
    pub mode: &'static str,
    pub partial: bool,
    /// Seconds from start to the first poll with data.
    pub time_to_first_data: f64,
    pub cache_hit: bool,
    /// The stack sampler's result, attributed to threads and ops.
    pub stacks: Option<StackRecording>,
    /// A DataLoader recording's stage stacks and spans.
    pub stages: Option<StageRecording>,
}

/// A DataLoader recording's stage sampler, ready for its outputs
/// (stages.folded, stages.svg, profile.pb.gz, trace.json).
pub struct StageRecording {
    /// Wall ns per stack, rooted at `[stage]` and the process.
    pub stacks: Vec<LabeledStack>,
    /// A span per stretch of ticks of one thread in one stage and
    /// function; one process per worker.
    pub spans: Vec<Span>,
    /// The training process.
    pub pid: i32,
    pub hz: u32,
    /// When sampling ran, ns since the epoch.
    pub start_wall_ns: u64,
    pub end_wall_ns: u64,
}

/// Stack samples of a recording, ready for the flamegraph outputs.
pub struct StackRecording {
    pub agg: StackAggregator,
    /// Op spans of the attribution windows, for trace.json.
    pub spans: Vec<Span>,
    pub samples: u64,
    pub complete_pct: f64,
    pub pid: i32,
    pub hz: u32,
    /// When sampling ran, ns since the epoch.
    pub start_wall_ns: u64,
    pub end_wall_ns: u64,
    /// One line on the stacks' Python frames: which interpreter and how
    /// many samples carry them, or why there are none.
    pub python: String,
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Duration,
    Signal,
    TargetExited,
}

/// What the first half of a round (`Source::prepare`) decided.
pub enum Prepared {
    /// Go on and read the nodes.
    Ready,
    /// Start the round again at once (e.g. nothing found yet).
    Again,
    /// The recording is over.
    End(Stop),
}

/// Where the loop stands, for the source.
pub struct Round {
    /// The window has started (a poll with nodes was recorded).
    pub window_started: bool,
    /// Time since the loop began.
    pub since_start: Duration,
}

/// One way of observing a pipeline. The loop calls, each round:
/// `prepare` (find the pipeline if it is not known), the stop check
/// (`alive`), `nodes`, and, when there are nodes, `drain_retired`,
/// `learn_nodes`, the poll, `after_poll`; then `poll_again_now` or a sleep of
/// `interval` (during which `tick` runs). After the last round:
/// `drain_retired` and `finish`.
pub trait Source {
    /// The target process.
    fn target(&self) -> &Target;
    /// How the pipeline is read (`mode` in the outputs).
    fn mode(&self) -> &'static str;
    /// The target's PID (its CPU time goes with each poll).
    fn pid(&self) -> i32 {
        self.target().pid
    }
    /// The target as the recording describes it (first event).
    fn target_info(&self) -> TargetInfo {
        self.target().info(self.mode())
    }
    /// The job's CPU time so far, ns: the target process's (a source whose
    /// job spans processes adds theirs).
    fn cpu_ns(&self) -> Option<u64> {
        target::process_cpu_ns(self.pid())
    }
    /// Whether the target still runs.
    fn alive(&mut self) -> bool {
        target::alive(self.pid())
    }
    /// The autotune model's walk, for the sources that read the model.
    fn walk(&mut self) -> Option<&mut ModelWalk> {
        None
    }
    /// What the recording waits for while `prepare` answers `Again`, for
    /// the line that says so.
    fn awaited(&self) -> &'static str {
        "its tf.data pipeline to start"
    }
    /// Finds the pipeline when it is not known yet. An error before the
    /// window started fails the recording; after it, the recording ends.
    fn prepare(&mut self, round: &Round) -> Result<Prepared> {
        let _ = round;
        Ok(Prepared::Ready)
    }
    /// The pipeline's nodes now, root first; empty when it is gone.
    fn nodes(&mut self) -> Result<Vec<NodeObservation>> {
        Ok(self.walk().map(ModelWalk::nodes).unwrap_or_default())
    }
    /// No nodes this round and no stop: what to do before the next round
    /// (forget the pipeline's iterators, give up waiting, pause).
    fn idle(&mut self, round: &Round) -> Result<()> {
        let _ = round;
        if let Some(w) = self.walk() {
            w.forget_iterators();
        }
        Ok(())
    }
    /// Moves the final counters of nodes that died since the last call
    /// into the sink.
    fn drain_retired(&mut self, sink: &mut EventSink) -> Result<()> {
        let _ = sink;
        Ok(())
    }
    /// Sees each poll's nodes before they go to the sink.
    fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        let _ = nodes;
    }
    /// The source's own events of this poll (threads, waits, I/O), after
    /// the poll; `first`: the poll that opened the window.
    fn after_poll(&mut self, sink: &mut EventSink, mono_ns: u64, first: bool) -> Result<()> {
        let _ = (sink, mono_ns, first);
        Ok(())
    }
    /// After a poll that does not end the recording: true to start the
    /// next round at once instead of sleeping.
    fn poll_again_now(&mut self) -> bool {
        false
    }
    /// The poll interval when the user gave none.
    fn default_interval(&self) -> Duration;
    /// Runs before each sleep between polls; how soon it wants to run
    /// again.
    fn tick(&mut self) -> Option<Duration> {
        None
    }
    /// The window is over: what was lost or rejected.
    fn finish(&mut self, sink: &mut EventSink) -> Result<Vec<DropCount>>;
    /// How a recording that the target's exit ended is marked: (partial,
    /// reason), given whether a duration was asked for.
    fn exit_end(&self, has_duration: bool) -> (bool, &'static str) {
        let _ = has_duration;
        (true, "target exited")
    }
    /// The source's own time inside the target so far, ns, cumulative
    /// (`run`'s shim: its hooks and their clock reads); None when the
    /// source runs nothing there.
    fn in_target_ns(&self) -> Option<u64> {
        None
    }
}

/// The loop's settings.
pub struct LoopOpts {
    pub duration: Option<Duration>,
    /// None: the source's default interval.
    pub interval: Option<Duration>,
    pub quiet: bool,
    /// When the recording began (time to first data counts from here).
    pub started: Instant,
    /// What the recording costs the target, measured at each poll (and
    /// kept to its budget); its `ProbeCost` ends the recording's events.
    pub cost: Option<Meter>,
}

/// How the loop ended.
pub struct Ended {
    pub partial: bool,
    pub reason: &'static str,
    /// Seconds from start to the first poll with nodes; None when no poll
    /// had any (the window never started).
    pub time_to_first_data: Option<f64>,
}

/// Polls `source` until the duration, a stopping signal or the target's
/// exit, pushing every observation into `sink`.
pub fn run<S: Source>(source: &mut S, sink: &mut EventSink, opts: &LoopOpts) -> Result<Ended> {
    sink.push(Event::Target(source.target_info()))?;
    if let Some(m) = &opts.cost {
        m.restart();
    }
    let mut state = LoopState {
        window_start: None,
        time_to_first_data: None,
        progress: Progress::new(opts.quiet),
        began: Instant::now(),
    };
    let stop = state.rounds(source, sink, opts)?;
    state.progress.done();
    // Over the window, first poll to last: before the probes' detach,
    // which `finish` below does.
    if let Some(cost) = opts.cost.as_ref().and_then(Meter::finish) {
        sink.push(Event::ProbeCost(cost))?;
    }
    source.drain_retired(sink)?;
    let drops = source.finish(sink)?;
    sink.push(Event::Drops { drops })?;
    let (partial, reason) = match stop {
        Stop::Duration => (false, "duration reached"),
        Stop::Signal => (opts.duration.is_some(), "interrupted"),
        Stop::TargetExited => source.exit_end(opts.duration.is_some()),
    };
    sink.push(Event::End {
        partial,
        reason: reason.into(),
    })?;
    Ok(Ended {
        partial,
        reason,
        time_to_first_data: state.time_to_first_data,
    })
}

struct LoopState {
    window_start: Option<Instant>,
    time_to_first_data: Option<f64>,
    progress: Progress,
    began: Instant,
}

impl LoopState {
    fn round(&self) -> Round {
        Round {
            window_started: self.window_start.is_some(),
            since_start: self.began.elapsed(),
        }
    }

    fn should_stop<S: Source>(&self, source: &mut S, opts: &LoopOpts) -> Option<Stop> {
        should_stop(source, opts.duration, self.window_start)
    }

    fn rounds<S: Source>(
        &mut self,
        source: &mut S,
        sink: &mut EventSink,
        opts: &LoopOpts,
    ) -> Result<Stop> {
        loop {
            match source.prepare(&self.round()) {
                Ok(Prepared::Ready) => {}
                Ok(Prepared::Again) => {
                    if self.window_start.is_none() {
                        let waited = self.began.elapsed();
                        self.progress
                            .waiting(source.pid(), source.awaited(), waited);
                    }
                    continue;
                }
                Ok(Prepared::End(stop)) => return Ok(stop),
                // A pipeline without a model fails the recording whenever
                // it is found: the caller may record it another way.
                Err(e) if self.window_start.is_some() && !e.is::<NoModel>() => {
                    tracing::warn!(
                        "pipeline gone and not found again: {}",
                        crate::errors::one_line(&e)
                    );
                    return Ok(if STOP.load(std::sync::atomic::Ordering::SeqCst) {
                        Stop::Signal
                    } else {
                        Stop::TargetExited
                    });
                }
                Err(e) => return Err(e),
            }
            // On Ctrl-C or at the deadline take one last poll, so the
            // window ends where the user asked; a dead target cannot be read.
            let stopping = self.should_stop(source, opts);
            if stopping == Some(Stop::TargetExited) {
                return Ok(Stop::TargetExited);
            }
            let nodes = source.nodes()?;
            if nodes.is_empty() {
                if let Some(stop) = stopping {
                    return Ok(stop);
                }
                source.idle(&self.round())?;
                continue;
            }
            source.drain_retired(sink)?;
            self.push_poll(source, sink, opts, nodes, stopping.is_some())?;
            if let Some(stop) = stopping {
                return Ok(stop);
            }
            if source.poll_again_now() {
                continue;
            }
            let interval = opts.interval.unwrap_or_else(|| source.default_interval());
            sleep_interval(interval, opts.duration, self.window_start, || source.tick());
        }
    }

    /// Records one poll; the first one starts the window.
    /// The poll's instant is taken here, after the nodes were read: a node
    /// that died while we read (and so was not read) then has its
    /// retirement inside the window, and its final counts are kept.
    fn push_poll<S: Source>(
        &mut self,
        source: &mut S,
        sink: &mut EventSink,
        opts: &LoopOpts,
        nodes: Vec<NodeObservation>,
        last: bool,
    ) -> Result<()> {
        let (mono_ns, wall_ns) = now_ns();
        let root_elems = nodes.first().map(|n| n.counters.num_elements);
        let target_cpu = source.cpu_ns();
        let process_cpu_ns = target_cpu.unwrap_or(0);
        source.learn_nodes(&nodes);
        sink.push(Event::Poll(Poll {
            mono_ns,
            wall_ns,
            process_cpu_ns,
            machine_busy_ns: target::machine_busy_ns(),
            nodes,
        }))?;
        let first = self.window_start.is_none();
        let start = *self.window_start.get_or_insert_with(|| {
            self.time_to_first_data = Some(opts.started.elapsed().as_secs_f64());
            Instant::now()
        });
        if let Some(m) = &opts.cost {
            m.on_poll(target_cpu, source.in_target_ns(), start.elapsed(), last);
        }
        source.after_poll(sink, mono_ns, first)?;
        self.progress.tick(
            start.elapsed().as_secs_f64(),
            opts.duration.map(|d| d.as_secs_f64()),
            root_elems,
        );
        Ok(())
    }
}

/// The stop check of a round: a signal, the target's exit, the duration
/// (counted from the window's start).
pub fn should_stop<S: Source>(
    source: &mut S,
    duration: Option<Duration>,
    window_start: Option<Instant>,
) -> Option<Stop> {
    if STOP.load(std::sync::atomic::Ordering::SeqCst) {
        return Some(Stop::Signal);
    }
    if !source.alive() {
        return Some(Stop::TargetExited);
    }
    match (duration, window_start) {
        (Some(d), Some(s)) if s.elapsed() >= d => Some(Stop::Duration),
        _ => None,
    }
}
