/* bpf/memory.bpf.c's walker program, included once per walker it can run
 * with (WALK, as sample_walk.bpf.h) under the name MEMORY_PROGRAM(walk_kept):
 * the probes that keep an event tail-call it, so that the verifier checks
 * the walk once, not once per probe program; user space loads the one
 * whose loops this kernel verifies fastest. No include guard, on purpose. */

/* Walks the stack of an event kept with chance `p` and adds it to its
 * stack's growth under `source`, and under `also` too unless it is
 * SOURCE_COUNT; returns the stack's hash (0: not counted). */
static __always_inline __u64 WALK(count_kept)(__u32 pid, __u32 source, __u32 also, __u64 bytes, __u64 objects, __u64 p)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), zero = 0;
	const struct sample_target *t = bpf_map_lookup_elem(&processes, &pid);
	struct stack_key known = { .pid = pid };
	struct task_struct *task;
	struct walk_scratch *s;

	if (!t || !(s = bpf_map_lookup_elem(&scratch, &zero)))
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	known.hash = WALK(walk_python)(t, s, tid, task, BPF_CORE_READ(task, thread.fsbase));
	if (!SEND_IF_NEW(&s->rec, &known, t, task, WALK(read_names)))
		return 0;
	if (also < SOURCE_COUNT && !add_growth(pid, also, known.hash, bytes, objects, p))
		return 0;
	return add_growth(pid, source, known.hash, bytes, objects, p) ? known.hash : 0;
}

/* The event the probe kept (kept_events): its stack walked and counted,
 * and the block followed for the live view. */
SEC("uprobe")
int MEMORY_PROGRAM(walk_kept)(struct pt_regs *ctx)
{
	__u32 zero = 0, also;
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
	/* On a stripped build, --allocations sees big allocations here. */
	also = e->source == SOURCE_BIG && memory_cfg.big_allocated ? SOURCE_ALLOCATED : SOURCE_COUNT;
	block.hash = WALK(count_kept)(e->pid, e->source, also, e->bytes, e->objects, e->p);
	/* --allocations' events are counted only: no block to follow. */
	if (!block.hash || e->source == SOURCE_ALLOCATED)
		return 0;
	block.p = (__u32)e->p; /* 2^32 (certain) wraps to 0 */
	if (bpf_map_update_elem(&kept_blocks, &place, &block, BPF_ANY))
		count(MEMORY_KEPT_FULL);
	return 0;
}
