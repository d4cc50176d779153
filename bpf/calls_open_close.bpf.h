/* Part of bpf/calls.bpf.c, included once after calls_edges.bpf.h: a call
 * opened on its thread's shadow stack at entry, and closed and timed at its
 * return, or at the thread's next event when no return probe sees it. */

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
 * returns, or above the caller of a new call. The loop is a global
 * function too (one per `cas`, so that a program for kernels without
 * compare-and-swap contains none): inlined, it was verified again on
 * every path into it, half of the entry program's instructions. Three
 * levels of calls fit under the 512 bytes of stack that Linux 5.10 to
 * 6.12 allow them together only because the entry probe keeps its
 * buffers off the stack (entry_scratch in calls.bpf.c). */
__noinline long unwind_cas(__u32 tid, __u64 now, __u64 until_frame, __u32 until_depth)
{
	for (__u32 i = 0; i < MAX_DEPTH; i++)
		if (unwind_step(tid, now, until_frame, until_depth))
			break;
	return 0;
}

__noinline long unwind_no_cas(__u32 tid, __u64 now, __u64 until_frame, __u32 until_depth)
{
	for (__u32 i = 0; i < MAX_DEPTH; i++)
		if (unwind_step_no_cas(tid, now, until_frame, until_depth))
			break;
	return 0;
}

static __always_inline void unwind(__u32 tid, __u64 now, __u64 until_frame, __u32 until_depth,
				   const int cas)
{
	if (cas)
		unwind_cas(tid, now, until_frame, until_depth);
	else
		unwind_no_cas(tid, now, until_frame, until_depth);
}

/* Whether the kernel will report a call's return. */
enum call_return {
	RETURN_IF_SHALLOW, /* a return probe, armed within URETPROBE_DEPTH */
	RETURN_ALWAYS,     /* a USDT return probe */
	RETURN_NEVER,      /* a call run inline: it ends at the thread's next event */
};

/* Opens a call on thread `tid`'s shadow stack `stack` and returns the
 * stack's new depth. Every entry pushes a slot, counted or not, so that
 * every return pops the right one. `st` is the function's statistics for
 * a counted call; `tstate` (uprobe mode; 0: the one last seen on this
 * thread) finds the calling frame. `cas`: see close_top. */
static __always_inline __u32 open_call(struct thread_stack *stack, __u32 tid, const struct func_key *key,
				       struct func_stats *st, __u64 frame, const void *tstate, int counted,
				       enum call_return returns, const int cas)
{
	__u64 now = bpf_ktime_get_ns();
	struct frame_slot *slot, *caller = 0;
	__u32 depth;
	int recursive;

	if (counted && st)
		__sync_fetch_and_add(&st->calls, 1);
	count(CALLS_EVALUATIONS);

	if (tstate)
		stack->tstate = (__u64)tstate;
	else
		tstate = (const void *)stack->tstate;
	/* Only calls whose return the kernel will not report can be left open
	 * on top of the caller; find the caller only then. */
	depth = stack->depth;
	if (tstate && depth > 0 && depth <= MAX_DEPTH &&
	    !(stack->slots[(depth - 1) & (MAX_DEPTH - 1)].flags & SLOT_RETURNS)) {
		__u64 caller = (__u64)running_frame(&cfg.layout, tstate);

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
	 * slot's address.) The scan is a global function: inlined, its
	 * MAX_DEPTH steps were checked on every path here, 23,000 of
	 * eval_frame's 60,700 instructions; its second look-up of the stack
	 * costs no time measurable from the program's run time. */
	recursive = function_open_below(tid, depth, key->id, key->aux, key->line);
	if (st && !recursive)
		__sync_fetch_and_add(&st->primitive_calls, 1);
	slot->flags |= SLOT_COUNTED | (recursive ? 0 : SLOT_OUTERMOST);
	if (cfg.count_edges && caller)
		count_edge(tid, depth, &caller->key, slot, recursive);
	return depth + 1;
}

/* open_call on the calling thread's stack, made if it has none yet. A
 * thread past the thread map's size still counts its call, untimed. */
static __always_inline __u32 on_call(const struct func_key *key, struct func_stats *st, __u64 frame,
				     const void *tstate, int counted, enum call_return returns, const int cas)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_stack *stack = thread_stack(tid, 1);

	if (!stack) {
		if (counted && st)
			__sync_fetch_and_add(&st->calls, 1);
		count(CALLS_EVALUATIONS);
		return 0;
	}
	return open_call(stack, tid, key, st, frame, tstate, counted, returns, cas);
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
