//! Whether a thread of a Python process waits for its interpreter's GIL,
//! at a stage sampler's tick, from outside: no probe on the target.
//!
//! Each thread is asked of the kernel: `/proc/PID/task/TID/syscall`
//! names the system call a blocked thread is in and its arguments. A
//! thread waiting for the GIL sleeps in `futex` on the GIL's own condition
//! variable or mutex (`take_gil`), or, having just dropped it on request,
//! on its switch condition until another thread took it; all four lie
//! inside the interpreter's `_gil_runtime_state`, whose address the
//! interpreter's offsets give. A thread asleep in `futex` anywhere else
//! waits for a lock, a condition or a semaphore (`threading.Lock`, a
//! `multiprocessing.Lock` shared by the workers, a `queue.Queue`, a
//! mutex of native code): a lock wait. A thread that released the GIL
//! for I/O or to sleep waits for neither. Who holds the GIL
//! (`Gil::now`) only says whether anyone could be waiting. Each thread's
//! file stays open between ticks and is read again at offset 0.
//!
//! Where the job's BPF object loaded (`crate::bpf::procio::FutexWaits`),
//! the futex a thread sleeps on comes from it instead: /proc names a futex
//! only while its waiter sleeps, and a waiter woken on a busy machine may
//! wait for a core a tenth of its lock wait and more, still inside its
//! `acquire` (measured: 35% of get-item's time in waits from /proc, 45%
//! in the workers' own clocks, on two cores). Its task iterator, run over
//! the process's threads once per walk of their stacks, tells a wait from
//! the call's entry to its return.
//!
//! The thread's kernel id comes from its thread state's `native_thread_id`
//! (3.11+), else from glibc's thread descriptor, whose `tid` field's
//! offset is found in the probe's own threads (`pthread_tid_offset`); an
//! id is used only when it is one of the process's threads.

use std::cell::{OnceCell, Ref, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};

use tracing::debug;

use crate::bpf::procio::{FutexWait, FutexWaits, ProcessWaits};
use crate::mem::Memory;
use crate::python::PyConfig;

/// `struct _gil_runtime_state` on x86-64, 3.9 to 3.13: `interval`,
/// `last_holder`, `locked`, `switch_number`, then two condition variables
/// (48 bytes) and two mutexes (40 bytes).
const GIL_STATE_LEN: u64 = 4 * 8 + 2 * (48 + 40);
/// `futex(2)` on x86-64.
const NR_FUTEX: u64 = 202;
/// Bytes of a glibc thread descriptor searched for its `tid`.
const PTHREAD_SEARCH: usize = 2048;
/// Threads' `/proc/PID/task/TID/syscall` kept open, at most: a process's
/// threads at a time, far fewer than this.
const MAX_OPEN: usize = 256;

/// Where a process's GIL lies, and how to read who holds it.
#[derive(Debug)]
pub struct Gil {
    holder_addr: u64,
    locked_addr: u64,
    /// `[lo, hi)`: the GIL's state, its condition variables and mutexes.
    lo: u64,
    hi: u64,
    /// Each thread's syscall file, kept open and read again at offset 0
    /// (one call a tick instead of an open, a read and a close), by tid.
    files: RefCell<HashMap<i32, File>>,
    /// The BPF side's futex waits, where it loaded.
    futex: Option<Arc<FutexWaits>>,
    /// Its iterator over this process's threads: made at the first wait
    /// asked; an error (logged once) leaves the process to /proc.
    process: OnceCell<Option<ProcessWaits>>,
    /// The waits it read last: one run of the iterator tells every
    /// thread's.
    read: RefCell<Option<WaitsRead>>,
}

/// A process's futex waits, read for one walk of its stacks.
#[derive(Debug)]
struct WaitsRead {
    walk: u64,
    waits: Vec<FutexWait>,
}

/// What a thread was asleep on when the kernel was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Running, runnable, or asleep in a call other than `futex` (I/O,
    /// `poll`, a sleep).
    Not,
    /// `futex` on the GIL's state.
    Gil,
    /// `futex` anywhere else: a lock, a condition or a semaphore.
    Lock,
}

/// The GIL at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GilNow {
    /// The holder's thread state; 0 when nobody holds it.
    pub holder: u64,
}

impl Gil {
    pub fn new(cfg: &PyConfig) -> Gil {
        // `interval` comes first, one word before `last_holder`.
        let lo = cfg.holder_addr.saturating_sub(8);
        Gil {
            holder_addr: cfg.holder_addr,
            locked_addr: cfg.locked_addr,
            lo,
            hi: lo + GIL_STATE_LEN,
            files: RefCell::new(HashMap::new()),
            futex: None,
            process: OnceCell::new(),
            read: RefCell::new(None),
        }
    }

    /// Asks `futex` which futex a thread sleeps on.
    pub fn with_futex_waits(mut self, futex: Option<Arc<FutexWaits>>) -> Gil {
        self.futex = futex;
        self.process = OnceCell::new();
        self
    }

