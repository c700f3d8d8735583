//! What the DataLoader's stage sampler hands the collector: one cumulative
//! observation per poll (the loop's and each worker's wall time per stage,
//! their waits, the job's CPU and each followed process's reads). The
//! summary over a window (`dataloader.rs`) and the waits
//! (`loader_waits.rs`) are both read from these.

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
    /// The type of the followed loader's dataset: which of the job's
    /// loaders (a training and a validation one) this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_type: Option<String>,
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
    /// Times the loader followed was gone and the one the loop ran then
    /// was followed instead (a loader the job made anew), since the
    /// recording began.
    #[serde(default)]
    pub loaders_replaced: u64,
    /// Batches sent to workers and not yet yielded, now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_outstanding: Option<u64>,
    /// Wall time the sampler covered, ns.
    pub covered_ns: u64,
    pub ticks: u64,
    /// The training loop's thread, wall ns per stage (`wait`, `get_item`,
    /// `collate`, `other`; `other_loader` inside another loader's calls),
    /// from when it was first seen in `next()`.
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
    /// File reads of every process the recording follows: the training
    /// process, its workers and whatever else it started. None: not
    /// measured (the recording could not load its BPF programs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<Vec<ProcessIo>>,
    /// Of `training`'s time, what the loop's thread spent waiting for its
    /// process's GIL, wall ns per stage.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub training_gil: BTreeMap<String, u64>,
    /// Of `training`'s time, what the loop's thread spent asleep on a
    /// lock, a condition or a semaphore (a futex other than the GIL's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub training_lock: BTreeMap<String, u64>,
    /// Threads' ticks whose GIL wait the sampler could tell, and those it
    /// could not (the thread's kernel id or the GIL not readable).
    #[serde(default)]
    pub gil_told: u64,
    #[serde(default)]
    pub gil_untold: u64,
    /// CPU time per stage of the threads whose wall time is in
    /// `training` and `pin_memory_stages`, ns: what each ran between two
    /// of the sampler's reads, put on the stage seen at the second. Empty:
    /// not read (the thread's kernel id not known).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub training_cpu: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pin_memory_cpu: BTreeMap<String, u64>,
}

/// What a followed process is to the loader.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The process that iterates the loader.
    Training,
    /// One the loader names among its workers.
    Worker,
    /// Any other process the job started (a forkserver, a resource
    /// tracker, a subprocess), or a worker the loader has not named yet.
    #[default]
    Other,
}

/// A followed process's file reads, cumulative since it was followed
/// (from its first instruction for those started during the recording).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ProcessIo {
    pub pid: i32,
    pub role: Role,
    /// Bytes that read syscalls (read, pread64, readv, preadv, preadv2)
    /// returned from regular files.
    pub bytes: u64,
    /// Those read syscalls.
    pub reads: u64,
    /// Time inside them, ns.
    pub read_ns: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct WorkerObservation {
    pub pid: i32,
    /// Wall ns per stage of its main thread (`get_item`, `collate`,
    /// `idle`), and `send` while its result queue's feeder pickles.
    pub stages: BTreeMap<String, u64>,
    pub cpu_ns: u64,
    /// Of `stages`' time, what its threads waited for its GIL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gil: BTreeMap<String, u64>,
    /// Of `stages`' time, what its threads waited on locks, conditions
    /// and semaphores.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lock: BTreeMap<String, u64>,
    /// CPU time per stage of the threads whose wall time is in `stages`,
    /// ns (as `DataLoaderObservation::training_cpu`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stage_cpu: BTreeMap<String, u64>,
}

/// The training loop's stages inside the loader's `next()` and `iter()`:
/// the data stall. `pin_memory` is the loop's only without workers, when
/// it pins each batch itself.
pub(crate) const STALLS: [&str; 6] = [
    "wait",
    "receive",
    "startup",
    "get_item",
    "collate",
    "pin_memory",
];

/// What each key of `b` grew by since `a` (0 for a key `a` lacks).
pub(crate) fn delta(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    b.iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(a.get(k).copied().unwrap_or(0))))
        .collect()
}
