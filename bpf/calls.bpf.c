// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace calls`: exact per-function call counts, inclusive and exclusive
 * time and latency histograms, aggregated in the kernel.
 *
 * Two ways in, one aggregation:
 *  - uprobe mode: one uprobe session on _PyEval_EvalFrameDefault (entry and
 *    return in one program and one link). The frame's code object
 *    identifies the function. Why a session: see eval_frame below.
 *  - usdt mode: CPython's function__entry / function__return probes.
 * Each thread keeps a shadow stack of its open calls (start time, time spent
 * in callees) so that self time is exact; per-function totals live in a
 * hash map shared by every CPU (updated atomically) that user space reads at
 * the end. User space hears about a
 * function once, when it is first seen, through a ring buffer. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/usdt.bpf.h>
#include "calls.h"
#include "counters.bpf.h"
#include "ring.bpf.h"
#include "python_read.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct calls_config cfg = {};

/* Set at the first frame evaluation, so the target is stopped only once. */
__u32 first_eval_seen = 0;

/* Calls are counted only while user space keeps this non-zero: from the
 * moment the eval-frame hook is set (before it, on 3.11+, calls made from
 * C were seen and inlined ones were not) to the end of the traced window,
 * which comes before the hook is put back and the probes are detached
 * (src/session/calls.rs). Outside the window the programs change nothing,
 * and an entry arms no return probe. */
__u32 counting = 0;

static __always_inline int is_counting(void)
{
	return *(volatile __u32 *)&counting;
}

#define SIGSTOP 19

/* User space closes the calls still open when the window ends (src/tracing/calls.rs). */
struct frame_slot {
	struct func_key key;
	/* The caller's key, when edges are counted: with `key` before it, the
	 * call's struct edge_key in place. Looked up from here, the 48-byte key
	 * never sits on the BPF stack, which Linux 5.10 caps at 512 bytes for a
	 * program and the global functions it calls together. */
	struct func_key caller;
	__u64 frame; /* the interpreter frame's address, 0 in USDT mode */
	__u64 start_ns;
	__u64 child_ns;
	__u64 entries_at_start; /* the thread's `entries` when this call began */
	__u64 switches_at_start; /* the thread's context switches then */
	__u32 flags;
	__u32 children; /* evaluations entered directly from this call */
};

_Static_assert(__builtin_offsetof(struct frame_slot, caller) == sizeof(struct func_key) &&
		       __builtin_offsetof(struct edge_key, caller) == sizeof(struct func_key),
	       "a slot's key and caller are its edge_key");

struct thread_stack {
	/* Open calls, including those past MAX_DEPTH that have no slot. */
	__u32 depth;
	__u32 pad;
	/* Evaluations entered on this thread. */
	__u64 entries;
	/* The thread's PyThreadState, from its last frame evaluation: a probe
	 * inside the eval loop has none at hand to find the running frame. */
	__u64 tstate;
	struct frame_slot slots[MAX_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS);
	__type(key, struct func_key);
	__type(value, struct func_stats);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_THREADS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct thread_stack);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES);
} new_functions SEC(".maps");

/* The live processes the target forked while traced, and their forks: PID
 * to parent PID. They inherit the eval-frame hook; user space reads this
 * map as it polls and restores the hook in them too. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CHILDREN);
	__type(key, __u32);
	__type(value, __u32);
} children SEC(".maps");

/* Caller->callee pairs (`calls --pstats` only: user space shrinks the map
 * to one entry otherwise). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_EDGES);
	__type(key, struct edge_key);
	__type(value, struct edge_stats);
} edges SEC(".maps");

DEFINE_COUNTERS(CALLS_COUNTER_COUNT);

/* Zeroed templates: the values are too large for the 512-byte BPF stack. */
struct zeroes {
	struct func_stats stats;
	struct edge_stats edge;
	struct thread_stack stack;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct zeroes);
} zero SEC(".maps");

/* The skeleton emits these types for Rust only if something uses them. */
struct new_function _new_function = {};
struct edge_key _edge_key = {};
struct edge_stats _edge_stats = {};
enum calls_counter _calls_counter = 0;
enum slot_flag _slot_flag = 0;
enum str_kind _str_kind = 0;

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

static __always_inline __u32 hist_bucket(__u64 ns)
{
	__u32 exp;

	if (ns < HIST_LINEAR)
		return ns;
	exp = log2_u64(ns);
	if (exp > HIST_MAX_EXP)
		return HIST_BUCKETS - 1;
	return HIST_LINEAR + (exp - HIST_MIN_EXP) * HIST_SUB +
	       ((ns >> (exp - HIST_SUB_BITS)) & (HIST_SUB - 1));
}

static __always_inline int same_key(const struct func_key *a, const struct func_key *b)
{
	return a->id == b->id && a->aux == b->aux && a->line == b->line;
}

