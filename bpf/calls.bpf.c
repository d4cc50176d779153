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
#include "python_code.bpf.h"
#include "histogram.bpf.h"
#include "registers.bpf.h"

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
	/* Where the entry probe reads a frame's and its code object's heads
	 * and builds the function's key. On the BPF stack these 352 bytes left
	 * no room under the 512 bytes Linux 5.10 to 6.12 allow a program and
	 * the global functions it calls together, which unwind's loop needs
	 * (calls_open_close.bpf.h). Not a per-CPU array: a uprobe's program
	 * runs with migration disabled but may be preempted, and another
	 * task's run on the same CPU would then write over it; only this
	 * thread's own probes use its entry. */
	struct entry_scratch {
		__u64 frame_words[FRAME_HEAD_MAX / 8];
		__u64 code_words[CODE_HEAD_MAX / 8];
		struct func_key key;
	} scratch;
	struct frame_slot slots[MAX_DEPTH];
};

/* Not preallocated: 16,384 entries of 2.7 KB (the latency histograms) are
 * 46 MB that the kernel zeroed at every start, a tenth of a run's fixed
 * CPU, for the few hundred functions a run usually sees. An entry the
 * kernel cannot allocate is counted as the map being full. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
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
enum hist_layout _hist_layout = 0;

#include "calls_stack.bpf.h"
#include "calls_edges.bpf.h"
#include "calls_open_close.bpf.h"

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
 * (src/python/target_writes/eval_hook.rs) and only then let it go. */
static __always_inline void stop_for_hook(void)
{
	first_eval_seen = 1;
	if (bpf_send_signal(SIGSTOP))
		count(CALLS_STOP_FAILED);
}

/* Where the hook points at a jump to the eval function
 * (src/python/probes/eval_entry.rs), the calls before the hook is set reach
 * the function's entry without passing the jump: this probe on the entry
 * stops the command there instead, and user space detaches it as soon as
 * the hook is set (every call passes the entry too, single-stepped). */
SEC("uprobe")
int first_eval(void *ctx)
{
	if (!first_eval_seen)
		stop_for_hook();
	return 0;
}

/* Weak: on kernels without uprobe sessions (before 6.13) the session
 * program is not loaded and these stay unresolved. */
extern bool bpf_session_is_return(void) __ksym __weak;
extern __u64 *bpf_session_cookie(void) __ksym __weak;

/* Names the function of a code object: fills the key's id, fingerprint and
 * first line, and *flags with its co_flags. `code_words` holds the code
 * object's head (CODE_HEAD_MAX bytes, 8-byte aligned). Non-zero if `code`
 * cannot be read or is not a code object. */
static __always_inline int code_key(const void *code, struct func_key *key, __u32 *flags, __u64 *code_words)
{
	const volatile struct py_layout *l = &cfg.layout;
	char *code_head = (char *)code_words;
	__u32 csize = cfg.code_head;

	if (read_code_head(l, cfg.code_type, code, code_words, csize))
		return -1;
	key->id = (__u64)code;
	key->aux = code_fingerprint(l, FIELD(code_head, csize, l->code_qualname, const void *),
				    FIELD(code_head, csize, l->code_filename, const void *));
	key->line = FIELD(code_head, csize, l->code_firstlineno, __u32);
	*flags = FIELD(code_head, csize, l->code_flags, __u32);
	return 0;
}

/* A frame is about to be evaluated: name its function and open a call.
 * Returns the stack depth of the call's slot (0 if none). The frame's and
 * code object's heads are read into the thread's stack entry (see
 * entry_scratch), so a thread past the thread map's size has nowhere to
 * name its calls: they are counted lost (CALLS_THREAD_MAP_FULL). `cas`:
 * see close_top. */
static __always_inline __u32 eval_enter(const void *tstate, const void *frame, const int cas)
{
	const volatile struct py_layout *l = &cfg.layout;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_stack *stack;
	struct entry_scratch *scratch;
	struct func_key *key;
	char *frame_head;
	struct func_stats *st = 0;
	__u32 fsize = cfg.frame_head, flags = 0;
	const void *code;
	int is_new, counted = 1;

	if (cfg.stop_at_first_eval && !first_eval_seen)
		stop_for_hook();

	stack = thread_stack(tid, 1);
	if (!stack)
		return 0;
	scratch = &stack->scratch;
	key = &scratch->key;
	frame_head = (char *)scratch->frame_words;
	__builtin_memset(key, 0, sizeof(*key));
	key->tgid = bpf_get_current_pid_tgid() >> 32;
	if (fsize > FRAME_HEAD_MAX || fsize < 8 || bpf_probe_read_user(scratch->frame_words, fsize, frame))
		goto bad;
	code = (const void *)PY_CODE_ADDRESS(FIELD(frame_head, fsize, l->frame_code, __u64), l);
	if (code_key(code, key, &flags, scratch->code_words))
		goto bad;

	/* From 3.11, calling a generator function runs its frame in the eval
	 * loop just long enough to create the generator (RETURN_GENERATOR).
	 * cProfile sees no call there, only each resumption, which runs in a
	 * frame the generator owns. */
	if (l->frame_owner != PY_NO_FIELD && (flags & PY_CO_GENERATOR_LIKE) &&
	    FIELD(frame_head, fsize, l->frame_owner, __u8) == l->frame_owned_by_thread)
		counted = 0;

	if (counted) {
		st = function_stats(key, &is_new);
		if (is_new)
			announce(key, code, 0, 0);
	}
	goto push;
bad:
	/* Still push, so that this frame's return pops the right slot. */
	count(CALLS_BAD_CODE);
	key->id = 0;
	st = function_stats(key, &is_new);
push:
	return open_call(stack, tid, key, st, (__u64)frame, tstate, counted, RETURN_IF_SHALLOW, cas);
}

#include "calls_inline.bpf.h"

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
