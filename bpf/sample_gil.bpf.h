/* --gil for bpf/sample.bpf.c: whether a sampled thread holds the GIL,
 * included once per way of reading the target's memory, as
 * sample_walk.bpf.h (whose WALK and WALK_READ it uses). No include guard,
 * on purpose.
 *
 * A thread holds the GIL when the GIL is locked and the thread state that
 * took it last is the thread's: take_gil sets last_holder once it has the
 * GIL, drop_gil clears locked and leaves last_holder. (Read one after the
 * other: a hand-over in between is a race of nanoseconds in a sample.) */

#ifndef SAMPLE_GIL_HOLDING
#define SAMPLE_GIL_HOLDING
enum gil_holding {
	GIL_UNREADABLE = -1,
	GIL_NOT_HOLDING = 0,
	GIL_HOLDING = 1,
};
#endif

static __always_inline int WALK(holds_gil)(const struct sample_target *t, __u32 tid, struct task_struct *task,
					   __u64 thread_pointer)
{
	__u64 gil = t->gil_address, tstate, holder = 0;
	__s32 locked = 0;

	tstate = WALK(thread_state)(t, tid, task, thread_pointer);
	if (!tstate)
		return GIL_NOT_HOLDING;
	if (!t->gil_size)
		return GIL_UNREADABLE;
	if (!gil && t->interp_gil != PY_NO_FIELD) {
		__u64 interp = WALK(read_ptr)(tstate, t->layout.tstate_interp, task);

		gil = interp ? WALK(read_ptr)(interp, t->interp_gil, task) : 0;
	}
	if (!gil || WALK_READ(&locked, sizeof(locked), (const void *)(gil + t->gil_locked), task) ||
	    WALK_READ(&holder, sizeof(holder), (const void *)(gil + t->gil_last_holder), task))
		return GIL_UNREADABLE;
	/* locked is 0 or 1 in a real GIL: anything else is not one. */
	if (locked != 0 && locked != 1)
		return GIL_UNREADABLE;
	return locked == 1 && holder == tstate ? GIL_HOLDING : GIL_NOT_HOLDING;
}

/* --gil: true if the sample is to be left out (counted why). */
static __always_inline bool WALK(leave_out_for_gil)(const struct sample_target *t, __u32 tid, struct task_struct *task,
						    __u64 thread_pointer)
{
	int holding;

	if (!cfg.gil_only)
		return false;
	holding = WALK(holds_gil)(t, tid, task, thread_pointer);
	if (holding == GIL_HOLDING)
		return false;
	count(holding == GIL_UNREADABLE ? SAMPLE_GIL_UNREADABLE : SAMPLE_GIL_NOT_HELD);
	return true;
}
