//! Loading and attaching the BPF programs of bpf/probe.bpf.c, and reading
//! what they produce. Every attach failure comes back as an error that names
//! the probe; every drop counted in BPF is read back and reported.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::path::Path;
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{
    Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder, UprobeMultiOpts,
};
use thiserror::Error;
use tracing::debug;

use crate::layout::NodeLayout;

pub mod sample;
pub mod types;

use sample::RawSample;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/probe.skel.rs"));
}
use skel::{ProbeSkel, ProbeSkelBuilder};

pub use types::{Attr, IoEvent, IterStats, RetiredEvent, SiteKey, ThreadState, DROP_NAMES};

#[derive(Debug, Error)]
pub enum BpfError {
    #[error("loading BPF programs: {0} (needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE)")]
    Load(libbpf_rs::Error),
    #[error("attaching {what} to {lib} at offset {offset:#x}: {source}")]
    Attach {
        what: &'static str,
        lib: String,
        offset: u64,
        source: libbpf_rs::Error,
    },
    #[error("attaching {what} to {lib} at offset {offset:#x}: {source} (uprobes are attached as uprobe_multi links, which need Linux 6.6 or later)")]
    AttachUprobe {
        what: &'static str,
        lib: String,
        offset: u64,
        source: libbpf_rs::Error,
    },
    #[error("reading BPF map {0}: {1}")]
    Map(&'static str, libbpf_rs::Error),
}

pub struct Bpf<'obj> {
    skel: ProbeSkel<'obj>,
    pid: i32,
    reaper: Reaper,
    /// Inside [`Bpf::quietly`]: nested calls need no warm-up of their own.
    warm: std::cell::Cell<bool>,
    /// How long the last warm-up took (see [`Bpf::detach_lead`]).
    warm_up: std::cell::Cell<Duration>,
}

/// Removes the grace-period warm-up probes (see [`Bpf::quietly`]) on a
/// thread of its own: a removal waits ~100 ms for grace periods, and
/// nothing needs to wait for it. One at a time: these are perf-event
/// uprobes, whose removals the kernel serialises anyway, and a queue of
/// them would hold up the next warm-up's registration. Dropping the reaper
/// waits for them all.
struct Reaper {
    tx: Option<mpsc::Sender<Link>>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    fn new() -> Self {
        let (tx, rx) = mpsc::channel::<Link>();
        match std::thread::Builder::new()
            .name("plumber-reaper".into())
            .spawn(move || {
                crate::stop::leave_stop_signals_to_main();
                rx.into_iter().for_each(drop)
            }) {
            Ok(thread) => Reaper {
                tx: Some(tx),
                thread: Some(thread),
            },
            Err(e) => {
                debug!("no reaper thread, warm-up probes are removed in line: {e}");
                Reaper {
                    tx: None,
                    thread: None,
                }
            }
        }
    }

    fn remove(&self, link: Link) {
        if let Some(tx) = &self.tx {
            // A failed send hands the link back: drop it here.
            let _ = tx.send(link);
        }
    }
}

