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

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Result;
use libbpf_rs::{Link, RingBuffer};
use plumber_collector::event::{
    AttributionSample, DropCount, Event, FileIo, LockSite, NodeObservation, ThreadObservation,
    WaitCounters,
};
use plumber_collector::opnames;
use tracing::{debug, info, warn};

use crate::bpf::sample::RawSample;
use crate::bpf::types::{self as bt, lock_kind, wait_kind_name, Waits};
use crate::bpf::{self, Bpf, IoEvent, SiteKey, WaitProbe};
use crate::derive::{self, Derived, ProbePoint};
use crate::frames::{getnext_class, is_wait_machinery, op_class_of_model, strip_params};
use crate::mem::Memory;
use crate::sink::EventSink;
use crate::symbolize::{AddrNames, UNKNOWN};
use crate::target::Target;
use crate::threads::{self, NameRegistry};

/// Attribution windows: `WINDOW` long, at the start of the recording and
/// then `Schedule::gap` apart. Not shorter: a pipeline that reads in bursts
/// needs each window to span a few of them (125 ms windows read a
/// parallel interleave 15% off the shim), and what a window costs the
/// target grows with its length (see `Schedule`), so the split's accuracy
/// is bought with the windows' total length either way.
const WINDOW: Duration = Duration::from_millis(250);
/// How long record_stop and sched_switch stay after a window's close, for
/// each thread's stretch in progress at the close to end in a stop that
/// names its node. A stretch longer than this is still cut off.
const TAIL: Duration = Duration::from_millis(50);
/// How long lock, condition and GIL waits are counted after each
/// attribution window.
const WAIT_WINDOW: Duration = Duration::from_millis(500);

/// When the attribution windows open. Each window costs the image pipeline
/// about 0.035-0.04 s of its throughput (bench/windows.py: ~5% while
/// record_stop is probed, ~4% while only the lock and GIL probes are, and
/// a slope back over the next half second), and that cost grows with the
/// time the probes are in, not with the number of attaches. So how many
/// windows come is what the default mode costs: three in 30 s were 0.4%
/// of the recording's throughput, two are 0.25%.
///
/// Windows are spread so that a recording gets at least `MIN_WINDOWS`
/// (the split is then not one moment's), but never closer than
/// `MIN_GAP` nor further apart than `MAX_GAP`, which bounds their cost at
/// one window per 15 s on long recordings. Two windows are what an 8 s
/// recording has always had, and what the e2e tests check the split
/// against the shim and the fixture with. Without a known duration
/// (until Ctrl-C) the second window comes `MIN_GAP` after the first, so a
/// short recording still has two, and the rest `MAX_GAP` apart. A window
/// due too close to the end to finish does not open (`fits`).
#[derive(Debug, Clone, Copy)]
struct Schedule {
    duration: Option<Duration>,
}

impl Schedule {
    const MIN_WINDOWS: u32 = 2;
    const MIN_GAP: Duration = Duration::from_secs(5);
    const MAX_GAP: Duration = Duration::from_secs(15);

    /// From the opening of window `opened` (1 = the first) to the next.
    fn gap(&self, opened: u32) -> Duration {
        match self.duration {
            Some(d) => (d / Self::MIN_WINDOWS).clamp(Self::MIN_GAP, Self::MAX_GAP),
            None if opened <= 1 => Self::MIN_GAP,
            None => Self::MAX_GAP,
        }
    }

    /// Whether a window opening `since_start` into the recording can book
    /// its attribution part and tail before the recording ends. One that
    /// cannot (a 30 s recording's third, due at 30 s) would cost the
    /// target its attaches for a split of a few ms; the first window
    /// always opens.
    fn fits(&self, since_start: Duration, opened: u32) -> bool {
        match self.duration {
            Some(d) if opened > 0 => since_start + WINDOW + TAIL <= d,
            _ => true,
        }
    }
}

/// The part of a window that is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// record_stop and sched_switch attached (and the wait probes, not
    /// counting).
    Attribution,
    /// The same probes, after the window's close: each thread's next stop
    /// books its stretch up to the close (`TAIL`).
    Tail,
    /// Only the wait probes, counting.
    Waits,
}

/// A lock or GIL slow path to probe.
type WaitPoint = (WaitProbe, ProbePoint, &'static str);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribution {
    /// Short windows (default): nothing stays on the target's hot path.
    Sampled,
    /// record_stop probed for the whole recording (precise, costs about a
    /// microsecond per op transition).
    Continuous,
}

/// An open file of the target.
struct OpenFile {
    path: String,
    /// Stacks that name its op: its open's and its first read's (glibc's
    /// open wrappers often break the frame-pointer chain).
    open_stack: i64,
    first_read_stack: i64,
    tid: u32,
    /// Bytes read since the open; None when it was open before we attached.
    session_bytes: Option<u64>,
    /// Whether its open was counted (once the op is known, or at close).
    open_counted: bool,
}

/// No stack (a file open before we attached).
const NO_STACK: i64 = i64::MIN;

/// The stacks that name the op of some file I/O, resolved to an op only
/// after the recording: symbolizing the 0.8 GB libtensorflow_cc takes a
/// second of CPU and much memory traffic, which must not land in the
/// recording window on the target's cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct OpStacks {
    /// The read's own stack (preferred).
    read: i64,
    /// The file's open (fallback).
    open: i64,
}

/// File I/O by (path, the stacks naming its op, tid).
type IoByStacks = BTreeMap<(String, OpStacks, u32), FileIo>;
/// A lock site's (waits, wait ns) since the previous poll.
type SiteDelta = (SiteKey, u64, u64);

/// Kernel pseudo-files (/proc, /sys, /dev) are not data I/O (the same
/// list as `is_pseudo_path` in probe.bpf.c, which filters new opens).
fn is_pseudo_file(path: &str) -> bool {
    ["/proc/", "/sys/", "/dev/"]
        .iter()
        .any(|p| path.starts_with(p))
}

struct StackInfo {
    /// Symbolized frames, innermost first.
    frames: Vec<String>,
    /// Op of the innermost GetNextInternal frame, if it names one op.
    op: String,
    /// The waiting function.
    site: String,
}