static __always_inline struct thread_stack *thread_stack(__u32 tid, int create)
{
	struct thread_stack *stack = bpf_map_lookup_elem(&stacks, &tid);
	__u32 zero_key = 0;
	struct zeroes *z;

	if (stack || !create)
		return stack;
	z = bpf_map_lookup_elem(&zero, &zero_key);
	if (!z)
		return 0;
	if (bpf_map_update_elem(&stacks, &tid, &z->stack, BPF_NOEXIST) && 
	    !bpf_map_lookup_elem(&stacks, &tid)) {
		count(CALLS_THREAD_MAP_FULL);
		return 0;
	}
	return bpf_map_lookup_elem(&stacks, &tid);
}

/* Finds or creates the function's statistics; a new function is announced. */
static __always_inline struct func_stats *function_stats(const struct func_key *key,
							 int *is_new)
{
	struct func_stats *st = bpf_map_lookup_elem(&stats, key);
	__u32 zero_key = 0;
	struct zeroes *z;

	*is_new = 0;
	if (st)
		return st;
	z = bpf_map_lookup_elem(&zero, &zero_key);
	if (!z)
		return 0;
	if (bpf_map_update_elem(&stats, key, &z->stats, BPF_NOEXIST) == 0)
		*is_new = 1;
	st = bpf_map_lookup_elem(&stats, key);
	if (!st)
		count(CALLS_FUNCTION_MAP_FULL);
	return st;
}

/* Whether the function is among the first `depth` calls of the stack.
 * Loops here are plain bounded loops, not bpf_loop (Linux 5.17+): every
 * kernel since 5.3 verifies them, and they cost less per iteration. */
static __always_inline int on_stack(struct thread_stack *stack, const struct func_key *key, __u32 depth)
{
	for (__u32 i = 0; i < MAX_DEPTH; i++) {
		if (i >= depth)
			return 0;
		if (same_key(&stack->slots[i].key, key))
			return 1;
	}
	return 0;
}

/* on_stack for the thread `tid`, as a global function with only scalar
 * arguments, verified once: for calls with no slot of their own. */
__noinline long function_open_below(__u32 tid, __u32 depth, __u64 id, __u64 aux, __u32 line)
{
	struct thread_stack *stack = bpf_map_lookup_elem(&stacks, &tid);
	struct func_key key = { .id = id, .aux = aux, .line = line };

	return stack ? on_stack(stack, &key, depth) : 0;
}

/* Whether a call of the function (callee_id, callee_aux, callee_line) in
 * slot `depth` repeats a caller->callee pair already open below it on the
 * stack: cProfile counts such a call of the edge as recursive, not
 * primitive. A global function with only scalar arguments, checked once
 * (like unwind_step below) wherever it is called. */
__noinline long edge_open_below(__u32 tid, __u32 depth, __u64 callee_id, __u64 callee_aux, __u32 callee_line)
{
	struct thread_stack *stack = bpf_map_lookup_elem(&stacks, &tid);
	struct func_key caller, callee = { .id = callee_id, .aux = callee_aux, .line = callee_line };
	__u32 below = (depth - 1) & (MAX_DEPTH - 1);

	barrier_var(below); /* keeps the mask (see time_edge) */
	if (!stack || depth == 0 || depth > MAX_DEPTH)
		return 0;
	caller = stack->slots[below].key;
	for (__u32 i = 0; i + 1 < MAX_DEPTH; i++) {
		if (i + 1 >= depth)
			break;
		if (same_key(&stack->slots[i].key, &caller) && same_key(&stack->slots[i + 1].key, &callee))
			return 1;
	}
	return 0;
}

/* The statistics of an edge, created if new (0 if the map is full). */
static __always_inline struct edge_stats *edge_entry(const struct edge_key *key)
{
	struct edge_stats *es = bpf_map_lookup_elem(&edges, key);
	__u32 zero_key = 0;
	struct zeroes *z;

	if (es)
		return es;
	z = bpf_map_lookup_elem(&zero, &zero_key);
	if (!z)
		return 0;
	bpf_map_update_elem(&edges, key, &z->edge, BPF_NOEXIST);
	es = bpf_map_lookup_elem(&edges, key);
	if (!es)
		count(CALLS_EDGE_MAP_FULL);
	return es;
}

/* Counts the call in `slot`, at stack depth `depth` (> 0), on its
 * caller->callee edge, and marks the slot so that its return times the
 * edge. `recursive`: a call of the callee is open below. */
static __always_inline void count_edge(__u32 tid, __u32 depth, const struct func_key *caller, struct frame_slot *slot,
				       int recursive)
{
	struct edge_stats *es;

	slot->caller = *caller;
	es = edge_entry((const struct edge_key *)&slot->key);
	if (!es)
		return;
	__sync_fetch_and_add(&es->calls, 1);
	slot->flags |= SLOT_EDGE;
	/* Only a recursive call of the callee can repeat an open pair. */
	if (recursive && edge_open_below(tid, depth, slot->key.id, slot->key.aux, slot->key.line))
		return;
	__sync_fetch_and_add(&es->primitive_calls, 1);
	slot->flags |= SLOT_EDGE_OUTERMOST;
}

