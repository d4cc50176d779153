// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace sample`: on a CPU-clock perf event on every CPU, walks the
 * interrupted thread's Python frames in the kernel, for every process in
 * the `processes` map (one, or every Python with --all), and counts the
 * sample under its stack's hash in the kernel. A stack's frames (code
 * object and instruction addresses, kernel return addresses) go to user
 * space once, when the stack is first seen; user space names them and reads
 * the counts periodically. Only --native sends a record per sample (its
 * native frames go with it: bpf/native_unwind.bpf.h).
 *
 * Kernels: bounded loops (5.3), bpf_get_stack (4.18), bpf_ringbuf_output
 * (5.8), map-in-map (4.12) are all this program needs;
 * --native samples that interrupted the kernel find the user registers
 * with bpf_task_pt_regs (5.15) where it exists, else at the top of the
 * kernel stack as the kernel does. --idle needs a sleepable task iterator and
 * bpf_copy_from_user_task (5.18). */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "sample.h"
#include "python_read.bpf.h"
#include "counters.bpf.h"
#include "ring.bpf.h" /* RING_BYTES, ring_submit_flags */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct sample_config cfg = {};

/* The one process sampled (-p, --), 0 with --all. The clock fires on a
 * CPU whatever runs there, so most runs are for other tasks: a compare
 * with a constant turns them away before any look-up. */
const volatile __u32 only_pid = 0;

/* The processes to sample. User space fills an entry per process, sets its
 * interpreters_head once the interpreter file is mapped (with `--`, it is
 * not yet at load time), and removes it when the process exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct sample_target);
} processes SEC(".maps");

/* With one process sampled (only_pid), its entry again, at index 0: the
 * verifier inlines an array's look-up, where the hash map's is a helper
 * call, made on every tick of every CPU that runs the target. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_target);
} only_target SEC(".maps");

/* Samples per stack. Two maps, swapped by user space: the perf-event
 * program counts into the one `counts` holds, and user space reads the
 * other. Replacing a map-in-map element waits for every running program
 * (the kernel's maybe_wait_bpf_programs), so once the swap returns nobody
 * counts into the old map any more and it can be read and emptied without
 * losing an increment. (Reading and deleting a live hash map's element
 * would lose the samples counted in between.) */
struct counts_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_COUNTED_STACKS);
	__type(key, struct stack_key);
	__type(value, __u64);
};
struct counts_map counts_a SEC(".maps");
struct counts_map counts_b SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct counts_map);
} counts SEC(".maps") = {
	.values = { &counts_a },
};

/* Each CPU's clock period now, as a sample's weight (SAMPLE_WEIGHT: the
 * mean period); written by the thread that re-arms that CPU's clock, 0
 * until its first re-arm (the clock then runs at the mean period). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_WEIGHTED_CPUS);
	__type(key, __u32);
	__type(value, __u32);
} sample_weights SEC(".maps");

/* dump (cfg.once): the threads whose stack a pass has read, which later
 * passes (run for the threads whose read was torn) leave alone. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} threads_read SEC(".maps");

DEFINE_COUNTERS(SAMPLE_COUNTER_COUNT);

struct sample_stack _sample_stack = {};
struct native_record _native_record = {};
struct unwind_row _unwind_row = {};
struct native_mappings _native_mappings = {};
enum native_end _native_end = 0;
struct stack_key _stack_key = {};
enum sample_counter _sample_counter = 0;
enum record_kind _record_kind = 0;
enum thread_state _thread_state = 0;
enum sample_weight _sample_weight = 0;

/* The ring of new stacks, the walk's scratch and its helpers, shared with
 * bpf/memory.bpf.c. */
#include "sample_walk_base.bpf.h"
/* --native's unwinder. */
#include "native_unwind.bpf.h"

/* The walker three times, from one template: reading the interrupted
 * thread's own memory (the perf-event sampler), with bounded loops for
 * kernels before 5.17... */
