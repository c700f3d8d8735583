//! The CPU time a thread ran between two of the stage sampler's reads of
//! it, for its stage's CPU time beside its wall time.
//!
//! The kernel keeps each thread's time on a CPU (`sum_exec_runtime`, ns)
//! and gives it as the first field of `/proc/PID/task/TID/schedstat`,
//! readable by the process's owner (no root: `plumber-probe run` reads it
//! too). Each thread's file stays open between reads and is read again at
//! offset 0, ~1 us a read. The figure of a thread running right then lags
//! by up to one scheduler tick (1-4 ms), which the next read makes good.
//!
//! A thread read at every tick (the training loop, a worker's main
//! thread, idle or not) gets the CPU of each period between two reads put
//! on the stages seen at its two ends (`split`): on the one stage when
//! both saw it; when one end waited (a worker idle, the loop waiting for
//! a batch), on the other, which ran it; else half each. Put on the
//! second end's stage alone, as its wall time is, a worker 10% idle had
//! a tenth of its CPU called idle, though an idle worker runs nothing.
//! A thread read only while busy (a worker's feeder while it sends) gets
//! its CPU since its last read put on that one stage, where all of it
//! went.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use super::stage::Stage;

/// Threads' files kept open, at most: the training process's and the
/// workers' counted threads, far fewer than this.
const MAX_OPEN: usize = 512;

/// A period's CPU time, ns, on the stages it went to (the second 0
/// when one took it all).
pub type CpuSplit = [(Stage, u64); 2];

/// A thread's schedstat file, its CPU time and its stage at its last read.
#[derive(Debug)]
struct Thread {
    file: File,
    ns: u64,
    stage: Stage,
}

/// Each counted thread, as last read.
#[derive(Debug, Default)]
pub struct ThreadCpu {
    threads: HashMap<(i32, i32), Thread>,
}

impl ThreadCpu {
    /// The CPU time thread `tid` of `pid`, now in `stage`, ran since its
    /// last read, ns, on the stages it went to; at its first read what it
    /// ran in all, up to `dt` (the time since the tick before, within
    /// which a thread just started ran all of it). None when its kernel
    /// id is not known or it ended.
    pub fn since_last(&mut self, pid: i32, tid: i32, dt: u64, stage: Stage) -> Option<CpuSplit> {
        if pid <= 0 || tid <= 0 {
            return None;
        }
        let key = (pid, tid);
        if !self.threads.contains_key(&key) {
            if self.threads.len() >= MAX_OPEN {
                self.threads.clear();
            }
            let file = File::open(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
            let ns = read_ns(&file)?;
            self.threads.insert(key, Thread { file, ns, stage });
            return Some([(stage, ns.min(dt)), (stage, 0)]);
        }
        let t = self.threads.get_mut(&key)?;
        // A thread that ended answers ESRCH: its file goes (the id may
        // come back as another thread's).
        let Some(now) = read_ns(&t.file) else {
            self.threads.remove(&key);
            return None;
        };
        let ran = now.saturating_sub(t.ns);
        let before = std::mem::replace(&mut t.stage, stage);
        t.ns = now;
        Some(split(before, stage, ran))
    }

    /// Forgets the threads of a process gone.
    pub fn forget(&mut self, pid: i32) {
        self.threads.retain(|(p, _), _| *p != pid);
    }
}

/// `ran` ns of a period whose ends saw `before` and `after`.
fn split(before: Stage, after: Stage, ran: u64) -> CpuSplit {
    let waits = |s: Stage| matches!(s, Stage::Idle | Stage::Wait);
    match (waits(before), waits(after)) {
        _ if before == after => [(after, ran), (after, 0)],
        (false, true) => [(before, ran), (after, 0)],
        (false, false) => [(before, ran / 2), (after, ran - ran / 2)],
        (true, _) => [(after, ran), (before, 0)],
    }
}

/// The first field of a schedstat file: ns on a CPU.
fn read_ns(f: &File) -> Option<u64> {
    let mut buf = [0u8; 96];
    let n = f.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(buf.get(..n)?).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn my_tid() -> i32 {
        // SAFETY: gettid takes no argument and cannot fail.
        unsafe { libc::gettid() }
    }

    #[test]
    fn a_thread_s_cpu_grows_by_what_it_ran() {
        let (pid, tid) = (std::process::id() as i32, my_tid());
        let mut cpu = ThreadCpu::default();
        let get = Stage::GetItem;
        // First read: capped at the period given (a thread just started
        // may not have its first tick's time counted yet).
        let first = cpu.since_last(pid, tid, 1, get);
        assert!(
            matches!(first, Some([(Stage::GetItem, n), (Stage::GetItem, 0)]) if n <= 1),
            "{first:?}"
        );
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let ran = match cpu.since_last(pid, tid, u64::MAX, get) {
            Some([(Stage::GetItem, ran), (Stage::GetItem, 0)]) => ran,
            other => panic!("{other:?}"),
        };
        assert!(
            (20_000_000..200_000_000).contains(&ran),
            "30 ms of spinning read as {ran} ns"
        );
        assert_eq!(cpu.since_last(pid, 0, 1, get), None);
        assert_eq!(cpu.since_last(pid, i32::MAX, 1, get), None);
        cpu.forget(pid);
        assert!(cpu.threads.is_empty());
    }

    #[test]
    fn a_period_s_cpu_goes_to_the_stage_that_ran_it() {
        use Stage::*;
        assert_eq!(split(GetItem, GetItem, 10), [(GetItem, 10), (GetItem, 0)]);
        // Busy then idle: the busy stage ran it.
        assert_eq!(split(Collate, Idle, 10), [(Collate, 10), (Idle, 0)]);
        assert_eq!(split(Wait, Other, 10), [(Other, 10), (Wait, 0)]);
        // Two busy stages: half each.
        assert_eq!(split(GetItem, Collate, 11), [(GetItem, 5), (Collate, 6)]);
        // Two waits: the second's.
        assert_eq!(split(Idle, Wait, 4), [(Wait, 4), (Idle, 0)]);
    }
}
