//! A thread's Python stack read from user space (process_vm_readv), for
//! the stage sampler: which functions, in which files, each thread of a
//! training or worker process is running now. Reads are what this costs
//! (each ~3-6 us of the probe's CPU, most of it the kernel pinning the
//! target's pages), so a walk reads `BLOCK_PAGES` pages below the frame at
//! once: on 3.11+ a thread's frames lie next to each other in its data
//! stack, and a whole stack usually comes in one call (3.9 and 3.10 keep
//! frames on the heap, where the block rarely helps). Code objects are
//! named once and cached by address, the cache dropped every
//! `CODE_CACHE_TICKS` walks so a freed and reused address is named anew.

use std::collections::HashMap;
use std::sync::Arc;

use crate::mem::{word_at, Memory};
use crate::python::{Offsets, PyProcess};

/// Deepest stack walked.
const MAX_FRAMES: usize = 256;
/// Most threads of one process walked.
const MAX_THREADS: usize = 512;
/// Walks between two drops of the code cache.
const CODE_CACHE_TICKS: u64 = 500;
/// 3.12+: the eval loop's own entry frame, not a Python frame.
const OWNED_BY_CSTACK: u8 = 3;
const PAGE: u64 = 4096;
/// Pages read at once below (and including) a frame.
const BLOCK_PAGES: usize = 4;

/// Target memory read a block at a time: `[base, base + bytes.len())`.
#[derive(Default)]
struct Block {
    base: u64,
    bytes: Vec<u8>,
}

impl Block {
    fn get(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        self.bytes.get(off..off.checked_add(len)?)
    }

    /// Reads the page holding `[addr, addr + len)` and up to
    /// `BLOCK_PAGES - 1` pages below it, one iovec per page, the top page
    /// first: the kernel stops at the first page it cannot read, so an
    /// unmapped page below keeps the ones above.
    fn load(&mut self, pid: nix::unistd::Pid, addr: u64, len: usize) -> bool {
        use nix::sys::uio::{process_vm_readv, RemoteIoVec};
        use std::io::IoSliceMut;
        let Some(end) = addr
            .checked_add(len as u64)
            .and_then(|e| e.checked_next_multiple_of(PAGE))
        else {
            return false;
        };
        // Never below the first page: no pointer of the target points there.
        let base = end.saturating_sub(BLOCK_PAGES as u64 * PAGE).max(PAGE);
        if base >= end {
            return false;
        }
        let pages = (end - base) / PAGE;
        let mut buf = vec![0u8; (end - base) as usize];
        let remote: Vec<RemoteIoVec> = (0..pages)
            .map(|i| RemoteIoVec {
                base: (end - (i + 1) * PAGE) as usize,
                len: PAGE as usize,
            })
            .collect();
        // Local slices in the same order as the remote pages: the top page
        // goes to the end of `buf`.
        let mut chunks: Vec<&mut [u8]> = buf.chunks_mut(PAGE as usize).rev().collect();
        let mut local: Vec<IoSliceMut> = chunks.iter_mut().map(|c| IoSliceMut::new(c)).collect();
        let got = process_vm_readv(pid, &mut local, &remote).unwrap_or(0);
        let full_pages = got / PAGE as usize;
        if full_pages == 0 {
            return false;
        }
        let keep = full_pages * PAGE as usize;
        let start = buf.len() - keep;
        self.base = end - keep as u64;
        self.bytes = buf.split_off(start);
        self.get(addr, len).is_some()
    }
}

/// A frame's function and file.
pub type Named = (Arc<str>, Arc<str>);

/// A frame as the outputs name it: `function (file.py)`.
pub fn frame_label((name, file): &Named) -> String {
    format!("{name} ({})", crate::python::short_file(file))
}

/// Python stacks of one process.
pub struct Frames {
    pub pid: i32,
    mem: Memory,
    off: Offsets,
    interp: u64,
    threads_head: u32,
    code_type: u64,
    f_read: usize,
    codes: HashMap<u64, Option<Named>>,
    walks: u64,
    /// Frames whose code object could not be read.
    pub bad_frames: u64,
}

