//! Folded stacks (Brendan Gregg's format: `frame;frame;frame count`, one
//! stack per line), the input of flamegraph.pl, inferno and speedscope.
//!
//! Every stack is rooted at its op, then its thread:
//!
//! ```text
//! [ParallelMapV2];tf_data_private_threadpool;start_thread;...;DecodeJpeg;jpeg_idct_islow 1234
//! [outside pipeline];python3;_start;...;PyEval_EvalFrameDefault 99
//! ```
//!
//! so a flamegraph's bottom row shows how the weight splits between ops.
//! Lock waits end in a synthetic leaf frame naming the lock kind
//! (`[lock: gil]`, `[lock: mutex]`, ...), which marks GIL waits for
//! highlighting even where the stack has no Python frame.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::aggregate::{Stack, StackAggregator};
use super::sample::{LockKind, OpRef, ThreadInfo};

/// Root frame of the stacks of threads outside the pipeline.
pub const OUTSIDE_PIPELINE: &str = "[outside pipeline]";

/// Substrings of frame names that wait for (or take) Python's GIL, the
/// lock-wait leaf `[lock: gil]` included. flamegraphs highlight them.
pub const GIL_FRAME_PATTERNS: &[&str] = &[
    "[lock: gil]",
    "take_gil",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyEval_AcquireLock",
    "PyGILState_Ensure",
];

pub fn is_gil_frame(name: &str) -> bool {
    GIL_FRAME_PATTERNS.iter().any(|p| name.contains(p))
}

/// A Python frame as the sampler names it: `function (file.py:line)`, or
/// `function (<frozen importlib._bootstrap>:line)`; flamegraphs give
/// them their own colour.
pub fn is_python_frame(name: &str) -> bool {
    let Some((func, rest)) = name.rsplit_once(" (") else {
        return false;
    };
    let Some(inner) = rest.strip_suffix(')') else {
        return false;
    };
    let file = match inner.rsplit_once(':') {
        Some((f, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => f,
        _ => inner,
    };
    !func.is_empty()
        && !func.contains(['(', ' '])
        && (file.ends_with(".py") || (file.starts_with('<') && file.ends_with('>')))
}

/// The synthetic leaf frame of a lock wait in locks.folded.
pub fn lock_frame(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Mutex => "[lock: mutex]",
        LockKind::Condvar => "[lock: condvar]",
        LockKind::Gil => "[lock: gil]",
        LockKind::Futex => "[lock: futex]",
    }
}

/// One of the folded outputs, by the weight it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FoldedKind {
    /// On-CPU time (`cpu_ns`): cpu.folded.
    Cpu,
    /// Off-CPU time that is not a lock wait (`offcpu_ns`): offcpu.folded.
    Offcpu,
    /// Lock-wait time (`lock_wait_ns`), with a `[lock: KIND]` leaf: locks.folded.
    Locks,
    /// Bytes of I/O (`io_bytes`): io.folded.
    Io,
}

impl FoldedKind {
    pub const ALL: [FoldedKind; 4] = [
        FoldedKind::Cpu,
        FoldedKind::Offcpu,
        FoldedKind::Locks,
        FoldedKind::Io,
    ];

    /// `cpu`, `offcpu`, `locks`, `io`: the file names' stem.
    pub fn stem(self) -> &'static str {
        match self {
            FoldedKind::Cpu => "cpu",
            FoldedKind::Offcpu => "offcpu",
            FoldedKind::Locks => "locks",
            FoldedKind::Io => "io",
        }
    }

    pub fn folded_file(self) -> String {
        format!("{}.folded", self.stem())
    }

    pub fn svg_file(self) -> String {
        format!("{}.svg", self.stem())
    }

    /// The unit of the counts: `ns` or `bytes`.
    pub fn count_name(self) -> &'static str {
        match self {
            FoldedKind::Io => "bytes",
            _ => "ns",
        }
    }

    /// The default flamegraph title.
    pub fn title(self) -> &'static str {
        match self {
            FoldedKind::Cpu => "On-CPU time by tf.data op",
            FoldedKind::Offcpu => "Off-CPU time by tf.data op",
            FoldedKind::Locks => "Lock wait time by tf.data op",
            FoldedKind::Io => "I/O bytes by tf.data op",
        }
    }

    /// The kind a file such as `out/cpu.folded` holds, by its stem.
    pub fn from_path(path: &Path) -> Option<FoldedKind> {
        let stem = path.file_stem()?.to_str()?;
        FoldedKind::ALL.into_iter().find(|k| k.stem() == stem)
    }
}

/// A frame name safe for the folded format: `;` (the separator) becomes
/// `:`, control characters (newlines, tabs) become spaces, surrounding
/// blanks go, and an empty name becomes `[unknown]`. A trailing
/// space-separated number (`foo 12`) would be read as a second count
/// (differential flamegraphs), so that space becomes `_`.
pub fn sanitize_frame(name: &str) -> Cow<'_, str> {
    let trimmed = name.trim();
    if trimmed.is_empty() {
        return Cow::Borrowed("[unknown]");
    }
    let needs_map = trimmed.chars().any(|c| c == ';' || c.is_control());
    let mut s: Cow<'_, str> = if needs_map {
        let mapped: String = trimmed
            .chars()
            .map(|c| match c {
                ';' => ':',
                c if c.is_control() => ' ',
                c => c,
            })
            .collect();
        Cow::Owned(mapped.trim().to_string())
    } else {
        Cow::Borrowed(trimmed)
    };
    if let Some(i) = s.rfind(' ') {
        let tail = &s[i + 1..];
        if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '.') {
            let mut owned = s.into_owned();
            owned.replace_range(i..i + 1, "_");
            s = Cow::Owned(owned);
        }
    }
    if s.is_empty() {
        return Cow::Borrowed("[unknown]");
    }
    s
}

