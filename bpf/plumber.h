/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Event and map value layouts shared by the BPF programs, the LD_PRELOAD shim
 * and Rust (probe/src/bpf/types.rs mirrors them; a test checks the sizes).
 * Fixed-width fields only, explicit padding, so C and #[repr(C)] agree.
 */
#ifndef PLUMBER_H
#define PLUMBER_H

#define PP_NAME_LEN 32
#define PP_MAX_DEPTH 16

/* Offsets into TensorFlow's model::Node, derived at attach time from the
 * target's own libtensorflow_framework (probe/src/layout.rs). */
struct pp_node_layout {
	__u32 id;
	__u32 name;
	__u32 buffered_bytes;
	__u32 buffered_elements;
	__u32 bytes_consumed;
	__u32 bytes_produced;
	__u32 num_elements;
	__u32 processing_time;
	__u32 output;
	__u32 _pad;
};

/* A model::Node leaving the model (Model::RemoveNode): its final counters. */
struct pp_retired_event {
	__u64 mono_ns;
	__u64 node;
	__s64 id;
	__u64 parent;
	__s64 parent_id;
	__s64 num_elements;
	__s64 bytes_produced;
	__s64 bytes_consumed;
	__s64 processing_time;
	__s64 buffered_elements;
	__s64 buffered_bytes;
	__u32 name_len;
	__u32 flags;
	char name[PP_NAME_LEN];
};

#define PP_RETIRED_NAME_TRUNCATED 1u
#define PP_RETIRED_READ_FAILED 2u

/* Fallback mode: per-iterator GetNext counts (key: iterator `this`). */
struct pp_iter_stats {
	__u64 calls;
	__u64 elements;
	__u64 self_ns;
	__u64 incl_ns;
};

/* Every way an event can be lost. Counted per CPU, shown to the user. */
enum pp_drop {
	PP_DROP_RINGBUF_FULL = 0,
	PP_DROP_READ_FAILED = 1,
	PP_DROP_DISCOVER_MAP_FULL = 2,
	PP_DROP_STACK_OVERFLOW = 3,
	PP_DROP_UNMATCHED_RETURN = 4,
	PP_DROP_STATS_MAP_FULL = 5,
	PP_DROP_THREAD_MAP_FULL = 6,
	PP_DROP__COUNT = 7,
};

#endif
