/* The log-linear histogram of durations that calls (func_stats.hist) and
 * gil (each thread's wait distribution) keep. Values below HIST_LINEAR ns
 * get a bucket each; above, every power of two is split into HIST_SUB
 * buckets, so a bucket is at most 1/8 as wide as its lowest value.
 * An enum, not #defines, so the numbers reach Rust through the skeleton
 * (src/model/latency.rs inverts the buckets from them). */
#ifndef PYTRACE_HISTOGRAM_H
#define PYTRACE_HISTOGRAM_H

enum hist_layout {
	HIST_SUB_BITS = 3,
	HIST_SUB = 1 << HIST_SUB_BITS,
	HIST_LINEAR = 2 * HIST_SUB,
	HIST_MIN_EXP = HIST_SUB_BITS + 1,
	/* calls' last bucket takes every longer call: 2^44 ns is almost 5 hours. */
	HIST_MAX_EXP = 43,
	HIST_BUCKETS = HIST_LINEAR + (HIST_MAX_EXP - HIST_MIN_EXP + 1) * HIST_SUB,
	/* With no last bucket (gil's waits, a sparse map): every __u64 has its own. */
	HIST_UNCLAMPED_MAX_EXP = 63,
	HIST_UNCLAMPED_BUCKETS = HIST_LINEAR + (HIST_UNCLAMPED_MAX_EXP - HIST_MIN_EXP + 1) * HIST_SUB,
};

#endif