/* The slot below stack depth `depth`: the caller of a call made there. */
static __always_inline struct frame_slot *caller_slot(struct thread_stack *stack, __u32 depth)
{
	__u32 parent;

	if (depth == 0 || depth > MAX_DEPTH)
		return 0;
	parent = depth - 1;
	/* Hides the check above from clang, so the mask below stays: the
	 * verifier cannot follow a check made on a copy. */
	barrier_var(parent);
	return &stack->slots[parent & (MAX_DEPTH - 1)];
}

/* A call run inline, with no slot (inlined_init, skipped_close): counted
 * like any other call, on its function and its edge, untimed. */
static __always_inline void count_untimed_call(const struct func_key *key, struct func_stats *st)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_stack *stack = thread_stack(tid, 0);
	int recursive = stack && function_open_below(tid, stack->depth, key->id, key->aux, key->line);
	struct frame_slot *caller;

	struct edge_key edge;
	struct edge_stats *es;

	__sync_fetch_and_add(&st->calls, 1);
	if (!recursive)
		__sync_fetch_and_add(&st->primitive_calls, 1);
	if (!stack || !cfg.count_edges || stack->depth == 0)
		return;
	caller = caller_slot(stack, stack->depth);
	if (!caller) {
		count(CALLS_EDGE_NO_CALLER);
		return;
	}
	edge.callee = *key;
	edge.caller = caller->key;
	es = edge_entry(&edge);
	if (!es)
		return;
	__sync_fetch_and_add(&es->calls, 1);
	if (!recursive || !edge_open_below(tid, stack->depth, key->id, key->aux, key->line))
		__sync_fetch_and_add(&es->primitive_calls, 1);
}

/* Adds a closing call's times to its edge. */
static __always_inline void time_edge(const struct frame_slot *slot, __u64 elapsed, __u64 self)
{
	struct edge_stats *es = bpf_map_lookup_elem(&edges, (const struct edge_key *)&slot->key);

	if (!es)
		return;
	__sync_fetch_and_add(&es->self_ns, self);
	if (slot->flags & SLOT_EDGE_OUTERMOST)
		__sync_fetch_and_add(&es->total_ns, elapsed);
}

/* How many times the calling thread has left its CPU, either way. */
static __always_inline __u64 context_switches(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	return BPF_CORE_READ(task, nvcsw) + BPF_CORE_READ(task, nivcsw);
}

/* Closes the top call of a thread's stack at `now`. `cas`: the kernel has
 * BPF's compare-and-swap (Linux 5.12+); a program that contains one does
 * not even load before that, so every caller passes a constant and each
 * program is compiled with one way or the other. */
static __always_inline void close_top(struct thread_stack *stack, __u64 now, const int cas)
{
	struct frame_slot *slot;
	struct func_stats *st;
	__u64 elapsed, self;
	__u32 depth, bucket;

	if (stack->depth == 0)
		return;
	depth = stack->depth - 1;
	stack->depth = depth;
	/* Inlined into unwind's loop, clang proves this check redundant and
	 * drops it; the 5.10 verifier cannot follow that proof. */
	barrier_var(depth);
	if (depth >= MAX_DEPTH)
		return;
	slot = &stack->slots[depth];
	/* A generator's creation is no call to cProfile: its time stays in the
	 * caller's self time, as cProfile reports it. */
	if (!(slot->flags & SLOT_COUNTED))
		return;
	if (!(slot->flags & SLOT_RETURNS))
		count(CALLS_INFERRED_RETURN);
	elapsed = now - slot->start_ns;
	self = elapsed > slot->child_ns ? elapsed - slot->child_ns : 0;
	if (depth > 0) {
		__u32 parent = depth - 1;

		barrier_var(parent); /* so the verifier sees the check below */
		if (parent < MAX_DEPTH) {
			stack->slots[parent].child_ns += elapsed;
			if (slot->flags & SLOT_EDGE)
				time_edge(slot, elapsed, self);
		}
	}

	st = bpf_map_lookup_elem(&stats, &slot->key);
	if (!st)
		return;
	__sync_fetch_and_add(&st->timed_calls, 1);
	if (slot->flags & SLOT_OUTERMOST) {
		__sync_fetch_and_add(&st->total_ns, elapsed);
		__sync_fetch_and_add(&st->outermost_calls, 1);
		__sync_fetch_and_add(&st->nested_calls, stack->entries - slot->entries_at_start);
	}
	__sync_fetch_and_add(&st->self_ns, self);
	if (slot->children)
		__sync_fetch_and_add(&st->child_calls, slot->children);
	if (context_switches() != slot->switches_at_start)
		__sync_fetch_and_add(&st->off_cpu_calls, 1);
	bucket = hist_bucket(elapsed);
	/* So the check and the index below are one register: the 6.1 verifier
	 * loses the bound when clang tests a copy. */
	barrier_var(bucket);
	if (bucket < HIST_BUCKETS)
		__sync_fetch_and_add(&st->hist[bucket], 1);
	if (!cas) {
		/* Two CPUs ending calls of this function at once can race here,
		 * and the smaller maximum may win: exact only with compare-and-swap. */
		if (elapsed > st->max_ns)
			st->max_ns = elapsed;
		return;
	}
	for (int i = 0; i < 4; i++) {
		__u64 max = st->max_ns;

		if (elapsed <= max || __sync_val_compare_and_swap(&st->max_ns, max, elapsed) == max)
			break;
	}
}