#define WALK(name) CAT(name, _current)
#define WALK_READ(dst, size, src, task) bpf_probe_read_user(dst, size, src)
/* The interrupted thread cannot change its own stack under the walk. */
#define WALK_OTHER_THREAD 0
#define WALK_BPF_LOOP 0
#include "sample_async.bpf.h"
#include "sample_walk.bpf.h"
#include "sample_gil.bpf.h"
#undef WALK
#undef WALK_BPF_LOOP

/* ...the same with bpf_loop, whose loops later kernels verify once rather
 * than pass by pass... */
#define WALK(name) CAT(name, _current_loops)
#define WALK_BPF_LOOP 1
#include "sample_async.bpf.h"
#include "sample_walk.bpf.h"
#include "sample_gil.bpf.h"
#undef WALK
#undef WALK_READ
#undef WALK_OTHER_THREAD
#undef WALK_BPF_LOOP

/* ...and another thread's, from a sleepable task iterator (--idle). */
#define WALK(name) CAT(name, _task)
#define WALK_READ(dst, size, src, task) bpf_copy_from_user_task(dst, size, src, task, 0)
/* Another thread, which may run meanwhile: the walk keeps what it read of
 * each link for a second read; its loops are bpf_loop's (5.17; this program
 * needs 5.18), whose body the verifier checks once instead of per pass. */
#define WALK_OTHER_THREAD 1
#define WALK_BPF_LOOP 1
#include "sample_async.bpf.h"
#include "sample_walk.bpf.h"
#include "sample_gil.bpf.h"
#undef WALK
#undef WALK_READ
#undef WALK_OTHER_THREAD
#undef WALK_BPF_LOOP

/* --kernel: the kernel stack into the record, mixed into the hash. */
static __always_inline __u64 add_kernel_stack(void *ctx, struct sample_stack *rec, __u64 hash)
{
	long bytes = bpf_get_stack(ctx, rec->kernel, sizeof(rec->kernel), 0);
	__u32 n;

	if (bytes < 0) {
		count(SAMPLE_KERNEL_STACK_FAILED);
		rec->kernel_frames = bytes;
		return mix(hash, HASH_KERNEL);
	}
	n = bytes / sizeof(__u64);
	rec->kernel_frames = n;
	hash = mix(hash, HASH_KERNEL + n);
	for (int i = 0; i < MAX_KERNEL_FRAMES; i++) {
		if (i >= n)
			break;
		hash = mix(hash, rec->kernel[i]);
	}
	return hash;
}

/* Adds a sample to its stack's count; false if the stack is not counted
 * yet in this map (nothing added). In the steady state this one look-up is
 * all a sample costs beyond the walk: a stack with a count here was sent
 * before it was counted, so known_stacks need not be asked. */
static __always_inline bool add_to_count(void *counts_map, struct stack_key *key, __u64 weight)
{
	__u64 *n = bpf_map_lookup_elem(counts_map, key);

	if (!n)
		return false;
	__sync_fetch_and_add(n, weight);
	return true;
}

/* Counts a stack's first sample in this map. */
static __always_inline void start_count(void *counts_map, struct stack_key *key, __u64 weight)
{
	if (!bpf_map_update_elem(counts_map, key, &weight, BPF_NOEXIST) || add_to_count(counts_map, key, weight))
		return;
	/* Another CPU added it first, or the map is full. */
	count(SAMPLE_COUNTS_FULL);
}

/* --native: a sample's record (reserved by the caller: older verifiers
 * lose track of a reservation checked in a helper and again by its caller),
 * before its registers and stack. */
static __always_inline void start_native(struct native_record *r, struct stack_key *key)
{
	r->kind = RECORD_NATIVE;
	r->pid = key->pid;
	r->tid = key->tid;
	r->hash = key->hash;
}

/* x86-64's struct pt_regs (its ABI): 15 general registers, orig_ax, ip,
 * then cs. Read as a plain word of the context: a CO-RE field access would
 * take the local 2-byte cs of newer kernels (FRED) and fail to relocate. */
#define PT_REGS_CS_WORD 17

