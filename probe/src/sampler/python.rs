//! Python frames into unwound stacks: each run of interpreter frames that
//! executes Python code is replaced, in place, by the Python frames it was
//! running, so a native call from Python (a TensorFlow op, a decoder)
//! stays under the Python frame that made it, and Python called from
//! native code (tf.py_function's PyFuncOp::Compute) sits above it.
//!
//! The BPF walk (bpf/python.h) gives the frames innermost first, with the
//! outermost frame of each C-level call of the eval loop marked (3.11+:
//! one `_PyEval_EvalFrameDefault` runs several Python frames; up to 3.10,
//! one each). The k-th `_PyEval_EvalFrameDefault` of the native stack,
//! counted from the innermost, ran the k-th group.

use std::sync::Arc;

use crate::bpf::sample::{RawSample, PY_READ_FAILED, PY_TRUNCATED};
use crate::python::{CodeNames, PyProcess};

/// One frame of a stack before naming: a native address (named at the
/// end) or a Python frame (named as it is sampled, while its code object
/// is alive).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Frame {
    Addr(u64),
    Py(Arc<str>),
}

/// The interpreter and its code objects' names.
pub struct PyFrames {
    pub py: PyProcess,
    pub names: CodeNames,
    /// Samples that carried Python frames, and those whose walk was cut.
    pub with_frames: u64,
    pub truncated: u64,
    pub read_failed: u64,
}

impl PyFrames {
    pub fn new(py: PyProcess) -> Self {
        let names = CodeNames::new(py.pid, py.offsets, py.code_type);
        PyFrames {
            py,
            names,
            with_frames: 0,
            truncated: 0,
            read_failed: 0,
        }
    }

    /// The sample's Python frames, grouped by eval loop call, innermost
    /// group first, each innermost frame first. Frames whose code object
    /// cannot be named are left out.
    pub fn groups(&mut self, s: &RawSample) -> Vec<Vec<Arc<str>>> {
        if s.py.is_empty() {
            return Vec::new();
        }
        self.with_frames += 1;
        if s.py_flags & PY_TRUNCATED != 0 {
            self.truncated += 1;
        }
        if s.py_flags & PY_READ_FAILED != 0 {
            self.read_failed += 1;
        }
        let one_per_call = self.py.offsets.minor <= 10;
        let mut groups = Vec::new();
        let mut cur = Vec::new();
        for (i, &(code, instr)) in s.py.iter().enumerate() {
            if code == 0 {
                // 3.12+: the entry frame of an eval loop call; the frames
                // before it were that call's (none: it has just begun).
                groups.push(std::mem::take(&mut cur));
                continue;
            }
            if let Some(name) = self.names.frame(code, instr) {
                cur.push(name);
            }
            if one_per_call || s.py_entry & (1 << i) != 0 {
                groups.push(std::mem::take(&mut cur));
            }
        }
        if !cur.is_empty() {
            groups.push(cur);
        }
        groups
    }
}

