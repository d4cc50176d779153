/* What the Python-stack walk of sample_walk.bpf.h needs around it, shared
 * by every program that walks a stack (bpf/sample.bpf.c, bpf/memory.bpf.c):
 * the ring buffer a new stack's frames go to once (struct sample_stack),
 * the stacks already sent, the threads' states, the per-CPU scratch, the
 * stack hash and the bounded accessors the walk reads through. The includer
 * defines `cfg` (struct sample_config), DEFINE_COUNTERS (count() with
 * enum sample_counter's indexes) and includes sample.h and ring.bpf.h
 * (RING_BYTES, ring_submit_flags) before this. */
#ifndef PYTRACE_SAMPLE_WALK_BASE_BPF_H
#define PYTRACE_SAMPLE_WALK_BASE_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES);
} records SEC(".maps");

/* (pid, stack hash) of the stacks whose frames user space was sent. Asked
 * only for a stack not counted yet in the counts map of the moment: one
 * counted there was sent before its first count (or is being sent again,
 * once user space forgot it, by the first sample after the next swap). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_KNOWN_STACKS);
	__type(key, struct stack_key);
	__type(value, __u8);
} known_stacks SEC(".maps");

/* (pid, code object, globals) of the innermost frames that woke user space
 * at once (new_stack_wakeup): code it had not seen run. */
struct code_seen {
	__u32 pid;
	__u32 pad;
	__u64 code;
	__u64 globals;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct code_seen);
	__type(value, __u8);
} codes_seen SEC(".maps");

/* tid -> its PyThreadState, checked at each use. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} thread_states SEC(".maps");

/* The stack being walked, per CPU: too big for the BPF stack. A program
 * does not run twice at once on one CPU (and --idle's iterator is the only
 * program loaded then). */
#define WALK_PAGE 4096
/* Links a walk follows at most: shim frames (3.12+) take a link but no
 * record, so some more links than records (a power of two, for masks). */
#define MAX_LINKS 512
#define WALK_LINKS (MAX_FRAMES + MAX_FRAMES / 4)

struct walk_scratch {
	struct sample_stack rec;
	/* The thread's PyThreadState the walk found (and checked), 0: none. */
	__u64 tstate;
	/* The first bytes of the thread's PyThreadState. */
	__u64 tstate_head[SAMPLE_TSTATE_HEAD / 8];
	/* The bytes of the frame being read, when read alone. */
	__u64 frame_head[SAMPLE_FRAME_HEAD / 8];
	/* The first page_len bytes of a page of the thread's frames, read at
	 * page_base (0: none). */
	__u64 page_base;
	__u64 page_len;
	__u8 page[WALK_PAGE];
	/* --idle: what the walk read of each link (frame address, code,
	 * previous link, and but for the innermost its instruction), hashed per
	 * link, so that a second read can tell whether the stack changed under
	 * the walk (see stack_unchanged); links: how many were read. */
	__u64 first_frame;
	__u32 links;
	__u32 pad;
	__u64 link_sum[MAX_LINKS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct walk_scratch);
} scratch SEC(".maps");

/* A stack's hash: each word the walk read mixed in turn (a multiply and
 * xor-shift per word, as in MurmurHash3's finalizer), plus markers for what
 * is not an address. 64 bits: two different stacks of one process collide
 * with odds of about n^2 / 2^65 for n stacks. */
#define HASH_SEED 0x9e3779b97f4a7c15ULL
#define HASH_NO_PYTHON 1
#define HASH_BAD_FRAME 2
#define HASH_TRUNCATED 3
#define HASH_ENTRY 4
#define HASH_KERNEL 5
#define HASH_STATE 6
#define HASH_TASK 7

static __always_inline __u64 mix(__u64 hash, __u64 word)
{
	hash ^= word;
	hash *= 0xff51afd7ed558ccdULL;
	hash ^= hash >> 33;
	return hash;
}

/* Fields of a frame's first bytes, at offsets that differ per process, so
 * the verifier cannot know them: 8-byte fields are read as an indexed word
 * (their offsets are 8-aligned in every layout), bytes by masked index. The
 * barriers keep clang from dropping the masks the verifier needs. */
