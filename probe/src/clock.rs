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
