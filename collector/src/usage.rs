//! The CPU, wait and file I/O fields of stats.pb: Plumber's own fields where
//! it has one (`*_clock`, `aggregate_wait_time`, `aggregate_disk_bytes_read`,
//! `ctx_info`), extension fields (>= 1006 on OpStats, >= 1002 on
//! PipelineSnapshot) for the rest. A window without thread or file data
//! leaves every one of them zero or unset, so such a snapshot encodes
//! exactly as before these fields existed.

use std::collections::BTreeMap;

use crate::event::WaitCounters;
use crate::proto::pipeline_snapshot::{
    CtxInfo, FileSize, OpStats, ProbeCpu, ProbeFile, ProbeLockSite, ProbeShare, ProbeThread,
    ProbeWaits,
};
use crate::proto::PipelineSnapshot;
use crate::totals::{sat_i64, FileTotals, LockSiteTotals, OpTotals, ThreadRole, ThreadTotals};
use crate::window::WindowResult;

/// Files per op path.
pub(crate) fn files_by_op(files: &[FileTotals]) -> BTreeMap<&str, Vec<&FileTotals>> {
    let mut m: BTreeMap<&str, Vec<&FileTotals>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.op_path.is_empty()) {
        m.entry(f.op_path.as_str()).or_default().push(f);
    }
    m
}

/// Fills one op's CPU, wait and I/O fields; `files` are the op's.
pub(crate) fn fill_op(s: &mut OpStats, o: &OpTotals, files: &[&FileTotals]) {
    let w = &o.waits;
    s.processing_time_clock = sat_i64(o.cpu_ns);
    s.aggregate_processing_time_clock = sat_i64(o.cpu_ns);
    s.aggregate_udf_processing_time_clock = sat_i64(o.udf_cpu_ns);
    s.probe_cpu_from_self_time = o.cpu_from_self_time;
    // Plumber's wait time is time the op was blocked without using a core:
    // on its inputs or buffer space (condition variables) and on storage.
    s.aggregate_wait_time = sat_i64(w.cond_wait_ns.saturating_add(o.io_read_ns));
    s.aggregate_disk_bytes_read = sat_i64(o.io_bytes_read);
    // Plumber counts the file names a reader consumed here; only a reader
    // opens files, so other ops keep their value.
    if o.files_opened > 0 {
        s.aggregate_elements_consumed = sat_i64(o.files_opened);
    }
    s.probe_lock_wait_ns = sat_i64(w.lock_wait_ns);
    s.probe_lock_waits = sat_i64(w.lock_waits);
    s.probe_gil_wait_ns = sat_i64(w.gil_wait_ns);
    s.probe_gil_waits = sat_i64(w.gil_waits);
    s.probe_cond_wait_ns = sat_i64(w.cond_wait_ns);
    s.probe_cond_waits = sat_i64(w.cond_waits);
    s.probe_futex_wait_ns = sat_i64(w.futex_wait_ns);
    s.probe_futex_waits = sat_i64(w.futex_waits);
    s.probe_io_wait_ns = sat_i64(w.io_wait_ns);
    s.probe_io_bytes_read = sat_i64(o.io_bytes_read);
    s.probe_io_read_ns = sat_i64(o.io_read_ns);
    s.probe_files_opened = sat_i64(o.files_opened);
    s.probe_files = files.iter().map(|f| probe_file(f)).collect();
}

fn probe_file(f: &FileTotals) -> ProbeFile {
    ProbeFile {
        path: f.path.clone(),
        op_path: f.op_path.clone(),
        bytes_read: sat_i64(f.bytes_read),
        reads: sat_i64(f.reads),
        opens: sat_i64(f.opens),
        read_ns: sat_i64(f.read_ns),
        size: f.size.map_or(0, sat_i64),
        complete_sessions: sat_i64(f.complete_sessions),
        complete_bytes: sat_i64(f.complete_bytes),
    }
}

fn probe_waits(w: &WaitCounters) -> ProbeWaits {
    ProbeWaits {
        lock_wait_ns: sat_i64(w.lock_wait_ns),
        lock_waits: sat_i64(w.lock_waits),
        cond_wait_ns: sat_i64(w.cond_wait_ns),
        cond_waits: sat_i64(w.cond_waits),
        gil_wait_ns: sat_i64(w.gil_wait_ns),
        gil_waits: sat_i64(w.gil_waits),
        futex_wait_ns: sat_i64(w.futex_wait_ns),
        futex_waits: sat_i64(w.futex_waits),
        io_wait_ns: sat_i64(w.io_wait_ns),
    }
}

