//! The one clock read of the shim, for its hooks and for timing itself
//! (`cost.rs`): below both, so neither imports the other for it.

/// `clock`'s time in ns (0 if it cannot be read).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; a failure leaves it zero.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
