/* --async for bpf/sample.bpf.c: the asyncio task the sampled thread is
 * running (CPython 3.14+), included once per way of reading the target's
 * memory, before sample_walk.bpf.h (whose walk reads the running task as
 * soon as it has found the thread's state, before the frames). Uses only
 * WALK_READ. No include guard, on purpose.
 *
 * Only the task's address is read here: it is mixed into the stack's hash,
 * so each task's samples are counted apart, and sent with the stack's
 * frames. User space names the task (and the tasks awaiting it) when the
 * stack arrives (src/python/reading/asyncio_tasks.rs), from the task object's
 * layout in _asyncio's debug section, which may be mapped only later than
 * the program is loaded. Per sample: one read, from the thread state the
 * walk found and checked (--idle: two, see task_switched). */

/* The task the thread whose PyThreadState is at `tstate` is running: 0 for
 * none, without --async, or before 3.14. */
static __always_inline __u64 WALK(running_task)(const struct sample_target *t, __u64 tstate, struct task_struct *task)
{
	__u64 running = 0;

	if (!cfg.async_tasks || !tstate || t->tstate_running_task == PY_NO_FIELD)
		return 0;
	if (WALK_READ(&running, sizeof(running), (const void *)(tstate + t->tstate_running_task), task))
		return 0;
	return running;
}

/* --idle reads threads that may be running on another CPU meanwhile: a
 * thread that left its task (or entered another) between the read of its
 * running task and the end of the walk would have its frames put under a
 * task they did not run for. Read again now: true if it changed. */
static __always_inline bool WALK(task_switched)(const struct sample_target *t, const struct walk_scratch *scratch,
						struct task_struct *task)
{
	return cfg.async_tasks && WALK(running_task)(t, scratch->tstate, task) != scratch->rec.running_task;
}

/* The stack's hash with the running task the walk read mixed in. */
static __always_inline __u64 WALK(add_running_task)(const struct sample_stack *rec, __u64 hash)
{
	return rec->running_task ? mix(mix(hash, HASH_TASK), rec->running_task) : hash;
}