/// Closes `link` on a thread of its own within `scope`: closing a uprobe
/// link waits for RCU grace periods, and closes on separate threads wait
/// for them together.
fn close_apart<'scope>(scope: &'scope std::thread::Scope<'scope, '_>, link: Link) {
    let closer = std::thread::Builder::new()
        .name("plumber-detach".into())
        .stack_size(64 * 1024);
    let close = move || {
        crate::stop::leave_stop_signals_to_main();
        drop(link)
    };
    // A thread that cannot start drops its closure, and so closes the
    // link, right here.
    if let Err(e) = closer.spawn_scoped(scope, close) {
        debug!("detach thread not started, link closed in line: {e}");
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<'obj> Bpf<'obj> {
    /// `io_ringbuf_bytes`: size of the file-event ring buffer (a power of
    /// two, at least a page); small values test that drops are reported.
    /// `wait_stacks`: size the ring buffer of sampled waits' stack copies
    /// for use (the stack sampler runs); else it keeps one page.
    pub fn load(
        obj: &'obj mut MaybeUninit<OpenObject>,
        pid: i32,
        layout: &NodeLayout,
        io_ringbuf_bytes: Option<u32>,
        wait_stacks: bool,
    ) -> Result<Self, BpfError> {
        let builder = ProbeSkelBuilder::default();
        let mut open = builder.open(obj).map_err(BpfError::Load)?;
        if let Some(n) = io_ringbuf_bytes {
            open.maps
                .io_events
                .set_max_entries(n)
                .map_err(BpfError::Load)?;
        }
        if wait_stacks {
            // 256 copies of 32 KiB: a poll's worth of sampled waits on a
            // pipeline contending thousands of times a second.
            open.maps
                .wait_samples
                .set_max_entries(8 << 20)
                .map_err(BpfError::Load)?;
            // Op spans for trace.json: ~35,000 record_stop calls a second
            // on the image pipeline while record_stop is in, 40 bytes
            // each, drained every poll (1 s by default): 4 MiB is ~3 s of
            // them (a window keeps it in for ~0.3 s; --precise for all).
            open.maps
                .spans
                .set_max_entries(4 << 20)
                .map_err(BpfError::Load)?;
        }
        let (pidns_dev, pidns_ino) = own_pid_namespace();
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.target_tgid = pid as u32;
            ro.pidns_dev = pidns_dev;
            ro.pidns_ino = pidns_ino;
            ro.layout.id = layout.id;
            ro.layout.name = layout.name;
            ro.layout.buffered_bytes = layout.buffered_bytes;
            ro.layout.buffered_elements = layout.buffered_elements;
            ro.layout.bytes_consumed = layout.bytes_consumed;
            ro.layout.bytes_produced = layout.bytes_produced;
            ro.layout.num_elements = layout.num_elements;
            ro.layout.processing_time = layout.processing_time;
            ro.layout.output = layout.output;
        }
        let skel = open.load().map_err(BpfError::Load)?;
        Ok(Bpf {
            skel,
            pid,
            reaper: Reaper::new(),
            warm: std::cell::Cell::new(false),
            warm_up: std::cell::Cell::new(Duration::ZERO),
        })
    }

    fn attach(
        &self,
        prog: &libbpf_rs::ProgramMut<'_>,
        what: &'static str,
        ret: bool,
        lib: &Path,
        offset: u64,
    ) -> Result<Link, BpfError> {
        // uprobe_multi links, not perf-event ones: closing a perf-event
        // uprobe first waits ~35 ms for other grace periods and only then
        // unregisters, too late for `quietly` to help. A multi link
        // unregisters as soon as it is closed.
        let opts = UprobeMultiOpts {
            offsets: vec![offset as usize],
            retprobe: ret,
            ..Default::default()
        };
        self.quietly(|| prog.attach_uprobe_multi_with_opts(self.pid, lib, "", opts))
            .map_err(|source| BpfError::AttachUprobe {
                what,
                lib: lib.display().to_string(),
                offset,
                source,
            })
    }

    /// Runs `f`, an attach or a detach of a uprobe the target may be
    /// executing, right after registering a probe no one executes (see
    /// `gp_warmer` in bpf/probe.bpf.c): without it, target threads that
    /// hit the probe while the kernel (un)registers it block for an RCU
    /// grace period, every pipeline thread at once for `record_stop`
    /// (measured: 4 threads blocked 6-8 ms at each window's end).
    ///
    /// Attaches may be grouped in one call: a registration keeps the grace
    /// period paid for the next ones right after it. Detaches in a row may
    /// not: each close waits for further grace periods after its
    /// unregistration, long enough for the warm-up to lapse, so
    /// [`Bpf::detach`] closes its links at once, from threads of their own.
    pub fn quietly<T>(&self, f: impl FnOnce() -> T) -> T {
        if self.warm.get() {
            return f();
        }
        let t0 = Instant::now();
        let warm = std::env::current_exe().ok().and_then(|exe| {
            // Our own executable: the target does not map it, so the
            // registration installs nothing and no one waits for it.
            self.skel
                .progs
                .gp_warmer
                .attach_uprobe(false, self.pid, &exe, 0)
                .map_err(|e| debug!("grace-period warm-up probe not attached: {e}"))
                .ok()
        });
        self.warm.set(warm.is_some());
        if warm.is_some() {
            self.warm_up.set(t0.elapsed());
        }
        let out = f();
        self.warm.set(false);
        if let Some(w) = warm {
            self.reaper.remove(w);
        }
        out
    }

    /// How long before a probe must be gone its detach should start: the
    /// warm-up in [`Bpf::quietly`] waits for a grace period (tens of ms)
    /// with the probes still in, so a detach started on time leaves them
    /// trapping that long past their part of a window. The last warm-up's
    /// length is the estimate, at most `MAX_LEAD`.
    pub fn detach_lead(&self) -> Duration {
        const MAX_LEAD: Duration = Duration::from_millis(100);
        self.warm_up.get().min(MAX_LEAD)
    }

    /// Detaches probes, all under one [`Bpf::quietly`]: each link is
    /// closed on a thread of its own, so every unregistration happens while
    /// the warm-up holds and the grace periods each close then waits for
    /// overlap. Closed one after the other, each with its own warm-up, the
    /// lock and GIL probes took ~0.45 s to go, all the while still trapping
    /// in the target (strace of a default recording: 4 links, ~110 ms
    /// each).
    pub fn detach(&self, links: impl IntoIterator<Item = Link>) {
        let links: Vec<Link> = links.into_iter().collect();
        match links.len() {
            0 => {}
            1 => self.quietly(|| drop(links)),
            _ => self.quietly(|| {
                std::thread::scope(|s| links.into_iter().for_each(|link| close_apart(s, link)))
            }),
        }
    }

    /// The one-shot discovery probe on `DatasetBaseIterator::GetNext`.
    pub fn attach_discovery(&self, lib: &Path, offset: u64) -> Result<Link, BpfError> {
        self.attach(
            &self.skel.progs.discover_getnext,
            "GetNext discovery probe",
            false,
            lib,
            offset,
        )
    }

    /// `Model::RemoveNode`: rare (per file / per epoch), stays attached.
    pub fn attach_remove_node(&self, lib: &Path, offset: u64) -> Result<Link, BpfError> {
        self.attach(
            &self.skel.progs.node_removed,
            "Model::RemoveNode probe",
            false,
            lib,
            offset,
        )
    }

    /// Fallback per-call probes on GetNext entry and return.
    pub fn attach_getnext_counting(
        &self,
        lib: &Path,
        offset: u64,
    ) -> Result<(Link, Link), BpfError> {
        // Return probe first, as in `attach_wait`: a call entered between
        // the two attaches would push a frame whose return is never seen,
        // and the thread's GetNext stack would stay that much deeper for
        // the rest of the recording (seen once as tens of thousands of
        // getnext_stack_overflow drops, the nested ops unseen). A return
        // without an entry pops nothing and is counted.
        let exit = self.attach(
            &self.skel.progs.getnext_exit,
            "GetNext return probe",
            true,
            lib,
            offset,
        )?;
        let enter = self.attach(
            &self.skel.progs.getnext_enter,
            "GetNext entry probe",
            false,
            lib,
            offset,
        )?;
        Ok((enter, exit))
    }

    /// `model::Node::record_stop`, during attribution windows only.
    pub fn attach_record_stop(&self, lib: &Path, offset: u64) -> Result<Link, BpfError> {
        self.attach(
            &self.skel.progs.record_stop_probe,
            "record_stop attribution probe",
            false,
            lib,
            offset,
        )
    }

    /// Entry and return probes on one lock slow path.
    pub fn attach_wait(
        &self,
        kind: WaitProbe,
        lib: &Path,
        offset: u64,
    ) -> Result<(Link, Link), BpfError> {
        let p = &self.skel.progs;
        let (enter, exit, what) = match kind {
            WaitProbe::Mutex => (&p.mutex_enter, &p.mutex_exit, "absl::Mutex::LockSlow probe"),
            WaitProbe::Gil => (&p.gil_enter, &p.gil_exit, "GIL acquisition probe"),
        };
        // Return probe first: a thread entering between the two attaches
        // must not count an entry whose return is never seen (its nesting
        // depth would never come back to zero); a return without an entry
        // is harmless and counted.
        let exit = self.attach(exit, what, true, lib, offset)?;
        let enter = self.attach(enter, what, false, lib, offset)?;
        Ok((enter, exit))
    }

    /// The scheduler tracepoint (BTF-typed, so no tracefs needed; attribution
    /// windows only).
    pub fn attach_switch(&self) -> Result<Link, BpfError> {
        self.skel
            .progs
            .on_switch
            .attach()
            .map_err(|source| BpfError::Attach {
                what: "sched_switch",
                lib: "kernel tracepoint".into(),
                offset: 0,
                source,
            })
    }

    /// Task free: final runtime of threads that exit.
    pub fn attach_exit_hook(&self) -> Result<Link, BpfError> {
        self.skel
            .progs
            .on_free
            .attach()
            .map_err(|source| BpfError::Attach {
                what: "sched_process_free",
                lib: "kernel tracepoint".into(),
                offset: 0,
                source,
            })
    }

    /// Uprobes on the target's libc file functions (see bpf/probe.bpf.c):
    /// one return probe per function, attached before its entry probe (an
    /// entry without its return would leave a stale call; a return without
    /// entry is ignored). Close needs no return probe.
    pub fn attach_libc_io(
        &self,
        lib: &Path,
        points: &[crate::derive::LibcIoPoint],
    ) -> Result<Vec<Link>, BpfError> {
        use crate::derive::LibcIo;
        let p = &self.skel.progs;
        // One warm-up for all: the reaper removes them one at a time, ~0.1 s
        // each, and one per probe (23 on glibc 2.36) kept it busy for the
        // recording's first 2.5 s and held a 1 s recording's exit back by
        // 1.5 s (its drop waits for them).
        self.quietly(|| {
            let mut links = Vec::new();
            for &(kind, offset, _name) in points {
                let enter = match kind {
                    LibcIo::Read => &p.libc_read_enter,
                    LibcIo::Open => &p.libc_open_enter,
                    LibcIo::OpenAt => &p.libc_openat_enter,
                    LibcIo::Close => &p.libc_close_enter,
                };
                if kind != LibcIo::Close {
                    links.push(self.attach(
                        &p.libc_io_exit,
                        "libc file return probe",
                        true,
                        lib,
                        offset,
                    )?);
                }
                links.push(self.attach(enter, "libc file probe", false, lib, offset)?);
            }
            Ok(links)
        })
    }

    /// The file syscalls' own tracepoints; without tracefs, the raw
    /// sys_enter/sys_exit ones (every syscall of every process pays a
    /// little then).
    pub fn attach_file_syscalls(&self) -> Result<Vec<Link>, BpfError> {
        let p = &self.skel.progs;
        let mut links = Vec::new();
        let mut failed = None;
        for name in FILE_SYSCALLS {
            for (prog, dir) in [(&p.file_sys_enter, "enter"), (&p.file_sys_exit, "exit")] {
                match prog.attach_tracepoint(
                    libbpf_rs::TracepointCategory::Syscalls,
                    format!("sys_{dir}_{name}"),
                ) {
                    Ok(l) => links.push(l),
                    Err(e) => failed = Some(e),
                }
            }
        }
        let Some(e) = failed else {
            return Ok(links);
        };
        tracing::info!("syscall tracepoints unavailable ({e}); using raw sys_enter/sys_exit");
        drop(links);
        let mut links = Vec::new();
        for (prog, what) in [(&p.on_sys_enter, "sys_enter"), (&p.on_sys_exit, "sys_exit")] {
            links.push(prog.attach().map_err(|source| BpfError::Attach {
                what,
                lib: "kernel tracepoint".into(),
                offset: 0,
                source,
            })?);
        }
        Ok(links)
    }

    /// A new attribution window, not open yet: nothing counts while its
    /// probes are being attached.
    pub fn window_pending(&self) -> Result<(), BpfError> {
        use skel::types::bss;
        use std::mem::offset_of;
        self.update_bss(|b| {
            let gen = get_u32(b, offset_of!(bss, attr_gen)).wrapping_add(1);
            put(b, offset_of!(bss, attr_gen), &gen.to_ne_bytes());
            put(b, offset_of!(bss, attr_open_ns), &0u64.to_ne_bytes());
            put(b, offset_of!(bss, attr_close_ns), &0u64.to_ne_bytes());
        })
    }

    /// The window's probes are in: what threads do from `mono_ns`
    /// (CLOCK_MONOTONIC, the BPF side's ktime) on counts.
    pub fn window_open(&self, mono_ns: u64) -> Result<(), BpfError> {
        self.set_u64(
            std::mem::offset_of!(skel::types::bss, attr_open_ns),
            mono_ns,
        )
    }

    /// The window ends at `mono_ns`: each thread's next stop books its
    /// stretch up to then, and nothing after it counts.
    pub fn window_close(&self, mono_ns: u64) -> Result<(), BpfError> {
        self.set_u64(
            std::mem::offset_of!(skel::types::bss, attr_close_ns),
            mono_ns,
        )
    }

    /// Call before attaching or detaching the lock and GIL probes: a new,
    /// odd generation, in which nothing unmatched counts as lost (see
    /// `wait_gen` in probe.bpf.c).
    pub fn settle_waits(&self) -> Result<(), BpfError> {
        self.update_global(std::mem::offset_of!(skel::types::bss, wait_gen), |g| {
            (g | 1).wrapping_add(2)
        })
    }

    /// Call once they are all attached: a new, even generation.
    pub fn waits_attached(&self) -> Result<(), BpfError> {
        self.update_global(std::mem::offset_of!(skel::types::bss, wait_gen), |g| {
            (g | 1).wrapping_add(1)
        })
    }

    /// Whether lock, condition and GIL waits count in the totals and sites.
    pub fn set_count_waits(&self, on: bool) -> Result<(), BpfError> {
        self.update_global(std::mem::offset_of!(skel::types::bss, count_waits), |_| {
            u32::from(on)
        })
    }

    /// Whether sampled lock and GIL waits send a copy of their stack.
    pub fn set_copy_wait_stacks(&self, on: bool) -> Result<(), BpfError> {
        self.update_global(
            std::mem::offset_of!(skel::types::bss, copy_wait_stacks),
            |_| u32::from(on),
        )
    }

    /// record_stop sends op spans (trace.json) from now on.
    pub fn set_trace_spans(&self, on: bool) -> Result<(), BpfError> {
        self.update_global(std::mem::offset_of!(skel::types::bss, trace_spans), |_| {
            u32::from(on)
        })
    }

    /// Reader of the op spans.
    pub fn span_reader(
        &self,
        sink: Rc<RefCell<Vec<types::RawSpan>>>,
        bad: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'_>, BpfError> {
        reader(
            &self.skel.maps.spans,
            "spans",
            types::RawSpan::from_bytes,
            sink,
            bad,
        )
    }

    /// Reader of the sampled waits' stack copies.
    pub fn wait_sample_reader(
        &self,
        sink: Rc<RefCell<Vec<RawSample>>>,
        bad: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'_>, BpfError> {
        reader(
            &self.skel.maps.wait_samples,
            "wait_samples",
            RawSample::from_bytes,
            sink,
            bad,
        )
    }

    /// Rewrites one u32 of the BPF side's .bss (offsets from the generated
    /// skeleton's own layout of it).
    fn update_global(&self, offset: usize, f: impl FnOnce(u32) -> u32) -> Result<(), BpfError> {
        self.update_bss(|b| {
            let old = get_u32(b, offset);
            put(b, offset, &f(old).to_ne_bytes());
        })
    }

    /// Sets one u64 of the BPF side's .bss.
    fn set_u64(&self, offset: usize, v: u64) -> Result<(), BpfError> {
        self.update_bss(|b| put(b, offset, &v.to_ne_bytes()))
    }

    /// Rewrites the BPF side's .bss in one update, so that fields changed
    /// together are seen together.
    fn update_bss(&self, f: impl FnOnce(&mut [u8])) -> Result<(), BpfError> {
        let m = &self.skel.maps.bss;
        let key = 0u32.to_ne_bytes();
        let mut v = m
            .lookup(&key, MapFlags::ANY)
            .map_err(|e| BpfError::Map("bss", e))?
            .unwrap_or_default();
        if v.is_empty() {
            return Ok(());
        }
        f(&mut v);
        m.update(&key, &v, MapFlags::ANY)
            .map_err(|e| BpfError::Map("bss", e))
    }

    /// Per-thread state, keyed by global tid.
    pub fn threads(&self) -> Result<Vec<(u32, ThreadState)>, BpfError> {
        self.read_map("threads", &self.skel.maps.threads, |k, v| {
            Some((
                u32::from_ne_bytes(k.get(0..4)?.try_into().ok()?),
                ThreadState::from_bytes(v)?,
            ))
        })
    }

    pub fn forget_thread(&self, tid: u32) {
        // Already gone is fine: the thread's values were read.
        let _ = self.skel.maps.threads.delete(&tid.to_ne_bytes());
    }

    pub fn attribution(&self) -> Result<Vec<Attr>, BpfError> {
        self.read_map("attr", &self.skel.maps.attr, Attr::from_bytes)
    }

    /// Per call site: (waits, wait ns), cumulative.
    pub fn lock_sites(&self) -> Result<Vec<(SiteKey, SiteTotals)>, BpfError> {
        self.read_map("lock_sites", &self.skel.maps.lock_sites, |k, v| {
            Some((SiteKey::from_bytes(k)?, types::site_value(v)?))
        })
    }

    /// User stack addresses of a stack id, innermost first.
    pub fn stack(&self, id: i64) -> Vec<u64> {
        stack_addrs(&self.skel.maps.stack_traces, id)
    }

    /// Marks a file descriptor of the target as one whose reads are
    /// followed (for files already open when we attach).
    pub fn track_fd(&self, fd: u32) -> Result<(), BpfError> {
        self.skel
            .maps
            .fds
            // struct pp_fd with no stack yet (read_tid 0).
            .update(&fd.to_ne_bytes(), &[0u8; 16], MapFlags::ANY)
            .map_err(|e| BpfError::Map("fds", e))
    }

    fn read_map<T>(
        &self,
        name: &'static str,
        m: &libbpf_rs::MapMut<'_>,
        decode: impl Fn(&[u8], &[u8]) -> Option<T>,
    ) -> Result<Vec<T>, BpfError> {
        let mut out = Vec::new();
        for k in m.keys() {
            // A key deleted between keys() and lookup() is simply skipped.
            if let Some(v) = m
                .lookup(&k, MapFlags::ANY)
                .map_err(|e| BpfError::Map(name, e))?
            {
                if let Some(t) = decode(&k, &v) {
                    out.push(t);
                }
            }
        }
        Ok(out)
    }

    /// A ring buffer reader for file events.
    pub fn io_reader(
        &self,
        sink: Rc<RefCell<Vec<IoEvent>>>,
        bad: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'_>, BpfError> {
        reader(
            &self.skel.maps.io_events,
            "io_events",
            IoEvent::from_bytes,
            sink,
            bad,
        )
    }

    /// Iterator pointers seen by the discovery probe, with hit counts.
    pub fn seen_iterators(&self) -> Result<Vec<(u64, u64)>, BpfError> {
        let m = &self.skel.maps.seen_iters;
        let mut out = Vec::new();
        for k in m.keys() {
            let Ok(kb) = <[u8; 8]>::try_from(k.as_slice()) else {
                continue;
            };
            let v = m
                .lookup(&k, MapFlags::ANY)
                .map_err(|e| BpfError::Map("seen_iters", e))?
                .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                .map(u64::from_ne_bytes)
                .unwrap_or(0);
            out.push((u64::from_ne_bytes(kb), v));
        }
        Ok(out)
    }

    pub fn clear_seen_iterators(&self) {
        let m = &self.skel.maps.seen_iters;
        let keys: Vec<Vec<u8>> = m.keys().collect();
        for k in keys {
            // A key deleted concurrently is not an error worth reporting.
            let _ = m.delete(&k);
        }
    }

    /// Fallback mode: per-iterator GetNext statistics.
    pub fn iter_stats(&self) -> Result<Vec<(u64, IterStats)>, BpfError> {
        let m = &self.skel.maps.iter_stats;
        let mut out = Vec::new();
        for k in m.keys() {
            let Ok(kb) = <[u8; 8]>::try_from(k.as_slice()) else {
                continue;
            };
            if let Some(v) = m
                .lookup(&k, MapFlags::ANY)
                .map_err(|e| BpfError::Map("iter_stats", e))?
            {
                if let Some(s) = IterStats::from_bytes(&v) {
                    out.push((u64::from_ne_bytes(kb), s));
                }
            }
        }
        Ok(out)
    }

    /// Drop counters summed over CPUs, indexed like `DROP_NAMES`.
    pub fn drops(&self) -> Result<Vec<u64>, BpfError> {
        percpu_counters(&self.skel.maps.drops, DROP_NAMES.len())
            .map_err(|e| BpfError::Map("drops", e))
    }

    /// A ring buffer reader that appends retired-node events to `sink`;
    /// malformed records are counted in `bad`.
    pub fn retired_reader(
        &self,
        sink: Rc<RefCell<Vec<RetiredEvent>>>,
        bad: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'_>, BpfError> {
        reader(
            &self.skel.maps.events,
            "events",
            RetiredEvent::from_bytes,
            sink,
            bad,
        )
    }
}

/// [`ring_reader`] for a map of this object, its errors naming the map.
fn reader<T: 'static>(
    map: &dyn MapCore,
    name: &'static str,
    parse: fn(&[u8]) -> Option<T>,
    sink: Rc<RefCell<Vec<T>>>,
    bad: Rc<RefCell<u64>>,
) -> Result<RingBuffer<'static>, BpfError> {
    ring_reader(map, parse, sink, bad).map_err(|e| BpfError::Map(name, e))
}

