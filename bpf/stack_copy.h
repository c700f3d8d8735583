/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Copying the top of a user stack into a struct ps_sample (bpf/sample.h),
 * for user-space unwinding with .eh_frame: the stack sampler
 * (sample.bpf.c) and sampled lock and GIL waits (probe.bpf.c).
 */
#ifndef PLUMBER_STACK_COPY_H
#define PLUMBER_STACK_COPY_H

#include "sample.h"

/* Where a thread's readable stack ends, as its last full search found it.
 * Keyed by tid; the task's start time tells a reused tid apart. */
struct stack_end {
	__u64 end;
	__u64 start_time;
};

/* A thread's stack mapping often ends less than PS_STACK_BYTES above sp (a
 * pool thread idles a few KiB below the top of its stack), and a read that
 * crosses into unmapped memory fails as a whole after copying up to the
 * fault: searching down from the largest size costs several partial
 * copies per sample. The end found is kept, so a thread pays for the search
 * once. LRU: threads that are gone age out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct stack_end);
} stack_ends SEC(".maps");

/* Copies the stack from sp up, as much of it as is mapped, up to
 * PS_STACK_BYTES. Returns the bytes copied, 0 on failure.
 *
 * With a known end above sp, one read to it (or PS_STACK_BYTES). Otherwise,
 * or when that read fails (the thread switched stacks), a search: readable
 * memory ends at a page boundary, so sizes that end on the page boundaries
 * above sp are tried from the largest down, and the end is kept when one
 * of them failed. */
static __always_inline __u32 copy_stack(struct ps_sample *s, __u64 sp)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 started = BPF_CORE_READ(task, start_time);
	struct stack_end *known = bpf_map_lookup_elem(&stack_ends, &tid);

	if (known && known->start_time == started && known->end > sp) {
		__u64 n = known->end - sp;

		if (n > PS_STACK_BYTES)
			n = PS_STACK_BYTES;
		if (!bpf_probe_read_user(s->stack, n, (void *)sp))
			return n;
	}

	__u32 rem = 4096 - (__u32)(sp & 4095);	/* 1..4096: bytes to the next page */

#pragma unroll
	for (int k = PS_STACK_BYTES / 4096 - 1; k >= 0; k--) {
		__u32 n = k * 4096 + rem;

		if (n > PS_STACK_BYTES)
			n = PS_STACK_BYTES;
		if (!bpf_probe_read_user(s->stack, n, (void *)sp)) {
			/* A larger size failed before: the page at sp + n is
			 * not readable, so that is where the stack ends. */
			if (k < PS_STACK_BYTES / 4096 - 1) {
				struct stack_end e = { .end = sp + n, .start_time = started };

				bpf_map_update_elem(&stack_ends, &tid, &e, BPF_ANY);
			}
			return n;
		}
	}
	return 0;
}

#endif
