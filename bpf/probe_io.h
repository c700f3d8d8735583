// SPDX-License-Identifier: GPL-2.0
/*
 * Part of probe.bpf.c, included where it stands there (it uses that file's
 * maps, state and helpers): the target's file reads and opens, from its
 * libc's wrappers or, as fallbacks, the file syscalls' tracepoints or the
 * raw syscall tracepoints. A part of its own so that no BPF source passes
 * ~800 lines.
 */
#ifndef PLUMBER_PROBE_IO_H
#define PLUMBER_PROBE_IO_H

/* "/proc/", "/sys/" or "/dev/" (the same list as usage.rs). */
static __always_inline bool is_pseudo_path(const char *p)
{
	if (p[0] != '/')
		return false;
	if (p[1] == 'p' && p[2] == 'r' && p[3] == 'o' && p[4] == 'c' && p[5] == '/')
		return true;
	if (p[1] == 's' && p[2] == 'y' && p[3] == 's' && p[4] == '/')
		return true;
	return p[1] == 'd' && p[2] == 'e' && p[3] == 'v' && p[4] == '/';
}


static __always_inline void emit_io(struct pp_thread *st, __u32 kind, __s32 fd, __s64 ret,
				    __u64 dur, __s64 stack)
{
	struct pp_io_event *e = bpf_ringbuf_reserve(&io_events, PP_IO_EVENT_HEAD, 0);
	if (!e) {
		count_drop(PP_DROP_IO_RINGBUF_FULL);
		return;
	}
	e->mono_ns = bpf_ktime_get_ns();
	e->ns_tid = st->ns_tid;
	e->kind = kind;
	e->fd = fd;
	e->_pad = 0;
	e->stack_id = stack;
	e->ret = ret;
	e->dur_ns = dur;
	/* User space drains at every poll and never waits on this ring: a
	 * wakeup would only cost an irq_work (a self-IPI, a VM exit under
	 * KVM) per read. */
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* A file syscall starts: remember what is needed at its return. */
static __always_inline int sys_enter(void *ctx, long nr, __u64 a0, __u64 a1)
{
	if (!is_read_nr(nr) && !is_open_nr(nr) && nr != NR_close)
		return 0;
	struct pp_thread *st = current_state();
	if (!st)
		return 0;
	/* Not followed until the end of this function says so. */
	st->sys_nr = 0;
	st->sys_start = 0;
	if (is_read_nr(nr)) {
		__u32 fd = (__u32)a0;
		struct pp_fd *f = bpf_map_lookup_elem(&fds, &fd);
		if (!f)
			return 0;
		st->sys_arg = fd;
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		if (f->read_tid == tid) {
			st->sys_stack = f->read_stack;
		} else {
			st->sys_stack = user_stack(ctx);
			f->read_stack = st->sys_stack;
			f->read_tid = tid;
		}
	} else if (is_open_nr(nr)) {
		st->sys_arg = nr == NR_open ? a0 : a1;
		st->sys_stack = user_stack(ctx);
	} else {
		__u32 fd = (__u32)a0;
		if (!bpf_map_lookup_elem(&fds, &fd))
			return 0;
		bpf_map_delete_elem(&fds, &fd);
		emit_io(st, PP_IO_CLOSE, fd, 0, 0, -1);
		return 0;
	}
	st->sys_nr = nr;
	st->sys_start = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int sys_exit_st(struct pp_thread *st, long nr, long ret)
{
	if (!is_read_nr(nr) && !is_open_nr(nr))
		return 0;
	if (st->sys_nr != nr || !st->sys_start)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 start = st->sys_start;
	__u64 dur = now - start;
	st->sys_nr = 0;
	st->sys_start = 0;
	if (is_read_nr(nr)) {
		if (ret <= 0)
			return 0;
		__u64 end = window_clock(st, now, true);
		account_wait(st, PP_WAIT_IO, start, now, end != 0, -1);
		/* Bytes cannot be split: a read that ends past the close is
		 * not the window's. */
		if (end == now)
			st->seg_io += ret;
		emit_io(st, PP_IO_READ, (__s32)st->sys_arg, ret, dur, st->sys_stack);
		return 0;
	}
	if (ret < 0)
		return 0;
	__u32 fd = (__u32)ret;
	struct pp_fd none = {};
	struct pp_io_event *e = bpf_ringbuf_reserve(&io_events, sizeof(*e), 0);
	if (!e) {
		/* Followed without a path: its reads still count as unnamed. */
		if (bpf_map_update_elem(&fds, &fd, &none, BPF_ANY) != 0)
			count_drop(PP_DROP_FD_MAP_FULL);
		count_drop(PP_DROP_IO_RINGBUF_FULL);
		return 0;
	}
	if (bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)st->sys_arg) < 0)
		e->path[0] = 0;
	/* /proc, /sys and /dev are not input files (TensorFlow's autotune
	 * reads /proc/meminfo all the time). Decided here, at the open's
	 * return: by the time user space could untrack the fd, another thread
	 * may have closed it and opened a real file under the same number. */
	if (is_pseudo_path(e->path)) {
		bpf_map_delete_elem(&fds, &fd);
		bpf_ringbuf_discard(e, 0);
		return 0;
	}
	if (bpf_map_update_elem(&fds, &fd, &none, BPF_ANY) != 0)
		count_drop(PP_DROP_FD_MAP_FULL);
	e->mono_ns = bpf_ktime_get_ns();
	e->ns_tid = st->ns_tid;
	e->kind = PP_IO_OPEN;
	e->fd = (__s32)ret;
	e->_pad = 0;
	e->stack_id = st->sys_stack;
	e->ret = ret;
	e->dur_ns = dur;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

static __always_inline int sys_exit(long nr, long ret)
{
	if (!is_read_nr(nr) && !is_open_nr(nr))
		return 0;
	struct pp_thread *st = current_state();
	if (!st)
		return 0;
	return sys_exit_st(st, nr, ret);
}

/* Default: uprobes on the target's own libc wrappers (read, pread64, readv,
 * preadv*, open*, close), installed in the target's address space only.
 * Enabling any syscall tracepoint instead puts every syscall of every
 * thread on the kernel's slow tracing path (TensorFlow makes tens of
 * thousands of futex calls a second); measured in BENCHMARKS.md. The
 * syscall number stands for the function's kind: the read functions all
 * take the fd first. glibc returns -1 (errno) on failure: same tests. */
SEC("uprobe.multi")
int libc_read_enter(struct pt_regs *ctx)
{
	return sys_enter(ctx, NR_read, PT_REGS_PARM1(ctx), 0);
}
SEC("uprobe.multi")
int libc_open_enter(struct pt_regs *ctx)
{
	return sys_enter(ctx, NR_open, PT_REGS_PARM1(ctx), 0);
}
SEC("uprobe.multi")
int libc_openat_enter(struct pt_regs *ctx)
{
	return sys_enter(ctx, NR_openat, 0, PT_REGS_PARM2(ctx));
}
SEC("uprobe.multi")
int libc_close_enter(struct pt_regs *ctx)
{
	return sys_enter(ctx, NR_close, PT_REGS_PARM1(ctx), 0);
}
/* One return probe for all: the entry left its kind in sys_nr, and
 * sys_start is 0 when the call is not followed (e.g. a read of an fd we do
 * not track; NR_read is 0, so sys_nr cannot tell). */
SEC("uretprobe.multi")
int libc_io_exit(struct pt_regs *ctx)
{
	struct pp_thread *st = current_state();
	if (!st || !st->sys_start)
		return 0;
	return sys_exit_st(st, st->sys_nr, PT_REGS_RC(ctx));
}

/* Fallback where the target's libc cannot be probed (static or unknown
 * libc): the tracepoints of the file syscalls themselves, attached one by
 * one, so at least no other syscall's program runs. */
SEC("tracepoint")
int file_sys_enter(struct trace_event_raw_sys_enter *ctx)
{
	return sys_enter(ctx, ctx->id, ctx->args[0], ctx->args[1]);
}

SEC("tracepoint")
int file_sys_exit(struct trace_event_raw_sys_exit *ctx)
{
	return sys_exit(ctx->id, ctx->ret);
}

/* Fallback without tracefs: the raw syscall tracepoints (every syscall). */
SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long nr)
{
	if (!is_read_nr(nr) && !is_open_nr(nr) && nr != NR_close)
		return 0;
	return sys_enter(ctx, nr, BPF_CORE_READ(regs, di), BPF_CORE_READ(regs, si));
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	return sys_exit(BPF_CORE_READ(regs, orig_ax), ret);
}

#endif
