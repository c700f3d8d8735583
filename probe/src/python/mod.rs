//! The target's Python interpreter, read from outside: where CPython is,
//! which version, the offsets of what a stack walk reads, and the
//! configuration the BPF walk (bpf/python.h) gets. Nothing here stops or
//! changes the target: process_vm_readv only.
//!
//! [`PyProcess::attach`] finds the interpreter (`find.rs`), takes its
//! offsets (3.13's `_Py_DebugOffsets`, else the table of `offsets.rs`) and
//! validates them on the live process before anything uses them: every
//! thread state must point back at the interpreter, and the threads'
//! current frames must lead to code objects (their type is `PyCode_Type`)
//! with plausible names. Any failure is an error the caller turns into a
//! one-line note and native-only stacks.

mod code;
mod dict;
mod find;
mod frame_refs;
mod kept;
mod known;
mod lines;
mod object_layout;
mod objects;
mod offsets;
mod ref_path;
mod slots;
mod type_info;

use std::ops::Range;

pub use code::{qualified, short_file, CodeNames};
pub use frame_refs::{Found, LookHow};
pub use objects::{ObjError, Objects, PyValue, Storage};
pub use offsets::Offsets;

use crate::mem::{word_at, Memory};
pub use offsets::NONE;

#[derive(Debug, thiserror::Error)]
pub enum PyError {
    #[error("no CPython interpreter in the target")]
    NotPython,
    #[error("reading the interpreter: {0}")]
    Unreadable(String),
    #[error("CPython {0} is not supported (3.9 to 3.13 are)")]
    UnknownVersion(String),
    #[error("CPython 3.{minor}'s structures do not look as expected ({what})")]
    Invalid { minor: u32, what: String },
    /// `_PyRuntime` lists no interpreter: before `Py_Initialize` or after
    /// finalization. Seen attaching to a job as it exited; said as a fault
    /// of the layout before, which it is not.
    #[error("no Python interpreter runs in it now: the process is starting up or shutting down; attach once the job runs")]
    NotRunning,
}

/// The BPF walk's configuration (bpf/python.h `struct py_cfg`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PyConfig {
    pub interp: u64,
    pub holder_addr: u64,
    pub locked_addr: u64,
    pub minor: u32,
    pub threads_head: u32,
    pub ts_next: u32,
    pub ts_thread_id: u32,
    pub ts_frame: u32,
    pub cframe_frame: u32,
    pub f_previous: u32,
    pub f_code: u32,
    pub f_instr: u32,
    pub f_owner: u32,
    pub f_is_entry: u32,
    /// Bytes of a frame the walk reads at once (bpf/python.h
    /// PY_FRAME_READ at most).
    pub f_read: u32,
}

/// Walks of every thread before the offsets are refused.
const VALIDATE_TRIES: u32 = 5;

/// bpf/python.h PY_FRAME_READ.
const FRAME_READ: u32 = 128;

/// A validated interpreter.
#[derive(Debug, Clone)]
pub struct PyProcess {
    pub pid: i32,
    pub path: String,
    pub offsets: Offsets,
    pub config: PyConfig,
    pub code_type: u64,
    /// `_PyRuntime` (3.13 starts it with `_Py_DebugOffsets`).
    pub runtime: u64,
    /// `_PyEval_EvalFrameDefault`, and all of the interpreter's code.
    pub eval: Range<u64>,
    pub text: Vec<Range<u64>>,
}

/// 3.12+: the eval loop's own entry frame, not a Python frame.
const OWNED_BY_CSTACK: u8 = 3;

impl PyProcess {
    /// Finds and validates the target's interpreter.
    pub fn attach(pid: i32) -> Result<PyProcess, PyError> {
        Self::attach_with(pid, None)
    }

