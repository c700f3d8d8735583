//! File I/O and blocking call sites over the window, from the probe's `Io`
//! and `LockSites` events (deltas; the caller passes only in-window ones).

use std::collections::{BTreeMap, BTreeSet};

use crate::event::{FileIo, LockSite};
use crate::process_files::PidFiles;
use crate::totals::{FileTotals, LockSiteTotals};

#[derive(Clone, Debug, Default)]
struct IoAcc {
    bytes_read: u64,
    reads: u64,
    opens: u64,
    read_ns: u64,
    size: Option<u64>,
    complete_sessions: u64,
    complete_bytes: u64,
}

impl IoAcc {
    fn add(&mut self, o: &IoAcc) {
        self.bytes_read = self.bytes_read.saturating_add(o.bytes_read);
        self.reads = self.reads.saturating_add(o.reads);
        self.opens = self.opens.saturating_add(o.opens);
        self.read_ns = self.read_ns.saturating_add(o.read_ns);
        self.complete_sessions = self.complete_sessions.saturating_add(o.complete_sessions);
        self.complete_bytes = self.complete_bytes.saturating_add(o.complete_bytes);
        // st_size can change while a file is written; the largest is the
        // closest to what was read through.
        self.size = self.size.max(o.size);
    }
}

/// I/O of one op over the window.
#[derive(Clone, Debug, Default)]
pub(crate) struct OpIo {
    pub bytes_read: u64,
    pub read_ns: u64,
    pub opens: u64,
    pub files: BTreeSet<String>,
}

pub(crate) struct IoResult {
    /// By op index.
    pub per_op: Vec<OpIo>,
    pub files: Vec<FileTotals>,
    pub unattributed_bytes: u64,
    pub by_pid: PidFiles,
}

/// (path, op_path as reported, tid) -> totals.
#[derive(Debug, Default)]
pub(crate) struct IoTracker {
    files: BTreeMap<(String, String, u32), IoAcc>,
    by_pid: PidFiles,
}

impl IoTracker {
    pub(crate) fn add(&mut self, files: Vec<FileIo>) {
        for f in files {
            if let Some(pid) = f.pid.filter(|_| f.reads > 0) {
                let r = self
                    .by_pid
                    .entry(pid)
                    .or_default()
                    .entry(f.path.clone())
                    .or_default();
                r.bytes = r.bytes.saturating_add(f.bytes_read);
                r.reads = r.reads.saturating_add(f.reads);
            }
            let acc = IoAcc {
                bytes_read: f.bytes_read,
                reads: f.reads,
                opens: f.opens,
                read_ns: f.read_ns,
                size: f.size,
                complete_sessions: f.complete_sessions,
                complete_bytes: f.complete_bytes,
            };
            self.files
                .entry((f.path, f.op_path, f.tid))
                .or_default()
                .add(&acc);
        }
    }

    /// Per-op and per-file totals. `resolve(op_path, tid)` names the op the
    /// I/O counts for (None: unattributed); `path_of(op)` is its path.
    pub(crate) fn finish<'a>(
        self,
        n_ops: usize,
        resolve: impl Fn(&str, u32) -> Option<usize>,
        path_of: impl Fn(usize) -> &'a str,
    ) -> IoResult {
        let mut per_op = vec![OpIo::default(); n_ops];
        let mut unattributed_bytes = 0u64;
        let mut by_file: BTreeMap<(String, String), IoAcc> = BTreeMap::new();
        for ((path, op_path, tid), acc) in self.files {
            let op = resolve(&op_path, tid);
            let resolved_path = match op.and_then(|i| per_op.get_mut(i).map(|o| (i, o))) {
                Some((i, o)) => {
                    o.bytes_read = o.bytes_read.saturating_add(acc.bytes_read);
                    o.read_ns = o.read_ns.saturating_add(acc.read_ns);
                    o.opens = o.opens.saturating_add(acc.opens);
                    if acc.bytes_read > 0 || acc.reads > 0 || acc.opens > 0 {
                        o.files.insert(path.clone());
                    }
                    path_of(i).to_string()
                }
                None => {
                    unattributed_bytes = unattributed_bytes.saturating_add(acc.bytes_read);
                    String::new()
                }
            };
            by_file.entry((path, resolved_path)).or_default().add(&acc);
        }
        let files = by_file
            .into_iter()
            .map(|((path, op_path), a)| FileTotals {
                path,
                op_path,
                bytes_read: a.bytes_read,
                reads: a.reads,
                opens: a.opens,
                read_ns: a.read_ns,
                size: a.size,
                complete_sessions: a.complete_sessions,
                complete_bytes: a.complete_bytes,
            })
            .collect();
        IoResult {
            per_op,
            files,
            unattributed_bytes,
            by_pid: self.by_pid,
        }
    }
}

/// (kind, site, op_path) -> (waits, wait_ns), summed over threads.
#[derive(Debug, Default)]
pub(crate) struct LockTracker {
    sites: BTreeMap<(String, String, String), (u64, u64)>,
}

impl LockTracker {
    pub(crate) fn add(&mut self, sites: Vec<LockSite>) {
        for s in sites {
            let e = self.sites.entry((s.kind, s.site, s.op_path)).or_default();
            e.0 = e.0.saturating_add(s.waits);
            e.1 = e.1.saturating_add(s.wait_ns);
        }
    }

    /// Longest total wait first.
    pub(crate) fn finish(self) -> Vec<LockSiteTotals> {
        let mut out: Vec<LockSiteTotals> = self
            .sites
            .into_iter()
            .map(|((kind, site, op_path), (waits, wait_ns))| LockSiteTotals {
                kind,
                site,
                op_path,
                waits,
                wait_ns,
            })
            .collect();
        // Stable over the key order: ties stay sorted by kind, site, op.
        out.sort_by_key(|l| std::cmp::Reverse(l.wait_ns));
        out
    }
}