/// A reader of one ring buffer whose records `parse` decodes into `sink`;
/// records it rejects are counted in `bad`. Also the stack sampler's.
pub(crate) fn ring_reader<T: 'static>(
    map: &dyn MapCore,
    parse: fn(&[u8]) -> Option<T>,
    sink: Rc<RefCell<Vec<T>>>,
    bad: Rc<RefCell<u64>>,
) -> Result<RingBuffer<'static>, libbpf_rs::Error> {
    let mut b = RingBufferBuilder::new();
    b.add(map, move |data: &[u8]| {
        match parse(data) {
            Some(e) => sink.borrow_mut().push(e),
            None => *bad.borrow_mut() += 1,
        }
        0
    })?;
    b.build()
}

/// The addresses of a BPF stack-trace map entry, innermost first (empty
/// for a failed or evicted id).
pub(crate) fn stack_addrs(map: &impl MapCore, id: i64) -> Vec<u64> {
    let Ok(id) = u32::try_from(id) else {
        return Vec::new();
    };
    match map.lookup(&id.to_ne_bytes(), MapFlags::ANY) {
        Ok(Some(v)) => v
            .chunks_exact(8)
            .filter_map(|c| c.try_into().ok().map(u64::from_ne_bytes))
            .take_while(|&a| a != 0)
            .collect(),
        _ => Vec::new(),
    }
}

