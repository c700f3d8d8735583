//! The LP solution against brute force on random small pipelines: the
//! solver's allocation must be feasible and reach its rate, and no allocation
//! on a fine grid may beat it (and the grid must come close to it).

use plumber_analyzer::solver::{round_up, solve, Binding, LpItem};
use proptest::prelude::*;

/// An op that waits (σ > 0) runs its threads at part of a core: its rate
/// per CPU-second is above its rate per thread.
fn item() -> impl Strategy<Value = LpItem> {
    (
        0.5f64..500.0,
        prop_oneof![3 => Just(0.0), 1 => 0.0f64..0.9],
        prop_oneof![Just(1.0), 1.0f64..12.0],
        1.0f64..3.0,
    )
        .prop_map(|(r, s, cap, k)| LpItem {
            rate_per_core: r,
            cpu_rate: if s > 0.0 { r * k } else { r },
            serial_share: s,
            cap,
        })
}

/// max over a grid of min_i f_i(θ_i), θ_i ≤ cap_i, where each op at θ_i
/// threads runs flat out and so burns f_i(θ_i)/c_i cores, Σ ≤ budget:
/// every item but the last on the grid, the last one takes what is left.
fn brute(items: &[LpItem], budget: f64, steps: usize) -> f64 {
    fn go(items: &[LpItem], i: usize, left: f64, cur_min: f64, steps: usize) -> f64 {
        let it = &items[i];
        if i + 1 == items.len() {
            return cur_min
                .min(it.rate_at(it.cap))
                .min(left.max(0.0) * it.cpu_rate);
        }
        let mut best = 0.0f64;
        let hi = grid_top(it, left);
        for k in 0..=steps {
            let x = it.rate_at(hi * k as f64 / steps as f64);
            let cost = x / it.cpu_rate;
            if cost > left {
                break;
            }
            let m = cur_min.min(x);
            if m <= best {
                continue;
            }
            best = best.max(go(items, i + 1, left - cost, m, steps));
        }
        best
    }
    go(items, 0, budget, f64::INFINITY, steps)
}

/// The most threads worth trying with `cores` left: up to the cap, and no
/// further than those cores pay for.
fn grid_top(it: &LpItem, cores: f64) -> f64 {
    it.cap.min(it.need(cores.max(0.0) * it.cpu_rate))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lp_matches_brute_force(items in prop::collection::vec(item(), 1..=4), budget in 0.25f64..16.0) {
        let sol = solve(&items, budget);
        // Feasible, and it reaches its rate.
        let used: f64 = sol.cores.iter().sum();
        prop_assert!(used <= budget * (1.0 + 1e-9) + 1e-12, "uses {used} of {budget}");
        for ((it, &t), &c) in items.iter().zip(&sol.theta).zip(&sol.cores) {
            prop_assert!(t >= 0.0 && t <= it.cap * (1.0 + 1e-12));
            prop_assert!(it.rate_at(t) >= sol.rate * (1.0 - 1e-9), "item below the rate");
            // Never more cores than threads; as many for an op that does not wait.
            prop_assert!(c <= t * (1.0 + 1e-9) + 1e-12, "{c} cores on {t} threads");
            if it.serial_share == 0.0 && it.cpu_rate == it.rate_per_core {
                prop_assert!((c - t).abs() <= 1e-9 * t.max(1.0));
            }
        }
        // Nothing on the grid beats it, and the grid gets close.
        let steps = if items.len() <= 2 { 400 } else if items.len() == 3 { 120 } else { 40 };
        let b = brute(&items, budget, steps);
        prop_assert!(b <= sol.rate * (1.0 + 1e-9), "grid {b} beats LP {}", sol.rate);
        // A grid step moves an item's rate by at most r_i × its step.
        let slack: f64 = items
            .iter()
            .map(|i| i.rate_per_core * grid_top(i, budget) / steps as f64)
            .sum();
        prop_assert!(b >= sol.rate - slack - 1e-9, "grid {b} far below LP {}", sol.rate);
        // The binding constraint is what the solution says.
        match sol.binding {
            Binding::Budget => prop_assert!((used - budget).abs() <= 1e-6 * budget.max(1.0)),
            Binding::Cap(i) => prop_assert!((items[i].rate_at(items[i].cap) - sol.rate).abs() <= 1e-9 * sol.rate.max(1.0)),
            Binding::Unbounded => prop_assert!(false, "items given"),
        }
    }

    #[test]
    fn closed_form_without_caps(rs in prop::collection::vec(0.5f64..500.0, 1..8), budget in 0.5f64..64.0) {
        // Caps out of reach: X* = B / Σ 1/r_i exactly (Plumber's closed form).
        let items: Vec<LpItem> = rs.iter().map(|&r| LpItem { rate_per_core: r, cpu_rate: r, serial_share: 0.0, cap: 1e9 }).collect();
        let sol = solve(&items, budget);
        let x = budget / rs.iter().map(|r| 1.0 / r).sum::<f64>();
        prop_assert!((sol.rate - x).abs() <= 1e-9 * x);
    }

    #[test]
    fn rounding_never_lowers(theta in 0.0f64..64.0) {
        let p = round_up(theta);
        prop_assert!(p >= 1);
        prop_assert!(f64::from(p) >= theta - 1e-6);
        prop_assert!(f64::from(p) < theta + 1.0);
    }
}
