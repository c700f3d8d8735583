//! A small fixed set of stack samples and spans, as the stack sampler would
//! report them for an image pipeline (TFRecord → ParallelMapV2 (JPEG decode,
//! a py_function waiting for the GIL) → BatchV2 → Prefetch, with the Python
//! main thread and a compute thread outside the pipeline), and those of a
//! PyTorch DataLoader's stage sampler (a training loop and two worker
//! processes). The golden, pprof and trace.json tests of the collector, the
//! analyzer and the CLI use it.

use super::aggregate::StackAggregator;
use super::folded::{LabelValue, LabeledStack};
use super::sample::{LockKind, OpRef, StackSample, ThreadInfo, Weight};
use super::trace::Span;

const MS: u64 = 1_000_000;

const THREAD_FN: &[&str] = &[
    "start_thread",
    "tensorflow::(anonymous namespace)::PThread::ThreadFn(void*)",
    "tensorflow::thread::EigenEnvironment::CreateThread(std::function<void ()>)::{lambda()#1}::operator()() const",
];

fn ops() -> [OpRef; 3] {
    [
        OpRef::new("Root::Prefetch::BatchV2::ParallelMapV2", "ParallelMapV2"),
        OpRef::new("Root::Prefetch::BatchV2", "BatchV2"),
        OpRef::new(
            "Root::Prefetch::BatchV2::ParallelMapV2::TFRecord",
            "TFRecord",
        ),
    ]
}

fn sample(thread: &ThreadInfo, op: Option<&OpRef>, frames: &[&str], weight: Weight) -> StackSample {
    StackSample {
        thread: thread.clone(),
        op: op.cloned(),
        frames: THREAD_FN
            .iter()
            .chain(frames)
            .map(|f| f.to_string())
            .collect(),
        weight,
    }
}

/// The samples, in arrival order (identical stacks repeated).
pub fn demo_samples() -> Vec<StackSample> {
    let mut v = map_samples();
    v.extend(batch_and_reader_samples());
    v.extend(outside_samples());
    v
}

/// The map's UDF pool: the JPEG decode, a JIT frame, a C++ name with `;`,
/// and the py_function waiting for the GIL.
fn map_samples() -> Vec<StackSample> {
    let [map, _, _] = ops();
    let pool = |tid| ThreadInfo::new(tid, "tf_data_privat").with_role("tf_data_private_threadpool");
    let (w1, w2) = (pool(101), pool(102));
    let map_fn = [
        "tensorflow::data::ParallelMapDatasetOp::Dataset::Iterator::RunnerThread(std::shared_ptr<tensorflow::data::IteratorContext> const&)",
        "tensorflow::data::InstantiatedCapturedFunction::Run(tensorflow::data::IteratorContext*, std::vector<tensorflow::Tensor>&&, std::vector<tensorflow::Tensor>*, std::shared_ptr<tensorflow::model::Node> const&) const",
    ];
    let decode = |leaf: &'static str| -> Vec<&'static str> {
        let mut v = map_fn.to_vec();
        v.extend([
            "tensorflow::DecodeImageV2Op::Compute(tensorflow::OpKernelContext*)",
            "DecodeJpeg",
            leaf,
        ]);
        v
    };
    let py_udf = {
        let mut v = map_fn.to_vec();
        v.extend([
            "tensorflow::EagerPyFunc::Compute(tensorflow::OpKernelContext*)",
            "PyGILState_Ensure",
            "take_gil",
            "pthread_cond_timedwait",
        ]);
        v
    };
    let idct = Weight::CpuNs(10 * MS);
    let gil = Weight::LockWaitNs {
        ns: 15 * MS,
        lock: LockKind::Gil,
    };
    let rows = [
        (&w1, decode("jpeg_idct_islow"), idct),
        (&w1, decode("jpeg_idct_islow"), idct),
        (&w1, decode("jpeg_idct_islow"), idct),
        (&w2, decode("jpeg_idct_islow"), idct),
        (&w2, decode("decode_mcu"), Weight::CpuNs(25 * MS)),
        (
            &w1,
            vec![map_fn[0], map_fn[1], "[jit]"],
            Weight::CpuNs(5 * MS),
        ),
        // A C++ name with `;` in it: the folded output must not split it.
        (
            &w1,
            vec![map_fn[0], "std::array<float; 4>::fill(float const&)"],
            Weight::CpuNs(2 * MS),
        ),
        (&w1, py_udf.clone(), gil),
        (&w2, py_udf, gil),
    ];
    rows.into_iter()
        .map(|(thread, frames, weight)| sample(thread, Some(&map), &frames, weight))
        .collect()
}

