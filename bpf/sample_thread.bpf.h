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
		/* The interrupt's registers, if it came from user mode (read
		 * through the context, which the verifier rewrites on every
		 * kernel); otherwise those saved at the top of the kernel stack,
		 * found by bpf_task_pt_regs (5.15) or as the kernel does. */
		bool user = (((volatile const __u64 *)ctx)[PT_REGS_CS_WORD] & 3) == 3;
		__u64 ip = ctx->regs.ip, sp = ctx->regs.sp, bp = ctx->regs.bp;
		struct native_record *r = bpf_ringbuf_reserve(&records, NATIVE_RECORD_BYTES, 0);

		if (!r) {
			count(SAMPLE_LOST);
			return 0;
		}
		start_native(r, &key);
		if (!user) {
			struct pt_regs *regs;

			if (cfg.task_pt_regs && bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)) {
				regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
				user = regs && (BPF_CORE_READ(regs, cs) & 3) == 3;
			} else {
				regs = saved_user_regs_fallback(task, &user);
			}
			ip = BPF_CORE_READ(regs, ip);
			sp = BPF_CORE_READ(regs, sp);
			bp = BPF_CORE_READ(regs, bp);
		}
		WALK(fill_native)(r, user, ip, sp, bp, task);
		bpf_ringbuf_submit(r, ring_submit_flags(&records));
		return 0;
	}
	start_count(counts_map, &key, weight && *weight ? *weight : SAMPLE_WEIGHT);
	return 0;
}
