//! One stack sample as the (BPF) stack sampler reports it.

use serde::{Deserialize, Serialize};

/// A thread of the target.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// Kernel thread id (as the probe's PID namespace sees it).
    pub tid: u32,
    /// The thread's name: TensorFlow's name for its own threads (e.g.
    /// `tf_data_private_threadpool`), else the kernel's `comm`.
    pub name: String,
    /// What the thread does for the pipeline when the sampler knows it
    /// (e.g. `tf_data_private_threadpool`, `tf_data_iterator_get_next`);
    /// names the thread frame of pipeline stacks in place of `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

impl ThreadInfo {
    pub fn new(tid: u32, name: impl Into<String>) -> Self {
        ThreadInfo {
            tid,
            name: name.into(),
            role: None,
        }
    }

    pub fn with_role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }
}

/// The tf.data op a thread was working for when the sample was taken.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpRef {
    /// Its path in the autotune model, e.g. `Root::Prefetch::BatchV2::ParallelMapV2`.
    pub path: String,
    /// Its model name, e.g. `ParallelMapV2`: the flamegraphs' root frame.
    pub name: String,
}

impl OpRef {
    pub fn new(path: impl Into<String>, name: impl Into<String>) -> Self {
        OpRef {
            path: path.into(),
            name: name.into(),
        }
    }
}

/// What a thread waited for in a lock-wait sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LockKind {
    Mutex,
    Condvar,
    /// Python's global interpreter lock.
    Gil,
    /// A bare futex wait the sampler could not classify further.
    Futex,
}

impl LockKind {
    pub const ALL: [LockKind; 4] = [
        LockKind::Mutex,
        LockKind::Condvar,
        LockKind::Gil,
        LockKind::Futex,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Condvar => "condvar",
            LockKind::Gil => "gil",
            LockKind::Futex => "futex",
        }
    }
}

/// What one sample stands for. The kinds are disjoint: time counted as a
/// lock wait is not also off-CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weight {
    /// On-CPU time represented by the sample (the sampling period).
    CpuNs(u64),
    /// Time blocked off CPU (not a lock wait).
    OffcpuNs(u64),
    /// Time waiting for a lock.
    LockWaitNs { ns: u64, lock: LockKind },
    /// Bytes read or written.
    IoBytes(u64),
}

/// One sample of one thread's stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackSample {
    pub thread: ThreadInfo,
    /// The op active on the thread; `None` for threads outside the pipeline
    /// (or pipeline threads between ops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<OpRef>,
    /// Symbolized frames, outermost first: demangled C++ names, `[jit]` for
    /// JIT code, `[unknown]` where symbolization failed.
    pub frames: Vec<String>,
    pub weight: Weight,
}
