// SPDX-License-Identifier: GPL-2.0
/*
 * plumber-probe's BPF side. Default mode puts nothing on the target's hot
 * path: `discover_getnext` is attached for a fraction of a second to learn
 * live iterator pointers and then detached, and `node_removed` fires only
 * when an iterator is destroyed (per file or per epoch), to keep the final
 * counters of nodes that die between two polls.
 *
 * `getnext_enter`/`getnext_exit` are the fallback (autotune model missing or
 * its layout not derivable): per-call probes, microseconds per hit.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "plumber.h"
#include "target.h"
#include "sample.h"
#include "stack_copy.h"
#include "python.h"
#include "file_syscalls.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct pp_node_layout layout = {};

/* Set by user space once RemoveNode's probe is in: record_stop then keys
 * the evidence by node instance (pp_attr_key.id), and user space deletes a
 * dead node's entries once its RemoveNode event is read. Without that
 * probe the map would keep an entry per node instance. */
volatile __u32 node_ids = 0;
/* Bumped by every RemoveNode: the threads' cached node ids may be stale
 * (a node's address can be reused only after it is removed and freed).
 * Not zero, so that it lives in .data: user space rewrites the whole of
 * .bss to set its flags, which could roll a count there back. */
__u64 node_removals = 1;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_DROP__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} seen_iters SEC(".maps");

/* Drained at every poll (1 s by default): ~8,000 removed nodes' worth. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1024 * 1024);
} events SEC(".maps");

struct frame {
	__u64 iter;
	__u64 eos;
	__u64 start;
	__u64 child_ns;
};

struct thread_stack {
	__u32 depth;
	__u32 _pad;
	struct frame f[PP_MAX_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct thread_stack);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct pp_iter_stats);
} iter_stats SEC(".maps");

/* A zeroed value to insert new per-thread stacks from (too big for the
 * 512-byte BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct thread_stack);
} zero_stack SEC(".maps");

static __always_inline void count_drop(__u32 what)
{
	__u64 *v = bpf_map_lookup_elem(&drops, &what);
	if (v)
		*v += 1;
}

/* The iterator probes. */
#include "probe_getnext.h"

/* ------------------------------------------------------------------------
 * Per-thread CPU, waits, I/O and their attribution to ops (issue 4).
 *
 * CPU: the kernel's own per-thread runtime (se.sum_exec_runtime), read by
 * user space from /proc at each poll, and here when a thread is freed (so
 * threads that live between two polls count too).
 *
 * Attribution windows (250 ms, 5-15 s apart; see probe/src/usage.rs):
 * `record_stop_probe` and `on_switch` are attached. Each
 * model::Node::record_stop(node) call on a thread ends a stretch of work
 * that TensorFlow itself books to `node`; the on-CPU time, waits and reads
 * of that stretch are added to (thread, node), the parts inside the window
 * only (see attr_open_ns). Those totals are only used as ratios per
 * thread. Blocks (a voluntary switch-out to the next switch-in)
 * outside the timed slow paths are condition waits, idle pools or sleeps;
 * they are timed in the windows only, and scaled by user space.
 *
 * uprobe + uretprobe on absl::Mutex::LockSlow (contention) and CPython's
 * take_gil come with each window and stay for a while after it: their
 * waits count only then (`count_waits`), scaled by user space.
 *
 * Always attached, all on rare paths: uprobes on the target's libc file
 * functions, for files the target opened; task free.
 * Measured on the image pipeline: a sched_switch program always attached,
 * raw sys_enter/sys_exit on every syscall and CondVar::WaitCommon probes
 * each cost the target a few % of its CPU per element, hence this design.
 * ------------------------------------------------------------------------ */

