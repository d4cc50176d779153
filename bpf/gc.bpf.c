// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace gc`: every garbage collection's generation, pause and number of
 * objects collected. Either CPython's gc__start/gc__done USDT probes, or,
 * on builds without them, a hardware watchpoint on the collector's
 * `collecting` flag (below). One event per collection goes to user space:
 * collections are rare next to calls, and --events wants each one. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "gc.h"
#include "counters.bpf.h"
#include "ring.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct pending {
	__u64 start_ns;
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pending);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES);
} events SEC(".maps");

DEFINE_COUNTERS(GC_COUNTER_COUNT);

struct gc_event _gc_event = {};
enum gc_counter _gc_counter = 0;

static __always_inline void gc_begins(int generation)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pending p = { .start_ns = bpf_ktime_get_ns(), .generation = generation };

	bpf_map_update_elem(&pending, &tid, &p, BPF_ANY);
}

static __always_inline void gc_ends(long collected)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pending *p = bpf_map_lookup_elem(&pending, &tid);
	struct gc_event *ev;

	if (!p) {
		count(GC_UNMATCHED_DONE);
		return;
	}
	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (ev) {
		ev->start_ns = p->start_ns;
		ev->duration_ns = bpf_ktime_get_ns() - p->start_ns;
		ev->collected = collected;
		ev->generation = p->generation;
		ev->tid = tid;
		bpf_ringbuf_submit(ev, ring_submit_flags(&events));
	} else {
		count(GC_EVENT_LOST);
	}
	bpf_map_delete_elem(&pending, &tid);
}

SEC("usdt")
int BPF_USDT(usdt_gc_start, int generation)
{
	gc_begins(generation);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_gc_done, long collected)
{
	gc_ends(collected);
	return 0;
}

/* Builds without those probes: a hardware watchpoint on the main
 * interpreter's gc.collecting, which every version sets to 1 when a
 * collection starts and back to 0 when it ends (3.13+ with an atomic
 * compare-and-exchange, which also writes when it fails). The debug trap
 * comes after the write, so the value read here is the one written. Each
 * generation's running totals (collections, collected, uncollectable),
 * read at the start and at the end, say which generation was collected and
 * how many objects: what gc.callbacks and gc__done report. One perf event
 * per thread (inherited by the threads it starts), so the same trap can
 * reach this program twice: every step below is idempotent. */
struct gc_watch_target target = {};

struct totals {
	__s64 collections[GC_GENERATIONS];
	__s64 objects[GC_GENERATIONS]; /* collected + uncollectable */
};

struct open_collection {
	__u64 start_ns;
	__u64 open; /* 64-bit: clang's BPF target has no 32-bit compare-and-swap before v3 */
	__u32 tid;
	__u32 pad;
	struct totals before;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct open_collection);
} collection SEC(".maps");

/* A generation's newest totals. Non-zero if they cannot be read. */
static __always_inline int read_generation(const char *block, __u32 g, struct totals *t)
{
	__u64 item[3] = {};
	__s8 index = 0;
	__u32 ring, at;

	if (g >= GC_GENERATIONS)
		return -1;
	ring = target.generation_ring[g];
	if (ring > 1) {
		if (bpf_probe_read_user(&index, sizeof(index), block + target.generation_index[g]))
			return -1;
		if (index < 0 || index >= ring)
			return -1;
	}
	at = target.generation_items[g] + (__u32)index * target.item_size;
	/* The three counters are consecutive words in every version. */
	if (target.item_collected != target.item_collections + 8 ||
	    target.item_uncollectable != target.item_collections + 16 ||
	    bpf_probe_read_user(item, sizeof(item), block + at + target.item_collections))
		return -1;
	t->collections[g] = item[0];
	t->objects[g] = item[1] + item[2];
	return 0;
}

static __always_inline int read_totals(struct totals *t)
{
	const char *block = (const char *)target.stats;

	if (target.stats_indirect && bpf_probe_read_user(&block, sizeof(block), (const void *)target.stats))
		return -1;
	if (!block)
		return -1;
	for (__u32 g = 0; g < GC_GENERATIONS; g++)
		if (read_generation(block, g, t))
			return -1;
	return 0;
}

static __always_inline void send_collection(const struct open_collection *c, __u64 end_ns, __u32 g,
					    __s64 objects)
{
	struct gc_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);

	if (!ev) {
		count(GC_EVENT_LOST);
		return;
	}
	ev->start_ns = c->start_ns;
	ev->duration_ns = end_ns - c->start_ns;
	ev->collected = objects;
	ev->generation = g;
	ev->tid = c->tid;
	bpf_ringbuf_submit(ev, ring_submit_flags(&events));
}

/* Moves c->open from `from` to `to` if it holds `from`; says whether it
 * did. `cas`: the kernel has BPF's compare-and-swap (Linux 5.12+); a
 * program that contains one does not load before that, so each program is
 * compiled one way or the other. Without it a plain test and store is
 * enough: the copies of one write run one after the other on the writing
 * thread's CPU, and CPython sets gc.collecting for one collection at a
 * time. */
static __always_inline int move_open(struct open_collection *c, __u64 from, __u64 to, const int cas)
{
	if (cas)
		return __sync_val_compare_and_swap(&c->open, from, to) == from;
	if (c->open != from)
		return 0;
	c->open = to;
	return 1;
}

static __always_inline int on_collecting_written(const int cas)
{
	__u64 id = bpf_get_current_pid_tgid(), now = bpf_ktime_get_ns();
	struct open_collection *c;
	struct totals after = {};
	__u32 zero = 0, changed = 0;
	int value = 0;

	/* The event is inherited by forked children too: only the target counts. */
	if ((__u32)(id >> 32) != target.tgid)
		return 0;
	c = bpf_map_lookup_elem(&collection, &zero);
	if (!c || bpf_probe_read_user(&value, sizeof(value), (const void *)target.collecting))
		return 0;
	if (value) {
		/* A start, or a failed attempt while one runs (the flag stays 1). */
		if (!move_open(c, 0, 1, cas))
			return 0;
		c->start_ns = now;
		c->tid = (__u32)id;
		if (read_totals(&c->before)) {
			count(GC_STATS_UNREADABLE);
			c->open = 0;
		}
		return 0;
	}
	/* An end: only the first of the copies that see it closes it. */
	if (!move_open(c, 1, 0, cas)) {
		count(GC_UNMATCHED_DONE);
		return 0;
	}
	if (read_totals(&after)) {
		count(GC_STATS_UNREADABLE);
		return 0;
	}
	for (__u32 g = 0; g < GC_GENERATIONS; g++) {
		__s64 runs = after.collections[g] - c->before.collections[g];

		if (runs <= 0)
			continue;
		if (runs > 1 || changed)
			count(GC_MERGED);
		changed++;
		send_collection(c, now, g, after.objects[g] - c->before.objects[g]);
	}
	if (!changed)
		count(GC_EMPTY_BRACKET);
	return 0;
}

SEC("perf_event")
int collecting_written(void *ctx)
{
	return on_collecting_written(1);
}

/* The same, for kernels before 5.12. */
SEC("perf_event")
int collecting_written_no_cas(void *ctx)
{
	return on_collecting_written(0);
}

/* A command pytrace starts has no interpreter yet when the watchpoint
 * would be set: stopping it at its first frame evaluation (before any
 * Python code runs) lets user space find the main interpreter then. */
__u32 first_eval_seen = 0;

SEC("uprobe")
int first_eval(void *ctx)
{
	if (first_eval_seen)
		return 0;
	first_eval_seen = 1;
	bpf_send_signal(19 /* SIGSTOP */);
	return 0;
}
