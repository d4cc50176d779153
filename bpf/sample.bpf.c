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
 * thread pointer, the fs base. (bpf_get_current_task, not its _btf twin,
 * which needs Linux 5.11.) */
static __always_inline __u64 thread_pointer(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	return BPF_CORE_READ(task, thread.fsbase);
}

/* The user registers --native needs, as a thread saved them on entering
 * the kernel. */
struct user_regs {
	__u64 ip, sp, bp, cs;
};

/* From bpf_task_pt_regs (Linux 5.15+; the task must be a BTF pointer). */
static __always_inline int task_user_regs(struct task_struct *task, struct user_regs *out)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);

	if (!regs)
		return -1;
	out->ip = regs->ip;
	out->sp = regs->sp;
	out->bp = regs->bp;
	out->cs = regs->cs;
	return 0;
}

/* x86-64's THREAD_SIZE without KASAN (which no production kernel enables):
 * the kernel stack a thread's pt_regs sit on top of. */
#define KERNEL_STACK_BYTES (4 * 4096)

/* The running thread's, before bpf_task_pt_regs (5.15): where x86-64's
 * task_pt_regs() finds them, the top of its kernel stack. The helper's
 * presence is resolved when the program loads (CO-RE), and the verifier
 * drops the branch a kernel cannot run. */
static __always_inline int current_user_regs(struct task_struct *unused, struct user_regs *out)
{
	struct task_struct *task;
	struct pt_regs *regs;

	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs))
		return task_user_regs(bpf_get_current_task_btf(), out);
	task = (struct task_struct *)bpf_get_current_task();
	regs = (struct pt_regs *)((__u64)BPF_CORE_READ(task, stack) + KERNEL_STACK_BYTES) - 1;
	out->ip = BPF_CORE_READ(regs, ip);
	out->sp = BPF_CORE_READ(regs, sp);
	out->bp = BPF_CORE_READ(regs, bp);
	out->cs = BPF_CORE_READ(regs, cs);
	return 0;
}

struct scan_ctx {
	const struct sample_target *t;
	struct task_struct *task;
	__u64 tstate;
	__u64 want;
	__u64 found;
};

struct walk_ctx {
	const struct sample_target *t;
	struct task_struct *task;
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

static __always_inline void mark_entry(struct py_sample *s, __u32 n)
{
	__u32 word;

	/* Clang knows n < MAX_FRAMES here and would drop the mask below as
	 * redundant, leaving an index the 5.10 and 6.1 verifiers cannot bound:
	 * make it forget. */
	barrier_var(n);
	word = (n >> 6) & (MAX_FRAMES / 64 - 1);
	s->entry[word] |= 1ULL << (n & 63);
}

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* The walker twice, from one template: reading the interrupted thread's own
 * memory (the perf-event sampler)... */
#define WALK(name) CAT(name, _current)
#define WALK_READ(dst, size, src, task) bpf_probe_read_user(dst, size, src)
#define WALK_USER_REGS(task, out) current_user_regs(task, out)
#include "sample_walk.bpf.h"
#undef WALK
#undef WALK_READ
#undef WALK_USER_REGS

/* ...and another thread's, from a sleepable task iterator (--idle). */
#define WALK(name) CAT(name, _task)
#define WALK_READ(dst, size, src, task) bpf_copy_from_user_task(dst, size, src, task, 0)
#define WALK_USER_REGS(task, out) task_user_regs(task, out)
#include "sample_walk.bpf.h"
#undef WALK
#undef WALK_READ
#undef WALK_USER_REGS

/* Reserves a sample for a thread (with room for its stack with --native),
 * or counts it lost. */
static __always_inline struct py_sample *start_sample(__u32 pid, __u32 tid)
{
	struct py_sample *s = bpf_ringbuf_reserve(&samples, cfg.native ? NATIVE_RECORD_BYTES : sizeof(*s), 0);

	if (!s) {
		count(SAMPLE_LOST);
		return 0;
	}
	s->pid = pid;
	s->tid = tid;
	s->kernel_stack = -1;
	s->native = 0;
	s->stack_len = 0;
	return s;
}

SEC("perf_event")
int sample_thread(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, pid = pid_tgid >> 32;
	const struct sample_target *t = bpf_map_lookup_elem(&processes, &pid);
	struct py_sample *s;

	if (!t || !(s = start_sample(pid, tid)))
		return 0;
	s->kernel_stack = cfg.kernel_stacks ? bpf_get_stackid(ctx, &kernel_stacks, 0) : -1;
	fill_sample_current(t, s, tid, 0, thread_pointer());
	if (cfg.native)
		fill_native_current(s, 0);
	/* Wake the reader at each sample, unlike the other programs: user space
	 * names code objects as samples arrive, and a module's code object is
	 * freed as soon as its import ends. At 99 Hz the wakeups cost little. */
	bpf_ringbuf_submit(s, 0);
	return 0;
}

/* --idle: every thread of every target, running or not, each time user
 * space reads this iterator (at the sampling rate): a wall-clock view. */
SEC("iter.s/task")
int sample_all_threads(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	const struct sample_target *t;
	struct py_sample *s;
	__u32 pid, tid;

	if (!task)
		return 0;
	pid = task->tgid;
	tid = task->pid;
	t = bpf_map_lookup_elem(&processes, &pid);
	if (!t || !(s = start_sample(pid, tid)))
		return 0;
	fill_sample_task(t, s, tid, task, task->thread.fsbase);
	/* A thread running on another CPU right now has its registers in that
	 * CPU, not saved in its task: no native stack for it this tick. */
	if (cfg.native && task->on_cpu)
		count(SAMPLE_NATIVE_ON_CPU);
	else if (cfg.native)
		fill_native_task(s, task);
	bpf_ringbuf_submit(s, 0);
	return 0;
}