/// Merges Python frames into a native stack (innermost first). In each
/// run of interpreter frames holding eval loop frames, the frames inside
/// the innermost eval frame stay (what the Python code called: `time_sleep`,
/// `take_gil`); the rest of the run, from the innermost eval frame out, is
/// replaced by the groups of its eval frames. Groups left over (the
/// native unwind stopped early) go on the outer end.
///
/// `walk_complete`: the Python walk reached the thread's first frame.
/// Then eval frames beyond the groups are the innermost ones: an eval
/// call that has not yet pushed its frame, or has popped it and is
/// returning (3.9 calls `_Py_CheckFunctionResult` after
/// `tstate->frame = f->f_back`). They ran no Python frame and are left
/// out, so each group stays with its own eval call. Otherwise the walk
/// was cut and the outer ones keep their native name.
pub fn merge(
    native: &[u64],
    groups: &[Vec<Arc<str>>],
    walk_complete: bool,
    is_interp: impl Fn(u64) -> bool,
    is_eval: impl Fn(u64) -> bool,
) -> Vec<Frame> {
    if groups.is_empty() {
        return native.iter().map(|&a| Frame::Addr(a)).collect();
    }
    let mut out = Vec::with_capacity(native.len() + groups.iter().map(Vec::len).sum::<usize>());
    let evals = native.iter().filter(|&&a| is_eval(a)).count();
    let mut skip = if walk_complete {
        evals.saturating_sub(groups.len())
    } else {
        0
    };
    let mut next = groups.iter();
    let mut i = 0;
    while i < native.len() {
        if !is_interp(native[i]) {
            out.push(Frame::Addr(native[i]));
            i += 1;
            continue;
        }
        let end = native[i..]
            .iter()
            .position(|&a| !is_interp(a))
            .map_or(native.len(), |n| i + n);
        let run = &native[i..end];
        match run.iter().position(|&a| is_eval(a)) {
            None => out.extend(run.iter().map(|&a| Frame::Addr(a))),
            Some(first) => {
                out.extend(run[..first].iter().map(|&a| Frame::Addr(a)));
                for &a in run[first..].iter().filter(|&&a| is_eval(a)) {
                    if skip > 0 {
                        skip -= 1;
                        continue;
                    }
                    match next.next() {
                        Some(g) => out.extend(g.iter().cloned().map(Frame::Py)),
                        // More eval frames than groups (the walk was
                        // cut): the outer ones keep their native name.
                        None => out.push(Frame::Addr(a)),
                    }
                }
            }
        }
        i = end;
    }
    for g in next {
        out.extend(g.iter().cloned().map(Frame::Py));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(names: &[&str]) -> Vec<Arc<str>> {
        names.iter().map(|n| Arc::from(*n)).collect()
    }

    fn show(f: &[Frame]) -> Vec<String> {
        f.iter()
            .map(|f| match f {
                Frame::Addr(a) => format!("{a:#x}"),
                Frame::Py(n) => n.to_string(),
            })
            .collect()
    }

    // Interpreter code is 0x1000-0x1fff, the eval loop 0x1800-0x18ff.
    fn interp(a: u64) -> bool {
        (0x1000..0x2000).contains(&a)
    }
    fn eval(a: u64) -> bool {
        (0x1800..0x1900).contains(&a)
    }

    #[test]
    fn runs_of_interpreter_frames_become_python_frames() {
        // Innermost first: jpeg decode (0x5000) called from Python through
        // cfunction (0x1100), in an eval call (0x1810) running f and g,
        // called from vectorcall (0x1200) and an eval call (0x1820)
        // running main, from PyRun (0x1300), from _start (0x9000).
        let native = [0x5000, 0x1100, 0x1810, 0x1200, 0x1820, 0x1300, 0x9000];
        let groups = vec![py(&["g (a.py:3)", "f (a.py:9)"]), py(&["main (a.py:20)"])];
        let m = merge(&native, &groups, true, interp, eval);
        assert_eq!(
            show(&m),
            [
                "0x5000",
                "0x1100",
                "g (a.py:3)",
                "f (a.py:9)",
                "main (a.py:20)",
                "0x9000"
            ]
        );
    }

    #[test]
    fn python_under_a_native_caller() {
        // PyFuncOp::Compute (0x7000) calls into the interpreter; the UDF
        // waits for nothing, it runs: the leaf is the eval loop itself.
        let native = [0x1805, 0x1400, 0x7000, 0x7100];
        let groups = vec![py(&[
            "slow_fn (train.py:42)",
            "__call__ (script_ops.py:150)",
        ])];
        let m = merge(&native, &groups, true, interp, eval);
        assert_eq!(
            show(&m),
            [
                "slow_fn (train.py:42)",
                "__call__ (script_ops.py:150)",
                "0x7000",
                "0x7100"
            ]
        );
    }

    #[test]
    fn leftovers_and_shortfalls() {
        // No Python frames: the stack as it was.
        assert_eq!(
            show(&merge(&[0x1810, 0x9000], &[], true, interp, eval)),
            ["0x1810", "0x9000"]
        );
        // Fewer groups than eval frames, the walk cut: the outer one
        // keeps its address.
        let m = merge(
            &[0x1810, 0x1820],
            &[py(&["f (a.py:1)"])],
            false,
            interp,
            eval,
        );
        assert_eq!(show(&m), ["f (a.py:1)", "0x1820"]);
        // The walk complete: the inner eval call has popped its frame
        // (3.9, returning through _Py_CheckFunctionResult at 0x1100) and
        // ran no Python; its caller's group stays with its own call.
        let m = merge(
            &[0x1100, 0x1810, 0x1200, 0x1820, 0x9000],
            &[py(&["f (a.py:1)"])],
            true,
            interp,
            eval,
        );
        assert_eq!(show(&m), ["0x1100", "f (a.py:1)", "0x9000"]);
        // More groups than eval frames (the unwind stopped): outermost.
        let m = merge(
            &[0x1810],
            &[py(&["f (a.py:1)"]), py(&["g (a.py:2)"])],
            true,
            interp,
            eval,
        );
        assert_eq!(show(&m), ["f (a.py:1)", "g (a.py:2)"]);
        // A run without an eval frame (PyGILState_Ensure -> take_gil) stays.
        let m = merge(
            &[0x1100, 0x1200, 0x7000],
            &[py(&["f (a.py:1)"])],
            true,
            interp,
            eval,
        );
        assert_eq!(show(&m), ["0x1100", "0x1200", "0x7000", "f (a.py:1)"]);
    }
}
