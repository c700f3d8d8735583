/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Event and map value layouts shared by the BPF programs, the LD_PRELOAD shim
 * and Rust (probe/src/bpf/types.rs mirrors them; a test checks the sizes).
 * Fixed-width fields only, explicit padding, so C and #[repr(C)] agree.
 */
#ifndef PLUMBER_H
#define PLUMBER_H

#define PP_NAME_LEN 32
#define PP_MAX_DEPTH 16

/* Offsets into TensorFlow's model::Node, derived at attach time from the
 * target's own libtensorflow_framework (probe/src/layout.rs). */
struct pp_node_layout {
	__u32 id;
	__u32 name;
	__u32 buffered_bytes;
	__u32 buffered_elements;
	__u32 bytes_consumed;
	__u32 bytes_produced;
	__u32 num_elements;
	__u32 processing_time;
	__u32 output;
	__u32 _pad;
};

/* A model::Node leaving the model (Model::RemoveNode): its final counters. */
struct pp_retired_event {
	__u64 mono_ns;
	__u64 node;
	__s64 id;
	__u64 parent;
	__s64 parent_id;
	__s64 num_elements;
	__s64 bytes_produced;
	__s64 bytes_consumed;
	__s64 processing_time;
	__s64 buffered_elements;
	__s64 buffered_bytes;
	__u32 name_len;
	__u32 flags;
	char name[PP_NAME_LEN];
};

#define PP_RETIRED_NAME_TRUNCATED 1u
#define PP_RETIRED_READ_FAILED 2u

/* Fallback mode: per-iterator GetNext counts (key: iterator `this`). */
struct pp_iter_stats {
	__u64 calls;
	__u64 elements;
	__u64 self_ns;
	__u64 incl_ns;
};

/* Every way an event can be lost. Counted per CPU, shown to the user. */
enum pp_drop {
	PP_DROP_RINGBUF_FULL = 0,
	PP_DROP_READ_FAILED = 1,
	PP_DROP_DISCOVER_MAP_FULL = 2,
	PP_DROP_STACK_OVERFLOW = 3,
	PP_DROP_UNMATCHED_RETURN = 4,
	PP_DROP_STATS_MAP_FULL = 5,
	PP_DROP_THREAD_MAP_FULL = 6,
	PP_DROP_CPU_THREAD_MAP_FULL = 7,
	PP_DROP_ATTR_MAP_FULL = 8,
	PP_DROP_LOCK_SITE_MAP_FULL = 9,
	PP_DROP_STACK_ID_FAILED = 10,
	PP_DROP_IO_RINGBUF_FULL = 11,
	PP_DROP_FD_MAP_FULL = 12,
	PP_DROP_WAIT_UNMATCHED_RETURN = 13,
	PP_DROP_WAIT_UNMATCHED_ENTRY = 14,
	PP_DROP_WAIT_SAMPLE_RINGBUF_FULL = 15,	/* a sampled wait's stack copy */
	PP_DROP_WAIT_STACK_COPY_FAILED = 16,	/* sent with no stack */
	PP_DROP_SPAN_RINGBUF_FULL = 17,		/* an op span for trace.json */
	PP_DROP_BLOCK_COPY_MAP_FULL = 18,	/* a sampled block's stack copy */
	PP_DROP_BLOCK_NO_USER_REGS = 19,	/* likewise: no user registers */
	PP_DROP_BLOCK_SAMPLE_RINGBUF_FULL = 20,	/* likewise: its ring buffer full */
	PP_DROP__COUNT = 21,
};

/* Kinds of blocking, indexes into pp_waits. */
enum pp_wait_kind {
	PP_WAIT_LOCK = 0,	/* absl::Mutex slow path: contention */
	PP_WAIT_COND = 1,	/* absl::Mutex slow path with a condition (LockWhen, Await) */
	PP_WAIT_GIL = 2,	/* CPython GIL acquisition */
	/* Blocked otherwise (sched_switch, in attribution windows only):
	 * condition variables, idle pools, sleeps. Reported with PP_WAIT_COND
	 * as condition waits, after scaling to the whole recording. */
	PP_WAIT_BLOCK = 3,
	PP_WAIT_IO = 4,		/* read syscalls on tracked files */
	PP_WAIT__COUNT = 5,
};

