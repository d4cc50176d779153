/* What `pytrace sample` shares between its BPF program and user space. */
#ifndef PYTRACE_SAMPLE_H
#define PYTRACE_SAMPLE_H

#include "python.h"

/* Python frames recorded per sample; a deeper stack is marked truncated. */
#define MAX_FRAMES 256
#define SAMPLE_FRAME_HEAD 128
#define MAX_THREAD_SCAN 512

/* --native: the user stack copied per sample, in whole pages from the one
 * holding the stack pointer up (a page that cannot be read ends the copy).
 * 32 KiB holds the C frames of a few dozen nested eval calls. */
#define NATIVE_PAGE 4096
#define NATIVE_STACK_PAGES 8
#define NATIVE_STACK_BYTES (NATIVE_STACK_PAGES * NATIVE_PAGE)

/* One sample of one thread: its Python frames, innermost first. */
struct py_sample {
	__u32 pid;
	__u32 tid;
	__u32 frames;
	__u8 truncated;   /* more frames than MAX_FRAMES */
	__u8 no_python;   /* the thread runs no Python code (no thread state or frame) */
	__u8 pad[2];
	__s32 kernel_stack; /* stack id in kernel_stacks, or negative */
	__u64 code[MAX_FRAMES];  /* code object addresses */
	__u64 instr[MAX_FRAMES]; /* what the layout's frame_instr holds: an instruction address or f_lasti */
	/* Bit i (of word i / 64): frame i is the first one its C-level
	 * _PyEval_EvalFrameDefault call ran, so it and the frames inside it up to
	 * the previous such frame are that call's (--native merges by it). */
	__u64 entry[MAX_FRAMES / 64];
	/* --native: the thread's user registers where it was interrupted (or
	 * entered the kernel), and the stack bytes that follow the record. */
	__u64 user_ip;
	__u64 user_sp;
	__u64 user_bp;
	__u64 stack_start; /* address of the first copied byte: user_sp's page */
	__u32 stack_len;   /* bytes copied, a multiple of NATIVE_PAGE */
	__u8 native;       /* 1: registers and stack recorded */
	__u8 pad2[3];
};

/* With --native each record is a py_sample followed by
 * NATIVE_STACK_BYTES of stack (stack_len of them filled). */
#define NATIVE_RECORD_BYTES (sizeof(struct py_sample) + NATIVE_STACK_BYTES)

enum sample_counter {
	SAMPLE_LOST,          /* ring buffer full */
	SAMPLE_BAD_FRAME,     /* a frame could not be read: the walk stopped there */
	SAMPLE_NO_THREAD,     /* no thread state for the sampled thread */
	SAMPLE_NO_USER_REGS,  /* --native: the thread's saved registers are not user mode ones
			       * (a kernel thread; seen too while a `--` target is being started) */
	SAMPLE_NATIVE_ON_CPU, /* --idle --native: the thread was running on another CPU, so its
			       * registers were not saved anywhere BPF can read them */
	SAMPLE_COUNTER_COUNT,
};

/* One process to sample, in the `processes` map keyed by its PID: one
 * BPF program samples any number of them, each with its own Python's
 * layout. */
struct sample_target {
	struct py_layout layout;
	/* &_PyRuntime.interpreters.head; 0 until its file is mapped. */
	__u64 interpreters_head;
	__u32 frame_head;      /* bytes of a frame covering code, previous, instr, owner, is_entry */
	__u32 frame_previous;  /* offset of the link to the calling frame */
	__u32 frame_instr;
	__u32 frame_is_entry;  /* PY_NO_FIELD but on 3.11 */
	__u32 tstate_thread_id;
	__u32 interp_threads_head;
	__u32 tstate_next;
};

#define MAX_PROCESSES 1024

struct sample_config {
	__u8 kernel_stacks;    /* also record kernel stacks */
	__u8 native;           /* also record user registers and stack */
	__u8 pad[6];
};

#endif