/* Bumped by user space at the start of each attribution window. */
volatile __u32 attr_gen = 0;
/* The window's bounds (ktime), set by user space: attr_open_ns once its
 * probes are all in (0 while they are being attached: nothing counts),
 * attr_close_ns when it ends (0 until then). The probes stay a little past
 * the close, so that each thread's stretch in progress at the close is
 * booked, up to the close, to the node of the stop that ends it; likewise
 * the stretch in progress at the open is booked from the open. Cutting
 * those stretches off instead under-counts the ops whose stretches are
 * long (TFRecord's reads read at a third of their CPU). */
volatile __u64 attr_open_ns = 0;
volatile __u64 attr_close_ns = 0;
/* Generation of the lock and GIL probes' attachment, set by user space:
 * even once all are attached, odd while they are being attached or
 * detached (entry and return probes come and go one after the other, an
 * RCU grace period apart for a detach, so entries without returns and
 * returns without entries are expected then).
 * A slow path entered under an earlier attachment may have returned while
 * they were detached. */
volatile __u32 wait_gen = 0;
#define WAITS_SETTLING(gen) ((gen) & 1)
/* Set by user space while lock, condition and GIL waits count in the
 * totals and call sites (the wait part of a window, or always when
 * attribution is continuous). Outside it the probes only mark the thread
 * as being in a slow path (its blocks are not condition waits) and feed
 * the attribution window's per-node split. */
volatile __u32 count_waits = 0;
/* Set by user space when the stack sampler runs: each sampled, counted
 * lock or GIL wait also sends a copy of the user stack at its return, for
 * user space to unwind with .eh_frame (the frame-pointer walk of
 * `user_stack` stops inside libpython and glibc, short of the op). */
volatile __u32 copy_wait_stacks = 0;
/* Of the sampled waits, one in PP_WAIT_COPY_SAMPLE sends its stack: a copy
 * is 32 KiB, and a GIL-bound pipeline samples thousands of waits a second.
 * User space takes only the shape from these stacks; the totals come from
 * the counters. */
#define PP_WAIT_COPY_SAMPLE 8
__u64 wait_copy_tick = 0;
/* Set by user space when the stack sampler runs: record_stop also sends
 * each stretch of work as a span (struct pp_span) for trace.json. */
volatile __u32 trace_spans = 0;
/* The target's tgid as the kernel sees it, learned from its own threads
 * (target_tgid is in our PID namespace, task->tgid is global). */
volatile __u32 target_host_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct pp_thread);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct pp_attr_key);
	__type(value, struct pp_attr);
} attr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct pp_site_key);
	__type(value, struct pp_site);
} lock_sites SEC(".maps");

/* Sampled waits' stack copies (struct ps_sample, PS_FLAG_WAIT); one page
 * unless the sampler runs (user space sizes it before loading). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} wait_samples SEC(".maps");

/* Sampled blocks' stack copies, the same records, in a ring of their own:
 * an attribution part's blocks fill a ring (every pipeline thread sends
 * one every PP_BLOCK_COPY_GAP_NS), and in a shared one the lock and GIL
 * copies of the waits part that follows found no room whenever user space
 * had not drained it in between: the recording then had no GIL stack but
 * the frame-pointer walk's, cut inside libpython. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} block_samples SEC(".maps");

/* Sampled blocks' stack copies, taken when the thread goes to sleep (it is
 * the current task then: its user memory and Python state are readable)
 * and sent to block_samples when it wakes, with the block's length, which
 * only the wake-up knows. Key: global tid; an entry lives from the
 * switch-out to the switch-in (or the task's free). One entry unless the
 * sampler runs (user space sizes it): 33 KiB each, preallocated. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ps_sample);
} block_copies SEC(".maps");

/* A zeroed record, the source of a new block_copies entry (a map update
 * copies a whole value, and 33 KiB does not fit on the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ps_sample);
} block_zero SEC(".maps");

/* Op spans; one page unless the sampler runs (user space sizes it). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} spans SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 8192);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, PP_STACK_DEPTH * sizeof(__u64));
} stack_traces SEC(".maps");

/* Files of the target worth following (opened during the recording, or
 * regular files open at attach time); key: fd. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct pp_fd);
} fds SEC(".maps");

/* Drained at every poll (1 s by default): a read is 48 bytes, so 4 MiB
 * holds ~87,000 reads, ~3 s of a pipeline reading with 4 KiB buffers. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} io_events SEC(".maps");

/* A zeroed pp_thread to create entries from: at 392 bytes it does not fit
 * on the BPF stack beside the callers' own. Never written. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_thread);
} thread_zero SEC(".maps");

static __always_inline struct pp_thread *thread_state(__u32 tid)
{
	struct pp_thread *st = bpf_map_lookup_elem(&threads, &tid);
	if (st)
		return st;
	__u32 zero = 0;
	struct pp_thread *init = bpf_map_lookup_elem(&thread_zero, &zero);
	if (!init)
		return 0;
	if (bpf_map_update_elem(&threads, &tid, init, BPF_NOEXIST) != 0) {
		st = bpf_map_lookup_elem(&threads, &tid);
		if (!st)
			count_drop(PP_DROP_CPU_THREAD_MAP_FULL);
		return st;
	}
	return bpf_map_lookup_elem(&threads, &tid);
}

/* State of the current thread if it belongs to the target. */
static __always_inline struct pp_thread *current_state(void)
{
	__u32 ns_tid = 0;
	if (!target_tid(&ns_tid))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	target_host_tgid = id >> 32;
	struct pp_thread *st = thread_state((__u32)id);
	if (st)
		st->ns_tid = ns_tid;
	return st;
}


