//! What the stage sampler saw so far, shared with the recording's polls:
//! the loader's state as its iterator says it, and each thread role's
//! time and CPU time per stage.

use std::collections::BTreeMap;

use super::count::EpochTotal;
use super::stage::Stage;

/// What the loader says of itself, read from its iterator object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoaderState {
    /// The iterator object (a new one per epoch without persistent
    /// workers).
    pub iter: u64,
    /// The type of the loader's dataset (`ImageFolder`): which of the
    /// job's loaders is followed.
    pub dataset_type: Option<String>,
    pub num_yielded: u64,
    /// `_send_idx` of a map-style iterator with workers.
    pub sent: Option<u64>,
    /// The thread whose frames hold the iterator (CPython's `thread_id`):
    /// the training loop's.
    pub held_by: Option<u64>,
    pub num_workers: u32,
    pub prefetch_factor: Option<u32>,
    pub pin_memory: bool,
    pub persistent_workers: bool,
    pub batch_size: Option<u64>,
    pub drop_last: bool,
    /// Batches sent to workers and not yet yielded.
    pub tasks_outstanding: Option<u64>,
    /// (worker id, pid) of each worker process.
    pub workers: Vec<(u32, i32)>,
    /// The pid of worker 0 when the workers were read by name for this
    /// state; None when kept from an earlier read, not read, or not
    /// started yet (`Count::first_worker`).
    pub first_worker: Option<i32>,
    /// A map-style dataset's loader (`_dataset_kind` 0), not an iterable
    /// one's.
    pub map_style: bool,
    /// Times since the recording began that the loader followed was gone
    /// and the one running then was followed: a loader the job made anew.
    pub replaced: u64,
}

/// Wall time per stage of one thread role, ns.
pub type StageNs = BTreeMap<Stage, u64>;

/// What the sampler saw so far (cumulative).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub ticks: u64,
    /// Wall time covered by the ticks, ns.
    pub covered_ns: u64,
    /// The training loop's thread (the one holding the loader's
    /// iterator).
    pub training: StageNs,
    /// Time whose training-loop stage is not known: before its thread
    /// was, or a partial stack.
    pub training_unknown_ns: u64,
    /// Per worker process: its main thread, and its result queue's feeder
    /// thread (Send while it pickles and writes); empty for a worker
    /// followed that no tick saw in a stage.
    pub workers: BTreeMap<i32, StageNs>,
    pub pin_memory: StageNs,
    pub batches: EpochTotal,
    pub state: Option<LoaderState>,
    /// Workers whose interpreter could not be read (pid, why).
    pub unreadable_workers: Vec<(i32, String)>,
    pub bad_frames: u64,
    /// The tensor sharing strategy the training loop's receiving frames
    /// showed (`file_descriptor`, `file_system`), once seen.
    pub sharing_strategy: Option<&'static str>,
    /// The sampler's thread ended by a panic: what it saw stops there.
    pub failed: bool,
    /// Of `training`'s time, what its thread spent waiting for its
    /// process's GIL (`crate::torch::gil`), per stage.
    pub training_gil: StageNs,
    /// Of `workers`' time, the same, per worker process.
    pub workers_gil: BTreeMap<i32, StageNs>,
    /// Of `training`'s time, what its thread spent asleep on a lock, a
    /// condition or a semaphore (a futex other than the GIL's), per stage.
    pub training_lock: StageNs,
    /// Of `workers`' time, the same, per worker process.
    pub workers_lock: BTreeMap<i32, StageNs>,
    /// Threads' ticks whose GIL wait was told, and those it could not be
    /// (the thread's kernel id or the GIL not readable).
    pub gil_told: u64,
    pub gil_untold: u64,
    /// CPU time per stage, ns, of the threads whose wall time is in
    /// `training`, `workers` and `pin_memory` (`thread_cpu.rs`); empty
    /// where no thread's CPU could be read (its kernel id not known).
    pub training_cpu: StageNs,
    pub workers_cpu: BTreeMap<i32, StageNs>,
    pub pin_memory_cpu: StageNs,
}
