/* bpf/memory.bpf.c's programs that walk the Python stack (a pool opened,
 * a raw allocation returned), included once per walker they can run with
 * (WALK, as sample_walk.bpf.h) under the names MEMORY_PROGRAM(name) gives:
 * user space loads the pair whose loops this kernel verifies fastest.
 * No include guard, on purpose. */

/* Walks the stack of an event kept with chance `p` and adds it to its
 * stack's growth; returns the stack's hash (0: not counted). */
static __always_inline __u64 WALK(count_kept)(__u32 pid, __u32 source, __u64 bytes, __u64 objects, __u64 p)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), zero = 0;
	const struct sample_target *t = bpf_map_lookup_elem(&processes, &pid);
	struct memory_key key = { .pid = pid, .source = source };
	struct stack_key known = { .pid = pid };
	struct memory_growth *g, first = {};
	struct task_struct *task;
	struct walk_scratch *s;
	__u64 estimate;

	if (!t || !(s = bpf_map_lookup_elem(&scratch, &zero)))
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	key.hash = known.hash = WALK(walk_python)(t, s, tid, task, BPF_CORE_READ(task, thread.fsbase));
	if (!SEND_IF_NEW(&s->rec, &known, t, task, WALK(read_names)))
		return 0;
	estimate = (bytes << 32) / p;
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
	return key.hash;
}

/* An event of `bytes` at `address`: kept or not, and if kept, followed. */
static __always_inline void WALK(event)(__u32 source, __u64 address, __u64 bytes, __u32 szidx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	struct memory_place place = { .pid = pid, .address = address };
	struct kept_block block = { .bytes = bytes, .szidx = szidx, .source = source };
	__u64 p, objects;

	count(MEMORY_EVENTS);
	if (bytes > MAX_EVENT_BYTES)
		bytes = MAX_EVENT_BYTES;
	/* A block opened (or made) again at a kept one's address: the kept
	 * one was emptied (or freed) since; its sample ends. */
	bpf_map_delete_elem(&kept_blocks, &place);
	p = keep_chance(bytes);
	if ((__u64)bpf_get_prandom_u32() >= p) {
		count(MEMORY_NOT_KEPT);
		return;
	}
	/* A pool holds pool_size / block size objects (its header aside). */
	objects = source == SOURCE_POOL ? bytes / (((__u64)szidx + 1) * BLOCK_ALIGNMENT) : 1;
	block.hash = WALK(count_kept)(pid, source, bytes, objects, p);
	if (!block.hash)
		return;
	block.p = (__u32)p; /* 2^32 (certain) wraps to 0 */
	if (bpf_map_update_elem(&kept_blocks, &place, &block, BPF_ANY))
		count(MEMORY_KEPT_FULL);
}

SEC("uprobe")
int MEMORY_PROGRAM(pool_opened)(struct pt_regs *ctx)
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
	WALK(event)(SOURCE_POOL, pool, pool_size, szidx);
	return 0;
}

SEC("uprobe")
int MEMORY_PROGRAM(raw_returned)(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 chunk = PT_REGS_RC(ctx), *size = bpf_map_lookup_elem(&raw_calls, &tid), bytes;

	if (!size) {
		count(MEMORY_UNPAIRED);
		return 0;
	}
	bytes = *size;
	bpf_map_delete_elem(&raw_calls, &tid);
	if (chunk)
		WALK(event)(SOURCE_BIG, chunk, bytes, 0);
	return 0;
}
