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
 * the program is loaded. One thread-state look-up (cached per thread by
 * the walk) and one read per sample. */

static __always_inline __u64 WALK(add_running_task)(const struct sample_target *t, struct sample_stack *rec, __u32 tid,
						    struct task_struct *task, __u64 thread_pointer, __u64 hash)
{
	__u64 tstate, running = 0;

	rec->running_task = 0;
	if (!cfg.async_tasks || t->tstate_running_task == PY_NO_FIELD)
		return hash;
	tstate = WALK(thread_state)(t, tid, task, thread_pointer);
	if (tstate)
		running = WALK(read_ptr)(tstate, t->tstate_running_task, task);
	rec->running_task = running;
	return running ? mix(mix(hash, HASH_TASK), running) : hash;
}
