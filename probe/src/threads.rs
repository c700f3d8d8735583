//! The target's threads: which exist, their CPU time as the kernel counts
//! it, and their names. TensorFlow names its threads
//! (`tf_data_private_threadpool`, ...) but the names are longer than the
//! 15 characters `pthread_setname_np` accepts, so /proc shows `python` for
//! all of them; the real names live in TensorFlow's own registry
//! (`tsl::GetThreadNameRegistry()`: a heap `std::map<std::thread::id,
//! std::string>`), which we read from the target's memory.

use std::collections::{HashMap, HashSet};
use std::fs;

use tracing::debug;

use crate::mem::{word_at, Memory};

/// One live thread of the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// tid in our PID namespace (/proc as we see it).
    pub tid: u32,
    /// tid in the target's own PID namespace (what glibc stores).
    pub inner_tid: u32,
    pub comm: String,
    /// sum_exec_runtime, ns (first field of /proc/.../schedstat).
    pub cpu_ns: u64,
}

/// Most threads whose schedstat file is kept open between polls: beyond
/// that, files are opened at each read (a process may have thousands of
/// threads, and our descriptors are limited).
const MAX_OPEN: usize = 256;

/// Reads the target's threads poll after poll, cheaply: each thread's
/// schedstat and comm stay open and are read again from offset 0; its
/// namespace tid is read once. Every poll of ours takes CPU
/// from the target on a busy machine, and reopening three files per thread
/// per poll was most of a poll's work.
pub struct TaskReader {
    pid: i32,
    known: HashMap<u32, Known>,
}

struct Known {
    sched: Option<fs::File>,
    comm: Option<fs::File>,
    inner_tid: u32,
}

impl TaskReader {
    pub fn new(pid: i32) -> Self {
        TaskReader {
            pid,
            known: HashMap::new(),
        }
    }

    /// The live threads, sorted by tid.
    pub fn read(&mut self) -> Vec<Task> {
        let pid = self.pid;
        let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
            self.known.clear();
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut live = HashSet::new();
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            live.insert(tid);
            // A file kept open that no longer reads belongs to an exited
            // thread whose tid came back: start again.
            let cpu = self.known.get_mut(&tid).and_then(|k| {
                let f = k.sched.as_ref()?;
                let v = read_at_start(f).and_then(|s| first_u64(&s));
                if v.is_none() {
                    k.sched = None;
                }
                v
            });
            let cpu_ns = match cpu {
                Some(v) => v,
                None => {
                    // A thread that exits while we read is skipped; its
                    // last values come from BPF.
                    let base = format!("/proc/{pid}/task/{tid}");
                    let Ok(f) = fs::File::open(format!("{base}/schedstat")) else {
                        self.known.remove(&tid);
                        continue;
                    };
                    let Some(v) = read_at_start(&f).and_then(|s| first_u64(&s)) else {
                        self.known.remove(&tid);
                        continue;
                    };
                    let inner_tid = fs::read_to_string(format!("{base}/status"))
                        .ok()
                        .and_then(|s| inner_tid(&s))
                        .unwrap_or(tid);
                    let keep = self.known.len() < MAX_OPEN || self.known.contains_key(&tid);
                    let comm = fs::File::open(format!("{base}/comm")).ok();
                    self.known.insert(
                        tid,
                        Known {
                            sched: keep.then_some(f),
                            comm: comm.filter(|_| keep),
                            inner_tid,
                        },
                    );
                    v
                }
            };
            let Some(k) = self.known.get_mut(&tid) else {
                continue;
            };
            let comm = match &k.comm {
                Some(f) => read_at_start(f),
                None => fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok(),
            };
            out.push(Task {
                tid,
                inner_tid: k.inner_tid,
                comm: comm.map(|s| s.trim_end().to_string()).unwrap_or_default(),
                cpu_ns,
            });
        }
        self.known.retain(|tid, _| live.contains(tid));
        out.sort_by_key(|t| t.tid);
        out
    }
}

/// The whole of a small /proc file, read again from its start.
fn read_at_start(f: &fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 128];
    let n = f.read_at(&mut buf, 0).ok()?;
    if n == 0 {
        return None;
    }
    String::from_utf8(buf[..n].to_vec()).ok()
}

