//! What a tick of the stage sampler adds to what it saw: each thread's
//! time to its stage, its CPU time beside it, and whether its wait was
//! told.

use std::sync::Arc;

use super::frames::Stack;
use super::gil::Wait;
use super::observed::{Observed, StageNs};
use super::spans::{Role, Seen};
use super::stage::Stage;
use super::thread_cpu::CpuSplit;
use super::worker_ticks::WorkerStage;

/// A worker process at a tick: its threads' stages, and each one's CPU
/// time since it was last read (None: not read).
pub(super) type WorkerTicks = (i32, Vec<WorkerStage>, Vec<Option<CpuSplit>>);

/// `dt` of the training loop's time to its stage, or to the unknown; the
/// CPU its thread ran meanwhile (`cpu`) to the stages it went to. CPU
/// time whose stage is not known is not kept.
pub(super) fn add_loop(o: &mut Observed, stage: Option<Stage>, dt: u64, cpu: Option<CpuSplit>) {
    match stage {
        Some(s) => {
            *o.training.entry(s).or_default() += dt;
            add_cpu(&mut o.training_cpu, cpu);
        }
        None => o.training_unknown_ns += dt,
    }
}

/// A thread's CPU time, when read, to the stages it went to.
pub(super) fn add_cpu(to: &mut StageNs, cpu: Option<CpuSplit>) {
    for (stage, ns) in cpu.into_iter().flatten() {
        if ns > 0 {
            *to.entry(stage).or_default() += ns;
        }
    }
}

/// Counts a thread's tick as told or not; what it waited for.
pub(super) fn count_wait(o: &mut Observed, waits: Option<Wait>) -> Wait {
    match waits {
        Some(w) => {
            o.gil_told += 1;
            w
        }
        None => {
            o.gil_untold += 1;
            Wait::Not
        }
    }
}

/// Thread `s` of process `pid` in `stage` at a tick.
pub(super) fn seen<'a>(
    pid: i32,
    process: &'a Arc<str>,
    role: Role,
    stage: Stage,
    s: &'a Stack,
) -> Seen<'a> {
    Seen {
        pid,
        process,
        thread_id: s.thread_id,
        tid: s.tid,
        role,
        stage,
        leaf: s.frames.last(),
    }
}
