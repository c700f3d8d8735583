//! `plumber-probe run -- CMD...`: no root, no capabilities. The command is
//! started as our child with the shim (`libplumber_shim.so`) preloaded.
//!
//! A parent may read its own child's memory with process_vm_readv (same uid
//! and a descendant pass the ptrace access check without privileges), so
//! the autotune model is walked exactly as in `--pid` mode. What needs a
//! probe there comes from the shim here, through shared memory
//! (shim/src/abi.rs): which iterators run (discovery) and the final
//! counters of nodes that die between polls. Thread CPU comes from
//! /proc/PID/task/*/schedstat.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use plumber_collector::event::{
    AttributionSample, DropCount, Event, FileIo, NodeCounters, NodeRetired, Poll,
    ThreadObservation, WaitCounters,
};
use tracing::{debug, info, warn};

use crate::clock::now_ns;
use crate::derive::{self, Derived};
use crate::errors::{self, one_line};
use crate::layout::NodeLayout;
use crate::mem::Memory;
use crate::model::ModelReader;
use crate::output;
use crate::progress::Progress;
use crate::record;
use crate::shim_abi as abi;
use crate::sink::EventSink;
use crate::stop::{self, STOP};
use crate::target::{self, Target, TargetError};
use crate::threads::{self, NameRegistry};

/// The shim's file name, next to the plumber-probe binary (cargo builds
/// both into the same target directory).
const SHIM_FILE: &str = "libplumber_shim.so";
/// Overrides where the shim is looked for.
const SHIM_ENV: &str = "PLUMBER_SHIM";

#[derive(Debug, Clone)]
pub struct RunOpts {
    pub command: Vec<OsString>,
    pub duration: Option<Duration>,
    pub interval: Duration,
    pub quiet: bool,
    pub output: PathBuf,
}

/// Measurements `--pid` mode makes that the shim does not (yet): carried in
/// stats.pb and report.json (`not_measured`) and said in the report text,
/// so an absent number is not read as zero.
const NOT_MEASURED: &[&str] = &[
    "absl lock and condition-variable waits, other futex waits",
    "call sites of waits (no stacks)",
    "GIL waits in Python not called from an extension module (inside py_function they are the thread's off-CPU time, run-queue delay included)",
    "reads of files opened before the recording started",
    "the CPU of a thread after the last poll that saw it, if it exits",
];

fn shim_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(SHIM_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the plumber-probe binary")?;
    let dir = exe
        .parent()
        .context("the plumber-probe binary has no directory")?;
    // Integration tests run the binary from target/debug; a binary in
    // target/debug/deps looks one level up.
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let p = d.join(SHIM_FILE);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "{SHIM_FILE} not found next to {} (build it with `cargo build`, which builds the whole workspace, or set {SHIM_ENV})",
        exe.display()
    )
}

/// The shared memory: a file in /dev/shm (the child opens it by name from
/// its environment), mapped here; unlinked and unmapped on drop.
struct SharedMem {
    path: PathBuf,
    ptr: *mut abi::Header,
    _file: File,
}

