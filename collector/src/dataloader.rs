//! PyTorch DataLoader recordings: what the stage sampler saw (cumulative,
//! one observation per poll) and, over the recording window, the summary a
//! user reads first: batches and samples per second, the share of the
//! training loop's time it waited for data (the data stall), where the
//! workers' time went and what the loader is configured with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Cumulative, from the start of sampling, at `mono_ns`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct DataLoaderObservation {
    pub mono_ns: u64,
    /// The same instant, Unix-epoch ns.
    #[serde(default)]
    pub wall_ns: u64,
    pub torch_version: String,
    pub num_workers: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_factor: Option<u32>,
    pub pin_memory: bool,
    pub persistent_workers: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    pub drop_last: bool,
    /// Batches the loader yielded to the training loop.
    pub batches: u64,
    /// Epochs that ended while sampling.
    pub epochs: u64,
    /// Batches sent to workers and not yet yielded, now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_outstanding: Option<u64>,
    /// Wall time the sampler covered, ns.
    pub covered_ns: u64,
    pub ticks: u64,
    /// The training loop's thread, wall ns per stage (`wait`, `get_item`,
    /// `collate`, `other`), from when it was first seen in `next()`.
    pub training: BTreeMap<String, u64>,
    pub training_unknown_ns: u64,
    pub pin_memory_stages: BTreeMap<String, u64>,
    pub workers: Vec<WorkerObservation>,
    /// CPU time of the training process and of its workers (those alive,
    /// and those gone, through the training process's children times), ns.
    pub job_cpu_ns: u64,
    /// torch's tensor sharing strategy, as the training loop's receiving
    /// frames showed it (`file_descriptor`, `file_system`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing_strategy: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct WorkerObservation {
    pub pid: i32,
    /// Wall ns per stage of its main thread (`get_item`, `collate`,
    /// `idle`), and `send` while its result queue's feeder pickles.
    pub stages: BTreeMap<String, u64>,
    pub cpu_ns: u64,
}

/// The window's DataLoader figures (dataloader.json).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DataLoaderSummary {
    pub torch_version: String,
    /// The window, Unix-epoch ns (the polls that bound it).
    pub start_wall_ns: u64,
    pub end_wall_ns: u64,
    pub window_s: f64,
    pub batches: u64,
    pub batches_per_s: f64,
    /// Batches times the batch size: a partial last batch of an epoch
    /// counts whole (see docs/pytorch.md).
    pub samples: u64,
    pub samples_per_s: f64,
    /// Share of the training loop's wall time inside the loader's
    /// `next()`: waiting for a worker, or (no workers) fetching the batch.
    pub stall_share: f64,
    pub epochs: u64,
    pub num_workers: u32,
    pub prefetch_factor: Option<u32>,
    /// prefetch_factor x num_workers: batches the loader keeps in flight.
    pub queue_capacity: Option<u64>,
    pub tasks_outstanding: Option<u64>,
    pub pin_memory: bool,
    pub persistent_workers: bool,
    pub batch_size: Option<u64>,
    /// Share of the training loop's wall time per stage.
    pub training: BTreeMap<String, f64>,
    /// Share of the workers' wall time per stage, all workers together.
    pub workers_stages: BTreeMap<String, f64>,
    pub workers: Vec<WorkerSummary>,
    /// The job's CPU over the window in cores (training process and
    /// workers).
    pub job_cores: f64,
    pub sampler_ticks: u64,
    /// torch's tensor sharing strategy, where the training loop was seen
    /// receiving a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing_strategy: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct WorkerSummary {
    pub pid: i32,
    /// CPU over the window, in cores.
    pub cores: f64,
    pub get_item_share: f64,
}

fn delta(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    b.iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(a.get(k).copied().unwrap_or(0))))
        .collect()
}

fn shares(m: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    let total: u64 = m.values().sum();
    m.iter()
        .map(|(k, &v)| {
            (
                k.clone(),
                if total > 0 {
                    v as f64 / total as f64
                } else {
                    0.0
                },
            )
        })
        .collect()
}

/// The training loop's stages inside the loader's `next()` and `iter()`:
/// the data stall.
const STALLS: [&str; 5] = ["wait", "receive", "startup", "get_item", "collate"];

