//! The LP solution against brute force on random small pipelines: the
//! solver's allocation must be feasible and reach its rate, and no allocation
//! on a fine grid may beat it (and the grid must come close to it).

use plumber_analyzer::solver::{round_up, solve, Binding, LpItem};
use proptest::prelude::*;

fn item() -> impl Strategy<Value = LpItem> {
    (
        0.5f64..500.0,
        prop_oneof![3 => Just(0.0), 1 => 0.0f64..0.9],
        prop_oneof![Just(1.0), 1.0f64..12.0],
    )
        .prop_map(|(r, s, cap)| LpItem {
            rate_per_core: r,
            serial_share: s,
            cap,
        })
}

/// max over a grid of min_i f_i(θ_i), Σθ ≤ budget, θ_i ≤ cap_i: every item
/// but the last on the grid, the last one takes what is left.
fn brute(items: &[LpItem], budget: f64, steps: usize) -> f64 {
    fn go(items: &[LpItem], i: usize, left: f64, cur_min: f64, steps: usize) -> f64 {
        let it = &items[i];
        if i + 1 == items.len() {
            let theta = left.min(it.cap).max(0.0);
            return cur_min.min(it.rate_at(theta));
        }
        let hi = left.min(it.cap);
        let mut best = 0.0f64;
        for k in 0..=steps {
            let theta = hi * k as f64 / steps as f64;
            let m = cur_min.min(it.rate_at(theta));
            if m <= best {
                continue;
            }
            best = best.max(go(items, i + 1, left - theta, m, steps));
        }
        best
    }
    go(items, 0, budget, f64::INFINITY, steps)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lp_matches_brute_force(items in prop::collection::vec(item(), 1..=4), budget in 0.25f64..16.0) {
        let sol = solve(&items, budget);
        // Feasible, and it reaches its rate.
        let used: f64 = sol.theta.iter().sum();
        prop_assert!(used <= budget * (1.0 + 1e-9) + 1e-12, "uses {used} of {budget}");
        for (it, &t) in items.iter().zip(&sol.theta) {
            prop_assert!(t >= 0.0 && t <= it.cap * (1.0 + 1e-12));
            prop_assert!(it.rate_at(t) >= sol.rate * (1.0 - 1e-9), "item below the rate");
        }
        // Nothing on the grid beats it, and the grid gets close.
        let steps = if items.len() <= 2 { 400 } else if items.len() == 3 { 120 } else { 40 };
        let b = brute(&items, budget, steps);
        prop_assert!(b <= sol.rate * (1.0 + 1e-9), "grid {b} beats LP {}", sol.rate);
        let max_r = items.iter().map(|i| i.rate_per_core).fold(0.0, f64::max);
        let max_cap = items.iter().map(|i| i.cap.min(budget)).fold(0.0, f64::max);
        let slack = max_r * max_cap / steps as f64 * items.len() as f64;
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
        let items: Vec<LpItem> = rs.iter().map(|&r| LpItem { rate_per_core: r, serial_share: 0.0, cap: 1e9 }).collect();
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
