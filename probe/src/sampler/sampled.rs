//! What a recording's stack sampler hands back: the unwound stacks and
//! sampled waits it counted, and how complete they were.

use std::collections::HashMap;
use std::sync::Arc;

use plumber_collector::event::DropCount;

/// What the sampler collected.
#[derive(Debug, Default)]
pub struct SampledStacks {
    /// Nanoseconds of CPU one sample stands for.
    pub period_ns: u64,
    /// (tid, frames outermost first) -> samples.
    pub stacks: HashMap<(u32, Vec<Arc<str>>), u64>,
    pub samples: u64,
    /// Samples whose unwound stack reaches a thread entry point.
    pub complete: u64,
    /// How the incomplete ones ended.
    pub out_of_stack: u64,
    pub unwind_failed: u64,
    pub too_deep: u64,
    /// Samples of a thread in the kernel (kernel frames on top).
    pub in_kernel: u64,
    /// Samples not kept: their stack was new past MAX_DISTINCT_STACKS.
    pub over_limit: u64,
    /// Sampled lock and GIL waits (copied by bpf/probe.bpf.c at their
    /// return): (tid, wait kind, frames outermost first, down to the slow
    /// path's caller) -> wait ns, unscaled.
    pub waits: HashMap<(u32, u32, Vec<Arc<str>>), u64>,
    /// How many, and how many of them reach a thread entry point.
    pub wait_samples: u64,
    pub wait_complete: u64,
    /// Addresses looked up with blazesym (the rest came from the cache).
    pub symbol_lookups: u64,
    /// CPU time of our worker thread (unwinding, symbolizing).
    pub worker_cpu_ns: u64,
    /// When sampling started and stopped, ns since the epoch.
    pub start_wall_ns: u64,
    pub end_wall_ns: u64,
    /// Wall time spent unwinding and naming frames.
    pub unwind_ns: u64,
    pub symbolize_ns: u64,
    pub drops: Vec<DropCount>,
    /// Python frames: None when the target's interpreter was not read.
    pub python: Option<PythonSummary>,
}

/// How the Python frames of a recording went.
#[derive(Debug, Default, Clone)]
pub struct PythonSummary {
    /// The interpreter, one line.
    pub note: String,
    /// Samples (and sampled waits) that carried Python frames.
    pub samples: u64,
    /// ... whose frame walk was cut at PS_PY_FRAMES, or by a failed read.
    pub truncated: u64,
    pub read_failed: u64,
    /// Frames left out: their code object could not be read or named.
    pub unnamed_frames: u64,
    /// Code objects decoded (each once while it lives).
    pub code_objects: u64,
    /// The BPF walk: how many, their time in the target, frames copied.
    pub walks: u64,
    pub walk_ns: u64,
    pub walk_frames: u64,
}

impl PythonSummary {
    /// Mean ns one walk cost the target (0 without walks).
    pub fn ns_per_walk(&self) -> u64 {
        self.walk_ns / self.walks.max(1)
    }
}

impl SampledStacks {
    /// Share of samples whose stack reaches a thread entry point, in %.
    pub fn complete_pct(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            100.0 * self.complete as f64 / self.samples as f64
        }
    }
}
