/* What `pytrace memory` shares between its BPF program and user space.
 * The Python stacks it walks are sample.h's (struct sample_stack records,
 * struct sample_target per process): src/tracing/memory.rs names them
 * with the sampler's own code. */
#ifndef PYTRACE_MEMORY_H
#define PYTRACE_MEMORY_H

#include "sample.h"

/* Where the bytes came from. */
enum memory_source {
	SOURCE_POOL = 0, /* obmalloc opened a pool (objects up to 512 bytes) */
	SOURCE_BIG = 1,  /* obmalloc handed an allocation over 512 bytes to the raw allocator */
	SOURCE_ALLOCATED = 2, /* --allocations: any object or mem allocation, at its entry point */
	SOURCE_COUNT,
};

/* Growth per stack and source, summed in the kernel over kept events. */
struct memory_key {
	__u32 pid;
	__u32 source;
	__u64 hash;
};

struct memory_growth {
	__u64 kept;      /* events kept */
	__u64 bytes;     /* their bytes */
	__u64 estimate;  /* sum of bytes / p: the Horvitz-Thompson estimate of all events' bytes */
	__u64 variance;  /* sum of (1 - p) bytes^2 / p^2 = estimate * (estimate - bytes), in bytes^2 */
	__u64 objects;   /* sum of objects / p in units of 2^-16: a chunk is one object, a pool
			  * its blocks (pprof's alloc_objects) */
};

/* The fixed point of memory_growth.objects. */
enum memory_objects { OBJECTS_FRACTION_BITS = 16 };

/* obmalloc's block sizes are (szidx + 1) times this on 64-bit builds. */
enum memory_alignment { BLOCK_ALIGNMENT = 16 };

/* A kept pool (key: struct memory_place), read from user space at each
 * --interval: its header says how many blocks are in use. */
struct memory_place {
	__u32 pid;
	__u32 pad;
	__u64 address;
};

struct kept_block {
	__u64 hash;      /* the stack that opened the pool or made the chunk */
	__u64 bytes;     /* SOURCE_BIG: the size asked for; SOURCE_POOL: the pool's */
	__u32 p;         /* the chance it was kept, in units of 2^-32 (0: 2^32, certain) */
	__u32 szidx;     /* SOURCE_POOL: the size class the pool's header said when opened */
	__u32 source;
	__u32 pad;
};

/* Pools and chunks kept for the live view. At the default --every one
 * is kept per 512 KiB of growth: 65536 hold 32 GiB. */
#define MAX_KEPT_BLOCKS 65536
/* Distinct (stack, source) pairs whose growth is summed. */
#define MAX_GROWTH_STACKS 16384
/* e^(-2^(k - EXP_FRACTION_BITS)) for each bit k of b/T in fixed point,
 * in units of 2^-32, filled by user space (the program has no floats). An
 * enum, so that the numbers reach Rust through the skeleton. */
enum memory_exp {
	EXP_FRACTION_BITS = 20,
	EXP_BITS = 25,
};

enum memory_counter {
	/* After sample.h's counters, which the walk counts in the same array. */
	MEMORY_NOT_KEPT = SAMPLE_COUNTER_COUNT, /* events not kept by the byte sampler (informational) */
	MEMORY_EVENTS,           /* events seen */
	MEMORY_GROWTH_FULL,      /* kept events lost: the growth map was full */
	MEMORY_KEPT_FULL,        /* kept blocks not followed: the kept-block map was full */
	MEMORY_BAD_CHUNK,        /* a raw allocation whose header cannot be a glibc chunk's */
	MEMORY_BAD_POOL,         /* a pool header that could not be read when opened */
	MEMORY_ALLOC_EVENTS,     /* --allocations: allocator entries seen */
	MEMORY_ALLOC_NOT_KEPT,   /* --allocations: of those, not kept by the byte sampler */
	MEMORY_NOT_WALKED,       /* kept events lost: the tail call to the walker failed */
	MEMORY_COUNTER_COUNT,
};

/* A kept event, from the probe that saw it to the walker it tail-calls
 * (one per CPU: a uprobe's programs run to the end on one CPU). */
struct kept_event {
	__u32 pid;
	__u32 source;
	__u32 szidx;
	__u32 pad;
	__u64 address;
	__u64 block_bytes; /* as kept_block.bytes: the usable bytes, unclamped */
	__u64 bytes;       /* counted, at most MAX_EVENT_BYTES */
	__u64 objects;
	__u64 p;
};

struct memory_config {
	__u64 every;           /* T: the mean bytes between kept events */
	__u64 pool_size;       /* POOL_SIZE of the target's obmalloc */
	__u32 pool_szidx;      /* offset of szidx in a pool's header */
	__u32 big_allocated;   /* --allocations on a stripped build: a big allocation's
				* event also counts as allocated (SOURCE_ALLOCATED), the
				* copies' probes seeing sizes up to 512 only */
};

#endif
