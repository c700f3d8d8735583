//! A thread's Python stack read from user space (process_vm_readv), for
//! the stage sampler: which functions, in which files, each thread of a
//! training or worker process is running now. Reads are what this costs
//! (each ~3-6 us of the probe's CPU, most of it the kernel pinning the
//! target's pages), so a tick reads every thread's state in one call, their
//! frame pointers in one, and `BLOCK_PAGES` pages below each innermost
//! frame in one: on 3.11+ a thread's frames lie next to each other in its
//! data stack, and a whole stack usually comes in that call (3.9 and 3.10
//! keep frames on the heap, where the block rarely helps). Code objects
//! are named once and cached by address, the cache dropped every
//! `CODE_CACHE_TICKS` walks so a freed and reused address is named anew;
//! forked workers share names by their strings' addresses
//! (`SharedNames`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::bpf::procio::FutexWaits;
use crate::mem::{word_at, Memory};
use crate::python::{Offsets, PyProcess};
use crate::torch::gil::{Gil, Wait};

/// Deepest stack walked.
const MAX_FRAMES: usize = 256;
/// Most threads of one process walked.
const MAX_THREADS: usize = 512;
/// Most code names kept by `SharedNames`.
const MAX_SHARED_NAMES: usize = 1 << 16;
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

    /// The pages a load of `[addr, addr + len)` reads, top page first:
    /// the page holding it and up to `BLOCK_PAGES - 1` below, never the
    /// first page (no pointer of the target points there).
    fn pages(addr: u64, len: usize) -> Option<Vec<u64>> {
        let end = addr
            .checked_add(len as u64)?
            .checked_next_multiple_of(PAGE)?;
        let base = end.saturating_sub(BLOCK_PAGES as u64 * PAGE).max(PAGE);
        (base < end).then(|| (1..=(end - base) / PAGE).map(|i| end - i * PAGE).collect())
    }

    /// A block of the leading `got` pages of `pages` (top first) read into
    /// `bufs`; None when not even the top one was read.
    fn of_pages(pages: &[u64], bufs: Vec<Vec<u8>>, got: usize) -> Option<Block> {
        let got = got.min(pages.len());
        let base = *pages.get(got.checked_sub(1)?)?;
        let mut bytes = Vec::with_capacity(got * PAGE as usize);
        for b in bufs.into_iter().take(got).rev() {
            bytes.extend_from_slice(&b);
        }
        Some(Block { base, bytes })
    }

    /// Reads the page holding `[addr, addr + len)` and the pages below it
    /// (`pages`) in one call, the top page first: the kernel stops at the
    /// first page it cannot read, so an unmapped page below keeps the ones
    /// above.
    fn load(&mut self, mem: &Memory, addr: u64, len: usize) -> bool {
        let Some(pages) = Block::pages(addr, len) else {
            return false;
        };
        let mut bufs = vec![vec![0u8; PAGE as usize]; pages.len()];
        let mut parts: Vec<(u64, &mut [u8])> = pages
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&p, b)| (p, b.as_mut_slice()))
            .collect();
        let got = mem.read_many(&mut parts);
        match Block::of_pages(&pages, bufs, got) {
            Some(b) => {
                *self = b;
                self.get(addr, len).is_some()
            }
            None => false,
        }
    }
}

/// A frame's function and file. The function is its qualified name where
/// the interpreter has one (3.11+: `RandomResizedCrop.forward`, which
/// names a torchvision transform where `forward` names them all); its
/// last dotted part is the code object's own name (`Frame::name`).
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
    /// The thread states found at the last walk, head first.
    threads: Vec<u64>,
    /// Pages read at once, kept between walks.
    scratch: Vec<u8>,
    /// Names shared with the other processes forked from the same parent.
    shared_names: Option<SharedNames>,
    walks: u64,
    /// Frames whose code object could not be read.
    pub bad_frames: u64,
    gil: Gil,
    /// 3.9/3.10 (no `native_thread_id`): kernel ids by `thread_id`, read
    /// from glibc's thread descriptors and checked once.
    pthread_tids: HashMap<u64, i32>,
}

