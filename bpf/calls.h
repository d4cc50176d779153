/* Everything `pytrace calls` shares between its BPF program and user space.
 * Rust reads these through the skeleton's generated types (src/bpf/mod.rs),
 * never through a hand-written copy. */
#ifndef PYTRACE_CALLS_H
#define PYTRACE_CALLS_H

#include "python.h"
#include "histogram.h" /* func_stats.hist: HIST_BUCKETS */

/* Timed frames per thread. Deeper calls are still counted; their time is not
 * (counter CALLS_DEEP_UNTIMED says how many). */
#define MAX_DEPTH 256

/* The kernel arms a uretprobe only while fewer than this many are pending on
 * a thread (MAX_URETPROBE_DEPTH in kernel/events/uprobes.c). Calls deeper
 * than that return unseen; their end is inferred at the thread's next event. */
#define URETPROBE_DEPTH 64
/* Preallocated, so a burst of new functions never fails for lack of memory:
 * about 2.7 KiB each. */
#define MAX_FUNCTIONS 16384
#define MAX_THREADS 16384 /* live ones: an exiting thread's entry is deleted */
/* Processes the target forks while traced (and their forks), alive at once:
 * they inherit the eval-frame hook, and user space restores it in them. */
#define MAX_CHILDREN 4096
/* Distinct caller->callee pairs, counted only for `calls --pstats` (the map
 * has one entry otherwise). Preallocated: about 200 bytes each. */
#define MAX_EDGES 65536

#define NAME_CAP 128
#define FILE_CAP 256

/* Every way an event can be lost or an input can be refused, and how many
 * frame evaluations the probes saw (each one entry and one return hit). */
enum calls_counter {
	CALLS_NEW_FUNCTION_LOST,   /* ring buffer full: a function's name was not sent */
	CALLS_FUNCTION_MAP_FULL,   /* more distinct functions than MAX_FUNCTIONS, or no memory for one */
	CALLS_THREAD_MAP_FULL,     /* more live threads than MAX_THREADS */
	CALLS_BAD_CODE,            /* frame's code object unreadable or not a code object */
	CALLS_UNMATCHED_RETURN,    /* a return with no entry seen (frames older than attach) */
	CALLS_DEEP_UNTIMED,        /* calls deeper than MAX_DEPTH: counted, not timed */
	CALLS_STOP_FAILED,         /* could not stop the target at its first frame */
	CALLS_INFERRED_RETURN,     /* return unseen (deeper than URETPROBE_DEPTH, or inline): timed to the next event */
	CALLS_STACK_RESYNC,        /* shadow stack disagreed with the interpreter's */
	CALLS_EVALUATIONS,         /* frame evaluations entered, counted as calls or not */
	CALLS_INLINED_INIT,        /* 3.13: __init__ calls run inline, counted untimed */
	CALLS_CHILD_MAP_FULL,      /* a forked child not tracked: more than MAX_CHILDREN */
	CALLS_THREAD_EXITS,        /* threads whose entry was deleted when they exited */
	CALLS_INLINED_CALL,        /* 3.11.0-3.11.3: __getitem__ run inline, timed to the next event */
	CALLS_SKIPPED_CLOSE,       /* 3.13+: close() skipped a generator's frame, counted untimed */
	CALLS_EDGE_MAP_FULL,       /* calls of a caller->callee pair past MAX_EDGES, in no edge */
	CALLS_EDGE_NO_CALLER,      /* calls deeper than MAX_DEPTH: caller unknown, in no edge */
	CALLS_COUNTER_COUNT,
};

/* What a shadow-stack slot (struct frame_slot in calls.bpf.c) holds: user
 * space reads them too, to close the calls still open when tracing ends. */
enum slot_flag {
	SLOT_COUNTED = 1,   /* a call cProfile would count; else a generator's creation */
	SLOT_OUTERMOST = 2, /* not a recursive call: its time counts in total_ns */
	SLOT_RETURNS = 4,   /* its return will be seen (within URETPROBE_DEPTH) */
	SLOT_EDGE = 8,      /* its caller->callee edge was counted: time it too */
	SLOT_EDGE_OUTERMOST = 16, /* no call of the same edge was open: its time counts in total_ns */
};

