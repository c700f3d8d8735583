//! File reads of a process tree, per process (bpf/procio.bpf.c): a PyTorch
//! job's training process, its workers and whatever else it starts. The
//! BPF side sends each read and each open of a regular file as an event,
//! and counts in its map the reads whose event was lost; here the events
//! are cut at each poll's instant and named by path, and a process's counts
//! are its events' sums plus its lost reads. Its counts and its files then
//! cover the same reads: counts read from the map beside the events would
//! take in the reads that end between the cut's instant and the map's read
//! on one side only. The same object tells which threads of a process are
//! in a futex wait (`FutexWaits`, a task iterator the probe runs), for the
//! stage sampler's waits.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::mem::MaybeUninit;

use libbpf_rs::OpenObject;
use plumber_collector::event::{DropCount, FileIo};
use tracing::debug;

use crate::bpf::procio::{FutexWaits, ProcIoBpf, TREE_DROP_NAMES};
use crate::bpf::types::{ProcIoCounters, TreeIoEvent, IO_OPEN, IO_READ};
use crate::bpf::{BpfError, RingFeed};
use crate::target;

/// The reads of one process up to a cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcCounts {
    pub pid: i32,
    pub counters: ProcIoCounters,
}

/// What a cut hands back: every followed process's counts (those that
/// ended keep their last ones), and the reads since the previous cut by
/// (process, file, thread), with their process in `pid`.
#[derive(Debug, Default)]
pub struct Cut {
    pub processes: Vec<ProcCounts>,
    pub files: Vec<FileIo>,
}

/// Files named at most before the names are forgotten.
const MAX_NAMES: usize = 200_000;

/// A file read by a thread of a process: (pid, dev, ino, tid).
type FileKey = (i32, u64, u64, u32);

pub struct ProcIo<'obj> {
    /// Declared before `bpf`: the reader goes first.
    feed: RingFeed<'static, TreeIoEvent>,
    bpf: ProcIoBpf<'obj>,
    /// Events drained and not yet cut, in arrival order.
    queue: Vec<TreeIoEvent>,
    /// (dev, ino) -> path, from the opens (any process's).
    paths: HashMap<(u64, u64), String>,
    /// (process, dev, ino) -> opens not counted yet: an open counts with
    /// the file's first read after it (a file opened and never read, like
    /// torch's shared-memory tensors, is not input).
    opens: HashMap<(i32, u64, u64), u64>,
    /// (dev, ino) -> st_size, once looked up.
    sizes: HashMap<(u64, u64), Option<u64>>,
    /// Each process's reads cut so far, from their events.
    totals: BTreeMap<i32, ProcIoCounters>,
    /// The last lost-read counts of processes that ended (their map
    /// entries go).
    gone: BTreeMap<i32, ProcIoCounters>,
    /// Processes the loader named that could not be followed (a full map).
    not_followed: u64,
}

impl<'obj> ProcIo<'obj> {
    /// Loads and attaches the BPF side, then follows `root` and every
    /// process below it (children first seen from /proc; from now on the
    /// BPF side follows forks itself).
    pub fn start(obj: &'obj mut MaybeUninit<OpenObject>, root: i32) -> Result<Self, BpfError> {
        let mut bpf = ProcIoBpf::load(obj)?;
        bpf.attach()?;
        let feed = RingFeed::open(|sink, bad| bpf.event_reader(sink, bad))?;
        let io = ProcIo {
            feed,
            bpf,
            queue: Vec::new(),
            paths: HashMap::new(),
            opens: HashMap::new(),
            sizes: HashMap::new(),
            totals: BTreeMap::new(),
            gone: BTreeMap::new(),
            not_followed: 0,
        };
        // Parents before their children: a child forked after its parent
        // is followed is the BPF side's.
        for pid in descendants(root) {
            io.bpf.follow(pid)?;
        }
        Ok(io)
    }

    /// Follows processes the loader names (already followed: nothing).
    pub fn follow(&mut self, pids: &[i32]) {
        for &pid in pids {
            if self.gone.contains_key(&pid) {
                continue;
            }
            if let Err(e) = self.bpf.follow(pid) {
                debug!(pid, "not following: {e}");
                self.not_followed += 1;
            }
        }
    }