    /// Who holds the GIL now, both fields in one read (they are
    /// neighbours); None when it cannot be read.
    pub fn now(&self, mem: &Memory) -> Option<GilNow> {
        let lo = self.holder_addr.min(self.locked_addr);
        let mut b = [0u8; 16];
        mem.read(lo, &mut b).ok()?;
        let at = |addr: u64, len: usize| {
            let o = usize::try_from(addr - lo).ok()?;
            b.get(o..o + len)
        };
        let holder = u64::from_ne_bytes(at(self.holder_addr, 8)?.try_into().ok()?);
        let locked = i32::from_ne_bytes(at(self.locked_addr, 4)?.try_into().ok()?);
        Some(GilNow {
            holder: if locked != 0 { holder } else { 0 },
        })
    }

    /// What thread `tid` of `pid` waits for, after the stacks' walk
    /// `walk`; None when the kernel does not say (the thread ended, or no
    /// permission). The kernel is asked even for the thread that held the
    /// GIL at the walk: threads that take turns every switch interval
    /// (5 ms) have swapped by the time a walk of all threads is done, and
    /// a holder read then would call the one now waiting a holder.
    pub fn waits(&self, pid: i32, tid: i32, walk: u64) -> Option<Wait> {
        if let Some(w) = self.bpf_waits(pid, walk) {
            return Some(match w.iter().find(|f| f.tid == tid) {
                Some(f) => self.wait_on(f.word),
                None => Wait::Not,
            });
        }
        let mut files = self.files.borrow_mut();
        if !files.contains_key(&tid) {
            if files.len() >= MAX_OPEN {
                files.clear();
            }
            let f = File::open(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
            files.insert(tid, f);
        }
        let mut buf = [0u8; 256];
        // A thread that ended answers ESRCH: its file goes (the id may
        // come back as another thread's).
        let n = match files.get(&tid)?.read_at(&mut buf, 0) {
            Ok(n) => n,
            Err(_) => {
                files.remove(&tid);
                return None;
            }
        };
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        Some(self.wait_of(text))
    }

    /// A `/proc/PID/task/TID/syscall` line: a futex on the GIL's state, a
    /// futex elsewhere, or neither ("running", another call).
    fn wait_of(&self, line: &str) -> Wait {
        let mut f = line.split_whitespace();
        let nr = f.next().and_then(|n| n.parse::<u64>().ok());
        let addr = f
            .next()
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
        match (nr, addr) {
            (Some(NR_FUTEX), Some(a)) => self.wait_on(a),
            _ => Wait::Not,
        }
    }

    /// A futex wait on `word`: the GIL's, or a lock's.
    fn wait_on(&self, word: u64) -> Wait {
        if (self.lo..self.hi).contains(&word) {
            Wait::Gil
        } else {
            Wait::Lock
        }
    }

    /// The threads of `pid` inside a futex wait and their words, read
    /// once for the walk `walk`; None where the BPF side cannot tell.
    fn bpf_waits(&self, pid: i32, walk: u64) -> Option<Ref<'_, Vec<FutexWait>>> {
        let process = self.process.get_or_init(|| {
            let f = self.futex.as_deref()?;
            f.of_process(pid)
                .map_err(|e| debug!(pid, "futex waits from /proc instead: {e}"))
                .ok()
        });
        let process = process.as_ref()?;
        let fresh = matches!(&*self.read.borrow(), Some(r) if r.walk == walk);
        if !fresh {
            let now = match process.now() {
                Ok(v) => v,
                Err(e) => {
                    debug!(pid, "futex waits not read: {e}");
                    return None;
                }
            };
            *self.read.borrow_mut() = Some(WaitsRead { walk, waits: now });
        }
        Ref::filter_map(self.read.borrow(), |r| r.as_ref().map(|r| &r.waits)).ok()
    }
}

/// The offset of `tid` in glibc's thread descriptor (what `pthread_self()`
/// points to, and what CPython keeps as a thread's `thread_id`), found in
/// two of the probe's own threads: the one offset where both hold their
/// own kernel id. None when not exactly one does. The target's glibc may
/// differ from the probe's: every id read with it is checked against the
/// target's threads.
pub fn pthread_tid_offset() -> Option<usize> {
    static OFFSET: OnceLock<Option<usize>> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        let here = tid_offsets();
        let there = std::thread::spawn(tid_offsets).join().ok()?;
        let both: Vec<usize> = here.into_iter().filter(|o| there.contains(o)).collect();
        match both.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    })
}

/// The offsets in the calling thread's descriptor that hold its kernel id.
fn tid_offsets() -> Vec<usize> {
    let me = std::process::id() as i32;
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: pthread_self() has no preconditions and cannot fail.
    let base = unsafe { libc::pthread_self() } as u64;
    let mut buf = vec![0u8; PTHREAD_SEARCH];
    if Memory::new(me).read(base, &mut buf).is_err() {
        return Vec::new();
    }
    (0..PTHREAD_SEARCH - 4)
        .step_by(4)
        .filter(|&o| buf[o..o + 4] == tid.to_ne_bytes())
        .collect()
}