/* One step of unwind() below: closes the top call of thread `tid`'s stack,
 * or says to stop (1). It stops at the slot of `until_frame` (0: at the
 * first slot whose return will be seen) or once the stack is `until_depth`
 * deep (0: no such limit). */
static __always_inline long unwind_one(__u32 tid, __u64 now, __u64 until_frame, __u32 until_depth,
				       const int cas)
{
	struct thread_stack *stack = bpf_map_lookup_elem(&stacks, &tid);
	struct frame_slot *top;
	__u32 depth;

	if (!stack)
		return 1;
	depth = stack->depth;
	if (depth == 0 || depth <= until_depth)
		return 1;
	if (depth > MAX_DEPTH) {
		/* Slot-less calls past MAX_DEPTH: nothing to time, only to pop. */
		stack->depth = depth - 1;
		return 0;
	}
	top = &stack->slots[(depth - 1) & (MAX_DEPTH - 1)];
	if (!until_depth && (top->flags & SLOT_RETURNS))
		return 1;
	if (until_frame && top->frame == until_frame)
		return 1;
	close_top(stack, now, cas);
	return 0;
}

/* unwind_one as global functions, which the verifier checks once each
 * whatever calls them, with only scalar arguments, as Linux 5.10 wants.
 * Inlined into unwind's loop, every step was checked again: 670,000
 * instructions for the session program on 6.18, 1.6 s to load, and past
 * the 1M limit on 5.10 before closing a call lost its branches. */
__noinline long unwind_step(__u32 tid, __u64 now, __u64 until_frame, __u32 until_depth)
{
	return unwind_one(tid, now, until_frame, until_depth, 1);
}

__noinline long unwind_step_no_cas(__u32 tid, __u64 now, __u64 until_frame, __u32 until_depth)
{
	return unwind_one(tid, now, until_frame, until_depth, 0);
}

/* Closes the calls whose returns the kernel did not report (deeper than
 * URETPROBE_DEPTH) and that have ended by now: those above the slot that
 * returns, or above the caller of a new call. */
static __always_inline void unwind(__u32 tid, __u64 now, __u64 until_frame, __u32 until_depth,
				   const int cas)
{
	for (__u32 i = 0; i < MAX_DEPTH; i++)
		if (cas ? unwind_step(tid, now, until_frame, until_depth)
			: unwind_step_no_cas(tid, now, until_frame, until_depth))
			break;
}

static __always_inline __u64 current_frame(const void *tstate);

/* Whether the kernel will report a call's return. */
enum call_return {
	RETURN_IF_SHALLOW, /* a return probe, armed within URETPROBE_DEPTH */
	RETURN_ALWAYS,     /* a USDT return probe */
	RETURN_NEVER,      /* a call run inline: it ends at the thread's next event */
};

/* Opens a call on this thread's shadow stack and returns the stack's new
 * depth (0 if it has none). Every entry pushes a slot, counted or not, so
 * that every return pops the right one. `st` is the function's statistics
 * for a counted call; `tstate` (uprobe mode; 0: the one last seen on this
 * thread) finds the calling frame. `cas`: see close_top. */
