/* What `pytrace gc` shares between its BPF program and user space. */
#ifndef PYTRACE_GC_H
#define PYTRACE_GC_H

/* One garbage collection, sent when it ends. */
struct gc_event {
	__u64 start_ns;    /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u64 duration_ns;
	__s64 collected;   /* gc__done's argument: collected + uncollectable */
	__u32 generation;
	__u32 tid;
};

enum gc_counter {
	GC_EVENT_LOST,      /* ring buffer full: a collection was not sent */
	GC_UNMATCHED_DONE,  /* a collection's end without its start (began before attach) */
	GC_COUNTER_COUNT,
};

#endif
