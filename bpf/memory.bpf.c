// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace memory`: the bytes the Python stacks of one process make its
 * heap grow by, sampled by bytes, and the blocks kept for the live view.
 *
 * Two sources (docs/design/memory.md), each at an instruction the kernel
 * emulates (about 1 µs a hit; a single-stepped one costs 16-19 µs):
 * - a pool opened: the conditional jump just after obmalloc's call of
 *   allocate_from_new_pool, which every call runs, where rax holds the
 *   pool's first block (the pool is that address rounded down to
 *   POOL_SIZE) and the pool's header its size class;
 * - an allocation over 512 bytes: the conditional jump after obmalloc's
 *   call of the raw allocator (rax: the chunk), its size read from the
 *   chunk's own header (glibc's size word, 8 bytes before it): one trap a
 *   big allocation. Chosen over a uprobe at PyMem_RawMalloc's entry,
 *   which is single-stepped (16.2 µs × 6.6k calls a second on
 *   alloc_heavy.py: 10.7 %) and sees every raw allocation, obmalloc's or
 *   not; and over a second probe at the call for the size asked (rdi),
 *   paired with the return per thread: 2.8-2.9 µs per big allocation on
 *   6.18, against 1.8 µs with the header, in one run (bench/results.md).
 * Found by src/python/probes/alloc_sites.rs. An event of b bytes is kept
 * with probability p = 1 - e^(-b/T) (T = --every) and stands for b/p bytes
 * (Horvitz-Thompson, unbiased); a kept event walks the Python stack with
 * sample's walker and adds to its stack's sums in the kernel. Nothing is
 * written into the target: the live view reads the kept pools' headers and
 * chunks' headers from user space.
 *
 * Kernels: uprobes, bounded loops, bpf_ringbuf_output (5.8): as sample;
 * from 5.17 the walk's loops are bpf_loop's, as sample's. */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "memory.h"
#include "python_read.bpf.h"
#include "counters.bpf.h"
#include "ring.bpf.h"
#include "registers.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The walk's own options: all off (no --async, no --native). */
const volatile struct sample_config cfg = {};
const volatile struct memory_config memory_cfg = {};
/* In .bss, not .rodata: the verifier knows frozen read-only values, and
 * with them would follow the product below as a distinct constant on each
 * of the 2^25 paths through its bits. */
__u64 exp_bits[EXP_BITS] = {};

/* The one target (sample.bpf.c's map, filled by the same code). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct sample_target);
} processes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_GROWTH_STACKS);
	__type(key, struct memory_key);
	__type(value, struct memory_growth);
} growth SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_KEPT_BLOCKS);
	__type(key, struct memory_place);
	__type(value, struct kept_block);
} kept_blocks SEC(".maps");

/* The event being kept, for the walker the probe tail-calls. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kept_event);
} kept_events SEC(".maps");

/* The one walker loaded (walk_kept or walk_kept_loops), put here by user
 * space. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} walkers SEC(".maps");

DEFINE_COUNTERS(MEMORY_COUNTER_COUNT);

struct memory_key _memory_key = {};
struct memory_growth _memory_growth = {};
struct memory_place _memory_place = {};
struct kept_block _kept_block = {};
struct kept_event _kept_event = {};
enum memory_source _memory_source = 0;
enum memory_counter _memory_counter = 0;
struct sample_stack _sample_stack = {};
struct stack_key _stack_key = {};
enum record_kind _record_kind = 0;
enum sample_counter _sample_counter = 0;
enum memory_exp _memory_exp = 0;
enum memory_objects _memory_objects = 0;
enum memory_alignment _memory_alignment = 0;

#include "sample_walk_base.bpf.h"

/* sample's walker twice, reading the current thread's memory: with plain
 * bounded loops, which kernels before 5.17 verify pass by pass, and with
 * bpf_loop, whose bodies later kernels verify once. */
