//! Plumber's core-allocation LP (plumber-model.md §4), solved exactly:
//!
//! ```text
//!   maximise X  s.t.  X ≤ f_i(θ_i),  Σ X/c_i ≤ B,  0 ≤ θ_i ≤ cap_i
//! ```
//!
//! θ_i is op i's threads and f_i(θ) its rate on them: r_i·θ (Plumber's
//! linear scaling) or the Amdahl curve of [`crate::amdahl`] for an op that
//! waits on a lock or the GIL. The budget counts CPU, not threads: op i
//! needs X/c_i cores at rate X, c_i being its root elements per CPU-second.
//! For an op that does not wait, c_i = r_i and its cores are its threads
//! (Plumber's LP exactly); a thread that waits for a lock or the GIL
//! sleeps, so an op that waits needs fewer cores than threads. Charging it
//! a core a thread told a 2-core machine running a GIL-bound `py_function`
//! at half its CPU that "all cores are in use".
//!
//! Every f_i is increasing, so the optimum gives each op the least θ_i
//! that reaches X — θ_i = f_i⁻¹(X) — and X* = min(min_i f_i(cap_i),
//! B / Σ 1/c_i): a cap binds when its rate fits the budget, else the
//! budget (closed form).
//!
//! Ops with zero CPU time have an infinite rate and are left out by the
//! caller (Plumber lets them force X* = 0, §8.2).

use crate::amdahl;
use crate::guard::positive;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LpItem {
    /// Per-thread rate r_i, root elements/s: one thread's rate, its waits
    /// included.
    pub rate_per_core: f64,
    /// Root elements per CPU-second c_i (≥ r_i; = r_i for an op that does
    /// not wait): what one core of the budget buys.
    pub cpu_rate: f64,
    /// Amdahl serial share σ_i (0 = linear).
    pub serial_share: f64,
    /// Most threads the op may get.
    pub cap: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The core budget binds.
    Budget,
    /// Item i's cap binds (its parallelism limit, or one thread for a
    /// sequential op).
    Cap(usize),
    /// No item: nothing bounds the rate.
    Unbounded,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LpSolution {
    /// X*, root elements/s (infinite when unbounded).
    pub rate: f64,
    /// θ_i, threads per item.
    pub theta: Vec<f64>,
    /// Cores per item at X* (X*/c_i; θ_i for an op that does not wait).
    pub cores: Vec<f64>,
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
        // An op never needs more cores than threads (c_i ≥ r_i).
        let cpu = if self.cpu_rate.is_finite() && self.cpu_rate > 0.0 {
            self.cpu_rate.max(r)
        } else {
            r
        };
        LpItem {
            rate_per_core: r,
            cpu_rate: cpu,
            serial_share: s,
            cap: c,
        }
    }

    /// Cores the op needs at rate `x`.
    pub fn cores_at(&self, x: f64) -> f64 {
        if self.cpu_rate > 0.0 {
            x / self.cpu_rate
        } else {
            f64::INFINITY
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
    solve_with_overhead(items, budget, 0.0)
}

/// Solves the LP for a core budget `budget` of which `overhead` CPU-seconds
/// per root element go to work outside the items (the consumer of the
/// pipeline): Σ X/c_i + X·overhead ≤ B.
pub fn solve_with_overhead(items: &[LpItem], budget: f64, overhead: f64) -> LpSolution {
    let overhead = if overhead.is_finite() && overhead > 0.0 {
        overhead
    } else {
        0.0
    };
    let items: Vec<LpItem> = items.iter().map(LpItem::sane).collect();
    if items.is_empty() {
        return LpSolution {
            rate: f64::INFINITY,
            theta: Vec::new(),
            cores: Vec::new(),
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
    let cores_needed = |x: f64| items.iter().map(|it| it.cores_at(x)).sum::<f64>() + x * overhead;
    let (rate, binding) = if !positive(x_cap) {
        (0.0, Binding::Cap(arg))
    } else if cores_needed(x_cap) <= budget * (1.0 + 1e-12) {
        (x_cap, Binding::Cap(arg))
    } else {
        // Closed form: X = B / Σ 1/c_i. It lies below x_cap because the
        // caps did not fit the budget.
        let inv: f64 = items.iter().map(|it| 1.0 / it.cpu_rate).sum::<f64>() + overhead;
        ((budget / inv).min(x_cap), Binding::Budget)
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
    let cores = items
        .iter()
        .map(|it| {
            let c = it.cores_at(rate);
            if c.is_finite() {
                c
            } else {
                0.0
            }
        })
        .collect();
    LpSolution {
        rate,
        theta,
        cores,
        binding,
    }
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
            cpu_rate: r,
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
    fn overhead_per_element_shares_the_budget() {
        // One op at 10/s per core on 2 cores with the consumer at 0.05
        // CPU-s an element: X (0.1 + 0.05) ≤ 2.
        let s = solve_with_overhead(&[lin(10.0, 2.0)], 2.0, 0.05);
        assert_eq!(s.binding, Binding::Budget);
        assert!((s.rate - 2.0 / 0.15).abs() < 1e-9, "{}", s.rate);
        assert!((s.cores[0] - s.rate / 10.0).abs() < 1e-9);
        // A cap that fits beside the consumer still binds.
        let s = solve_with_overhead(&[lin(10.0, 1.0)], 2.0, 0.05);
        assert_eq!((s.binding, s.rate), (Binding::Cap(0), 10.0));
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
    fn a_waiting_op_is_charged_its_cpu_not_its_threads() {
        // The py_function map of tests/workloads on 2 cores: two threads
        // that wait on the GIL (σ = 0.77) reach 1.13 threads' worth and
        // burn 1.13 cores; the GIL, not the cores, bounds it.
        let items = [
            LpItem {
                rate_per_core: 186.0,
                cpu_rate: 186.0,
                serial_share: 0.77,
                cap: 2.0,
            },
            lin(8000.0, 1.0),
        ];
        let s = solve(&items, 2.0);
        assert_eq!(s.binding, Binding::Cap(0));
        let x = 186.0 * 2.0 / 1.77;
        assert!((s.rate - x).abs() < 1e-9, "{}", s.rate);
        assert!((s.theta[0] - 2.0).abs() < 1e-9);
        assert!((s.cores[0] - 2.0 / 1.77).abs() < 1e-9);
        assert!((s.cores[1] - x / 8000.0).abs() < 1e-12);

        // A single thread that waits: its rate per thread is below its
        // rate per CPU-second, and the budget counts the latter.
        let one = LpItem {
            rate_per_core: 50.0,
            cpu_rate: 100.0,
            serial_share: 0.5,
            cap: 8.0,
        };
        let s = solve(&[one, lin(100.0, 8.0)], 1.0);
        assert_eq!(s.binding, Binding::Budget);
        assert!((s.rate - 50.0).abs() < 1e-9, "{}", s.rate);
        assert!((s.cores[0] - 0.5).abs() < 1e-9 && (s.theta[0] - 1.0).abs() < 1e-9);
    }
}
