//! What a DataLoader's stages spent waiting: per stage, the share of its
//! threads' time that they waited for their own process's GIL (the
//! training process's for the training loop, each worker's own for the
//! workers), and the share they waited on a lock, a condition or a
//! semaphore (a futex other than the GIL's), as the stage sampler told
//! them at its ticks (probe/src/torch/gil.rs).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::loader_observation::{delta, DataLoaderObservation, WorkerObservation, STALLS};

/// Shares under this are left out of the printed line.
const SHOWN: f64 = 0.01;
/// Below this share of ticks told, the line says how many were.
const TOLD_WELL: f64 = 0.9;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct GilWaits {
    /// Per stage of the training loop: the share of its time the loop's
    /// thread waited for the training process's GIL.
    pub training: BTreeMap<String, f64>,
    /// Per stage of the workers, all together: the share of that stage's
    /// time their threads waited for their own process's GIL.
    pub workers: BTreeMap<String, f64>,
    /// The share of the training loop's data stall (its stages inside the
    /// loader's `next()` and `iter()`) that it waited for its process's
    /// GIL.
    #[serde(default)]
    pub stall: f64,
    /// Share of the threads' ticks whose wait could be told.
    pub told: f64,
}

/// Waits on locks, conditions and semaphores: shares as in [`GilWaits`].
/// Waiting for the next batch is such a wait in some stages (the loop's
/// `wait` on a pin-memory thread's queue): what a stage waits on is part
/// of what the stage is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct LockWaits {
    /// Per stage of the training loop, the share of its time.
    pub training: BTreeMap<String, f64>,
    /// Per stage of the workers, all together.
    pub workers: BTreeMap<String, f64>,
    /// The share of the loop's data stall.
    pub stall: f64,
}

/// The GIL waits between two observations; None when no tick was told.
pub fn gil_waits(first: &DataLoaderObservation, last: &DataLoaderObservation) -> Option<GilWaits> {
    let told = last.gil_told.saturating_sub(first.gil_told);
    let untold = last.gil_untold.saturating_sub(first.gil_untold);
    if told == 0 {
        return None;
    }
    let w = waits(first, last, |o| &o.training_gil, |w| &w.gil);
    Some(GilWaits {
        training: w.training,
        workers: w.workers,
        stall: w.stall,
        told: told as f64 / (told + untold) as f64,
    })
}

/// The lock waits between two observations; None when no tick was told.
pub fn lock_waits(
    first: &DataLoaderObservation,
    last: &DataLoaderObservation,
) -> Option<LockWaits> {
    if last.gil_told <= first.gil_told {
        return None;
    }
    Some(waits(first, last, |o| &o.training_lock, |w| &w.lock))
}

/// One kind of wait over the window: the loop's per stage and over its
/// stall, and all workers' together per stage.
fn waits(
    first: &DataLoaderObservation,
    last: &DataLoaderObservation,
    of_loop: fn(&DataLoaderObservation) -> &BTreeMap<String, u64>,
    of_worker: fn(&WorkerObservation) -> &BTreeMap<String, u64>,
) -> LockWaits {
    let (waited, time) = (
        delta(of_loop(first), of_loop(last)),
        delta(&first.training, &last.training),
    );
    let in_stall =
        |m: &BTreeMap<String, u64>| -> u64 { STALLS.iter().filter_map(|k| m.get(*k)).sum() };
    let stall = match in_stall(&time) {
        0 => 0.0,
        t => (in_stall(&waited) as f64 / t as f64).min(1.0),
    };
    let training = shares(&waited, &time);
    let (mut waited, mut time) = (BTreeMap::new(), BTreeMap::new());
    let empty = BTreeMap::new();
    for w in &last.workers {
        let before = first.workers.iter().find(|x| x.pid == w.pid);
        let (w0, t0) = before.map_or((&empty, &empty), |b| (of_worker(b), &b.stages));
        add(&mut waited, &delta(w0, of_worker(w)));
        add(&mut time, &delta(t0, &w.stages));
    }
    LockWaits {
        training,
        workers: shares(&waited, &time),
        stall,
    }
}

