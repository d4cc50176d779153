/* bpf/memory.bpf.c's walker program, included once per walker it can run
 * with (WALK, as sample_walk.bpf.h) under the name MEMORY_PROGRAM(walk_kept):
 * the probes that keep an event tail-call it, so that the verifier checks
 * the walk once, not once per probe program; user space loads the one
 * whose loops this kernel verifies fastest. No include guard, on purpose. */

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

/* The event the probe kept (kept_events): its stack walked and counted,
 * and the block followed for the live view. */
SEC("uprobe")
int MEMORY_PROGRAM(walk_kept)(struct pt_regs *ctx)
{
	__u32 zero = 0;
	struct kept_event *e = bpf_map_lookup_elem(&kept_events, &zero);
	struct memory_place place = {};
	struct kept_block block = {};

	if (!e)
		return 0;
	place.pid = e->pid;
	place.address = e->address;
	block.bytes = e->block_bytes;
	block.szidx = e->szidx;
	block.source = e->source;
	block.hash = WALK(count_kept)(e->pid, e->source, e->bytes, e->objects, e->p);
	/* --allocations' events are counted only: no block to follow. */
	if (!block.hash || e->source == SOURCE_ALLOCATED)
		return 0;
	block.p = (__u32)e->p; /* 2^32 (certain) wraps to 0 */
	if (bpf_map_update_elem(&kept_blocks, &place, &block, BPF_ANY))
		count(MEMORY_KEPT_FULL);
	return 0;
}