/// The root frame: `[<op model name>]`, or `[outside pipeline]`.
pub fn op_root_frame(op: Option<&OpRef>) -> String {
    match op {
        Some(op) => {
            let name = if op.name.trim().is_empty() {
                crate::opnames::model_name_of_path(&op.path)
            } else {
                op.name.as_str()
            };
            format!("[{}]", sanitize_frame(name))
        }
        None => OUTSIDE_PIPELINE.to_string(),
    }
}

/// The second frame: a pipeline thread's role (else its name), a thread
/// outside the pipeline's name (else its role); `tid N` when neither is known.
pub fn thread_frame(thread: &ThreadInfo, in_pipeline: bool) -> String {
    let role = thread.role.as_deref().filter(|r| !r.trim().is_empty());
    let name = Some(thread.name.as_str()).filter(|n| !n.trim().is_empty());
    let pick = if in_pipeline {
        role.or(name)
    } else {
        name.or(role)
    };
    match pick {
        Some(p) => sanitize_frame(p).into_owned(),
        None => format!("tid {}", thread.tid),
    }
}

fn stack_prefix(s: &Stack<'_>) -> String {
    let mut line = op_root_frame(s.op);
    line.push(';');
    line.push_str(&thread_frame(s.thread, s.op.is_some()));
    for f in &s.frames {
        line.push(';');
        line.push_str(&sanitize_frame(f));
    }
    line
}

/// The folded lines of one kind (without newlines), sorted, identical
/// stacks merged (threads of the same role fold together), zero counts left
/// out.
pub fn folded_lines(agg: &StackAggregator, kind: FoldedKind) -> Vec<String> {
    let mut merged: HashMap<String, u64> = HashMap::new();
    let mut add = |stack: String, count: u64| {
        if count > 0 {
            let c = merged.entry(stack).or_default();
            *c = c.saturating_add(count);
        }
    };
    for s in agg.stacks() {
        let w = s.weights;
        match kind {
            FoldedKind::Cpu => add(stack_prefix(&s), w.cpu_ns),
            FoldedKind::Offcpu => add(stack_prefix(&s), w.offcpu_ns),
            FoldedKind::Io => add(stack_prefix(&s), w.io_bytes),
            FoldedKind::Locks => {
                if w.lock_wait_ns.total() == 0 {
                    continue;
                }
                let prefix = stack_prefix(&s);
                for lk in LockKind::ALL {
                    add(
                        format!("{prefix};{}", lock_frame(lk)),
                        w.lock_wait_ns.get(lk),
                    );
                }
            }
        }
    }
    sorted_lines(merged)
}

/// A label of a [`LabeledStack`]'s sample: a string or a number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelValue {
    Str(String),
    Num(i64),
}

/// One stack of a profile with a single sample type, for a sampler whose
/// stacks are not a [`StackAggregator`]'s: the DataLoader's stage sampler
/// (wall time per stage, process and Python stack).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabeledStack {
    /// Outermost first, as in a folded line (root frames such as
    /// `[get item]` included).
    pub frames: Vec<String>,
    pub labels: Vec<(&'static str, LabelValue)>,
    pub value: u64,
}

/// The folded lines of [`LabeledStack`]s (frames sanitized as
/// [`folded_lines`]' are), sorted, identical stacks merged, zero values
/// left out.
pub fn labeled_folded_lines(stacks: &[LabeledStack]) -> Vec<String> {
    let mut merged: HashMap<String, u64> = HashMap::new();
    for s in stacks.iter().filter(|s| s.value > 0) {
        let line: Vec<Cow<'_, str>> = s.frames.iter().map(|f| sanitize_frame(f)).collect();
        let c = merged.entry(line.join(";")).or_default();
        *c = c.saturating_add(s.value);
    }
    sorted_lines(merged)
}

/// `STACK COUNT` lines, sorted.
fn sorted_lines(merged: HashMap<String, u64>) -> Vec<String> {
    let mut lines: Vec<String> = merged
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    lines.sort_unstable();
    lines
}

/// The folded file's text: [`folded_lines`], each ending in `\n`.
pub fn folded_text(agg: &StackAggregator, kind: FoldedKind) -> String {
    let lines = folded_lines(agg, kind);
    let mut out = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_frames() {
        for yes in [
            "slow_fn (train.py:42)",
            "__call__ (tensorflow/python/ops/script_ops.py:267)",
            "_find_and_load (<frozen importlib._bootstrap>:1178)",
            "<module> (train.py:1)",
            "f (a.py)",
            "RandomResizedCrop.forward (torchvision/transforms/transforms.py)",
            "build.<locals>.<lambda> (train.py:7)",
        ] {
            assert!(is_python_frame(yes), "{yes}");
        }
        for no in [
            "take_gil",
            "tensorflow::PyFuncOp::Compute(tensorflow::OpKernelContext*)",
            "std::_Function_handler<void (), std::_Bind<f (x.py:1)>>::_M_invoke(std::_Any_data const&)",
            "[lock: gil]",
            "f (a.pyc:3)",
        ] {
            assert!(!is_python_frame(no), "{no}");
        }
    }
}
