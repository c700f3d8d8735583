// SPDX-License-Identifier: GPL-2.0
/*
 * Part of probe.bpf.c, included where it stands there (it uses that file's
 * maps, state and helpers, and what follows uses it): lock, condition and
 * GIL waits, timed by probes on their slow paths, and the stacks of the
 * sampled ones. A part of its own so that no BPF source passes ~800 lines.
 */
#ifndef PLUMBER_PROBE_WAITS_H
#define PLUMBER_PROBE_WAITS_H

static __always_inline __s64 user_stack(void *ctx)
{
	__s64 id = bpf_get_stackid(ctx, &stack_traces, BPF_F_USER_STACK);
	if (id < 0)
		count_drop(PP_DROP_STACK_ID_FAILED);
	return id;
}

/* A wait from `start` to `now`. The thread's stretch (`in_window`) gets
 * its part inside the attribution window. The totals get all of a lock,
 * condition or GIL wait (while they count) and of a read, and a block's
 * part inside the window (blocks are timed there only). */
static __always_inline void account_wait(struct pp_thread *st, __u32 kind, __u64 start, __u64 now,
					 bool in_window, __s64 stack)
{
	if (kind >= PP_WAIT__COUNT)
		return;
	__u64 part = window_part(start, now);
	if (in_window && part) {
		st->seg.ns[kind] += part;
		st->seg.n[kind] += 1;
	}
	bool slow_path = kind == PP_WAIT_LOCK || kind == PP_WAIT_COND || kind == PP_WAIT_GIL;
	if (slow_path && !count_waits)
		return;
	__u64 ns = kind == PP_WAIT_BLOCK ? part : now - start;
	if (!ns)
		return;
	st->waits.ns[kind] += ns;
	st->waits.n[kind] += 1;
	if (kind == PP_WAIT_IO || stack == PP_STACK_UNSAMPLED)
		return;
	struct pp_site_key key = { .ns_tid = st->ns_tid, .kind = kind, .stack_id = stack };
	struct pp_site *s = bpf_map_lookup_elem(&lock_sites, &key);
	if (!s) {
		struct pp_site init = {};
		if (bpf_map_update_elem(&lock_sites, &key, &init, BPF_NOEXIST) != 0 &&
		    !bpf_map_lookup_elem(&lock_sites, &key)) {
			count_drop(PP_DROP_LOCK_SITE_MAP_FULL);
			return;
		}
		s = bpf_map_lookup_elem(&lock_sites, &key);
		if (!s)
			return;
	}
	s->waits += 1;
	s->wait_ns += ns;
}

static __always_inline int wait_enter(void *ctx, __u32 kind)
{
	struct pp_thread *st = current_state();
	if (!st)
		return 0;
	__u64 sp = PT_REGS_SP((struct pt_regs *)ctx);
	__u32 gen = wait_gen;
	if (st->wait_depth > 0 && st->wait_gen != gen) {
		/* Entered while the probes were attached before; they were
		 * detached before its return. Not a loss: the windows are
		 * scaled by the time they covered. */
		st->wait_depth = 0;
	} else if (st->wait_depth > 0 && sp >= st->wait_sp) {
		/* A nested entry runs deeper on the stack (lower sp). One at
		 * or above the outermost entry's sp means that entry's return
		 * was never seen (the kernel could not set up its return
		 * probe): start over rather than leave the thread stuck. */
		if (!WAITS_SETTLING(gen))
			count_drop(PP_DROP_WAIT_UNMATCHED_ENTRY);
		st->wait_depth = 0;
	}
	/* Only the outermost slow path counts (nested: re-locking inside). */
	if (st->wait_depth++ == 0) {
		st->wait_gen = gen;
		st->wait_sp = sp;
		st->wait_start = bpf_ktime_get_ns();
		st->wait_kind = kind;
		/* Sites are only needed where waits count. */
		st->wait_stack = count_waits && (st->slow_paths++ % PP_WAIT_SAMPLE) == 0 ?
					 user_stack(ctx) :
					 PP_STACK_UNSAMPLED;
	}
	return 0;
}

/* At a sampled wait's return: the caller's registers (the return probe
 * runs with ip at the return address) and its stack. */
static __always_inline void send_wait_sample(struct pt_regs *ctx, struct pp_thread *st,
					     __u32 kind, __u64 ns)
{
	struct ps_sample *s = bpf_ringbuf_reserve(&wait_samples, sizeof(*s), 0);
	if (!s) {
		count_drop(PP_DROP_WAIT_SAMPLE_RINGBUF_FULL);
		return;
	}
	s->mono_ns = bpf_ktime_get_ns();
	s->ns_tid = st->ns_tid;
	s->flags = PS_FLAG_WAIT | (kind << PS_WAIT_KIND_SHIFT);
	s->ip = PT_REGS_IP(ctx);
	s->sp = PT_REGS_SP(ctx);
	s->bp = PT_REGS_FP(ctx);
	s->kstack_id = -1;
	s->wait_ns = ns;
	s->_pad = 0;
	s->stack_len = copy_stack(s, s->sp);
	if (!s->stack_len)
		count_drop(PP_DROP_WAIT_STACK_COPY_FAILED);
	/* At the wait's return: a GIL wait has just taken the GIL. */
	py_frames(s);
	/* Drained at every poll; see the file-event ring buffer. */
	bpf_ringbuf_submit(s, BPF_RB_NO_WAKEUP);
}

static __always_inline int wait_exit(struct pt_regs *ctx)
{
	struct pp_thread *st = current_state();
	if (!st)
		return 0;
	if (st->wait_depth == 0 || st->wait_gen != wait_gen) {
		/* The first return of a thread in an attachment belongs to an
		 * entry before it: expected, every window. A second one means
		 * an entry went unseen. */
		if (st->wait_gen == wait_gen && !WAITS_SETTLING(wait_gen))
			count_drop(PP_DROP_WAIT_UNMATCHED_RETURN);
		st->wait_gen = wait_gen;
		st->wait_depth = 0;
		return 0;
	}
	if (--st->wait_depth == 0 && st->wait_start) {
		__u64 now = bpf_ktime_get_ns();
		__u64 ns = now - st->wait_start;
		bool in_window = window_clock(st, now, true) != 0;
		account_wait(st, st->wait_kind, st->wait_start, now, in_window, st->wait_stack);
		/* Some of the waits the call sites' stacks were taken for. */
		if (copy_wait_stacks && count_waits && st->wait_stack != PP_STACK_UNSAMPLED &&
		    __sync_fetch_and_add(&wait_copy_tick, 1) % PP_WAIT_COPY_SAMPLE == 0)
			send_wait_sample(ctx, st, st->wait_kind, ns);
		st->wait_start = 0;
	}
	return 0;
}

/* Mutex::LockSlow(MuHow how, const Condition *cond, int flags): with a
 * condition (LockWhen, Notification::WaitForNotification) the thread waits
 * for that condition, not for a lock holder. */
SEC("uprobe.multi")
int mutex_enter(struct pt_regs *ctx)
{
	return wait_enter(ctx, PT_REGS_PARM3(ctx) ? PP_WAIT_COND : PP_WAIT_LOCK);
}
SEC("uretprobe.multi")
int mutex_exit(struct pt_regs *ctx) { return wait_exit(ctx); }
SEC("uprobe.multi")
int gil_enter(struct pt_regs *ctx) { return wait_enter(ctx, PP_WAIT_GIL); }
SEC("uretprobe.multi")
int gil_exit(struct pt_regs *ctx) { return wait_exit(ctx); }

#endif
