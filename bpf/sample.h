/* What `pytrace sample` shares between its BPF program and user space. */
#ifndef PYTRACE_SAMPLE_H
#define PYTRACE_SAMPLE_H

#include "python.h"

/* Python frames recorded per sample; a deeper stack is marked truncated. */
#define MAX_FRAMES 256
/* Kernel frames recorded per sample (the kernel's own limit is 127). */
#define MAX_KERNEL_FRAMES 128
/* Bytes of a frame read at once: every field the walk needs lies in them. */
#define SAMPLE_FRAME_HEAD 128
/* The most bytes of a code object read to get its name and file name
 * pointers (neighbours in every version). */
#define NAMES_READ 32
/* Bytes of a PyThreadState read at once: its thread id and its current
 * frame (or cframe) pointer lie in them in every layout. */
#define SAMPLE_TSTATE_HEAD 256
#define MAX_THREAD_SCAN 512

/* --native: the user stack copied per sample, in whole pages from the one
 * holding the stack pointer up (a page that cannot be read ends the copy).
 * 64 KiB holds the C frames of a few dozen nested eval calls, and what
 * the stack scan past code without unwind information reads above them. */
#define NATIVE_PAGE 4096
#define NATIVE_STACK_PAGES 16
#define NATIVE_STACK_BYTES (NATIVE_STACK_PAGES * NATIVE_PAGE)

/* Samples are counted in the kernel, per stack: a stack is named by a hash
 * of what the walk read (each frame's code object and instruction, the
 * kernel frames, the flags below), computed during the walk. The counts map
 * is keyed by it; the frames themselves go to user space once, in a
 * stack_record, when the stack is first seen (so that user space names its
 * code objects while they are alive). */
struct stack_key {
	__u32 pid;
	__u32 tid;  /* 0 unless sample_config.per_thread */
	__u64 hash;
};

/* Ring-buffer records start with their kind. */
enum record_kind {
	RECORD_STACK = 1,
	RECORD_NATIVE = 2,
};

struct py_frame_ref {
	__u64 code;  /* code object address */
	__u64 instr; /* what the layout's frame_instr holds: an instruction address or f_lasti */
	/* The code object's name (its co_qualname pointer) when the stack was
	 * sent: user space names the stack a little later, by when the code
	 * object may have been freed and another made at its address. */
	__u64 name;
	/* Its file name (co_filename pointer), read with the name: module
	 * bodies all share the interned name `<module>`, and the next module's
	 * code object is often made at a freed one's address. */
	__u64 file;
	/* The frame's globals (its module's dict), 0 where the layout has
	 * none: module bodies share their interned name `<module>`, and the
	 * next module's code object is often made at the freed one's address;
	 * their dicts live on, one per module. Hashed with the frame and part
	 * of user space's key for the code object. */
	__u64 globals;
};

/* A stack seen for the first time (or again after user space forgot it).
 * Only the first `frames` entries of `frame` are sent. */
struct sample_stack {
	__u32 kind;           /* RECORD_STACK */
	__u32 pid;
	__u64 hash;
	__u32 frames;         /* Python frames, innermost first */
	__s32 kernel_frames;  /* kernel return addresses, innermost first; negative: bpf_get_stack's error */
	__u8 truncated;       /* more frames than MAX_FRAMES */
	__u8 no_python;       /* the thread runs no Python code (no thread state or frame) */
	__u8 thread_state;    /* --idle --states: enum thread_state, else 0 */
	__u8 pad;
	__s32 syscall;        /* THREAD_RELEASED: the system call it is in, or -1 */
	/* --async: the asyncio task (TaskObj address) the thread was running,
	 * 0 for none; part of the hash, so each task's samples count apart. */
	__u64 running_task;
	/* Bit i (of word i / 64): frame i is the first one its C-level
	 * _PyEval_EvalFrameDefault call ran, so it and the frames inside it up to
	 * the previous such frame are that call's (--native merges by it). */
	__u64 entry[MAX_FRAMES / 64];
	__u64 kernel[MAX_KERNEL_FRAMES];
	struct py_frame_ref frame[MAX_FRAMES];
};

