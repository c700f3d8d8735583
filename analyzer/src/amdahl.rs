//! Scaling of an op whose threads wait for a lock or for Python's GIL.
//!
//! Plumber scales an op's rate linearly with its parallelism. When the stats
//! carry lock or GIL wait, part of the op's work is serialised and the
//! speedup follows Amdahl's law instead:
//!
//! ```text
//!   S(p) = p / (1 + σ·(p − 1))          (S(p) = p for p ≤ 1; S(∞) = 1/σ)
//! ```
//!
//! The serial share σ comes from the measured wait (Karp–Flatt, the
//! experimentally determined serial fraction). With busy (CPU) time C and
//! wait W summed over the op's p₀ threads, each thread spends C/(C+W) of its
//! time working, so the measured speedup is S(p₀) = p₀·C/(C+W) and
//!
//! ```text
//!   σ = (1/S(p₀) − 1/p₀) / (1 − 1/p₀) = W / (C·(p₀ − 1))      for p₀ > 1
//! ```
//!
//! With one thread (p₀ ≤ 1) the wait is on threads outside the op (the
//! training loop holding the GIL): σ = W/(C+W) is taken as the serial share,
//! and the single thread's rate is scaled by C/(C+W), its measured
//! efficiency, so the model reproduces the measured rate at p₀ either way.

use crate::guard::positive;

/// A thread that adds less than this fraction of one thread's rate "cannot
/// help": parallelism is never recommended past that point.
pub const MIN_MARGINAL_SPEEDUP: f64 = 0.1;

/// Serial share σ ∈ [0, 1] from busy and wait seconds at parallelism `p0`.
pub fn serial_share(busy_s: f64, wait_s: f64, p0: f64) -> f64 {
    if !positive(wait_s) || !wait_s.is_finite() {
        return 0.0;
    }
    if !positive(busy_s) || !busy_s.is_finite() {
        return 1.0;
    }
    let s = if p0 > 1.0 + 1e-9 && p0.is_finite() {
        wait_s / (busy_s * (p0 - 1.0))
    } else {
        wait_s / (busy_s + wait_s)
    };
    if s.is_finite() {
        s.clamp(0.0, 1.0)
    } else {
        1.0
    }
}

/// Factor applied to the per-core rate when the op runs single-threaded and
/// still waits (see the module doc).
pub fn single_thread_efficiency(busy_s: f64, wait_s: f64, p0: f64) -> f64 {
    if p0 > 1.0 + 1e-9 || !positive(wait_s) || !positive(busy_s) {
        return 1.0;
    }
    let e = busy_s / (busy_s + wait_s);
    if e.is_finite() {
        e.clamp(0.0, 1.0)
    } else {
        1.0
    }
}

/// Amdahl speedup S(θ) at θ threads (θ may be fractional: a share of a core
/// below one thread scales linearly).
pub fn speedup(theta: f64, sigma: f64) -> f64 {
    if !positive(theta) {
        return 0.0;
    }
    if theta <= 1.0 || !positive(sigma) {
        return theta;
    }
    theta / (1.0 + sigma.min(1.0) * (theta - 1.0))
}

/// Rate at θ threads of an op with per-thread rate `r`.
pub fn rate(r: f64, sigma: f64, theta: f64) -> f64 {
    r * speedup(theta, sigma)
}

/// Threads needed to reach rate `x`: the inverse of [`rate`]; infinite when
/// `x` is at or past the Amdahl ceiling r/σ.
pub fn need(r: f64, sigma: f64, x: f64) -> f64 {
    if !positive(x) {
        return 0.0;
    }
    if !positive(r) {
        return f64::INFINITY;
    }
    if x <= r || !positive(sigma) {
        return x / r;
    }
    // x = rθ/(1+σ(θ−1))  ⇔  θ = x(1−σ)/(r − xσ)
    let d = r - x * sigma;
    if d <= 0.0 {
        return f64::INFINITY;
    }
    let t = x * (1.0 - sigma) / d;
    if t.is_finite() {
        t.max(1.0)
    } else {
        f64::INFINITY
    }
}

/// The most threads worth running: past it the next thread adds less than
/// [`MIN_MARGINAL_SPEEDUP`] of one thread's rate. From dS/dp =
/// (1−σ)/(1+σ(p−1))² ≥ m:  p ≤ 1 + (√((1−σ)/m) − 1)/σ. Infinite for σ = 0.
pub fn useful_parallelism(sigma: f64) -> f64 {
    if !positive(sigma) {
        return f64::INFINITY;
    }
    let s = sigma.min(1.0);
    let p = 1.0 + (((1.0 - s) / MIN_MARGINAL_SPEEDUP).sqrt() - 1.0) / s;
    if p.is_finite() {
        p.floor().max(1.0)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn karp_flatt_reproduces_measured_speedup() {
        // 8 threads, 96 s busy, 288 s waiting: efficiency 0.25, S(8) = 2.
        let s = serial_share(96.0, 288.0, 8.0);
        assert!((s - 288.0 / (96.0 * 7.0)).abs() < 1e-12);
        assert!((speedup(8.0, s) - 2.0).abs() < 1e-9);
        assert_eq!(useful_parallelism(s), 4.0);
    }

    #[test]
    fn need_inverts_rate() {
        for &sigma in &[0.0, 0.1, 0.43, 0.9] {
            for &theta in &[0.3, 1.0, 2.5, 7.0, 20.0] {
                let x = rate(6.25, sigma, theta);
                assert!(
                    (need(6.25, sigma, x) - theta).abs() < 1e-9,
                    "{sigma} {theta}"
                );
            }
        }
        assert!(need(1.0, 0.5, 2.0).is_infinite());
        assert!(need(1.0, 1.0, 1.5).is_infinite());
    }

    #[test]
    fn degenerate_inputs() {
        assert_eq!(serial_share(0.0, 0.0, 4.0), 0.0);
        assert_eq!(serial_share(0.0, 1.0, 4.0), 1.0);
        assert_eq!(serial_share(f64::NAN, 1.0, 4.0), 1.0);
        assert_eq!(speedup(f64::NAN, 0.5), 0.0);
        assert_eq!(useful_parallelism(0.0), f64::INFINITY);
        assert_eq!(useful_parallelism(1.0), 1.0);
        assert_eq!(single_thread_efficiency(3.0, 1.0, 1.0), 0.75);
    }
}
