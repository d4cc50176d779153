/* The buckets of bpf/histogram.h, as every BPF program computes them, and
 * as tests run them (bpf/histogram_test.bpf.c, through BPF_PROG_TEST_RUN). */
#ifndef PYTRACE_HISTOGRAM_BPF_H
#define PYTRACE_HISTOGRAM_BPF_H

#include "histogram.h"

/* floor(log2(v)) for v > 0, without a branch: the top bit smeared down,
 * then the ones counted. (Six data-dependent branches here multiplied the
 * states the verifier explores by up to 64 for every call unwind's loop
 * closes, past the 1M-instruction limit on Linux 5.10.) */
static __always_inline __u32 log2_u64(__u64 v)
{
	v |= v >> 1;
	v |= v >> 2;
	v |= v >> 4;
	v |= v >> 8;
	v |= v >> 16;
	v |= v >> 32;
	v -= (v >> 1) & 0x5555555555555555ULL;
	v = (v & 0x3333333333333333ULL) + ((v >> 2) & 0x3333333333333333ULL);
	v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (__u32)((v * 0x0101010101010101ULL) >> 56) - 1;
}

/* The bucket of `ns` nanoseconds; values of 2^(max_exp + 1) and more go to
 * the last bucket below that power. */
static __always_inline __u32 log_linear_bucket(__u64 ns, __u32 max_exp)
{
	__u32 exp;

	if (ns < HIST_LINEAR)
		return ns;
	exp = log2_u64(ns);
	if (exp > max_exp)
		return HIST_LINEAR + (max_exp - HIST_MIN_EXP + 1) * HIST_SUB - 1;
	return HIST_LINEAR + (exp - HIST_MIN_EXP) * HIST_SUB +
	       ((ns >> (exp - HIST_SUB_BITS)) & (HIST_SUB - 1));
}

/* A call's duration, in one of func_stats.hist's HIST_BUCKETS. */
static __always_inline __u32 hist_bucket(__u64 ns)
{
	return log_linear_bucket(ns, HIST_MAX_EXP);
}

/* A GIL wait, in one of HIST_UNCLAMPED_BUCKETS (a key of gil's sparse map). */
static __always_inline __u32 wait_bucket(__u64 ns)
{
	return log_linear_bucket(ns, HIST_UNCLAMPED_MAX_EXP);
}

#endif
