/* The Python-stack walker of bpf/sample.bpf.c, included once per way of
 * reading the target's memory: WALK(name) names this copy's functions and
 * WALK_READ(dst, size, src, task) reads user memory. (A sleepable helper may
 * not even appear in a non-sleepable program, so one function with a branch
 * would not load.) No include guard, on purpose.
 *
 * WALK_BPF_LOOP picks how the long loops (the frames, their names, the
 * thread list) run. 0: plain bounded loops, which every kernel since 5.3
 * verifies, but pass by pass: on 6.18 the perf-event sampler took 338,000
 * verified instructions, about half a second of CPU at every start. 1:
 * bpf_loop (Linux 5.17+), whose body the verifier checks once: 2,900.
 * What changes from one iteration to the next lives in the scratch record
 * (map memory, which the verifier does not track by value), so it does not
 * multiply the states the verifier explores. */

static __always_inline __u64 WALK(read_ptr)(__u64 base, __u32 offset, struct task_struct *task)
{
	__u64 value = 0;

	if (WALK_READ(&value, sizeof(value), (const void *)(base + offset), task))
		return 0;
	return value;
}

/* Reads the first bytes of the PyThreadState at `tstate` (its thread id
 * and current frame pointer among them) into the scratch; false if they
 * cannot be read. One read for both: each read of the target costs about
 * as much as a map look-up. */
static __always_inline bool WALK(read_tstate_head)(const struct sample_target *t, struct walk_scratch *scratch,
						   __u64 tstate, struct task_struct *task)
{
	/* Read and bounded where it is used (see walk_python). */
	__u64 size = *(volatile const __u32 *)&t->tstate_read_size;

	barrier_var(size);
	if (size > SAMPLE_TSTATE_HEAD || size < 8)
		return false;
	return !WALK_READ(scratch->tstate_head, size, (const void *)(tstate + t->tstate_read_start), task);
}

/* One thread of thread_state's scan, as a bpf_loop callback: stops at the
 * thread whose id is `want` (found), at the list's end, or at a read that
 * fails. */
struct WALK(thread_scan) {
	const struct sample_target *t;
	struct task_struct *task;
	__u64 want, tstate;
	bool found;
};

static long WALK(thread_scan_step)(__u32 i, void *ctx)
{
	struct WALK(thread_scan) *scan = ctx;
	__u64 id = 0;

	if (!scan->tstate ||
	    WALK_READ(&id, sizeof(id), (const void *)(scan->tstate + scan->t->tstate_thread_id), scan->task))
		return 1;
	if (id == scan->want) {
		scan->found = true;
		return 1;
	}
	scan->tstate = WALK(read_ptr)(scan->tstate, scan->t->tstate_next, scan->task);
	return 0;
}

/* The thread's PyThreadState, its first bytes in the scratch (see
 * read_tstate_head): cached per thread, else found by walking the main
 * interpreter's thread list for the one whose id (pthread_self, the fs
 * base) is `want`. */
static __always_inline __u64 WALK(thread_state)(const struct sample_target *t, struct walk_scratch *scratch, __u32 tid,
						struct task_struct *task, __u64 want)
{
	__u64 tstate, interp, *cached = bpf_map_lookup_elem(&thread_states, &tid);

	if (cached) {
		tstate = *cached;
		if (WALK(read_tstate_head)(t, scratch, tstate, task) &&
		    tstate_word(scratch->tstate_head, t->tstate_id_in_read) == want)
			return tstate;
	}
	if (!t->interpreters_head)
		return 0;
	interp = WALK(read_ptr)(t->interpreters_head, 0, task);
	if (!interp)
		return 0;
	tstate = WALK(read_ptr)(interp, t->interp_threads_head, task);
#if WALK_BPF_LOOP
	struct WALK(thread_scan) scan = { .t = t, .task = task, .want = want, .tstate = tstate };

	bpf_loop(MAX_THREAD_SCAN, WALK(thread_scan_step), &scan, 0);
	if (!scan.found || !WALK(read_tstate_head)(t, scratch, scan.tstate, task))
		return 0;
	bpf_map_update_elem(&thread_states, &tid, &scan.tstate, BPF_ANY);
	return scan.tstate;
#else
	__u64 id = 0;

	for (int i = 0; i < MAX_THREAD_SCAN && tstate; i++) {
		if (WALK_READ(&id, sizeof(id), (const void *)(tstate + t->tstate_thread_id), task))
			return 0;
		if (id == want) {
			if (!WALK(read_tstate_head)(t, scratch, tstate, task))
				return 0;
			bpf_map_update_elem(&thread_states, &tid, &tstate, BPF_ANY);
			return tstate;
		}
		tstate = WALK(read_ptr)(tstate, t->tstate_next, task);
	}
	return 0;
#endif
}