struct pp_waits {
	__u64 ns[PP_WAIT__COUNT];
	__u64 n[PP_WAIT__COUNT];
};

/* Node ids a thread keeps (pp_thread.id_node). */
#define PP_ID_CACHE 4

/* Per-thread state and totals (key: global tid). cpu_ns is the kernel's
 * sum_exec_runtime at the thread's last switch-out. */
struct pp_thread {
	__u32 ns_tid;		/* tid in plumber-probe's PID namespace, 0 = unknown */
	__u32 flags;		/* PP_THREAD_* */
	__u64 cpu_ns;
	struct pp_waits waits;	/* cumulative since attach */
	/* Attribution: work since the last record_stop on this thread. */
	__u32 gen;
	__u32 wait_depth;	/* nesting of instrumented slow paths */
	__u64 on_since;		/* ktime when switched in, 0 when off CPU */
	__u64 seg_cpu;
	__u64 seg_io;
	struct pp_waits seg;
	/* An instrumented wait in progress. */
	__u64 wait_start;
	__s64 wait_stack;
	__u32 wait_kind;
	/* A syscall in progress (futex wait, read, open). */
	__u32 sys_nr;
	__u64 sys_start;
	__u64 sys_arg;		/* fd, or the user pointer to an open's path */
	__s64 sys_stack;
	/* Blocked (off CPU by its own choice) since; 0 when not. */
	__u64 blocked_since;
	__s64 block_stack;	/* PP_STACK_UNSAMPLED for most blocks */
	__u32 blocks;
	__u32 block_gen;	/* attribution window the block began in */
	__u64 wait_sp;		/* stack pointer at the outermost slow-path entry */
	__u32 slow_paths;	/* outermost slow-path entries: stack sampling */
	__u32 wait_gen;		/* wait-probe attachment of the outermost entry */
	/* Start of the current op span: the last record_stop, or the wake-up
	 * after a block since (trace.json spans leave out idle time). */
	__u64 span_start;
	/* Stack copies of blocks (probe.bpf.c, take_block_copy): when the
	 * last was taken, and the blocks since, in this window. */
	__u64 block_copy_ns;
	__u32 blocks_uncopied;
	__u32 _pad_block;
	/* The model ids of nodes this thread's record_stop saw, a small
	 * direct-mapped cache (reading an id is a user memory read, ~150 ns),
	 * valid while no node was removed since (id_gen = node_removals). */
	__u64 id_node[PP_ID_CACHE];
	__s64 id_val[PP_ID_CACHE];
	__u64 id_gen;
};

/* Call-site stacks of blocks are taken for one block in PP_BLOCK_SAMPLE,
 * and of lock, condition and GIL slow paths for one entry in
 * PP_WAIT_SAMPLE (a user stack walk costs 1-2 us, more than the handler
 * itself, and TensorFlow enters absl's slow path thousands of times a
 * second); user space scales those sites up. Wait totals are not sampled. */
#define PP_BLOCK_SAMPLE 8
/* A block's stack copy (32 KiB, and the Python walk) is taken for one
 * block in PP_BLOCK_SAMPLE of a thread, or sooner when the thread's last
 * copy is PP_BLOCK_COPY_GAP_NS old: a thread that blocks a few times a
 * window (the training loop waiting for its next batch) still has its
 * blocks copied. Each copy weighs the blocks it stands for. */
#define PP_BLOCK_COPY_GAP_NS 20000000ull
#define PP_WAIT_SAMPLE 8
#define PP_STACK_UNSAMPLED (-1000)

#define PP_THREAD_EXITED 1u
/* Has booked, in the current attribution window, the stretch its close
 * cut: nothing more counts for it there. */
#define PP_THREAD_BOOKED 2u
/* Its block in progress has a stack copy in block_copies (probe.bpf.c). */
#define PP_THREAD_BLOCK_COPY 4u

/* A followed file descriptor (the fds map's value). The user stack at a
 * read names the op reading; walking it costs several us, so it is taken
 * at the fd's first read by a thread and reused for that thread's next
 * reads of the fd (another thread walks again). read_tid 0: none yet. */
struct pp_fd {
	__s64 read_stack;
	__u32 read_tid;
	__u32 _pad;
};

struct pp_attr_key {
	__u32 tid;		/* global tid */
	__u32 _pad;
	__u64 node;
	/* The node's model id, -1 when unknown: addresses are reused, and the
	 * ops of a pipeline re-created every epoch swap them, so the address
	 * alone would merge two ops' evidence. */
	__s64 id;
};

