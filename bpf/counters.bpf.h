/* Every BPF program counts what it drops or cannot read in a per-CPU array
 * named `counters`, indexed by its header's counter enum; user space sums it
 * (src/tracing/mod.rs: read_counters) and shows every count. */
#ifndef PYTRACE_COUNTERS_BPF_H
#define PYTRACE_COUNTERS_BPF_H

#define DEFINE_COUNTERS(how_many)                                                              \
	struct {                                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                                       \
		__uint(max_entries, how_many);                                                 \
		__type(key, __u32);                                                            \
		__type(value, __u64);                                                          \
	} counters SEC(".maps");                                                               \
                                                                                               \
	/* Per-CPU, and a program does not run twice at once on one CPU. */                   \
	static __always_inline void count(__u32 which)                                        \
	{                                                                                      \
		__u64 *value = bpf_map_lookup_elem(&counters, &which);                         \
                                                                                               \
		if (value)                                                                     \
			*value += 1;                                                           \
	}

#endif
