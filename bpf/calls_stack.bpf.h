/* Part of bpf/calls.bpf.c, included once after its maps: each thread's
 * shadow stack of open calls (struct thread_stack) and the function
 * statistics its calls count into. */

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
 * arguments (what Linux 5.10 allows), verified once wherever it is called. */
__noinline long function_open_below(__u32 tid, __u32 depth, __u64 id, __u64 aux, __u32 line)
{
	struct thread_stack *stack = bpf_map_lookup_elem(&stacks, &tid);
	struct func_key key = { .id = id, .aux = aux, .line = line };

	return stack ? on_stack(stack, &key, depth) : 0;
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

/* How many times the calling thread has left its CPU, either way. */
static __always_inline __u64 context_switches(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	return BPF_CORE_READ(task, nvcsw) + BPF_CORE_READ(task, nivcsw);
}
