/* sample.bpf.c's perf-event sampler, included once per walker it can run
 * with (WALK, as sample_walk.bpf.h) under the name SAMPLE_THREAD_PROGRAM:
 * user space loads the one whose loops this kernel verifies fastest. No
 * include guard, on purpose. */

SEC("perf_event")
int SAMPLE_THREAD_PROGRAM(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, pid = pid_tgid >> 32, zero = 0;
	const struct sample_target *t;
	struct task_struct *task;
	struct walk_scratch *s;
	struct stack_key key = {}, known = {};
	void *counts_map = 0;
	__u32 cpu, *weight = 0;
	__u64 hash, thread_pointer;

	if (only_pid && pid != only_pid)
		return 0;
	t = only_pid ? bpf_map_lookup_elem(&only_target, &zero) : bpf_map_lookup_elem(&processes, &pid);
	if (!t || !(s = bpf_map_lookup_elem(&scratch, &zero)))
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	thread_pointer = BPF_CORE_READ(task, thread.fsbase);
	if (WALK(leave_out_for_gil)(t, s, tid, task, thread_pointer))
		return 0;
	hash = WALK(walk_python)(t, s, tid, task, thread_pointer);
	/* The thread is interrupted: its task cannot change under the walk. */
	hash = WALK(add_running_task)(&s->rec, hash);
	s->rec.kernel_frames = 0;
	if (cfg.kernel_stacks)
		hash = add_kernel_stack(ctx, &s->rec, hash);
	known.pid = key.pid = pid;
	known.hash = key.hash = hash;
	key.tid = cfg.per_thread || cfg.native ? tid : 0;
	if (!cfg.native) {
		counts_map = bpf_map_lookup_elem(&counts, &zero);
		if (!counts_map)
			return 0;
		cpu = bpf_get_smp_processor_id();
		weight = bpf_map_lookup_elem(&sample_weights, &cpu);
		if (add_to_count(counts_map, &key, weight && *weight ? *weight : SAMPLE_WEIGHT))
			return 0;
	}
	if (!SEND_IF_NEW(&s->rec, &known, t, task, WALK(read_names)))
		return 0;
	if (cfg.native) {
		NATIVE_SAMPLE_CALL(ctx, task, ((__u64)pid << 32) | tid, key.hash);
		return 0;
	}
	start_count(counts_map, &key, weight && *weight ? *weight : SAMPLE_WEIGHT);
	return 0;
}
