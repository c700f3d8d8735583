/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The sampled thread's Python frames, read from the interpreter's own
 * structures at the moment of the sample (as py-spy and Austin read them
 * from outside), into a struct ps_sample: for each frame its code object
 * and where in it the frame was. User space (probe/src/python/) names the
 * code objects and computes lines; nothing here dereferences a code object.
 *
 * Offsets come from user space (py_cfg, read-only data set before load:
 * 3.13's _Py_DebugOffsets, a table validated at attach for older
 * versions); py_cfg.interp == 0 turns all of this off, and every read can
 * fail without harm: the sample then carries fewer frames and a flag.
 */
#ifndef PLUMBER_PYTHON_H
#define PLUMBER_PYTHON_H

#include "sample.h"

#define PY_NONE 0xffffffffu
/* 3.12+: the entry frame a C-level call of the eval loop pushes. */
#define PY_OWNED_BY_CSTACK 3
/* Thread states looked at when searching the interpreter's list. */
#define PY_MAX_THREADS 128
/* How long a thread's tstate (or its absence) is trusted, ns: a pool
 * thread of tf.py_function gets a new one at every call. */
#define PY_TSTATE_TTL_NS 200000000ull
/* Bytes of a frame read at once (all the fields the walk needs are in
 * them: probe/src/python/ checks), and the mask that keeps an offset in. */
#define PY_FRAME_READ 128
#define PY_FRAME_MASK 127

/* Mirrored by probe/src/python/config.rs. */
struct py_cfg {
	__u64 interp;		/* the main PyInterpreterState; 0: off */
	__u64 holder_addr;	/* the GIL's last holder (PyThreadState *) */
	__u64 locked_addr;	/* the GIL's locked flag (int) */
	__u32 minor;		/* 3.minor */
	__u32 threads_head;	/* interp: first PyThreadState */
	__u32 ts_next;
	__u32 ts_thread_id;	/* pthread_self() of the thread: its fs base */
	__u32 ts_frame;		/* tstate: current frame, or its _PyCFrame */
	__u32 cframe_frame;	/* _PyCFrame: current frame, or PY_NONE */
	__u32 f_previous;
	__u32 f_code;
	__u32 f_instr;		/* <= 3.10: f_lasti (int); else the instruction pointer */
	__u32 f_owner;		/* 3.12+: owner (char), else PY_NONE */
	__u32 f_is_entry;	/* 3.11: is_entry (bool), else PY_NONE */
	__u32 f_read;		/* bytes of a frame to read: past every field above */
};

const volatile struct py_cfg py_cfg = {};

struct py_tstate_cache {
	__u64 tstate;		/* 0: the thread has none */
	__u64 at_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct py_tstate_cache);
} py_tstates SEC(".maps");

/* What the walk costs the target, read by user space: walks, ns spent in
 * them, frames copied. Per CPU, summed by the reader. */
enum py_stat { PY_STAT_WALKS = 0, PY_STAT_NS = 1, PY_STAT_FRAMES = 2, PY_STAT__COUNT = 3 };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PY_STAT__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} py_stats SEC(".maps");

static __always_inline void py_stat_add(__u32 what, __u64 v)
{
	__u64 *p = bpf_map_lookup_elem(&py_stats, &what);

	if (p)
		*p += v;
}