/* --idle --states: what a sampled thread was doing, as a stack's root. */
enum thread_state {
	THREAD_STATE_NONE = 0,
	THREAD_RUNNING = 1,          /* holding the GIL (on CPU or waiting for one) */
	THREAD_RUNNING_NO_GIL = 2,   /* on CPU without the GIL: C code that released it */
	THREAD_WAITING_FOR_GIL = 3,  /* asleep on the GIL's condition or mutex */
	THREAD_RELEASED = 4,         /* without the GIL, off CPU: in `syscall`, or preempted */
};

/* --native: native frames unwound in the kernel (bpf/native_unwind.bpf.h)
 * from the unwind tables user space loads (src/native/kernel_tables.rs):
 * at most this many frames a sample, a power of two for masks. */
#define MAX_NATIVE_FRAMES 256
/* Set in a frame's address: the address is exact (the sampled frame, or
 * one a signal interrupted), not a return address, whose call is at
 * address - 1. Bit 63: user addresses stay below 2^47. */
#define NATIVE_EXACT_PC (1ULL << 63)

/* Why a sample's native stack ends: one per sample, counted per CPU
 * (native_ends) and sent with the sample. */
enum native_end {
	NATIVE_COMPLETE = 0,          /* the thread's first frame was reached */
	NATIVE_FRAME_CAP = 1,         /* MAX_NATIVE_FRAMES frames */
	NATIVE_NO_MAPPING = 2,        /* pc in no executable mapping BPF knows */
	NATIVE_NO_TABLE = 3,          /* pc in a file without a table in the rows map */
	NATIVE_NO_UNWIND_INFO = 4,    /* no row for pc and the frame-pointer step failed */
	NATIVE_UNSUPPORTED = 5,       /* a rule the stepper does not follow */
	NATIVE_READ_FAILED = 6,       /* a stack word could not be read */
	NATIVE_BAD_RETURN_ADDRESS = 7,/* the CFA or the return address is not a user address */
	NATIVE_SP_NOT_RISING = 8,     /* the CFA is not above sp */
	NATIVE_STACK_COPY = 9,        /* stopped at no mapping, no table or no unwind information:
				       * the stack from there copied for user space (`reason` says which) */
	NATIVE_NO_REGISTERS = 10,     /* no user registers (a kernel thread) */
	NATIVE_NOT_UNWOUND = 11,      /* --idle: nothing unwound in the kernel (a reason only) */
	NATIVE_END_COUNT,
};

/* --native: one record per sample. Its Python and kernel frames are the
 * stack_record of `hash`, sent before it. The kernel's frames follow the
 * header (`frames` of them); where the kernel could go no further but user
 * space may (end NATIVE_STACK_COPY, or --idle, which unwinds nothing in the
 * kernel), NATIVE_STACK_BYTES of stack follow the frames (stack_len of
 * them filled), copied from user_sp's page, and user space unwinds on from
 * the registers user_*: the last of the kernel's frames is theirs. */
struct native_record {
	__u32 kind;        /* RECORD_NATIVE */
	__u32 pid;
	__u32 tid;
	__u32 stack_len;   /* bytes copied, a multiple of NATIVE_PAGE */
	__u64 hash;
	/* With a stack copy, the registers user space's unwinding starts from
	 * (the thread's own where it was interrupted, or the kernel's last
	 * frame's). */
	__u64 user_ip;
	__u64 user_sp;
	__u64 user_bp;
	__u64 stack_start; /* address of the first copied byte: user_sp's page */
	__u8 native;       /* 1: registers recorded */
	__u8 end;          /* enum native_end */
	__u8 reason;       /* NATIVE_STACK_COPY: the end that made the kernel stop */
	__u8 copy;         /* 1: the stack copy follows the frames */
	__u32 frames;      /* kernel-unwound frames, innermost first */
	__u64 frame[MAX_NATIVE_FRAMES]; /* run-time addresses, NATIVE_EXACT_PC where exact */
};

