/* --async for bpf/sample.bpf.c: the asyncio task the sampled thread is
 * running (CPython 3.14+), included once per way of reading the target's
 * memory, as sample_walk.bpf.h (whose WALK and WALK_READ it uses). No
 * include guard, on purpose.
 *
 * Only the task's address is read here: it is mixed into the stack's hash,
 * so each task's samples are counted apart, and sent with the stack's
 * frames. User space names the task (and the tasks awaiting it) when the
 * stack arrives (src/python/asyncio_tasks.rs), from the task object's
 * layout in _asyncio's debug section, which may be mapped only later than
 * the program is loaded. Per sample: one map look-up and two reads. */

static __always_inline __u64 WALK(add_running_task)(const struct sample_target *t, struct sample_stack *rec, __u32 tid,
						    struct task_struct *task, __u64 thread_pointer, __u64 hash)
{
	__u64 id = 0, running = 0, *tstate;

	rec->running_task = 0;
	if (!cfg.async_tasks || t->tstate_running_task == PY_NO_FIELD)
		return hash;
	/* The walk just found (and cached) the thread's state, if it has one:
	 * the cached entry, checked as the walk checks it, without a second
	 * copy of its search loop for the verifier to walk through. */
	tstate = bpf_map_lookup_elem(&thread_states, &tid);
	if (tstate && !WALK_READ(&id, sizeof(id), (const void *)(*tstate + t->tstate_thread_id), task) &&
	    id == thread_pointer)
		running = WALK(read_ptr)(*tstate, t->tstate_running_task, task);
	rec->running_task = running;
	return running ? mix(mix(hash, HASH_TASK), running) : hash;
}