#define TASK_DEAD_STATE 0x80

static __always_inline __s64 user_stack(void *ctx);

/* Brings the thread into the current attribution window at its first
 * event there (`running`: it is on a CPU now). Returns the time up to
 * which its stretch in progress counts (now, or the window's close), or 0
 * when nothing it does counts: no window open, or the thread has already
 * booked the stretch the close cut. */
static __always_inline __u64 window_clock(struct pp_thread *st, __u64 now, bool running)
{
	__u64 open = attr_open_ns;
	if (!open || now < open)
		return 0;
	__u32 gen = attr_gen;
	if (st->gen != gen) {
		st->gen = gen;
		st->flags &= ~PP_THREAD_BOOKED;
		st->seg_cpu = 0;
		st->seg_io = 0;
		__builtin_memset(&st->seg, 0, sizeof(st->seg));
		/* A span needs a start seen in the window. */
		st->span_start = 0;
		/* sched_switch is attached before the window opens, so a
		 * thread first seen on a CPU has been on it since the open. */
		st->on_since = running ? open : 0;
	}
	if (st->flags & PP_THREAD_BOOKED)
		return 0;
	__u64 close = attr_close_ns;
	return close && now > close ? close : now;
}

/* The part of [start, now] inside the attribution window. */
static __always_inline __u64 window_part(__u64 start, __u64 now)
{
	__u64 open = attr_open_ns, close = attr_close_ns;
	if (!open)
		return 0;
	__u64 lo = start > open ? start : open;
	__u64 hi = close && now > close ? close : now;
	return hi > lo ? hi - lo : 0;
}

/* On-CPU time of the thread's stretch, up to `end` (0: none counts). */
static __always_inline void add_on_cpu(struct pp_thread *st, __u64 end)
{
	if (end && st->on_since && end > st->on_since)
		st->seg_cpu += end - st->on_since;
}

/* In a timed slow path entered under the current attachment of the wait
 * probes (an older entry's return may have gone unseen). */
static __always_inline bool in_slow_path(const struct pp_thread *st)
{
	return st->wait_depth > 0 && st->wait_gen == wait_gen;
}
static __always_inline void account_wait(struct pp_thread *st, __u32 kind, __u64 start, __u64 now,
					 bool in_window, __s64 stack);

