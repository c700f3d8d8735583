//! `plumber-probe run`: the LD_PRELOAD shim inside the command, read
//! through shared memory (shim/src/abi.rs). The parent may read its own
//! child's memory with process_vm_readv, so the autotune model is walked
//! exactly as in `--pid` mode; what needs a probe there comes from the shim
//! here: which iterators run (discovery), the final counters of nodes that
//! die between polls, per-thread waits, file I/O and the attribution rows.
//! Thread CPU comes from /proc/PID/task/*/schedstat.

use std::collections::{HashMap, HashSet};
use std::process::Child;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use plumber_collector::event::{
    AttributionSample, DropCount, Event, FileIo, NodeCounters, NodeObservation, NodeRetired,
    TargetInfo, ThreadObservation, WaitCounters,
};
use tracing::warn;

use crate::derive::Derived;
use crate::layout::NodeLayout;
use crate::mem::Memory;
use crate::recording::{
    await_iterators, Discovery, ModelWalk, Prepared, Round, Source, Stop, NO_MODEL,
};
use crate::shim_abi as abi;
use crate::sink::EventSink;
use crate::target::{self, Target};
use crate::threads::{self, NameRegistry};

/// Measurements `--pid` mode makes that the shim does not (yet): carried in
/// stats.pb and report.json (`not_measured`) and said in the report text,
/// so an absent number is not read as zero.
const NOT_MEASURED: &[&str] = &[
    "absl lock and condition-variable waits, other futex waits",
    "call sites of waits (no stacks)",
    "sampled stacks and their Python frames (no cpu/locks flamegraphs: the shim cannot sample from inside the process without stopping it; --pid can)",
    "GIL waits in Python not called from an extension module (inside py_function they are the thread's off-CPU time, run-queue delay included)",
    "reads of files opened before the recording started",
    "the CPU of a thread after the last poll that saw it, if it exits",
];

pub struct ShimSource<'a> {
    h: &'a abi::Header,
    child: &'a mut Child,
    target: &'a Target,
    pid: i32,
    interval: Duration,
    walk: ModelWalk,
    registry: Option<NameRegistry>,
    cpu: ThreadCpu,
    io_prev: HashMap<u32, [u64; 6]>,
    attr: AttrRows,
    /// Model node -> op path, from every poll (attribution rows name
    /// nodes by address).
    node_path: HashMap<u64, String>,
    retired_tail: u64,
    unreadable: u64,
    no_model_rounds: u64,
}

impl<'a> ShimSource<'a> {
    pub fn new(
        h: &'a abi::Header,
        child: &'a mut Child,
        target: &'a Target,
        derived: &Derived,
        layout: &NodeLayout,
        interval: Duration,
    ) -> Self {
        let pid = target.pid;
        let mem = Memory::new(pid);
        let registry = derived.thread_registry.and_then(|vaddr| {
            let base = threads::load_base(pid, &target.framework.path)?;
            Some(NameRegistry::new(mem, base + vaddr))
        });
        ShimSource {
            h,
            child,
            target,
            pid,
            interval,
            walk: ModelWalk::new(mem, *layout, derived.iter.clone().unwrap_or_default())
                .with_ratios(target, derived),
            registry,
            cpu: ThreadCpu::default(),
            io_prev: HashMap::new(),
            attr: AttrRows::default(),
            node_path: HashMap::new(),
            retired_tail: h.retired_tail.load(Ordering::Acquire),
            unreadable: 0,
            no_model_rounds: 0,
        }
    }

    /// Asks the shim for the iterators that run, until the pipeline runs
    /// (no timeout: the command may take long to start training), then
    /// about 150 ms more. `None` when the command ended or we were stopped.
    fn discover(&mut self) -> Result<Discovery> {
        let h = self.h;
        h.discover.store(0, Ordering::SeqCst);
        for s in &h.iters {
            s.this.store(0, Ordering::Relaxed);
            s.calls.store(0, Ordering::Relaxed);
        }
        h.discover.store(1, Ordering::SeqCst);
        let (child, pid) = (&mut *self.child, self.pid);
        let found = await_iterators(
            || {
                Ok(h.iters
                    .iter()
                    .filter_map(|s| {
                        let it = s.this.load(Ordering::Acquire);
                        (it != 0).then(|| (it, s.calls.load(Ordering::Relaxed)))
                    })
                    .collect())
            },
            || !exited(child) && target::alive(pid),
            None,
        );
        h.discover.store(0, Ordering::SeqCst);
        found
    }