fn probe_thread(t: &ThreadTotals) -> ProbeThread {
    ProbeThread {
        tid: i64::from(t.tid),
        name: t.name.clone(),
        role: t.role.as_str().to_string(),
        cpu_ns: sat_i64(t.cpu_ns),
        waits: Some(probe_waits(&t.waits)),
        attributed: t
            .attributed
            .iter()
            .map(|(op_path, ns)| ProbeShare {
                op_path: op_path.clone(),
                cpu_ns: sat_i64(*ns),
            })
            .collect(),
        unattributed_ns: sat_i64(t.unattributed_cpu_ns),
        non_pipeline_ns: sat_i64(t.non_pipeline_cpu_ns),
        consumer_ns: sat_i64(t.consumer_cpu_ns),
    }
}

fn probe_lock_site(l: &LockSiteTotals) -> ProbeLockSite {
    ProbeLockSite {
        kind: l.kind.clone(),
        site: l.site.clone(),
        op_path: l.op_path.clone(),
        waits: sat_i64(l.waits),
        wait_ns: sat_i64(l.wait_ns),
    }
}

#[derive(Default)]
struct SizeEvidence {
    size: Option<u64>,
    complete_sessions: u64,
    complete_bytes: u64,
    bytes_read: u64,
}

impl SizeEvidence {
    /// st_size; else what one read from open to close got (Plumber records
    /// a file's size when a reader reaches its end); else the bytes read,
    /// the most that is known of it.
    fn size(&self) -> u64 {
        self.size
            .or_else(|| {
                self.complete_bytes
                    .checked_div(self.complete_sessions)
                    .filter(|b| *b > 0)
            })
            .unwrap_or(self.bytes_read)
    }
}

/// One FileSize per path read in the window.
fn file_sizes(files: &[FileTotals]) -> Vec<FileSize> {
    let mut by_path: BTreeMap<&str, SizeEvidence> = BTreeMap::new();
    for f in files.iter().filter(|f| f.bytes_read > 0 || f.reads > 0) {
        let e = by_path.entry(f.path.as_str()).or_default();
        e.size = e.size.max(f.size);
        e.complete_sessions = e.complete_sessions.saturating_add(f.complete_sessions);
        e.complete_bytes = e.complete_bytes.saturating_add(f.complete_bytes);
        e.bytes_read = e.bytes_read.saturating_add(f.bytes_read);
    }
    by_path
        .into_iter()
        .map(|(name, e)| FileSize {
            name: name.to_string(),
            size: sat_i64(e.size()),
        })
        .collect()
}

/// Fills the snapshot-level CPU, thread, file and lock-site fields.
pub(crate) fn fill_snapshot(s: &mut PipelineSnapshot, w: &WindowResult) {
    let machine_busy_ns = match (w.start.machine_busy_ns, w.end.machine_busy_ns) {
        (Some(a), Some(b)) => sat_i64(b.saturating_sub(a)),
        _ => 0,
    };
    let cpu_quota_cores = w
        .target
        .as_ref()
        .and_then(|t| t.cpu_quota_cores)
        .filter(|q| q.is_finite() && *q > 0.0)
        .unwrap_or(0.0);
    if w.has_thread_data() {
        let c = &w.cpu;
        s.probe_cpu = Some(ProbeCpu {
            process_ns: sat_i64(c.process_cpu_ns),
            threads_ns: sat_i64(c.threads_cpu_ns),
            pipeline_ns: sat_i64(c.pipeline_cpu_ns),
            unattributed_ns: sat_i64(c.unattributed_cpu_ns),
            non_pipeline_ns: sat_i64(c.non_pipeline_cpu_ns),
            consumer_ns: sat_i64(c.consumer_cpu_ns),
            threads: w.threads.iter().map(probe_thread).collect(),
            unattributed_waits: Some(probe_waits(&w.unattributed_waits)),
            non_pipeline_waits: Some(probe_waits(&w.non_pipeline_waits)),
            machine_busy_ns,
            cpu_quota_cores,
        });
    } else if machine_busy_ns > 0 || cpu_quota_cores > 0.0 {
        // No per-thread rows (a DataLoader recording, or BPF not loaded):
        // what the rest of the machine took and the quota are still known,
        // and the analyzer's core budget takes them off. No threads in it
        // tells the analyzer the rest is not measured.
        s.probe_cpu = Some(ProbeCpu {
            machine_busy_ns,
            cpu_quota_cores,
            ..Default::default()
        });
    }
    s.probe_files = w.files.iter().map(probe_file).collect();
    s.probe_lock_sites = w.lock_sites.iter().map(probe_lock_site).collect();
    s.probe_unattributed_io_bytes = sat_i64(w.unattributed_io_bytes);
    if w.has_thread_data() || !w.files.is_empty() {
        let udf_threads = w
            .threads
            .iter()
            .filter(|t| t.role == ThreadRole::UdfPool)
            .count();
        s.ctx_info = Some(CtxInfo {
            // Not observed: 0 lets readers fall back to other figures.
            shared_threadpool_size: 0,
            udf_threadpool_size: i64::try_from(udf_threads).unwrap_or(i64::MAX),
            file_sizes: file_sizes(&w.files),
        });
    }
}