/// One thread's stack, outermost frame first.
pub struct Stack {
    /// CPython's `thread_id` (pthread_self()).
    pub thread_id: u64,
    pub frames: Vec<Named>,
    /// The walk reached the outermost frame and named every frame on the
    /// way. The thread runs while it is read: a frame popped meanwhile can
    /// end the walk early, and a partial stack would say the wrong stage.
    pub complete: bool,
}

impl Frames {
    pub fn new(py: &PyProcess) -> Frames {
        Frames {
            pid: py.pid,
            mem: Memory::new(py.pid),
            off: py.offsets,
            interp: py.config.interp,
            threads_head: py.config.threads_head,
            code_type: py.code_type,
            f_read: py.config.f_read as usize,
            codes: HashMap::new(),
            walks: 0,
            bad_frames: 0,
        }
    }

    /// Every thread's stack now; None when the process cannot be read
    /// (it exited).
    pub fn stacks(&mut self) -> Option<Vec<Stack>> {
        self.walks += 1;
        if self.walks.is_multiple_of(CODE_CACHE_TICKS) {
            self.codes.clear();
        }
        let o = self.off;
        let mut ts = self
            .mem
            .u64(self.interp + u64::from(self.threads_head))
            .ok()?;
        let mut out = Vec::new();
        for _ in 0..MAX_THREADS {
            if ts == 0 {
                break;
            }
            let mut head = vec![
                0u8;
                [o.ts_next, o.ts_thread_id, o.ts_frame]
                    .into_iter()
                    .max()
                    .unwrap_or(0) as usize
                    + 8
            ];
            self.mem.read(ts, &mut head).ok()?;
            let frame = word_at(&head, o.ts_frame as usize);
            let (frames, complete) = self.walk(frame);
            out.push(Stack {
                thread_id: word_at(&head, o.ts_thread_id as usize),
                frames,
                complete,
            });
            ts = word_at(&head, o.ts_next as usize);
        }
        Some(out)
    }

    /// The frames from `f` outward, outermost first, and whether the walk
    /// was complete.
    fn walk(&mut self, mut f: u64) -> (Vec<Named>, bool) {
        let o = self.off;
        if f != 0 && o.cframe_frame != crate::python::NONE {
            f = self
                .mem
                .u64(f.wrapping_add(u64::from(o.cframe_frame)))
                .unwrap_or(0);
        }
        let mut frames = Vec::new();
        let mut block = Block::default();
        let pid = nix::unistd::Pid::from_raw(self.pid);
        let mut complete = true;
        for _ in 0..2 * MAX_FRAMES {
            if f == 0 {
                break;
            }
            if frames.len() == MAX_FRAMES
                || (block.get(f, self.f_read).is_none() && !block.load(pid, f, self.f_read))
            {
                complete = false;
                break;
            }
            let Some(buf) = block.get(f, self.f_read) else {
                complete = false;
                break;
            };
            let code = word_at(buf, o.f_code as usize);
            let owner = (o.f_owner != crate::python::NONE)
                .then(|| buf.get(o.f_owner as usize).copied())
                .flatten();
            let prev = word_at(buf, o.f_previous as usize);
            if owner != Some(OWNED_BY_CSTACK) {
                match self.name(code) {
                    Some(n) => frames.push(n),
                    None => {
                        self.bad_frames += 1;
                        complete = false;
                    }
                }
            }
            f = prev;
        }
        frames.reverse();
        (frames, complete && f == 0)
    }

    fn name(&mut self, code: u64) -> Option<Named> {
        if let Some(n) = self.codes.get(&code) {
            return n.clone();
        }
        let n = self.read_name(code);
        self.codes.insert(code, n.clone());
        n
    }

    fn read_name(&self, code: u64) -> Option<Named> {
        let o = &self.off;
        if self.mem.u64(code.wrapping_add(8)).ok()? != self.code_type {
            return None;
        }
        let names = crate::python::CodeNames::new(self.pid, *o, self.code_type);
        let name = names.string(self.mem.u64(code.wrapping_add(u64::from(o.co_name))).ok()?)?;
        let file = names.string(
            self.mem
                .u64(code.wrapping_add(u64::from(o.co_filename)))
                .ok()?,
        )?;
        Some((name.into(), file.into()))
    }
}
