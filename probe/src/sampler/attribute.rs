//! Sampled stacks -> a [`StackAggregator`]: each stack gets its thread
//! (TensorFlow's name for it) and the op it worked for.
//!
//! The op of a stack is the innermost `...DatasetOp::...::GetNextInternal`
//! frame's op when that names one op of the pipeline; otherwise the op the
//! thread was attributed to (`record_stop` windows): the UDF runs on
//! `tf_data_private_threadpool` threads whose stacks have no GetNextInternal
//! frame at all (executor -> kernel), and record_stop books them to the
//! function-owning op, e.g. ParallelMapV2. Threads attributed to no op go
//! under `[outside pipeline]`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use plumber_collector::stacks::{LockKind, OpRef, StackAggregator, ThreadInfo, Weight};

use super::sampled::SampledStacks;
use crate::frames::getnext_class;

/// What the rest of the recording knows about threads and ops.
#[derive(Clone, Debug, Default)]
pub struct StackContext {
    /// tid (our namespace) -> TensorFlow's name, else comm.
    pub names: HashMap<u32, String>,
    /// Op class (`ParallelMap`) -> op paths of that class.
    pub class_paths: HashMap<String, HashSet<String>>,
    /// tid -> op path the thread spent most attributed CPU on.
    pub thread_ops: HashMap<u32, String>,
    /// Lock waits by site, for locks.folded, and blocks off CPU outside
    /// the lock and GIL slow paths, for offcpu.folded.
    pub locks: Vec<LockStack>,
    /// Bytes read by stack, for io.folded.
    pub io: Vec<IoStack>,
    /// Op spans per thread, for trace.json.
    pub spans: Vec<plumber_collector::stacks::Span>,
    /// Wait kind (`enum pp_wait_kind`) -> the probed slow path's name, the
    /// leaf of its unwound stacks (which start at its caller).
    pub wait_leaf: HashMap<u32, String>,
}

/// The waits of one thread at one lock site.
#[derive(Clone, Debug)]
pub struct LockStack {
    pub tid: u32,
    /// `enum pp_wait_kind`.
    pub wait_kind: u32,
    pub kind: LockKind,
    /// Outermost first.
    pub frames: Vec<String>,
    pub ns: u64,
}

/// The file bytes one thread read from one stack.
#[derive(Clone, Debug)]
pub struct IoStack {
    pub tid: u32,
    /// Outermost first; the leaf names the file.
    pub frames: Vec<String>,
    pub bytes: u64,
}

/// A wait's weight: a block outside the timed slow paths (sched_switch
/// saw the thread go to sleep: a condition wait, an idle pool, a sleep)
/// is time off CPU, for offcpu.folded; the rest are lock waits, for
/// locks.folded.
fn wait_weight(wait_kind: u32, kind: LockKind, ns: u64) -> Weight {
    if wait_kind as usize == crate::bpf::types::WAIT_BLOCK {
        Weight::OffcpuNs(ns)
    } else {
        Weight::LockWaitNs { ns, lock: kind }
    }
}

fn op_of_path(path: &str) -> OpRef {
    OpRef::new(path, plumber_collector::opnames::model_name_of_path(path))
}

impl StackContext {
    fn thread(&self, tid: u32) -> ThreadInfo {
        // Unknown: empty, and the folded stacks say `tid N`.
        ThreadInfo::new(tid, self.names.get(&tid).cloned().unwrap_or_default())
    }

    /// The op of a stack (frames outermost first) of thread `tid`.
    fn op<S: AsRef<str>>(&self, tid: u32, frames: &[S]) -> Option<OpRef> {
        let by_frame = frames.iter().rev().find_map(|f| {
            let class = getnext_class(f.as_ref())?;
            let paths = self.class_paths.get(&class)?;
            (paths.len() == 1)
                .then(|| paths.iter().next().cloned())
                .flatten()
        });
        by_frame
            .or_else(|| self.thread_ops.get(&tid).cloned())
            .map(|p| op_of_path(&p))
    }
}

