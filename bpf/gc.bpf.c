// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace gc`: every garbage collection's generation, pause and number of
 * objects collected. Either CPython's gc__start/gc__done USDT probes, or,
 * on builds without them, a uprobe session on gc_collect_main (its second
 * argument is the generation, its return value what gc__done reports). One
 * event per collection goes to user space: collections are rare next to
 * calls, and --events wants each one. */
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

extern bool bpf_session_is_return(void) __ksym __weak;

/* gc_collect_main's entry and return, as one uprobe session (Linux 6.13+)... */
SEC("uprobe.session")
int BPF_UPROBE(gc_collect_main, void *tstate, int generation)
{
	if (bpf_session_is_return())
		gc_ends(PT_REGS_RC(ctx));
	else
		gc_begins(generation);
	return 0;
}

/* ...or, on older kernels, a uprobe and a uretprobe. */
SEC("uprobe")
int BPF_UPROBE(gc_collect_main_entry, void *tstate, int generation)
{
	gc_begins(generation);
	return 0;
}

SEC("uretprobe")
int BPF_URETPROBE(gc_collect_main_return, long collected)
{
	gc_ends(collected);
	return 0;
}
