/* Part of bpf/calls.bpf.c, included once after calls_stack.bpf.h: the
 * caller->callee pairs `calls --pstats` counts and times, as cProfile keeps
 * them for pstats' callers map. */

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