/* A block begins (`prev` is going to sleep, and is the current task):
 * when its copy is due (see PP_BLOCK_COPY_GAP_NS), its user registers,
 * stack and Python frames, as a timer sample would take them, kept until
 * it wakes. Only while the sampler runs and the window counts blocks (one
 * that begins in the tail after the close has no part in it). Called
 * before the block's window generation is stored: a thread's first block
 * in a window does not stand for blocks of the one before. */
static __always_inline void take_block_copy(struct task_struct *prev, struct pp_thread *st,
					    __u64 now)
{
	__u64 close = attr_close_ns;
	if (!copy_wait_stacks || !attr_open_ns || (close && now >= close))
		return;
	if (st->block_gen != attr_gen)
		st->blocks_uncopied = 0;
	st->blocks_uncopied++;
	if (st->blocks_uncopied < PP_BLOCK_SAMPLE && now - st->block_copy_ns < PP_BLOCK_COPY_GAP_NS)
		return;
	__u32 tid = BPF_CORE_READ(prev, pid), zero = 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(prev);
	if (!regs) {
		count_drop(PP_DROP_BLOCK_NO_USER_REGS);
		return;
	}
	struct ps_sample *s = bpf_map_lookup_elem(&block_copies, &tid);
	if (!s) {
		struct ps_sample *z = bpf_map_lookup_elem(&block_zero, &zero);
		if (!z || bpf_map_update_elem(&block_copies, &tid, z, BPF_NOEXIST) != 0) {
			count_drop(PP_DROP_BLOCK_COPY_MAP_FULL);
			return;
		}
		s = bpf_map_lookup_elem(&block_copies, &tid);
		if (!s)
			return;
	}
	/* The block's start: the wake-up sends the copy only for this block. */
	s->mono_ns = now;
	s->ns_tid = st->ns_tid;
	s->flags = PS_FLAG_WAIT | (PP_WAIT_BLOCK << PS_WAIT_KIND_SHIFT);
	/* Where the thread entered the kernel: after its syscall instruction
	 * (a precise ip, as a timer sample's). */
	s->ip = BPF_CORE_READ(regs, ip);
	s->sp = BPF_CORE_READ(regs, sp);
	s->bp = BPF_CORE_READ(regs, bp);
	s->kstack_id = -1;
	/* Until the wake-up: the blocks this copy stands for. */
	s->wait_ns = st->blocks_uncopied;
	s->_pad = 0;
	s->stack_len = copy_stack(s, s->sp);
	if (!s->stack_len)
		count_drop(PP_DROP_WAIT_STACK_COPY_FAILED);
	py_frames(s);
	st->flags |= PP_THREAD_BLOCK_COPY;
	st->blocks_uncopied = 0;
	st->block_copy_ns = now;
}

/* The thread whose block began at `since` runs again: its copy, if it has
 * one for that block, goes to user space weighing `ns` (the block's part
 * in the window, as the counters have it) times the blocks it stands for;
 * the entry is freed either way. */