/// What a pipeline thread does, from a frame of its stack: TF names the
/// prefetch and parallel-map runner threads `tf_data_iterator_resource`
/// alike (its thread pool's name), the stack tells them apart.
fn role_of_frame(frame: &str) -> Option<String> {
    if frame.contains("::PrefetchThread(") {
        return Some("prefetch thread".into());
    }
    let at = frame.find("::RunnerThread(")?;
    let head = &frame[..at];
    let class = head
        .find("DatasetOp::")
        .map(|ds| {
            let start = head[..ds].rfind("::").map(|i| i + 2).unwrap_or(0);
            &head[start..ds]
        })
        .filter(|c| !c.is_empty());
    Some(match class {
        Some(c) => format!("{c} runner thread"),
        None => "runner thread".into(),
    })
}

/// Each thread's role: the one most of its samples show.
fn thread_roles(s: &SampledStacks) -> HashMap<u32, String> {
    let mut votes: HashMap<u32, HashMap<String, u64>> = HashMap::new();
    for ((tid, frames), &count) in &s.stacks {
        if let Some(r) = frames.iter().find_map(|f| role_of_frame(f)) {
            *votes.entry(*tid).or_default().entry(r).or_default() += count;
        }
    }
    votes
        .into_iter()
        .filter_map(|(tid, v)| {
            let (r, _) = v
                .into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))?;
            Some((tid, r))
        })
        .collect()
}

/// The sampled CPU stacks and the lock waits, attributed to threads and ops.
pub fn attribute(s: &SampledStacks, ctx: &StackContext) -> StackAggregator {
    let mut agg = StackAggregator::new();
    let roles = thread_roles(s);
    let mut threads: HashMap<u32, ThreadInfo> = roles
        .into_iter()
        .map(|(tid, r)| (tid, ctx.thread(tid).with_role(r)))
        .collect();
    // Waits whose stacks were copied and unwound replace the frame-pointer
    // stacks of the same kind: a sample of the same waits, seen further up.
    // They give the shape; the total stays the counters' (the copies are a
    // sub-sample, and some can be lost to a full ring buffer).
    let mut unwound: HashMap<u32, u64> = HashMap::new();
    for ((_, kind, _), ns) in &s.waits {
        *unwound.entry(*kind).or_default() += ns;
    }
    let mut counted: HashMap<u32, u64> = HashMap::new();
    for l in &ctx.locks {
        *counted.entry(l.wait_kind).or_default() += l.ns;
    }
    for ((tid, kind, frames), &ns) in &s.waits {
        let thread = threads.entry(*tid).or_insert_with(|| ctx.thread(*tid));
        let mut frames = frames.clone();
        if let Some(leaf) = ctx.wait_leaf.get(kind) {
            frames.push(Arc::from(leaf.as_str()));
        }
        let op = ctx.op(*tid, &frames);
        let total = counted.get(kind).copied().unwrap_or(0);
        let scale = total as f64 / unwound.get(kind).copied().unwrap_or(1).max(1) as f64;
        agg.add_parts(
            thread,
            op.as_ref(),
            &frames,
            wait_weight(
                *kind,
                crate::bpf::types::lock_kind(*kind),
                (ns as f64 * scale).round() as u64,
            ),
        );
    }
    for l in ctx
        .locks
        .iter()
        .filter(|l| !unwound.contains_key(&l.wait_kind))
    {
        let thread = threads.entry(l.tid).or_insert_with(|| ctx.thread(l.tid));
        let op = ctx.op(l.tid, &l.frames);
        agg.add_parts(
            thread,
            op.as_ref(),
            &l.frames,
            wait_weight(l.wait_kind, l.kind, l.ns),
        );
    }
    for io in &ctx.io {
        let thread = threads.entry(io.tid).or_insert_with(|| ctx.thread(io.tid));
        let op = ctx.op(io.tid, &io.frames);
        agg.add_parts(thread, op.as_ref(), &io.frames, Weight::IoBytes(io.bytes));
    }
    for ((tid, frames), &count) in &s.stacks {
        let thread = threads.entry(*tid).or_insert_with(|| ctx.thread(*tid));
        let op = ctx.op(*tid, frames);
        let ns = s.period_ns.saturating_mul(count);
        let mut w = plumber_collector::stacks::Weights::default();
        w.add(Weight::CpuNs(ns));
        w.samples = count;
        agg.add_weights(thread, op.as_ref(), frames, &w);
    }
    agg
}

