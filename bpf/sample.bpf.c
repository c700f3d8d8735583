// SPDX-License-Identifier: GPL-2.0
/*
 * The stack sampler: a cpu-clock perf event on every CPU runs `sample` at
 * the sampling rate; for a thread of the target it copies the user
 * registers and the top of the user stack to a ring buffer, and user space
 * unwinds it with the libraries' .eh_frame (TensorFlow, glibc and CPython
 * are built without frame pointers, so an in-kernel frame-pointer walk
 * stops after a frame or two).
 *
 * Its own object and skeleton: it shares nothing with probe.bpf.c but the
 * target filter, and loading it is optional (--sample-hz 0).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "sample.h"
#include "stack_copy.h"
#include "target.h"
#include "python.h"

char LICENSE[] SEC("license") = "GPL";

_Static_assert(sizeof(struct ps_sample) ==
	       PS_SAMPLE_HEAD + PS_STACK_BYTES + 16 + 16 * PS_PY_FRAMES,
	       "struct ps_sample layout (probe/src/sampler/bpf.rs reads it)");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PS_DROP__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} sample_drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 4096);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, PS_KSTACK_DEPTH * sizeof(__u64));
} kstacks SEC(".maps");

static __always_inline void count_drop(__u32 what)
{
	__u64 *v = bpf_map_lookup_elem(&sample_drops, &what);
	if (v)
		*v += 1;
}

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	__u32 ns_tid = 0;
	if (!target_tid(&ns_tid))
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	/* The user registers, whether the timer hit user or kernel code: the
	 * pt_regs saved at the last entry into the kernel. */
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs) {
		count_drop(PS_DROP_NO_USER_REGS);
		return 0;
	}
	struct ps_sample *s = bpf_ringbuf_reserve(&samples, sizeof(*s), 0);
	if (!s) {
		count_drop(PS_DROP_RINGBUF_FULL);
		return 0;
	}
	s->mono_ns = bpf_ktime_get_ns();
	s->ns_tid = ns_tid;
	s->flags = 0;
	s->ip = BPF_CORE_READ(regs, ip);
	s->sp = BPF_CORE_READ(regs, sp);
	s->bp = BPF_CORE_READ(regs, bp);
	/* Kernel-mode samples: where in the kernel the thread was. The
	 * interrupted ip tells (x86-64 kernel text is in the upper half); a
	 * narrow read of regs.cs is rejected by the verifier. */
	s->kstack_id = -1;
	s->wait_ns = 0;
	if ((__s64)ctx->regs.ip < 0) {
		s->flags |= PS_FLAG_IN_KERNEL;
		s->kstack_id = bpf_get_stackid(ctx, &kstacks, 0);
		if (s->kstack_id < 0)
			count_drop(PS_DROP_KSTACK_FAILED);
	}
	s->stack_len = copy_stack(s, s->sp);
	if (!s->stack_len)
		count_drop(PS_DROP_STACK_COPY_FAILED);
	py_frames(s);
	/* No wakeup: the worker drains every 50 ms by itself. A wakeup per
	 * sample would be an irq_work (a self-IPI, a VM exit under KVM) in
	 * the target's timer interrupt and a context switch to our thread. */
	bpf_ringbuf_submit(s, BPF_RB_NO_WAKEUP);
	return 0;
}
