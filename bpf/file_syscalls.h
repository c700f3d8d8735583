/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The file syscalls both objects follow (probe.bpf.c's TensorFlow reads,
 * procio.bpf.c's process tree): x86-64 numbers, and which are reads and
 * which opens. The read ones all take the fd first.
 */
#ifndef PLUMBER_FILE_SYSCALLS_H
#define PLUMBER_FILE_SYSCALLS_H

#define NR_read 0
#define NR_open 2
#define NR_close 3
#define NR_pread64 17
#define NR_readv 19
#define NR_openat 257
#define NR_preadv 295
#define NR_preadv2 327
#define NR_openat2 437

static __always_inline bool is_read_nr(long nr)
{
	return nr == NR_read || nr == NR_pread64 || nr == NR_readv || nr == NR_preadv ||
	       nr == NR_preadv2;
}

static __always_inline bool is_open_nr(long nr)
{
	return nr == NR_open || nr == NR_openat || nr == NR_openat2;
}

#endif