/* One link of the walk (see walk_python): reads the frame at *frame,
 * records it unless it is a shim, and moves *frame to its caller. */
static __always_inline int WALK(walk_link)(const struct sample_target *t, struct walk_scratch *scratch,
					   struct task_struct *task, __u32 link, __u64 *frame, __u64 *hash)
{
	struct sample_stack *rec = &scratch->rec;
	__u32 n = rec->frames;
	const __u64 *words;
	__u64 addr, size;
	__u32 off;

	if (!*frame)
		return WALK_ENDED;
	if (n >= MAX_FRAMES)
		return WALK_FULL;
	addr = *frame + t->frame_read_start;
	off = addr & (WALK_PAGE - 1);
	barrier_var(off);
	/* Read and bounded right where it is used, in 64 bits: older
	 * verifiers (5.10, 6.1) lose a bound checked on a copy (one clang
	 * kept from before the loop, or a zero-extended one). */
	size = *(volatile const __u32 *)&t->frame_read_size;
	barrier_var(size);
	if (size > SAMPLE_FRAME_HEAD)
		size = SAMPLE_FRAME_HEAD;
	if (scratch->page_base && scratch->page_base == addr - off && off <= WALK_PAGE - SAMPLE_FRAME_HEAD &&
	    off + size <= scratch->page_len) {
		words = (const __u64 *)(scratch->page + off);
	} else if (t->frames_contiguous && off <= WALK_PAGE - SAMPLE_FRAME_HEAD) {
		/* From 3.11 a thread's frames sit one after another on its data
		 * stack, each caller's below its callee's: one read, from the
		 * start of the frame's page to its end, holds the frame and
		 * the callers below it in that page. */
		__u64 len = off + size;

		barrier_var(len);
		if (len > WALK_PAGE || len < 8 || WALK_READ(scratch->page, len, (const void *)(addr - off), task)) {
			count(SAMPLE_BAD_FRAME);
			*hash = mix(*hash, HASH_BAD_FRAME);
			return WALK_BAD;
		}
		scratch->page_base = addr - off;
		scratch->page_len = len;
		words = (const __u64 *)(scratch->page + off);
	} else {
		words = scratch->frame_head;
		if (WALK_READ(scratch->frame_head, size, (const void *)addr, task)) {
			count(SAMPLE_BAD_FRAME);
			*hash = mix(*hash, HASH_BAD_FRAME);
			return WALK_BAD;
		}
	}
	if (WALK_OTHER_THREAD)
		keep_link(scratch, link, link_sum(t, words, *frame, link));
	if (t->frame_owner == PY_NO_FIELD || byte_at(words, t->frame_owner) < t->layout.frame_owned_not_code) {
		__u64 code = PY_CODE_ADDRESS(word_at(words, t->frame_code), &t->layout);
		__u64 instr = word_at(words, t->frame_instr);
		__u64 globals = t->frame_globals == PY_NO_FIELD ? 0 : word_at(words, t->frame_globals);
		struct py_frame_ref *slot = frame_slot(rec, n);

		if (!slot)
			return WALK_FULL;
		slot->code = code;
		slot->instr = instr;
		slot->globals = globals;
		*hash = mix(mix(mix(*hash, code), instr), globals);
		/* Before 3.11 (no owner field) every frame has its own C-level
		 * eval call; 3.11 flags the first frame of each. */
		if (t->frame_owner == PY_NO_FIELD || (t->frame_is_entry != PY_NO_FIELD && byte_at(words, t->frame_is_entry))) {
			mark_entry(rec, n);
			*hash = mix(*hash, HASH_ENTRY);
		}
		rec->frames = n + 1;
	} else if (n > 0) {
		/* From 3.12 each C-level eval call puts a shim frame just outside
		 * its first frame (and 3.14's base frame, outside the outermost
		 * shim, marks a frame already marked). */
		mark_entry(rec, n - 1);
		*hash = mix(*hash, HASH_ENTRY);
	}
	*frame = word_at(words, t->frame_previous);
	return WALK_NEXT;
}

/* walk_link as a bpf_loop callback. */
static long WALK(walk_step)(__u32 link, void *ctx)
{
	struct walk_step *step = ctx;

	step->result = WALK(walk_link)(step->t, step->scratch, step->task, link, &step->frame, &step->hash);
	return step->result != WALK_NEXT;
}

