// SPDX-License-Identifier: GPL-2.0
/*
 * File reads of a process tree: a PyTorch job's training process and every
 * process it starts (the DataLoader's workers under fork, spawn and
 * forkserver, the forkserver itself), per process.
 *
 * Which processes: those user space adds to `procs` (the training process
 * and its descendants when the recording starts, workers the loader names),
 * and every child a followed process forks from then on, added here at the
 * fork, before the child runs: a worker's reads count from its first one.
 *
 * Which reads: read, pread64, readv, preadv and preadv2 that return data
 * from a regular file, told by the file the fd names in the kernel at the
 * read's entry (its inode's mode and file system), not by its path: the
 * pipes, sockets and shared memory of the DataLoader's queues are not
 * regular files or are never read() (torch maps its shared tensors), and
 * kernel pseudo-files (/proc, /sys, cgroup, ...) are left out. Files open
 * before the recording, inherited across fork or dup'ed count the same.
 * Opens of regular files send their path, so user space can name the files
 * read (reads send the file's device and inode).
 *
 * Which waits: the threads of a process inside a futex wait, and the
 * word each waits on, when user space asks (`tree_waits`, a task
 * iterator), for the stage sampler to tell a lock or GIL wait at its tick.
 *
 * Attached to the file syscalls' own tracepoints: while any syscall
 * tracepoint is on, every syscall of the machine takes the kernel's
 * tracing path, but these programs run only for the file syscalls and
 * return at once for processes not followed (kprobes are not available on
 * the kernels this runs on, and uprobes on libc would not follow a child
 * before user space saw it).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "plumber.h"
#include "file_syscalls.h"

char LICENSE[] SEC("license") = "GPL";

/* Our PID namespace; 0: the initial one, where global ids are ours. */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_TREE_DROP__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} tree_drops SEC(".maps");

/* Followed processes; user space forgets the ones that ended once it has
 * read their last values. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pp_proc_io);
} procs SEC(".maps");

/* A followed read or open between its entry and its exit, in the thread's
 * own storage. */
struct inflight {
	__u64 start;
	__u64 dev;
	__u64 ino;
	__u64 path;		/* an open's user pointer to its path */
	__u32 tgid;		/* our namespace */
	__u32 tid;
	__s32 nr;
	__s32 fd;		/* a read's fd, an open's dirfd */
	__u32 active;		/* between an entry and its exit */
	__u32 _pad;
};

/* Per thread: no hashing, freed with the thread (a thread killed inside a
 * read leaves nothing behind). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* Drained by user space at each poll (every 0.5 s): a read is 64 bytes,
 * so 8 MiB holds ~130,000 reads, a second of a job reading 4 KiB records
 * at 500 MB/s. Waking the probe more often would cost the job more. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} tree_events SEC(".maps");

#define AT_FDCWD (-100)
#define S_IFMT 00170000
#define S_IFREG 0100000

/* The per-syscall tracepoints' records: the syscall number is an int. */
struct sys_enter_rec {
	__u64 common;
	__s32 nr;
	__u32 _pad;
	__u64 args[6];
};

struct sys_exit_rec {
	__u64 common;
	__s32 nr;
	__u32 _pad;
	__s64 ret;
};

static __always_inline void count_drop(__u32 what)
{
	__u64 *v = bpf_map_lookup_elem(&tree_drops, &what);
	if (v)
		*v += 1;
}

/* The current thread's process and thread ids in our namespace. */
static __always_inline bool current_ids(__u32 *tgid, __u32 *tid)
{
	if (pidns_ino) {
		struct bpf_pidns_info ns = {};

		if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
			return false; /* not in our namespace */
		*tgid = ns.tgid;
		*tid = ns.pid;
		return true;
	}
	__u64 id = bpf_get_current_pid_tgid();
	*tgid = id >> 32;
	*tid = (__u32)id;
	return true;
}

/* How deep below ours a child's PID namespace may be. */
#define MAX_NS_DEPTH 8

/* The id of thread `t` in our namespace (a new process's: it leads its
 * group, its pid is its tgid); 0 when it has none. */
static __always_inline __u32 task_pid_ours(struct task_struct *t)
{
	if (!pidns_ino)
		return BPF_CORE_READ(t, pid);
	struct pid *p = BPF_CORE_READ(t, thread_pid);
	unsigned int level = BPF_CORE_READ(p, level);

	for (__u32 i = 0; i < MAX_NS_DEPTH; i++) {
		struct upid u = {};

		if (i > level)
			break;
		if (bpf_core_read(&u, sizeof(u), &p->numbers[i]))
			break;
		if (BPF_CORE_READ(u.ns, ns.inum) == (unsigned int)pidns_ino)
			return u.nr;
	}
	return 0;
}