#[cfg(test)]
mod tests {
    use super::*;
    use plumber_collector::stacks::{folded_text, FoldedKind};
    use std::sync::Arc;

    #[test]
    fn ops_from_frames_then_threads() {
        let mut s = SampledStacks {
            period_ns: 10,
            ..Default::default()
        };
        let f = |v: &[&str]| v.iter().map(|x| Arc::from(*x)).collect::<Vec<Arc<str>>>();
        s.stacks.insert(
            (
                1,
                f(&[
                    "start_thread",
                    "tensorflow::data::TFRecordDatasetOp::Dataset::Iterator::GetNextInternal(x)",
                    "read",
                ]),
            ),
            3,
        );
        s.stacks.insert((2, f(&["start_thread", "DecodeJpeg"])), 2);
        s.stacks.insert((3, f(&["_start", "main"])), 1);
        s.stacks.insert(
            (
                4,
                f(&[
                    "start_thread",
                    "tensorflow::data::ParallelMapDatasetOp::Dataset::Iterator::RunnerThread(x)",
                    "memcpy",
                ]),
            ),
            1,
        );
        let mut ctx = StackContext::default();
        ctx.names.insert(2, "tf_data_private_threadpool".into());
        ctx.class_paths.insert(
            "TFRecord".into(),
            ["Root::Prefetch::TFRecord".to_string()].into(),
        );
        ctx.thread_ops
            .insert(2, "Root::Prefetch::ParallelMapV2".into());
        let agg = attribute(&s, &ctx);
        assert_eq!(agg.totals().cpu_ns, 70);
        assert_eq!(agg.totals().samples, 7);
        let text = folded_text(&agg, FoldedKind::Cpu);
        assert!(text.contains("[TFRecord]"), "{text}");
        assert!(text.contains("[ParallelMapV2]"), "{text}");
        assert!(text.contains("DecodeJpeg 20"), "{text}");
        assert!(text.contains("[outside pipeline]"), "{text}");
        // tid 4 has no name and no op: its role names it.
        assert!(
            text.contains("[outside pipeline];ParallelMap runner thread;"),
            "{text}"
        );
        assert!(text.contains("[TFRecord];tid 1;"), "{text}");
        assert_eq!(
            role_of_frame("tensorflow::data::ParallelMapDatasetOp::Dataset::Iterator::RunnerThread(std::shared_ptr<x>)"),
            Some("ParallelMap runner thread".into())
        );
        assert_eq!(
            role_of_frame("tensorflow::data::PrefetchDatasetOp::Dataset::Iterator::PrefetchThread(std::shared_ptr<x>)"),
            Some("prefetch thread".into())
        );
        assert_eq!(role_of_frame("memcpy"), None);
    }

