/* What `pytrace gc` shares between its BPF program and user space. */
#ifndef PYTRACE_GC_H
#define PYTRACE_GC_H

/* CPython's generations (NUM_GENERATIONS in every version). */
#define GC_GENERATIONS 3

/* One garbage collection, sent when it ends. */
struct gc_event {
	__u64 start_ns;    /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u64 duration_ns;
	__s64 collected;   /* gc__done's argument: collected + uncollectable */
	__u32 generation;
	__u32 tid;
};

/* Where, in the target, the watchpoint program finds the collector's state
 * (src/python/layouts/mod.rs says where each comes from). Set by user space
 * once the main interpreter exists, so in .bss, not in read-only config. */
struct gc_watch_target {
	__u64 collecting;   /* address of interp->gc.collecting, the watched int */
	__u64 stats;        /* address of the generations' totals, or of a pointer to them */
	__u32 tgid;
	__u32 stats_indirect;
	/* Per generation, from the totals' start: its first entry; how many
	 * entries its ring has (1: no ring); where the newest one's index is. */
	__u32 generation_items[GC_GENERATIONS];
	__u32 generation_ring[GC_GENERATIONS];
	__u32 generation_index[GC_GENERATIONS];
	/* struct gc_generation_stats: its size and its three counters. */
	__u32 item_size;
	__u32 item_collections;
	__u32 item_collected;
	__u32 item_uncollectable;
};

enum gc_counter {
	GC_EVENT_LOST,       /* ring buffer full: a collection was not sent */
	GC_UNMATCHED_DONE,   /* a collection's end without its start (began before attach) */
	GC_STATS_UNREADABLE, /* watchpoint mode: the totals could not be read; that collection is lost */
	GC_EMPTY_BRACKET,    /* watchpoint mode: `collecting` set and cleared with no collection (3.13+ picked none) */
	GC_MERGED,           /* watchpoint mode: several collections in one bracket, each given the whole pause */
	GC_COUNTER_COUNT,
};

#endif