#define WALK(name) CAT(name, _current)
#define WALK_READ(dst, size, src, task) bpf_probe_read_user(dst, size, src)
#define WALK_OTHER_THREAD 0
#define WALK_BPF_LOOP 0
#include "sample_async.bpf.h"
#include "sample_walk.bpf.h"
#undef WALK
#undef WALK_BPF_LOOP
#define WALK(name) CAT(name, _current_loops)
#define WALK_BPF_LOOP 1
#include "sample_async.bpf.h"
#include "sample_walk.bpf.h"
#undef WALK
#undef WALK_READ
#undef WALK_OTHER_THREAD
#undef WALK_BPF_LOOP

/* Sizes above this are counted as this (b << 32 must fit 64 bits). */
#define MAX_EVENT_BYTES (1ULL << 31)

/* The chance an event of `bytes` is kept, 1 - e^(-bytes/T), in units of
 * 2^-32 (2^32: certain): e^(-x) as the product of e^(-2^j) over the bits
 * of x in fixed point. */
static __always_inline __u64 keep_chance(__u64 bytes)
{
	__u64 every = memory_cfg.every ? memory_cfg.every : 1;
	__u64 x = (bytes << EXP_FRACTION_BITS) / every;
	__u64 e = 1ULL << 32;

	if (x >> EXP_BITS)
		return 1ULL << 32;
	for (int k = 0; k < EXP_BITS; k++) {
		if (x & (1ULL << k))
			e = (e * exp_bits[k]) >> 32;
	}
	e = (1ULL << 32) - e;
	return e ? e : 1;
}

/* Adds an event kept with chance `p` to the growth of its stack (`hash`)
 * under `source`; 0 if the map is full (counted). */
static __always_inline int add_growth(__u32 pid, __u32 source, __u64 hash, __u64 bytes, __u64 objects, __u64 p)
{
	struct memory_key key = { .pid = pid, .source = source, .hash = hash };
	struct memory_growth *g, first = {};
	__u64 estimate = (bytes << 32) / p;

	g = bpf_map_lookup_elem(&growth, &key);
	if (!g) {
		bpf_map_update_elem(&growth, &key, &first, BPF_NOEXIST);
		g = bpf_map_lookup_elem(&growth, &key);
		if (!g) {
			count(MEMORY_GROWTH_FULL);
			return 0;
		}
	}
	__sync_fetch_and_add(&g->kept, 1);
	__sync_fetch_and_add(&g->bytes, bytes);
	__sync_fetch_and_add(&g->estimate, estimate);
	__sync_fetch_and_add(&g->variance, estimate * (estimate - bytes));
	__sync_fetch_and_add(&g->objects, (objects << (32 + OBJECTS_FRACTION_BITS)) / p);
	return 1;
}

/* The walker, once per walker: walk_kept with bounded loops (5.10 to
 * 5.16), walk_kept_loops with bpf_loop (src/tracing/memory.rs loads one
 * and puts it in `walkers`). */
#define WALK(name) CAT(name, _current)
#define MEMORY_PROGRAM(name) name
#include "memory_events.bpf.h"
#undef WALK
#undef MEMORY_PROGRAM
#define WALK(name) CAT(name, _current_loops)
#define MEMORY_PROGRAM(name) CAT(name, _loops)
#include "memory_events.bpf.h"
#undef WALK
#undef MEMORY_PROGRAM

/* An event of `bytes` at `address`: kept or not, and if kept, handed to
 * the walker. */
static __always_inline void event(void *ctx, __u32 source, __u64 address, __u64 bytes, __u32 szidx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	struct memory_place place = { .pid = pid, .address = address };
	__u64 p, objects, block_bytes = bytes;
	struct kept_event *e;
	__u32 zero = 0;

	count(MEMORY_EVENTS);
	if (source == SOURCE_BIG && memory_cfg.big_allocated)
		count(MEMORY_ALLOC_EVENTS);
	if (bytes > MAX_EVENT_BYTES)
		bytes = MAX_EVENT_BYTES;
	/* A block opened (or made) again at a kept one's address: the kept
	 * one was emptied (or freed) since; its sample ends. Looked up first:
	 * nearly every address is not kept, and a lookup takes no lock where a
	 * delete takes its bucket's. */
	if (bpf_map_lookup_elem(&kept_blocks, &place))
		bpf_map_delete_elem(&kept_blocks, &place);
	p = keep_chance(bytes);
	if ((__u64)bpf_get_prandom_u32() >= p) {
		count(MEMORY_NOT_KEPT);
		if (source == SOURCE_BIG && memory_cfg.big_allocated)
			count(MEMORY_ALLOC_NOT_KEPT);
		return;
	}
	/* A pool holds pool_size / block size objects (its header aside). */
	objects = source == SOURCE_POOL ? bytes / (((__u64)szidx + 1) * BLOCK_ALIGNMENT) : 1;
	e = bpf_map_lookup_elem(&kept_events, &zero);
	if (!e)
		return;
	e->pid = pid;
	e->source = source;
	e->szidx = szidx;
	e->address = address;
	e->block_bytes = block_bytes;
	e->bytes = bytes;
	e->objects = objects;
	e->p = p;
	bpf_tail_call(ctx, &walkers, 0);
	count(MEMORY_NOT_WALKED);
}