static __always_inline __u32 on_call(const struct func_key *key, struct func_stats *st, __u64 frame,
				     const void *tstate, int counted, enum call_return returns, const int cas)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = bpf_ktime_get_ns();
	struct thread_stack *stack;
	struct frame_slot *slot, *caller = 0;
	__u32 depth;
	int recursive;

	if (counted && st)
		__sync_fetch_and_add(&st->calls, 1);
	count(CALLS_EVALUATIONS);

	stack = thread_stack(tid, 1);
	if (!stack)
		return 0;
	if (tstate)
		stack->tstate = (__u64)tstate;
	else
		tstate = (const void *)stack->tstate;
	/* Only calls whose return the kernel will not report can be left open
	 * on top of the caller; find the caller only then. */
	depth = stack->depth;
	if (tstate && depth > 0 && depth <= MAX_DEPTH &&
	    !(stack->slots[(depth - 1) & (MAX_DEPTH - 1)].flags & SLOT_RETURNS)) {
		__u64 caller = current_frame(tstate);

		if (caller)
			unwind(tid, now, caller, 0, cas);
	}
	depth = stack->depth;
	stack->depth = depth + 1;
	stack->entries++;
	if (depth > 0) {
		__u32 parent = depth - 1;

		barrier_var(parent);
		if (parent < MAX_DEPTH) {
			caller = &stack->slots[parent];
			caller->children++;
		}
	}
	if (depth >= MAX_DEPTH) {
		count(CALLS_DEEP_UNTIMED);
		if (!counted)
			return depth + 1;
		recursive = function_open_below(tid, MAX_DEPTH, key->id, key->aux, key->line);
		if (st && !recursive)
			__sync_fetch_and_add(&st->primitive_calls, 1);
		/* Its caller may be slot-less too: in no edge, said. */
		if (cfg.count_edges)
			count(CALLS_EDGE_NO_CALLER);
		return depth + 1;
	}
	slot = &stack->slots[depth];
	slot->key = *key;
	slot->frame = frame;
	slot->start_ns = now;
	slot->child_ns = 0;
	slot->entries_at_start = stack->entries;
	slot->switches_at_start = context_switches();
	slot->children = 0;
	slot->flags = returns == RETURN_ALWAYS || (returns == RETURN_IF_SHALLOW && depth < URETPROBE_DEPTH) ? SLOT_RETURNS : 0;
	if (!counted)
		return depth + 1;
	/* Like cProfile, a recursive call's inclusive time is counted only at the
	 * outermost call, so a function's total never exceeds the wall time;
	 * and only the outermost calls are primitive. (Checked here, after the
	 * slot's setup: checked before it, the loop's exits gave Linux 5.10's
	 * verifier bounds on `depth` it then contradicted, and it refused the
	 * slot's address.) */
	recursive = on_stack(stack, key, depth);
	if (st && !recursive)
		__sync_fetch_and_add(&st->primitive_calls, 1);
	slot->flags |= SLOT_COUNTED | (recursive ? 0 : SLOT_OUTERMOST);
	if (cfg.count_edges && caller)
		count_edge(tid, depth, &caller->key, slot, recursive);
	return depth + 1;
}

/* A call returns. `depth` is the stack's depth just after that call was
 * pushed, when known (0 otherwise): calls above it returned unseen.
 * `cas`: see close_top. */
static __always_inline void on_return(__u32 depth, const int cas)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = bpf_ktime_get_ns();
	struct thread_stack *stack = thread_stack(tid, 0);

	if (!stack || stack->depth == 0) {
		count(CALLS_UNMATCHED_RETURN);
		return;
	}
	if (depth > stack->depth) {
		/* The slot is gone: an entry's resync closed it. */
		count(CALLS_STACK_RESYNC);
		return;
	}
	/* Only calls deeper than the kernel's return probes can be open above
	 * the returning one; the loop is skipped when none is. */
	if (depth ? stack->depth > depth
		  : stack->depth <= MAX_DEPTH &&
			    !(stack->slots[(stack->depth - 1) & (MAX_DEPTH - 1)].flags & SLOT_RETURNS))
		unwind(tid, now, 0, depth, cas);
	if (stack->depth == 0) {
		count(CALLS_STACK_RESYNC);
		return;
	}
	close_top(stack, now, cas);
}

static __always_inline void announce(const struct func_key *key, const void *code, const char *file_str,
				     const char *name_str)
{
	struct new_function *ev = bpf_ringbuf_reserve(&new_functions, sizeof(*ev), 0);

	if (!ev) {
		count(CALLS_NEW_FUNCTION_LOST);
		return;
	}
	ev->key = *key;
	if (code) {
		const volatile struct py_layout *l = &cfg.layout;

		ev->name_kind = read_pystr(l, read_ptr(code, l->code_qualname), ev->name, NAME_CAP,
					   &ev->name_len);
		ev->file_kind = read_pystr(l, read_ptr(code, l->code_filename), ev->file, FILE_CAP,
					   &ev->file_len);
	} else {
		long n = bpf_probe_read_user_str(ev->name, NAME_CAP, name_str);
		long m = bpf_probe_read_user_str(ev->file, FILE_CAP, file_str);

		ev->name_kind = n > 0 ? STR_UTF8 : STR_UNREADABLE;
		ev->name_len = n > 0 ? n - 1 : 0;
		ev->file_kind = m > 0 ? STR_UTF8 : STR_UNREADABLE;
		ev->file_len = m > 0 ? m - 1 : 0;
	}
	bpf_ringbuf_submit(ev, ring_submit_flags(&new_functions));
}

/* pytrace started the target and holds it under ptrace until the
 * interpreter exists. Stopping it at its first frame evaluation, before any
 * Python code runs, lets user space set the eval-frame hook
 * (src/python/eval_hook.rs) and only then let it go. */
static __always_inline void stop_for_hook(void)
{
	first_eval_seen = 1;
	if (bpf_send_signal(SIGSTOP))
		count(CALLS_STOP_FAILED);
}

/* The frame running on the calling thread: the caller of a frame about to
 * be evaluated. */
static __always_inline __u64 current_frame(const void *tstate)
{
	const volatile struct py_layout *l = &cfg.layout;
	void *current = read_ptr(tstate, l->tstate_current);

	if (current && l->cframe_current_frame != PY_NO_FIELD)
		current = read_ptr(current, l->cframe_current_frame);
	return (__u64)current;
}

