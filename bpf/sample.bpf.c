// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace sample`: on a CPU-clock perf event on every CPU, walks the
 * interrupted thread's Python frames in the kernel, for every process in
 * the `processes` map (one, or every Python with --all), and sends them, with the
 * kernel stack if asked, to user space. Only addresses are recorded (code
 * object, instruction); names and lines are resolved in user space, once
 * per code object. */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "sample.h"
#include "python_read.bpf.h"
#include "counters.bpf.h"
#include "ring.bpf.h" /* RING_BYTES */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct sample_config cfg = {};

/* The processes to sample. User space fills an entry per process and sets
 * its interpreters_head once the interpreter file is mapped (with `--`, it
 * is not yet at load time). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct sample_target);
} processes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES);
} samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 127 * sizeof(__u64));
} kernel_stacks SEC(".maps");

/* tid -> its PyThreadState, checked at each use. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} thread_states SEC(".maps");

DEFINE_COUNTERS(SAMPLE_COUNTER_COUNT);

struct py_sample _py_sample = {};
enum sample_counter _sample_counter = 0;

/* CPython records pthread_self() as a thread's id, which on x86-64 is the
 * thread pointer, the fs base. */
static __always_inline __u64 thread_pointer(void)
{
	struct task_struct *task = bpf_get_current_task_btf();

	return BPF_CORE_READ(task, thread.fsbase);
}

struct scan_ctx {
	const struct sample_target *t;
	__u64 tstate;
	__u64 want;
	__u64 found;
};

static long scan_one(__u64 i, void *data)
{
	struct scan_ctx *ctx = data;
	__u64 id = 0;

	if (!ctx->tstate)
		return 1;
	if (bpf_probe_read_user(&id, sizeof(id), (void *)(ctx->tstate + ctx->t->tstate_thread_id)))
		return 1;
	if (id == ctx->want) {
		ctx->found = ctx->tstate;
		return 1;
	}
	ctx->tstate = (__u64)read_ptr((void *)ctx->tstate, ctx->t->tstate_next);
	return 0;
}

/* The sampled thread's PyThreadState: cached per thread, else found by
 * walking the main interpreter's thread list. */
static __always_inline __u64 thread_state(const struct sample_target *t, __u32 tid)
{
	__u64 want = thread_pointer(), id = 0, *cached = bpf_map_lookup_elem(&thread_states, &tid);
	struct scan_ctx ctx = { .t = t, .want = want };
	void *interp;

	if (cached && !bpf_probe_read_user(&id, sizeof(id), (void *)(*cached + t->tstate_thread_id)) &&
	    id == want)
		return *cached;
	if (!t->interpreters_head)
		return 0;
	interp = read_ptr((void *)t->interpreters_head, 0);
	if (!interp)
		return 0;
	ctx.tstate = (__u64)read_ptr(interp, t->interp_threads_head);
	bpf_loop(MAX_THREAD_SCAN, scan_one, &ctx, 0);
	if (ctx.found)
		bpf_map_update_elem(&thread_states, &tid, &ctx.found, BPF_ANY);
	return ctx.found;
}

struct walk_ctx {
	const struct sample_target *t;
	struct py_sample *s;
	__u64 frame;
};

/* Fields of a frame's first bytes, at offsets that differ per process, so
 * the verifier cannot know them: 8-byte fields are read as an indexed word
 * (their offsets are 8-aligned in every layout), bytes by masked index. The
 * barriers keep clang from dropping the masks the verifier needs. */
static __always_inline __u64 word_at(const __u64 *words, __u32 offset)
{
	__u32 i = offset >> 3;

	barrier_var(i);
	i &= SAMPLE_FRAME_HEAD / 8 - 1;
	return (offset & 7) || offset >= SAMPLE_FRAME_HEAD ? 0 : words[i];
}

static __always_inline __u8 byte_at(const __u64 *words, __u32 offset)
{
	barrier_var(offset);
	offset &= SAMPLE_FRAME_HEAD - 1;
	return ((const __u8 *)words)[offset];
}

static long walk_one(__u64 i, void *data)
{
	struct walk_ctx *ctx = data;
	const struct sample_target *t = ctx->t;
	const struct py_layout *l = &t->layout;
	__u64 words[SAMPLE_FRAME_HEAD / 8] = {};
	__u32 size = t->frame_head, n = ctx->s->frames;

	if (!ctx->frame)
		return 1;
	if (n >= MAX_FRAMES) {
		ctx->s->truncated = 1;
		return 1;
	}
	if (size > SAMPLE_FRAME_HEAD || size < 8 || bpf_probe_read_user(words, size, (void *)ctx->frame)) {
		count(SAMPLE_BAD_FRAME);
		return 1;
	}
	/* From 3.12, frames owned by the C stack are shims, not Python code. */
	if (l->frame_owner == PY_NO_FIELD || byte_at(words, l->frame_owner) != 3) {
		ctx->s->code[n & (MAX_FRAMES - 1)] = word_at(words, l->frame_code);
		ctx->s->instr[n & (MAX_FRAMES - 1)] = word_at(words, t->frame_instr);
		ctx->s->frames = n + 1;
	}
	ctx->frame = word_at(words, t->frame_previous);
	return 0;
}

SEC("perf_event")
int sample_thread(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, pid = pid_tgid >> 32;
	const struct sample_target *t = bpf_map_lookup_elem(&processes, &pid);
	const struct py_layout *l;
	struct walk_ctx walk = {};
	struct py_sample *s;
	__u64 tstate, current;

	if (!t)
		return 0;
	l = &t->layout;
	s = bpf_ringbuf_reserve(&samples, sizeof(*s), 0);
	if (!s) {
		count(SAMPLE_LOST);
		return 0;
	}
	s->pid = pid;
	s->tid = tid;
	s->frames = 0;
	s->truncated = 0;
	s->no_python = 0;
	s->kernel_stack = cfg.kernel_stacks ? bpf_get_stackid(ctx, &kernel_stacks, 0) : -1;

	tstate = thread_state(t, tid);
	current = tstate ? (__u64)read_ptr((void *)tstate, l->tstate_current) : 0;
	if (current && l->cframe_current_frame != PY_NO_FIELD)
		current = (__u64)read_ptr((void *)current, l->cframe_current_frame);
	if (!tstate)
		count(SAMPLE_NO_THREAD);
	if (!current) {
		s->no_python = 1;
	} else {
		walk.t = t;
		walk.s = s;
		walk.frame = current;
		bpf_loop(MAX_FRAMES + 1, walk_one, &walk, 0);
	}
	/* Wake the reader at each sample, unlike the other programs: user space
	 * names code objects as samples arrive, and a module's code object is
	 * freed as soon as its import ends. At 99 Hz the wakeups cost little. */
	bpf_ringbuf_submit(s, 0);
	return 0;
}
