//! On-CPU stack sampling of the target: a worker thread drains the
//! sampler BPF object, unwinds each user stack with the libraries' CFI and
//! names its frames.
//!
//! A cpu-clock perf event per CPU runs bpf/sample.bpf.c at `--sample-hz`;
//! for the target's threads it sends the user registers and a copy of the
//! top of the user stack through a ring buffer. A worker thread of ours
//! unwinds each copy with the libraries' `.eh_frame` (framehop) and counts
//! identical (thread, address stack) pairs, so memory grows with distinct
//! stacks, not with samples. Frames are named (blazesym) only when the
//! recording ends: the first lookup in libtensorflow_cc builds an index of
//! its 1.2 M symbols, about 1.5 s of CPU that would otherwise be taken from
//! the target while it is measured. At the end [`attribute`] turns the
//! named stacks into a [`StackAggregator`] with TensorFlow's thread names
//! and the ops the threads worked for, which `plumber_analyzer::flamegraph`
//! renders.
//!
//! Everything runs on the worker: the BPF object, its perf events and ring
//! buffer are created, read and released there, so the poll loop of the
//! recording is never delayed by unwinding.

mod attribute;
mod python;
mod sampled;
mod symbols;
mod unwind;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plumber_collector::event::DropCount;
use tracing::{debug, info, warn};

pub use crate::bpf::sample::RawSample;
use crate::bpf::sample::{
    SampleBpf, SampleBpfError, DROP_NAMES, FLAG_IN_KERNEL, PY_READ_FAILED, PY_TRUNCATED,
};
use crate::cost::Thin;
use crate::python::PyProcess;
pub use attribute::{attribute, IoStack, LockStack, StackContext};
use python::{Frame, PyFrames};
pub use sampled::SampledStacks;
use symbols::FrameNames;
use unwind::{StackUnwinder, Truncation};

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error(transparent)]
    Bpf(#[from] SampleBpfError),
    #[error("starting the sampler thread: {0}")]
    Thread(std::io::Error),
    #[error("the sampler thread ended before it started sampling")]
    Gone,
}

/// Frame names that start a thread: a stack unwound to one of them is
/// complete.
const ENTRY_FRAMES: &[&str] = &[
    "clone3",
    "__clone3",
    "clone",
    "__clone",
    "start_thread",
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
];

/// Whether the outermost frames of a stack (outermost first) include a
/// thread entry point.
pub fn reaches_entry(frames_outer_first: &[Arc<str>]) -> bool {
    frames_outer_first.iter().take(2).any(|f| {
        let base = f.split('@').next().unwrap_or(f);
        ENTRY_FRAMES.contains(&base)
    })
}

/// Distinct (thread, address stack) pairs kept until the end; samples of
/// new stacks past it are counted (`sample_stacks_over_limit`), not kept,
/// so memory stays bounded on a long recording of a program with very
/// varied stacks (at 49 Hz on 2 CPUs, 200,000 samples take 30 minutes even
/// if each were new).
const MAX_DISTINCT_STACKS: usize = 200_000;

/// A sample's stack as unwound, before naming: user frames innermost
/// first (Python frames merged in), kernel addresses innermost first.
#[derive(PartialEq, Eq, Hash)]
struct RawStack {
    tid: u32,
    user: Vec<Frame>,
    kernel: Vec<u64>,
}

/// The worker's word that sampling runs: on how many CPUs, and the
/// sampling program's id.
type Started = (usize, Option<u32>);

/// What the worker is to do: sample, or stop and name what it has
/// ([`Sampler::finish`]), or stop and drop it (the recording failed: naming
/// would build libtensorflow_cc's symbol index, ~1.5 s, for nothing).
const RUN: u8 = 0;
const FINISH: u8 = 1;
const DISCARD: u8 = 2;

