/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stack sampler's ring-buffer record (bpf/sample.bpf.c, and sampled
 * lock and GIL waits of bpf/probe.bpf.c); mirrored by
 * probe/src/sampler/bpf.rs (a test checks the size). Fixed-width fields,
 * explicit padding.
 */
#ifndef PLUMBER_SAMPLE_H
#define PLUMBER_SAMPLE_H

/* Bytes of user stack copied from sp per sample. Deep TF executor stacks
 * and CPython's eval loop need more than perf's default 8 KiB to reach the
 * thread's entry point. */
#define PS_STACK_BYTES 32768
#define PS_KSTACK_DEPTH 64

#define PS_FLAG_IN_KERNEL 1u
/* Not a timer sample: a sampled lock or GIL wait (bpf/probe.bpf.c), taken
 * at the slow path's return: ip is the return address in its caller, and
 * bits 8-15 of flags hold the wait kind (enum pp_wait_kind). */
#define PS_FLAG_WAIT 2u
#define PS_WAIT_KIND_SHIFT 8

/* Python frames copied per sample (bpf/python.h), innermost first. */
#define PS_PY_FRAMES 64
/* py_flags: more frames than PS_PY_FRAMES; a frame could not be read
 * (the chain ends early). */
#define PS_PY_TRUNCATED 1u
#define PS_PY_READ_FAILED 2u

struct ps_sample {
	__u64 mono_ns;
	__u32 ns_tid;		/* tid in plumber-probe's PID namespace */
	__u32 flags;		/* PS_FLAG_* */
	__u64 ip;		/* user registers */
	__u64 sp;
	__u64 bp;
	__s64 kstack_id;	/* kernel stack of kernel-mode samples, else -1 */
	__u64 wait_ns;		/* PS_FLAG_WAIT: how long the wait lasted */
	__u32 stack_len;	/* bytes of `stack` that are valid */
	__u32 _pad;
	__u8 stack[PS_STACK_BYTES];
	/* The thread's Python frames at the sample (bpf/python.h): */
	__u32 py_count;		/* valid entries of py */
	__u32 py_flags;		/* PS_PY_* */
	__u64 py_entry;		/* bit i: py[i] is the outermost frame of its
				 * C-level eval loop call (3.11); 3.12+ marks
				 * the call's entry frame instead: code 0 */
	struct ps_py_frame {
		__u64 code;	/* PyCodeObject* (3.13: f_executable); 0: an
				 * eval loop call's entry frame (3.12+) */
		__u64 instr;	/* <= 3.10: f_lasti; 3.11+: the instruction pointer */
	} py[PS_PY_FRAMES];
};

#define PS_SAMPLE_HEAD 64

/* Every way a sample is lost or degraded. Counted per CPU, shown. */
enum ps_drop {
	PS_DROP_RINGBUF_FULL = 0,
	PS_DROP_STACK_COPY_FAILED = 1,	/* sent with no stack: only the leaf frame */
	PS_DROP_KSTACK_FAILED = 2,
	PS_DROP_NO_USER_REGS = 3,
	PS_DROP__COUNT = 4,
};

#endif