#define NATIVE_HEADER_BYTES (sizeof(struct native_record) - MAX_NATIVE_FRAMES * sizeof(__u64))
#define NATIVE_RECORD_BYTES (sizeof(struct native_record) + NATIVE_STACK_BYTES)

/* One row of a file's unwind table: src/native/table.rs's UnwindRow. */
struct unwind_row {
	__u32 pc;         /* address minus the table's start */
	__s16 cfa_offset;
	__u8 kind;        /* enum unwind_row_kind */
	__s8 rbp_at;      /* caller's rbp at CFA + 8 * rbp_at; 0: unchanged */
};

/* table.rs's RowKind. */
enum unwind_row_kind {
	ROW_CFA_RSP = 0,
	ROW_CFA_RBP = 1,
	ROW_PLT = 2,
	ROW_SIGNAL_FRAME = 3,
	ROW_END_OF_STACK = 4,
	ROW_NO_FDE = 5,
	/* 6 and up: unsupported rules */
};

/* The rows map's entries when --native is off (user space sizes it at
 * load otherwise). */
#define MIN_UNWIND_ROWS 1
/* Fixed-count binary search steps: enough for 2^22 rows (32 MiB). */
#define ROW_SEARCH_STEPS 23
/* A process's executable mappings BPF knows (a power of two). */
#define MAX_NATIVE_MAPPINGS 512
#define MAPPING_SEARCH_STEPS 10
/* Processes whose mappings BPF knows at once (--all --native). */
#define MAX_NATIVE_PROCESSES 64

/* One executable mapping: its table's rows are
 * unwind_rows[first_row, first_row + rows), row pc 0 at table_start
 * (run-time address). rows 0: the file has no table. */
struct native_mapping {
	__u64 start;
	__u64 end;
	__u64 table_start;
	__u32 first_row;
	__u32 rows;
};

/* A process's executable mappings, sorted by start, not overlapping. */
struct native_mappings {
	__u32 count;
	__u32 pad;
	struct native_mapping m[MAX_NATIVE_MAPPINGS];
};

enum sample_counter {
	SAMPLE_LOST,          /* ring buffer full: a new stack's frames or a --native record not sent */
	SAMPLE_BAD_FRAME,     /* a frame could not be read: the walk stopped there */
	SAMPLE_NO_THREAD,     /* no thread state for the sampled thread */
	SAMPLE_NO_USER_REGS,  /* --native: the thread's saved registers are not user mode ones
			       * (a kernel thread; seen too while a `--` target is being started) */
	SAMPLE_NATIVE_ON_CPU, /* --idle --native: the thread was running on another CPU, so its
			       * registers were not saved anywhere BPF can read them */
	SAMPLE_COUNTS_FULL,   /* the counts map held as many stacks as it can until user space drained it */
	SAMPLE_KERNEL_STACK_FAILED, /* --kernel: bpf_get_stack failed; the sample has no kernel frames */
	SAMPLE_GIL_NOT_HELD,  /* --gil: samples left out, their thread not holding the GIL */
	SAMPLE_GIL_UNREADABLE, /* --gil: samples left out, the GIL's state not readable (or not a GIL's) */
	SAMPLE_TASK_SWITCHED, /* --async --idle: samples left out, their thread switched asyncio tasks while read */
	SAMPLE_TORN,          /* --idle: samples lost, their thread's stack changed while it was read */
	SAMPLE_COUNTER_COUNT,
};

/* One process to sample, in the `processes` map keyed by its PID: one
 * BPF program samples any number of them, each with its own Python's
 * layout. */
