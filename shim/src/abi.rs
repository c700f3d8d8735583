//! The shared-memory layout between the shim (writer, inside the target) and
//! `plumber-probe run` (reader, the target's parent). Both sides compile this
//! very file (the probe includes it with `#[path]`), so they cannot drift;
//! the sizes are pinned by a test. Everything is `repr(C)` and made of
//! atomics: the two processes map the same pages, and neither ever blocks
//! the other (a full table drops and counts, it never waits).

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

/// "PLUMSHM1".
pub const MAGIC: u64 = 0x314d_4853_4d55_4c50;
/// 2: `ThreadSlot::hook_ns`.
pub const VERSION: u32 = 2;

/// Environment variables the parent sets for the child.
pub const ENV_SHM: &str = "PLUMBER_SHIM_SHM";

/// Distinct iterators one discovery round may publish (the BPF discovery
/// map has the same purpose).
pub const ITER_SLOTS: usize = 1024;
/// Retired-node records in flight between two polls.
pub const RETIRED_SLOTS: usize = 4096;
pub const NAME_LEN: usize = 48;
/// Threads with their own attribution row.
pub const THREAD_SLOTS: usize = 512;
/// Model nodes one thread books work to (per-file nodes are re-created, so
/// a long-lived reader thread can fill them: then it drops and counts).
pub const NODES_PER_THREAD: usize = 64;
/// Files the process opened while recorded.
pub const FILE_SLOTS: usize = 512;
pub const PATH_LEN: usize = 256;
/// Descriptors followed (a larger fd is not followed, and counted).
pub const FD_SLOTS: usize = 4096;
/// (file, op) rows of one thread.
pub const IO_ROWS: usize = 16;
pub const PREFIX_LEN: usize = 192;

/// `Header::state`.
pub const STATE_WAITING: u32 = 0;
/// A process with TensorFlow claimed the shared memory (`owner_pid`).
pub const STATE_ACTIVE: u32 = 1;
/// Set by the parent when its recording ends (the command may run on):
/// the shim forwards calls and records nothing more.
pub const STATE_DISABLED: u32 = 2;

/// Indexes into `Header::drops`, named by [`DROP_NAMES`].
pub const DROP_ITER_TABLE_FULL: usize = 0;
pub const DROP_RETIRED_RING_FULL: usize = 1;
pub const DROP_RETIRED_BEFORE_LAYOUT: usize = 2;
pub const DROP_RETIRED_UNREADABLE: usize = 3;
pub const DROP_OTHER_PROCESS: usize = 4;
pub const DROP_THREAD_TABLE_FULL: usize = 5;
pub const DROP_NODE_TABLE_FULL: usize = 6;
pub const DROP_FILE_TABLE_FULL: usize = 7;
pub const DROP_FD_OUT_OF_RANGE: usize = 8;
pub const DROP_IO_ROWS_FULL: usize = 9;
pub const NUM_DROPS: usize = 16;
pub const DROP_NAMES: [&str; 10] = [
    "shim_iterator_table_full",
    "shim_retired_ring_full",
    "shim_retired_before_layout",
    "shim_retired_unreadable",
    "shim_calls_in_other_processes",
    "shim_thread_table_full",
    "shim_thread_node_table_full",
    "shim_file_table_full",
    "shim_fd_out_of_range",
    "shim_thread_io_rows_full",
];

/// `Retired::flags`: the node could not be read (no trustworthy counters).
pub const FLAG_READ_FAILED: u32 = 1;

/// Offsets into `model::Node`, derived by the parent from the target's
/// libraries (probe/src/layout.rs) once TensorFlow is mapped, and written
/// here before `layout_ready` is set.
#[repr(C)]
#[derive(Debug, Default)]
pub struct NodeOffsets {
    pub id: AtomicU32,
    pub name: AtomicU32,
    pub buffered_bytes: AtomicU32,
    pub buffered_elements: AtomicU32,
    pub bytes_consumed: AtomicU32,
    pub bytes_produced: AtomicU32,
    pub num_elements: AtomicU32,
    pub processing_time: AtomicU32,
    pub output: AtomicU32,
    /// `DatasetBaseIterator::prefix_` (a std::string), to name the op of
    /// a read.
    pub iter_prefix: AtomicU32,
}

/// One iterator seen in `DatasetBaseIterator::GetNext` while discovery was
/// on. `this` is 0 while free; the writer claims it with a CAS.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IterSlot {
    pub this: AtomicU64,
    pub calls: AtomicU64,
}

/// The final counters of one node, read in `Model::RemoveNode`. `seq` is
/// `index + 1` once the record is complete (release), 0 or stale before.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Retired {
    pub seq: AtomicU64,
    pub mono_ns: AtomicU64,
    pub node: AtomicU64,
    pub id: AtomicU64,
    pub parent: AtomicU64,
    pub parent_id: AtomicU64,
    pub num_elements: AtomicU64,
    pub bytes_produced: AtomicU64,
    pub bytes_consumed: AtomicU64,
    pub processing_time: AtomicU64,
    pub buffered_elements: AtomicU64,
    pub buffered_bytes: AtomicU64,
    pub flags: AtomicU32,
    pub name_len: AtomicU32,
    /// The node name's bytes, 8 per word.
    pub name: [AtomicU64; NAME_LEN / 8],
}