static __always_inline void send_block_copy(struct pp_thread *st, __u32 tid, __u64 since, __u64 ns)
{
	if (!(st->flags & PP_THREAD_BLOCK_COPY))
		return;
	st->flags &= ~PP_THREAD_BLOCK_COPY;
	struct ps_sample *c = bpf_map_lookup_elem(&block_copies, &tid);
	if (c && ns && since && c->mono_ns == since) {
		struct ps_sample *s = bpf_ringbuf_reserve(&block_samples, sizeof(*s), 0);
		if (s && bpf_probe_read_kernel(s, sizeof(*s), c) == 0) {
			s->wait_ns = ns * s->wait_ns;
			/* Drained at every poll; see the file-event ring buffer. */
			bpf_ringbuf_submit(s, BPF_RB_NO_WAKEUP);
		} else if (s) {
			/* Cannot fail (a map value): not sent half-copied. */
			bpf_ringbuf_discard(s, 0);
		} else {
			count_drop(PP_DROP_BLOCK_SAMPLE_RINGBUF_FULL);
		}
	}
	bpf_map_delete_elem(&block_copies, &tid);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 ns_tid = 0;

	__u32 host = target_host_tgid;
	bool ours = target_tid(&ns_tid);

	/* The tracepoint runs on prev's stack: "current" is prev. */
	if (ours)
		target_host_tgid = BPF_CORE_READ(prev, tgid);
	else if (host && BPF_CORE_READ(prev, tgid) == host)
		/* An exiting thread has already left its PID namespace (the
		 * namespace lookup fails), but its last slice still counts. */
		ours = true;
	if (ours) {
		struct pp_thread *st = thread_state(BPF_CORE_READ(prev, pid));
		if (st) {
			if (ns_tid)
				st->ns_tid = ns_tid;
			st->cpu_ns = BPF_CORE_READ(prev, se.sum_exec_runtime);
			add_on_cpu(st, window_clock(st, now, true));
			st->on_since = 0;
			if (prev_state & TASK_DEAD_STATE) {
				st->flags |= PP_THREAD_EXITED;
			} else if (!preempt && prev_state != 0 && !in_slow_path(st) &&
				   !(st->sys_start && is_read_nr(st->sys_nr))) {
				/* Blocking outside the timed slow paths and file
				 * reads: a condition wait, an idle pool, a sleep. */
				bool sampled = (st->blocks++ % PP_BLOCK_SAMPLE) == 0;

				take_block_copy(prev, st, now);
				st->blocked_since = now;
				st->block_gen = attr_gen;
				st->block_stack = sampled ? user_stack(ctx) : PP_STACK_UNSAMPLED;
			}
		}
	}
	host = target_host_tgid;
	if (host && BPF_CORE_READ(next, tgid) == host) {
		struct pp_thread *st = thread_state(BPF_CORE_READ(next, pid));
		if (st) {
			bool in_window = window_clock(st, now, false) != 0;
			st->on_since = now;
			/* A block that began in an earlier window (the tracepoint
			 * was detached in between) has no known length. */
			__u64 since = st->blocked_since;
			bool known = since && now > since && st->block_gen == attr_gen;

			if (known)
				account_wait(st, PP_WAIT_BLOCK, since, now, in_window,
					     st->block_stack);
			send_block_copy(st, BPF_CORE_READ(next, pid), since,
					known ? window_part(since, now) : 0);
			/* Idle until now: the next span starts here. */
			if (st->blocked_since)
				st->span_start = now;
			st->blocked_since = 0;
		}
	}
	return 0;
}

static __always_inline void add_waits(struct pp_waits *dst, const struct pp_waits *src)
{
	for (int i = 0; i < PP_WAIT__COUNT; i++) {
		dst->ns[i] += src->ns[i];
		dst->n[i] += src->n[i];
	}
}

static __always_inline void send_span(struct pp_thread *st, __u64 node, __s64 id, __u64 now)
{
	__u64 start = st->span_start;
	st->span_start = now;
	if (!start || start >= now)
		return;
	struct pp_span *sp = bpf_ringbuf_reserve(&spans, sizeof(*sp), 0);
	if (!sp) {
		count_drop(PP_DROP_SPAN_RINGBUF_FULL);
		return;
	}
	sp->node = node;
	sp->start_ns = start;
	sp->end_ns = now;
	sp->ns_tid = st->ns_tid;
	sp->_pad = 0;
	sp->id = id;
	/* Drained at every poll: no wakeup (see io_events). */
	bpf_ringbuf_submit(sp, BPF_RB_NO_WAKEUP);
}

/* The model id of `node`, from the thread's cache when no node was
 * removed since it was read; -1 when it cannot be read. */
static __always_inline __s64 node_id(struct pp_thread *st, __u64 node)
{
	__u64 gen = *(volatile __u64 *)&node_removals;
	__u32 slot = ((node >> 4) ^ (node >> 10)) & (PP_ID_CACHE - 1);
	if (st->id_gen != gen) {
		__builtin_memset(st->id_node, 0, sizeof(st->id_node));
		st->id_gen = gen;
	}
	if (st->id_node[slot] == node)
		return st->id_val[slot];
	bool ok = true;
	__s64 id = read_i64(node, layout.id, &ok);
	if (!ok)
		return -1;
	st->id_node[slot] = node;
	st->id_val[slot] = id;
	return id;
}