/// Entries 0..n of a per-CPU array of u64 counters, summed over CPUs.
pub(crate) fn percpu_counters(map: &impl MapCore, n: usize) -> Result<Vec<u64>, libbpf_rs::Error> {
    let mut out = vec![0u64; n];
    for (i, slot) in out.iter_mut().enumerate() {
        let key = (i as u32).to_ne_bytes();
        if let Some(per_cpu) = map.lookup_percpu(&key, MapFlags::ANY)? {
            *slot = per_cpu
                .iter()
                .filter_map(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                .map(u64::from_ne_bytes)
                .sum();
        }
    }
    Ok(out)
}

/// Syscalls whose tracepoints follow file I/O (x86-64 names).
const FILE_SYSCALLS: [&str; 9] = [
    "read", "pread64", "readv", "preadv", "preadv2", "open", "openat", "openat2", "close",
];

/// (waits, wait ns) of one lock call site.
pub type SiteTotals = (u64, u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitProbe {
    Mutex,
    Gil,
}

/// Our PID namespace as the kernel names it for
/// `bpf_get_ns_current_pid_tgid`: the nsfs device in the kernel's dev_t
/// encoding (major << 20 | minor; stat() returns the userspace encoding) and
/// the inode. (0, 0) if unknown: BPF then compares global PIDs, which is
/// right when we run in the initial namespace.
pub(crate) fn own_pid_namespace() -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self/ns/pid") {
        Ok(m) => {
            let dev = m.dev();
            let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
            ((major << 20) | minor, m.ino())
        }
        Err(e) => {
            tracing::warn!("cannot read our PID namespace ({e}); filtering on global PIDs");
            (0, 0)
        }
    }
}

/// Drains a ring buffer without blocking.
pub fn drain(rb: &RingBuffer<'_>) {
    // consume(), not poll(0): the file events come without wakeups
    // (BPF_RB_NO_WAKEUP), so epoll would not report them. consume()
    // errors only when a callback returns an error; ours do not.
    let _ = rb.consume();
}

/// The u32 at `at` in a copy of the .bss (0 past its end).
fn get_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|f| f.try_into().ok())
        .map(u32::from_ne_bytes)
        .unwrap_or(0)
}

/// Writes `bytes` at `at` in a copy of the .bss (nothing past its end).
fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(f) = b.get_mut(at..at + bytes.len()) {
        f.copy_from_slice(bytes);
    }
}