pub struct Usage<'a, 'obj> {
    bpf: &'a Bpf<'obj>,
    pid: i32,
    links: Vec<Link>,
    record_stop: Option<ProbePoint>,
    mode: Attribution,
    /// The open window's links (record_stop, sched_switch) and start.
    window: Option<(Vec<Link>, Instant)>,
    phase: Phase,
    /// Lock and GIL slow paths, and their (entry, return) links while
    /// attached.
    wait_points: Vec<WaitPoint>,
    wait_links: Vec<(Link, Link)>,
    /// Time wait phases have been open before the current one.
    waits_closed: Duration,
    /// When the recording started (its first poll), and how long windows
    /// have been open before the current one: blocks are timed in the
    /// windows only and scaled by the share of time observed. Windows wait
    /// for the first poll: before it, the discovery probe slows the target.
    started: Option<Instant>,
    windows_closed: Duration,
    /// sched_switch could not be attached (or is skipped).
    no_switch: bool,
    task_reader: threads::TaskReader,
    /// The open window's sched_switch link: a tracepoint, detached without
    /// the uprobes' warm-up.
    switch_link: Option<Link>,
    /// Stacks are left unnamed (PLUMBER_PROBE_SKIP=symbolize).
    no_symbolize: bool,
    last_window: Option<Instant>,
    /// Attribution windows opened so far (`Schedule::gap` depends on it).
    windows_opened: u32,
    schedule: Schedule,
    registry: Option<NameRegistry>,
    names: HashMap<u32, String>,
    io: Rc<RefCell<Vec<IoEvent>>>,
    io_bad: Rc<RefCell<u64>>,
    rb: RingBuffer<'a>,
    files: HashMap<i32, OpenFile>,
    io_acc: IoByStacks,
    /// Per poll (its instant), file I/O and lock-site deltas whose stacks
    /// are named after the recording.
    pending_io: Vec<(u64, IoByStacks)>,
    pending_sites: Vec<(u64, Vec<SiteDelta>)>,
    sizes: HashMap<String, Option<u64>>,
    /// Model node address -> op path, from every poll so far.
    node_path: HashMap<u64, String>,
    /// Normalized op class (`ParallelMap`) -> op paths of that class.
    class_paths: HashMap<String, HashSet<String>>,
    symbolizer: AddrNames,
    stacks: HashMap<i64, StackInfo>,
    sites_prev: HashMap<SiteKey, (u64, u64)>,
    attach_failures: u64,
    /// The attribution map as last read, tids in our namespace. It only
    /// changes while a window's probes are in (record_stop), and so does
    /// the lock-site map (waits count in windows only): between windows
    /// neither is read again. Scanning their 16,384 buckets key by key was
    /// a fifth of the probe's CPU at every poll.
    attr_latest: Vec<bpf::Attr>,
    /// A window's probes were in since the two maps were last read.
    window_maps_stale: bool,
    /// `node_path`'s size when the attribution was last sent: a path
    /// learned since names more of it.
    attr_sent_paths: Option<usize>,
    /// Per thread, the wait counters last emitted: see `emit_waits`.
    waits_emitted: HashMap<u32, WaitCounters>,
    /// Sampled waits' stack copies, handed to the stack sampler.
    wait_stacks: Option<WaitStacks<'a>>,
    spans: Option<SpanTrace<'a>>,
}

/// The ring buffer of sampled waits' stack copies and where they go: the
/// stack sampler's worker unwinds them with the libraries' .eh_frame, as it
/// does its own samples.
struct WaitStacks<'a> {
    rb: RingBuffer<'a>,
    buf: Rc<RefCell<Vec<RawSample>>>,
    malformed: Rc<RefCell<u64>>,
    tx: mpsc::Sender<Vec<RawSample>>,
    /// Copies the sampler was gone for.
    lost: u64,
}

/// Op spans sent by record_stop while the stack sampler runs (trace.json).
struct SpanTrace<'a> {
    rb: RingBuffer<'a>,
    buf: Rc<RefCell<Vec<bt::RawSpan>>>,
    malformed: Rc<RefCell<u64>>,
    /// Named at each poll, while the node's address still means it.
    kept: Vec<plumber_collector::stacks::Span>,
    /// Spans of nodes not known at the last poll: a node that died just
    /// after the poll read the RemoveNode events is named at the next.
    unnamed: Vec<bt::RawSpan>,
    /// Spans past `MAX_SPANS`.
    over_limit: u64,
    /// Spans of nodes neither a poll nor a RemoveNode event named.
    unknown_node: u64,
}