struct pp_attr {
	__u64 cpu_ns;
	__u64 io_bytes;
	__u64 stops;
	__u64 _pad;
	struct pp_waits waits;
};

struct pp_site_key {
	__u32 ns_tid;
	__u32 kind;
	__s64 stack_id;
};

struct pp_site {
	__u64 waits;
	__u64 wait_ns;
};

#define PP_PATH_LEN 256
#define PP_STACK_DEPTH 64

enum pp_io_kind {
	PP_IO_OPEN = 1,
	PP_IO_READ = 2,
	PP_IO_CLOSE = 3,
};

/* One file event; `path` is only filled for opens (a read or close event
 * is PP_IO_EVENT_HEAD bytes long). */
struct pp_io_event {
	__u64 mono_ns;
	__u32 ns_tid;
	__u32 kind;
	__s32 fd;
	__u32 _pad;
	__s64 stack_id;
	__s64 ret;		/* bytes read, or the fd opened */
	__u64 dur_ns;
	char path[PP_PATH_LEN];
};

#define PP_IO_EVENT_HEAD 48

/* One stretch of work of a thread for a model node, ended by the node's
 * record_stop (trace.json; only while the stack sampler runs). */
struct pp_span {
	__u64 node;		/* model::Node* */
	__u64 start_ns;		/* bpf_ktime_get_ns */
	__u64 end_ns;
	__u32 ns_tid;
	__u32 _pad;
	__s64 id;		/* the node's model id, -1: unknown */
};

/* procio.bpf.c: the file reads of a process tree (a PyTorch job's
 * training process and every process it starts). One followed process
 * (the procs map's value; key: its tgid in plumber-probe's PID namespace),
 * cumulative since it was followed. Every read is counted once, by its
 * event, or here when its event was lost: user space sums the events it
 * cuts at one instant, so that a process's counts and its files cover the
 * same reads (counters read beside the events would catch the reads in
 * flight at the cut on one side only). */
struct pp_proc_io {
	__u64 bytes;		/* returned by read syscalls on regular files whose event was lost */
	__u64 reads;		/* those read syscalls (that returned > 0) */
	__u64 read_ns;		/* time inside them */
	__u32 parent;		/* the followed process that forked it; 0: added by user space */
	__u32 _pad;
};

/* Every way procio.bpf.c can lose something. Counted per CPU, shown to the
 * user. */
enum pp_tree_drop {
	PP_TREE_DROP_PROC_MAP_FULL = 0,		/* a child not followed */
	PP_TREE_DROP_NO_TASK_STORAGE = 1,	/* a read or an open not counted (no task storage for it) */
	PP_TREE_DROP_RINGBUF_FULL = 2,		/* a file event lost (a read's bytes then count in pp_proc_io) */
	PP_TREE_DROP_NO_NS_PID = 3,		/* a child with no PID in our namespace: not followed */
	PP_TREE_DROP__COUNT = 4,
};

/* A thread inside a futex wait (procio.bpf.c's tree_waits writes one per
 * such thread of the process it iterates): from the call's entry to its
 * return to user space, so the time a woken waiter waits for a core counts
 * too. */
struct pp_futex_wait {
	__u32 tid;		/* in plumber-probe's PID namespace */
	__u32 _pad;
	__u64 uaddr;		/* the futex word */
};

/* One file event of a followed process: a read of a regular file, or the
 * open of one (`path` is filled for opens only: a read event is
 * PP_TREE_IO_HEAD bytes long). */
struct pp_tree_io {
	__u64 mono_ns;
	__u32 tgid;		/* in plumber-probe's PID namespace */
	__u32 tid;
	__u32 kind;		/* PP_IO_OPEN or PP_IO_READ */
	__s32 fd;
	__u64 dev;		/* the file's superblock s_dev, kernel encoding (major << 20 | minor) */
	__u64 ino;
	__s64 ret;		/* bytes read, or the fd opened */
	__u64 dur_ns;
	__s32 dirfd;		/* an open's directory fd (AT_FDCWD: -100) */
	__u32 _pad;
	char path[PP_PATH_LEN];	/* as the open was given it */
};

#define PP_TREE_IO_HEAD 64

#endif