impl SharedMem {
    fn create() -> Result<SharedMem> {
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let (mono, _) = now_ns();
        let path = dir.join(format!("plumber-shim-{}-{mono}", std::process::id()));
        // 0600: only our uid (the child's) may map it.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let guard = Unlink(path.clone());
        file.set_len(abi::HEADER_SIZE as u64)
            .with_context(|| format!("sizing {}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: a shared mapping of a file we just sized to HEADER_SIZE;
        // the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                abi::HEADER_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mapping {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        std::mem::forget(guard);
        let shm = SharedMem {
            path,
            ptr: p.cast(),
            _file: file,
        };
        let h = shm.header();
        h.version.store(abi::VERSION, Ordering::Relaxed);
        h.size.store(abi::HEADER_SIZE as u32, Ordering::Relaxed);
        // Last, with release: the shim checks the magic first.
        h.magic.store(abi::MAGIC, Ordering::Release);
        Ok(shm)
    }

    fn header(&self) -> &abi::Header {
        // SAFETY: `ptr` maps HEADER_SIZE bytes (zero-filled by the kernel,
        // a valid Header: atomics only) until drop.
        unsafe { &*self.ptr }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping, which nothing references
        // after drop (header() borrows self).
        unsafe { libc::munmap(self.ptr.cast(), abi::HEADER_SIZE) };
        let _ = std::fs::remove_file(&self.path);
    }
}

struct Unlink(PathBuf);
impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs the command under the shim, records, writes the outputs, and
/// returns the command's exit status.
pub fn run(opts: &RunOpts) -> Result<ExitCode> {
    let Some((prog, args)) = opts.command.split_first() else {
        return Err(errors::usage(
            "nothing to run: give the command after `--`, e.g. plumber-probe run -- python train.py".into(),
        ));
    };
    let shim = shim_path()?;
    output::prepare_dir(&opts.output)?;
    let shm = SharedMem::create()?;
    // Like `--pid` mode (stop the recording cleanly), also noting which
    // signal it was, to pass it on to the command.
    stop::install_signal_handlers(on_signal)?;
    let mut preload = OsString::from(&shim);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut child = Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env(abi::ENV_SHM, &shm.path)
        .spawn()
        .with_context(|| format!("starting {}", prog.to_string_lossy()))?;
    let pid = child.id() as i32;
    info!(pid, shim = %shim.display(), "started");
    let started = Instant::now();
    match record_child(opts, &shm, &mut child, pid, started) {
        Ok(Some(rec)) => rec.write(&opts.output)?,
        Ok(None) => {
            if !opts.quiet {
                eprintln!(
                    "plumber-probe: {} ran no tf.data pipeline; nothing recorded",
                    prog.to_string_lossy()
                );
            }
        }
        // The command keeps running; its exit status is still ours.
        Err(e) => eprintln!("plumber-probe: recording failed: {}", one_line(&e)),
    }
    // A terminal's Ctrl-C (SIGINT) reached the whole process group, the
    // command included; a SIGTERM or SIGHUP sent to us alone would leave
    // the command running while we wait for it, so pass it on.
    let sig = SIGNAL.load(Ordering::SeqCst);
    if sig == libc::SIGTERM || sig == libc::SIGHUP {
        // SAFETY: kill on our own child's pid (not yet reaped, so the pid
        // cannot have been reused).
        unsafe { libc::kill(pid, sig) };
    }
    // The command may run on after the recording: from now on the shim
    // only forwards calls.
    shm.header()
        .state
        .store(abi::STATE_DISABLED, Ordering::Release);
    drop(shm);
    let status = child.wait().context("waiting for the command")?;
    use std::os::unix::process::ExitStatusExt;
    // As a shell reports it: a command killed by signal N exits 128 + N.
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// One recording's observations and how it ended.
struct Recording {
    sink: EventSink,
    reason: String,
    partial: bool,
    time_to_first_data: f64,
    cache_hit: bool,
}

impl Recording {
    /// The same files and summary lines as `--pid` mode.
    fn write(self, out: &Path) -> Result<()> {
        let collected = self.sink.finish()?;
        output::write_collected(out, &collected)?;
        println!(
            "mode: model (LD_PRELOAD shim) | window {:.1} s | time to first data {:.2} s{}",
            collected.window.duration_ns() as f64 / 1e9,
            self.time_to_first_data,
            if self.cache_hit {
                " (layout cache hit)"
            } else {
                ""
            }
        );
        if self.partial {
            println!(
                "PARTIAL: the recording ended early ({}); the window covers what was observed",
                self.reason
            );
        }
        println!("wrote {}", out.display());
        Ok(())
    }
}

/// The last signal that asked us to stop.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

fn exited(child: &mut Child) -> bool {
    !matches!(child.try_wait(), Ok(None))
}

enum Stop {
    Duration,
    Signal,
    TargetExited,
}

struct Ctx<'a> {
    opts: &'a RunOpts,
    h: &'a abi::Header,
    mem: Memory,
    pid: i32,
}

/// `Ok(None)`: the command ended (or we were interrupted) before any
/// TensorFlow pipeline ran.
fn record_child(
    opts: &RunOpts,
    shm: &SharedMem,
    child: &mut Child,
    pid: i32,
    started: Instant,
) -> Result<Option<Recording>> {
    let h = shm.header();
    let Some(target) = wait_for_tensorflow(child, pid)? else {
        return Ok(None);
    };
    info!(pid, tf = %target.tensorflow_version, "TensorFlow loaded");
    let (derived, cache_hit) = derive::derive(&target)?;
    let Some(layout) = derived.node else {
        bail!(
            "cannot read TensorFlow's autotune model in this build: {}",
            derived.model_error.as_deref().unwrap_or("unknown reason")
        );
    };
    publish_layout(h, &layout, derived.iter.as_ref().map(|i| i.prefix));
    // From here on the child has opened the file (it maps it at load);
    // a later exec'd program would only find it gone and stay inert.
    let ctx = Ctx {
        opts,
        h,
        mem: Memory::new(pid),
        pid,
    };
    let mut rec = Recording {
        sink: EventSink::new(None)?,
        reason: String::new(),
        partial: false,
        time_to_first_data: 0.0,
        cache_hit,
    };
    let mut info = record::target_info(&target, "model");
    info.not_measured = NOT_MEASURED.iter().map(|m| m.to_string()).collect();
    rec.sink.push(Event::Target(info))?;
    match ctx.poll_loop(&target, &derived, &layout, child, &mut rec, started)? {
        true => Ok(Some(rec)),
        false => Ok(None),
    }
}

/// Waits until the child has TensorFlow's framework library mapped.
fn wait_for_tensorflow(child: &mut Child, pid: i32) -> Result<Option<Target>> {
    loop {
        if STOP.load(Ordering::SeqCst) || exited(child) {
            return Ok(None);
        }
        match Target::open(pid) {
            Ok(t) => return Ok(Some(t)),
            Err(TargetError::NoTensorFlow { .. }) => {}
            // Exiting between our checks.
            Err(TargetError::NoSuchProcess(_)) => return Ok(None),
            Err(e) if exited(child) => {
                debug!("target gone: {e}");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn publish_layout(h: &abi::Header, l: &NodeLayout, iter_prefix: Option<u32>) {
    let o = &h.layout;
    // 0: unknown; the shim then books reads to no op.
    o.iter_prefix
        .store(iter_prefix.unwrap_or(0), Ordering::Relaxed);
    for (dst, v) in [
        (&o.id, l.id),
        (&o.name, l.name),
        (&o.buffered_bytes, l.buffered_bytes),
        (&o.buffered_elements, l.buffered_elements),
        (&o.bytes_consumed, l.bytes_consumed),
        (&o.bytes_produced, l.bytes_produced),
        (&o.num_elements, l.num_elements),
        (&o.processing_time, l.processing_time),
        (&o.output, l.output),
    ] {
        dst.store(v, Ordering::Relaxed);
    }
    h.layout_ready.store(1, Ordering::Release);
}

impl Ctx<'_> {
    fn should_stop(&self, child: &mut Child, window_start: Option<Instant>) -> Option<Stop> {
        if STOP.load(Ordering::SeqCst) {
            return Some(Stop::Signal);
        }
        if exited(child) || !target::alive(self.pid) {
            return Some(Stop::TargetExited);
        }
        match (self.opts.duration, window_start) {
            (Some(d), Some(s)) if s.elapsed() >= d => Some(Stop::Duration),
            _ => None,
        }
    }

    /// Asks the shim for the iterators that run, until the pipeline runs
    /// (no timeout: the command may take long to start training), then
    /// about 150 ms more. `None` when the command ended or we were stopped.
    fn discover(&self, child: &mut Child) -> Option<Vec<(u64, u64)>> {
        let h = self.h;
        h.discover.store(0, Ordering::SeqCst);
        for s in &h.iters {
            s.this.store(0, Ordering::Relaxed);
            s.calls.store(0, Ordering::Relaxed);
        }
        h.discover.store(1, Ordering::SeqCst);
        let mut first_hit: Option<Instant> = None;
        let seen = loop {
            std::thread::sleep(Duration::from_millis(20));
            if self.should_stop(child, None).is_some() {
                h.discover.store(0, Ordering::SeqCst);
                return None;
            }
            let any = h.iters.iter().any(|s| s.this.load(Ordering::Relaxed) != 0);
            if any && first_hit.is_none() {
                first_hit = Some(Instant::now());
            }
            if first_hit.is_some_and(|t| t.elapsed() >= Duration::from_millis(150)) {
                h.discover.store(0, Ordering::SeqCst);
                break h
                    .iters
                    .iter()
                    .filter_map(|s| {
                        let it = s.this.load(Ordering::Acquire);
                        (it != 0).then(|| (it, s.calls.load(Ordering::Relaxed)))
                    })
                    .collect();
            }
        };
        Some(seen)
    }

    /// Returns false when no pipeline was ever seen.
    fn poll_loop(
        &self,
        target: &Target,
        derived: &Derived,
        layout: &NodeLayout,
        child: &mut Child,
        rec: &mut Recording,
        started: Instant,
    ) -> Result<bool> {
        let reader = ModelReader::new(self.mem, *layout);
        let iter_layout = derived.iter.clone().unwrap_or_default();
        let mut registry = derived.thread_registry.and_then(|vaddr| {
            let base = threads::load_base(self.pid, &target.framework.path)?;
            Some(NameRegistry::new(self.mem, base + vaddr))
        });
        let mut cpu = ThreadCpu::default();
        let mut io_prev: HashMap<u32, [u64; 6]> = HashMap::new();
        let mut attr = AttrRows::default();
        // Model node -> op path, from every poll (attribution rows name
        // nodes by address).
        let mut node_path: HashMap<u64, String> = HashMap::new();
        let mut retired_tail = self.h.retired_tail.load(Ordering::Acquire);
        let mut root: Option<(u64, i64)> = None;
        let mut iter_of: HashMap<u64, u64> = HashMap::new();
        let mut invalid_nodes = 0u64;
        let mut unreadable = 0u64;
        let mut no_model_rounds = 0u64;
        let mut window_start: Option<Instant> = None;
        let mut progress = Progress::new(self.opts.quiet);
        let stop = loop {
            if root.is_none() {
                let Some(iters) = self.discover(child) else {
                    break if STOP.load(Ordering::SeqCst) {
                        Stop::Signal
                    } else {
                        Stop::TargetExited
                    };
                };
                let (busiest, _, invalid) = crate::model::busiest_root(
                    &self.mem,
                    &reader,
                    &iter_layout,
                    iters,
                    &mut iter_of,
                );
                invalid_nodes += invalid;
                let Some(busiest) = busiest else {
                    // Iterators without model nodes: autotune is off.
                    no_model_rounds += 1;
                    if no_model_rounds == 3 {
                        warn!("{}; still looking", record::NO_MODEL);
                    }
                    continue;
                };
                root = reader.node(busiest).ok().map(|n| (busiest, n.id));
                debug!(?root, iterators = iter_of.len(), "discovered pipelines");
            }
            let stopping = self.should_stop(child, window_start);
            if let Some(Stop::TargetExited) = stopping {
                break Stop::TargetExited;
            }
            let mut nodes = Vec::new();
            if let Some((addr, id)) = root {
                match reader.walk(addr) {
                    Ok((obs, skipped))
                        if obs
                            .first()
                            .is_some_and(|n| n.parent.is_none() && n.id == id) =>
                    {
                        invalid_nodes += skipped;
                        nodes = obs;
                    }
                    _ => root = None,
                }
            }
            if nodes.is_empty() {
                if let Some(stop) = stopping {
                    break stop;
                }
                iter_of.clear();
                continue;
            }
            crate::model::fill_parallelism(&self.mem, &mut nodes, &iter_of, &iter_layout);
            iter_of.retain(|node, _| nodes.iter().any(|n| n.addr == *node));
            unreadable += self.drain_retired(&mut retired_tail, &mut rec.sink, &mut node_path)?;
            let (mono_ns, wall_ns) = now_ns();
            let root_elems = nodes.first().map(|n| n.counters.num_elements);
            for n in &nodes {
                node_path.insert(n.addr, n.path.clone());
            }
            rec.sink.push(Event::Poll(Poll {
                mono_ns,
                wall_ns,
                process_cpu_ns: target::process_cpu_ns(self.pid).unwrap_or(0),
                nodes,
            }))?;
            let mut threads = cpu.observe(self.pid, registry.as_mut());
            self.add_waits(&mut threads);
            rec.sink.push(Event::Threads { mono_ns, threads })?;
            rec.sink.push(Event::Attribution {
                mono_ns,
                samples: self.attribution(&node_path, &mut attr),
            })?;
            let start = *window_start.get_or_insert_with(|| {
                rec.time_to_first_data = started.elapsed().as_secs_f64();
                // Files opened from now on can be read whole in the window.
                self.h.record_since_ns.store(mono_ns, Ordering::Release);
                Instant::now()
            });
            rec.sink.push(Event::Io {
                mono_ns,
                files: self.io_deltas(&mut io_prev),
            })?;
            progress.tick(
                start.elapsed().as_secs_f64(),
                self.opts.duration.map(|d| d.as_secs_f64()),
                root_elems,
            );
            if let Some(stop) = stopping {
                break stop;
            }
            stop::sleep_interval(self.opts.interval, self.opts.duration, window_start, || {
                None
            });
        };
        progress.done();
        if window_start.is_none() {
            return Ok(false);
        }
        unreadable += self.drain_retired(&mut retired_tail, &mut rec.sink, &mut node_path)?;
        let mut drops: Vec<DropCount> = abi::DROP_NAMES
            .iter()
            .zip(&self.h.drops)
            .map(|(what, n)| DropCount::new(*what, n.load(Ordering::Relaxed)))
            .collect();
        drops.extend([
            DropCount::new("invalid_model_nodes_skipped", invalid_nodes),
            DropCount::new("retired_node_unreadable", unreadable),
            DropCount::new("exited_threads_cpu_after_last_poll", cpu.exited),
        ]);
        rec.sink.push(Event::Drops { drops })?;
        let (partial, reason) = match stop {
            Stop::Duration => (false, "duration reached"),
            Stop::Signal => (self.opts.duration.is_some(), "interrupted"),
            Stop::TargetExited => (self.opts.duration.is_some(), "command exited"),
        };
        rec.partial = partial;
        rec.reason = reason.into();
        rec.sink.push(Event::End {
            partial,
            reason: reason.into(),
        })?;
        Ok(true)
    }

    /// Moves complete retired records from the ring into the sink. Returns
    /// how many had no readable counters.
    fn drain_retired(
        &self,
        tail: &mut u64,
        sink: &mut EventSink,
        node_path: &mut HashMap<u64, String>,
    ) -> Result<u64> {
        let h = self.h;
        let head = h.retired_head.load(Ordering::Acquire);
        let mut unreadable = 0;
        while *tail < head {
            let idx = *tail;
            let Some(r) = h.retired.get((idx % abi::RETIRED_SLOTS as u64) as usize) else {
                break;
            };
            let seq = r.seq.load(Ordering::Acquire);
            if seq != idx + 1 {
                // Reserved but not yet written (a writer between its
                // fetch_add and its release store), or dropped as full.
                // Wait for the writer unless later records are complete,
                // which means this one was dropped.
                if head.saturating_sub(idx) < abi::RETIRED_SLOTS as u64 {
                    break;
                }
                *tail += 1;
                continue;
            }
            if r.flags.load(Ordering::Relaxed) & abi::FLAG_READ_FAILED != 0 {
                unreadable += 1;
            } else {
                let e = retired_event(r);
                // A node that lived between two polls is named from its
                // parent, so its attribution rows still find their op.
                if let Some(pp) = e.parent.and_then(|p| node_path.get(&p)) {
                    if !e.name.is_empty() {
                        let path = format!("{pp}::{}", e.name);
                        node_path.insert(e.addr, path);
                    }
                }
                sink.push(Event::Retired(e))?;
            }
            *tail += 1;
        }
        h.retired_tail.store(*tail, Ordering::Release);
        Ok(unreadable)
    }

    /// The shim's per-thread wait counters, into the /proc observations.
    fn add_waits(&self, threads: &mut [ThreadObservation]) {
        let by_tid: HashMap<u32, &abi::ThreadSlot> = self
            .h
            .threads
            .iter()
            .filter_map(|s| {
                let tid = s.tid.load(Ordering::Acquire);
                (tid != 0).then_some((tid, s))
            })
            .collect();
        for t in threads {
            if let Some(s) = by_tid.get(&t.tid) {
                t.waits.gil_wait_ns = s.gil_wait_ns.load(Ordering::Relaxed);
                t.waits.gil_waits = s.gil_waits.load(Ordering::Relaxed);
                t.waits.io_wait_ns = s.read_ns.load(Ordering::Relaxed);
            }
        }
    }

    /// File I/O since the previous poll, per (thread, file, op) row.
    fn io_deltas(&self, prev: &mut HashMap<u32, [u64; 6]>) -> Vec<FileIo> {
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let mut out = Vec::new();
        for (t, s) in self.h.threads.iter().enumerate() {
            let tid = s.tid.load(Ordering::Acquire);
            if tid == 0 {
                continue;
            }
            for (i, r) in s.io.iter().enumerate() {
                let file = r.file.load(Ordering::Acquire);
                if file == 0 {
                    break;
                }
                let now = [
                    ld(&r.bytes),
                    ld(&r.reads),
                    ld(&r.read_ns),
                    ld(&r.opens),
                    ld(&r.complete_sessions),
                    ld(&r.complete_bytes),
                ];
                let id = (t * abi::IO_ROWS + i) as u32;
                let before = prev.insert(id, now).unwrap_or_default();
                let d: Vec<u64> = now
                    .iter()
                    .zip(before)
                    .map(|(a, b)| a.saturating_sub(b))
                    .collect();
                if d.iter().all(|v| *v == 0) {
                    continue;
                }
                let Some(f) = self.h.files.get(file as usize - 1) else {
                    continue;
                };
                out.push(FileIo {
                    path: words_str(&f.path, f.path_len.load(Ordering::Acquire)),
                    op_path: words_str(&r.prefix, r.prefix_len.load(Ordering::Relaxed))
                        .strip_prefix("Iterator::")
                        .unwrap_or_default()
                        .to_string(),
                    tid,
                    bytes_read: d[0],
                    reads: d[1],
                    read_ns: d[2],
                    opens: d[3],
                    size: Some(f.size.load(Ordering::Relaxed)).filter(|s| *s > 0),
                    complete_sessions: d[4],
                    complete_bytes: d[5],
                });
            }
        }
        out
    }

    /// Cumulative (thread, node) samples from the shim's record_stop
    /// hook. A thread's row is reused for another node once we have read
    /// it (its old node died); the old node's final totals are then kept
    /// here in `attr`.
    fn attribution(
        &self,
        node_path: &HashMap<u64, String>,
        attr: &mut AttrRows,
    ) -> Vec<AttributionSample> {
        // Bump first, then read: the shim reuses a row only once a read
        // that began after the row's last update has ended.
        self.h.poll_seq.fetch_add(1, Ordering::AcqRel);
        for (t, s) in self.h.threads.iter().enumerate() {
            let tid = s.tid.load(Ordering::Acquire);
            if tid == 0 {
                continue;
            }
            for (i, n) in s.nodes.iter().enumerate() {
                let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Acquire);
                let gen = ld(&n.gen);
                let node = ld(&n.node);
                if node == 0 {
                    break;
                }
                if gen % 2 == 1 {
                    continue;
                }
                let sample = AttributionSample {
                    tid,
                    node,
                    op_path: node_path.get(&node).cloned().unwrap_or_default(),
                    cpu_ns: ld(&n.cpu_ns),
                    waits: WaitCounters {
                        gil_wait_ns: ld(&n.gil_wait_ns),
                        gil_waits: ld(&n.gil_waits),
                        ..Default::default()
                    },
                    io_bytes: ld(&n.io_bytes),
                    stops: ld(&n.stops),
                };
                if ld(&n.gen) != gen {
                    // Being reused as we read: the previous values stand.
                    continue;
                }
                let key = (t, i);
                if let Some((old_gen, old)) = attr.rows.get(&key) {
                    if *old_gen != gen {
                        // Reused: what we last read of the old node was final.
                        attr.carry(old.clone());
                    }
                }
                attr.rows.insert(key, (gen, sample));
            }
        }
        let mut out: HashMap<(u32, u64, String), AttributionSample> = attr.carried.clone();
        for (_, s) in attr.rows.values() {
            add_sample(&mut out, s);
        }
        let mut v: Vec<AttributionSample> = out.into_values().collect();
        v.sort_by(|a, b| (a.tid, a.node, &a.op_path).cmp(&(b.tid, b.node, &b.op_path)));
        v
    }
}

/// A string the shim stored 8 bytes per word.
fn words_str(words: &[std::sync::atomic::AtomicU64], len: u32) -> String {
    let mut b = Vec::with_capacity(words.len() * 8);
    for w in words {
        b.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
    b.truncate((len as usize).min(b.len()));
    String::from_utf8_lossy(&b).into_owned()
}

fn retired_event(r: &abi::Retired) -> NodeRetired {
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let parent = ld(&r.parent);
    NodeRetired {
        mono_ns: ld(&r.mono_ns),
        addr: ld(&r.node),
        id: ld(&r.id) as i64,
        name: words_str(&r.name, r.name_len.load(Ordering::Relaxed)),
        parent: (parent != 0).then_some(parent),
        parent_id: (parent != 0).then_some(ld(&r.parent_id) as i64),
        counters: NodeCounters {
            num_elements: ld(&r.num_elements) as i64,
            bytes_produced: ld(&r.bytes_produced) as i64,
            bytes_consumed: ld(&r.bytes_consumed) as i64,
            processing_time_ns: ld(&r.processing_time) as i64,
            buffered_elements: ld(&r.buffered_elements) as i64,
            buffered_bytes: ld(&r.buffered_bytes) as i64,
        },
    }
}

/// Attribution rows as last read, and the final totals of nodes whose
/// rows the shim reused.
#[derive(Default)]
struct AttrRows {
    /// (thread index, row index) -> (generation, sample).
    rows: HashMap<(usize, usize), (u64, AttributionSample)>,
    carried: HashMap<(u32, u64, String), AttributionSample>,
}

impl AttrRows {
    fn carry(&mut self, s: AttributionSample) {
        add_sample(&mut self.carried, &s);
    }
}

/// Adds `s` to the total of its (thread, node, op) in `totals`.
fn add_sample(totals: &mut HashMap<(u32, u64, String), AttributionSample>, s: &AttributionSample) {
    let into = totals
        .entry((s.tid, s.node, s.op_path.clone()))
        .or_insert_with(|| AttributionSample {
            tid: s.tid,
            node: s.node,
            op_path: s.op_path.clone(),
            ..Default::default()
        });
    into.cpu_ns += s.cpu_ns;
    into.stops += s.stops;
    into.io_bytes += s.io_bytes;
    into.waits.gil_wait_ns += s.waits.gil_wait_ns;
    into.waits.gil_waits += s.waits.gil_waits;
}

/// Per-thread CPU from /proc. Without a sched_switch probe a thread that
/// exits keeps the value of the last poll that saw it (its CPU after that
/// poll is lost, and counted).
#[derive(Default)]
struct ThreadCpu {
    last: HashMap<u32, ThreadObservation>,
    names: HashMap<u32, String>,
    exited: u64,
    reader: Option<threads::TaskReader>,
}

impl ThreadCpu {
    fn observe(&mut self, pid: i32, registry: Option<&mut NameRegistry>) -> Vec<ThreadObservation> {
        let tasks = self
            .reader
            .get_or_insert_with(|| threads::TaskReader::new(pid))
            .read();
        if let Some(r) = registry {
            let inner: HashMap<u32, u32> = tasks.iter().map(|t| (t.inner_tid, t.tid)).collect();
            for (itid, name) in r.names(&tasks) {
                if let Some(&tid) = inner.get(itid) {
                    self.names.insert(tid, name.clone());
                }
            }
        }
        let live: HashSet<u32> = tasks.iter().map(|t| t.tid).collect();
        for (tid, o) in self.last.iter_mut() {
            if !live.contains(tid) && !o.exited {
                o.exited = true;
                self.exited += 1;
            }
        }
        for t in tasks {
            let name = self.names.get(&t.tid).cloned().unwrap_or(t.comm);
            self.last.insert(
                t.tid,
                ThreadObservation {
                    tid: t.tid,
                    name,
                    cpu_ns: t.cpu_ns,
                    waits: Default::default(),
                    exited: false,
                },
            );
        }
        let mut v: Vec<ThreadObservation> = self.last.values().cloned().collect();
        v.sort_by_key(|t| t.tid);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout both sides compile; a change must be deliberate (and
    /// bump abi::VERSION).
    #[test]
    fn abi_sizes_pinned() {
        assert_eq!(std::mem::size_of::<abi::NodeOffsets>(), 40);
        assert_eq!(std::mem::size_of::<abi::IterSlot>(), 16);
        assert_eq!(std::mem::size_of::<abi::Retired>(), 152);
        assert_eq!(std::mem::size_of::<abi::NodeAttr>(), 64);
        assert_eq!(std::mem::size_of::<abi::IoRow>(), 256);
        assert_eq!(std::mem::size_of::<abi::ThreadSlot>(), 8224);
        assert_eq!(std::mem::size_of::<abi::FileSlot>(), 280);
        assert_eq!(std::mem::size_of::<abi::FdSlot>(), 24);
        assert_eq!(abi::HEADER_SIZE, 5_091_560);
        assert!(abi::DROP_NAMES.len() <= abi::NUM_DROPS);
    }
}
