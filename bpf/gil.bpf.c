// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace gil`: how long each thread of the target held the GIL, waited
 * for it and ran without it, from uprobes on CPython's take_gil and drop_gil
 * (Python/ceval_gil.c), the only two functions through which any thread
 * gets or gives up the GIL. Everything is summed here, per thread; user
 * space reads the maps once, at the end. Nothing is sent per event.
 *
 * A thread's time is cut at four points: take_gil's entry (it starts
 * waiting) and return (it holds the GIL), drop_gil's entry (it stops
 * holding; a forced switch then waits inside drop_gil until the thread
 * that asked has the GIL, which is waiting too) and return (released). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "gil.h"
#include "counters.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The target's process ID, for the exit tracepoint (the uprobes are
 * attached to it alone). */
const volatile __u32 target_tgid = 0;

struct gil_window window = {};

/* The thread that last took the GIL: the GIL is held by one thread at a
 * time, and only the taker writes this, so no atomics are needed. */
__u32 last_holder = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct gil_thread);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct gil_wait_key);
	__type(value, __u64);
} waits SEC(".maps");

DEFINE_COUNTERS(GIL_COUNTER_COUNT);

struct gil_thread _gil_thread = {};
struct gil_wait_key _gil_wait_key = {};
enum gil_counter _gil_counter = 0;
enum gil_state _gil_state = 0;

/* The time of an event inside the session's window, or 0 outside it. */
static __always_inline __u64 now_in_window(void)
{
	__u64 now = bpf_ktime_get_ns(), start = window.start_ns, stop = window.stop_ns;

	if (!start || (stop && now >= stop))
		return 0;
	return now < start ? start : now;
}

/* This thread's record; on its first event, made with the state it must
 * have been in before (`before`), from the session's start or from its
 * creation if that came later. */
static __always_inline struct gil_thread *thread_record(__u32 tid, __u64 now, __u32 before)
{
	struct gil_thread *t = bpf_map_lookup_elem(&threads, &tid);
	struct gil_thread fresh = {};
	struct task_struct *task;
	__u64 created;

	if (t)
		return t;
	task = (struct task_struct *)bpf_get_current_task();
	created = BPF_CORE_READ(task, start_time);
	fresh.first_ns = created > window.start_ns ? created : window.start_ns;
	if (fresh.first_ns > now)
		fresh.first_ns = now;
	fresh.since_ns = fresh.first_ns;
	fresh.state = before;
	if (bpf_map_update_elem(&threads, &tid, &fresh, BPF_NOEXIST) && bpf_map_lookup_elem(&threads, &tid) == NULL) {
		count(GIL_THREADS_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(&threads, &tid);
}

/* Ends the thread's current state at `now`, adding its length to its sum. */
static __always_inline void enter(struct gil_thread *t, __u32 state, __u64 now)
{
	__u64 spent = now > t->since_ns ? now - t->since_ns : 0;

	switch (t->state) {
	case GIL_HELD:
		t->held_ns += spent;
		break;
	case GIL_WAITING:
		t->wait_ns += spent;
		t->pending_wait_ns += spent;
		break;
	case GIL_RELEASED:
		t->released_ns += spent;
		break;
	}
	t->state = state;
	t->since_ns = now;
}

static __always_inline __u32 msb(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) r += 1;
	return r;
}

/* See GIL_SUB_BUCKET_BITS. */
static __always_inline __u32 wait_bucket(__u64 ns)
{
	__u32 top;

	if (ns < (1 << GIL_SUB_BUCKET_BITS))
		return ns;
	top = msb(ns);
	return ((top - GIL_SUB_BUCKET_BITS + 1) << GIL_SUB_BUCKET_BITS) +
	       ((ns >> (top - GIL_SUB_BUCKET_BITS)) & ((1 << GIL_SUB_BUCKET_BITS) - 1));
}

static __always_inline void record_wait(__u32 tid, __u64 ns)
{
	struct gil_wait_key key = { .tid = tid, .bucket = wait_bucket(ns) };
	__u64 one = 1, *n = bpf_map_lookup_elem(&waits, &key);

	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	if (bpf_map_update_elem(&waits, &key, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(&waits, &key);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			count(GIL_HISTOGRAM_FULL);
	}
}

SEC("uprobe")
int take_gil_entry(void *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t;

	if (!now || !(t = thread_record(tid, now, GIL_RELEASED)))
		return 0;
	enter(t, GIL_WAITING, now);
	return 0;
}

SEC("uretprobe")
int take_gil_return(void *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window(), waited;
	struct gil_thread *t;

	if (!now || !(t = thread_record(tid, now, GIL_WAITING)))
		return 0;
	enter(t, GIL_HELD, now);
	waited = t->pending_wait_ns;
	t->pending_wait_ns = 0;
	if (waited > t->max_wait_ns)
		t->max_wait_ns = waited;
	t->acquisitions++;
	if (last_holder != tid)
		t->switches++;
	last_holder = tid;
	record_wait(tid, waited);
	return 0;
}

SEC("uprobe")
int drop_gil_entry(void *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t;

	if (!now || !(t = thread_record(tid, now, GIL_HELD)))
		return 0;
	enter(t, GIL_WAITING, now);
	t->drops++;
	bpf_get_current_comm(t->comm, sizeof(t->comm));
	return 0;
}

SEC("uretprobe")
int drop_gil_return(void *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t;

	if (!now || !(t = thread_record(tid, now, GIL_WAITING)))
		return 0;
	enter(t, GIL_RELEASED, now);
	return 0;
}

/* A thread of the target ends: its time stops there. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(thread_exited, struct task_struct *task)
{
	__u32 tid = task->pid;
	__u64 now;
	struct gil_thread *t;

	if (task->tgid != target_tgid || !(now = now_in_window()))
		return 0;
	t = bpf_map_lookup_elem(&threads, &tid);
	if (!t)
		return 0;
	bpf_get_current_comm(t->comm, sizeof(t->comm));
	enter(t, GIL_EXITED, now);
	t->exit_ns = now;
	return 0;
}