/* A field of a block read from the target, or 0 if the layout puts it
 * outside the block. Sizes (checked against the buffers first) and offsets
 * come from frozen rodata, so the verifier sees constants. */
#define FIELD(block, size, offset, type)                                                     \
	((offset) <= (size) - sizeof(type) ? *(type *)((block) + (offset)) : 0)

#define NAME_HEAD_MAX 64

static __always_inline __u64 mix(__u64 h, __u64 v)
{
	h ^= v;
	h *= 0x9e3779b97f4a7c15ULL;
	return h ^ (h >> 29);
}

/* What tells apart two functions whose code objects had the same address:
 * their name and file objects' addresses, and the name's hash and first 16
 * bytes (its hash may not be computed yet), read in one go: each read from
 * the target costs about 150 ns here, more than the rest of the program. */
static __always_inline __u64 code_fingerprint(const void *qualname, const void *filename)
{
	const volatile struct py_layout *l = &cfg.layout;
	__u32 from = l->unicode_hash, to = l->unicode_ascii_data + 16;
	__u64 name[NAME_HEAD_MAX / 8] = {}, h = mix((__u64)qualname, (__u64)filename);
	__u32 size = to - from;

	if (to <= from || size > NAME_HEAD_MAX || bpf_probe_read_user(name, size, (const char *)qualname + from))
		return h;
	/* Words past `size` stay zero. */
	for (int i = 0; i < NAME_HEAD_MAX / 8; i++)
		h = mix(h, name[i]);
	return h;
}

/* Weak: on kernels without uprobe sessions (before 6.13) the session
 * program is not loaded and these stay unresolved. */
extern bool bpf_session_is_return(void) __ksym __weak;
extern __u64 *bpf_session_cookie(void) __ksym __weak;

/* Names the function of a code object: fills the key's id, fingerprint and
 * first line, and *flags with its co_flags. Non-zero if `code` cannot be
 * read or is not a code object. */
static __always_inline int code_key(const void *code, struct func_key *key, __u32 *flags)
{
	const volatile struct py_layout *l = &cfg.layout;
	/* 8-byte aligned, for the 8-byte loads FIELD makes. */
	__u64 code_words[CODE_HEAD_MAX / 8];
	char *code_head = (char *)code_words;
	__u32 csize = cfg.code_head;

	if (!code || csize > CODE_HEAD_MAX || csize < 8 || bpf_probe_read_user(code_words, csize, code))
		return -1;
	if (cfg.code_type && FIELD(code_head, csize, l->object_type, __u64) != cfg.code_type)
		return -1;
	key->id = (__u64)code;
	key->aux = code_fingerprint(FIELD(code_head, csize, l->code_qualname, const void *),
				    FIELD(code_head, csize, l->code_filename, const void *));
	key->line = FIELD(code_head, csize, l->code_firstlineno, __u32);
	*flags = FIELD(code_head, csize, l->code_flags, __u32);
	return 0;
}

/* A frame is about to be evaluated: name its function and open a call.
 * Returns the stack depth of the call's slot (0 if none). `cas`: see
 * close_top. */
static __always_inline __u32 eval_enter(const void *tstate, const void *frame, const int cas)
{
	const volatile struct py_layout *l = &cfg.layout;
	/* 8-byte aligned, for the 8-byte loads FIELD makes. */
	__u64 frame_words[FRAME_HEAD_MAX / 8];
	char *frame_head = (char *)frame_words;
	struct func_stats *st = 0;
	struct func_key key = {};
	__u32 fsize = cfg.frame_head, flags = 0;
	const void *code;
	int is_new, counted = 1;

	if (cfg.stop_at_first_eval && !first_eval_seen)
		stop_for_hook();

	key.tgid = bpf_get_current_pid_tgid() >> 32;
	if (fsize > FRAME_HEAD_MAX || fsize < 8 || bpf_probe_read_user(frame_words, fsize, frame))
		goto bad;
	code = (const void *)PY_CODE_ADDRESS(FIELD(frame_head, fsize, l->frame_code, __u64), l);
	if (code_key(code, &key, &flags))
		goto bad;

	/* From 3.11, calling a generator function runs its frame in the eval
	 * loop just long enough to create the generator (RETURN_GENERATOR).
	 * cProfile sees no call there, only each resumption, which runs in a
	 * frame the generator owns. */
	if (l->frame_owner != PY_NO_FIELD && (flags & PY_CO_GENERATOR_LIKE) &&
	    FIELD(frame_head, fsize, l->frame_owner, __u8) == l->frame_owned_by_thread)
		counted = 0;

	if (counted) {
		st = function_stats(&key, &is_new);
		if (is_new)
			announce(&key, code, 0, 0);
	}
	goto push;
bad:
	/* Still push, so that this frame's return pops the right slot. */
	count(CALLS_BAD_CODE);
	key.id = 0;
	st = function_stats(&key, &is_new);
push:
	return on_call(&key, st, (__u64)frame, tstate, counted, RETURN_IF_SHALLOW, cas);
}