/* Before bpf_task_pt_regs (5.15): where the kernel's task_pt_regs() finds
 * the user registers a thread's entry into the kernel saved, at the top of
 * its kernel stack: THREAD_SIZE above task->stack (16 KiB on x86-64; a
 * KASAN kernel doubles it), less TOP_OF_KERNEL_STACK_PADDING (0 on x86-64
 * until FRED, 6.9, whose kernels all have the helper). Only user-mode
 * segment selectors (__USER_CS, __USER_DS) make them user registers, so a
 * kernel built otherwise gets no registers rather than wrong ones. */
#define KERNEL_THREAD_SIZE 16384
#define USER_CS 0x33
#define USER_DS 0x2b

static __always_inline struct pt_regs *saved_user_regs_fallback(struct task_struct *task, bool *user)
{
	struct pt_regs *regs =
		(struct pt_regs *)((__u8 *)BPF_CORE_READ(task, stack) + KERNEL_THREAD_SIZE - bpf_core_type_size(struct pt_regs));

	*user = BPF_CORE_READ(regs, cs) == USER_CS && BPF_CORE_READ(regs, ss) == USER_DS;
	return regs;
}

/* --native: the interrupted thread's user registers, if the interrupt
 * came from user mode (read through the context, which the verifier
 * rewrites on every kernel); otherwise those saved at the top of the
 * kernel stack, found by bpf_task_pt_regs (5.15) or as the kernel does.
 * sp 0: none. */
static __always_inline void native_user_regs(struct bpf_perf_event_data *ctx, struct task_struct *task, __u64 *ip,
					     __u64 *sp, __u64 *bp)
{
	bool user = (((volatile const __u64 *)ctx)[PT_REGS_CS_WORD] & 3) == 3;

	*ip = ctx->regs.ip;
	*sp = ctx->regs.sp;
	*bp = ctx->regs.bp;
	if (!user) {
		struct pt_regs *regs;

		if (cfg.task_pt_regs && bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)) {
			regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
			user = regs && (BPF_CORE_READ(regs, cs) & 3) == 3;
		} else {
			regs = saved_user_regs_fallback(task, &user);
		}
		*ip = BPF_CORE_READ(regs, ip);
		*sp = BPF_CORE_READ(regs, sp);
		*bp = BPF_CORE_READ(regs, bp);
	}
	if (!user) {
		count(SAMPLE_NO_USER_REGS);
		*sp = 0;
	}
}

/* With bpf_loop (5.17+): the unwinding called. */
static __always_inline void native_sample_call(struct bpf_perf_event_data *ctx, struct task_struct *task,
					       __u64 pid_tid, __u64 hash)
{
	__u64 ip, sp, bp;

	native_user_regs(ctx, task, &ip, &sp, &bp);
	native_sample_loops(pid_tid, hash, ip, sp, bp);
}

/* Before: tail-called (see native_tail), the key through the scratch. */
static __always_inline void native_sample_tail_call(struct bpf_perf_event_data *ctx, struct task_struct *task,
						    __u64 pid_tid, __u64 hash)
{
	__u32 zero = 0;
	struct native_scratch *ns = bpf_map_lookup_elem(&native_scratch, &zero);

	if (!ns)
		return;
	ns->key_pid_tid = pid_tid;
	ns->key_hash = hash;
	bpf_tail_call(ctx, &native_tail, 0);
	count(SAMPLE_LOST);
}

SEC("perf_event")
int sample_native_tail(struct bpf_perf_event_data *ctx)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u32 zero = 0;
	struct native_scratch *ns = bpf_map_lookup_elem(&native_scratch, &zero);
	__u64 ip, sp, bp;

	if (!ns)
		return 0;
	native_user_regs(ctx, task, &ip, &sp, &bp);
	native_sample_bounded(ns->key_pid_tid, ns->key_hash, ip, sp, bp);
	return 0;
}

/* The perf-event sampler twice, one per current-thread walker: with plain
 * bounded loops (kernels before 5.17) and with bpf_loop. */
#define WALK(name) CAT(name, _current)
#define SAMPLE_THREAD_PROGRAM sample_thread
#define NATIVE_SAMPLE_CALL native_sample_tail_call
#include "sample_thread.bpf.h"
#undef WALK
#undef SAMPLE_THREAD_PROGRAM
#undef NATIVE_SAMPLE_CALL
#define WALK(name) CAT(name, _current_loops)
#define SAMPLE_THREAD_PROGRAM sample_thread_loops
#define NATIVE_SAMPLE_CALL native_sample_call
#include "sample_thread.bpf.h"
#undef WALK
#undef SAMPLE_THREAD_PROGRAM
#undef NATIVE_SAMPLE_CALL