/// The summary between two observations of one recording; None when they
/// cover no time.
pub fn summarise(
    first: &DataLoaderObservation,
    last: &DataLoaderObservation,
) -> Option<DataLoaderSummary> {
    let window_ns = last.mono_ns.checked_sub(first.mono_ns).filter(|&d| d > 0)?;
    let secs = window_ns as f64 / 1e9;
    let batches = last.batches.saturating_sub(first.batches);
    let samples = batches * last.batch_size.unwrap_or(1);
    let training = delta(&first.training, &last.training);
    let seen: u64 = training.values().sum();
    let stalled: u64 = STALLS.iter().filter_map(|k| training.get(*k)).sum();
    let mut all_workers: BTreeMap<String, u64> = BTreeMap::new();
    let mut workers = Vec::new();
    for w in &last.workers {
        let before = first.workers.iter().find(|x| x.pid == w.pid);
        let empty = WorkerObservation::default();
        let b = before.unwrap_or(&empty);
        let st = delta(&b.stages, &w.stages);
        for (k, v) in &st {
            *all_workers.entry(k.clone()).or_default() += v;
        }
        let main: u64 = st
            .iter()
            .filter(|(k, _)| *k != "send")
            .map(|(_, v)| v)
            .sum();
        workers.push(WorkerSummary {
            pid: w.pid,
            cores: w.cpu_ns.saturating_sub(b.cpu_ns) as f64 / window_ns as f64,
            get_item_share: ratio(st.get("get_item").copied().unwrap_or(0), main),
        });
    }
    Some(DataLoaderSummary {
        torch_version: last.torch_version.clone(),
        start_wall_ns: first.wall_ns,
        end_wall_ns: last.wall_ns,
        window_s: secs,
        batches,
        batches_per_s: batches as f64 / secs,
        samples,
        samples_per_s: samples as f64 / secs,
        stall_share: ratio(stalled, seen),
        epochs: last.epochs.saturating_sub(first.epochs),
        num_workers: last.num_workers,
        prefetch_factor: last.prefetch_factor,
        queue_capacity: last
            .prefetch_factor
            .map(|p| u64::from(p) * u64::from(last.num_workers))
            .filter(|&c| c > 0),
        tasks_outstanding: last.tasks_outstanding,
        pin_memory: last.pin_memory,
        persistent_workers: last.persistent_workers,
        batch_size: last.batch_size,
        training: shares(&training),
        workers_stages: shares(&all_workers),
        workers,
        job_cores: last.job_cpu_ns.saturating_sub(first.job_cpu_ns) as f64 / window_ns as f64,
        sampler_ticks: last.ticks.saturating_sub(first.ticks),
        sharing_strategy: last.sharing_strategy.clone(),
    })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl DataLoaderSummary {
    /// The lines the recording prints.
    pub fn lines(&self) -> Vec<String> {
        let pct = |x: f64| format!("{:.0}%", 100.0 * x);
        let mut v = vec![format!(
            "DataLoader (torch {}): {:.1} batches/s, {:.1} samples/s; the training loop waited for data {} of its time",
            self.torch_version,
            self.batches_per_s,
            self.samples_per_s,
            pct(self.stall_share)
        )];
        v.push(format!(
            "  num_workers={} batch_size={} prefetch_factor={} pin_memory={} persistent_workers={}; in flight {} of {}",
            self.num_workers,
            self.batch_size.map_or("?".into(), |b| b.to_string()),
            self.prefetch_factor.map_or("-".into(), |p| p.to_string()),
            self.pin_memory,
            self.persistent_workers,
            self.tasks_outstanding.map_or("-".into(), |t| t.to_string()),
            self.queue_capacity.map_or("-".into(), |c| c.to_string()),
        ));
        if self.num_workers > 0 {
            v.push(self.training_line());
        }
        if !self.workers.is_empty() {
            let stages: Vec<String> = self
                .workers_stages
                .iter()
                .map(|(k, s)| format!("{k} {}", pct(*s)))
                .collect();
            // Without persistent workers each epoch starts new ones.
            let processes = if self.workers.len() > self.num_workers as usize {
                format!(", {} processes over the window", self.workers.len())
            } else {
                String::new()
            };
            v.push(format!(
                "  workers: {}{processes} ({:.2} cores in all); their time: {}",
                self.num_workers,
                self.workers.iter().map(|w| w.cores).sum::<f64>(),
                stages.join(", ")
            ));
        }
        v
    }

    /// Where the training loop's time went, with workers: waiting for a
    /// batch, receiving it (unpickling, the tensors' shared memory), the
    /// workers' start and end at epoch edges, its own step.
    fn training_line(&self) -> String {
        let share = |k: &str| self.training.get(k).copied().unwrap_or(0.0);
        let strategy = self
            .sharing_strategy
            .as_deref()
            .map_or(String::new(), |s| format!(" ({s} sharing)"));
        format!(
            "  training loop: waiting {:.0}%, receiving {:.0}%{strategy}, worker start-up {:.0}%, its step {:.0}%",
            100.0 * share("wait"),
            100.0 * share("receive"),
            100.0 * share("startup"),
            100.0 * share("other"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(mono: u64, batches: u64, wait: u64, other: u64) -> DataLoaderObservation {
        DataLoaderObservation {
            mono_ns: mono,
            batch_size: Some(32),
            batches,
            num_workers: 2,
            prefetch_factor: Some(2),
            training: [("wait".to_string(), wait), ("other".to_string(), other)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn window_figures() {
        let a = obs(1_000_000_000, 10, 100, 100);
        let b = obs(3_000_000_000, 50, 1_300, 500);
        let s = summarise(&a, &b).expect("window");
        assert_eq!(s.batches, 40);
        assert!((s.batches_per_s - 20.0).abs() < 1e-9);
        assert_eq!(s.samples, 1280);
        assert!((s.stall_share - 0.75).abs() < 1e-9);
        assert_eq!(s.queue_capacity, Some(4));
        assert!(summarise(&b, &b).is_none());
    }

    #[test]
    fn receiving_and_epoch_edges_are_stall() {
        let a = obs(1_000_000_000, 10, 0, 0);
        let mut b = obs(2_000_000_000, 30, 400, 100);
        b.training.insert("receive".into(), 300);
        b.training.insert("startup".into(), 200);
        b.sharing_strategy = Some("file_descriptor".into());
        let s = summarise(&a, &b).expect("window");
        assert!((s.stall_share - 0.9).abs() < 1e-9);
        let lines = s.lines();
        assert!(
            lines.iter().any(|l| l.contains(
                "training loop: waiting 40%, receiving 30% (file_descriptor sharing), worker start-up 20%, its step 10%"
            )),
            "{lines:?}"
        );
    }
}