    /// Moves complete retired records from the ring into the sink. Returns
    /// how many had no readable counters.
    fn drain_retired_rows(&mut self, sink: &mut EventSink) -> Result<()> {
        let tail = &mut self.retired_tail;
        let node_path = &mut self.node_path;
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
        self.unreadable += unreadable;
        Ok(())
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
    fn io_deltas(&mut self) -> Vec<FileIo> {
        let prev = &mut self.io_prev;
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
                    pid: None,
                });
            }
        }
        out
    }

    /// Cumulative (thread, node) samples from the shim's record_stop
    /// hook. A thread's row is reused for another node once we have read
    /// it (its old node died); the old node's final totals are then kept
    /// here in `attr`.
    fn attribution(&mut self) -> Vec<AttributionSample> {
        let attr = &mut self.attr;
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
                    op_path: self.node_path.get(&node).cloned().unwrap_or_default(),
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

impl Source for ShimSource<'_> {
    fn target(&self) -> &Target {
        self.target
    }

    fn mode(&self) -> &'static str {
        "model"
    }

    fn walk(&mut self) -> Option<&mut ModelWalk> {
        Some(&mut self.walk)
    }

    fn target_info(&self) -> TargetInfo {
        let mut info = self.target.info(self.mode());
        info.not_measured = NOT_MEASURED.iter().map(|m| m.to_string()).collect();
        info
    }

    fn alive(&mut self) -> bool {
        !exited(self.child) && target::alive(self.pid)
    }

    fn prepare(&mut self, _round: &Round) -> Result<Prepared> {
        if self.walk.has_root() {
            return Ok(Prepared::Ready);
        }
        let iters = match self.discover()? {
            Discovery::Found(iters) => iters,
            Discovery::Stopped { signal: true } => return Ok(Prepared::End(Stop::Signal)),
            Discovery::Stopped { signal: false } | Discovery::TimedOut => {
                return Ok(Prepared::End(Stop::TargetExited))
            }
        };
        if self.walk.find_root(iters) {
            return Ok(Prepared::Ready);
        }
        // Iterators without model nodes: autotune is off.
        self.no_model_rounds += 1;
        if self.no_model_rounds == 3 {
            warn!("{NO_MODEL}; still looking");
        }
        Ok(Prepared::Again)
    }

    fn drain_retired(&mut self, sink: &mut EventSink) -> Result<()> {
        self.drain_retired_rows(sink)
    }

    fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        for n in nodes {
            self.node_path.insert(n.addr, n.path.clone());
        }
    }

    fn after_poll(&mut self, sink: &mut EventSink, mono_ns: u64, first: bool) -> Result<()> {
        let mut threads = self.cpu.observe(self.pid, self.registry.as_mut());
        self.add_waits(&mut threads);
        sink.push(Event::Threads { mono_ns, threads })?;
        let samples = self.attribution();
        sink.push(Event::Attribution { mono_ns, samples })?;
        if first {
            // Files opened from now on can be read whole in the window.
            self.h.record_since_ns.store(mono_ns, Ordering::Release);
        }
        let files = self.io_deltas();
        sink.push(Event::Io { mono_ns, files })
    }

    fn default_interval(&self) -> Duration {
        self.interval
    }

    fn finish(&mut self, _sink: &mut EventSink) -> Result<Vec<DropCount>> {
        let mut drops: Vec<DropCount> = abi::DROP_NAMES
            .iter()
            .zip(&self.h.drops)
            .map(|(what, n)| DropCount::new(*what, n.load(Ordering::Relaxed)))
            .collect();
        drops.extend([
            self.walk.invalid_nodes_drop(),
            DropCount::new("retired_node_unreadable", self.unreadable),
            DropCount::new("exited_threads_cpu_after_last_poll", self.cpu.exited),
        ]);
        Ok(drops)
    }

    /// The command exiting ends a recording without a duration as asked.
    fn in_target_ns(&self) -> Option<u64> {
        Some(
            self.h
                .threads
                .iter()
                .map(|t| t.hook_ns.load(Ordering::Relaxed))
                .fold(0u64, u64::wrapping_add),
        )
    }

    fn exit_end(&self, has_duration: bool) -> (bool, &'static str) {
        (has_duration, "command exited")
    }
}

/// The command has ended (or cannot be waited for).
pub(crate) fn exited(child: &mut Child) -> bool {
    !matches!(child.try_wait(), Ok(None))
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