fn first_u64(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// The innermost PID namespace's tid from /proc/.../status `NSpid:`.
fn inner_tid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Most entries we accept in the registry (a corrupt count must not make
/// us walk memory for long).
const MAX_ENTRIES: u64 = 65536;
/// How far into glibc's `struct pthread` to look for the kernel tid.
const TID_SEARCH: u64 = 0x800;

/// A walk that found nothing new is trusted for at most this many polls
/// (4 s at the default interval of 1 s): a name changed in place would
/// change neither the registry's size nor the thread set.
const REWALK_POLLS: u32 = 4;

/// Reads TensorFlow's thread name registry.
pub struct NameRegistry {
    mem: Memory,
    /// Address of the `thread_name_registry` pointer in the target.
    ptr_addr: u64,
    /// Offset of the tid in glibc's `struct pthread`, found once by
    /// matching the registry's pthread_t values against the live tids.
    tid_offset: Option<u64>,
    /// Names found by the last complete walk, and what it saw. A walk
    /// costs about five remote reads a registered thread (~110 a poll on
    /// the image pipeline, most of a poll's reads), so it is done again
    /// only when the registry's size or the live thread set changed: a
    /// thread that registers its name after it first showed up changes
    /// the size and is named at the next poll.
    names: HashMap<u32, String>,
    seen: Option<Seen>,
    polls_since_walk: u32,
}

#[derive(Debug, PartialEq, Eq)]
struct Seen {
    map: u64,
    count: u64,
    tids: Vec<u32>,
}

/// The registry's std::map: its address, root node and size.
struct Head {
    map: u64,
    root: u64,
    count: u64,
}

impl NameRegistry {
    pub fn new(mem: Memory, ptr_addr: u64) -> Self {
        NameRegistry {
            mem,
            ptr_addr,
            tid_offset: None,
            names: HashMap::new(),
            seen: None,
            polls_since_walk: 0,
        }
    }

    /// None if the registry is absent or does not look like a std::map.
    fn head(&self) -> Option<Head> {
        let map = self.mem.u64(self.ptr_addr).ok().filter(|&m| m != 0)?;
        // libstdc++ _Rb_tree: [+0x00 compare][+0x08 header: color, parent
        // (root), left, right][+0x28 node_count]; a node is [color, parent,
        // left, right][value at +0x20: thread::id, then std::string].
        let mut b = [0u8; 0x20];
        self.mem.read(map + 0x10, &mut b).ok()?;
        let (root, count) = (word_at(&b, 0), word_at(&b, 0x18));
        (count <= MAX_ENTRIES).then_some(Head { map, root, count })
    }

    /// (pthread_t, name) pairs; empty if a node cannot be read.
    fn entries(&self, head: &Head) -> Vec<(u64, String)> {
        let (root, count) = (head.root, head.count);
        let mut out = Vec::new();
        let mut todo = vec![root];
        let mut seen = HashSet::new();
        while let Some(n) = todo.pop() {
            if n == 0 || !seen.insert(n) || seen.len() as u64 > count {
                continue;
            }
            // One read for left, right, the id and the string's header
            // with its 16-byte local buffer (a short name lies there).
            let mut b = [0u8; 0x38];
            if self.mem.read(n + 0x10, &mut b).is_err() {
                return Vec::new();
            }
            let (left, right, id) = (word_at(&b, 0), word_at(&b, 0x8), word_at(&b, 0x10));
            let header = (word_at(&b, 0x18), word_at(&b, 0x20));
            if let Ok(name) = self
                .mem
                .std_string_from(n + 0x28, header, 256, (n + 0x10, &b))
            {
                out.push((id, name));
            }
            todo.push(left);
            todo.push(right);
        }
        out
    }

    fn tid_offset(&mut self, pthreads: &[u64], tids: &HashSet<u32>) -> Option<u64> {
        if self.tid_offset.is_some() {
            return self.tid_offset;
        }
        let mut buf = vec![0u8; TID_SEARCH as usize];
        let mut votes: HashMap<u64, usize> = HashMap::new();
        let mut readable = 0usize;
        for &p in pthreads {
            if self.mem.read(p, &mut buf).is_err() {
                continue;
            }
            readable += 1;
            for (i, w) in buf.chunks_exact(4).enumerate() {
                let v = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
                if tids.contains(&v) {
                    *votes.entry(i as u64 * 4).or_default() += 1;
                }
            }
        }
        // The tid field matches for every entry of a live thread; require a
        // clear winner seen in at least two threads.
        let mut best: Vec<(u64, usize)> = votes.into_iter().collect();
        best.sort_by_key(|&(off, n)| (std::cmp::Reverse(n), off));
        match best.as_slice() {
            [(off, n), rest @ ..]
                if *n >= 2 && *n * 2 >= readable && rest.first().is_none_or(|r| r.1 < *n) =>
            {
                debug!(offset = off, threads = n, "pthread tid offset");
                self.tid_offset = Some(*off);
            }
            _ => {}
        }
        self.tid_offset
    }

    /// Names by tid (the target's own namespace) of registered threads.
    pub fn names(&mut self, tasks: &[Task]) -> &HashMap<u32, String> {
        let Some(head) = self.head() else {
            self.seen = None;
            self.names.clear();
            return &self.names;
        };
        let mut tids: Vec<u32> = tasks.iter().map(|t| t.inner_tid).collect();
        tids.sort_unstable();
        let seen = Seen {
            map: head.map,
            count: head.count,
            tids,
        };
        if self.seen.as_ref() == Some(&seen) && self.polls_since_walk < REWALK_POLLS {
            self.polls_since_walk += 1;
            return &self.names;
        }
        self.names = self.walk(&head, &seen.tids);
        // An empty walk (a node unreadable mid-update, or no tid offset
        // yet) is tried again at the next poll.
        self.seen = (!self.names.is_empty()).then_some(seen);
        self.polls_since_walk = 0;
        &self.names
    }

    fn walk(&mut self, head: &Head, live: &[u32]) -> HashMap<u32, String> {
        let entries = self.entries(head);
        if entries.is_empty() {
            return HashMap::new();
        }
        let tids: HashSet<u32> = live.iter().copied().collect();
        let pthreads: Vec<u64> = entries.iter().map(|(p, _)| *p).collect();
        let Some(off) = self.tid_offset(&pthreads, &tids) else {
            return HashMap::new();
        };
        let mut out = HashMap::new();
        for (p, name) in entries {
            let mut b = [0u8; 4];
            if self.mem.read(p + off, &mut b).is_ok() {
                let tid = u32::from_ne_bytes(b);
                if tids.contains(&tid) {
                    out.insert(tid, name);
                }
            }
        }
        out
    }
}

/// Load address of a mapped library (start of its offset-0 mapping), for
/// turning ELF vaddrs into target addresses. Shared libraries have their
/// first PT_LOAD at vaddr 0.
pub fn load_base(pid: i32, path: &str) -> Option<u64> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let range = it.next()?;
        let _perms = it.next()?;
        let off = it.next()?;
        let p = it.nth(2)?;
        (p == path && u64::from_str_radix(off, 16).ok()? == 0)
            .then(|| u64::from_str_radix(range.split('-').next()?, 16).ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_innermost() {
        assert_eq!(inner_tid("Name:\tx\nNSpid:\t4242\t17\n"), Some(17));
        assert_eq!(inner_tid("NSpid:\t99\n"), Some(99));
        assert_eq!(inner_tid("Name:\tx\n"), None);
    }

    /// Eight bytes of a short name, as a word of a node's local buffer.
    fn text(s: &str) -> u64 {
        let mut b = [0u8; 8];
        b[..s.len()].copy_from_slice(s.as_bytes());
        u64::from_ne_bytes(b)
    }

    fn task(tid: u32) -> Task {
        Task {
            tid,
            inner_tid: tid,
            comm: "python".into(),
            cpu_ns: 1,
        }
    }

    /// A libstdc++ std::map<thread::id, string> laid out in our own memory
    /// (read back through process_vm_readv on ourselves): the registry is
    /// walked again when its size or the thread set changes, or after
    /// REWALK_POLLS polls, and not otherwise.
    #[test]
    fn registry_walked_again_only_when_something_changed() {
        const TID_AT: usize = 0x2d0;
        let tids = [1_000_001u32, 1_000_002];
        // glibc's struct pthread of each thread, the tid at TID_AT.
        let pthreads: Vec<Vec<u8>> = tids
            .iter()
            .map(|t| {
                let mut p = vec![0u8; TID_SEARCH as usize];
                p[TID_AT..TID_AT + 4].copy_from_slice(&t.to_ne_bytes());
                p
            })
            .collect();
        let long = b"tf_data_private_threadpool".to_vec();
        // Nodes: [color, parent, left, right, id, str ptr, len, buf, buf].
        let mut b = Box::new([0u64; 9]);
        b[4] = pthreads[1].as_ptr() as u64;
        b[5] = b.as_ptr() as u64 + 0x38;
        b[6] = 5;
        b[7] = text("short");
        let mut a = Box::new([0u64; 9]);
        a[2] = b.as_ptr() as u64;
        a[4] = pthreads[0].as_ptr() as u64;
        a[5] = long.as_ptr() as u64;
        a[6] = long.len() as u64;
        // The map: [compare, color, root, leftmost, rightmost, count].
        let mut map = Box::new([0u64; 6]);
        map[2] = a.as_ptr() as u64;
        map[5] = 2;
        let ptr = Box::new(map.as_ptr() as u64);
        let mut reg = NameRegistry::new(
            Memory::new(std::process::id() as i32),
            &*ptr as *const u64 as u64,
        );
        let mut tasks: Vec<Task> = tids.iter().map(|&t| task(t)).collect();
        let name = |reg: &mut NameRegistry, tasks: &[Task]| reg.names(tasks).get(&tids[1]).cloned();

        assert_eq!(name(&mut reg, &tasks).as_deref(), Some("short"));
        assert_eq!(
            reg.names(&tasks).get(&tids[0]).map(String::as_str),
            Some("tf_data_private_threadpool")
        );
        assert_eq!(reg.tid_offset, Some(TID_AT as u64));
        // Renamed in place: nothing the registry is checked by changed.
        b[7] = text("other");
        // Stores the compiler cannot see read (process_vm_readv does).
        std::hint::black_box(&b);
        assert_eq!(name(&mut reg, &tasks).as_deref(), Some("short"));
        // A new thread: walked again.
        tasks.push(task(1_000_003));
        assert_eq!(name(&mut reg, &tasks).as_deref(), Some("other"));
        // The registry's size changed: walked again.
        b[7] = text("third");
        std::hint::black_box(&b);
        assert_eq!(name(&mut reg, &tasks).as_deref(), Some("other"));
        map[5] = 3;
        std::hint::black_box(&map);
        assert_eq!(name(&mut reg, &tasks).as_deref(), Some("third"));
        // Nothing changed: trusted for REWALK_POLLS polls, then walked.
        b[7] = text("later");
        std::hint::black_box(&b);
        for _ in 0..REWALK_POLLS {
            assert_eq!(name(&mut reg, &tasks).as_deref(), Some("third"));
        }
        assert_eq!(name(&mut reg, &tasks).as_deref(), Some("later"));
    }

    #[test]
    fn own_tasks_have_cpu() {
        let me = std::process::id() as i32;
        let mut r = TaskReader::new(me);
        let t = r.read();
        assert!(t.iter().any(|t| t.tid == me as u32));
        assert!(t.iter().all(|t| t.cpu_ns > 0 || t.tid != me as u32));
        // Read again through the files kept open: same threads, CPU time
        // not going back, a thread that came and went no longer listed.
        let gone = std::thread::spawn(|| (0..100_000u64).sum::<u64>());
        let _ = gone.join();
        let u = r.read();
        assert!(u.iter().any(|t| t.tid == me as u32));
        let cpu = |v: &[Task]| v.iter().find(|t| t.tid == me as u32).map(|t| t.cpu_ns);
        assert!(cpu(&u) >= cpu(&t));
        assert!(r.known.keys().all(|tid| u.iter().any(|t| t.tid == *tid)));
    }
}
