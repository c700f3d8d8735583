//! Per-thread CPU, waits and file I/O of the target, and the evidence that
//! ties them to pipeline ops. The BPF side counts; this module
//! turns its maps and ring buffer into collector events at every poll.
//!
//! Attribution: TensorFlow calls `model::Node::record_stop(node)` on every
//! thread each time that thread stops working for `node` (an op handing
//! over to its input, a UDF finishing on the pool). A uprobe there costs
//! about a microsecond per call, so it is attached only for short windows
//! (`WINDOW` long, one every 5-15 s: `Schedule`); within a window the BPF
//! side books each thread's on-CPU time, waits and reads between two calls
//! to the node of the second call. The collector uses those per-thread
//! splits as ratios over the thread's whole CPU time, which the kernel
//! counts at no cost.
//!
//! Lock, condition and GIL slow paths are timed by uprobes on their entry
//! and return (absl's `Mutex::LockSlow`, CPython's `take_gil`): thousands
//! of hits a second on a busy pipeline, ~2.5 us each, and the return probe
//! runs with the lock just taken, lengthening the critical section (which
//! does not make LockSlow come more often: bench/lock_contention.py). So
//! they too are attached in windows only: during the attribution part
//! of a window (for the per-node split, and so that blocks inside them are
//! not taken for condition waits) and for `WAIT_WINDOW` after it, the only
//! time their waits count. The record_stop probes are gone by then: they
//! slow the pipeline and would raise the very contention being measured.
//! Totals are scaled by the share of time observed.
//! File reads are tied to ops by the user stack at the read (the innermost
//! `GetNextInternal` frame), which is cheap because reads are rare.

mod attribution;
mod fileio;
mod nodes;
pub mod proc_io;
mod schedule;
mod spans;
mod stacks;
mod thread_cpu;
mod wait_probes;
mod wait_stacks;
mod waits;
mod windows;

use std::sync::mpsc;
use std::time::Duration;

use anyhow::Result;
use libbpf_rs::Link;
use plumber_collector::event::{DropCount, Event, NodeObservation};
use tracing::{info, warn};

use crate::bpf::sample::RawSample;
use crate::bpf::{Bpf, WaitProbe};
use crate::cost::Thin;
use crate::derive::{self, Derived, ProbePoint};
use crate::sampler::StackContext;
use crate::sink::EventSink;
use crate::target::Target;

use attribution::AttrEvidence;
use fileio::FileTracker;
pub use nodes::Instance;
use nodes::Nodes;
use spans::SpanTrace;
use stacks::Stacks;
use thread_cpu::{BpfThreads, ThreadCpu};
use wait_probes::{WaitPoint, WaitProbes};
use wait_stacks::WaitStacks;
use waits::WaitTotals;
pub use windows::Attribution;
use windows::Windows;

/// How often the stack copies are handed over while a window part is open
/// (see `Usage::tick`).
const FORWARD_EVERY: Duration = Duration::from_millis(50);

/// The usage side of a recording. Each part owns its state: the windows
/// (and the probes they attach), the threads' CPU, the file I/O, the lock
/// sites and wait counters, the stacks BPF took, the pipeline's node paths,
/// the op spans and the wait stacks handed to the sampler; this facade
/// passes each the others it reads, in one direction.
pub struct Usage<'a, 'obj> {
    bpf: &'a Bpf<'obj>,
    /// Probes attached for the whole recording (thread exit, file I/O).
    links: Vec<Link>,
    windows: Windows<'a, 'obj>,
    threads: ThreadCpu,
    files: FileTracker<'a>,
    waits: WaitTotals,
    attr: AttrEvidence,
    nodes: Nodes,
    stacks: Stacks<'a, 'obj>,
    /// Sampled waits' stack copies, handed to the stack sampler.
    wait_stacks: Option<WaitStacks<'a>>,
    spans: Option<SpanTrace<'a>>,
}

/// Debugging and cost measurement aid: PLUMBER_PROBE_SKIP=a,b leaves out
/// probes by name (sched_switch, syscalls, exit, mutex, gil, record_stop,
/// symbolize).
struct Skip(String);

impl Skip {
    fn from_env() -> Self {
        Skip(std::env::var("PLUMBER_PROBE_SKIP").unwrap_or_default())
    }

    fn has(&self, name: &str) -> bool {
        self.0.split(',').any(|s| s == name)
    }
}