    /// The processes followed now: the root, the processes below it and
    /// those named since; None when the map cannot be read.
    pub fn followed(&self) -> Option<Vec<i32>> {
        match self.bpf.processes() {
            Ok(v) => Some(v.into_iter().map(|(pid, _)| pid).collect()),
            Err(e) => {
                debug!("followed processes not read: {e}");
                None
            }
        }
    }

    /// Moves the events sent since the last call out of the ring buffer.
    pub fn drain(&mut self) {
        self.queue.extend(self.feed.take());
    }

    /// The reads up to `mono_ns` (CLOCK_MONOTONIC, the BPF side's clock),
    /// and every process's counts up to there; later events wait for the
    /// next cut.
    pub fn cut(&mut self, mono_ns: u64) -> Result<Cut, BpfError> {
        let lost = self.bpf.processes()?;
        self.drain();
        // By instant, not by position: programs on several CPUs stamp an
        // event before they queue it.
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|e| e.mono_ns <= mono_ns);
        self.queue = later;
        if self.paths.len() > MAX_NAMES || self.opens.len() > MAX_NAMES {
            // Bounded memory on datasets of millions of files (and on the
            // shared-memory files a long-lived worker opens per batch and
            // never reads): a file read again is named again by its next
            // open, or by its fd.
            self.paths.clear();
            self.sizes.clear();
            self.opens.clear();
        }
        let mut acc: HashMap<FileKey, FileIo> = HashMap::new();
        let mut cwd = WorkingDirs {
            parents: lost
                .iter()
                .map(|(pid, c)| (*pid, c.parent as i32))
                .collect(),
            known: HashMap::new(),
        };
        for e in now {
            match e.kind {
                IO_OPEN => self.on_open(e, &mut cwd),
                IO_READ => self.on_read(&e, &mut acc),
                _ => self.feed.count_malformed(),
            }
        }
        for f in acc.values() {
            let t = self.totals.entry(f.pid.unwrap_or(0)).or_default();
            t.bytes += f.bytes_read;
            t.reads += f.reads;
            t.read_ns += f.read_ns;
        }
        // Lost reads: those of processes that ended, then of the live ones
        // (a pid reused by a new process of the tree adds to the old).
        let mut lost_now = self.gone.clone();
        for (pid, c) in lost {
            // A process that ended reads no more: keep its last counts and
            // stop following it.
            if !target::alive(pid) {
                self.bpf.forget(pid);
                let g = self.gone.entry(pid).or_default();
                *g = add(g, &c);
                self.opens.retain(|(p, _, _), _| *p != pid);
            }
            let l = lost_now.entry(pid).or_default();
            *l = add(l, &c);
        }
        let mut counts = self.totals.clone();
        for (pid, l) in lost_now {
            let c = counts.entry(pid).or_default();
            *c = add(c, &l);
        }
        let processes = counts
            .into_iter()
            .map(|(pid, counters)| ProcCounts { pid, counters })
            .collect();
        let mut files: Vec<FileIo> = acc.into_values().collect();
        files.sort_by(|a, b| (a.pid, &a.path, a.tid).cmp(&(b.pid, &b.path, b.tid)));
        Ok(Cut { processes, files })
    }

    fn on_open(&mut self, e: TreeIoEvent, cwd: &mut WorkingDirs) {
        let pid = e.tgid as i32;
        let path = absolute(pid, &e.path, e.dirfd, cwd);
        self.paths.insert((e.dev, e.ino), path);
        *self.opens.entry((pid, e.dev, e.ino)).or_default() += 1;
    }

    fn on_read(&mut self, e: &TreeIoEvent, acc: &mut HashMap<FileKey, FileIo>) {
        let pid = e.tgid as i32;
        let opens = self.opens.remove(&(pid, e.dev, e.ino)).unwrap_or(0);
        // Named once per file and cut, not per read.
        let f = match acc.entry((pid, e.dev, e.ino, e.tid)) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let path = self.name(pid, e);
                let size = *self
                    .sizes
                    .entry((e.dev, e.ino))
                    .or_insert_with(|| file_size(pid, &path));
                v.insert(FileIo {
                    path,
                    pid: Some(pid),
                    tid: e.tid,
                    size,
                    ..Default::default()
                })
            }
        };
        f.bytes_read += e.ret.max(0) as u64;
        f.reads += 1;
        f.read_ns += e.dur_ns;
        f.opens += opens;
    }

    /// The path of the file a read event read.
    fn name(&mut self, pid: i32, e: &TreeIoEvent) -> String {
        let key = (e.dev, e.ino);
        if let Some(p) = self.paths.get(&key) {
            return p.clone();
        }
        // Opened before the recording, inherited or dup'ed: the fd may
        // still name it.
        let p = link(format!("/proc/{pid}/fd/{}", e.fd))
            .filter(|p| p.starts_with('/'))
            .unwrap_or_else(|| unknown_file(e.dev, e.ino));
        self.paths.insert(key, p.clone());
        p
    }

    /// What was lost: the BPF side's drops and malformed events.
    pub fn drops(&self) -> Vec<DropCount> {
        let counts = self.bpf.drops().unwrap_or_else(|e| {
            debug!("reading the file-read drops: {e}");
            vec![0; TREE_DROP_NAMES.len()]
        });
        let mut v: Vec<DropCount> = TREE_DROP_NAMES
            .iter()
            .zip(counts)
            .map(|(name, n)| DropCount::new(*name, n))
            .collect();
        // The BPF side's map full for a child, or for a worker added here.
        v[0].count += self.not_followed;
        v.push(DropCount::new("io_event_malformed", self.feed.malformed()));
        v
    }

    /// A reader of which threads of a process are in a futex wait, for the
    /// stage sampler's thread; None when the program cannot be shared
    /// (the sampler then asks /proc).
    pub fn futex_waits(&self) -> Option<FutexWaits> {
        self.bpf
            .futex_waits()
            .map_err(|e| debug!("futex waits from /proc instead: {e}"))
            .ok()
    }

    /// The BPF programs, for the cost meter.
    pub fn programs(&self) -> Vec<crate::bpf::stats::ProgRef> {
        self.bpf.programs()
    }
}

