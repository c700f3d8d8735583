//! The shim's own cost in the target: its time inside its hooks and their
//! clock reads, accumulated per thread in `ThreadSlot::hook_ns` (by
//! `thread::add_hook_ns` and `thread::HookSpan`) for the parent's cost
//! line (`shim_ns`). This module only knows what clock reads cost.
//!
//! Timing a hook costs clock reads of its own, so it is counted cheaply:
//! - `record_stop`, the hot hook (one call per element per op), already
//!   reads the thread's CPU clock at its entry; one more read of that clock
//!   at its exit, on one call in `SELF_TIME_EVERY`, measures the hook from
//!   that entry read to the exit read: its bookkeeping plus exactly one
//!   clock read (the tail of the first and the head of the second), which
//!   is what the hook costs. It is scaled by `SELF_TIME_EVERY`;
//! - rare hooks with costly work (`RemoveNode`'s read of the node, opens,
//!   reads of followed files with their op's prefix) are bracketed by two
//!   monotonic reads (vDSO, tens of ns), plus one calibrated read for the
//!   bracket's own first read;
//! - every other clock read of a hook (the GIL hooks', the two around each
//!   read call) counts at its cost calibrated at load (`calibrate`).
//!
//! What it misses: each hook's entry (the forwarding call, the shared
//! memory's state check, the thread-local access, a few ns), the
//! `GetNext` hook's iterator stack and discovery table (no clock read to
//! hang a count on: a few ns a call, where a `GetNext` call takes
//! microseconds), `close`, the GIL hooks' bookkeeping between their clock
//! reads, the hooks of a thread without a row in the table (one that only
//! reads descriptors not followed: two vDSO clock reads a read call), and
//! the cache lines the shim's tables take from the target's own data.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::clock::clock_ns;

/// One `record_stop` in this many times itself.
pub const SELF_TIME_EVERY: u32 = 16;

/// A CLOCK_MONOTONIC read (vDSO) and a CLOCK_THREAD_CPUTIME_ID read (a
/// system call), ns, as calibrated at load.
static MONO_READ_NS: AtomicU64 = AtomicU64::new(0);
static CPU_READ_NS: AtomicU64 = AtomicU64::new(0);

/// Measures both clocks' read cost: the fastest of a few rounds, in this
/// thread's CPU time (the library's load is single-threaded, and a round
/// is a few microseconds, so the fastest round is rarely interrupted).
/// Costs ~0.2 ms once, at load, in recorded processes only.
pub fn calibrate() {
    const N: u64 = 32;
    const ROUNDS: usize = 5;
    let (mut cpu, mut mono) = (u64::MAX, u64::MAX);
    for _ in 0..ROUNDS {
        // N + 1 intervals between N + 2 reads of the CPU clock: each
        // interval holds one read.
        let t0 = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        for _ in 0..N {
            core::hint::black_box(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID));
        }
        let t1 = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        cpu = cpu.min(t1.saturating_sub(t0) / (N + 1));
        let t0 = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        for _ in 0..N {
            core::hint::black_box(clock_ns(libc::CLOCK_MONOTONIC));
        }
        let t1 = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        mono = mono.min(t1.saturating_sub(t0).saturating_sub(cpu) / N);
    }
    CPU_READ_NS.store(cpu, Ordering::Relaxed);
    MONO_READ_NS.store(mono, Ordering::Relaxed);
}

/// The calibrated cost of `mono` monotonic and `cpu` thread-CPU reads.
pub fn reads_ns(mono: u64, cpu: u64) -> u64 {
    mono.saturating_mul(MONO_READ_NS.load(Ordering::Relaxed))
        .saturating_add(cpu.saturating_mul(CPU_READ_NS.load(Ordering::Relaxed)))
}
