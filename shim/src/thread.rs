//! Per-thread state of the shim (thread-local, constant-initialised, no
//! destructor: no allocation and usable from any hook) and the thread's row
//! in the shared attribution table.

use core::cell::Cell;
use core::sync::atomic::Ordering;

use crate::abi::{self, Header, NodeAttr, ThreadSlot};
use crate::clock::clock_ns;
use crate::cost;

/// Not looked up yet / no row (table full).
const UNSET: u32 = u32::MAX;
const NONE: u32 = u32::MAX - 1;

pub struct ThreadState {
    slot: Cell<u32>,
    /// Thread CPU at the previous record_stop (0: none yet).
    last_cpu: Cell<u64>,
    /// GIL waits and bytes read since the previous record_stop.
    seg_gil_ns: Cell<u64>,
    seg_gil_waits: Cell<u64>,
    seg_io: Cell<u64>,
    /// The iterators whose GetNext runs on this thread, innermost last.
    iters: [Cell<u64>; STACK],
    depth: Cell<u32>,
    /// Nesting of PyGILState_Ensure, and the outermost call's start
    /// (monotonic and thread-CPU ns).
    py_depth: Cell<u32>,
    py_wall0: Cell<u64>,
    py_cpu0: Cell<u64>,
    /// record_stop calls, for timing one in `cost::SELF_TIME_EVERY`.
    stops: Cell<u32>,
}

const STACK: usize = 32;

thread_local! {
    static STATE: ThreadState = const {
        ThreadState {
            slot: Cell::new(UNSET),
            last_cpu: Cell::new(0),
            seg_gil_ns: Cell::new(0),
            seg_gil_waits: Cell::new(0),
            seg_io: Cell::new(0),
            iters: [const { Cell::new(0) }; STACK],
            depth: Cell::new(0),
            py_depth: Cell::new(0),
            py_wall0: Cell::new(0),
            py_cpu0: Cell::new(0),
            stops: Cell::new(0),
        }
    };
}

/// Entering an iterator's GetNext on this thread.
pub fn push_iter(it: u64) {
    let _ = STATE.try_with(|st| {
        let d = st.depth.get();
        if let Some(c) = st.iters.get(d as usize) {
            c.set(it);
        }
        // Deeper than STACK: counted in depth, the innermost ones unknown.
        st.depth.set(d.saturating_add(1));
    });
}

pub fn pop_iter() {
    let _ = STATE.try_with(|st| st.depth.set(st.depth.get().saturating_sub(1)));
}

/// The innermost iterator running on this thread, 0 if none (or unknown).
pub fn current_iter() -> u64 {
    STATE
        .try_with(|st| {
            let d = st.depth.get() as usize;
            d.checked_sub(1)
                .and_then(|i| st.iters.get(i))
                .map_or(0, Cell::get)
        })
        .unwrap_or(0)
}

/// This thread's row index in the shared table, if it has one.
pub fn slot_index(h: &Header) -> Option<u32> {
    STATE
        .try_with(|st| slot(h, st).map(|_| st.slot.get()))
        .ok()
        .flatten()
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// This thread's row, claimed on first use.
fn slot<'h>(h: &'h Header, st: &ThreadState) -> Option<&'h ThreadSlot> {
    let mut i = st.slot.get();
    if i == UNSET {
        i = claim(h);
        st.slot.set(i);
    }
    h.threads.get(i as usize)
}

#[cold]
fn claim(h: &Header) -> u32 {
    let tid = gettid();
    let start = (tid as usize).wrapping_mul(2_654_435_761) % abi::THREAD_SLOTS;
    for k in 0..abi::THREAD_SLOTS {
        let i = (start + k) % abi::THREAD_SLOTS;
        let Some(s) = h.threads.get(i) else { break };
        // A reused tid (the old thread exited) continues its row: rows are
        // per thread id, like the kernel's per-thread counters.
        match s
            .tid
            .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return i as u32,
            Err(t) if t == tid => return i as u32,
            Err(_) => {}
        }
    }
    h.drops[abi::DROP_THREAD_TABLE_FULL].fetch_add(1, Ordering::Relaxed);
    NONE
}

fn node_row<'s>(h: &Header, s: &'s ThreadSlot, node: u64) -> Option<&'s NodeAttr> {
    // Only this thread writes its row's keys: find the node or a free
    // entry; else reuse one the parent has read since its last update.
    // Per-file and per-epoch nodes die constantly, and a dead node is
    // never updated again, so such a row exists unless the thread works
    // for more live nodes than it has rows.
    let seq = h.poll_seq.load(Ordering::Acquire);
    let mut reusable = None;
    for n in &s.nodes {
        let cur = n.node.load(Ordering::Relaxed);
        if cur == node {
            n.stamp.store(seq, Ordering::Relaxed);
            return Some(n);
        }
        if cur == 0 {
            n.stamp.store(seq, Ordering::Relaxed);
            n.node.store(node, Ordering::Release);
            return Some(n);
        }
        // The parent bumps poll_seq, then reads: with the sequence 3 past
        // the stamp, a read that began after the last update has ended.
        if reusable.is_none() && n.stamp.load(Ordering::Relaxed).saturating_add(3) <= seq {
            reusable = Some(n);
        }
    }
    let Some(n) = reusable else {
        h.drops[abi::DROP_NODE_TABLE_FULL].fetch_add(1, Ordering::Relaxed);
        return None;
    };
    n.gen.fetch_add(1, Ordering::AcqRel);
    for c in [
        &n.cpu_ns,
        &n.stops,
        &n.gil_wait_ns,
        &n.gil_waits,
        &n.io_bytes,
    ] {
        c.store(0, Ordering::Relaxed);
    }
    n.node.store(node, Ordering::Relaxed);
    n.stamp.store(seq, Ordering::Relaxed);
    n.gen.fetch_add(1, Ordering::Release);
    Some(n)
}

