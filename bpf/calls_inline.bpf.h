/* Part of bpf/calls.bpf.c, included once after eval_enter: the probes on
 * the calls CPython runs without entering _PyEval_EvalFrameDefault, where
 * the eval-frame hook never sees them (src/python/ finds their sites). */

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
	__u64 code_words[CODE_HEAD_MAX / 8];
	struct func_stats *st;
	__u32 flags;
	int is_new;

	if (cfg.empty_probe || !is_counting())
		return 0;
	if (code_key(code, &key, &flags, code_words)) {
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

/* The function whose frame (or, for a generator, whose embedded frame) is
 * at `frame`: its key and statistics, announced if new. */
static __always_inline struct func_stats *frame_function(const void *frame, struct func_key *key)
{
	const void *code = (const void *)PY_CODE_ADDRESS((__u64)read_ptr(frame, cfg.layout.frame_code), &cfg.layout);
	__u64 code_words[CODE_HEAD_MAX / 8];
	struct func_stats *st;
	__u32 flags;
	int is_new;

	key->tgid = bpf_get_current_pid_tgid() >> 32;
	if (code_key(code, key, &flags, code_words)) {
		count(CALLS_BAD_CODE);
		return 0;
	}
	st = function_stats(key, &is_new);
	if (st && is_new)
		announce(key, code, 0, 0);
	return st;
}

/* 3.11.0 to 3.11.3: BINARY_SUBSCR_GETITEM runs __getitem__ inline without
 * checking the eval-frame hook (src/python/probes/inlined_getitem.rs). The probe
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
 * frame unless a monitoring tool listens (src/python/probes/generator_close.rs),
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
