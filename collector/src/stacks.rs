//! Stack samples of the target's threads, attributed to the tf.data op each
//! thread was running, and the offline outputs built from them: folded
//! stacks (cpu.folded, offcpu.folded, locks.folded), pprof's profile.pb.gz
//! and a Chrome trace.json of op spans. The SVG flamegraphs are rendered from
//! the folded stacks by `plumber_analyzer::flamegraph`.
//!
//! No BPF here: the stack sampler produces [`StackSample`]s and [`Span`]s,
//! everything else can be driven from saved samples.
//!
//! ```text
//! StackSample --StackAggregator::add--> StackAggregator (one entry per distinct stack)
//!                                          |--folded_text--> cpu.folded / offcpu.folded / locks.folded
//!                                          '--build_profile--> profile.pb.gz
//! LabeledStack (DataLoader stages) --build_labeled_profile--> profile.pb.gz
//! Span ----------------render_trace_json--> trace.json
//! ```
//!
//! Everything here renders bytes; plumber-probe writes them (with
//! [`crate::atomic`]).
//!
//! Identical stacks are aggregated before anything is rendered: inferno's
//! time and memory grow with the number of distinct folded lines, not with
//! their counts.

mod aggregate;
mod error;
mod folded;
pub mod pprof;
mod sample;
pub mod synth;
mod trace;

pub use aggregate::{LockWaits, Stack, StackAggregator, StackKey, Weights};
pub use error::StacksError;
pub use folded::{
    folded_lines, folded_text, is_gil_frame, is_python_frame, labeled_folded_lines, lock_frame,
    op_root_frame, sanitize_frame, thread_frame, FoldedKind, LabelValue, LabeledStack,
    GIL_FRAME_PATTERNS, OUTSIDE_PIPELINE,
};
pub use pprof::{
    build_labeled_profile, build_profile, encode_profile_gz, PprofOptions, SAMPLE_TYPES,
};
pub use sample::{LockKind, OpRef, StackSample, ThreadInfo, Weight};
pub use trace::{render_trace_json, Span, TraceOptions, TraceSummary};
