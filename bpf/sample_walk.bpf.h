/* The Python-stack walker of bpf/sample.bpf.c, included once per way of
 * reading the target's memory: WALK(name) names this copy's functions and
 * WALK_READ(dst, size, src, task) reads user memory. (A sleepable helper may
 * not even appear in a non-sleepable program, so one function with a branch
 * would not load.) No include guard, on purpose.
 *
 * Loops are plain bounded loops, not bpf_loop (Linux 5.17+): every kernel
 * since 5.3 verifies them; a program that merely names a bpf_loop callback
 * does not load before 5.13. */

static __always_inline void *WALK(read_ptr)(const void *base, __u32 offset, struct task_struct *task)
{
	void *value = 0;

	if (WALK_READ(&value, sizeof(value), (const char *)base + offset, task))
		return 0;
	return value;
}

static __always_inline long WALK(scan_one)(struct scan_ctx *ctx)
{
	__u64 id = 0;

	if (!ctx->tstate)
		return 1;
	if (WALK_READ(&id, sizeof(id), (void *)(ctx->tstate + ctx->t->tstate_thread_id), ctx->task))
		return 1;
	if (id == ctx->want) {
		ctx->found = ctx->tstate;
		return 1;
	}
	ctx->tstate = (__u64)WALK(read_ptr)((void *)ctx->tstate, ctx->t->tstate_next, ctx->task);
	return 0;
}

/* The thread's PyThreadState: cached per thread, else found by walking the
 * main interpreter's thread list for the one whose id (pthread_self, the fs
 * base) is `want`. */
static __always_inline __u64 WALK(thread_state)(const struct sample_target *t, __u32 tid,
						struct task_struct *task, __u64 want)
{
	__u64 id = 0, *cached = bpf_map_lookup_elem(&thread_states, &tid);
	struct scan_ctx ctx = { .t = t, .task = task, .want = want };
	void *interp;

	if (cached && !WALK_READ(&id, sizeof(id), (void *)(*cached + t->tstate_thread_id), task) &&
	    id == want)
		return *cached;
	if (!t->interpreters_head)
		return 0;
	interp = WALK(read_ptr)((void *)t->interpreters_head, 0, task);
	if (!interp)
		return 0;
	ctx.tstate = (__u64)WALK(read_ptr)(interp, t->interp_threads_head, task);
	for (__u32 i = 0; i < MAX_THREAD_SCAN; i++)
		if (WALK(scan_one)(&ctx))
			break;
	if (ctx.found)
		bpf_map_update_elem(&thread_states, &tid, &ctx.found, BPF_ANY);
	return ctx.found;
}

static __always_inline long WALK(walk_one)(struct walk_ctx *ctx)
{
	const struct sample_target *t = ctx->t;
	const struct py_layout *l = &t->layout;
	__u64 words[SAMPLE_FRAME_HEAD / 8] = {};
	/* Read afresh from the record at each step (the verifier does not track
	 * it there), so that the states of one step look alike whatever the
	 * last step did: otherwise they multiply past what 5.10 can verify. */
	__u32 size = t->frame_head, n = *(volatile __u32 *)&ctx->s->frames;

	if (!ctx->frame)
		return 1;
	if (n >= MAX_FRAMES) {
		ctx->s->truncated = 1;
		return 1;
	}
	if (size > SAMPLE_FRAME_HEAD || size < 8 || WALK_READ(words, size, (void *)ctx->frame, ctx->task)) {
		count(SAMPLE_BAD_FRAME);
		return 1;
	}
	if (l->frame_owner == PY_NO_FIELD || byte_at(words, l->frame_owner) < PY_FRAME_OWNED_NOT_CODE) {
		ctx->s->code[n & (MAX_FRAMES - 1)] = PY_CODE_ADDRESS(word_at(words, l->frame_code));
		ctx->s->instr[n & (MAX_FRAMES - 1)] = word_at(words, t->frame_instr);
		/* Before 3.11 (no owner field) every frame has its own C-level
		 * eval call; 3.11 flags the first frame of each. */
		if (l->frame_owner == PY_NO_FIELD ||
		    (t->frame_is_entry != PY_NO_FIELD && byte_at(words, t->frame_is_entry)))
			mark_entry(ctx->s, n);
		ctx->s->frames = n + 1;
	} else if (n > 0) {
		/* From 3.12 each C-level eval call puts a shim frame just outside
		 * its first frame (and 3.14's base frame, outside the outermost
		 * shim, marks a frame already marked). */
		mark_entry(ctx->s, n - 1);
	}
	ctx->frame = word_at(words, t->frame_previous);
	return 0;
}

/* Fills a reserved sample with the thread's Python frames. */
static __always_inline void WALK(fill_sample)(const struct sample_target *t, struct py_sample *s, __u32 tid,
					       struct task_struct *task, __u64 thread_pointer)
{
	const struct py_layout *l = &t->layout;
	struct walk_ctx walk = {};
	__u64 tstate, current;

	s->frames = 0;
	s->truncated = 0;
	s->no_python = 0;
	for (int i = 0; i < MAX_FRAMES / 64; i++)
		s->entry[i] = 0;
	tstate = WALK(thread_state)(t, tid, task, thread_pointer);
	current = tstate ? (__u64)WALK(read_ptr)((void *)tstate, l->tstate_current, task) : 0;
	if (current && l->cframe_current_frame != PY_NO_FIELD)
		current = (__u64)WALK(read_ptr)((void *)current, l->cframe_current_frame, task);
	if (!tstate)
		count(SAMPLE_NO_THREAD);
	if (!current) {
		s->no_python = 1;
		return;
	}
	walk.t = t;
	walk.task = task;
	walk.s = s;
	walk.frame = current;
	for (__u32 i = 0; i < MAX_FRAMES + 1; i++)
		if (WALK(walk_one)(&walk))
			break;
}

/* --native: the thread's user registers, as saved when it last entered the
 * kernel (the sampling interrupt itself, or the system call it is blocked
 * in), and its stack in whole pages from the stack pointer's up, after the
 * record. Unwinding and naming are left to user space. */
static __always_inline void WALK(fill_native)(struct py_sample *s, struct task_struct *task)
{
	struct user_regs regs = {};
	__u8 *stack = (__u8 *)(s + 1);
	__u64 start;

	if (WALK_USER_REGS(task, &regs) || (regs.cs & 3) != 3) {
		count(SAMPLE_NO_USER_REGS);
		return;
	}
	s->user_ip = regs.ip;
	s->user_sp = regs.sp;
	s->user_bp = regs.bp;
	start = s->user_sp & ~(__u64)(NATIVE_PAGE - 1);
	s->stack_start = start;
	s->native = 1;
	/* Page by page: a read that crosses into an unmapped page fails whole,
	 * and the stack's mapping ends a few pages above the outermost frame. */
#pragma unroll
	for (int i = 0; i < NATIVE_STACK_PAGES; i++) {
		if (WALK_READ(stack + i * NATIVE_PAGE, NATIVE_PAGE, (void *)(start + i * NATIVE_PAGE), task))
			break;
		s->stack_len = (i + 1) * NATIVE_PAGE;
	}
}
