/* What `pytrace sample` shares between its BPF program and user space. */
#ifndef PYTRACE_SAMPLE_H
#define PYTRACE_SAMPLE_H

#include "python.h"

/* Python frames recorded per sample; a deeper stack is marked truncated. */
#define MAX_FRAMES 256
#define SAMPLE_FRAME_HEAD 128
#define MAX_THREAD_SCAN 512

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
};

enum sample_counter {
	SAMPLE_LOST,          /* ring buffer full */
	SAMPLE_BAD_FRAME,     /* a frame could not be read: the walk stopped there */
	SAMPLE_NO_THREAD,     /* no thread state for the sampled thread */
	SAMPLE_COUNTER_COUNT,
};

/* One process to sample, in the `processes` map keyed by its PID: one
 * BPF program samples any number of them, each with its own Python's
 * layout. */
struct sample_target {
	struct py_layout layout;
	/* &_PyRuntime.interpreters.head; 0 until its file is mapped. */
	__u64 interpreters_head;
	__u32 frame_head;      /* bytes of a frame covering code, previous, instr, owner */
	__u32 frame_previous;  /* offset of the link to the calling frame */
	__u32 frame_instr;
	__u32 tstate_thread_id;
	__u32 interp_threads_head;
	__u32 tstate_next;
};

#define MAX_PROCESSES 1024

struct sample_config {
	__u8 kernel_stacks;    /* also record kernel stacks */
	__u8 pad[7];
};

#endif
