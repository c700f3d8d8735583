/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Copying the top of a user stack into a struct ps_sample (bpf/sample.h),
 * for user-space unwinding with .eh_frame: the stack sampler
 * (sample.bpf.c) and sampled lock and GIL waits (probe.bpf.c).
 */
#ifndef PLUMBER_STACK_COPY_H
#define PLUMBER_STACK_COPY_H

#include "sample.h"

/* Copies the stack from sp up, as much of it as is mapped, up to
 * PS_STACK_BYTES: a read that crosses into unmapped memory fails as a whole
 * (the main thread's stack ends at the top of its mapping), and readable
 * memory ends at a page boundary, so sizes that end on the page boundaries
 * above sp are tried from the largest down. Returns the bytes copied, 0 on
 * failure. */
static __always_inline __u32 copy_stack(struct ps_sample *s, __u64 sp)
{
	__u32 rem = 4096 - (__u32)(sp & 4095);	/* 1..4096: bytes to the next page */

#pragma unroll
	for (int k = PS_STACK_BYTES / 4096 - 1; k >= 0; k--) {
		__u32 n = k * 4096 + rem;

		if (n > PS_STACK_BYTES)
			n = PS_STACK_BYTES;
		if (!bpf_probe_read_user(s->stack, n, (void *)sp))
			return n;
	}
	return 0;
}

#endif
