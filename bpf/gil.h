/* What `pytrace gil` shares between its BPF program and user space. */
#ifndef PYTRACE_GIL_H
#define PYTRACE_GIL_H

/* Where a thread stands with the GIL. Waiting covers both take_gil (asking
 * for it) and drop_gil (a forced switch waits there until the thread that
 * asked has taken it): either way the thread wants to run and cannot. */
enum gil_state {
	GIL_HELD = 1,
	GIL_WAITING = 2,
	GIL_RELEASED = 3, /* between drop_gil and the next take_gil: I/O, sleeps, C code */
	GIL_EXITED = 4,
};

/* One thread of the target, as the probes saw it since the session began. */
struct gil_thread {
	__u64 held_ns;
	__u64 wait_ns;
	__u64 released_ns;
	__u64 first_ns;  /* where its time in the session starts: the session's start, or its creation if later */
	__u64 since_ns;  /* when its current state began */
	__u64 exit_ns;   /* when it ended, or 0 */
	__u64 max_wait_ns;
	__u64 acquisitions; /* take_gil returns: one wait each, in the distribution */
	__u64 switches;     /* acquisitions after another thread held the GIL */
	__u64 drops;        /* drop_gil calls */
	__u64 pending_wait_ns; /* waited since it last held the GIL: the next acquisition's wait */
	__u64 tstate;       /* the PyThreadState it last asked for the GIL with */
	__u64 wait_code;    /* the code object it was running when it asked (0: none known) */
	__u64 take_since_ns; /* when it asked */
	__u64 gil;          /* the GIL it last asked for (3.12+: its interpreter's), or 0 */
	__u32 state;        /* enum gil_state */
	__u32 switch_wait;  /* 1 while in a forced switch's wait on the GIL's switch_cond */
	__u32 in_drop;      /* 1 between drop_gil's entry and return (its own probes cover what happens inside) */
	__u32 pad;
	char comm[16];      /* its name (/proc/PID/task/TID/comm) when last seen */
};

struct gil_wait_key {
	__u32 tid;
	__u32 bucket; /* wait_bucket() of bpf/histogram.bpf.h */
};

/* Set by user space: before the start nothing is counted (the probes are
 * still being attached), from the stop nothing changes (the maps are read). */
struct gil_window {
	__u64 start_ns;
	__u64 stop_ns;
};

/* The last hand-overs: who held the GIL from when to when, and the code
 * object it was running when it let go. Written by the holder, read by the
 * next taker (holding the GIL too): the GIL orders every access. */
#define GIL_HOLDER_RING 64

struct gil_holder_period {
	__u64 start_ns;
	__u64 end_ns;
	__u64 code;
};

/* Per Python function (its code object): the waits of the calls that asked
 * for the GIL in it, and the holding periods that ended in it. */
struct gil_function {
	__u64 wait_ns;
	__u64 held_ns;
};

/* A waiting function and a function that held the GIL while it waited. */
struct gil_blame_key {
	__u64 waiter_code;
	__u64 holder_code;
};

enum gil_counter {
	GIL_THREADS_FULL,     /* a thread not tracked: the thread map was full */
	GIL_HISTOGRAM_FULL,   /* a wait timed but not put in the distribution: its map was full */
	GIL_FUNCTIONS_FULL,   /* a function's wait or hold not counted: its map was full */
	GIL_BLAME_FULL,       /* a holder's share of a wait not counted: the blame map was full */
	GIL_BLAME_TRUNCATED,  /* a wait longer than the last GIL_HOLDER_RING hand-overs: its oldest holders not blamed */
	GIL_TAKE_UNSEEN,      /* a thread let the GIL go that no probe saw take it (its held time counted as released) */
	GIL_DROP_UNSEEN,      /* a thread asked for the GIL that no probe saw let it go (its released time counted as held) */
	GIL_COUNTER_COUNT,
};

#endif