fn add(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

/// Each stage with time: its waits over its time.
fn shares(waited: &BTreeMap<String, u64>, time: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    time.iter()
        .filter(|(_, &t)| t > 0)
        .map(|(k, &t)| {
            let g = waited.get(k).copied().unwrap_or(0);
            (k.clone(), (g as f64 / t as f64).min(1.0))
        })
        .collect()
}

/// The stages of the loop and of the workers that waited at least
/// `SHOWN` of their time, as "training loop a 25%; workers b 15%".
fn listed(training: &BTreeMap<String, f64>, workers: &BTreeMap<String, f64>) -> Vec<String> {
    let list = |m: &BTreeMap<String, f64>| -> Vec<String> {
        m.iter()
            .filter(|(k, &v)| v >= SHOWN && k.as_str() != "idle")
            .map(|(k, v)| format!("{k} {:.0}%", 100.0 * v))
            .collect()
    };
    let mut parts = Vec::new();
    for (who, m) in [("training loop", training), ("workers", workers)] {
        let l = list(m);
        if !l.is_empty() {
            parts.push(format!("{who} {}", l.join(", ")));
        }
    }
    parts
}

impl LockWaits {
    /// The recording's line; None when no stage waited `SHOWN` of its time.
    pub fn line(&self) -> Option<String> {
        let parts = listed(&self.training, &self.workers);
        (!parts.is_empty()).then(|| {
            format!(
                "  waiting on locks, conditions or semaphores, share of each stage's time: {}",
                parts.join("; ")
            )
        })
    }
}

impl GilWaits {
    /// The recording's line: the stages that waited at least `SHOWN` of
    /// their time.
    pub fn line(&self) -> String {
        let parts = listed(&self.training, &self.workers);
        let told = if self.told < TOLD_WELL {
            format!(" (told at {:.0}% of the threads' ticks)", 100.0 * self.told)
        } else {
            String::new()
        };
        if parts.is_empty() {
            format!("  waiting for the GIL: under 1% of every stage's time{told}")
        } else {
            format!(
                "  waiting for the GIL, share of each stage's time: {}{told}",
                parts.join("; ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
        v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn shares_per_stage_over_the_window() {
        let first = DataLoaderObservation {
            training: m(&[("get_item", 100), ("collate", 10)]),
            training_gil: m(&[("get_item", 50)]),
            gil_told: 10,
            workers: vec![WorkerObservation {
                pid: 7,
                stages: m(&[("get_item", 10)]),
                gil: m(&[]),
                lock: m(&[("get_item", 5)]),
                cpu_ns: 0,
                ..Default::default()
            }],
            ..Default::default()
        };
        let last = DataLoaderObservation {
            training: m(&[("get_item", 1_100), ("collate", 110), ("other", 40)]),
            training_gil: m(&[("get_item", 550), ("collate", 25)]),
            gil_told: 190,
            gil_untold: 10,
            workers: vec![
                WorkerObservation {
                    pid: 7,
                    stages: m(&[("get_item", 110), ("idle", 30)]),
                    gil: m(&[("get_item", 10)]),
                    lock: m(&[("get_item", 45)]),
                    cpu_ns: 0,
                    ..Default::default()
                },
                // A worker started in the window counts from 0.
                WorkerObservation {
                    pid: 8,
                    stages: m(&[("get_item", 100)]),
                    gil: m(&[("get_item", 20)]),
                    lock: BTreeMap::new(),
                    cpu_ns: 0,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let g = gil_waits(&first, &last).expect("told");
        assert_eq!(g.training["get_item"], 0.5);
        assert_eq!(g.training["collate"], 0.25);
        assert_eq!(g.training["other"], 0.0);
        assert_eq!(g.workers["get_item"], 0.15);
        assert_eq!(g.workers["idle"], 0.0);
        // The stall: get_item and collate, not other.
        assert!((g.stall - 525.0 / 1_100.0).abs() < 1e-12);
        assert!((g.told - 180.0 / 190.0).abs() < 1e-12);
        assert_eq!(
            g.line(),
            "  waiting for the GIL, share of each stage's time: training loop collate 25%, get_item 50%; workers get_item 15%"
        );
        // Locks: the workers' get_item waited 40 + 0 of its 200.
        let l = lock_waits(&first, &last).expect("told");
        assert_eq!(l.workers["get_item"], 0.2);
        assert_eq!(l.training["get_item"], 0.0);
        assert_eq!(l.stall, 0.0);
        assert_eq!(
            l.line().as_deref(),
            Some("  waiting on locks, conditions or semaphores, share of each stage's time: workers get_item 20%")
        );
        // Nothing told: no figures.
        assert!(gil_waits(&first, &first).is_none());
        assert!(lock_waits(&first, &first).is_none());
    }

    #[test]
    fn a_window_without_waits_says_so() {
        let g = GilWaits {
            training: [("get_item".to_string(), 0.004)].into(),
            workers: BTreeMap::new(),
            stall: 0.004,
            told: 0.5,
        };
        assert_eq!(
            g.line(),
            "  waiting for the GIL: under 1% of every stage's time (told at 50% of the threads' ticks)"
        );
    }
}