/// `record_stop(node)`: the stretch of work since this thread's previous
/// stop was done for `node`.
pub fn on_record_stop(h: &Header, node: u64) {
    let _ = STATE.try_with(|st| {
        let now = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        book_stop(h, st, node, now);
        // The hook's own time, from its entry read to here (see cost.rs).
        let k = st.stops.get().wrapping_add(1);
        st.stops.set(k);
        if k % cost::SELF_TIME_EVERY == 0 {
            let dt = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(now);
            add_hook(h, st, dt.saturating_mul(u64::from(cost::SELF_TIME_EVERY)));
        }
    });
}

/// Books the stretch that ended at `now` (thread CPU) to `node`.
fn book_stop(h: &Header, st: &ThreadState, node: u64, now: u64) {
    let last = st.last_cpu.replace(now);
    let (gil_ns, gil_waits, io) = (
        st.seg_gil_ns.replace(0),
        st.seg_gil_waits.replace(0),
        st.seg_io.replace(0),
    );
    // The first stop of a thread: what came before is not known to
    // belong to this node.
    if last == 0 || node == 0 {
        return;
    }
    let Some(s) = slot(h, st) else { return };
    let Some(n) = node_row(h, s, node) else {
        return;
    };
    n.cpu_ns
        .fetch_add(now.saturating_sub(last), Ordering::Relaxed);
    n.stops.fetch_add(1, Ordering::Relaxed);
    n.gil_wait_ns.fetch_add(gil_ns, Ordering::Relaxed);
    n.gil_waits.fetch_add(gil_waits, Ordering::Relaxed);
    n.io_bytes.fetch_add(io, Ordering::Relaxed);
}

/// Adds `ns` of the shim's own time to this thread's row (see cost.rs).
pub fn add_hook_ns(h: &Header, ns: u64) {
    if ns == 0 {
        return;
    }
    let _ = STATE.try_with(|st| add_hook(h, st, ns));
}

/// A stretch of a rare hook's work, timed on the monotonic clock (it costs
/// two reads), added to this thread's `hook_ns` (see cost.rs).
pub struct HookSpan(u64);

impl HookSpan {
    pub fn start() -> HookSpan {
        HookSpan(clock_ns(libc::CLOCK_MONOTONIC))
    }

    /// The stretch plus the start's own read.
    pub fn end(self, h: &Header) {
        let dt = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(self.0);
        add_hook_ns(h, dt.saturating_add(cost::reads_ns(1, 0)));
    }
}

fn add_hook(h: &Header, st: &ThreadState, ns: u64) {
    // Only a thread that has a row already: the shim's own cost must not
    // claim rows (a thread that only reads pipes and sockets would take
    // one for life).
    let i = st.slot.get();
    if i == UNSET || i == NONE {
        return;
    }
    if let Some(s) = h.threads.get(i as usize) {
        // Only this thread writes its row's hook_ns: no locked add needed.
        let v = s.hook_ns.load(Ordering::Relaxed);
        s.hook_ns.store(v.wrapping_add(ns), Ordering::Relaxed);
    }
}

/// A GIL acquisition that took `ns`.
pub fn on_gil_wait(h: &Header, ns: u64) {
    let _ = STATE.try_with(|st| {
        st.seg_gil_ns.set(st.seg_gil_ns.get().wrapping_add(ns));
        st.seg_gil_waits.set(st.seg_gil_waits.get().wrapping_add(1));
        if let Some(s) = slot(h, st) {
            s.gil_wait_ns.fetch_add(ns, Ordering::Relaxed);
            s.gil_waits.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Entering PyGILState_Ensure (a TensorFlow thread about to run Python).
pub fn py_enter() {
    let _ = STATE.try_with(|st| {
        let d = st.py_depth.get();
        if d == 0 {
            st.py_wall0.set(clock_ns(libc::CLOCK_MONOTONIC));
            st.py_cpu0.set(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID));
        }
        st.py_depth.set(d.saturating_add(1));
    });
}

/// Inside an Ensure..Release span, whose off-CPU time already counts
/// every GIL wait in it.
pub fn in_py() -> bool {
    STATE.try_with(|st| st.py_depth.get() > 0).unwrap_or(false)
}

/// Leaving PyGILState_Release. From the outermost Ensure to here the
/// thread runs Python: the time it was not on a CPU is time it waited for
/// the GIL (the first acquisition, and every re-acquisition after the
/// interpreter's switch interval made it drop the GIL, which happen inside
/// libpython where no hook can see them), plus any run-queue delay.
pub fn py_leave(h: &Header) {
    let off_cpu = STATE
        .try_with(|st| {
            let d = st.py_depth.get();
            st.py_depth.set(d.saturating_sub(1));
            if d != 1 {
                return None;
            }
            let wall = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(st.py_wall0.get());
            let cpu = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(st.py_cpu0.get());
            Some(wall.saturating_sub(cpu))
        })
        .ok()
        .flatten();
    if let Some(ns) = off_cpu {
        on_gil_wait(h, ns);
        // The outermost Ensure's two reads and these two.
        add_hook_ns(h, cost::reads_ns(2, 2));
    }
}

/// `bytes` read from a tracked file in `ns`.
pub fn on_read(h: &Header, bytes: u64, ns: u64) {
    let _ = STATE.try_with(|st| {
        st.seg_io.set(st.seg_io.get().wrapping_add(bytes));
        if let Some(s) = slot(h, st) {
            s.read_ns.fetch_add(ns, Ordering::Relaxed);
        }
    });
}
