// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* bpf/histogram.bpf.h's bucket functions, run as the kernel runs them over
 * values user space sets, so that Rust's tests check the C code itself and
 * not a Rust copy of it (src/model/latency.rs). Loaded only by those tests,
 * on the host, through BPF_PROG_TEST_RUN (a syscall program: Linux 5.14+);
 * pytrace itself never loads it. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "histogram.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define BATCH 1024

/* In: the values; out: their buckets, as calls and gil compute them. */
__u64 values[BATCH];
__u32 hist_buckets[BATCH];
__u32 wait_buckets[BATCH];

enum hist_layout _hist_layout = 0;

SEC("syscall")
int run_buckets(void *ctx)
{
	for (__u32 i = 0; i < BATCH; i++) {
		hist_buckets[i] = hist_bucket(values[i]);
		wait_buckets[i] = wait_bucket(values[i]);
	}
	return 0;
}
