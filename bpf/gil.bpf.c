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
#include "python_read.bpf.h"
#include "histogram.bpf.h" /* wait_bucket */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The target's process ID, for the exit tracepoint (the uprobes are
 * attached to it alone). */
const volatile __u32 target_tgid = 0;

/* The version's offsets, to read a thread's running code object. */
const volatile struct py_layout layout = {};

/* A stripped build's drops (src/python/probes/gil_sites.rs): the offsets in the
 * GIL of the condition variable drop_gil signals as it lets go and of the
 * one a forced switch waits on; and, 3.12+, of the pointer to its GIL in
 * an interpreter (PY_NO_FIELD before: the runtime's one GIL is known_gil). */
const volatile __u32 gil_cond_offset = 0;
const volatile __u32 gil_switch_cond_offset = 0;
const volatile __u32 interp_gil_offset = PY_NO_FIELD;

/* The GIL last asked for by any thread, for a thread that lets go before
 * it was seen asking; to 3.11, the runtime's GIL, set by user space. */
__u64 known_gil = 0;

struct gil_window window = {};

struct gil_holder_period periods[GIL_HOLDER_RING] = {};
__u32 next_period = 0;

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

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct gil_function);
} functions SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct gil_blame_key);
	__type(value, __u64);
} blame SEC(".maps");

DEFINE_COUNTERS(GIL_COUNTER_COUNT);

struct gil_thread _gil_thread = {};
struct gil_wait_key _gil_wait_key = {};
enum gil_counter _gil_counter = 0;
enum gil_state _gil_state = 0;
struct gil_blame_key _gil_blame_key = {};
struct gil_function _gil_function = {};

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
	fresh.take_since_ns = fresh.first_ns;
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

/* The code object a thread state is running (its innermost Python frame;
 * a C function called from Python leaves its caller's frame current), or 0
 * when none can be read. The address is only read here: user space reads
 * the object, checking that it is one. */
static __always_inline __u64 running_code(__u64 tstate)
{
	const void *frame;
	__u8 owner = 0;

	if (!tstate)
		return 0;
	frame = read_ptr((const void *)tstate, layout.tstate_current);
	if (frame && layout.cframe_current_frame != PY_NO_FIELD)
		frame = read_ptr(frame, layout.cframe_current_frame);
	if (!frame)
		return 0;
	if (layout.frame_owner != PY_NO_FIELD) {
		if (bpf_probe_read_user(&owner, sizeof(owner), (const char *)frame + layout.frame_owner) ||
		    owner >= layout.frame_owned_not_code)
			return 0;
	}
	return PY_CODE_ADDRESS((__u64)read_ptr(frame, layout.frame_code), &layout);
}

static __always_inline void add_to_function(__u64 code, __u64 wait_ns, __u64 held_ns)
{
	struct gil_function fresh = { .wait_ns = wait_ns, .held_ns = held_ns }, *f;

	f = bpf_map_lookup_elem(&functions, &code);
	if (!f) {
		if (!bpf_map_update_elem(&functions, &code, &fresh, BPF_NOEXIST))
			return;
		f = bpf_map_lookup_elem(&functions, &code);
		if (!f) {
			count(GIL_FUNCTIONS_FULL);
			return;
		}
	}
	/* Only what is not zero: clang turns an atomic add of a constant 0
	 * into an atomic OR, which kernels before 5.12 refuse. */
	if (wait_ns)
		__sync_fetch_and_add(&f->wait_ns, wait_ns);
	if (held_ns)
		__sync_fetch_and_add(&f->held_ns, held_ns);
}

/* Adds `ns` to the blame of the holder's code for the waiter's. A global
 * function with only scalar arguments (what Linux 5.10 allows), checked
 * once: inlined into blame_holders' loop, its branches were checked again
 * in each of GIL_HOLDER_RING steps. */
__noinline long add_blame(__u64 waiter_code, __u64 holder_code, __u64 ns)
{
	struct gil_blame_key key = { .waiter_code = waiter_code, .holder_code = holder_code };
	__u64 *sum = bpf_map_lookup_elem(&blame, &key);

	if (!sum) {
		if (!bpf_map_update_elem(&blame, &key, &ns, BPF_NOEXIST))
			return 0;
		sum = bpf_map_lookup_elem(&blame, &key);
		if (!sum) {
			count(GIL_BLAME_FULL);
			return 0;
		}
	}
	__sync_fetch_and_add(sum, ns);
	return 0;
}

/* A wait from `from` to `to` in `waiter_code`: each holding period that
 * overlaps it blames its holder's code for the overlap. The newest periods
 * first, back to the first that ended before the wait began. */