fn add(a: &ProcIoCounters, b: &ProcIoCounters) -> ProcIoCounters {
    ProcIoCounters {
        bytes: a.bytes + b.bytes,
        reads: a.reads + b.reads,
        read_ns: a.read_ns + b.read_ns,
        parent: b.parent,
    }
}

/// The name of a file whose path is not known.
fn unknown_file(dev: u64, ino: u64) -> String {
    format!(
        "(unknown file: device {}:{} inode {ino})",
        dev >> 20,
        dev & 0xf_ffff
    )
}

/// The working directories of the job's processes, read once per cut.
struct WorkingDirs {
    /// Each followed process's parent (the BPF side's).
    parents: HashMap<i32, i32>,
    known: HashMap<i32, Option<String>>,
}

impl WorkingDirs {
    /// How far up the parents a process that ended looks.
    const UP: usize = 8;

    /// `pid`'s working directory; for a process that ended (a worker of
    /// one short epoch, gone before the cut), its nearest live ancestor's,
    /// which it inherited unless it changed directory.
    fn of(&mut self, pid: i32) -> Option<String> {
        let mut p = pid;
        for _ in 0..Self::UP {
            let dir = self
                .known
                .entry(p)
                .or_insert_with(|| link(format!("/proc/{p}/cwd")))
                .clone();
            if dir.is_some() {
                return dir;
            }
            p = *self.parents.get(&p).filter(|&&pp| pp > 0 && pp != p)?;
        }
        None
    }
}

/// Where the symbolic link `p` points (a /proc cwd or fd link).
fn link(p: String) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .map(|d| d.to_string_lossy().into_owned())
}

/// An open's path made absolute: relative to the process's working
/// directory (see [`WorkingDirs::of`]), or to the directory its `dirfd`
/// names (read now, after the open: a process that changed directory
/// since, or closed the fd, keeps the path as it was given).
fn absolute(pid: i32, path: &str, dirfd: i32, cwd: &mut WorkingDirs) -> String {
    const AT_FDCWD: i32 = -100;
    if path.starts_with('/') || path.is_empty() {
        return path.to_string();
    }
    let dir = if dirfd == AT_FDCWD {
        cwd.of(pid)
    } else {
        link(format!("/proc/{pid}/fd/{dirfd}"))
    };
    match dir {
        Some(d) => normalize(&format!("{}/{path}", d.trim_end_matches('/'))),
        None => path.to_string(),
    }
}

