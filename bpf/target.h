/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The target filter shared by probe.bpf.c and sample.bpf.c (each object
 * gets its own copy of these read-only globals, set by its loader).
 *
 * target_tgid is in the PID namespace of plumber-probe itself, identified
 * by (pidns_dev, pidns_ino), so a probe running in a container filters on
 * the PIDs it sees; the kernel's global tgid would never match there.
 */
#ifndef PLUMBER_TARGET_H
#define PLUMBER_TARGET_H

const volatile __u32 target_tgid = 0;
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

/* Whether the current thread belongs to the target; also gives its tid in
 * our PID namespace. */
static __always_inline bool target_tid(__u32 *ns_tid)
{
	if (pidns_ino) {
		struct bpf_pidns_info ns = {};

		if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
			return false; /* not in our namespace: not our target */
		*ns_tid = ns.pid;
		return ns.tgid == target_tgid;
	}
	__u64 id = bpf_get_current_pid_tgid();
	*ns_tid = (__u32)id;
	return (id >> 32) == target_tgid;
}

static __always_inline bool is_target(void)
{
	__u32 ns_tid;

	return target_tid(&ns_tid);
}

#endif