/* Fills the scratch record with the thread's Python frames, innermost
 * first; returns the stack's hash over them. Each frame costs a read of
 * the target, the bytes from its first field needed to its last, or, from
 * 3.11, where frames are contiguous, one read per page of frames. */
static __always_inline __u64 WALK(walk_python)(const struct sample_target *t, struct walk_scratch *scratch, __u32 tid,
					       struct task_struct *task, __u64 thread_pointer)
{
	const struct py_layout *l = &t->layout;
	struct sample_stack *rec = &scratch->rec;
	struct walk_step step = { .t = t, .scratch = scratch, .task = task, .hash = HASH_SEED };
	__u64 tstate, frame;

	rec->frames = 0;
	rec->truncated = 0;
	rec->no_python = 0;
	scratch->page_base = 0;
	scratch->links = 0;
	scratch->first_frame = 0;
	for (int i = 0; i < MAX_FRAMES / 64; i++)
		rec->entry[i] = 0;
	tstate = WALK(thread_state)(t, scratch, tid, task, thread_pointer);
	scratch->tstate = tstate;
	if (!tstate)
		count(SAMPLE_NO_THREAD);
	/* --async (sample_async.bpf.h): the task before the frames, so that a
	 * thread read while it runs can be seen to have switched tasks. */
	rec->running_task = WALK(running_task)(t, tstate, task);
	frame = tstate ? tstate_word(scratch->tstate_head, t->tstate_current_in_read) : 0;
	if (frame && l->cframe_current_frame != PY_NO_FIELD)
		frame = WALK(read_ptr)(frame, l->cframe_current_frame, task);
	scratch->first_frame = frame;
	if (!frame) {
		rec->no_python = 1;
		return mix(step.hash, HASH_NO_PYTHON);
	}
	if (t->frame_read_size > SAMPLE_FRAME_HEAD || t->frame_read_size < 8) {
		count(SAMPLE_BAD_FRAME);
		return mix(step.hash, HASH_BAD_FRAME);
	}
	step.frame = frame;
	/* Shim frames (3.12+) take a link but no record: allow some more links
	 * than records. */
#if WALK_BPF_LOOP
	bpf_loop(WALK_LINKS, WALK(walk_step), &step, 0);
#else
	for (int link = 0; link < WALK_LINKS; link++) {
		step.result = WALK(walk_link)(t, scratch, task, link, &step.frame, &step.hash);
		if (step.result != WALK_NEXT)
			break;
	}
#endif
	if (step.result == WALK_BAD || step.result == WALK_ENDED)
		return step.hash;
	if (step.frame) {
		rec->truncated = 1;
		step.hash = mix(step.hash, HASH_TRUNCATED);
	}
	return step.hash;
}

/* --idle reads threads that may run on another CPU meanwhile, changing
 * their stack under the walk: before 3.11 a returning frame goes to a free
 * list (linked through its previous-frame field) and is reused by the next
 * call, so a walk can go from a live frame into freed ones, or into a frame
 * since reused at another depth, and read a stack the thread never had
 * (deeper than it ever goes, without its root, a function its own caller at
 * a line that calls nothing). True if the thread did not run while it was
 * read (off CPU before and after, and not switched in and out between:
 * its context-switch counts unchanged), or if a second read of each link,
 * from the thread state on, finds what the walk read (the innermost
 * frame's instruction aside). A stack torn by reuse that happens to read
 * the same twice is left possible only where the thread went through the
 * very same frames at the same places each time. */
/* One link of stack_unchanged's second read, as a bpf_loop callback:
 * step->result WALK_BAD once a link reads otherwise. */
static long WALK(check_link)(__u32 link, void *ctx)
{
	struct walk_step *step = ctx;
	struct walk_scratch *scratch = step->scratch;
	const struct sample_target *t = step->t;
	__u64 size;

	if (link >= scratch->links || !step->frame)
		return 1;
	size = *(volatile const __u32 *)&t->frame_read_size;
	barrier_var(size);
	if (size > SAMPLE_FRAME_HEAD)
		size = SAMPLE_FRAME_HEAD;
	if (WALK_READ(scratch->frame_head, size, (const void *)(step->frame + t->frame_read_start), step->task) ||
	    link_sum(t, scratch->frame_head, step->frame, link) != kept_link(scratch, link)) {
		step->result = WALK_BAD;
		return 1;
	}
	step->frame = word_at(scratch->frame_head, t->frame_previous);
	return 0;
}

