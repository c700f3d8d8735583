//! Both BPF objects: the probe's (bpf/probe.bpf.c: loaded here, its probes
//! attached in `attach`) and the stack sampler's (`sample`), the helpers
//! that read their maps (`maps`) and the raw records they produce
//! (`types`). Every attach failure comes back as an error that names the
//! probe; every drop counted in BPF is read back and reported.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, RingBuffer};

use crate::layout::NodeLayout;

mod attach;
mod error;
mod maps;
pub mod procio;
mod reaper;
pub mod sample;
pub mod stats;
pub mod types;

use maps::{get_u32, own_pid_namespace, percpu_counters, put, read_map, reader, stack_addrs};
use reaper::Reaper;
use sample::RawSample;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/probe.skel.rs"));
}
self::sample::py_cfg!(skel::types::py_cfg);
use skel::{ProbeSkel, ProbeSkelBuilder};

pub use error::BpfError;
pub(crate) use maps::ring_reader;
pub use maps::{drain, RingFeed};
pub use types::{Attr, IoEvent, IterStats, RetiredEvent, SiteKey, ThreadState, DROP_NAMES};

pub struct Bpf<'obj> {
    skel: ProbeSkel<'obj>,
    pid: i32,
    reaper: Reaper,
    /// Inside [`Bpf::quietly`]: nested calls need no warm-up of their own.
    warm: std::cell::Cell<bool>,
    /// How long the last warm-up took (see [`Bpf::detach_lead`]).
    warm_up: std::cell::Cell<Duration>,
}

impl<'obj> Bpf<'obj> {
    /// `io_ringbuf_bytes`: size of the file-event ring buffer (a power of
    /// two, at least a page); small values test that drops are reported.
    /// `wait_stacks`: size the ring buffers of sampled waits' stack copies
    /// for use (the stack sampler runs); else it keeps one page.
    /// `py`: the interpreter whose Python frames those copies carry.
    pub fn load(
        obj: &'obj mut MaybeUninit<OpenObject>,
        pid: i32,
        layout: &NodeLayout,
        io_ringbuf_bytes: Option<u32>,
        wait_stacks: bool,
        py: Option<&crate::python::PyConfig>,
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
            // The sampled blocks' copies, as many, in a ring of their own
            // (bpf/probe.bpf.c says why).
            open.maps
                .block_samples
                .set_max_entries(8 << 20)
                .map_err(BpfError::Load)?;
            // Sampled blocks' stack copies in flight, from the switch-out
            // to the wake-up: one per thread blocked with one (a block in
            // PP_BLOCK_SAMPLE, in windows only). 33 KiB each, 4 MiB in all;
            // a full map is counted (block_copy_map_full).
            open.maps
                .block_copies
                .set_max_entries(128)
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
            if let Some(c) = py.filter(|_| wait_stacks) {
                ro.py_cfg = skel::types::py_cfg::from_config(c);
            }
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

    /// RemoveNode's probe is in: record_stop keys its evidence by node
    /// instance from now on (see `node_ids` in probe.bpf.c).
    pub fn set_node_ids(&self) -> Result<(), BpfError> {
        self.update_global(std::mem::offset_of!(skel::types::bss, node_ids), |_| 1u32)
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

    /// Reader of the sampled blocks' stack copies.
    pub fn block_sample_reader(
        &self,
        sink: Rc<RefCell<Vec<RawSample>>>,
        bad: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'_>, BpfError> {
        reader(
            &self.skel.maps.block_samples,
            "block_samples",
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
        read_map("threads", &self.skel.maps.threads, |k, v| {
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
        read_map("attr", &self.skel.maps.attr, Attr::from_bytes)
    }

    /// Deletes an attribution entry whose node is gone: its values were
    /// read and are final.
    pub fn forget_attribution(&self, a: &Attr) {
        // Already gone is fine.
        let _ = self.skel.maps.attr.delete(&a.key_bytes());
    }

    /// Per call site: (waits, wait ns), cumulative.
    pub fn lock_sites(&self) -> Result<Vec<(SiteKey, SiteTotals)>, BpfError> {
        read_map("lock_sites", &self.skel.maps.lock_sites, |k, v| {
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

/// (waits, wait ns) of one lock call site.
pub type SiteTotals = (u64, u64);

/// A slow path whose entry and return are probed (`Bpf::attach_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitProbe {
    Mutex,
    Gil,
}
