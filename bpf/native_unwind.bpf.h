/* --native: unwinding a sampled thread's native stack in the kernel
 * (docs/design/native-unwind.md, steps 2 to 5), from the unwind tables
 * user space builds from each mapped file's .eh_frame (src/native/table.rs)
 * and loads into unwind_rows, and each process's executable mappings it
 * loads into native_mappings (src/native/kernel_tables.rs). Each frame
 * mirrors table.rs's `step` and `frame_pointer_step`; where neither finds
 * the caller and user space might (code without unwind information, an
 * address in a file mapped since, a file whose table did not fit), the
 * sample sends the stack from there for user space's unwinder and scan.
 *
 * The searches and the walk are global functions: the verifier checks each
 * once, apart from the program's own states, and they take only scalars
 * (all 5.10 allows). The walk's frame loop is a bounded loop for kernels
 * before 5.17 and bpf_loop after, as the Python walk's. */
#ifndef PYTRACE_NATIVE_UNWIND_BPF_H
#define PYTRACE_NATIVE_UNWIND_BPF_H

/* BPF_F_MMAPABLE (5.5): user space writes a table's rows through a
 * memory map of the array, not with one system call per row. */
#define NATIVE_MAP_MMAPABLE (1U << 10)

/* Every loaded file's rows, each file a contiguous range; sized by user
 * space at load (the memory bound). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MIN_UNWIND_ROWS);
	__uint(map_flags, NATIVE_MAP_MMAPABLE);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* pid -> its slot in native_mappings. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NATIVE_PROCESSES);
	__type(key, __u32);
	__type(value, __u32);
} native_slots SEC(".maps");

/* Per slot, a process's executable mappings; one entry unless --native. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct native_mappings);
} native_mappings SEC(".maps");

/* One read of the stack: a few frames of C code, and the size that made
 * the steady cost lowest (one read instead of two a frame). */
#define NATIVE_WINDOW 4096

/* The walk's state and the record it fills, per CPU. */
struct native_scratch {
	struct native_record rec;
	__u64 pc, sp, bp;
	/* The mapping of the last frame: consecutive frames are mostly in one
	 * file, whose mapping is then not searched again. */
	__u64 map_start, map_end, table_start;
	__u32 first_row, rows;
	__u32 slot;
	__u8 exact; /* pc is exact: the first frame, or one a signal interrupted */
	__u8 pad[3];
	/* The sample's stack key, for the tail-called unwinding. */
	__u64 key_pid_tid, key_hash;
	/* Stack bytes read at window_start (window_len of them): most frames'
	 * words are in the one read, not a helper call each. */
	__u64 window_start, window_len;
	__u8 window[NATIVE_WINDOW];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct native_scratch);
} native_scratch SEC(".maps");

/* Samples per enum native_end, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NATIVE_END_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} native_ends SEC(".maps");

/* Addresses at and above this are the kernel's (table.rs's USER_SPACE_END). */
#define NATIVE_USER_END 0x0000800000000000ULL
/* table.rs's MAX_FRAME_POINTER_FRAME. */
#define NATIVE_MAX_FP_FRAME (1ULL << 20)
/* Where the kernel's ucontext_t holds the interrupted rbp, rsp and rip. */
#define UCONTEXT_RBP 120
#define UCONTEXT_RSP 160
#define UCONTEXT_RIP 168
/* native_find_row's answer when no row covers the address. */
#define ROW_NONE (~0ULL)

static __always_inline void native_count(__u32 end)
{
	__u64 *value = bpf_map_lookup_elem(&native_ends, &end);

	if (value)
		*value += 1;
}

/* The row (an unwind_row's 8 bytes as a word) of the last row at or below
 * `offset` in unwind_rows[first, first + count), ROW_NONE for none: a
 * fixed-count binary search, each step an array look-up the verifier
 * inlines. */