/* 3.13 only: its CALL_ALLOC_AND_ENTER_INIT (a call of a Python class at a
 * site it has specialized) runs __init__ inline even with the eval-frame
 * hook set, so that frame never enters _PyEval_EvalFrameDefault (3.14
 * checks the hook there). The instruction first allocates the instance
 * with _PyType_NewManagedObject(type), which nothing else calls: a probe
 * there counts one call of the type's cached __init__, untimed (its time
 * stays in the caller's self time). */
SEC("uprobe")
int BPF_UPROBE(inlined_init, const void *type)
{
	const void *init = read_ptr(type, cfg.heaptype_spec_init);
	const void *code = init ? (const void *)PY_CODE_ADDRESS((__u64)read_ptr(init, cfg.function_code), &cfg.layout) : 0;
	struct func_key key = { .tgid = bpf_get_current_pid_tgid() >> 32 };
	struct func_stats *st;
	__u32 flags;
	int is_new;

	if (cfg.empty_probe || !is_counting())
		return 0;
	if (code_key(code, &key, &flags)) {
		count(CALLS_BAD_CODE);
		return 0;
	}
	st = function_stats(&key, &is_new);
	if (!st)
		return 0;
	if (is_new)
		announce(&key, code, 0, 0);
	count_untimed_call(&key, st);
	count(CALLS_INLINED_INIT);
	return 0;
}

/* A general-purpose register by its x86 number (rax 0 ... r15 15), as
 * user space found it in the code around a probe site. */
static __always_inline __u64 register_value(const struct pt_regs *regs, __u32 number)
{
	/* Loaded one by one at constant offsets, as the verifier wants for the
	 * context (a switch compiles into one load at a computed offset). */
	__u64 by_number[16] = {
		regs->ax, regs->cx, regs->dx, regs->bx, regs->sp, regs->bp, regs->si, regs->di,
		regs->r8, regs->r9, regs->r10, regs->r11, regs->r12, regs->r13, regs->r14, regs->r15,
	};

	if (number >= 16)
		return 0;
	barrier_var(number); /* keeps the mask below, which the verifier needs */
	return by_number[number & 15];
}

/* The function whose frame (or, for a generator, whose embedded frame) is
 * at `frame`: its key and statistics, announced if new. */
static __always_inline struct func_stats *frame_function(const void *frame, struct func_key *key)
{
	const void *code = (const void *)PY_CODE_ADDRESS((__u64)read_ptr(frame, cfg.layout.frame_code), &cfg.layout);
	struct func_stats *st;
	__u32 flags;
	int is_new;

	key->tgid = bpf_get_current_pid_tgid() >> 32;
	if (code_key(code, key, &flags)) {
		count(CALLS_BAD_CODE);
		return 0;
	}
	st = function_stats(key, &is_new);
	if (st && is_new)
		announce(key, code, 0, 0);
	return st;
}

/* 3.11.0 to 3.11.3: BINARY_SUBSCR_GETITEM runs __getitem__ inline without
 * checking the eval-frame hook (src/python/inlined_getitem.rs). The probe
 * sits in that handler after its last check; the attach cookie names the
 * register holding the new frame. The call opens a slot like any other,
 * so what __getitem__ calls is its child, but no return probe sees it end:
 * it is closed at the thread's next event (an upper bound on its time). */
SEC("uprobe")
int inline_frame(struct pt_regs *ctx)
{
	const void *frame = (const void *)register_value(ctx, (__u32)bpf_get_attach_cookie(ctx));
	struct func_key key = {};
	struct func_stats *st;

	if (cfg.empty_probe || !is_counting())
		return 0;
	st = frame_function(frame, &key);
	if (!st)
		return 0;
	count(CALLS_INLINED_CALL);
	on_call(&key, st, (__u64)frame, 0, 1, RETURN_NEVER, 1);
	return 0;
}

/* 3.13+: close() of a generator suspended outside any try block skips its
 * frame unless a monitoring tool listens (src/python/generator_close.rs),
 * so cProfile counts a call there that never runs without it. The probe
 * sits on the branch into that fast path: the cookie holds the register
 * with the generator (low byte) and the zero flag's value when the branch
 * goes the fast way (bit 8). Counted, untimed: no code runs. */
#define X86_ZERO_FLAG 0x40

SEC("uprobe")
int skipped_close(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 zero = (ctx->flags & X86_ZERO_FLAG) ? 1 : 0;
	const char *gen = (const char *)register_value(ctx, cookie & 0xff);
	struct func_key key = {};
	struct func_stats *st;

	if (cfg.empty_probe || !is_counting() || zero != ((cookie >> 8) & 1))
		return 0;
	st = frame_function(gen + cfg.gen_iframe, &key);
	if (!st)
		return 0;
	count_untimed_call(&key, st);
	count(CALLS_SKIPPED_CLOSE);
	return 0;
}

