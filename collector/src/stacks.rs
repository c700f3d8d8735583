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
//! Span ----------------render_trace_json--> trace.json
//! ```
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
    folded_lines, folded_text, is_gil_frame, lock_frame, op_root_frame, sanitize_frame,
    thread_frame, write_folded, FoldedKind, GIL_FRAME_PATTERNS, OUTSIDE_PIPELINE,
};
pub use pprof::{build_profile, encode_profile_gz, write_pprof, PprofOptions, SAMPLE_TYPES};
pub use sample::{LockKind, OpRef, StackSample, ThreadInfo, Weight};
pub use trace::{render_trace_json, write_trace_json, Span, TraceOptions, TraceSummary};

use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory
/// and a rename, so a reader never sees half a file (the analyzer writes
/// the SVGs with it too).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StacksError> {
    let werr = |source| StacksError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        // Best effort: the temporary file is ours and useless now.
        let _ = std::fs::remove_file(&tmp);
        return Err(werr(e));
    }
    tracing::debug!(path = %path.display(), bytes = bytes.len(), "wrote");
    Ok(())
}