/// The batch's copy and its wait for the map on the prefetch thread; the
/// reader's CRC, its blocked reads and the bytes they read.
fn batch_and_reader_samples() -> Vec<StackSample> {
    let [_, batch, tfrecord] = ops();
    let prefetch = ThreadInfo::new(140, "tf_data_prefet").with_role("tf_data_prefetch");
    let reader = ThreadInfo::new(150, "tf_data_private_threadpool");
    let batch_copy = [
        "tensorflow::data::BatchDatasetOp::Dataset::Iterator::GetNextInternal(tensorflow::data::IteratorContext*, std::vector<tensorflow::Tensor>*, bool*)",
        "tensorflow::data::CopyPartialBatch(long, tensorflow::Tensor const&, tensorflow::Tensor*)",
        "__memmove_avx_unaligned_erms",
    ];
    let batch_wait = [
        "tensorflow::data::BatchDatasetOp::Dataset::Iterator::GetNextInternal(tensorflow::data::IteratorContext*, std::vector<tensorflow::Tensor>*, bool*)",
        "tensorflow::data::ParallelMapDatasetOp::Dataset::Iterator::GetNextInternal(tensorflow::data::IteratorContext*, std::vector<tensorflow::Tensor>*, bool*)",
        "tensorflow::condition_variable::wait(tensorflow::mutex_lock&)",
        "pthread_cond_wait",
    ];
    let read = |leaf: &'static str| -> Vec<&'static str> {
        vec![
            "tensorflow::data::TFRecordDatasetOp::Dataset::Iterator::GetNextInternal(tensorflow::data::IteratorContext*, std::vector<tensorflow::Tensor>*, bool*)",
            "tensorflow::io::RecordReader::ReadRecord(unsigned long*, tsl::tstring*)",
            leaf,
        ]
    };
    let condvar = Weight::LockWaitNs {
        ns: 50 * MS,
        lock: LockKind::Condvar,
    };
    vec![
        sample(&prefetch, Some(&batch), &batch_copy, Weight::CpuNs(8 * MS)),
        sample(&prefetch, Some(&batch), &batch_wait, condvar),
        sample(
            &reader,
            Some(&tfrecord),
            &read("crc32c::ExtendSse42"),
            Weight::CpuNs(3 * MS),
        ),
        sample(
            &reader,
            Some(&tfrecord),
            &read("__pread64"),
            Weight::OffcpuNs(12 * MS),
        ),
        sample(
            &reader,
            Some(&tfrecord),
            &read("__pread64"),
            Weight::IoBytes(1 << 20),
        ),
    ]
}

/// Outside the pipeline: the Python main thread (running, then waiting for
/// the GIL; its stack starts at `_start`, not a thread entry) and a
/// compute thread (running, on a futex, off CPU).
fn outside_samples() -> Vec<StackSample> {
    let python = ThreadInfo::new(120, "python3");
    let compute = ThreadInfo::new(130, "tf_Compute");
    let main_loop = ["_start", "Py_RunMain", "_PyEval_EvalFrameDefault"];
    let worker_loop = "Eigen::ThreadPoolTempl<tsl::thread::EigenEnvironment>::WorkerLoop(int)";
    let mut v = vec![
        StackSample {
            thread: python.clone(),
            op: None,
            frames: main_loop
                .iter()
                .map(|f| f.to_string())
                .chain(["[unknown]".to_string()])
                .collect(),
            weight: Weight::CpuNs(7 * MS),
        },
        StackSample {
            thread: python,
            op: None,
            frames: main_loop
                .iter()
                .chain(&["PyEval_RestoreThread", "take_gil", "pthread_cond_timedwait"])
                .map(|f| f.to_string())
                .collect(),
            weight: Weight::LockWaitNs {
                ns: 20 * MS,
                lock: LockKind::Gil,
            },
        },
    ];
    let futex = Weight::LockWaitNs {
        ns: 4 * MS,
        lock: LockKind::Futex,
    };
    for (leaf, weight) in [
        (
            "Eigen::internal::TensorExecutor<>::run",
            Weight::CpuNs(15 * MS),
        ),
        ("syscall", futex),
        ("syscall", Weight::OffcpuNs(30 * MS)),
    ] {
        v.push(sample(&compute, None, &[worker_loop, leaf], weight));
    }
    v
}

/// [`demo_samples`] aggregated.
pub fn demo_aggregator() -> StackAggregator {
    let mut a = StackAggregator::new();
    for s in demo_samples() {
        a.add(&s);
    }
    a
}

