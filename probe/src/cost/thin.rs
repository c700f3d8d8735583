//! What can be thinned when the probe's cost passes its budget, and the
//! flags that tell the parts doing it (the attribution windows in
//! `usage`, the stack sampler's worker) to stop.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// The levers, shared by the meter that pulls them and the parts that
/// obey. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct Thin(Arc<Flags>);

#[derive(Debug, Default)]
struct Flags {
    windows: AtomicBool,
    sampling: AtomicBool,
    stages: AtomicBool,
    /// Attribution windows opened so far, and whether another is due
    /// before the recording ends: what the meter weighs before it comes.
    windows_opened: AtomicU32,
    window_due: AtomicBool,
}

impl Thin {
    /// No attribution window is to open from now on.
    pub fn windows_stopped(&self) -> bool {
        self.0.windows.load(Ordering::Relaxed)
    }

    /// The stack sampler is to stop its perf events.
    pub fn sampling_stopped(&self) -> bool {
        self.0.sampling.load(Ordering::Relaxed)
    }

    /// The DataLoader's stage sampler is to slow down.
    pub fn stages_slowed(&self) -> bool {
        self.0.stages.load(Ordering::Relaxed)
    }

    /// The attribution windows say they opened one, and whether another
    /// is due before the recording ends.
    pub fn window_opened(&self, another_due: bool) {
        self.0.windows_opened.fetch_add(1, Ordering::Relaxed);
        self.0.window_due.store(another_due, Ordering::Relaxed);
    }

    /// Attribution windows opened so far, and whether another is due.
    pub(super) fn windows(&self) -> (u32, bool) {
        (
            self.0.windows_opened.load(Ordering::Relaxed),
            self.0.window_due.load(Ordering::Relaxed),
        )
    }

    pub(super) fn pull(&self, lever: Lever) {
        match lever {
            Lever::Windows => self.0.windows.store(true, Ordering::Relaxed),
            Lever::Sampling => self.0.sampling.store(true, Ordering::Relaxed),
            Lever::StageSampler => self.0.stages.store(true, Ordering::Relaxed),
        }
    }
}

/// One thing the meter may thin, in the order it thins them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lever {
    /// The remaining attribution windows (record_stop, sched_switch, then
    /// the lock and GIL waits): the biggest in-target cost of the default
    /// mode, paid in traps on every op transition while a window is open.
    Windows,
    /// The stack sampler's perf events: a BPF run per tick on every CPU,
    /// and the unwinding in the probe process.
    Sampling,
    /// The DataLoader's stage sampler (`crate::torch::sampler`): its reads
    /// of the job's stacks, in the probe process. It reads them a quarter
    /// as often rather than stopping (the data stall rests on them), and
    /// the loader's counts as often as before.
    StageSampler,
}

impl Lever {
    /// What pulling it at `at_s` seconds into the window costs in
    /// accuracy, as `thinned` says it.
    pub(super) fn note(self, at_s: f64) -> String {
        match self {
            Lever::Windows => format!(
                "attribution windows stopped at {at_s:.1} s: the per-op CPU split and the lock and GIL waits rest on the windows taken before"
            ),
            Lever::Sampling => format!(
                "stack sampling stopped at {at_s:.1} s: the flamegraphs cover only the time before"
            ),
            Lever::StageSampler => format!(
                "the stage sampler slowed to a quarter of its rate at {at_s:.1} s: the data stall and the stages' shares rest on fewer samples after it (the batch counts do not: they are read as often)"
            ),
        }
    }
}