    #[test]
    fn unwound_wait_stacks_give_the_shape_counters_the_total() {
        let f = |v: &[&str]| v.iter().map(|x| Arc::from(*x)).collect::<Vec<Arc<str>>>();
        let mut s = SampledStacks::default();
        // Two sampled GIL waits' stacks (down to take_gil's caller), 3:1.
        let compute = f(&[
            "start_thread",
            "tensorflow::PyFuncOp::Compute",
            "PyGILState_Ensure",
        ]);
        s.waits.insert((7, 2, compute), 300);
        s.waits
            .insert((8, 2, f(&["_start", "PyEval_RestoreThread"])), 100);
        let mut ctx = StackContext::default();
        ctx.thread_ops.insert(7, "Root::ParallelMapV2".into());
        ctx.wait_leaf.insert(2, "take_gil".into());
        // The counters: 4,000 ns of GIL wait in all (frame-pointer stacks,
        // replaced), and 50 ns of mutex wait (kept: no unwound stacks).
        let lock = |wait_kind, kind, frames: &[&str], ns| LockStack {
            tid: 7,
            wait_kind,
            kind,
            frames: frames.iter().map(|x| x.to_string()).collect(),
            ns,
        };
        ctx.locks = vec![
            lock(2, LockKind::Gil, &["take_gil"], 4000),
            lock(0, LockKind::Mutex, &["LockSlow"], 50),
        ];
        let text = folded_text(&attribute(&s, &ctx), FoldedKind::Locks);
        assert!(
            text.contains(
                "[ParallelMapV2];tid 7;start_thread;tensorflow::PyFuncOp::Compute;\
                 PyGILState_Ensure;take_gil;[lock: gil] 3000"
            ),
            "{text}"
        );
        assert!(
            text.contains("PyEval_RestoreThread;take_gil;[lock: gil] 1000"),
            "{text}"
        );
        assert!(text.contains("LockSlow;[lock: mutex] 50"), "{text}");
        assert!(!text.contains("[ParallelMapV2];tid 7;take_gil;"), "{text}");
    }

    #[test]
    fn unwound_block_copies_shape_off_cpu() {
        // A sampled block's copy, its Python frames merged (no leaf: the
        // stack ends at the syscall), and the frame-pointer block stacks
        // it replaces: 900 ns of blocks counted, all off CPU, none a lock.
        let f = |v: &[&str]| v.iter().map(|x| Arc::from(*x)).collect::<Vec<Arc<str>>>();
        let block = crate::bpf::types::WAIT_BLOCK as u32;
        let mut s = SampledStacks::default();
        s.waits.insert(
            (
                5,
                block,
                f(&["_start", "run (common.py:239)", "GetNext", "syscall"]),
            ),
            300,
        );
        let mut ctx = StackContext::default();
        ctx.wait_leaf.insert(2, "take_gil".into());
        ctx.locks = vec![LockStack {
            tid: 5,
            wait_kind: block,
            kind: LockKind::Condvar,
            frames: vec!["_start".into(), "syscall".into()],
            ns: 900,
        }];
        let agg = attribute(&s, &ctx);
        assert_eq!(
            folded_text(&agg, FoldedKind::Offcpu),
            "[outside pipeline];tid 5;_start;run (common.py:239);GetNext;syscall 900\n"
        );
        assert_eq!(folded_text(&agg, FoldedKind::Locks), "");
    }

    #[test]
    fn blocks_go_off_cpu_and_reads_to_io() {
        let mut ctx = StackContext::default();
        ctx.thread_ops.insert(3, "Root::TFRecord".into());
        let frames = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        ctx.locks = vec![
            LockStack {
                tid: 3,
                wait_kind: crate::bpf::types::WAIT_BLOCK as u32,
                kind: LockKind::Condvar,
                frames: frames(&["start_thread", "WaitForWork", "syscall"]),
                ns: 700,
            },
            LockStack {
                tid: 3,
                wait_kind: crate::bpf::types::WAIT_LOCK as u32,
                kind: LockKind::Mutex,
                frames: frames(&["start_thread", "LockSlow"]),
                ns: 40,
            },
        ];
        ctx.io = vec![IoStack {
            tid: 3,
            frames: frames(&["start_thread", "pread64", "[read: /d/a.tfrecord]"]),
            bytes: 4096,
        }];
        let agg = attribute(&SampledStacks::default(), &ctx);
        let off = folded_text(&agg, FoldedKind::Offcpu);
        assert_eq!(
            off,
            "[TFRecord];tid 3;start_thread;WaitForWork;syscall 700\n"
        );
        let locks = folded_text(&agg, FoldedKind::Locks);
        assert_eq!(
            locks,
            "[TFRecord];tid 3;start_thread;LockSlow;[lock: mutex] 40\n"
        );
        let io = folded_text(&agg, FoldedKind::Io);
        assert_eq!(
            io,
            "[TFRecord];tid 3;start_thread;pread64;[read: /d/a.tfrecord] 4096\n"
        );
    }
}