/// The running sampler; [`Sampler::finish`] stops it.
pub struct Sampler {
    state: Arc<AtomicU8>,
    worker: Option<JoinHandle<SampledStacks>>,
    /// Until [`Sampler::ready`]: the worker's word that sampling runs
    /// (on how many CPUs, and its program's id), and when it was started.
    ready: Option<(mpsc::Receiver<Result<Started, SamplerError>>, Instant)>,
    /// The sampling program's id, for the probe's cost.
    program_id: Option<u32>,
    start_wall_ns: u64,
    waits: mpsc::Sender<Vec<RawSample>>,
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Sampler {
    /// Starts the worker, which loads and attaches the sampler; returns at
    /// once, so its set-up overlaps the recording's (see
    /// [`Sampler::ready`]).
    /// `thin`: the cost meter's levers (it may stop sampling early).
    /// `py`: the target's interpreter, whose Python frames go into the
    /// stacks (None: native frames only).
    pub fn spawn(
        pid: i32,
        hz: u32,
        thin: Thin,
        py: Option<PyProcess>,
    ) -> Result<Sampler, SamplerError> {
        let state = Arc::new(AtomicU8::new(RUN));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (waits, waits_rx) = mpsc::channel();
        let state2 = state.clone();
        let worker = std::thread::Builder::new()
            .name("plumber-sampler".into())
            .spawn(move || {
                crate::stop::leave_stop_signals_to_main();
                worker(pid, hz, &state2, ready_tx, waits_rx, &thin, py)
            })
            .map_err(SamplerError::Thread)?;
        Ok(Sampler {
            state,
            worker: Some(worker),
            ready: Some((ready_rx, Instant::now())),
            program_id: None,
            start_wall_ns: 0,
            waits,
        })
    }

    /// The sampler once it runs, or why it cannot (its worker has then
    /// ended).
    pub fn ready(mut self) -> Result<Sampler, SamplerError> {
        let Some((ready, t0)) = self.ready.take() else {
            return Ok(self);
        };
        let failed = match ready.recv() {
            Ok(Ok((cpus, program_id))) => {
                self.start_wall_ns = wall_ns();
                self.program_id = program_id;
                info!(
                    cpus,
                    ms = t0.elapsed().as_millis() as u64,
                    "stack sampling started"
                );
                return Ok(self);
            }
            Ok(Err(e)) => e,
            Err(_) => SamplerError::Gone,
        };
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        Err(failed)
    }

    /// The sampling program's kernel id (once [`Sampler::ready`]).
    pub fn program_id(&self) -> Option<u32> {
        self.program_id
    }

    /// Where the stack copies of sampled lock and GIL waits go, to be
    /// unwound with the samples.
    pub fn wait_sender(&self) -> mpsc::Sender<Vec<RawSample>> {
        self.waits.clone()
    }

    /// Stops sampling, processes what is left and returns the stacks.
    pub fn finish(mut self) -> SampledStacks {
        self.state.store(FINISH, Ordering::SeqCst);
        let end_wall_ns = wall_ns();
        match self.worker.take().map(|w| {
            // Cut its sleep short (up to 1 s, bpf::sample::ring_plan).
            w.thread().unpark();
            w.join()
        }) {
            // Stopped early by the cost meter: sampling ended then.
            Some(Ok(s)) => SampledStacks {
                start_wall_ns: self.start_wall_ns,
                end_wall_ns: if s.end_wall_ns > 0 {
                    s.end_wall_ns
                } else {
                    end_wall_ns
                },
                ..s
            },
            _ => {
                warn!("the stack sampler thread failed; no stacks");
                SampledStacks {
                    drops: vec![DropCount::new("sampler_thread_failed", 1)],
                    ..Default::default()
                }
            }
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.state.store(DISCARD, Ordering::SeqCst);
        if let Some(w) = self.worker.take() {
            w.thread().unpark();
            let _ = w.join();
        }
    }
}

fn worker(
    pid: i32,
    hz: u32,
    run: &AtomicU8,
    ready: mpsc::Sender<Result<Started, SamplerError>>,
    waits: mpsc::Receiver<Vec<RawSample>>,
    thin: &Thin,
    py: Option<PyProcess>,
) -> SampledStacks {
    let mut obj = MaybeUninit::uninit();
    let mut sbpf = match SampleBpf::load(&mut obj, pid, hz, py.as_ref().map(|p| &p.config)) {
        Ok(b) => b,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return SampledStacks::default();
        }
    };
    let raw: std::rc::Rc<std::cell::RefCell<Vec<RawSample>>> = Default::default();
    let malformed = std::rc::Rc::new(std::cell::RefCell::new(0u64));
    let rb = match crate::bpf::ring_reader(
        &sbpf.skel.maps.samples,
        RawSample::from_bytes,
        raw.clone(),
        malformed.clone(),
    ) {
        Ok(rb) => rb,
        Err(e) => {
            let _ = ready.send(Err(SampleBpfError::Map("samples", e).into()));
            return SampledStacks::default();
        }
    };
    // Before sampling starts, so the recording does not see it: the
    // libraries' files are mapped and their headers parsed (milliseconds;
    // the unwind sections are paged in as unwinds look them up), and the
    // kernel's symbols loaded.
    let mut state = Processor::new(pid, hz, py);
    state.names.load_kernel_symbols();
    match sbpf.attach(hz) {
        Ok(n) => {
            let _ = ready.send(Ok((n, sbpf.program_id())));
        }
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return SampledStacks::default();
        }
    }
    // Unwinding is best-effort work on a machine whose cores the target
    // may need: run it at the lowest priority while the target is measured.
    // Not the set-up above: niced on a busy machine it took up to 0.5 s,
    // which the recording's start waits for, and it is over before the
    // recording.
    set_own_nice(19);
    let mut last_refresh = Instant::now();
    let mut stopped_wall_ns = 0;
    while run.load(Ordering::SeqCst) == RUN {
        stop_if_thinned(&mut sbpf, thin, &mut stopped_wall_ns);
        // The BPF side never wakes us (BPF_RB_NO_WAKEUP): drain on a
        // timer, as seldom as the ring allows (bpf::sample::ring_plan). Woken
        // early (unpark) when the recording stops us. consume() errors
        // only when a callback does; ours do not.
        std::thread::park_timeout(sbpf.drain_every);
        let _ = rb.consume();
        let mut batch: Vec<RawSample> = raw.borrow_mut().drain(..).collect();
        batch.extend(waits.try_iter().flatten());
        // New libraries (dlopen) and JIT regions: look again when samples
        // ran into code of no known mapping, at most every 2 s (reading
        // the maps of TensorFlow's thousands of mappings costs ~2 ms).
        if state.stale_maps && last_refresh.elapsed() >= Duration::from_secs(2) {
            state.unwinder.refresh();
            state.stale_maps = false;
            last_refresh = Instant::now();
        }
        state.process(&batch, &sbpf);
    }
    sbpf.detach();
    if run.load(Ordering::SeqCst) == DISCARD {
        return SampledStacks::default();
    }
    let _ = rb.consume();
    let mut batch: Vec<RawSample> = raw.borrow_mut().drain(..).collect();
    // The recording sent its last wait stacks before stopping us.
    batch.extend(waits.try_iter().flatten());
    state.process(&batch, &sbpf);
    // Sampling has stopped: the target is no longer measured, and the
    // symbol index can be built now. At the priority the recording runs
    // at: niced on the 2 busy cores of the image workload, naming took
    // 0.8 s of wall time for a tenth of that in CPU, all of it added to the
    // wait for the results.
    set_own_nice(0);
    let t0 = Instant::now();
    let mut out = state.name_stacks();
    out.end_wall_ns = stopped_wall_ns;
    out.symbolize_ns = t0.elapsed().as_nanos() as u64;
    out.worker_cpu_ns = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0);
    read_counters(&mut out, &sbpf, *malformed.borrow());
    out.drops
        .push(DropCount::new("sample_stacks_over_limit", out.over_limit));
    debug!(
        samples = out.samples,
        complete = out.complete,
        stacks = out.stacks.len(),
        "stack sampler done"
    );
    out
}