static __always_inline bool WALK(stack_unchanged)(const struct sample_target *t, struct walk_scratch *scratch,
						  struct task_struct *task, __u64 switches_before, int on_cpu_before)
{
	struct walk_step step = { .t = t, .scratch = scratch, .task = task, .result = WALK_NEXT };
	__u64 frame;

	if (!on_cpu_before && !task->on_cpu && task->nvcsw + task->nivcsw == switches_before)
		return true;
	if (!scratch->tstate)
		return true;
	if (!WALK(read_tstate_head)(t, scratch, scratch->tstate, task))
		return false;
	frame = tstate_word(scratch->tstate_head, t->tstate_current_in_read);
	if (frame && t->layout.cframe_current_frame != PY_NO_FIELD)
		frame = WALK(read_ptr)(frame, t->layout.cframe_current_frame, task);
	if (frame != scratch->first_frame)
		return false;
	step.frame = frame;
	bpf_loop(WALK_LINKS, WALK(check_link), &step, 0);
	return step.result == WALK_NEXT;
}

/* --native: the thread's user registers (`user`: they are user-mode ones,
 * from the sampling interrupt itself or saved when the thread entered the
 * kernel) and its stack in whole pages from the stack pointer's up, after
 * the record. Unwinding and naming are left to user space. */
static __always_inline void WALK(fill_native)(struct native_record *r, bool user, __u64 ip, __u64 sp, __u64 bp,
					      struct task_struct *task)
{
	__u8 *stack = (__u8 *)(r + 1);
	__u64 start;

	r->native = 0;
	r->stack_len = 0;
	if (!user) {
		count(SAMPLE_NO_USER_REGS);
		return;
	}
	r->user_ip = ip;
	r->user_sp = sp;
	r->user_bp = bp;
	start = sp & ~(__u64)(NATIVE_PAGE - 1);
	r->stack_start = start;
	r->native = 1;
	/* Page by page: a read that crosses into an unmapped page fails whole,
	 * and the stack's mapping ends a few pages above the outermost frame. */
#pragma unroll
	for (int i = 0; i < NATIVE_STACK_PAGES; i++) {
		if (WALK_READ(stack + i * NATIVE_PAGE, NATIVE_PAGE, (void *)(start + i * NATIVE_PAGE), task))
			break;
		r->stack_len = (i + 1) * NATIVE_PAGE;
	}
}

/* Before a new stack is sent: each frame's code object's name and file
 * name pointers (one read: the fields are neighbours), so that user space
 * can tell whether the object it names later is the one sampled. Only for
 * new stacks: one read per frame. */
static __always_inline void WALK(read_name)(const struct sample_target *t, struct py_frame_ref *slot,
					    struct task_struct *task)
{
	__u64 words[NAMES_READ / 8] = {};
	/* Read and bounded where it is used (see walk_python). */
	__u64 size = *(volatile const __u32 *)&t->names_read_size;

	barrier_var(size);
	if (size > NAMES_READ || size < 8 ||
	    WALK_READ(words, size, (const void *)(slot->code + t->names_read_start), task)) {
		slot->name = 0;
		slot->file = 0;
		return;
	}
	slot->name = words[(t->name_in_read >> 3) & (NAMES_READ / 8 - 1)];
	slot->file = words[(t->file_in_read >> 3) & (NAMES_READ / 8 - 1)];
}

#if WALK_BPF_LOOP
struct WALK(names_step) {
	const struct sample_target *t;
	struct sample_stack *rec;
	struct task_struct *task;
};

/* One frame of read_names, as a bpf_loop callback. */
static long WALK(name_step)(__u32 i, void *ctx)
{
	struct WALK(names_step) *step = ctx;
	struct py_frame_ref *slot = frame_slot(step->rec, i);

	if (i >= step->rec->frames || !slot)
		return 1;
	WALK(read_name)(step->t, slot, step->task);
	return 0;
}
#endif

static __always_inline void WALK(read_names)(const struct sample_target *t, struct sample_stack *rec,
					    struct task_struct *task)
{
#if WALK_BPF_LOOP
	struct WALK(names_step) step = { .t = t, .rec = rec, .task = task };

	bpf_loop(MAX_FRAMES, WALK(name_step), &step, 0);
#else
	__u32 n = rec->frames;

	for (int i = 0; i < MAX_FRAMES; i++) {
		struct py_frame_ref *slot = frame_slot(rec, i);

		if (i >= n || !slot)
			break;
		WALK(read_name)(t, slot, task);
	}
#endif
}