SEC("uprobe")
int pool_opened(struct pt_regs *ctx)
{
	__u64 pool_size = memory_cfg.pool_size, block = PT_REGS_RC(ctx), pool;
	__u32 szidx = 0;

	if (!block || !pool_size)
		return 0;
	pool = block & ~(pool_size - 1);
	if (bpf_probe_read_user(&szidx, sizeof(szidx), (const void *)(pool + memory_cfg.pool_szidx))) {
		count(MEMORY_BAD_POOL);
		return 0;
	}
	event(ctx, SOURCE_POOL, pool, pool_size, szidx);
	return 0;
}

/* glibc's chunk header: the size word just before the memory, its low
 * three bits flags; an mmapped chunk keeps a second word of overhead. */
#define CHUNK_SIZE_WORD 8
#define CHUNK_FLAGS 7ULL
#define CHUNK_IS_MMAPPED 2ULL
#define CHUNK_ALIGNMENT 16ULL
#define CHUNK_MIN_BYTES 32ULL
#define CHUNK_MAX_BYTES (1ULL << 40)

/* The return of obmalloc's call of the raw malloc or calloc (rax: the
 * chunk): an event of the chunk's usable bytes (malloc_usable_size: the
 * size asked, rounded up to glibc's 16 bytes, or an mmapped chunk's
 * page). obmalloc calls it for sizes over 512 bytes, and for 0 (made 1:
 * the smallest chunk, 24 usable bytes). A header that cannot be a glibc
 * chunk's (another malloc preloaded, a debug hook's offset pointer) is
 * counted, not used. */
SEC("uprobe")
int raw_returned(struct pt_regs *ctx)
{
	__u64 chunk = PT_REGS_RC(ctx), word = 0, size, overhead;

	if (!chunk)
		return 0;
	if (bpf_probe_read_user(&word, sizeof(word), (const void *)(chunk - CHUNK_SIZE_WORD))) {
		count(MEMORY_BAD_CHUNK);
		return 0;
	}
	size = word & ~CHUNK_FLAGS;
	overhead = word & CHUNK_IS_MMAPPED ? 2 * CHUNK_SIZE_WORD : CHUNK_SIZE_WORD;
	if ((chunk | size) & (CHUNK_ALIGNMENT - 1) || size > CHUNK_MAX_BYTES || size < CHUNK_MIN_BYTES) {
		count(MEMORY_BAD_CHUNK);
		return 0;
	}
	event(ctx, SOURCE_BIG, chunk, size - overhead, 0);
	return 0;
}

/* --allocations: every allocation's bytes per stack, freed or not (the
 * churn view). Uprobes on the object and mem domains' entry points
 * (PyObject_Malloc/Calloc/Realloc, PyMem_Malloc/Calloc/Realloc), where the
 * size is an argument, found by src/python/probes/allocation_sites.rs at
 * the first conditional jump that every call runs (emulated) or else at
 * the entry (single-stepped). The raw domain (PyMem_RawMalloc...) is not
 * probed: obmalloc calls it for each allocation over 512 bytes, which the
 * object entry already counted. A call of `bytes` asked is kept with the
 * same sampler as the pool and chunk events and summed per stack in
 * `growth` under SOURCE_ALLOCATED (one object each). */
