// SPDX-License-Identifier: GPL-2.0
/*
 * Part of probe.bpf.c, included where it stands there (it uses that file's
 * maps and helpers): the iterator probes. `discover_getnext` learns live
 * iterators, `gp_warmer` never runs (it pays the RCU grace period of an
 * attach or detach ahead of time), `node_removed` keeps the last counters
 * of a node that dies between two polls, and `getnext_enter` and
 * `getnext_exit` are the per-call fallback. A part of its own so that no
 * BPF source passes ~800 lines.
 */
#ifndef PLUMBER_PROBE_GETNEXT_H
#define PLUMBER_PROBE_GETNEXT_H

/* DatasetBaseIterator::GetNext returns absl::Status through a hidden
 * pointer, so `this` is the second argument. */
SEC("uprobe.multi")
int discover_getnext(struct pt_regs *ctx)
{
	if (!is_target())
		return 0;
	__u64 it = PT_REGS_PARM2(ctx);
	__u64 one = 1;
	__u64 *n = bpf_map_lookup_elem(&seen_iters, &it);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	if (bpf_map_update_elem(&seen_iters, &it, &one, BPF_NOEXIST) != 0 &&
	    !bpf_map_lookup_elem(&seen_iters, &it))
		count_drop(PP_DROP_DISCOVER_MAP_FULL);
	return 0;
}

/* Never runs: user space attaches it to a file the target does not map,
 * just before attaching or detaching a probe the target may be executing
 * (probe/src/bpf/mod.rs, `Bpf::quietly`). Every uprobe registration and
 * removal takes a percpu rwsem for writing, which costs an RCU grace
 * period (~7 ms here) unless one just passed, and it does so while holding
 * the probe's own rwsem: a target thread that hits the breakpoint then
 * blocks in the kernel until the grace period ends. After this probe's
 * registration the next ones find the grace period passed. */
SEC("uprobe")
int gp_warmer(struct pt_regs *ctx)
{
	return 0;
}

static __always_inline __s64 read_i64(__u64 base, __u32 off, bool *ok)
{
	__s64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)(base + off)) != 0)
		*ok = false;
	return v;
}

/* model::Model::RemoveNode(std::shared_ptr<Node> node): a shared_ptr passed
 * by value is passed by invisible reference, so arg1 points at it and the
 * Node* is its first word. */
SEC("uprobe.multi")
int node_removed(struct pt_regs *ctx)
{
	if (!is_target())
		return 0;
	__u64 sp = PT_REGS_PARM2(ctx);
	__u64 node = 0;
	struct pp_retired_event *e;
	bool ok = true;

	__sync_fetch_and_add(&node_removals, 1);

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(PP_DROP_RINGBUF_FULL);
		return 0;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->mono_ns = bpf_ktime_get_ns();
	if (bpf_probe_read_user(&node, sizeof(node), (void *)sp) != 0 || node == 0) {
		e->flags |= PP_RETIRED_READ_FAILED;
		count_drop(PP_DROP_READ_FAILED);
		bpf_ringbuf_submit(e, 0);
		return 0;
	}
	e->node = node;
	e->id = read_i64(node, layout.id, &ok);
	e->num_elements = read_i64(node, layout.num_elements, &ok);
	e->bytes_produced = read_i64(node, layout.bytes_produced, &ok);
	e->bytes_consumed = read_i64(node, layout.bytes_consumed, &ok);
	e->processing_time = read_i64(node, layout.processing_time, &ok);
	e->buffered_elements = read_i64(node, layout.buffered_elements, &ok);
	e->buffered_bytes = read_i64(node, layout.buffered_bytes, &ok);
	e->parent = (__u64)read_i64(node, layout.output, &ok);
	if (e->parent)
		e->parent_id = read_i64(e->parent, layout.id, &ok);

	/* libstdc++ std::string: {char *data; size_t len; ...}. */
	__u64 name_ptr = (__u64)read_i64(node, layout.name, &ok);
	__u64 name_len = (__u64)read_i64(node, layout.name + 8, &ok);
	if (name_len >= PP_NAME_LEN) {
		e->flags |= PP_RETIRED_NAME_TRUNCATED;
		name_len = PP_NAME_LEN - 1;
	}
	e->name_len = name_len;
	if (name_ptr && bpf_probe_read_user(e->name, (name_len & (PP_NAME_LEN - 1)) + 1,
					    (void *)name_ptr) != 0)
		ok = false;
	if (!ok) {
		e->flags |= PP_RETIRED_READ_FAILED;
		count_drop(PP_DROP_READ_FAILED);
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("uprobe.multi")
int getnext_enter(struct pt_regs *ctx)
{
	if (!is_target())
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_stack *st = bpf_map_lookup_elem(&stacks, &tid);
	if (!st) {
		__u32 zero = 0;
		struct thread_stack *z = bpf_map_lookup_elem(&zero_stack, &zero);
		if (!z)
			return 0;
		if (bpf_map_update_elem(&stacks, &tid, z, BPF_NOEXIST) != 0) {
			count_drop(PP_DROP_THREAD_MAP_FULL);
			return 0;
		}
		st = bpf_map_lookup_elem(&stacks, &tid);
		if (!st)
			return 0;
	}
	__u32 d = st->depth;
	if (d >= PP_MAX_DEPTH) {
		/* Still counted as depth so the matching return pops nothing. */
		st->depth = d + 1;
		count_drop(PP_DROP_STACK_OVERFLOW);
		return 0;
	}
	struct frame *f = &st->f[d & (PP_MAX_DEPTH - 1)];
	f->iter = PT_REGS_PARM2(ctx);
	f->eos = PT_REGS_PARM5(ctx);
	f->child_ns = 0;
	f->start = bpf_ktime_get_ns();
	st->depth = d + 1;
	return 0;
}

SEC("uretprobe.multi")
int getnext_exit(struct pt_regs *ctx)
{
	if (!is_target())
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_stack *st = bpf_map_lookup_elem(&stacks, &tid);
	if (!st || st->depth == 0) {
		count_drop(PP_DROP_UNMATCHED_RETURN);
		return 0;
	}
	__u32 d = st->depth - 1;
	st->depth = d;
	if (d >= PP_MAX_DEPTH)
		return 0;
	struct frame *f = &st->f[d & (PP_MAX_DEPTH - 1)];
	__u64 incl = now - f->start;
	__u64 self = incl > f->child_ns ? incl - f->child_ns : 0;
	if (d > 0) {
		struct frame *p = &st->f[(d - 1) & (PP_MAX_DEPTH - 1)];
		p->child_ns += incl;
	}
	__u8 eos = 1;
	if (f->eos)
		bpf_probe_read_user(&eos, sizeof(eos), (void *)f->eos);

	__u64 it = f->iter;
	struct pp_iter_stats *s = bpf_map_lookup_elem(&iter_stats, &it);
	if (!s) {
		struct pp_iter_stats init = {};
		if (bpf_map_update_elem(&iter_stats, &it, &init, BPF_NOEXIST) != 0 &&
		    !bpf_map_lookup_elem(&iter_stats, &it)) {
			count_drop(PP_DROP_STATS_MAP_FULL);
			return 0;
		}
		s = bpf_map_lookup_elem(&iter_stats, &it);
		if (!s)
			return 0;
	}
	__sync_fetch_and_add(&s->calls, 1);
	if (!eos)
		__sync_fetch_and_add(&s->elements, 1);
	__sync_fetch_and_add(&s->self_ns, self);
	__sync_fetch_and_add(&s->incl_ns, incl);
	return 0;
}

#endif