/// Op spans of the same pipeline: on each map worker two elements, each
/// with the reader's span on the reader thread; a batch on the prefetch
/// thread enclosing a GetNext of the map.
pub fn demo_spans() -> Vec<Span> {
    let [map, batch, tfrecord] = ops();
    let span = |tid: u32, thread: &str, op: &OpRef, start_us: u64, end_us: u64| Span {
        tid,
        thread_name: thread.to_string(),
        op_path: op.path.clone(),
        op_name: op.name.clone(),
        start_ns: 5_000_000_000 + start_us * 1000,
        end_ns: 5_000_000_000 + end_us * 1000,
        ..Default::default()
    };
    vec![
        span(101, "tf_data_private_threadpool", &map, 0, 1200),
        span(102, "tf_data_private_threadpool", &map, 150, 1400),
        span(150, "tf_data_private_threadpool", &tfrecord, 10, 90),
        span(150, "tf_data_private_threadpool", &tfrecord, 160, 240),
        span(101, "tf_data_private_threadpool", &map, 1300, 2500),
        span(140, "tf_data_prefetch", &batch, 900, 2600),
        span(140, "tf_data_prefetch", &map, 900, 1000),
        Span {
            // Sub-microsecond: the fractional ts/dur keep it.
            start_ns: 5_000_000_000 + 2_550_250,
            end_ns: 5_000_000_000 + 2_550_750,
            ..span(140, "tf_data_prefetch", &map, 0, 0)
        },
    ]
}

/// A DataLoader's stage stacks as its stage sampler gives them (wall ns):
/// the training loop (pid 4242) waiting for data and stepping, two
/// workers (4250, 4251) decoding and collating, one sending. Each is
/// (stage key, pid, frames below the process frame, ms).
#[rustfmt::skip]
const STAGE_STACKS: &[(&str, u32, &str, u64)] = &[
    ("wait", 4242, "{main};__next__ (dataloader.py);get (queues.py)", 600),
    ("other", 4242, "{main};step (train.py)", 400),
    ("get_item", 4250, "{worker};__getitem__ (ds.py);decode (ds.py)", 700),
    ("collate", 4250, "{worker};default_collate (collate.py)", 100),
    ("get_item", 4251, "{worker};__getitem__ (ds.py);decode (ds.py)", 650),
    ("send", 4251, "run (threading.py);_feed (queues.py);send_bytes (connection.py)", 50),
];

/// The stage's title, as its root frame and span name say it.
fn stage_title(key: &str) -> &str {
    match key {
        "wait" => "waiting for data",
        "get_item" => "get item",
        "other" => "training step",
        k => k,
    }
}

/// The process of the demo loader's pid: `training loop (pid 4242)`,
/// `worker K (pid M)`.
fn stage_process(pid: u32) -> String {
    match pid {
        4242 => "training loop (pid 4242)".into(),
        p => format!("worker {} (pid {p})", p - 4250),
    }
}

/// The demo loader's stage stacks (stages.folded, profile.pb.gz).
pub fn demo_stage_stacks() -> Vec<LabeledStack> {
    STAGE_STACKS
        .iter()
        .map(|&(stage, pid, frames, ms)| {
            let process = stage_process(pid);
            let frames = frames
                .replace("{main}", "<module> (train.py);train (train.py)")
                .replace(
                    "{worker}",
                    "_bootstrap (process.py);_worker_loop (worker.py);fetch (fetch.py)",
                );
            let mut f = vec![format!("[{}]", stage_title(stage)), process.clone()];
            f.extend(frames.split(';').map(str::to_string));
            LabeledStack {
                frames: f,
                labels: vec![
                    ("stage", LabelValue::Str(stage.into())),
                    ("process", LabelValue::Str(process)),
                    ("pid", LabelValue::Num(i64::from(pid))),
                ],
                value: ms * MS,
            }
        })
        .collect()
}

/// Spans of the same loader: (pid, tid, thread, stage key, function, start
/// ms, end ms). Worker 1's feeder thread has its own tid in the worker's
/// process.
#[rustfmt::skip]
const STAGE_SPANS: &[(u32, u32, &str, &str, &str, u64, u64)] = &[
    (4242, 4242, "training loop", "wait", "get (queues.py)", 0, 600),
    (4242, 4242, "training loop", "other", "step (train.py)", 600, 1000),
    (4250, 4250, "worker 0", "get_item", "decode (ds.py)", 0, 700),
    (4250, 4250, "worker 0", "collate", "default_collate (collate.py)", 700, 800),
    (4250, 4250, "worker 0", "idle", "poll (connection.py)", 800, 1000),
    (4251, 4251, "worker 1", "get_item", "decode (ds.py)", 100, 750),
    (4251, 1, "worker 1 feeder", "send", "send_bytes (connection.py)", 750, 800),
];

/// The demo loader's spans (trace.json): a process per worker.
pub fn demo_stage_spans() -> Vec<Span> {
    STAGE_SPANS
        .iter()
        .map(|&(pid, tid, thread, stage, function, start, end)| Span {
            pid,
            process_name: stage_process(pid),
            tid,
            thread_name: thread.into(),
            op_path: function.into(),
            op_name: stage_title(stage).into(),
            start_ns: 5_000_000_000 + start * MS,
            end_ns: 5_000_000_000 + end * MS,
        })
        .collect()
}