static __always_inline void allocation(void *ctx, __u64 bytes)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	struct kept_event *e;
	__u32 zero = 0;
	__u64 p;

	count(MEMORY_ALLOC_EVENTS);
	if (!bytes)
		return;
	if (bytes > MAX_EVENT_BYTES)
		bytes = MAX_EVENT_BYTES;
	p = keep_chance(bytes);
	if ((__u64)bpf_get_prandom_u32() >= p) {
		count(MEMORY_ALLOC_NOT_KEPT);
		return;
	}
	/* Walked and counted by the walker, as a kept pool or chunk is; with
	 * no block to follow (the walker knows SOURCE_ALLOCATED). */
	e = bpf_map_lookup_elem(&kept_events, &zero);
	if (!e)
		return;
	e->pid = pid;
	e->source = SOURCE_ALLOCATED;
	e->szidx = 0;
	e->address = 0;
	e->block_bytes = bytes;
	e->bytes = bytes;
	e->objects = 1;
	e->p = p;
	bpf_tail_call(ctx, &walkers, 0);
	count(MEMORY_NOT_WALKED);
}

/* PyObject_Malloc(size), PyMem_Malloc(size). */
SEC("uprobe")
int allocation_malloc(struct pt_regs *ctx)
{
	allocation(ctx, PT_REGS_PARM1(ctx));
	return 0;
}

/* PyObject_Calloc(nelem, elsize): the callee refuses a product over
 * PY_SSIZE_T_MAX, which then allocates nothing; counted as asked, bounded. */
SEC("uprobe")
int allocation_calloc(struct pt_regs *ctx)
{
	__u64 n = PT_REGS_PARM1(ctx), size = PT_REGS_PARM2(ctx);

	allocation(ctx, size && n > MAX_EVENT_BYTES / size ? MAX_EVENT_BYTES : n * size);
	return 0;
}

/* PyObject_Realloc(ptr, size): the new size, as memray and tracemalloc
 * count a reallocation. On a stripped build, also obmalloc's guarded
 * calls of libc's realloc (a block over 512 bytes reallocated: a list's
 * growth), probed on the call itself, which the kernel emulates. */
SEC("uprobe")
int allocation_realloc(struct pt_regs *ctx)
{
	allocation(ctx, PT_REGS_PARM2(ctx));
	return 0;
}

/* A stripped build's inlined copy of the object allocator, probed at a
 * jump every call through it runs (src/python/probes/alloc_sites_stripped.rs,
 * copy_size). The cookie says where the size is: bits 0-7 a register's
 * number, bit 8 that it holds the size less one (obmalloc's own check,
 * `nbytes - 1 < 512`), bit 10 that it holds twice the size class (an
 * index into usedpools: the class's block size), bit 9 that the size is
 * the constant in bits 16-31 instead. Needs attach cookies (5.15); user
 * space refuses before. The copies cover calls of up to 512 bytes; bigger
 * ones reach the raw allocator's sites, counted there
 * (memory_cfg.big_allocated). */
#define COPY_PLUS_ONE (1 << 8)
#define COPY_CONSTANT (1 << 9)
#define COPY_POOL_INDEX (1 << 10)
#define SMALL_REQUEST_MAX 512
#define SMALL_CLASSES (SMALL_REQUEST_MAX / BLOCK_ALIGNMENT)

SEC("uprobe")
int allocation_copy(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx), slot, bytes;

	if (cookie & COPY_CONSTANT) {
		bytes = (cookie >> 16) & 0xffff;
	} else if (cookie & COPY_POOL_INDEX) {
		/* usedpools[2 * class]: past the last class, no size (0: not counted). */
		slot = register_value(ctx, cookie & 0xff);
		bytes = slot < 2 * SMALL_CLASSES ? (slot / 2 + 1) * BLOCK_ALIGNMENT : 0;
	} else
		bytes = register_value(ctx, cookie & 0xff) + ((cookie & COPY_PLUS_ONE) ? 1 : 0);
	/* Over 512 bytes (and 0, which obmalloc makes 1 there) the copy hands
	 * the call to the raw allocator, whose return raw_returned counts:
	 * as allocated too, under big_allocated. */
	if (bytes - 1 >= SMALL_REQUEST_MAX)
		return 0;
	allocation(ctx, bytes);
	return 0;
}