/* Kernel pseudo-files are regular files too; they are not input data. */
static __always_inline bool pseudo_fs(unsigned long magic)
{
	switch (magic) {
	case 0x9fa0:		/* proc */
	case 0x62656572:	/* sysfs */
	case 0x27e0eb:		/* cgroup */
	case 0x63677270:	/* cgroup2 */
	case 0x64626720:	/* debugfs */
	case 0x74726163:	/* tracefs */
	case 0x73636673:	/* securityfs */
	case 0xcafe4a11:	/* bpf */
	case 0x62656570:	/* configfs */
	case 0x6165676c:	/* pstore */
	case 0xde5e81e4:	/* efivarfs */
	case 0xf97cff8c:	/* selinuxfs */
	case 0x6e736673:	/* nsfs */
		return true;
	}
	return false;
}

/* Whether the current task's `fd` names a regular file worth counting;
 * its device and inode. */
static __always_inline bool regular_file(__s32 fd, __u64 *dev, __u64 *ino)
{
	if (fd < 0)
		return false;
	/* Typed kernel pointers: plain loads (a faulting one reads 0), not a
	 * helper call each. */
	struct task_struct *t = bpf_get_current_task_btf();
	struct fdtable *fdt = t->files->fdt;
	if (!fdt || (__u32)fd >= fdt->max_fds)
		return false;
	struct file *raw = NULL;
	if (bpf_probe_read_kernel(&raw, sizeof(raw), &fdt->fd[fd]) || !raw)
		return false;
	struct file *f = bpf_core_cast(raw, struct file);
	struct inode *in = f->f_inode;
	if (!in || (in->i_mode & S_IFMT) != S_IFREG)
		return false;
	struct super_block *sb = in->i_sb;
	if (pseudo_fs(sb->s_magic))
		return false;
	*dev = sb->s_dev;
	*ino = in->i_ino;
	return true;
}

static __always_inline int begin(struct inflight *v)
{
	struct inflight *slot = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0,
						     BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!slot) {
		count_drop(PP_TREE_DROP_NO_TASK_STORAGE);
		return 0;
	}
	v->start = bpf_ktime_get_ns();
	v->active = 1;
	*slot = *v;
	return 0;
}

SEC("tracepoint")
int tree_sys_enter(struct sys_enter_rec *ctx)
{
	__s32 nr = ctx->nr;
	/* Both loaded up front, as they are: a load through a pointer into
	 * the record that clang picks at run time is refused. */
	__u64 a0 = ctx->args[0], a1 = ctx->args[1];
	struct inflight v = {};

	barrier_var(a0);
	barrier_var(a1);
	if (!is_read_nr(nr) && !is_open_nr(nr))
		return 0;
	if (!current_ids(&v.tgid, &v.tid) || !bpf_map_lookup_elem(&procs, &v.tgid))
		return 0;
	v.nr = nr;
	if (is_read_nr(nr)) {
		v.fd = (__s32)a0;
		if (!regular_file(v.fd, &v.dev, &v.ino))
			return 0;
		return begin(&v);
	}
	/* open(path, ...); openat and openat2(dirfd, path, ...). */
	v.fd = nr == NR_open ? AT_FDCWD : (__s32)a0;
	v.path = nr == NR_open ? a0 : a1;
	return begin(&v);
}

static __always_inline struct pp_tree_io *event(__u32 size, const struct inflight *v, __u32 kind,
						__u64 now)
{
	struct pp_tree_io *e = bpf_ringbuf_reserve(&tree_events, size, 0);
	if (!e) {
		count_drop(PP_TREE_DROP_RINGBUF_FULL);
		return 0;
	}
	e->mono_ns = now;
	e->tgid = v->tgid;
	e->tid = v->tid;
	e->kind = kind;
	e->dur_ns = now - v->start;
	e->_pad = 0;
	return e;
}

static __always_inline int read_done(const struct inflight *v, __s64 ret, __u64 now)
{
	if (ret <= 0)
		return 0;
	struct pp_tree_io *e = event(PP_TREE_IO_HEAD, v, PP_IO_READ, now);
	if (!e) {
		/* Counted here instead: the totals stay exact. */
		struct pp_proc_io *p = bpf_map_lookup_elem(&procs, &v->tgid);
		if (!p)
			return 0; /* forgotten meanwhile */
		__sync_fetch_and_add(&p->bytes, ret);
		__sync_fetch_and_add(&p->reads, 1);
		__sync_fetch_and_add(&p->read_ns, now - v->start);
		return 0;
	}
	e->fd = v->fd;
	e->dev = v->dev;
	e->ino = v->ino;
	e->ret = ret;
	e->dirfd = 0;
	/* User space drains on its own schedule: no wakeup (an irq_work per
	 * read otherwise). */
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

static __always_inline int open_done(struct inflight *v, __s64 ret, __u64 now)
{
	if (ret < 0 || !regular_file((__s32)ret, &v->dev, &v->ino))
		return 0;
	struct pp_tree_io *e = event(sizeof(*e), v, PP_IO_OPEN, now);
	if (!e)
		return 0;
	e->fd = (__s32)ret;
	e->dev = v->dev;
	e->ino = v->ino;
	e->ret = ret;
	e->dirfd = v->fd;
	if (bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)v->path) < 0)
		e->path[0] = 0;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tracepoint")