/* Entry and return of _PyEval_EvalFrameDefault, as one uprobe session (Linux
 * 6.13+). Not a uprobe plus a uretprobe where sessions exist: there
 * unregistering a probe waits (SRCU) for pending uretprobe instances, which
 * a target that keeps calling renews; a session has one link, so one
 * unregister, and once `counting` is off its entries arm no return probe,
 * so the run's own target stops renewing them. Other runs' targets may
 * still: src/tracing/mod.rs (detach_links) closes links off the user's
 * path. (A uprobe on the `ret`
 * instruction instead is single-stepped: 14 us a hit on a VM, against under
 * 1 us for a return probe.) The session cookie carries the depth of this
 * call's slot to its return. */
SEC("uprobe.session")
int BPF_UPROBE(eval_frame, const void *tstate, const void *frame)
{
	__u64 *cookie = bpf_session_cookie();
	__u32 depth;

	/* At entry, 0 still arms the return probe, as a real run does. */
	if (cfg.empty_probe)
		return 0;
	if (bpf_session_is_return()) {
		if (is_counting())
			on_return(cookie ? *cookie : 0, 1);
		return 0;
	}
	/* 1: no return probe for this call, so no return instance (below). */
	if (!is_counting())
		return 1;
	depth = eval_enter(tstate, frame, 1);
	if (cookie)
		*cookie = depth;
	return 0; /* 0: run this session's return probe too */
}

/* Older kernels: a uprobe and a uretprobe. User space detaches the return
 * probe first, so no new return instance keeps the entry probe's
 * unregister waiting. Each is built twice: with compare-and-swap, and
 * with `suffix` _no_cas for kernels before 5.12 (no compare-and-swap);
 * `cas` is a constant, so each program keeps only its own branches. */
#define EVAL_ENTRY_AND_RETURN(suffix, cas)					\
SEC("uprobe")								\
int BPF_UPROBE(eval_entry##suffix, const void *tstate, const void *frame)	\
{									\
	if (cfg.empty_probe || !is_counting())				\
		return 0;						\
	eval_enter(tstate, frame, cas);					\
	return 0;							\
}									\
									\
SEC("uretprobe")							\
int BPF_URETPROBE(eval_return##suffix)					\
{									\
	if (cfg.empty_probe || !is_counting())				\
		return 0;						\
	on_return(0, cas);						\
	return 0;							\
}

EVAL_ENTRY_AND_RETURN(, 1)
EVAL_ENTRY_AND_RETURN(_no_cas, 0)

static __always_inline void usdt_entry(const char *file, const char *name, int line, const int cas)
{
	struct func_key key = {
		.id = (__u64)name,
		.aux = (__u64)file,
		.line = line,
		.tgid = bpf_get_current_pid_tgid() >> 32,
	};
	struct func_stats *st;
	int is_new;

	st = function_stats(&key, &is_new);
	if (is_new)
		announce(&key, 0, file, name);
	on_call(&key, st, 0, 0, 1, RETURN_ALWAYS, cas);
}

/* CPython's function__entry and function__return probes, built twice as
 * EVAL_ENTRY_AND_RETURN is. */
#define USDT_ENTRY_AND_RETURN(suffix, cas)					\
SEC("usdt")								\
int BPF_USDT(usdt_function_entry##suffix, const char *file, const char *name, int line) \
{									\
	if (is_counting())						\
		usdt_entry(file, name, line, cas);			\
	return 0;							\
}									\
									\
SEC("usdt")								\
int BPF_USDT(usdt_function_return##suffix)				\
{									\
	if (is_counting())						\
		on_return(0, cas);					\
	return 0;							\
}

USDT_ENTRY_AND_RETURN(, 1)
USDT_ENTRY_AND_RETURN(_no_cas, 0)

/* A fork by the target, or by a child of it already tracked. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(target_forked, struct task_struct *parent, struct task_struct *child)
{
	__u32 parent_tgid = parent->tgid, child_tgid = child->tgid;

	if (child_tgid == parent_tgid) /* a new thread */
		return 0;
	if (parent_tgid != cfg.tgid && !bpf_map_lookup_elem(&children, &parent_tgid))
		return 0;
	if (bpf_map_update_elem(&children, &child_tgid, &parent_tgid, BPF_ANY))
		count(CALLS_CHILD_MAP_FULL);
	return 0;
}

/* A thread ends: its shadow stack goes, so a target that keeps starting
 * short-lived threads never fills the map (20,000 of them filled it before
 * this); a tracked child ends: it needs no restoring. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(task_exited, struct task_struct *task)
{
	__u32 tid = task->pid, tgid = task->tgid;

	if (tgid == cfg.tgid && bpf_map_delete_elem(&stacks, &tid) == 0)
		count(CALLS_THREAD_EXITS);
	if (tid == tgid)
		bpf_map_delete_elem(&children, &tgid);
	return 0;
}