static __always_inline __u64 py_read_u64(__u64 addr)
{
	__u64 v = 0;

	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

/* The thread state of the current thread, whose pthread id (fs base) is
 * `self`: the GIL holder's when that is this thread (every sample of
 * running Python code), else the one found by the last search of the
 * interpreter's thread list if recent enough and still naming this
 * thread, else a new search. */
static __always_inline __u64 py_thread_state(__u32 tid, __u64 self)
{
	__u64 holder = py_read_u64(py_cfg.holder_addr);
	__u32 locked = 0;

	bpf_probe_read_user(&locked, sizeof(locked), (void *)py_cfg.locked_addr);
	if (locked && holder && py_read_u64(holder + py_cfg.ts_thread_id) == self)
		return holder;

	__u64 now = bpf_ktime_get_ns();
	struct py_tstate_cache *c = bpf_map_lookup_elem(&py_tstates, &tid);

	if (c && now - c->at_ns < PY_TSTATE_TTL_NS) {
		if (!c->tstate)
			return 0;
		if (py_read_u64(c->tstate + py_cfg.ts_thread_id) == self)
			return c->tstate;
	}
	struct py_tstate_cache found = { .tstate = 0, .at_ns = now };
	__u64 ts = py_read_u64(py_cfg.interp + py_cfg.threads_head);

	for (int i = 0; i < PY_MAX_THREADS && ts; i++) {
		if (py_read_u64(ts + py_cfg.ts_thread_id) == self) {
			found.tstate = ts;
			break;
		}
		ts = py_read_u64(ts + py_cfg.ts_next);
	}
	bpf_map_update_elem(&py_tstates, &tid, &found, BPF_ANY);
	return found.tstate;
}

/* Fills s->py*: the current thread's Python frames, innermost first. */
static __always_inline void py_frames(struct ps_sample *s)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	s->py_count = 0;
	s->py_flags = 0;
	s->py_entry = 0;
	if (!py_cfg.interp)
		return;
	__u64 t0 = bpf_ktime_get_ns();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 self = BPF_CORE_READ(task, thread.fsbase);
	__u64 ts = py_thread_state(tid, self);

	if (!ts) {
		py_stat_add(PY_STAT_WALKS, 1);
		py_stat_add(PY_STAT_NS, bpf_ktime_get_ns() - t0);
		return;
	}
	__u64 f = py_read_u64(ts + py_cfg.ts_frame);

	if (f && py_cfg.cframe_frame != PY_NONE)
		f = py_read_u64(f + py_cfg.cframe_frame);
	__u32 n = 0;

	/* One slot per frame read, so the verifier follows one counter.
	 * 3.12+: the eval loop's own entry frames (owned by the C stack) take
	 * a slot with code 0: user space ends a group there. */
	for (n = 0; n < PS_PY_FRAMES && f; n++) {
		/* The frame's head in one read: each read is most of a
		 * field's cost. Offsets are masked into the buffer (user space
		 * keeps them below PY_FRAME_READ anyway). */
		__u8 b[PY_FRAME_READ + 8] = {};
		__u32 len = py_cfg.f_read;
		__u64 code = 0, prev = 0, instr = 0;

		if (len > PY_FRAME_READ)
			len = PY_FRAME_READ;
		if (len < 8 || bpf_probe_read_user(b, len, (void *)f)) {
			s->py_flags |= PS_PY_READ_FAILED;
			break;
		}
		__builtin_memcpy(&code, b + (py_cfg.f_code & PY_FRAME_MASK), 8);
		__builtin_memcpy(&prev, b + (py_cfg.f_previous & PY_FRAME_MASK), 8);
		if (py_cfg.f_owner != PY_NONE &&
		    b[py_cfg.f_owner & PY_FRAME_MASK] == PY_OWNED_BY_CSTACK)
			code = 0;
		if (py_cfg.minor <= 10)
			__builtin_memcpy(&instr, b + (py_cfg.f_instr & PY_FRAME_MASK), 4);
		else
			__builtin_memcpy(&instr, b + (py_cfg.f_instr & PY_FRAME_MASK), 8);
		if (py_cfg.f_is_entry != PY_NONE && b[py_cfg.f_is_entry & PY_FRAME_MASK])
			s->py_entry |= 1ull << n;
		s->py[n].code = code;
		s->py[n].instr = code ? instr : 0;
		f = prev;
	}
	if (f && !(s->py_flags & PS_PY_READ_FAILED))
		s->py_flags |= PS_PY_TRUNCATED;
	s->py_count = n;
	py_stat_add(PY_STAT_WALKS, 1);
	py_stat_add(PY_STAT_NS, bpf_ktime_get_ns() - t0);
	py_stat_add(PY_STAT_FRAMES, n);
}

#endif