/// Spans kept for trace.json: about 30 attribution windows of the image
/// pipeline (a 2.5 min recording), some 30 MB of JSON.
const MAX_SPANS: usize = 200_000;

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
        // Debugging and cost measurement aid: PLUMBER_PROBE_SKIP=a,b leaves
        // out probes by name (sched_switch, syscalls, exit, mutex, gil,
        // record_stop, symbolize).
        let skip_list = std::env::var("PLUMBER_PROBE_SKIP").unwrap_or_default();
        let skip = |name: &str| skip_list.split(',').any(|s| s == name);
        let mut links = Vec::new();
        if !skip("exit") {
            links.push(bpf.attach_exit_hook()?);
        }
        if !skip("syscalls") {
            links.extend(attach_file_io(bpf, target)?);
        }
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
            !skip(match kind {
                WaitProbe::Mutex => "mutex",
                WaitProbe::Gil => "gil",
            })
        });
        if derived.record_stop.is_none() {
            warn!("model::Node::record_stop not found: CPU cannot be attributed to ops");
        }
        let registry = derived.thread_registry.and_then(|vaddr| {
            let base = threads::load_base(target.pid, &target.framework.path)?;
            Some(NameRegistry::new(Memory::new(target.pid), base + vaddr))
        });
        let record_stop = if skip("record_stop") {
            None
        } else {
            derived.record_stop.clone()
        };
        let io = Rc::new(RefCell::new(Vec::new()));
        let io_bad = Rc::new(RefCell::new(0u64));
        let rb = bpf.io_reader(io.clone(), io_bad.clone())?;
        let mut u = Usage {
            bpf,
            pid: target.pid,
            links,
            record_stop,
            mode,
            window: None,
            phase: Phase::Attribution,
            wait_points,
            wait_links: Vec::new(),
            waits_closed: Duration::ZERO,
            started: None,
            windows_closed: Duration::ZERO,
            no_switch: skip("sched_switch"),
            task_reader: threads::TaskReader::new(target.pid),
            switch_link: None,
            no_symbolize: skip("symbolize"),
            last_window: None,
            windows_opened: 0,
            schedule: Schedule { duration },
            registry,
            names: HashMap::new(),
            io,
            io_bad,
            rb,
            files: HashMap::new(),
            io_acc: BTreeMap::new(),
            pending_io: Vec::new(),
            pending_sites: Vec::new(),
            sizes: HashMap::new(),
            node_path: HashMap::new(),
            class_paths: HashMap::new(),
            symbolizer: AddrNames::new(target.pid),
            stacks: HashMap::new(),
            sites_prev: HashMap::new(),
            attach_failures: 0,
            attr_latest: Vec::new(),
            window_maps_stale: true,
            attr_sent_paths: None,
            waits_emitted: HashMap::new(),
            wait_stacks: None,
            spans: None,
        };
        u.track_open_files();
        if mode == Attribution::Continuous {
            u.attach_waits();
            u.count_waits(true);
            u.open_window();
        }
        Ok(u)
    }

    /// Regular files the target has open already: their reads count too.
    fn track_open_files(&mut self) {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", self.pid)) else {
            return;
        };
        for e in dir.flatten() {
            let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            // metadata() follows the fd link to the file itself.
            let is_file = std::fs::metadata(e.path()).is_ok_and(|m| m.is_file());
            let Ok(path) = std::fs::read_link(e.path()) else {
                continue;
            };
            let path = path.to_string_lossy().into_owned();
            if !is_file || is_pseudo_file(&path) {
                continue;
            }
            if let Err(err) = self.bpf.track_fd(fd as u32) {
                debug!("not following fd {fd}: {err}");
                continue;
            }
            self.files.insert(
                fd,
                OpenFile {
                    path,
                    open_stack: NO_STACK,
                    first_read_stack: NO_STACK,
                    tid: 0,
                    session_bytes: None,
                    // Opened before the recording: not an open of ours.
                    open_counted: true,
                },
            );
        }
    }

    fn open_window(&mut self) {
        self.last_window = Some(Instant::now());
        self.windows_opened += 1;
        self.window_maps_stale = true;
        if let Err(e) = self.bpf.window_pending() {
            warn!("attribution window not started: {e}");
            return;
        }
        // One warm-up for all the window's uprobes (see Bpf::quietly).
        let bpf = self.bpf;
        let links = bpf.quietly(|| {
            // Before sched_switch: a block inside a slow path is not a
            // condition wait, and only these probes can tell.
            if self.mode == Attribution::Sampled {
                self.attach_waits();
            }
            if !self.no_switch {
                match bpf.attach_switch() {
                    Ok(l) => self.switch_link = Some(l),
                    Err(e) => {
                        warn!("no condition-wait timing or attribution: {e}");
                        self.attach_failures += 1;
                        // Do not retry every window.
                        self.no_switch = true;
                    }
                }
            }
            let mut links = Vec::new();
            if let Some(p) = &self.record_stop {
                match bpf.attach_record_stop(&p.lib, p.file_offset) {
                    Ok(l) => links.push(l),
                    Err(e) => {
                        warn!("no attribution of CPU to ops: {e}");
                        self.attach_failures += 1;
                        self.record_stop = None;
                    }
                }
            }
            links
        });
        // Only now: a stop seen while record_stop was still being attached
        // may end a stretch that other, unseen stops cut.
        if let Err(e) = self.bpf.window_open(crate::clock::now_ns().0) {
            warn!("attribution window not opened: {e}");
        }
        self.window = Some((links, Instant::now()));
        self.phase = Phase::Attribution;
        // bench/windows.py lines the target's throughput up on these.
        debug!(phase = "attribution", "window part opened");
    }

    /// Attaches the lock and GIL probes (a probe that fails is reported
    /// once and left out from then on).
    fn attach_waits(&mut self) {
        if self.wait_points.is_empty() {
            return;
        }
        if let Err(e) = self.bpf.settle_waits() {
            warn!("lock and GIL waits not measured: {e}");
            self.wait_points.clear();
            return;
        }
        let mut failed = Vec::new();
        for (i, (kind, p, name)) in self.wait_points.iter().enumerate() {
            match self.bpf.attach_wait(*kind, &p.lib, p.file_offset) {
                Ok(pair) => {
                    debug!(probe = name, "attached");
                    self.wait_links.push(pair);
                }
                Err(e) => {
                    warn!("{name} not probed: {e}");
                    self.attach_failures += 1;
                    failed.push(i);
                }
            }
        }
        for i in failed.into_iter().rev() {
            self.wait_points.remove(i);
        }
        if let Err(e) = self.bpf.waits_attached() {
            warn!("lock and GIL probes: {e}");
        }
    }

    /// Detaches the lock and GIL probes. Probes attach one by one and
    /// detach in no set order, so meanwhile entries are seen without their
    /// returns or the reverse: the BPF side is told first not to count
    /// those as lost (and forgets them at the next attach); `attach_waits`
    /// does the same.
    fn detach_waits(&mut self) {
        let links = self.take_wait_links();
        self.bpf.detach(links);
    }

    /// The lock and GIL probes' links, to detach, the BPF side told.
    fn take_wait_links(&mut self) -> Vec<Link> {
        if self.wait_links.is_empty() {
            return Vec::new();
        }
        if let Err(e) = self.bpf.settle_waits() {
            warn!("lock and GIL probes: {e}");
        }
        std::mem::take(&mut self.wait_links)
            .into_iter()
            .flat_map(|(enter, exit)| [exit, enter])
            .collect()
    }

    fn count_waits(&mut self, on: bool) {
        if let Err(e) = self.bpf.set_count_waits(on) {
            warn!("lock and GIL waits not counted: {e}");
            self.attach_failures += 1;
        }
    }

    /// Closes the open window's current part, and opens the next one when
    /// `then_waits`: attribution, its tail, then waits. Without it (the
    /// recording ends) the window closes for good, without a tail.
    fn close_window_part(&mut self, then_waits: bool) {
        let Some((links, since)) = self.window.take() else {
            return;
        };
        let bpf = self.bpf;
        match self.phase {
            Phase::Attribution | Phase::Tail => {
                if self.phase == Phase::Attribution {
                    self.windows_closed += since.elapsed();
                    if let Err(e) = bpf.window_close(crate::clock::now_ns().0) {
                        warn!("attribution window not closed: {e}");
                    }
                    if then_waits {
                        self.window = Some((links, Instant::now()));
                        self.phase = Phase::Tail;
                        debug!(phase = "tail", "window part opened");
                        return;
                    }
                }
                let waits_next = then_waits && !self.wait_links.is_empty();
                // All at once (Bpf::detach): a close waits for grace
                // periods after its unregistration, and sched_switch
                // closed after record_stop would stay that long.
                let mut links = links;
                links.extend(self.switch_link.take());
                if !waits_next {
                    links.extend(self.take_wait_links());
                }
                bpf.detach(links);
                if waits_next {
                    self.count_waits(true);
                    self.window = Some((Vec::new(), Instant::now()));
                    self.phase = Phase::Waits;
                    debug!(phase = "waits", "window part opened");
                    return;
                }
            }
            Phase::Waits => {
                // Counted until the probes go, after the warm-up: the
                // part was closed `detach_lead` early for that.
                bpf.quietly(|| {
                    self.count_waits(false);
                    self.waits_closed += since.elapsed();
                    self.detach_waits();
                });
            }
        }
        debug!("window closed");
    }

    /// Closes the open window, whichever part (detaching its probes).
    fn close_window(&mut self) {
        if self.mode == Attribution::Continuous {
            if let Some((links, since)) = self.window.take() {
                self.windows_closed += since.elapsed();
                self.waits_closed += since.elapsed();
                drop(self.switch_link.take());
                self.bpf.detach(links);
            }
            self.detach_waits();
            return;
        }
        self.close_window_part(false);
        self.close_window_part(false);
    }

    /// What a lock site's counts are multiplied by: call sites are sampled
    /// (PP_WAIT_SAMPLE, PP_BLOCK_SAMPLE), and blocks are timed in the
    /// windows only.
    fn site_scale(&self, kind: u32) -> f64 {
        if kind as usize == bt::WAIT_BLOCK {
            bt::BLOCK_SAMPLE as f64 * self.block_scale()
        } else {
            bt::WAIT_SAMPLE as f64 * self.wait_scale()
        }
    }

    /// Lock, condition and GIL slow paths count in the wait parts of the
    /// windows only: the factor that scales them to the recording so far.
    fn wait_scale(&self) -> f64 {
        self.observed_scale(Phase::Waits)
    }

    /// Blocks are timed in the attribution parts of the windows only: the
    /// factor that scales them to the whole recording so far, from the time
    /// actually observed (a 6 s recording has 2 windows, not 1.2).
    fn block_scale(&self) -> f64 {
        self.observed_scale(Phase::Attribution)
    }

    /// The recording's time so far over the time `phase` was open, at
    /// least 1 (1 when attribution is continuous or nothing was observed).
    fn observed_scale(&self, phase: Phase) -> f64 {
        if self.mode == Attribution::Continuous {
            return 1.0;
        }
        let open = match &self.window {
            Some((_, t)) if self.phase == phase => t.elapsed(),
            _ => Duration::ZERO,
        };
        let closed = match phase {
            Phase::Attribution | Phase::Tail => self.windows_closed,
            Phase::Waits => self.waits_closed,
        };
        let observed = (closed + open).as_secs_f64();
        match self.started {
            Some(t) if observed > 0.0 => (t.elapsed().as_secs_f64() / observed).max(1.0),
            _ => 1.0,
        }
    }

    /// Opens and closes attribution windows; returns how soon it must run
    /// again (None: nothing scheduled).
    pub fn tick(&mut self) -> Option<Duration> {
        if self.mode == Attribution::Continuous || self.started.is_none() {
            return None;
        }
        let due = |since: Instant, after: Duration| after.checked_sub(since.elapsed());
        match (&self.window, self.phase) {
            (Some((_, since)), Phase::Attribution) => match due(*since, WINDOW) {
                Some(left) => return Some(left),
                None => self.close_window_part(true),
            },
            (Some((_, since)), Phase::Tail) => match due(*since, self.tail_close_after()) {
                Some(left) => return Some(left),
                None => self.close_window_part(true),
            },
            (Some((_, since)), Phase::Waits) => match due(*since, self.waits_close_after()) {
                Some(left) => return Some(left),
                None => self.close_window_part(false),
            },
            (None, _) => match self.next_window_in() {
                Some(left) => return Some(left),
                None if !self.window_fits_now() => return None,
                None => self.open_window(),
            },
        }
        // Something just opened or closed: what is due next.
        match (&self.window, self.phase) {
            (Some(_), Phase::Attribution) => Some(WINDOW),
            (Some(_), Phase::Tail) => Some(self.tail_close_after()),
            (Some(_), Phase::Waits) => Some(self.waits_close_after()),
            (None, _) => self.next_window_in(),
        }
    }

    /// When, after the waits part opened, its close starts: early by the
    /// time the detach's warm-up is expected to take (`Bpf::detach_lead`),
    /// so that the lock and GIL probes are gone at `WAIT_WINDOW`, not that
    /// much after it. The waits count until the probes go, so the part is
    /// as long either way.
    fn waits_close_after(&self) -> Duration {
        WAIT_WINDOW.saturating_sub(self.bpf.detach_lead())
    }

    /// The same for the tail, but never before half of it: its stretches
    /// are booked up to the close whenever they end, and a warm-up quicker
    /// than the last would leave record_stop too little time to see them.
    fn tail_close_after(&self) -> Duration {
        TAIL.saturating_sub(self.bpf.detach_lead()).max(TAIL / 2)
    }

    /// How long until the next attribution window opens; None when it is
    /// due now (or none has opened yet: the first opens at once).
    fn next_window_in(&self) -> Option<Duration> {
        let gap = self.schedule.gap(self.windows_opened);
        self.last_window.and_then(|t| gap.checked_sub(t.elapsed()))
    }

    /// Whether a window opening now still fits in the recording
    /// (`Schedule::fits`).
    fn window_fits_now(&self) -> bool {
        self.started
            .is_none_or(|started| self.schedule.fits(started.elapsed(), self.windows_opened))
    }

    /// A node that died between two polls (RemoveNode): its path, from
    /// its parent's, names the spans it left. A parent no poll saw either
    /// (interleave's per-file inputs) leaves its spans unnamed, counted in
    /// `spans_of_unknown_nodes`.
    pub fn learn_retired(&mut self, node: u64, parent: u64, name: &str) {
        if let Some(pp) = self.node_path.get(&parent) {
            let path = format!("{pp}::{name}");
            self.node_path.insert(node, path);
        }
    }

    /// Learns the pipeline's node addresses and op classes from a poll.
    pub fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        for n in nodes {
            self.node_path.insert(n.addr, n.path.clone());
            let class = op_class_of_model(&n.name);
            self.class_paths
                .entry(class)
                .or_default()
                .insert(n.path.clone());
        }
    }

    /// Op and call site of a user stack.
    fn stack_info(&mut self, id: i64) -> &StackInfo {
        if !self.stacks.contains_key(&id) {
            let info = self.resolve_stack(id);
            self.stacks.insert(id, info);
        }
        self.stacks.entry(id).or_insert_with(|| StackInfo {
            frames: Vec::new(),
            op: String::new(),
            site: UNKNOWN.into(),
        })
    }

    fn resolve_stack(&self, id: i64) -> StackInfo {
        let names = if self.no_symbolize {
            Vec::new()
        } else {
            self.symbolize(&self.bpf.stack(id))
        };
        let op = names
            .iter()
            .find_map(|n| getnext_class(n))
            .and_then(|class| {
                let paths = self.class_paths.get(&class)?;
                (paths.len() == 1)
                    .then(|| paths.iter().next().cloned())
                    .flatten()
            })
            .unwrap_or_default();
        let site = names
            .iter()
            .find(|n| !is_wait_machinery(n))
            .map(|n| strip_params(n))
            .unwrap_or_else(|| UNKNOWN.into());
        StackInfo {
            frames: names,
            op,
            site,
        }
    }

    fn symbolize(&self, addrs: &[u64]) -> Vec<String> {
        if addrs.is_empty() {
            return Vec::new();
        }
        match self.symbolizer.user(addrs) {
            Ok(names) => names,
            Err(e) => {
                debug!("symbolizing a stack: {e}");
                Vec::new()
            }
        }
    }

    /// Sends the stacks of sampled lock and GIL waits (copied in BPF) to
    /// `tx`, the stack sampler, from now on.
    pub fn send_wait_stacks(&mut self, tx: mpsc::Sender<Vec<RawSample>>) {
        let buf = Rc::new(RefCell::new(Vec::new()));
        let malformed = Rc::new(RefCell::new(0u64));
        let rb = match self.bpf.wait_sample_reader(buf.clone(), malformed.clone()) {
            Ok(rb) => rb,
            Err(e) => {
                warn!("lock and GIL wait stacks stay frame-pointer walks: {e}");
                return;
            }
        };
        if let Err(e) = self.bpf.set_copy_wait_stacks(true) {
            warn!("lock and GIL wait stacks stay frame-pointer walks: {e}");
            return;
        }
        self.wait_stacks = Some(WaitStacks {
            rb,
            buf,
            malformed,
            tx,
            lost: 0,
        });
    }

    /// Has record_stop send each stretch of work as a span, from now on.
    pub fn trace_spans(&mut self) {
        let buf = Rc::new(RefCell::new(Vec::new()));
        let malformed = Rc::new(RefCell::new(0u64));
        let rb = match self.bpf.span_reader(buf.clone(), malformed.clone()) {
            Ok(rb) => rb,
            Err(e) => {
                warn!("trace.json will have no op spans: {e}");
                return;
            }
        };
        if let Err(e) = self.bpf.set_trace_spans(true) {
            warn!("trace.json will have no op spans: {e}");
            return;
        }
        self.spans = Some(SpanTrace {
            rb,
            buf,
            malformed,
            kept: Vec::new(),
            unnamed: Vec::new(),
            over_limit: 0,
            unknown_node: 0,
        });
    }

    /// Reads the spans sent since the last call and names their ops from
    /// the nodes known now (a node's address may be reused later). Spans
    /// of unknown nodes wait for the next call, unless `last`.
    fn drain_spans(&mut self, last: bool) {
        let Some(t) = &mut self.spans else {
            return;
        };
        bpf::drain(&t.rb);
        let retry = std::mem::take(&mut t.unnamed);
        let retried = retry.len();
        let mut buf = t.buf.borrow_mut();
        for (i, sp) in retry.into_iter().chain(buf.drain(..)).enumerate() {
            if t.kept.len() >= MAX_SPANS {
                t.over_limit += 1;
                continue;
            }
            let Some(path) = self.node_path.get(&sp.node) else {
                if i < retried || last {
                    t.unknown_node += 1;
                } else {
                    t.unnamed.push(sp);
                }
                continue;
            };
            t.kept.push(plumber_collector::stacks::Span {
                tid: sp.ns_tid,
                thread_name: self.names.get(&sp.ns_tid).cloned().unwrap_or_default(),
                op_path: path.clone(),
                op_name: opnames::model_name_of_path(path).to_string(),
                start_ns: sp.start_ns,
                end_ns: sp.end_ns,
            });
        }
    }

    fn forward_wait_stacks(&mut self) {
        let Some(w) = &mut self.wait_stacks else {
            return;
        };
        bpf::drain(&w.rb);
        let batch: Vec<RawSample> = w.buf.borrow_mut().drain(..).collect();
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        if w.tx.send(batch).is_err() {
            w.lost += n;
        }
    }

    fn file_size(&mut self, path: &str) -> Option<u64> {
        let pid = self.pid;
        *self.sizes.entry(path.to_string()).or_insert_with(|| {
            std::fs::metadata(format!("/proc/{pid}/root{path}"))
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len())
        })
    }

    fn process_io(&mut self) {
        bpf::drain(&self.rb);
        let events: Vec<IoEvent> = self.io.borrow_mut().drain(..).collect();
        for e in events {
            match e.kind {
                bt::IO_OPEN => {
                    // Pseudo-files never get here (BPF drops them at the
                    // open). A session still under this fd lost its close:
                    // it is replaced, never counted as complete.
                    self.files.insert(
                        e.fd,
                        OpenFile {
                            path: e.path,
                            open_stack: e.stack_id,
                            first_read_stack: NO_STACK,
                            tid: e.ns_tid,
                            session_bytes: Some(0),
                            open_counted: false,
                        },
                    );
                }
                bt::IO_READ => {
                    let bytes = e.ret.max(0) as u64;
                    let Some(f) = self.files.get_mut(&e.fd) else {
                        // Untracked in the meantime (a pseudo-file).
                        continue;
                    };
                    if let Some(b) = &mut f.session_bytes {
                        *b += bytes;
                    }
                    if f.first_read_stack == NO_STACK {
                        f.first_read_stack = e.stack_id;
                    }
                    let stacks = OpStacks {
                        read: e.stack_id,
                        open: f.open_stack,
                    };
                    let (path, first) = (f.path.clone(), !f.open_counted);
                    let opener = f.tid;
                    f.open_counted = true;
                    if first {
                        self.acc(&path, stacks, opener).opens += 1;
                    }
                    let size = self.file_size(&path);
                    let a = self.acc(&path, stacks, e.ns_tid);
                    a.reads += 1;
                    a.bytes_read += bytes;
                    a.read_ns += e.dur_ns;
                    a.size = size;
                }
                bt::IO_CLOSE => {
                    let Some(f) = self.files.remove(&e.fd) else {
                        continue;
                    };
                    if f.open_counted && f.session_bytes.is_none() {
                        // Opened before we attached and not read since.
                        continue;
                    }
                    let size = self.file_size(&f.path);
                    let stacks = OpStacks {
                        read: f.first_read_stack,
                        open: f.open_stack,
                    };
                    let a = self.acc(&f.path, stacks, e.ns_tid);
                    a.size = size;
                    if !f.open_counted {
                        a.opens += 1;
                    }
                    if let Some(b) = f.session_bytes {
                        a.complete_sessions += 1;
                        a.complete_bytes += b;
                    }
                }
                _ => *self.io_bad.borrow_mut() += 1,
            }
        }
    }

    fn acc(&mut self, path: &str, stacks: OpStacks, tid: u32) -> &mut FileIo {
        self.io_acc
            .entry((path.to_string(), stacks, tid))
            .or_insert_with(|| FileIo {
                path: path.to_string(),
                tid,
                ..Default::default()
            })
    }

    /// The op a stack names, or empty.
    fn stack_op(&mut self, id: i64) -> String {
        if id == NO_STACK {
            return String::new();
        }
        self.stack_info(id).op.clone()
    }

    /// Names the stacks of the recording's file I/O and lock sites and
    /// emits them as `Io` and `LockSites` events at their polls' instants.
    fn emit_deferred(&mut self, sink: &mut EventSink) -> Result<()> {
        for (mono_ns, acc) in std::mem::take(&mut self.pending_io) {
            let mut by_op: BTreeMap<(String, String, u32), FileIo> = BTreeMap::new();
            for ((path, stacks, tid), f) in acc {
                let mut op = self.stack_op(stacks.read);
                if op.is_empty() {
                    op = self.stack_op(stacks.open);
                }
                let e = by_op
                    .entry((path.clone(), op.clone(), tid))
                    .or_insert_with(|| FileIo {
                        path,
                        op_path: op,
                        tid,
                        ..Default::default()
                    });
                e.bytes_read += f.bytes_read;
                e.reads += f.reads;
                e.opens += f.opens;
                e.read_ns += f.read_ns;
                e.complete_sessions += f.complete_sessions;
                e.complete_bytes += f.complete_bytes;
                e.size = e.size.or(f.size);
            }
            let files: Vec<FileIo> = by_op
                .into_values()
                .filter(|f| f.reads > 0 || f.complete_sessions > 0 || !f.op_path.is_empty())
                .collect();
            sink.push(Event::Io { mono_ns, files })?;
        }
        for (mono_ns, deltas) in std::mem::take(&mut self.pending_sites) {
            let mut sites = Vec::new();
            for (key, waits, ns) in deltas {
                let scale = self.site_scale(key.kind);
                let info = self.stack_info(key.stack_id);
                sites.push(LockSite {
                    kind: wait_kind_name(key.kind).to_string(),
                    site: info.site.clone(),
                    op_path: info.op.clone(),
                    tid: key.ns_tid,
                    waits: scale_u64(waits, scale),
                    wait_ns: scale_u64(ns, scale),
                });
            }
            sink.push(Event::LockSites { mono_ns, sites })?;
        }
        Ok(())
    }

    /// Emits the thread, attribution, I/O and lock-site events of one poll
    /// (call right after the poll, with its instant).
    pub fn on_poll(&mut self, sink: &mut EventSink, mono_ns: u64) -> Result<()> {
        // Threads first, at the poll's instant: the process CPU of the poll
        // was read just before, and the two must describe the same moment.
        // The first window opens after them: attaching its probes takes tens
        // of ms, and threads read after it would start the recording's
        // per-thread CPU later than the process CPU (measured: 1-2.6% short).
        let tasks = self.task_reader.read();
        let bpf_threads = self.bpf.threads()?;
        if let Some(reg) = &mut self.registry {
            let by_inner = reg.names(&tasks);
            for t in &tasks {
                if let Some(n) = by_inner.get(&t.inner_tid) {
                    self.names.insert(t.tid, n.clone());
                }
            }
        }
        for t in &tasks {
            self.names.entry(t.tid).or_insert_with(|| t.comm.clone());
        }
        // BPF keys are global tids; ns_tid is ours (0 until the thread was
        // seen running as itself, when it equals the global one outside
        // containers).
        let ns_of = |key: u32, st: &bpf::ThreadState| if st.ns_tid != 0 { st.ns_tid } else { key };
        let by_tid: HashMap<u32, (u32, bpf::ThreadState)> = bpf_threads
            .iter()
            .map(|(k, st)| (ns_of(*k, st), (*k, *st)))
            .collect();
        let block_scale = self.block_scale();
        let wait_scale = self.wait_scale();
        let mut observed = Vec::new();
        let live: HashSet<u32> = tasks.iter().map(|t| t.tid).collect();
        for t in &tasks {
            let st = by_tid.get(&t.tid).map(|(_, s)| *s).unwrap_or_default();
            observed.push(ThreadObservation {
                tid: t.tid,
                name: self.names.get(&t.tid).cloned().unwrap_or_default(),
                cpu_ns: t.cpu_ns.max(st.cpu_ns),
                waits: self.emit_waits(t.tid, wait_counters(&st.waits, block_scale, wait_scale)),
                exited: false,
            });
        }
        for (tid, (key, st)) in &by_tid {
            if live.contains(tid) {
                continue;
            }
            // Exited (or exiting) threads: final values from BPF.
            observed.push(ThreadObservation {
                tid: *tid,
                name: self.names.get(tid).cloned().unwrap_or_default(),
                cpu_ns: st.cpu_ns,
                waits: self.emit_waits(*tid, wait_counters(&st.waits, block_scale, wait_scale)),
                exited: true,
            });
            if st.exited {
                self.bpf.forget_thread(*key);
                self.waits_emitted.remove(tid);
            }
        }
        sink.push(Event::Threads {
            mono_ns,
            threads: observed,
        })?;
        if self.started.is_none() {
            self.started = Some(Instant::now());
            self.tick();
        }
        self.process_io();

        // Read while a window is open, and once after it closed; the
        // flag is set again when the next one opens.
        let read_window_maps = self.window_maps_stale;
        self.window_maps_stale = self.window.is_some() || self.mode == Attribution::Continuous;
        if read_window_maps {
            let key_to_tid: HashMap<u32, u32> = bpf_threads
                .iter()
                .map(|(k, st)| (*k, ns_of(*k, st)))
                .collect();
            self.attr_latest = self.bpf.attribution()?;
            for a in &mut self.attr_latest {
                a.tid = key_to_tid.get(&a.tid).copied().unwrap_or(a.tid);
            }
        }
        // Cumulative: sent again only when it or the paths that name it
        // changed.
        if read_window_maps || self.attr_sent_paths != Some(self.node_path.len()) {
            self.attr_sent_paths = Some(self.node_path.len());
            let samples = self.attribution_samples();
            if !samples.is_empty() {
                sink.push(Event::Attribution { mono_ns, samples })?;
            }
        }

        self.forward_wait_stacks();
        self.drain_spans(false);
        let io = std::mem::take(&mut self.io_acc);
        self.pending_io.push((mono_ns, io));
        let mut deltas = Vec::new();
        let sites = if read_window_maps {
            self.bpf.lock_sites()?
        } else {
            Vec::new()
        };
        for (key, (waits, ns)) in sites {
            let (w0, n0) = self.sites_prev.insert(key, (waits, ns)).unwrap_or((0, 0));
            if waits > w0 {
                deltas.push((key, waits - w0, ns.saturating_sub(n0)));
            }
        }
        self.pending_sites.push((mono_ns, deltas));
        Ok(())
    }

    /// A thread's scaled wait counters as emitted: never below the last
    /// ones. The scales move both ways (the recording's time over the
    /// time observed, which grows fastest while a window is open), so a
    /// counter scaled at one poll can come out below the same counter
    /// scaled at the poll before; counters are cumulative, and a reader
    /// takes a decrease for a broken counter.
    fn emit_waits(&mut self, tid: u32, now: WaitCounters) -> WaitCounters {
        let out = match self.waits_emitted.get(&tid) {
            Some(prev) => prev.max_each(&now),
            None => now,
        };
        self.waits_emitted.insert(tid, out);
        out
    }

    /// The attribution evidence as last read, its nodes named by the
    /// paths known now.
    fn attribution_samples(&self) -> Vec<AttributionSample> {
        self.attr_latest
            .iter()
            .map(|a| AttributionSample {
                tid: a.tid,
                node: a.node,
                op_path: self.node_path.get(&a.node).cloned().unwrap_or_default(),
                cpu_ns: a.cpu_ns,
                // Ratios within the windows: nothing to scale.
                waits: wait_counters(&a.waits, 1.0, 1.0),
                io_bytes: a.io_bytes,
                stops: a.stops,
            })
            .collect()
    }

    /// Thread names, op classes and each thread's main op (the one its
    /// windows booked most CPU to), for the stack sampler's attribution.
    pub fn stack_context(&mut self) -> crate::sampler::StackContext {
        let mut op_cpu: HashMap<u32, HashMap<String, u64>> = HashMap::new();
        for a in self.attribution_samples() {
            if !a.op_path.is_empty() {
                *op_cpu
                    .entry(a.tid)
                    .or_default()
                    .entry(a.op_path)
                    .or_default() += a.cpu_ns.max(1);
            }
        }
        let thread_ops = op_cpu
            .iter()
            .filter_map(|(tid, ops)| {
                let (path, _) = ops.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
                Some((*tid, path.clone()))
            })
            .collect();
        // Lock waits by site, since attach, with the frame-pointer stacks
        // BPF took at the wait: a first version of locks.folded (glibc has
        // no frame pointers, so these stacks can be short).
        let sites: Vec<(SiteKey, u64)> = self
            .sites_prev
            .iter()
            .filter(|(_, (_, ns))| *ns > 0)
            .map(|(key, (_, ns))| (*key, *ns))
            .collect();
        let locks = sites
            .into_iter()
            .map(|(key, ns)| {
                let scale = self.site_scale(key.kind);
                let mut frames = self.stack_info(key.stack_id).frames.clone();
                frames.reverse();
                crate::sampler::LockStack {
                    tid: key.ns_tid,
                    wait_kind: key.kind,
                    kind: lock_kind(key.kind),
                    frames,
                    ns: scale_u64(ns, scale),
                }
            })
            .collect();
        // The unwound stacks of the sampled waits start at the slow path's
        // caller: the probed function is their leaf.
        let mut wait_leaf = HashMap::new();
        for (probe, _, name) in &self.wait_points {
            let kinds: &[usize] = match probe {
                WaitProbe::Mutex => &[bt::WAIT_LOCK, bt::WAIT_COND],
                WaitProbe::Gil => &[bt::WAIT_GIL],
            };
            for k in kinds {
                wait_leaf.insert(*k as u32, name.to_string());
            }
        }
        // Bytes read by stack (the read's own, else the open's), for
        // io.folded; the file is the leaf. The first poll's batch is the
        // reads before the window, which the recording leaves out too.
        let mut by_stack: BTreeMap<(u32, i64, String), u64> = BTreeMap::new();
        for (_, acc) in self.pending_io.iter().skip(1) {
            for ((path, stacks, tid), f) in acc.iter().filter(|(_, f)| f.bytes_read > 0) {
                let id = if stacks.read != NO_STACK {
                    stacks.read
                } else {
                    stacks.open
                };
                *by_stack.entry((*tid, id, path.clone())).or_default() += f.bytes_read;
            }
        }
        let io = by_stack
            .into_iter()
            .map(|((tid, id, path), bytes)| {
                let mut frames = if id == NO_STACK {
                    Vec::new()
                } else {
                    self.stack_info(id).frames.clone()
                };
                frames.reverse();
                // `;` separates frames in folded stacks.
                frames.push(format!("[read: {}]", path.replace(';', "_")));
                crate::sampler::IoStack { tid, frames, bytes }
            })
            .collect();
        self.drain_spans(true);
        let spans = self
            .spans
            .as_mut()
            .map(|t| std::mem::take(&mut t.kept))
            .unwrap_or_default();
        crate::sampler::StackContext {
            names: self.names.clone(),
            class_paths: self.class_paths.clone(),
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
        let waits_seen = !self.waits_closed.is_zero() || self.phase == Phase::Waits;
        if self.mode == Attribution::Sampled && !self.wait_points.is_empty() && !waits_seen {
            warn!(
                "lock and GIL waits not measured: the recording ended before its first wait \
                 window ({} to {} ms after the first poll)",
                WINDOW.as_millis(),
                (WINDOW + WAIT_WINDOW).as_millis()
            );
        }
        self.close_window();
        let links = std::mem::take(&mut self.links);
        self.bpf.detach(links);
        self.forward_wait_stacks();
        self.process_io();
        // I/O after the last poll belongs to no window.
        self.io_acc.clear();
        self.emit_deferred(sink)?;
        if self.attach_failures > 0 {
            info!(
                count = self.attach_failures,
                "some probes could not be attached"
            );
        }
        Ok(vec![
            DropCount::new("malformed_io_records", *self.io_bad.borrow()),
            DropCount::new("usage_probes_not_attached", self.attach_failures),
            DropCount::new(
                "wait_sample_malformed_records",
                self.wait_stacks
                    .as_ref()
                    .map_or(0, |w| *w.malformed.borrow()),
            ),
            DropCount::new(
                "wait_samples_after_sampler_stopped",
                self.wait_stacks.as_ref().map_or(0, |w| w.lost),
            ),
            DropCount::new(
                "span_malformed_records",
                self.spans.as_ref().map_or(0, |t| *t.malformed.borrow()),
            ),
            DropCount::new(
                "spans_over_limit",
                self.spans.as_ref().map_or(0, |t| t.over_limit),
            ),
            DropCount::new(
                "spans_of_unknown_nodes",
                self.spans.as_ref().map_or(0, |t| t.unknown_node),
            ),
        ])
    }
}