    /// As [`PyProcess::attach`], with the given offsets instead of the
    /// version's (a test of the validation).
    pub fn attach_with(pid: i32, forced: Option<Offsets>) -> Result<PyProcess, PyError> {
        let it = find::find(pid)?;
        let mem = Memory::new(pid);
        let unreadable = |e: crate::mem::MemError| PyError::Unreadable(e.to_string());
        let mut head = vec![0u8; offsets::DEBUG_OFFSETS_LEN];
        mem.read(it.py_runtime, &mut head).map_err(unreadable)?;
        let off = match forced {
            Some(o) => o,
            None if &head[..8] == offsets::DEBUG_COOKIE => offsets::from_debug_offsets(&head)
                .ok_or_else(|| PyError::UnknownVersion(format!("{:#x}", word_at(&head, 8))))?,
            None => {
                let minor = match it.py_version {
                    Some(a) => mem
                        .u64(a)
                        .map(|v| ((v as u32) >> 16) & 0xff)
                        .map_err(unreadable)?,
                    None => it
                        .minor_from_name
                        .ok_or_else(|| PyError::UnknownVersion(it.path.clone()))?,
                };
                offsets::table(minor)
                    .ok_or_else(|| PyError::UnknownVersion(format!("3.{minor}")))?
            }
        };
        let interp = mem
            .u64(it.py_runtime + off.runtime_interp_head)
            .map_err(unreadable)?;
        let invalid = |what: &str| PyError::Invalid {
            minor: off.minor,
            what: what.to_string(),
        };
        if interp == 0 {
            return Err(PyError::NotRunning);
        }
        let gil_base = if off.gil_in_interp {
            interp
        } else {
            it.py_runtime
        };
        // One read covers every field of a frame the walk uses.
        let f_read = [
            off.f_previous,
            off.f_code,
            off.f_instr,
            off.f_owner,
            off.f_is_entry,
        ]
        .into_iter()
        .filter(|&o| o != NONE)
        .map(|o| o + 8)
        .max()
        .unwrap_or(0);
        if f_read > FRAME_READ {
            return Err(invalid("frame fields past what the walk reads"));
        }
        let config = PyConfig {
            interp,
            holder_addr: gil_base + off.gil_holder,
            locked_addr: gil_base + off.gil_locked,
            minor: off.minor,
            threads_head: off.interp_threads_head,
            ts_next: off.ts_next,
            ts_thread_id: off.ts_thread_id,
            ts_frame: off.ts_frame,
            cframe_frame: off.cframe_frame,
            f_previous: off.f_previous,
            f_code: off.f_code,
            f_instr: off.f_instr,
            f_owner: off.f_owner,
            f_is_entry: off.f_is_entry,
            f_read,
        };
        let py = PyProcess {
            pid,
            path: it.path,
            offsets: off,
            config,
            code_type: it.code_type,
            runtime: it.py_runtime,
            eval: it.eval,
            text: it.text,
        };
        // The threads run while their frames are walked: a frame popped
        // between two reads reads as nonsense. Wrong offsets fail every
        // time; a busy thread rarely twice in a row.
        let mut last = String::new();
        for attempt in 0..VALIDATE_TRIES {
            match py.validate(&mem) {
                Ok(()) => return Ok(py),
                Err(w) => last = w,
            }
            if attempt + 1 < VALIDATE_TRIES {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        Err(invalid(&last))
    }

    /// The interpreter of `pid`, a process forked from this one (a
    /// DataLoader worker started by fork): the same addresses, so the
    /// same offsets and configuration, validated on this process already.
    /// Checked on `pid`: the interpreter state where this process has it,
    /// and its first thread state naming it. None when `pid` is not laid
    /// out like this process (spawned, or exec'd: other addresses), which
    /// `attach` then reads from scratch. Not every frame walked as
    /// `attach` does: word by word, ~200 reads a worker, each epoch's
    /// workers anew without persistent workers (a fifth of a 1-worker
    /// loader's reads), to check offsets that this process's walk checked.
    pub fn forked(&self, pid: i32) -> Option<PyProcess> {
        let mem = Memory::new(pid);
        let interp = mem
            .u64(self.runtime + self.offsets.runtime_interp_head)
            .ok()?;
        if interp != self.config.interp {
            return None;
        }
        let ts = mem
            .u64(interp + u64::from(self.config.threads_head))
            .ok()
            .filter(|&ts| ts != 0)?;
        if mem.u64(ts + u64::from(self.offsets.ts_interp)).ok()? != interp {
            return None;
        }
        Some(PyProcess {
            pid,
            ..self.clone()
        })
    }

    /// Walks every thread's frames with the offsets: every thread state
    /// must belong to the interpreter, every frame's code object must be
    /// one, and at least one frame must be found.
    fn validate(&self, mem: &Memory) -> Result<(), String> {
        let o = &self.offsets;
        let c = &self.config;
        let names = CodeNames::new(self.pid, *o, self.code_type);
        let mut ts = mem
            .u64(c.interp + u64::from(c.threads_head))
            .map_err(|e| e.to_string())?;
        let mut frames = 0;
        for _ in 0..4096 {
            if ts == 0 {
                break;
            }
            let interp = mem
                .u64(ts + u64::from(o.ts_interp))
                .map_err(|e| e.to_string())?;
            if interp != c.interp {
                return Err(format!("thread state {ts:#x} names another interpreter"));
            }
            frames += self.validate_frames(mem, &names, ts)?;
            ts = mem
                .u64(ts + u64::from(o.ts_next))
                .map_err(|e| e.to_string())?;
        }
        if frames == 0 {
            return Err("no thread has a Python frame".into());
        }
        Ok(())
    }

    fn validate_frames(&self, mem: &Memory, names: &CodeNames, ts: u64) -> Result<u32, String> {
        let o = &self.offsets;
        let mut f = mem
            .u64(ts + u64::from(o.ts_frame))
            .map_err(|e| e.to_string())?;
        if f != 0 && o.cframe_frame != NONE {
            f = mem
                .u64(f + u64::from(o.cframe_frame))
                .map_err(|e| e.to_string())?;
        }
        let mut n = 0;
        for _ in 0..1024 {
            if f == 0 {
                break;
            }
            let code = mem
                .u64(f + u64::from(o.f_code))
                .map_err(|e| e.to_string())?;
            let prev = mem
                .u64(f + u64::from(o.f_previous))
                .map_err(|e| e.to_string())?;
            if o.f_owner != NONE {
                let mut b = [0u8; 1];
                mem.read(f + u64::from(o.f_owner), &mut b)
                    .map_err(|e| e.to_string())?;
                if b[0] == OWNED_BY_CSTACK {
                    f = prev;
                    continue;
                }
            }
            let ty = mem.u64(code + 8).map_err(|e| e.to_string())?;
            if ty != self.code_type {
                return Err(format!("frame {f:#x}: {code:#x} is not a code object"));
            }
            let name_ptr = mem
                .u64(code + u64::from(o.co_name))
                .map_err(|e| e.to_string())?;
            match names.string(name_ptr) {
                Some(s) if code::plausible_name(&s) => n += 1,
                _ => return Err(format!("code object {code:#x} has no plausible name")),
            }
            f = prev;
        }
        Ok(n)
    }

    /// The line a recording prints about its Python frames.
    pub fn note(&self) -> String {
        format!(
            "python: CPython 3.{} ({}), Python frames in stacks",
            self.offsets.minor, self.path
        )
    }

    /// Whether `addr` is code of the interpreter.
    pub fn is_interpreter(&self, addr: u64) -> bool {
        self.text.iter().any(|r| r.contains(&addr))
    }

    /// Whether `addr` is in the eval loop (return addresses included: a
    /// call at its very end returns to its end).
    pub fn is_eval(&self, addr: u64) -> bool {
        self.eval.start <= addr && addr <= self.eval.end
    }
}

/// Offsets made wrong on purpose, for tests of the validation.
pub fn skewed(mut o: Offsets) -> Offsets {
    o.f_code += 8;
    o.co_name += 8;
    if o.co_qualname != offsets::NONE {
        o.co_qualname += 8;
    }
    o
}