/// The lock and GIL slow paths found in the target, less those skipped.
fn wait_points(target: &Target, derived: &Derived, skip: &Skip) -> Vec<WaitPoint> {
    let mut wait_points: Vec<WaitPoint> = Vec::new();
    if let Some(p) = &derived.mutex_slow {
        wait_points.push((WaitProbe::Mutex, p.clone(), "absl::Mutex::LockSlow"));
    }
    match derive::gil_probe(target) {
        Some((p, name)) => wait_points.push((WaitProbe::Gil, p, name)),
        None => {
            warn!("no CPython GIL function found in the target: GIL waits are not measured")
        }
    }
    wait_points.retain(|(kind, _, _)| {
        !skip.has(match kind {
            WaitProbe::Mutex => "mutex",
            WaitProbe::Gil => "gil",
        })
    });
    wait_points
}

impl<'a, 'obj> Usage<'a, 'obj> {
    /// Attaches the tracepoints and slow-path probes. A probe that cannot
    /// be attached is reported and left out; the recording goes on.
    pub fn start(
        bpf: &'a Bpf<'obj>,
        target: &Target,
        derived: &Derived,
        mode: Attribution,
        duration: Option<Duration>,
    ) -> Result<Self> {
        let skip = Skip::from_env();
        let mut links = Vec::new();
        if !skip.has("exit") {
            links.push(bpf.attach_exit_hook()?);
        }
        if !skip.has("syscalls") {
            links.extend(fileio::attach(bpf, target)?);
        }
        let wait_points = wait_points(target, derived, &skip);
        if derived.record_stop.is_none() {
            warn!("model::Node::record_stop not found: CPU cannot be attributed to ops");
        }
        let threads = ThreadCpu::new(target, derived);
        let record_stop: Option<ProbePoint> = if skip.has("record_stop") {
            None
        } else {
            derived.record_stop.clone()
        };
        let files = FileTracker::start(bpf, target.pid)?;
        let windows = Windows::start(
            bpf,
            mode,
            record_stop,
            WaitProbes::new(bpf, wait_points),
            skip.has("sched_switch"),
            duration,
        );
        Ok(Usage {
            bpf,
            links,
            windows,
            threads,
            files,
            waits: WaitTotals::default(),
            attr: AttrEvidence::default(),
            nodes: Nodes::default(),
            stacks: Stacks::new(bpf, target.pid, skip.has("symbolize")),
            wait_stacks: None,
            spans: None,
        })
    }

    /// Opens and closes attribution windows and hands stack copies over;
    /// returns how soon it must run again (None: nothing scheduled).
    pub fn tick(&mut self) -> Option<Duration> {
        let next = self.windows.tick();
        // A window part may have just moved on: hand the stack copies in
        // the rings over now, not at the next poll, so that the next part
        // finds room; and while a part is open, every FORWARD_EVERY. An
        // attribution part's block copies filled their ring's 256 within
        // its 250 ms (a pipeline's threads each send one every 20 ms), and
        // the blocks of its end were lost: a sample leaning to the blocks
        // that come first. The lock and GIL copies have a ring of their
        // own (bpf/probe.bpf.c).
        if let Some(w) = &mut self.wait_stacks {
            w.forward();
            if self.windows.is_open() {
                return Some(next.map_or(FORWARD_EVERY, |n| n.min(FORWARD_EVERY)));
            }
        }
        next
    }

    /// A node that died (RemoveNode): its path, from its parent's, names
    /// the spans and the evidence it left (see `Nodes::learn_retired`).
    pub fn learn_retired(&mut self, node: Instance, parent: Instance, name: &str) {
        self.nodes.learn_retired(node, parent, name);
    }

