//! Clocks: the monotonic instant events are stamped with, and the wall
//! clock beside it.

use std::time::{SystemTime, UNIX_EPOCH};

/// (CLOCK_MONOTONIC, wall clock) now, in ns; the BPF side stamps with the
/// same monotonic clock (`bpf_ktime_get_ns`).
pub fn now_ns() -> (u64, u64) {
    let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0);
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (mono, wall)
}

/// Our own process's CPU time, user and system, all threads, ns; None when
/// getrusage fails (on ourselves it does not).
pub fn own_cpu_ns() -> Option<u64> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the valid, writable
    // buffer it is given; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded, so it initialised the struct (and it
    // was zeroed before: every bit pattern of it is valid anyway).
    let ru = unsafe { ru.assume_init() };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    Some(ns(ru.ru_utime) + ns(ru.ru_stime))
}