static __always_inline __u64 word_at(const __u64 *words, __u32 offset)
{
	__u32 i = offset >> 3;

	barrier_var(i);
	i &= SAMPLE_FRAME_HEAD / 8 - 1;
	return (offset & 7) || offset >= SAMPLE_FRAME_HEAD ? 0 : words[i];
}

/* The same for a PyThreadState's first bytes. */
static __always_inline __u64 tstate_word(const __u64 *words, __u32 offset)
{
	__u32 i = offset >> 3;

	barrier_var(i);
	i &= SAMPLE_TSTATE_HEAD / 8 - 1;
	return (offset & 7) || offset >= SAMPLE_TSTATE_HEAD ? 0 : words[i];
}

static __always_inline __u8 byte_at(const __u64 *words, __u32 offset)
{
	barrier_var(offset);
	offset &= SAMPLE_FRAME_HEAD - 1;
	return ((const __u8 *)words)[offset];
}

/* Indexes into the record become byte offsets that are bounded where they
 * are added to the pointer: the barrier keeps clang from checking one copy
 * of an index and scaling another, which older verifiers (5.10, 6.1)
 * cannot follow. */
static __always_inline void mark_entry(struct sample_stack *rec, __u32 n)
{
	__u64 off = ((n >> 6) & (MAX_FRAMES / 64 - 1)) * sizeof(__u64);

	barrier_var(off);
	if (off <= sizeof(rec->entry) - sizeof(__u64))
		*(__u64 *)((char *)rec->entry + off) |= 1ULL << (n & 63);
}

static __always_inline struct py_frame_ref *frame_slot(struct sample_stack *rec, __u32 n)
{
	__u64 off = (__u64)(n & (MAX_FRAMES - 1)) * sizeof(struct py_frame_ref);

	barrier_var(off);
	if (off > sizeof(rec->frame) - sizeof(struct py_frame_ref))
		return 0;
	return (struct py_frame_ref *)((char *)rec->frame + off);
}

/* What a walk read of one link of the stack, hashed: the frame's address
 * and its code, previous-link and instruction words (but the innermost
 * frame's instruction, which moves as the thread runs without making the
 * stack another). */
static __always_inline __u64 link_sum(const struct sample_target *t, const __u64 *words, __u64 frame, __u32 link)
{
	__u64 sum = mix(mix(mix(HASH_SEED, frame), word_at(words, t->frame_code)), word_at(words, t->frame_previous));

	return link ? mix(sum, word_at(words, t->frame_instr)) : sum;
}

static __always_inline void keep_link(struct walk_scratch *scratch, __u32 link, __u64 sum)
{
	__u64 off = (__u64)(link & (MAX_LINKS - 1)) * sizeof(__u64);

	barrier_var(off);
	if (off <= sizeof(scratch->link_sum) - sizeof(__u64))
		*(__u64 *)((char *)scratch->link_sum + off) = sum;
	scratch->links = link + 1;
}

static __always_inline __u64 kept_link(const struct walk_scratch *scratch, __u32 link)
{
	__u64 off = (__u64)(link & (MAX_LINKS - 1)) * sizeof(__u64);

	barrier_var(off);
	if (off > sizeof(scratch->link_sum) - sizeof(__u64))
		return 0;
	return *(const __u64 *)((const char *)scratch->link_sum + off);
}

/* A walk in steps (walk_link), with what changes from one to the next. */
enum walk_result {
	WALK_NEXT = 0,  /* go on to the caller */
	WALK_ENDED,     /* no caller: the stack is whole */
	WALK_FULL,      /* the record is full */
	WALK_BAD,       /* a frame could not be read (or, checking, read otherwise) */
};

struct walk_step {
	const struct sample_target *t;
	struct walk_scratch *scratch;
	struct task_struct *task;
	__u64 frame;
	__u64 hash;
	int result;
};

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* Sends a new stack's frames (with their code objects' names, read now) to
 * user space, unless they were sent before. False if they could not be
 * (the ring buffer is full): the sample is then counted lost, since user
 * space could not name it. */
#define SEND_IF_NEW(rec, known, t, task, read_names)                                                   \
	(bpf_map_lookup_elem(&known_stacks, known) || (read_names(t, rec, task), send_stack(rec, known, task)))