static __always_inline void blame_holders(__u64 waiter_code, __u64 from, __u64 to)
{
	__u32 newest = next_period, i;

	for (i = 0; i < GIL_HOLDER_RING; i++) {
		struct gil_holder_period *p = &periods[(newest - 1 - i) & (GIL_HOLDER_RING - 1)];
		__u64 lo, hi;

		if (p->end_ns <= from)
			return;
		lo = p->start_ns > from ? p->start_ns : from;
		hi = p->end_ns < to ? p->end_ns : to;
		if (hi > lo)
			add_blame(waiter_code, p->code, hi - lo);
	}
	count(GIL_BLAME_TRUNCATED);
}

SEC("uprobe")
int BPF_UPROBE(take_gil_entry, void *tstate)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t;

	if (!now || !(t = thread_record(tid, now, GIL_RELEASED)))
		return 0;
	if (t->state == GIL_HELD)
		count(GIL_DROP_UNSEEN);
	enter(t, GIL_WAITING, now);
	t->tstate = (__u64)tstate;
	if (interp_gil_offset != PY_NO_FIELD && tstate) {
		void *interp = read_ptr(tstate, layout.tstate_interp);
		__u64 gil = interp ? (__u64)read_ptr(interp, interp_gil_offset) : 0;

		if (gil) {
			t->gil = gil;
			known_gil = gil;
		}
	}
	t->wait_code = running_code((__u64)tstate);
	t->take_since_ns = now;
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
	add_to_function(t->wait_code, waited, 0);
	blame_holders(t->wait_code, t->take_since_ns, now);
	return 0;
}

/* The thread lets go of the GIL at `now`: its holding period ends. */
static __always_inline void let_go(struct gil_thread *t, __u64 now)
{
	if (t->state == GIL_HELD) {
		__u32 slot = next_period;
		struct gil_holder_period *p = &periods[slot & (GIL_HOLDER_RING - 1)];

		p->start_ns = t->since_ns;
		p->end_ns = now;
		p->code = running_code(t->tstate);
		next_period = slot + 1;
		add_to_function(p->code, 0, now > t->since_ns ? now - t->since_ns : 0);
	} else if (t->state == GIL_RELEASED) {
		count(GIL_TAKE_UNSEEN);
	}
	t->drops++;
	bpf_get_current_comm(t->comm, sizeof(t->comm));
}

SEC("uprobe")
int drop_gil_entry(void *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t;

	if (!now || !(t = thread_record(tid, now, GIL_HELD)))
		return 0;
	let_go(t, now);
	enter(t, GIL_WAITING, now);
	t->in_drop = 1;
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
	t->in_drop = 0;
	return 0;
}

/* Whether `addr` is, at `offset`, in the GIL this thread asked for last
 * (or, before it asked in the session, the last GIL any thread asked for). */
static __always_inline bool in_gil(const struct gil_thread *t, __u64 addr, __u32 offset)
{
	__u64 gil = t && t->gil ? t->gil : known_gil;

	return gil && addr == gil + offset;
}

/* A stripped build: pthread_cond_signal's PLT stub. drop_gil signals the
 * GIL's `cond` right after unlocking it, in every copy of it the compiler
 * made: the thread has let go. Inside the out-of-line drop_gil, where one
 * was found and probed, its own probes have counted it. */
SEC("uprobe")
int BPF_UPROBE(gil_cond_signal, void *cond)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t = bpf_map_lookup_elem(&threads, &tid);

	if (!now || (t && t->in_drop) || !in_gil(t, (__u64)cond, gil_cond_offset) || !(t = thread_record(tid, now, GIL_HELD)))
		return 0;
	let_go(t, now);
	enter(t, GIL_RELEASED, now);
	return 0;
}

/* pthread_cond_wait's PLT stub: on the GIL's switch_cond, a forced switch
 * waits until the thread that asked has taken the GIL (what drop_gil's
 * probes count as waiting inside drop_gil). */
SEC("uprobe")
int BPF_UPROBE(gil_switch_wait, void *cond)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t = bpf_map_lookup_elem(&threads, &tid);

	if (!now || (t && t->in_drop) || !in_gil(t, (__u64)cond, gil_switch_cond_offset) || !(t = thread_record(tid, now, GIL_RELEASED)))
		return 0;
	enter(t, GIL_WAITING, now);
	t->switch_wait = 1;
	return 0;
}

SEC("uretprobe")
int gil_switch_wait_return(void *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = now_in_window();
	struct gil_thread *t = bpf_map_lookup_elem(&threads, &tid);

	if (!t || !t->switch_wait)
		return 0;
	t->switch_wait = 0;
	if (now)
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