/* One Python function. In uprobe mode `id` is the code object's address and
 * `aux` a fingerprint of its name and file: their addresses, and the name's
 * str hash and first characters. A function whose code object (and
 * name) reuse the addresses of a freed one still gets a key of its own.
 * (Two keys for one function do no harm: user space merges rows by name,
 * file and line.) In USDT mode they are the probe's name and file string
 * addresses. */
struct func_key {
	__u64 id;
	__u64 aux;
	__u32 line;
	__u32 tgid;
};

struct func_stats {
	__u64 calls;
	/* Calls made while no call of the same function was open: cProfile's
	 * primitive calls (the 20 of `ncalls 21/1` that are recursive are not). */
	__u64 primitive_calls;
	__u64 timed_calls;
	__u64 total_ns;   /* outermost calls only, so recursion is not counted twice */
	__u64 self_ns;
	__u64 max_ns;
	/* What `pytrace compare` needs to take the probes' own cost out of the
	 * times above: every probe hit costs time, part of it inside the timed
	 * call and part in its caller's. */
	__u64 child_calls;     /* evaluations entered directly from this function's timed calls */
	__u64 outermost_calls; /* timed calls whose time counts in total_ns */
	__u64 nested_calls;    /* evaluations entered during those outermost calls */
	/* Timed calls during which the thread left its CPU (preempted, or
	 * waiting: for the GIL, a lock, I/O): their wall time includes that. */
	__u64 off_cpu_calls;
	__u64 hist[HIST_BUCKETS];
};

/* One caller->callee pair, what cProfile keeps per edge for pstats' callers
 * map. The caller is the function whose call is just below on the thread's
 * shadow stack. Callee first: a shadow-stack slot holds the two in this
 * order, so the key is looked up where it lies (see frame_slot). */
struct edge_key {
	struct func_key callee;
	struct func_key caller;
};

struct edge_stats {
	__u64 calls;
	/* Calls made while no call of the same pair was open (cProfile's rule
	 * for an edge's primitive calls). */
	__u64 primitive_calls;
	__u64 self_ns;  /* the callee's self time in these calls */
	__u64 total_ns; /* their inclusive time, outermost calls of the pair only */
};

/* Sent once per function, the first time it is called, while its code object
 * is certainly alive. */
struct new_function {
	struct func_key key;
	__u32 name_len;  /* characters (PyUnicode) or bytes (UTF-8) */
	__u32 file_len;
	__u8 name_kind;  /* enum str_kind */
	__u8 file_kind;
	__u8 pad[6];
	char name[NAME_CAP];
	char file[FILE_CAP];
};

/* The entry probe reads a frame's and a code object's first bytes in one
 * read each, then picks the fields out by offset. */
#define FRAME_HEAD_MAX 128

struct calls_config {
	struct py_layout layout;
	/* Bytes to read from a frame and a code object to cover every field the
	 * layout names (at most FRAME_HEAD_MAX, and bpf/python_code.bpf.h's
	 * CODE_HEAD_MAX). */
	__u32 frame_head;
	__u32 code_head;
	__u32 tgid;
	/* Address of PyCode_Type in the target; 0 skips the type check. */
	__u64 code_type;
	/* Non-zero: stop the target (SIGSTOP, seen by pytrace as its ptrace
	 * tracer) at its first frame evaluation. */
	__u64 stop_at_first_eval;
	/* Non-zero (scripts/bench.sh only): the uprobe programs return at once,
	 * so a run measures the kernel's own cost of the probe, the floor. */
	__u64 empty_probe;
	/* 3.13's inlined __init__ (inlined_init in calls.bpf.c): where a heap
	 * type keeps its cached __init__ and a function its code object. */
	__u32 heaptype_spec_init;
	__u32 function_code;
	/* Where a generator embeds its frame (skipped_close in calls.bpf.c). */
	__u32 gen_iframe;
	/* Non-zero (`calls --pstats`): count caller->callee edges too. */
	__u32 count_edges;
};

#endif