/* model::Node::record_stop(long now): `this` (the Node) is the first
 * argument. Ends the current stretch of work on this thread. */
SEC("uprobe.multi")
int record_stop_probe(struct pt_regs *ctx)
{
	struct pp_thread *st = current_state();
	if (!st)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 end = window_clock(st, now, true);
	add_on_cpu(st, end);
	/* The thread is running: we are on it. */
	st->on_since = now;
	if (!end)
		return 0;
	/* Past the close: the stretch the close cut ends here, and it is the
	 * thread's last in this window. */
	if (end < now)
		st->flags |= PP_THREAD_BOOKED;
	__u64 node = PT_REGS_PARM1(ctx);
	struct pp_attr_key key = {
		.tid = (__u32)bpf_get_current_pid_tgid(),
		.node = node,
		.id = -1,
	};
	/* The layout is known in the model mode only (id_ is never at 0, the
	 * vtable's place). */
	if (node_ids && layout.id)
		key.id = node_id(st, node);
	if (trace_spans)
		send_span(st, node, key.id, now);
	struct pp_attr *a = bpf_map_lookup_elem(&attr, &key);
	if (!a) {
		struct pp_attr init = {};
		if (bpf_map_update_elem(&attr, &key, &init, BPF_NOEXIST) != 0 &&
		    !bpf_map_lookup_elem(&attr, &key)) {
			count_drop(PP_DROP_ATTR_MAP_FULL);
			return 0;
		}
		a = bpf_map_lookup_elem(&attr, &key);
		if (!a)
			return 0;
	}
	a->cpu_ns += st->seg_cpu;
	a->io_bytes += st->seg_io;
	a->stops += 1;
	add_waits(&a->waits, &st->seg);
	st->seg_cpu = 0;
	st->seg_io = 0;
	__builtin_memset(&st->seg, 0, sizeof(st->seg));
	return 0;
}

/* Lock, condition and GIL waits. */
#include "probe_waits.h"

/* File reads and opens. */
#include "probe_io.h"

/* A freed task: its runtime is final. Keeps the CPU of threads that exit
 * between two polls (sched_switch is only attached in windows). */
SEC("tp_btf/sched_process_free")
int BPF_PROG(on_free, struct task_struct *p)
{
	__u32 host = target_host_tgid;
	if (!host || BPF_CORE_READ(p, tgid) != host)
		return 0;
	struct pp_thread *st = thread_state(BPF_CORE_READ(p, pid));
	if (!st)
		return 0;
	st->cpu_ns = BPF_CORE_READ(p, se.sum_exec_runtime);
	st->flags |= PP_THREAD_EXITED;
	/* A block copy of a thread that never woke again. */
	if (st->flags & PP_THREAD_BLOCK_COPY) {
		__u32 tid = BPF_CORE_READ(p, pid);

		st->flags &= ~PP_THREAD_BLOCK_COPY;
		bpf_map_delete_elem(&block_copies, &tid);
	}
	return 0;
}

/* probe/src/bpf/types.rs decodes these by offset. */
_Static_assert(sizeof(struct pp_thread) == 392, "pp_thread layout");
_Static_assert(sizeof(struct pp_span) == 40, "pp_span layout");
_Static_assert(sizeof(struct pp_attr_key) == 24, "pp_attr_key layout");
_Static_assert(sizeof(struct pp_attr) == 112, "pp_attr layout");
_Static_assert(sizeof(struct pp_site_key) == 16, "pp_site_key layout");
_Static_assert(sizeof(struct pp_fd) == 16, "pp_fd layout");
_Static_assert(__builtin_offsetof(struct pp_io_event, path) == PP_IO_EVENT_HEAD, "pp_io_event layout");