/* --idle: every thread of every target, running or not, each time user
 * space reads this iterator (at the sampling rate): a wall-clock view.
 * User space runs the iterator itself and reads the counts after each
 * pass, so no swap is needed: it counts into counts_a directly. */
SEC("iter.s/task")
int sample_all_threads(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	const struct sample_target *t;
	struct stack_key key = {}, known = {};
	struct walk_scratch *s;
	__u32 pid, tid, zero = 0;
	__u64 switches;
	__u8 read = 1;
	int on_cpu;

	if (!task)
		return 0;
	pid = task->tgid;
	tid = task->pid;
	t = bpf_map_lookup_elem(&processes, &pid);
	if (!t || !(s = bpf_map_lookup_elem(&scratch, &zero)))
		return 0;
	if (cfg.once && bpf_map_lookup_elem(&threads_read, &tid))
		return 0;
	if (leave_out_for_gil_task(t, s, tid, task, task->thread.fsbase))
		return 0;
	on_cpu = task->on_cpu;
	switches = task->nvcsw + task->nivcsw;
	known.pid = key.pid = pid;
	known.hash = key.hash = walk_python_task(t, s, tid, task, task->thread.fsbase);
	if (!stack_unchanged_task(t, s, task, switches, on_cpu)) {
		count(SAMPLE_TORN);
		return 0;
	}
	if (task_switched_task(t, s, task)) {
		count(SAMPLE_TASK_SWITCHED);
		return 0;
	}
	/* Read whole, stack and task: a snapshot's next pass leaves it be. Set
	 * only now, so that a thread whose asyncio task switched under the read
	 * is read again, like a torn one, rather than dropped from the dump. */
	if (cfg.once)
		bpf_map_update_elem(&threads_read, &tid, &read, BPF_ANY);
	known.hash = key.hash = add_running_task_task(&s->rec, key.hash);
	if (cfg.thread_states) {
		s->rec.thread_state = thread_state_of_task(t, s, tid, task, task->thread.fsbase, &s->rec.syscall);
		known.hash = key.hash = mix(mix(key.hash, HASH_STATE + s->rec.thread_state), (__u32)s->rec.syscall);
	}
	key.tid = cfg.per_thread || cfg.native ? tid : 0;
	s->rec.kernel_frames = 0;
	/* Every thread once per tick: each sample is one mean period. */
	if (!cfg.native && add_to_count(&counts_a, &key, SAMPLE_WEIGHT))
		return 0;
	if (!SEND_IF_NEW(&s->rec, &known, t, task, read_names_task))
		return 0;
	if (cfg.native) {
		struct native_record *r = bpf_ringbuf_reserve(&records, NATIVE_RECORD_BYTES, 0);

		if (!r) {
			count(SAMPLE_LOST);
			return 0;
		}
		start_native(r, &key);
		/* Nothing unwound in the kernel: the whole stack is copied. */
		r->frames = 0;
		r->end = NATIVE_STACK_COPY;
		r->reason = NATIVE_NOT_UNWOUND;
		r->copy = 1;
		/* A thread running on another CPU right now has its registers in
		 * that CPU, not saved in its task: no native stack for it this
		 * tick. */
		if (task->on_cpu) {
			count(SAMPLE_NATIVE_ON_CPU);
			r->native = 0;
			r->stack_len = 0;
		} else {
			struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);

			fill_native_task(r, regs && (BPF_CORE_READ(regs, cs) & 3) == 3, BPF_CORE_READ(regs, ip),
					 BPF_CORE_READ(regs, sp), BPF_CORE_READ(regs, bp), task);
		}
		bpf_ringbuf_submit(r, ring_submit_flags(&records));
		return 0;
	}
	start_count(&counts_a, &key, SAMPLE_WEIGHT);
	return 0;
}