/// Condition waits are measured in the attribution windows only.
/// File I/O probes: the target's libc functions, else (static or unknown
/// libc, or a failed attach) the file syscalls' tracepoints, which cost every
/// syscall of the machine a little while attached.
fn attach_file_io(bpf: &Bpf<'_>, target: &Target) -> Result<Vec<Link>> {
    match derive::libc_io_probes(target) {
        Some((lib, points)) => match bpf.attach_libc_io(&lib, &points) {
            Ok(links) => {
                debug!(probes = links.len(), "libc file probes attached");
                return Ok(links);
            }
            Err(e) => warn!("{e}; following file I/O with the syscall tracepoints instead"),
        },
        None => warn!(
            "no glibc file functions found in the target; following file I/O with the syscall tracepoints instead"
        ),
    }
    Ok(bpf.attach_file_syscalls()?)
}

/// Condition waits are the condition slow path's and the blocks'; slow
/// paths are counted in the windows' wait parts (scaled by `wait_scale`),
/// blocks in their attribution parts (`block_scale`).
fn wait_counters(w: &Waits, block_scale: f64, wait_scale: f64) -> WaitCounters {
    let slow = |kind: usize| {
        (
            scale_u64(w.ns[kind], wait_scale),
            scale_u64(w.n[kind], wait_scale),
        )
    };
    let (lock_wait_ns, lock_waits) = slow(bt::WAIT_LOCK);
    let (cond_ns, cond_n) = slow(bt::WAIT_COND);
    let (gil_wait_ns, gil_waits) = slow(bt::WAIT_GIL);
    WaitCounters {
        lock_wait_ns,
        lock_waits,
        cond_wait_ns: cond_ns.saturating_add(scale_u64(w.ns[bt::WAIT_BLOCK], block_scale)),
        cond_waits: cond_n.saturating_add(scale_u64(w.n[bt::WAIT_BLOCK], block_scale)),
        gil_wait_ns,
        gil_waits,
        futex_wait_ns: 0,
        futex_waits: 0,
        io_wait_ns: w.ns[bt::WAIT_IO],
    }
}