/// One thread's stack, outermost frame first.
pub struct Stack {
    /// CPython's `thread_id` (pthread_self()).
    pub thread_id: u64,
    /// Its kernel id; 0 when not known (see `crate::torch::gil`).
    pub tid: i32,
    pub frames: Vec<Named>,
    /// Each frame's address, as `frames` (the `self` of a loader call is
    /// read from its frame: which loader the loop is in).
    pub addrs: Vec<u64>,
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
            threads: Vec::new(),
            scratch: Vec::new(),
            shared_names: None,
            walks: 0,
            bad_frames: 0,
            gil: Gil::new(&py.config),
            pthread_tids: HashMap::new(),
        }
    }

    /// Tells the threads' futex waits from the BPF side's iterator
    /// (`crate::torch::gil`).
    pub fn with_futex_waits(mut self, futex: Option<Arc<FutexWaits>>) -> Frames {
        self.gil = self.gil.with_futex_waits(futex);
        self
    }

    /// The stacks of a process forked from the parent whose other forked
    /// processes name their code through `names`.
    pub fn sharing(py: &PyProcess, names: SharedNames) -> Frames {
        Frames {
            shared_names: Some(names),
            ..Frames::new(py)
        }
    }

    /// Every thread's stack now; None when the process cannot be read
    /// (it exited). A few calls to the kernel per process, not per
    /// thread: each read costs ~3-10 us of the probe's CPU, mostly fixed
    /// (the target's memory map locked, its pages pinned), so the thread
    /// states, their current frames and the pages of their stacks are each
    /// read for all threads at once.
    pub fn stacks(&mut self) -> Option<Vec<Stack>> {
        self.walks += 1;
        if self.walks.is_multiple_of(CODE_CACHE_TICKS) {
            self.codes.clear();
            // Thread ids are reused too.
            self.pthread_tids.clear();
        }
        let o = self.off;
        let heads = self.thread_heads()?;
        let mut tops: Vec<u64> = heads
            .iter()
            .map(|h| word_at(h, o.ts_frame as usize))
            .collect();
        if o.cframe_frame != crate::python::NONE {
            self.deref_all(&mut tops, u64::from(o.cframe_frame));
        }
        let blocks = self.preload(&tops);
        let mut out = Vec::with_capacity(heads.len());
        for ((head, top), block) in heads.iter().zip(tops).zip(blocks) {
            let (frames, addrs, complete) = self.walk(top, block);
            let thread_id = word_at(head, o.ts_thread_id as usize);
            out.push(Stack {
                thread_id,
                tid: self.tid_of(head, thread_id),
                frames,
                addrs,
                complete,
            });
        }
        Some(out)
    }

    /// Whether some thread holds the GIL now (one read; None when it
    /// cannot be read).
    pub fn gil_held(&self) -> Option<bool> {
        self.gil.now(&self.mem).map(|g| g.holder != 0)
    }

    /// What the thread of `s` (from the last walk) waits for now: the
    /// GIL, a lock, or neither; None when that cannot be told (its kernel
    /// id not known, or the kernel does not say).
    pub fn wait(&self, s: &Stack) -> Option<Wait> {
        (s.tid > 0).then_some(())?;
        self.gil.waits(self.pid, s.tid, self.walks)
    }

    /// A thread's kernel id: its `native_thread_id` (3.11+), else the
    /// `tid` of its glibc descriptor; 0 when neither is one of the
    /// process's threads.
    fn tid_of(&mut self, head: &[u8], thread_id: u64) -> i32 {
        let o = self.off;
        if o.ts_native_thread_id != crate::python::NONE {
            return i32::try_from(word_at(head, o.ts_native_thread_id as usize)).unwrap_or(0);
        }
        if let Some(&t) = self.pthread_tids.get(&thread_id) {
            return t;
        }
        let Some(off) = crate::torch::gil::pthread_tid_offset() else {
            return 0;
        };
        let mut b = [0u8; 4];
        let tid = match self.mem.read(thread_id.wrapping_add(off as u64), &mut b) {
            Ok(()) => i32::from_ne_bytes(b),
            Err(_) => 0,
        };
        let tid = if crate::torch::gil::is_thread_of(self.pid, tid) {
            tid
        } else {
            0
        };
        self.pthread_tids.insert(thread_id, tid);
        tid
    }

    /// Bytes of a thread state read: up to its last field used.
    fn head_len(&self) -> usize {
        let o = self.off;
        [o.ts_next, o.ts_thread_id, o.ts_native_thread_id, o.ts_frame]
            .into_iter()
            .filter(|&f| f != crate::python::NONE)
            .max()
            .unwrap_or(0) as usize
            + 8
    }

    /// Each thread state's first bytes, head of the list first. The
    /// threads of the last walk are read in one call with the list's head,
    /// and kept when their links still chain the same way; else the list
    /// is walked a thread at a time.
    fn thread_heads(&mut self) -> Option<Vec<Vec<u8>>> {
        let (o, len) = (self.off, self.head_len());
        let mut first = [0u8; 8];
        let mut heads = vec![vec![0u8; len]; self.threads.len()];
        let mut parts: Vec<(u64, &mut [u8])> = Vec::with_capacity(heads.len() + 1);
        parts.push((self.interp + u64::from(self.threads_head), &mut first));
        for (&ts, h) in self.threads.iter().zip(heads.iter_mut()) {
            parts.push((ts, h.as_mut_slice()));
        }
        let n = parts.len();
        if self.mem.read_many(&mut parts) == n {
            let mut links = heads.iter().map(|h| word_at(h, o.ts_next as usize));
            let head = word_at(&first, 0);
            let same = self.threads.first().copied().unwrap_or(0) == head
                && self
                    .threads
                    .iter()
                    .skip(1)
                    .chain(std::iter::once(&0))
                    .all(|&next| links.next() == Some(next));
            if same {
                return Some(heads);
            }
        }
        let mut ts = self
            .mem
            .u64(self.interp + u64::from(self.threads_head))
            .ok()?;
        self.threads.clear();
        let mut heads = Vec::new();
        for _ in 0..MAX_THREADS {
            if ts == 0 {
                break;
            }
            let mut head = vec![0u8; len];
            self.mem.read(ts, &mut head).ok()?;
            self.threads.push(ts);
            ts = word_at(&head, o.ts_next as usize);
            heads.push(head);
        }
        Some(heads)
    }

    /// Replaces each non-zero pointer with the word at `pointer + off`
    /// (3.11/3.12: a thread's `cframe` with its `current_frame`), all in
    /// one call; one at a time (0 where unreadable) if that fails.
    fn deref_all(&self, ptrs: &mut [u64], off: u64) {
        let mut words = vec![[0u8; 8]; ptrs.len()];
        let mut parts: Vec<(u64, &mut [u8])> = ptrs
            .iter()
            .zip(words.iter_mut())
            .filter(|(&p, _)| p != 0)
            .map(|(&p, w)| (p.wrapping_add(off), w.as_mut_slice()))
            .collect();
        let n = parts.len();
        let whole = self.mem.read_many(&mut parts) == n;
        for (p, w) in ptrs.iter_mut().zip(&words) {
            if *p == 0 {
                continue;
            }
            *p = if whole {
                word_at(w, 0)
            } else {
                self.mem.u64(p.wrapping_add(off)).unwrap_or(0)
            };
        }
    }

    /// The pages below each thread's innermost frame, all read in one
    /// call (on 3.11+ a whole stack usually lies there). The call lists
    /// every thread's top page first, then every thread's next page, and
    /// so on: the kernel stops at the first page it cannot read, and an
    /// unmapped page below one thread's stack then costs the others only
    /// their deeper pages, which a walk reads when it gets there.
    fn preload(&mut self, tops: &[u64]) -> Vec<Block> {
        let pages: Vec<Vec<u64>> = tops
            .iter()
            .map(|&f| match f {
                0 => Vec::new(),
                f => Block::pages(f, self.f_read).unwrap_or_default(),
            })
            .collect();
        // (thread, rank) of each page in the order read.
        let order: Vec<(usize, usize)> = (0..BLOCK_PAGES)
            .flat_map(|r| {
                pages
                    .iter()
                    .enumerate()
                    .filter(move |(_, p)| r < p.len())
                    .map(move |(t, _)| (t, r))
            })
            .collect();
        let page = PAGE as usize;
        self.scratch.clear();
        self.scratch.resize(order.len() * page, 0);
        let mut parts: Vec<(u64, &mut [u8])> = order
            .iter()
            .zip(self.scratch.chunks_mut(page))
            .map(|(&(t, r), b)| (pages[t][r], b))
            .collect();
        let got = self.mem.read_many(&mut parts);
        drop(parts);
        // Each thread's pages read, top first, up to its first one missed.
        let mut bufs: Vec<Vec<Vec<u8>>> = vec![Vec::new(); tops.len()];
        let mut missed = vec![false; tops.len()];
        for (i, &(t, _)) in order.iter().enumerate() {
            if i >= got {
                missed[t] = true;
            } else if !missed[t] {
                bufs[t].push(self.scratch[i * page..(i + 1) * page].to_vec());
            }
        }
        pages
            .iter()
            .zip(bufs)
            .map(|(p, b)| {
                let n = b.len();
                Block::of_pages(p, b, n).unwrap_or_default()
            })
            .collect()
    }

    /// The frames from `f` (the innermost) outward, outermost first, their
    /// addresses, and whether the walk was complete; `block`: pages read
    /// already.
    fn walk(&mut self, mut f: u64, mut block: Block) -> (Vec<Named>, Vec<u64>, bool) {
        let o = self.off;
        let mut frames = Vec::new();
        let mut addrs = Vec::new();
        let mut complete = true;
        for _ in 0..2 * MAX_FRAMES {
            if f == 0 {
                break;
            }
            if frames.len() == MAX_FRAMES
                || (block.get(f, self.f_read).is_none() && !block.load(&self.mem, f, self.f_read))
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
                    Some(n) => {
                        frames.push(n);
                        addrs.push(f);
                    }
                    None => {
                        self.bad_frames += 1;
                        complete = false;
                    }
                }
            }
            f = prev;
        }
        frames.reverse();
        addrs.reverse();
        // No frame at all is a thread caught between two (its frame
        // pointer read as 0 or stale while an eval loop was entered or
        // left), not a thread at rest: said as a stage it would be the
        // training step (2.4% of a fast loop's window in one e2e run).
        let complete = complete && f == 0 && !frames.is_empty();
        (frames, addrs, complete)
    }

    fn name(&mut self, code: u64) -> Option<Named> {
        if let Some(n) = self.codes.get(&code) {
            return n.clone();
        }
        let n = self.read_name(code);
        self.codes.insert(code, n.clone());
        n
    }

    /// Reads a code object's type and its name, qualified name and file
    /// pointers in one call, then the strings unless another process
    /// forked from the same parent named the same code already
    /// (`Frames::sharing`).
    fn read_name(&self, code: u64) -> Option<Named> {
        let o = &self.off;
        let q_at = (o.co_qualname != crate::python::NONE).then_some(u64::from(o.co_qualname));
        let (n_at, f_at) = (u64::from(o.co_name), u64::from(o.co_filename));
        let end = n_at.max(f_at).max(q_at.unwrap_or(0)).max(8) + 8;
        let mut b = vec![0u8; end as usize];
        self.mem.read(code, &mut b).ok()?;
        if word_at(&b, 8) != self.code_type {
            return None;
        }
        let key = (
            word_at(&b, n_at as usize),
            word_at(&b, f_at as usize),
            q_at.map_or(0, |q| word_at(&b, q as usize)),
        );
        if let Some(n) = self.shared_names.as_ref().and_then(|s| s.get(key)) {
            return Some(n);
        }
        let names = crate::python::CodeNames::new(self.pid, *o, self.code_type);
        let name = names.string(key.0)?;
        let shown =
            crate::python::qualified(name, (key.2 != 0).then(|| names.string(key.2)).flatten());
        let named: Named = (shown.into(), names.string(key.1)?.into());
        if let Some(s) = &self.shared_names {
            s.put(key, named.clone());
        }
        Some(named)
    }
}

/// Code names shared by the processes forked from one parent (the
/// loader's workers), by the addresses of the name and file strings: a
/// worker forked after another has its code objects and their strings
/// where the other had them, and a new worker every epoch would otherwise
/// read every frame's two strings again (most of a short epoch's ticks).
#[derive(Clone, Default)]
pub struct SharedNames(Arc<Mutex<HashMap<NameKey, Named>>>);

/// A code object's name, file and qualified name string addresses (0:
/// no qualified name).
type NameKey = (u64, u64, u64);

impl SharedNames {
    fn get(&self, key: NameKey) -> Option<Named> {
        let m = self.0.lock().ok()?;
        m.get(&key).cloned()
    }

    fn put(&self, key: NameKey, named: Named) {
        if let Ok(mut m) = self.0.lock() {
            // Bounded: a job that makes code objects without end must not
            // grow the probe without end.
            if m.len() >= MAX_SHARED_NAMES {
                m.clear();
            }
            m.insert(key, named);
        }
    }
}