/// Work one thread did for one model node, split at TensorFlow's
/// `model::Node::record_stop(node)` calls (each ends a stretch of work
/// for `node`; the same meaning as the BPF attribution). Cumulative; only
/// the owning thread writes, so `node` is claimed without a CAS.
#[repr(C)]
#[derive(Debug, Default)]
pub struct NodeAttr {
    /// Seqlock of the row's reuse: odd while the owning thread rewrites
    /// it for another node; the parent carries the old node's totals over
    /// when it sees it change.
    pub gen: AtomicU64,
    /// `Header::poll_seq` at the row's last update: a row may be reused
    /// only once the parent has read it since (see `thread.rs`).
    pub stamp: AtomicU64,
    pub node: AtomicU64,
    /// CLOCK_THREAD_CPUTIME_ID ns.
    pub cpu_ns: AtomicU64,
    pub stops: AtomicU64,
    pub gil_wait_ns: AtomicU64,
    pub gil_waits: AtomicU64,
    pub io_bytes: AtomicU64,
}

/// One opened file; claimed by CAS on `hash` (of the path, never 0).
#[repr(C)]
#[derive(Debug)]
pub struct FileSlot {
    pub hash: AtomicU64,
    /// st_size at open.
    pub size: AtomicU64,
    pub path_len: AtomicU32,
    pub _pad: AtomicU32,
    pub path: [AtomicU64; PATH_LEN / 8],
}

/// An open descriptor being followed (indexed by fd).
#[repr(C)]
#[derive(Debug, Default)]
pub struct FdSlot {
    /// FileSlot index + 1; 0: not followed.
    pub file: AtomicU32,
    /// The opener's IoRow: thread index * IO_ROWS + row + 1; 0: none.
    pub row: AtomicU32,
    /// CLOCK_MONOTONIC ns of the open.
    pub opened_ns: AtomicU64,
    /// Bytes read in this open-to-close session.
    pub bytes: AtomicU64,
}

/// Reads of one thread on one file for one op (the op named by the
/// iterator prefix of the innermost GetNext on the thread, `[n]` indexes
/// removed; empty outside any GetNext). Keyed by (file, prefix_hash); the
/// keys are written by the owning thread only, the counters by any
/// (a close on another thread ends the opener's session).
#[repr(C)]
#[derive(Debug)]
pub struct IoRow {
    pub file: AtomicU32,
    pub prefix_len: AtomicU32,
    pub prefix_hash: AtomicU64,
    pub bytes: AtomicU64,
    pub reads: AtomicU64,
    pub read_ns: AtomicU64,
    pub opens: AtomicU64,
    /// Sessions opened after `Header::record_since_ns` and closed, and
    /// their bytes.
    pub complete_sessions: AtomicU64,
    pub complete_bytes: AtomicU64,
    pub prefix: [AtomicU64; PREFIX_LEN / 8],
}

/// One thread of the owner process, claimed by CAS on `tid`.
#[repr(C)]
#[derive(Debug)]
pub struct ThreadSlot {
    pub tid: AtomicU32,
    pub _pad: AtomicU32,
    /// Time waiting for the GIL (`PyEval_RestoreThread` and
    /// `PyGILState_Ensure` as called by extension modules).
    pub gil_wait_ns: AtomicU64,
    pub gil_waits: AtomicU64,
    /// Time inside read calls on tracked files.
    pub read_ns: AtomicU64,
    /// The shim's own time on this thread: inside its hooks and their
    /// clock reads (`shim/src/cost.rs` says how it is counted and what it
    /// misses). Written by the owning thread only.
    pub hook_ns: AtomicU64,
    pub nodes: [NodeAttr; NODES_PER_THREAD],
    pub io: [IoRow; IO_ROWS],
}

#[repr(C)]
#[derive(Debug)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    /// `size_of::<Header>()` as the parent built it.
    pub size: AtomicU32,
    pub state: AtomicU32,
    /// The process that claimed the shared memory: the first one in which
    /// a TensorFlow hook ran. Others (forked children, other programs the
    /// job execs) only count their calls.
    pub owner_pid: AtomicI32,
    /// Set by the parent while it wants iterators published.
    pub discover: AtomicU32,
    pub layout_ready: AtomicU32,
    pub layout: NodeOffsets,
    pub drops: [AtomicU64; NUM_DROPS],
    pub iters: [IterSlot; ITER_SLOTS],
    /// Next retired index a writer reserves.
    pub retired_head: AtomicU64,
    /// Next retired index the parent will read; a writer whose index is
    /// `RETIRED_SLOTS` ahead of it drops instead of overwriting.
    pub retired_tail: AtomicU64,
    pub retired: [Retired; RETIRED_SLOTS],
    pub threads: [ThreadSlot; THREAD_SLOTS],
    /// Bumped by the parent before each read of the attribution rows.
    pub poll_seq: AtomicU64,
    /// Set by the parent when its window starts: sessions opened before
    /// are not complete.
    pub record_since_ns: AtomicU64,
    pub files: [FileSlot; FILE_SLOTS],
    pub fds: [FdSlot; FD_SLOTS],
}

pub const HEADER_SIZE: usize = core::mem::size_of::<Header>();