/// Whether `tid` is a thread of `pid`.
pub fn is_thread_of(pid: i32, tid: i32) -> bool {
    tid > 0 && std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gil() -> Gil {
        Gil::new(&PyConfig {
            holder_addr: 0x1008,
            locked_addr: 0x1010,
            ..Default::default()
        })
    }

    #[test]
    fn a_futex_inside_the_gil_state_is_a_gil_wait_and_elsewhere_a_lock_wait() {
        let g = gil();
        // take_gil: the condition variable, right after the four words.
        let line = "202 0x1020 0x189 0x0 0x0 0x0 0xffffffff 0x7ffd 0x7f00\n";
        assert_eq!(g.wait_of(line), Wait::Gil);
        // The switch mutex, the state's last bytes.
        let end = 0x1000 + GIL_STATE_LEN;
        assert_eq!(
            g.wait_of(&format!("202 {:#x} 0x80 0x2", end - 40)),
            Wait::Gil
        );
        // Another futex (a queue's lock, a semaphore in shared memory).
        assert_eq!(g.wait_of(&format!("202 {end:#x} 0x80 0x2")), Wait::Lock);
        assert_eq!(g.wait_of("202 0x7f0012340000 0x189"), Wait::Lock);
        // A read, a running thread, nothing.
        assert_eq!(g.wait_of("0 0x3 0x7f00 0x1000"), Wait::Not);
        assert_eq!(g.wait_of("running\n"), Wait::Not);
        assert_eq!(g.wait_of(""), Wait::Not);
    }

    #[test]
    fn glibc_keeps_each_thread_s_id_at_one_offset() {
        let off = pthread_tid_offset().expect("found");
        // SAFETY: pthread_self() has no preconditions and cannot fail.
        let mine = unsafe { libc::pthread_self() } as u64 + off as u64;
        let mut b = [0u8; 4];
        Memory::new(std::process::id() as i32)
            .read(mine, &mut b)
            .expect("read");
        assert_eq!(i32::from_ne_bytes(b), nix::unistd::gettid().as_raw());
    }

    /// The holder read in one go, in either order of the two fields
    /// (3.9-3.12: `last_holder` then `locked`; 3.13's debug offsets put
    /// them so too, at other places), from this process's memory.
    #[test]
    fn the_holder_counts_only_while_locked() {
        let me = Memory::new(std::process::id() as i32);
        let state: [u64; 4] = [5000, 0xabc0, 1, 0];
        let base = state.as_ptr() as u64;
        let g = Gil::new(&PyConfig {
            holder_addr: base + 8,
            locked_addr: base + 16,
            ..Default::default()
        });
        assert_eq!(g.now(&me), Some(GilNow { holder: 0xabc0 }));
        let unlocked: [u64; 4] = [5000, 0xabc0, 0, 0];
        let g = Gil::new(&PyConfig {
            holder_addr: unlocked.as_ptr() as u64 + 8,
            locked_addr: unlocked.as_ptr() as u64 + 16,
            ..Default::default()
        });
        assert_eq!(g.now(&me), Some(GilNow { holder: 0 }));
        // Locked first, then the holder.
        let swapped: [u64; 3] = [1, 0xdef0, 0];
        let g = Gil::new(&PyConfig {
            holder_addr: swapped.as_ptr() as u64 + 8,
            locked_addr: swapped.as_ptr() as u64,
            ..Default::default()
        });
        assert_eq!(g.now(&me), Some(GilNow { holder: 0xdef0 }));
        std::hint::black_box((&state, &unlocked, &swapped));
    }

    /// This process's own GIL-less threads: the kernel's answer for a
    /// thread blocked on a channel (a futex: a lock wait), for one asleep
    /// (not a wait), and for one that is not there.
    #[test]
    fn a_thread_asleep_elsewhere_does_not_wait_for_the_gil() {
        let pid = std::process::id() as i32;
        let (tx, rx) = std::sync::mpsc::channel::<i32>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = tx.send(nix::unistd::gettid().as_raw());
            let _ = stop_rx.recv_timeout(std::time::Duration::from_secs(2));
        });
        let (tx2, rx2) = std::sync::mpsc::channel::<i32>();
        let sleeper = std::thread::spawn(move || {
            let _ = tx2.send(nix::unistd::gettid().as_raw());
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        let tid = rx.recv().expect("tid");
        let asleep = rx2.recv().expect("tid");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(is_thread_of(pid, tid));
        assert_eq!(gil().waits(pid, tid, 0), Some(Wait::Lock));
        assert_eq!(gil().waits(pid, asleep, 0), Some(Wait::Not));
        assert_eq!(gil().waits(pid, 1 << 30, 0), None);
        drop(stop_tx);
        let _ = t.join();
        let _ = sleeper.join();
        assert!(!is_thread_of(pid, -1));
    }
}