/// The BPF side's counters into what the sampler hands back: its drops
/// (every way a sample was lost) and the Python walk's statistics.
fn read_counters(out: &mut SampledStacks, sbpf: &SampleBpf<'_>, malformed: u64) {
    if let Some(p) = &mut out.python {
        match sbpf.python_stats() {
            Ok(v) => {
                p.walks = v.first().copied().unwrap_or(0);
                p.walk_ns = v.get(1).copied().unwrap_or(0);
                p.walk_frames = v.get(2).copied().unwrap_or(0);
            }
            Err(e) => warn!("python walk statistics not read: {e}"),
        }
    }
    match sbpf.drops() {
        Ok(counts) => out.drops.extend(
            counts
                .into_iter()
                .zip(DROP_NAMES)
                .map(|(count, what)| DropCount::new(what, count)),
        ),
        Err(e) => warn!("stack sampler drops not read: {e}"),
    }
    out.drops
        .push(DropCount::new("sample_malformed_records", malformed));
}

/// Past the cost budget (the meter pulled the sampling lever): no more
/// samples, the stacks so far stay; `stopped_wall_ns` says when.
fn stop_if_thinned(sbpf: &mut SampleBpf<'_>, thin: &Thin, stopped_wall_ns: &mut u64) {
    if *stopped_wall_ns == 0 && thin.sampling_stopped() {
        sbpf.detach();
        *stopped_wall_ns = wall_ns();
    }
}