struct sample_target {
	struct py_layout layout;
	/* &_PyRuntime.interpreters.head; 0 until its file is mapped. */
	__u64 interpreters_head;
	/* The bytes of a frame read in one go: every field below lies in
	 * [frame_read_start, frame_read_start + frame_read_size), and the
	 * offsets below count from frame_read_start. */
	__u32 frame_read_start;
	__u32 frame_read_size;
	__u32 frame_code;
	__u32 frame_previous;  /* the link to the calling frame */
	__u32 frame_instr;
	__u32 frame_globals;   /* PY_NO_FIELD when the target's layout moved from the table's */
	__u32 frame_owner;     /* PY_NO_FIELD before 3.11 */
	__u32 frame_is_entry;  /* PY_NO_FIELD but on 3.11 */
	__u32 frames_contiguous; /* 3.11+: a thread's frames are laid out one after another */
	/* The bytes of a code object read_names reads, from names_read_start:
	 * its qualified name and file name pointers, at these offsets from
	 * names_read_start. */
	__u32 names_read_start;
	__u32 names_read_size;
	__u32 name_in_read;
	__u32 file_in_read;
	__u32 tstate_thread_id;
	/* The bytes of a PyThreadState read in one go, from tstate_read_start:
	 * they hold its thread id and its current frame (or cframe) pointer,
	 * at these offsets from tstate_read_start. */
	__u32 tstate_read_start;
	__u32 tstate_read_size;
	__u32 tstate_id_in_read;
	__u32 tstate_current_in_read;
	__u32 interp_threads_head;
	__u32 tstate_next;
	/* --gil: where the GIL's state is. 3.9-3.11: one for the runtime, at
	 * gil_address; 3.12+: each interpreter's, at the pointer at
	 * interp_gil in the thread's interpreter (gil_address 0). gil_size 0:
	 * none known (a free-threaded build). */
	__u64 gil_address;
	__u32 interp_gil;
	__u32 gil_last_holder; /* the PyThreadState that took it last */
	__u32 gil_locked;      /* an int: 1 while held */
	__u32 gil_size;
	/* --async: _PyThreadStateImpl.asyncio_running_task, PY_NO_FIELD
	 * before 3.14. */
	__u32 tstate_running_task;
};

#define MAX_PROCESSES 4096
/* The sampling clock's period differs per CPU and per window (clock.rs
 * draws it at random, so that periodic work cannot lock in phase with it),
 * so a sample counts for its period: the counts are sums of weights, in
 * units of SAMPLE_WEIGHT per mean period. With equal weights a short run's
 * sample count, and so its CPU time estimate, would depend on which windows
 * the target happened to run in (about 8 % off in 3 s, simulated). An
 * enum, so the number reaches Rust through the skeleton (counts.rs). */
enum sample_weight {
	SAMPLE_WEIGHT = 1024,
};
/* CPUs whose clock's weight is kept; one beyond counts SAMPLE_WEIGHT. */
#define MAX_WEIGHTED_CPUS 1024
/* Distinct stacks (per thread with --threads) one drain of the counts map
 * can hold: user space sizes it to the rate, between 4096 and 65536. */
#define MAX_COUNTED_STACKS 4096
/* Stacks whose frames user space has been sent; forgetting one (LRU) only
 * makes the program send it again. */
#define MAX_KNOWN_STACKS 32768

struct sample_config {
	__u8 kernel_stacks;    /* also record kernel stacks */
	__u8 native;           /* also record user registers and stack */
	__u8 per_thread;       /* count stacks per thread (--threads) */
	__u8 task_pt_regs;     /* --native: use bpf_task_pt_regs (else the kernel stack's top, as before 5.15) */
	__u8 gil_only;         /* --gil: count only samples of threads holding the GIL */
	__u8 thread_states;    /* --idle --states: mark each sample with its thread's state */
	__u8 async_tasks;      /* --async: record the asyncio task each thread is running */
	__u8 once;             /* dump: each thread read once, passes repeated for those torn */
};

#endif
