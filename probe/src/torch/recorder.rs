//! What the stage sampler records besides its counts: each thread's tick
//! on its stage stack (stages.folded, profile.pb.gz) and on its track's
//! spans (trace.json).

use std::collections::HashMap;
use std::sync::Arc;

use plumber_collector::stacks::Span;

use super::frames::{Named, Stack};
use super::spans::{Seen, StageSpans};
use super::stage::Stage;

/// A stack of one process in one stage: `[stage];process;function
/// (file);...` in stages.folded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StageStack {
    pub stage: Stage,
    pub pid: i32,
    /// `training loop (pid N)`, `worker K (pid M)`.
    pub process: Arc<str>,
    /// Outermost first.
    pub frames: Vec<Named>,
}

/// Wall ns per stage stack.
pub type StageStacks = HashMap<StageStack, u64>;

/// What the sampler recorded besides its counts: the stage stacks and the
/// spans.
#[derive(Default)]
pub(super) struct Recorder {
    pub(super) stacks: StageStacks,
    pub(super) spans: StageSpans,
}

/// The stacks and spans of a finished sampler.
#[derive(Debug, Default)]
pub struct Recorded {
    pub stacks: StageStacks,
    pub spans: Vec<Span>,
    /// Spans past `spans::MAX_SPANS`, not kept.
    pub spans_over_limit: u64,
}

impl Recorder {
    /// Adds one thread's tick `[start_ns, end_ns]` to its stage stack (idle
    /// time is left out: a flamegraph of where the time went, not of
    /// waiting for work) and to its spans.
    pub(super) fn record(&mut self, seen: &Seen<'_>, stack: &Stack, start_ns: u64, end_ns: u64) {
        self.spans.see(seen, start_ns, end_ns);
        if seen.stage == Stage::Idle {
            return;
        }
        let key = StageStack {
            stage: seen.stage,
            pid: seen.pid,
            process: seen.process.clone(),
            frames: stack.frames.clone(),
        };
        *self.stacks.entry(key).or_default() += end_ns.saturating_sub(start_ns);
    }
}