fn scale_u64(v: u64, scale: f64) -> u64 {
    (v as f64 * scale).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds after the first window at which the windows open, for a
    /// recording of `secs` (or 60 s of one without a duration).
    fn openings(duration: Option<u64>) -> Vec<u64> {
        let schedule = Schedule {
            duration: duration.map(Duration::from_secs),
        };
        let end = Duration::from_secs(duration.unwrap_or(60));
        let (mut at, mut opened, mut out) = (Duration::ZERO, 0, Vec::new());
        while at < end && schedule.fits(at, opened) {
            out.push(at.as_secs());
            opened += 1;
            at += schedule.gap(opened);
        }
        out
    }

    #[test]
    fn windows_are_at_least_two_and_at_most_one_per_15_s() {
        // Short recordings: 5 s apart, as many as fit.
        assert_eq!(openings(Some(4)), [0]);
        assert_eq!(openings(Some(8)), [0, 5]);
        assert_eq!(openings(Some(12)), [0, 6]);
        // Spread to two, then capped at one per 15 s.
        assert_eq!(openings(Some(21)), [0, 10]);
        assert_eq!(openings(Some(30)), [0, 15]);
        assert_eq!(openings(Some(60)), [0, 15, 30, 45]);
        // Until Ctrl-C: a second window soon, then one per 15 s.
        assert_eq!(openings(None), [0, 5, 20, 35, 50]);
    }

    #[test]
    fn a_window_that_cannot_finish_before_the_end_does_not_open() {
        let ms = Duration::from_millis;
        let s = Schedule {
            duration: Some(ms(30_200)),
        };
        // Due at 30 s with 200 ms left: less than its 250 ms and tail.
        assert!(!s.fits(ms(30_000), 2));
        assert!(s.fits(ms(29_900), 2));
        // The first window opens however short the recording.
        assert!(s.fits(ms(0), 0));
        let short = Schedule {
            duration: Some(ms(100)),
        };
        assert!(short.fits(ms(0), 0));
        assert!(Schedule { duration: None }.fits(ms(3_600_000), 9));
    }
}