int tree_sys_exit(struct sys_exit_rec *ctx)
{
	struct inflight *found = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, 0);
	if (!found || !found->active)
		return 0;
	struct inflight v = *found;
	__u64 now = bpf_ktime_get_ns();

	found->active = 0;
	if (v.nr != ctx->nr)
		return 0; /* an entry whose exit was missed (the thread was killed) */
	if (is_read_nr(v.nr))
		return read_done(&v, ctx->ret, now);
	return open_done(&v, ctx->ret, now);
}

/* A followed process forks: follow the child (not a new thread). Runs in
 * the parent, before the child first runs. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(tree_fork, struct task_struct *parent, struct task_struct *child)
{
	struct pp_proc_io v = {};
	__u32 tgid, tid;

	if (BPF_CORE_READ(child, tgid) == BPF_CORE_READ(parent, tgid))
		return 0;
	if (!current_ids(&tgid, &tid) || !bpf_map_lookup_elem(&procs, &tgid))
		return 0;
	__u32 child_tgid = task_pid_ours(child);
	if (!child_tgid) {
		count_drop(PP_TREE_DROP_NO_NS_PID);
		return 0;
	}
	v.parent = tgid;
	if (bpf_map_update_elem(&procs, &child_tgid, &v, BPF_NOEXIST) &&
	    !bpf_map_lookup_elem(&procs, &child_tgid))
		count_drop(PP_TREE_DROP_PROC_MAP_FULL);
	return 0;
}

/* futex(2) operations that sleep (the command: op without the private
 * and clock flags). */
#define FUTEX_WAIT 0
#define FUTEX_LOCK_PI 6
#define FUTEX_WAIT_BITSET 9
#define FUTEX_WAIT_REQUEUE_PI 11
#define FUTEX_LOCK_PI2 13
#define FUTEX_CMD_MASK 0x7f
#define NR_futex 202
#define ENOSYS 38

static __always_inline bool futex_sleeps(__u64 op)
{
	switch (op & FUTEX_CMD_MASK) {
	case FUTEX_WAIT:
	case FUTEX_LOCK_PI:
	case FUTEX_WAIT_BITSET:
	case FUTEX_WAIT_REQUEUE_PI:
	case FUTEX_LOCK_PI2:
		return true;
	}
	return false;
}

/*
 * The threads of one process inside a futex wait now, for the stage
 * sampler's tick: user space runs it on the process it asks about (a task
 * iterator limited to that process's threads), in its own reads, on the
 * probe's CPU. Nothing runs in the job's futex calls (~5,000 a second on a
 * DataLoader job with one worker, and every other process's on the
 * machine, which two syscall tracepoint programs took ~300 and ~400 ns
 * each on the test VM: half the in-target BPF time of that job).
 *
 * A thread is inside a syscall from its entry to its return: the entry
 * saves the syscall's number in its user registers' orig_ax and sets their
 * ax to -ENOSYS; the return writes the result to ax. So orig_ax == futex
 * and ax == -ENOSYS: inside the call, asleep or woken and not yet run (on
 * a busy machine a tenth of a lock wait and more, which
 * /proc/PID/task/TID/syscall reads as "running"). A thread back in user
 * code keeps its last entry's registers with the result in ax; an
 * interrupt's entry saves its vector as orig_ax and the user's ax, which
 * is -ENOSYS with a vector of 202 only by a coincidence of both.
 */
SEC("iter/task")
int tree_waits(struct bpf_iter__task *ctx)
{
	struct task_struct *t = ctx->task;
	struct pp_futex_wait w = {};

	if (!t)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	if (!regs)
		return 0;
	if (BPF_CORE_READ(regs, orig_ax) != NR_futex ||
	    (long)BPF_CORE_READ(regs, ax) != -ENOSYS || !futex_sleeps(BPF_CORE_READ(regs, si)))
		return 0;
	w.tid = task_pid_ours(t);
	if (!w.tid)
		return 0;
	w.uaddr = BPF_CORE_READ(regs, di);
	bpf_seq_write(ctx->meta->seq, &w, sizeof(w));
	return 0;
}

/* probe/src/bpf/types.rs decodes these by offset. */
_Static_assert(sizeof(struct pp_proc_io) == 32, "pp_proc_io layout");
_Static_assert(sizeof(struct pp_futex_wait) == 16, "pp_futex_wait layout");
_Static_assert(__builtin_offsetof(struct pp_tree_io, path) == PP_TREE_IO_HEAD, "pp_tree_io layout");