/// Sets the calling thread's nice value (threads have their own on Linux).
fn set_own_nice(nice: i32) {
    // SAFETY: plain syscalls on our own thread id; no memory is passed.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if rc != 0 {
        debug!(
            nice,
            "sampler thread keeps its priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

struct Processor {
    unwinder: StackUnwinder,
    names: FrameNames,
    /// Address stacks and how their unwinding ended, with sample counts.
    raw: HashMap<RawStack, (Truncation, u64)>,
    /// Sampled waits: (address stack, wait kind) -> (samples, wait ns).
    raw_waits: HashMap<(RawStack, u32), (u64, u64)>,
    out: SampledStacks,
    /// A sample was in code of no known mapping, or its unwind failed:
    /// /proc/PID/maps may have changed.
    stale_maps: bool,
    py: Option<PyFrames>,
}

impl Processor {
    fn new(pid: i32, hz: u32, py: Option<PyProcess>) -> Self {
        Processor {
            py: py.map(PyFrames::new),
            unwinder: StackUnwinder::new(pid),
            names: FrameNames::new(pid),
            raw: HashMap::new(),
            raw_waits: HashMap::new(),
            stale_maps: false,
            out: SampledStacks {
                period_ns: 1_000_000_000 / u64::from(hz.max(1)),
                ..Default::default()
            },
        }
    }

    fn process(&mut self, batch: &[RawSample], sbpf: &SampleBpf<'_>) {
        if batch.is_empty() {
            return;
        }
        // Kernel stacks first: a sample taken in a uprobe's breakpoint
        // handler (ours, on record_stop or a lock) has a user ip one past
        // the int3, in the middle of the probed function's first
        // instruction, which the CFI would misread. Kernel names come from
        // kallsyms, which is cheap, so they are resolved as they come.
        let kernels: Vec<Vec<u64>> = batch
            .iter()
            .map(|s| {
                if s.flags & FLAG_IN_KERNEL != 0 {
                    sbpf.kernel_stack(s.kstack_id)
                } else {
                    Vec::new()
                }
            })
            .collect();
        let kaddrs: Vec<u64> = kernels.iter().flatten().copied().collect();
        if let Some(py) = &mut self.py {
            py.names.next_batch();
        }
        self.names.resolve_kernel(&kaddrs);
        let t0 = Instant::now();
        for (s, kernel) in batch.iter().zip(kernels) {
            let in_int3 = kernel
                .iter()
                .any(|a| self.names.kernel(*a).contains("exc_int3"));
            let ip = if in_int3 { s.ip.wrapping_sub(1) } else { s.ip };
            let (user, end) = self.unwinder.unwind(ip, s.sp, s.bp, &s.stack);
            if end == Truncation::Failed || !self.unwinder.is_mapped_code(ip) {
                self.stale_maps = true;
            }
            let user = self.with_python(s, &user);
            if let Some(kind) = s.wait_kind() {
                // Not a CPU sample: kept apart, and bounded the same way.
                let key = (
                    RawStack {
                        tid: s.tid,
                        user,
                        kernel,
                    },
                    kind,
                );
                if let Some(c) = self.raw_waits.get_mut(&key) {
                    c.0 += 1;
                    c.1 = c.1.saturating_add(s.wait_ns);
                } else if self.raw_waits.len() < MAX_DISTINCT_STACKS {
                    self.raw_waits.insert(key, (1, s.wait_ns));
                } else {
                    self.out.over_limit += 1;
                }
                continue;
            }
            self.out.samples += 1;
            if !kernel.is_empty() {
                self.out.in_kernel += 1;
            }
            let key = RawStack {
                tid: s.tid,
                user,
                kernel,
            };
            if let Some(c) = self.raw.get_mut(&key) {
                c.1 += 1;
            } else if self.raw.len() < MAX_DISTINCT_STACKS {
                self.raw.insert(key, (end, 1));
            } else {
                self.out.over_limit += 1;
            }
        }
        self.out.unwind_ns += t0.elapsed().as_nanos() as u64;
    }

    /// The unwound stack with the sample's Python frames merged in.
    fn with_python(&mut self, s: &RawSample, user: &[u64]) -> Vec<Frame> {
        let Some(py) = &mut self.py else {
            return user.iter().map(|&a| Frame::Addr(a)).collect();
        };
        let groups = py.groups(s);
        let complete = s.py_flags & (PY_TRUNCATED | PY_READ_FAILED) == 0;
        let p = &py.py;
        python::merge(
            user,
            &groups,
            complete,
            |a| p.is_interpreter(a),
            |a| p.is_eval(a),
        )
    }

    /// Names every address once (one blazesym call) and counts identical
    /// named stacks: different addresses in the same functions merge here.
    fn name_stacks(mut self) -> SampledStacks {
        let addrs = |f: &Vec<Frame>| -> Vec<u64> {
            f.iter()
                .filter_map(|f| match f {
                    Frame::Addr(a) => Some(*a),
                    Frame::Py(_) => None,
                })
                .collect()
        };
        let mut user: Vec<u64> = self
            .raw
            .keys()
            .flat_map(|k| addrs(&k.user))
            .chain(self.raw_waits.keys().flat_map(|(k, _)| addrs(&k.user)))
            .collect();
        user.sort_unstable();
        user.dedup();
        self.names.resolve_user(&user, &self.unwinder);
        let mut o = self.out;
        o.symbol_lookups = self.names.lookups;
        if let Some(py) = &self.py {
            o.python = Some(python_summary(py));
        }
        let names = &self.names;
        let name = |f: &Frame| -> Arc<str> {
            match f {
                Frame::Addr(a) => names.user(*a),
                Frame::Py(n) => n.clone(),
            }
        };
        for (k, (end, n)) in self.raw {
            // Outermost first, as folded stacks are written.
            let mut frames: Vec<Arc<str>> = k.user.iter().rev().map(name).collect();
            frames.extend(k.kernel.iter().rev().map(|a| self.names.kernel(*a)));
            if reaches_entry(&frames) {
                o.complete += n;
            } else {
                match end {
                    Truncation::OutOfStack => o.out_of_stack += n,
                    Truncation::TooDeep => o.too_deep += n,
                    Truncation::Failed | Truncation::Complete => o.unwind_failed += n,
                }
            }
            *o.stacks.entry((k.tid, frames)).or_default() += n;
        }
        for ((k, kind), (n, ns)) in self.raw_waits {
            let frames: Vec<Arc<str>> = k.user.iter().rev().map(name).collect();
            o.wait_samples += n;
            if reaches_entry(&frames) {
                o.wait_complete += n;
            }
            *o.waits.entry((k.tid, kind, frames)).or_default() += ns;
        }
        o
    }
}

/// What the Python side of the sampler did.
fn python_summary(py: &PyFrames) -> sampled::PythonSummary {
    sampled::PythonSummary {
        note: py.py.note(),
        samples: py.with_frames,
        truncated: py.truncated,
        read_failed: py.read_failed,
        unnamed_frames: py.names.bad,
        code_objects: py.names.decoded,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points() {
        let f = |v: &[&str]| v.iter().map(|s| Arc::from(*s)).collect::<Vec<Arc<str>>>();
        assert!(reaches_entry(&f(&["__clone3", "start_thread", "foo"])));
        assert!(reaches_entry(&f(&[
            "_start",
            "__libc_start_main@@GLIBC_2.34",
            "main"
        ])));
        assert!(!reaches_entry(&f(&["foo", "bar", "start_thread"])));
        assert!(!reaches_entry(&f(&[])));
    }
}