    /// Learns the pipeline's node addresses and op classes from a poll.
    pub fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        self.nodes.learn(nodes);
    }

    /// Sends the stacks of sampled lock and GIL waits (copied in BPF) to
    /// `tx`, the stack sampler, from now on.
    pub fn send_wait_stacks(&mut self, tx: mpsc::Sender<Vec<RawSample>>) {
        if let Some(w) = WaitStacks::start(self.bpf, tx) {
            self.wait_stacks = Some(w);
        }
    }

    /// Opens no more attribution windows once the cost meter says so.
    pub fn obey(&mut self, thin: Thin) {
        self.windows.thin = thin;
    }

    /// Has record_stop send each stretch of work as a span, from now on.
    pub fn trace_spans(&mut self) {
        if let Some(t) = SpanTrace::start(self.bpf) {
            self.spans = Some(t);
        }
    }

    /// Emits the thread, attribution, I/O and lock-site events of one poll
    /// (call right after the poll, with its instant).
    pub fn on_poll(&mut self, sink: &mut EventSink, mono_ns: u64) -> Result<()> {
        let bpf_threads = self.push_threads(sink, mono_ns)?;
        if self.windows.start_clock() {
            self.tick();
        }
        self.files.process();
        let read_window_maps = self.windows.take_maps_stale();
        if read_window_maps {
            self.attr.read(self.bpf, &bpf_threads, &mut self.nodes)?;
        }
        if let Some(samples) = self.attr.due(read_window_maps, &self.nodes) {
            sink.push(Event::Attribution { mono_ns, samples })?;
        }
        if let Some(w) = &mut self.wait_stacks {
            w.forward();
        }
        self.drain_spans(false);
        self.files.on_poll(mono_ns);
        let sites = if read_window_maps {
            self.bpf.lock_sites()?
        } else {
            Vec::new()
        };
        self.waits.on_poll(mono_ns, sites);
        Ok(())
    }

    /// Emits the poll's `Threads` event; returns the BPF side's thread
    /// state it was read with.
    fn push_threads(&mut self, sink: &mut EventSink, mono_ns: u64) -> Result<BpfThreads> {
        // Threads first, at the poll's instant: the process CPU of the poll
        // was read just before, and the two must describe the same moment.
        // The first window opens after them: attaching its probes takes tens
        // of ms, and threads read after it would start the recording's
        // per-thread CPU later than the process CPU (measured: 1-2.6% short).
        let windows = &self.windows;
        let (threads, bpf_threads) = self
            .threads
            .observe(self.bpf, &mut self.waits, || windows.scales())?;
        sink.push(Event::Threads { mono_ns, threads })?;
        Ok(bpf_threads)
    }

    /// Names the spans sent since the last call (see `SpanTrace::drain`).
    fn drain_spans(&mut self, last: bool) {
        if let Some(t) = &mut self.spans {
            t.drain(last, &self.nodes, self.threads.names());
        }
    }

    /// Thread names, op classes and each thread's main op (the one its
    /// windows booked most CPU to), for the stack sampler's attribution.
    pub fn stack_context(&mut self) -> StackContext {
        let thread_ops = self.attr.main_ops(&self.nodes);
        let windows = &self.windows;
        let locks = self
            .waits
            .lock_stacks(&mut self.stacks, &self.nodes, || windows.scales());
        let wait_leaf = self.windows.wait_leaf();
        let io = self.files.io_stacks(&mut self.stacks, &self.nodes);
        self.drain_spans(true);
        let spans = self
            .spans
            .as_mut()
            .map(|t| t.take_kept())
            .unwrap_or_default();
        StackContext {
            names: self.threads.names().clone(),
            class_paths: self.nodes.class_paths().clone(),
            thread_ops,
            locks,
            io,
            wait_leaf,
            spans,
        }
    }

    /// Detaches everything, then emits the file I/O and lock sites (named
    /// now, after the window); returns the drops this side counted.
    pub fn finish(mut self, sink: &mut EventSink) -> Result<Vec<DropCount>> {
        self.windows.finish();
        let links = std::mem::take(&mut self.links);
        self.bpf.detach(links);
        if let Some(w) = &mut self.wait_stacks {
            w.forward();
        }
        self.files.process();
        self.files.discard_unpolled();
        self.files.emit(sink, &mut self.stacks, &self.nodes)?;
        let windows = &self.windows;
        self.waits
            .emit_sites(sink, &mut self.stacks, &self.nodes, || windows.scales())?;
        let attach_failures = self.windows.attach_failures();
        if attach_failures > 0 {
            info!(count = attach_failures, "some probes could not be attached");
        }
        let mut drops = vec![
            DropCount::new("malformed_io_records", self.files.malformed()),
            DropCount::new("usage_probes_not_attached", attach_failures),
        ];
        drops.extend(WaitStacks::drops(self.wait_stacks.as_ref()));
        drops.extend(SpanTrace::drops(self.spans.as_ref()));
        Ok(drops)
    }
}