/* A young process is still importing: each module's code object is freed
 * as its import ends, and a short command exits with its last stacks
 * unnamed. So for its first YOUNG_NS a new stack of it wakes user space,
 * at most every PROMPT_WAKE_NS; later new stacks wait for user space's
 * periodic read. Measured on an import-heavy command (12 stdlib modules,
 * 0.25 s): 62-78 % of samples had an unreadable frame when new stacks
 * waited, 39-58 % with a wake-up at most every 10 ms, 0-19 % every 1 ms;
 * the cost, on a line-level workload (callgraph.py) finding ~100 new
 * stacks a second: user space at 3.5 ms of CPU a second instead of 1.0,
 * for those first seconds.
 * Later, a new stack whose innermost frame runs code not seen before (an
 * import or an exec long after start) wakes user space too, at most every
 * NEW_CODE_WAKE_NS: a module body's code object lives only as long as its
 * import, and the next module's is often made at its address, so waiting
 * up to 250 ms left a whole module's samples unreadable (30 modules of 0.1
 * s each imported beside three CPU hogs: one module's 100 samples). A
 * line-level workload finds new stacks but no new code, and pays one
 * look-up a new stack. */
#define YOUNG_NS (5 * 1000 * 1000 * 1000ULL)
#define PROMPT_WAKE_NS (1000 * 1000ULL)
#define NEW_CODE_WAKE_NS (10 * 1000 * 1000ULL)
__u64 last_prompt_wake_ns = 0;

static __always_inline __u64 new_stack_wakeup(struct sample_stack *rec, struct task_struct *task)
{
	__u64 now = bpf_ktime_get_ns(), since = now - last_prompt_wake_ns;
	struct code_seen seen = { .pid = rec->pid };
	__u8 yes = 1;

	if (since < PROMPT_WAKE_NS)
		return ring_submit_flags(&records);
	if (now - BPF_CORE_READ(task, group_leader, start_time) < YOUNG_NS) {
		last_prompt_wake_ns = now;
		return BPF_RB_FORCE_WAKEUP;
	}
	if (since < NEW_CODE_WAKE_NS || !rec->frames)
		return ring_submit_flags(&records);
	seen.code = rec->frame[0].code;
	seen.globals = rec->frame[0].globals;
	if (bpf_map_lookup_elem(&codes_seen, &seen))
		return ring_submit_flags(&records);
	bpf_map_update_elem(&codes_seen, &seen, &yes, BPF_ANY);
	last_prompt_wake_ns = now;
	return BPF_RB_FORCE_WAKEUP;
}

static __always_inline bool send_stack(struct sample_stack *rec, struct stack_key *known, struct task_struct *task)
{
	__u32 frames = rec->frames;
	__u64 size;
	__u8 yes = 1;

	rec->kind = RECORD_STACK;
	rec->pid = known->pid;
	rec->hash = known->hash;
	if (frames > MAX_FRAMES)
		frames = MAX_FRAMES;
	size = offsetof(struct sample_stack, frame) + frames * sizeof(struct py_frame_ref);
	/* Keep clang from testing a copy of size and passing another. */
	barrier_var(size);
	if (size > sizeof(*rec))
		return false;
	/* Past a process's first seconds the record does not wake user space
	 * unless it runs new code (new_stack_wakeup): user space reads the
	 * ring at each of its periodic checks (every 250 ms), and is woken
	 * early only once the ring is half full. A line-level workload keeps
	 * finding a hundred new stacks a second for minutes, and each wake-up
	 * cost user space about 150 us of CPU on a virtual machine: woken at
	 * most every 50 ms, that was half of `sample`'s own CPU in steady
	 * state. The cost of waiting: a code object freed before user space
	 * reads it leaves its frame unreadable; one replaced at the same
	 * address is not misnamed (py_frame_ref's name, file and globals). */
	if (bpf_ringbuf_output(&records, rec, size, new_stack_wakeup(rec, task))) {
		count(SAMPLE_LOST);
		return false;
	}
	bpf_map_update_elem(&known_stacks, known, &yes, BPF_ANY);
	return true;
}

#endif