/// `.` and `..` components resolved lexically.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// st_size of a file as process `pid` sees it.
fn file_size(pid: i32, path: &str) -> Option<u64> {
    if !path.starts_with('/') {
        return None;
    }
    std::fs::metadata(format!("/proc/{pid}/root{path}"))
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
}

/// `root` and every live process below it, parents first.
fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(ppid) = parent_of(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            out.extend(c.iter().copied());
        }
        i += 1;
    }
    out
}

/// The parent of a process, from /proc/PID/stat.
pub(crate) fn parent_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: state and ppid follow the last ')'.
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file written for one test, removed with its directory on drop
    /// (also when the test fails).
    struct TestFile {
        dir: std::path::PathBuf,
        path: std::path::PathBuf,
    }

    impl TestFile {
        fn new(tag: &str, bytes: &[u8]) -> Self {
            let dir = std::env::temp_dir().join(format!("procio-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            let path = dir.join("data.bin");
            std::fs::write(&path, bytes).expect("write");
            TestFile { dir, path }
        }
    }

    impl Drop for TestFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Loading BPF needs root (CI runs the tests as root): the tests that
    /// load it are skipped otherwise.
    fn root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            eprintln!("skipped: loading BPF needs root");
        }
        root
    }

    #[test]
    fn relative_paths_are_made_absolute() {
        assert_eq!(normalize("/a/./b/../c//d"), "/a/c/d");
        assert_eq!(normalize("/../x"), "/x");
        let mut cwd = WorkingDirs {
            parents: [(3, 1), (4, 3), (5, 0)].into(),
            known: [
                (1, Some("/work/job".to_string())),
                (2, None),
                (3, None),
                (4, None),
                (5, None),
            ]
            .into(),
        };
        assert_eq!(
            absolute(1, "data/x.jpg", -100, &mut cwd),
            "/work/job/data/x.jpg"
        );
        assert_eq!(absolute(1, "/abs", -100, &mut cwd), "/abs");
        assert_eq!(absolute(2, "rel", -100, &mut cwd), "rel");
        // Ended, as its parent: the grandparent's directory.
        assert_eq!(absolute(4, "d/y", -100, &mut cwd), "/work/job/d/y");
        assert_eq!(absolute(5, "rel", -100, &mut cwd), "rel");
    }

    #[test]
    fn descendants_start_at_the_root() {
        let me = std::process::id() as i32;
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let d = descendants(me);
        let parent = parent_of(child.id() as i32);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(d[0], me);
        assert!(d.contains(&(child.id() as i32)), "{d:?}");
        assert_eq!(parent, Some(me));
    }

    /// The BPF side on this process: a child it forks (a shell, and the
    /// `cat` and `wc` the shell forks) is followed from its first read,
    /// its reads of a regular file are counted to the byte, and a pipe's
    /// are not. Needs root (CI runs the tests as root): skipped otherwise.
    #[test]
    fn children_are_followed_and_only_regular_files_count() {
        if !root() {
            return;
        }
        let size = 3 * 1024 * 1024 + 17;
        let data = TestFile::new("test", &vec![7u8; size]);
        let file = &data.path;
        let mut obj = MaybeUninit::uninit();
        let mut io = ProcIo::start(&mut obj, std::process::id() as i32).expect("load");
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("cat {} | wc -c > /dev/null", file.display()))
            .status()
            .expect("sh");
        assert!(status.success());
        let (mono, _) = crate::clock::now_ns();
        let cut = io.cut(mono).expect("cut");
        let path = file.to_string_lossy();
        let of_file: Vec<&FileIo> = cut.files.iter().filter(|f| f.path == path).collect();
        let bytes: u64 = of_file.iter().map(|f| f.bytes_read).sum();
        assert_eq!(bytes, size as u64, "{of_file:?}");
        assert_eq!(of_file.iter().map(|f| f.opens).sum::<u64>(), 1);
        // Read by one process, a child of a child: followed from its fork.
        let reader = of_file[0].pid.expect("pid");
        assert!(of_file.iter().all(|f| f.pid == Some(reader)));
        let counts = cut
            .processes
            .iter()
            .find(|p| p.pid == reader)
            .expect("the reader's counts");
        assert!(counts.counters.parent != 0, "{counts:?}");
        assert!(counts.counters.bytes >= size as u64, "{counts:?}");
        // The pipe's bytes are nobody's: the regular files' reads add up
        // to what the counters say.
        let all: u64 = cut.files.iter().map(|f| f.bytes_read).sum();
        let counted: u64 = cut.processes.iter().map(|p| p.counters.bytes).sum();
        assert_eq!(all, counted);
        assert!(io.drops().iter().all(|d| d.count == 0), "{:?}", io.drops());
    }

    /// This process's threads: one blocked on a channel is in a futex
    /// wait on the channel's word until it is woken and has run (then in
    /// none while it runs on), one asleep is in none, and a thread that
    /// ended leaves nothing. Needs root.
    #[test]
    fn a_thread_in_a_futex_wait_is_seen_until_it_returns() {
        if !root() {
            return;
        }
        let mut obj = MaybeUninit::uninit();
        let io = ProcIo::start(&mut obj, std::process::id() as i32).expect("load");
        let waits = io.futex_waits().expect("futex waits");
        let mine = waits
            .of_process(std::process::id() as i32)
            .expect("iterator");
        let word = |tid: i32| {
            let now = mine.now().expect("read");
            now.iter().find(|f| f.tid == tid).map(|f| f.word)
        };
        let tid_of = || nix::unistd::gettid().as_raw();
        let (tx, rx) = std::sync::mpsc::channel::<i32>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (woke_tx, woke_rx) = std::sync::mpsc::channel::<()>();
        let blocked = std::thread::spawn(move || {
            let _ = tx.send(tid_of());
            let _ = go_rx.recv();
            let _ = woke_tx.send(());
            // Runs on, in user code.
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_millis(200) {
                std::hint::spin_loop();
            }
        });
        let (tx2, rx2) = std::sync::mpsc::channel::<i32>();
        let sleeper = std::thread::spawn(move || {
            let _ = tx2.send(tid_of());
            std::thread::sleep(std::time::Duration::from_millis(300));
        });
        let (tid, asleep) = (rx.recv().expect("tid"), rx2.recv().expect("tid"));
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(word(tid).is_some_and(|w| w != 0));
        assert_eq!(word(asleep), None);
        drop(go_tx);
        woke_rx.recv().expect("woken");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(word(tid), None);
        let _ = blocked.join();
        let _ = sleeper.join();
        assert_eq!(word(tid), None);
        // A process that is not there: no wait, no error.
        let gone = waits.of_process(i32::MAX).map(|w| w.now());
        assert!(matches!(&gone, Ok(Ok(v)) if v.is_empty()), "{gone:?}");
    }

    /// Cuts taken while a child reads: every cut's per-file reads add up,
    /// per process, to what its counts grew by since the previous cut, so
    /// a window's totals and its files agree at both edges. Needs root.
    #[test]
    fn counts_and_files_end_on_the_same_reads() {
        if !root() {
            return;
        }
        let data = TestFile::new("edge", &vec![3u8; 1 << 20]);
        let file = &data.path;
        let mut obj = MaybeUninit::uninit();
        let mut io = ProcIo::start(&mut obj, std::process::id() as i32).expect("load");
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "for i in $(seq 400); do dd if={} of=/dev/null bs=8k status=none; done",
                file.display()
            ))
            .spawn()
            .expect("sh");
        let mut before: BTreeMap<i32, u64> = BTreeMap::new();
        let mut cuts_with_reads = 0;
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            let (mono, _) = crate::clock::now_ns();
            let cut = io.cut(mono).expect("cut");
            let mut in_files: BTreeMap<i32, u64> = BTreeMap::new();
            for f in &cut.files {
                *in_files.entry(f.pid.unwrap_or(0)).or_default() += f.bytes_read;
            }
            for p in &cut.processes {
                let grew = p.counters.bytes - before.get(&p.pid).copied().unwrap_or(0);
                let read = in_files.get(&p.pid).copied().unwrap_or(0);
                assert_eq!(grew, read, "process {}", p.pid);
                cuts_with_reads += usize::from(read > 0);
                before.insert(p.pid, p.counters.bytes);
            }
        }
        let _ = child.wait();
        assert!(cuts_with_reads > 20, "{cuts_with_reads} cuts saw reads");
        assert!(io.drops().iter().all(|d| d.count == 0), "{:?}", io.drops());
    }

    /// What telling a process's futex waits costs the probe (the task
    /// iterator's run over its threads, in the probe's own reads): this
    /// process, with a few threads asleep in futex waits. BENCHMARKS.md:
    /// `sudo cargo test --release -p plumber-probe --bins
    /// procio_waits_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn procio_waits_cost() {
        const READS: u32 = 20_000;
        let mut obj = MaybeUninit::uninit();
        let io = ProcIo::start(&mut obj, std::process::id() as i32).expect("load");
        let waits = io.futex_waits().expect("futex waits");
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let stop_rx = std::sync::Arc::new(std::sync::Mutex::new(stop_rx));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let rx = stop_rx.clone();
                std::thread::spawn(move || {
                    let _ = rx.lock().map(|r| r.recv());
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mine = waits
            .of_process(std::process::id() as i32)
            .expect("iterator");
        let n = mine.now().expect("read").len();
        let cpu = || nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID);
        let t0 = cpu().expect("clock");
        for _ in 0..READS {
            std::hint::black_box(mine.now().expect("read"));
        }
        let t1 = cpu().expect("clock");
        let per =
            nix::sys::time::TimeValLike::num_nanoseconds(&(t1 - t0)) as f64 / f64::from(READS);
        eprintln!("{n} threads in a futex wait: {per:.0} ns of the probe's CPU a read");
        drop(stop_tx);
        for t in threads {
            let _ = t.join();
        }
    }

    /// What a read costs in the BPF programs (their run time, the
    /// kernel's statistics), for a followed process (`dd` reading a
    /// cached file in 4 KiB reads, a child of this one) and for one not
    /// followed (the same `dd` before the object is loaded is the baseline
    /// of its wall time). BENCHMARKS.md: `sudo cargo test --release -p
    /// plumber-probe --bins procio_read_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn procio_read_cost() {
        use crate::bpf::stats::{enable_run_time_stats, open_program, run_stats};
        use std::os::fd::AsFd;
        let data = TestFile::new("cost", &vec![1u8; 64 << 20]);
        let file = &data.path;
        let dd = || {
            let t = std::time::Instant::now();
            let ok = std::process::Command::new("dd")
                .arg(format!("if={}", file.display()))
                .args(["of=/dev/null", "bs=4096", "status=none"])
                .status()
                .expect("dd")
                .success();
            assert!(ok);
            t.elapsed().as_secs_f64()
        };
        let reads = (64 << 20) / 4096;
        let plain = (0..5).map(|_| dd()).fold(f64::MAX, f64::min);
        let _stats = enable_run_time_stats().expect("stats");
        let mut obj = MaybeUninit::uninit();
        let mut io = ProcIo::start(&mut obj, std::process::id() as i32).expect("load");
        let fds: Vec<_> = io
            .programs()
            .into_iter()
            .filter_map(|p| open_program(p.id).map(|fd| (p.name, fd)))
            .collect();
        let before: Vec<(u64, u64)> = fds
            .iter()
            .map(|(_, fd)| run_stats(fd.as_fd()).unwrap_or_default())
            .collect();
        let followed = (0..5).map(|_| dd()).fold(f64::MAX, f64::min);
        for ((name, fd), (c0, n0)) in fds.iter().zip(before) {
            let (c, n) = run_stats(fd.as_fd()).unwrap_or_default();
            let runs = c.saturating_sub(c0).max(1);
            eprintln!(
                "{name}: {} runs, {:.0} ns each",
                c - c0,
                (n - n0) as f64 / runs as f64
            );
        }
        io.drain();
        eprintln!(
            "dd, {reads} reads of 4 KiB: {:.0} ns a read unfollowed, {:.0} ns followed (+{:.0} ns)",
            plain * 1e9 / reads as f64,
            followed * 1e9 / reads as f64,
            (followed - plain) * 1e9 / reads as f64
        );
    }

    #[test]
    fn unknown_files_name_their_device_and_inode() {
        assert_eq!(
            unknown_file((8 << 20) | 3, 42),
            "(unknown file: device 8:3 inode 42)"
        );
    }
}
