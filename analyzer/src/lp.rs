//! Plumber's core-allocation LP (plumber-model.md §4), solved exactly:
//!
//! ```text
//!   maximise X  s.t.  X ≤ f_i(θ_i),  Σ θ_i ≤ B,  0 ≤ θ_i ≤ cap_i
//! ```
//!
//! with f_i(θ) = r_i·θ (Plumber's linear scaling) or the Amdahl curve of
//! [`crate::amdahl`] for ops that wait on a lock or the GIL. Every f_i is
//! increasing and concave, so the optimum gives each op the least θ_i that
//! reaches X — θ_i = f_i⁻¹(X) — and X* is the largest X with
//! f_i(cap_i) ≥ X for all i and Σ f_i⁻¹(X) ≤ B:
//!
//! * if Σ f_i⁻¹(min_i f_i(cap_i)) ≤ B, a cap binds: X* = min_i f_i(cap_i);
//! * otherwise the budget binds: with linear f_i, X* = B / Σ 1/r_i (the
//!   closed form); with Amdahl terms the monotone equation Σ f_i⁻¹(X) = B is
//!   solved by bisection to machine precision.
//!
//! Ops with zero CPU time have an infinite rate and are left out by the
//! caller (Plumber lets them force X* = 0, §8.2).

use crate::amdahl;
use crate::guard::positive;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LpItem {
    /// Per-core (per-thread) rate r_i, root elements/s.
    pub rate_per_core: f64,
    /// Amdahl serial share σ_i (0 = linear).
    pub serial_share: f64,
    /// Most cores/threads the op may get.
    pub cap: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The core budget binds.
    Budget,
    /// Item i's cap binds (its parallelism limit, or one core for a
    /// sequential op).
    Cap(usize),
    /// No item: nothing bounds the rate.
    Unbounded,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LpSolution {
    /// X*, root elements/s (infinite when unbounded).
    pub rate: f64,
    /// θ_i, cores per item.
    pub theta: Vec<f64>,
    pub binding: Binding,
}

impl LpItem {
    fn sane(&self) -> LpItem {
        let r = if self.rate_per_core.is_finite() && self.rate_per_core > 0.0 {
            self.rate_per_core
        } else {
            0.0
        };
        let s = if self.serial_share.is_finite() {
            self.serial_share.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let c = if self.cap.is_finite() && self.cap > 0.0 {
            self.cap
        } else {
            0.0
        };
        LpItem {
            rate_per_core: r,
            serial_share: s,
            cap: c,
        }
    }

    /// f_i(θ).
    pub fn rate_at(&self, theta: f64) -> f64 {
        amdahl::rate(self.rate_per_core, self.serial_share, theta)
    }

    /// f_i⁻¹(x).
    pub fn need(&self, x: f64) -> f64 {
        amdahl::need(self.rate_per_core, self.serial_share, x)
    }
}

/// Solves the LP for a core budget `budget`.
pub fn solve(items: &[LpItem], budget: f64) -> LpSolution {
    let items: Vec<LpItem> = items.iter().map(LpItem::sane).collect();
    if items.is_empty() {
        return LpSolution {
            rate: f64::INFINITY,
            theta: Vec::new(),
            binding: Binding::Unbounded,
        };
    }
    let budget = if budget.is_nan() {
        0.0
    } else {
        budget.max(0.0)
    };
    // The cap-bound rate and the item that sets it (first on ties).
    let (mut x_cap, mut arg) = (f64::INFINITY, 0);
    for (i, it) in items.iter().enumerate() {
        let x = it.rate_at(it.cap);
        if x < x_cap {
            x_cap = x;
            arg = i;
        }
    }
    let total = |x: f64| items.iter().map(|it| it.need(x)).sum::<f64>();
    let (rate, binding) = if !positive(x_cap) {
        (0.0, Binding::Cap(arg))
    } else if total(x_cap) <= budget * (1.0 + 1e-12) {
        (x_cap, Binding::Cap(arg))
    } else if items.iter().all(|it| it.serial_share == 0.0) {
        // Closed form: X = B / Σ 1/r_i. It lies below x_cap because the
        // caps did not fit the budget.
        let inv: f64 = items.iter().map(|it| 1.0 / it.rate_per_core).sum();
        ((budget / inv).min(x_cap), Binding::Budget)
    } else {
        (bisect(&total, budget, x_cap), Binding::Budget)
    };
    let theta = items
        .iter()
        .map(|it| {
            let t = it.need(rate).min(it.cap);
            if t.is_finite() {
                t
            } else {
                it.cap
            }
        })
        .collect();
    LpSolution {
        rate,
        theta,
        binding,
    }
}

/// Largest x in [0, hi] with total(x) ≤ budget (total increasing).
fn bisect(total: &dyn Fn(f64) -> f64, budget: f64, hi: f64) -> f64 {
    let (mut lo, mut hi) = (0.0_f64, hi);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if total(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Integer parallelism for a fractional allocation: Plumber's optimizer
/// rounds up (`max(ceil θ, 1)`), so the op gets at least what the LP gave
/// it. A θ within 1e-6 of an integer is not pushed to the next one.
pub fn round_up(theta: f64) -> u32 {
    if !positive(theta) {
        return 1;
    }
    let c = (theta - 1e-6).ceil();
    if c >= u32::MAX as f64 {
        u32::MAX
    } else {
        (c as u32).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lin(r: f64, cap: f64) -> LpItem {
        LpItem {
            rate_per_core: r,
            serial_share: 0.0,
            cap,
        }
    }

    #[test]
    fn worked_example() {
        // plumber-model.md §9: Prefetch, Batch, ParallelMap, TFRecord.
        let items = [
            lin(2000.0, 1.0),
            lin(100.0, 8.0),
            lin(6.25, 8.0),
            lin(200.0, 1.0),
        ];
        let s = solve(&items, 8.0);
        assert_eq!(s.binding, Binding::Budget);
        assert!((s.rate - 8.0 / 0.1755).abs() < 1e-9, "{}", s.rate);
        assert!((s.theta[2] - 7.293).abs() < 1e-3);
        assert_eq!(round_up(s.theta[2]), 8);
    }

    #[test]
    fn sequential_cap_binds() {
        // "If Batch had R1 = 40, its θ ≤ 1 cap would bind and X* = 40."
        let items = [
            lin(2000.0, 1.0),
            lin(40.0, 1.0),
            lin(6.25, 8.0),
            lin(200.0, 1.0),
        ];
        let s = solve(&items, 8.0);
        assert_eq!(s.binding, Binding::Cap(1));
        assert_eq!(s.rate, 40.0);
    }

    #[test]
    fn degenerate() {
        assert_eq!(solve(&[], 8.0).binding, Binding::Unbounded);
        let s = solve(&[lin(f64::NAN, 1.0), lin(10.0, 1.0)], 8.0);
        assert_eq!(s.rate, 0.0);
        let s = solve(&[lin(10.0, 4.0)], 0.0);
        assert_eq!(s.rate, 0.0);
        let s = solve(&[lin(10.0, 4.0)], f64::NAN);
        assert_eq!(s.rate, 0.0);
        assert_eq!(round_up(f64::NAN), 1);
        assert_eq!(round_up(3.0000001), 3);
        assert_eq!(round_up(1e30), u32::MAX);
    }

    #[test]
    fn amdahl_items_use_bisection() {
        let items = [
            LpItem {
                rate_per_core: 6.25,
                serial_share: 0.4,
                cap: 16.0,
            },
            lin(100.0, 16.0),
        ];
        let s = solve(&items, 4.0);
        let used: f64 = s.theta.iter().sum();
        assert!((used - 4.0).abs() < 1e-9);
        assert!((items[0].rate_at(s.theta[0]) - s.rate).abs() < 1e-9);
    }
}