__noinline __u64 native_find_row(__u32 first, __u32 count, __u32 offset)
{
	struct unwind_row *row;
	__u32 lo = 0, hi = count, idx;

	for (int i = 0; i < ROW_SEARCH_STEPS; i++) {
		__u32 mid;

		if (lo >= hi)
			break;
		mid = lo + (hi - lo) / 2;
		idx = first + mid;
		row = bpf_map_lookup_elem(&unwind_rows, &idx);
		if (!row)
			return ROW_NONE;
		if (row->pc <= offset)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* lo < hi: more rows than the steps search (user space loads none). */
	if (lo == 0 || lo < hi)
		return ROW_NONE;
	idx = first + lo - 1;
	row = bpf_map_lookup_elem(&unwind_rows, &idx);
	if (!row)
		return ROW_NONE;
	return *(__u64 *)row;
}

/* The index in slot's mappings of the one holding `address`, -1 for none. */
__noinline int native_find_mapping(__u32 slot, __u64 address)
{
	struct native_mappings *ms = bpf_map_lookup_elem(&native_mappings, &slot);
	__u32 lo = 0, hi;

	if (!ms)
		return -1;
	hi = ms->count;
	if (hi > MAX_NATIVE_MAPPINGS)
		return -1;
	for (int i = 0; i < MAPPING_SEARCH_STEPS; i++) {
		__u32 mid;

		if (lo >= hi)
			break;
		mid = lo + (hi - lo) / 2;
		if (ms->m[mid & (MAX_NATIVE_MAPPINGS - 1)].start <= address)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0 || lo < hi)
		return -1;
	lo = (lo - 1) & (MAX_NATIVE_MAPPINGS - 1);
	if (address >= ms->m[lo].end)
		return -1;
	return lo;
}

/* The stack word at addr, from the window, read anew from addr when addr
 * is outside it (to the end of addr's page if a whole window cannot be
 * read: the stack's mapping ends there). */
static __always_inline int native_read_word(struct native_scratch *ns, __u64 addr, __u64 *out)
{
	__u64 off = addr - ns->window_start;

	if (addr < ns->window_start || off + 8 > ns->window_len) {
		__u64 len = NATIVE_WINDOW;

		if (bpf_probe_read_user(ns->window, NATIVE_WINDOW, (const void *)addr)) {
			len = NATIVE_PAGE - (addr & (NATIVE_PAGE - 1));
			barrier_var(len);
			if (len < 8 || len > NATIVE_WINDOW)
				return -1;
			if (bpf_probe_read_user(ns->window, len, (const void *)addr))
				return -1;
		}
		ns->window_start = addr;
		ns->window_len = len;
		off = 0;
	}
	barrier_var(off);
	if (off > NATIVE_WINDOW - 8)
		return -1;
	*out = *(__u64 *)(ns->window + off);
	return 0;
}

/* Ends the walk; the ends user space may get further from the stack copy. */
static __always_inline int native_stop(struct native_scratch *ns, __u32 end)
{
	if (end == NATIVE_NO_MAPPING || end == NATIVE_NO_TABLE || end == NATIVE_NO_UNWIND_INFO) {
		ns->rec.reason = end;
		end = NATIVE_STACK_COPY;
	}
	ns->rec.end = end;
	return 1;
}

/* Makes the mapping holding `address` the scratch's; false if none. */
static __always_inline bool native_use_mapping(struct native_scratch *ns, __u64 address)
{
	int idx = native_find_mapping(ns->slot, address);
	struct native_mappings *ms;
	struct native_mapping *m;
	__u32 slot = ns->slot;

	if (idx < 0)
		return false;
	ms = bpf_map_lookup_elem(&native_mappings, &slot);
	if (!ms)
		return false;
	m = &ms->m[idx & (MAX_NATIVE_MAPPINGS - 1)];
	ns->map_start = m->start;
	ns->map_end = m->end;
	ns->table_start = m->table_start;
	ns->first_row = m->first_row;
	ns->rows = m->rows;
	return true;
}

/* Whether the return address `ra` follows a call instruction: a call
 * rel32 (E8) or an FF /2 of any length up to 7 bytes. The code is read
 * from the target (user space's scan decodes it from the file). */
static __always_inline bool native_follows_call(__u64 ra)
{
	__u8 b[8];

	if (bpf_probe_read_user(b, sizeof(b), (const void *)(ra - 8)))
		return false;
	if (b[3] == 0xe8)
		return true;
#define FF2_AT(i) (b[i] == 0xff && ((b[i + 1] >> 3) & 7) == 2)
	return FF2_AT(6) || FF2_AT(5) || FF2_AT(4) || FF2_AT(2) || FF2_AT(1);
#undef FF2_AT
}

/* table.rs's frame_pointer_step, for a pc no row covers, with the design's
 * checks of the return address (in a mapped file, after a call). */
static __always_inline int native_frame_pointer_step(struct native_scratch *ns)
{
	__u64 bp = ns->bp, sp = ns->sp, words[2];

	if ((bp & 7) || bp < sp || bp - sp > NATIVE_MAX_FP_FRAME || bp >= NATIVE_USER_END - 16)
		return native_stop(ns, NATIVE_NO_UNWIND_INFO);
	if (bpf_probe_read_user(words, sizeof(words), (const void *)bp))
		return native_stop(ns, NATIVE_NO_UNWIND_INFO);
	if (!words[1] || words[1] >= NATIVE_USER_END || native_find_mapping(ns->slot, words[1] - 1) < 0 ||
	    !native_follows_call(words[1]))
		return native_stop(ns, NATIVE_NO_UNWIND_INFO);
	ns->pc = words[1];
	ns->sp = bp + 16;
	ns->bp = words[0];
	ns->exact = 0;
	return 0;
}

/* table.rs's signal_frame_step: through __restore_rt, the interrupted
 * registers from the ucontext_t at sp. */
static __always_inline int native_signal_step(struct native_scratch *ns)
{
	__u64 context = ns->sp, words[(UCONTEXT_RIP + 8 - UCONTEXT_RBP) / 8];

	if ((context & 7) || context >= NATIVE_USER_END - UCONTEXT_RIP)
		return native_stop(ns, NATIVE_BAD_RETURN_ADDRESS);
	if (bpf_probe_read_user(words, sizeof(words), (const void *)(context + UCONTEXT_RBP)))
		return native_stop(ns, NATIVE_READ_FAILED);
	if (!words[6] || words[6] >= NATIVE_USER_END || !words[5] || words[5] >= NATIVE_USER_END)
		return native_stop(ns, NATIVE_BAD_RETURN_ADDRESS);
	ns->pc = words[(UCONTEXT_RIP - UCONTEXT_RBP) / 8];
	ns->sp = words[(UCONTEXT_RSP - UCONTEXT_RBP) / 8];
	ns->bp = words[0];
	ns->exact = 1;
	return 0;
}

/* One frame: records pc, then moves the scratch's registers to the
 * caller's (0), or ends the walk (1), as table.rs's `step`. */
static __always_inline int native_step(struct native_scratch *ns)
{
	__u64 pc = ns->pc, sp = ns->sp, bp = ns->bp, lookup, row = ROW_NONE, cfa, ra = 0, caller_bp;
	__u32 n = ns->rec.frames;
	__s16 cfa_offset;
	__s8 rbp_at;

	if (n >= MAX_NATIVE_FRAMES)
		return native_stop(ns, NATIVE_FRAME_CAP);
	ns->rec.frame[n & (MAX_NATIVE_FRAMES - 1)] = ns->exact ? pc | NATIVE_EXACT_PC : pc;
	ns->rec.frames = n + 1;
	/* A return address's call may be its function's last instruction. */
	lookup = ns->exact ? pc : pc - 1;
	if ((lookup < ns->map_start || lookup >= ns->map_end) && !native_use_mapping(ns, lookup))
		return native_stop(ns, NATIVE_NO_MAPPING);
	if (!ns->rows)
		return native_stop(ns, NATIVE_NO_TABLE);
	if (lookup >= ns->table_start && lookup - ns->table_start <= 0xffffffffULL)
		row = native_find_row(ns->first_row, ns->rows, (__u32)(lookup - ns->table_start));
	cfa_offset = (__s16)(row >> 32);
	rbp_at = (__s8)(row >> 56);
	switch ((row >> 48) & 0xff) {
	case ROW_CFA_RSP:
		cfa = sp + (__s64)cfa_offset;
		break;
	case ROW_CFA_RBP:
		cfa = bp + (__s64)cfa_offset;
		break;
	case ROW_PLT:
		cfa = sp + ((pc & 15) >= 11 ? 16 : 8);
		break;
	case ROW_SIGNAL_FRAME:
		return native_signal_step(ns);
	case ROW_END_OF_STACK:
		return native_stop(ns, NATIVE_COMPLETE);
	case ROW_NO_FDE:
	case 0xff: /* ROW_NONE */
		return native_frame_pointer_step(ns);
	default:
		return native_stop(ns, NATIVE_UNSUPPORTED);
	}
	if ((cfa & 7) || cfa >= NATIVE_USER_END)
		return native_stop(ns, NATIVE_BAD_RETURN_ADDRESS);
	if (cfa <= sp)
		return native_stop(ns, NATIVE_SP_NOT_RISING);
	if (native_read_word(ns, cfa - 8, &ra))
		return native_stop(ns, NATIVE_READ_FAILED);
	caller_bp = bp;
	if (rbp_at && native_read_word(ns, cfa + (__s64)rbp_at * 8, &caller_bp))
		return native_stop(ns, NATIVE_READ_FAILED);
	/* A zero return address ends a stack (framehop's reading, and some
	 * runtimes end their threads' stacks so). */
	if (!ra)
		return native_stop(ns, NATIVE_COMPLETE);
	if (ra >= NATIVE_USER_END)
		return native_stop(ns, NATIVE_BAD_RETURN_ADDRESS);
	ns->pc = ra;
	ns->sp = cfa;
	ns->bp = caller_bp;
	ns->exact = 0;
	return 0;
}

static __always_inline struct native_scratch *native_start(__u64 ip, __u64 sp, __u64 bp)
{
	__u32 zero = 0;
	struct native_scratch *ns = bpf_map_lookup_elem(&native_scratch, &zero);

	if (!ns)
		return 0;
	ns->pc = ip;
	ns->sp = sp;
	ns->bp = bp;
	ns->exact = 1;
	ns->map_start = ns->map_end = 0;
	ns->window_start = ns->window_len = 0;
	ns->rec.frames = 0;
	ns->rec.end = NATIVE_COMPLETE;
	ns->rec.reason = 0;
	return ns;
}

/* One frame, as a global function: verified once, so that the bounded
 * loop below costs the verifier a call per pass (5.10 checks a bounded
 * loop pass by pass: with the step inlined, 257 passes went past its
 * million instructions). */
__noinline int native_step_once(__u32 unused)
{
	__u32 zero = 0;
	struct native_scratch *ns = bpf_map_lookup_elem(&native_scratch, &zero);

	return ns ? native_step(ns) : 1;
}

/* The walk with a bounded loop (kernels before 5.17): into the scratch's
 * record, from the registers given, for the process in `slot`. */
__noinline int native_unwind_bounded(__u32 slot, __u64 ip, __u64 sp, __u64 bp)
{
	struct native_scratch *ns = native_start(ip, sp, bp);

	if (!ns)
		return -1;
	ns->slot = slot;
	for (int i = 0; i <= MAX_NATIVE_FRAMES; i++) {
		if (native_step_once(i))
			break;
	}
	return 0;
}

/* bpf_loop's context must be on the stack: it holds the scratch's address. */
struct native_loop {
	struct native_scratch *ns;
};

static long native_loop_step(__u32 i, void *ctx)
{
	struct native_loop *loop = ctx;

	return native_step(loop->ns);
}

/* The same with bpf_loop (5.17+), whose body the verifier checks once. */
__noinline int native_unwind_loops(__u32 slot, __u64 ip, __u64 sp, __u64 bp)
{
	struct native_scratch *ns = native_start(ip, sp, bp);

	if (!ns)
		return -1;
	struct native_loop loop = { .ns = ns };

	ns->slot = slot;
	bpf_loop(MAX_NATIVE_FRAMES + 1, native_loop_step, &loop, 0);
	return 0;
}

/* The stack from sp's page up, page by page, after the record (a read
 * crossing into an unmapped page fails whole; the stack's mapping ends a
 * few pages above the outermost frame). */
static __always_inline void native_copy_stack(struct native_record *r, __u64 ip, __u64 sp, __u64 bp)
{
	__u8 *stack = (__u8 *)(r + 1);
	__u64 start = sp & ~(__u64)(NATIVE_PAGE - 1);

	r->user_ip = ip;
	r->user_sp = sp;
	r->user_bp = bp;
	r->stack_start = start;
	r->stack_len = 0;
	r->copy = 1;
#pragma unroll
	for (int i = 0; i < NATIVE_STACK_PAGES; i++) {
		if (bpf_probe_read_user(stack + i * NATIVE_PAGE, NATIVE_PAGE, (void *)(start + i * NATIVE_PAGE)))
			break;
		r->stack_len = (i + 1) * NATIVE_PAGE;
	}
}

/* A perf-event sample's native stack, unwound and sent (sp 0: no user
 * registers). A global function, so that the sampler's verification, which
 * reaches its end in as many states as the Python walk leaves it in, does
 * not go through this code in each of them (on 5.10 the sampler then went
 * past a million instructions). Called with the sample's stack key. */
#define NATIVE_SAMPLE(name, unwind)                                                                     \
	__noinline int name(__u64 pid_tid, __u64 hash, __u64 ip, __u64 sp, __u64 bp)                    \
	{                                                                                               \
		__u32 pid = pid_tid >> 32, zero = 0, *slot = bpf_map_lookup_elem(&native_slots, &pid); \
		struct native_scratch *ns;                                                              \
		__u64 frames;                                                                           \
                                                                                                        \
		if (sp)                                                                                 \
			unwind(slot ? *slot : MAX_NATIVE_PROCESSES, ip, sp, bp);                        \
		else                                                                                    \
			native_start(0, 0, 0);                                                          \
		ns = bpf_map_lookup_elem(&native_scratch, &zero);                                       \
		if (!ns)                                                                                \
			return 0;                                                                       \
		ns->rec.kind = RECORD_NATIVE;                                                           \
		ns->rec.pid = pid;                                                                      \
		ns->rec.tid = (__u32)pid_tid;                                                           \
		ns->rec.hash = hash;                                                                    \
		ns->rec.native = sp != 0;                                                               \
		ns->rec.copy = 0;                                                                       \
		ns->rec.stack_len = 0;                                                                  \
		if (!sp)                                                                                \
			ns->rec.end = NATIVE_NO_REGISTERS;                                              \
		native_count(ns->rec.end);                                                              \
		if (ns->rec.end == NATIVE_STACK_COPY) {                                                 \
			/* The stack from the kernel's last frame, for user space. */                   \
			struct native_record *r = bpf_ringbuf_reserve(&records, NATIVE_RECORD_BYTES, 0); \
                                                                                                        \
			if (!r) {                                                                       \
				count(SAMPLE_LOST);                                                     \
				return 0;                                                               \
			}                                                                               \
			if (bpf_probe_read_kernel(r, sizeof(*r), &ns->rec)) {                           \
				bpf_ringbuf_discard(r, 0);                                              \
				return 0;                                                               \
			}                                                                               \
			native_copy_stack(r, ns->pc, ns->sp, ns->bp);                                   \
			bpf_ringbuf_submit(r, ring_submit_flags(&records));                             \
			return 0;                                                                       \
		}                                                                                       \
		frames = ns->rec.frames;                                                                \
		if (frames > MAX_NATIVE_FRAMES)                                                         \
			frames = MAX_NATIVE_FRAMES;                                                     \
		if (bpf_ringbuf_output(&records, &ns->rec, NATIVE_HEADER_BYTES + frames * sizeof(__u64), \
				       ring_submit_flags(&records)))                                    \
			count(SAMPLE_LOST);                                                             \
		return 0;                                                                               \
	}

NATIVE_SAMPLE(native_sample_bounded, native_unwind_bounded)
NATIVE_SAMPLE(native_sample_loops, native_unwind_loops)

/* Before 5.17 the sampler tail-calls the unwinding (the program below)
 * rather than calling it: a 5.10 verifier cannot follow a value's
 * precision back through a call to another BPF function and then marks
 * every value precise, which stopped it pruning the Python walk's states
 * (past a million instructions). The program is set in slot 0 by user
 * space. The stack key goes through the scratch. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} native_tail SEC(".maps");

#endif
