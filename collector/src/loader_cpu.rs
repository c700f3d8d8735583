//! The DataLoader's CPU time per stage over a window: what the stage
//! sampler's counted threads ran between two of its reads, put on the
//! stage it saw at the second (probe/src/torch/thread_cpu.rs). Beside the
//! stages' wall time it says which stage burns the cores and which waits
//! (a read, a lock, a core to run on).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::loader_observation::{delta, DataLoaderObservation, WorkerObservation};

/// CPU time per stage over the window, in cores (CPU s per window s).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct StageCpu {
    /// The training loop's thread (`wait`, `receive`, `other`: its step).
    pub training: BTreeMap<String, f64>,
    /// Every worker's counted threads together (`get_item`, `collate`,
    /// `send`, `idle`, `startup`).
    pub workers: BTreeMap<String, f64>,
    /// The pin-memory thread (with `pin_memory` and workers).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pin_memory: BTreeMap<String, f64>,
}

/// The stage CPU between two observations `window_ns` apart; None when
/// no thread's CPU was read in it (its kernel id not known, or an event
/// file from before it was).
pub fn stage_cpu(
    first: &DataLoaderObservation,
    last: &DataLoaderObservation,
    window_ns: u64,
) -> Option<StageCpu> {
    let cores = |m: BTreeMap<String, u64>| -> BTreeMap<String, f64> {
        m.into_iter()
            .map(|(k, ns)| (k, ns as f64 / window_ns as f64))
            .collect()
    };
    let mut workers: BTreeMap<String, u64> = BTreeMap::new();
    for w in &last.workers {
        for (k, v) in worker_cpu(first, w) {
            *workers.entry(k).or_default() += v;
        }
    }
    let out = StageCpu {
        training: cores(delta(&first.training_cpu, &last.training_cpu)),
        workers: cores(workers),
        pin_memory: cores(delta(&first.pin_memory_cpu, &last.pin_memory_cpu)),
    };
    let any = |m: &BTreeMap<String, f64>| m.values().any(|&c| c > 0.0);
    (any(&out.training) || any(&out.workers) || any(&out.pin_memory)).then_some(out)
}

/// Worker `w`'s CPU per stage since `first` (all of it for a worker
/// `first` does not hold: it started in the window), ns.
pub fn worker_cpu(first: &DataLoaderObservation, w: &WorkerObservation) -> BTreeMap<String, u64> {
    let before = first.workers.iter().find(|x| x.pid == w.pid);
    match before {
        Some(b) => delta(&b.stage_cpu, &w.stage_cpu),
        None => w.stage_cpu.clone(),
    }
}

impl StageCpu {
    /// The summary's line: the workers' CPU per stage and per batch, the
    /// training loop's; None with nothing to say.
    pub fn line(&self, window_s: f64, batches: u64) -> Option<String> {
        let fmt = |m: &BTreeMap<String, f64>| -> (String, f64) {
            let mut v: Vec<(&String, &f64)> = m.iter().filter(|(_, &c)| c >= 0.005).collect();
            v.sort_by(|a, b| b.1.total_cmp(a.1));
            let parts: Vec<String> = v
                .iter()
                .map(|(k, c)| format!("{} {c:.2}", stage_name(k)))
                .collect();
            (parts.join(", "), m.values().sum())
        };
        let per_batch = |cores: f64| {
            if batches == 0 {
                String::new()
            } else {
                format!(
                    ", {:.1} CPU-ms a batch",
                    1e3 * cores * window_s / batches as f64
                )
            }
        };
        let mut out = Vec::new();
        for (who, m) in [
            ("workers", &self.workers),
            ("training loop", &self.training),
            ("pin memory", &self.pin_memory),
        ] {
            let (parts, sum) = fmt(m);
            if !parts.is_empty() {
                out.push(format!("{who} {parts} ({sum:.2} in all{})", per_batch(sum)));
            }
        }
        (!out.is_empty()).then(|| format!("  CPU in cores: {}", out.join("; ")))
    }
}

/// A stage's key as the summary's lines say it.
fn stage_name(k: &str) -> &str {
    match k {
        "get_item" => "get item",
        "other" => "its step",
        "other_loader" => "other DataLoaders",
        "pin_memory" => "pin memory",
        "startup" => "start-up",
        _ => k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(training: &[(&str, u64)], workers: &[(i32, &[(&str, u64)])]) -> DataLoaderObservation {
        let m = |v: &[(&str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        DataLoaderObservation {
            training_cpu: m(training),
            workers: workers
                .iter()
                .map(|(pid, st)| WorkerObservation {
                    pid: *pid,
                    stage_cpu: m(st),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn cores_per_stage_over_the_window_with_workers_that_came_and_went() {
        let first = obs(&[("wait", 100)], &[(1, &[("get_item", 1_000_000_000)])]);
        // Worker 1 ran 0.5 s more of get-item; worker 2 started in the
        // window and ran 0.5 s of it and 0.1 s of collate.
        let last = obs(
            &[("wait", 100), ("other", 200_000_000)],
            &[
                (1, &[("get_item", 1_500_000_000)]),
                (2, &[("get_item", 500_000_000), ("collate", 100_000_000)]),
            ],
        );
        let c = stage_cpu(&first, &last, 2_000_000_000).expect("CPU read");
        assert_eq!(c.workers["get_item"], 0.5);
        assert_eq!(c.workers["collate"], 0.05);
        assert_eq!(c.training["other"], 0.1);
        assert_eq!(c.training["wait"], 0.0);
        assert_eq!(
            c.line(2.0, 20).as_deref(),
            Some("  CPU in cores: workers get item 0.50, collate 0.05 (0.55 in all, 55.0 CPU-ms a batch); training loop its step 0.10 (0.10 in all, 10.0 CPU-ms a batch)")
        );
        assert_eq!(stage_cpu(&first, &first, 1), None);
    }
}
