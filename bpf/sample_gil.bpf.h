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

/* The GIL of the thread whose state is `tstate` into *gil, and
 * GIL_UNREADABLE if it cannot be read. *gil is 0, and no thread holds a
 * GIL, while an interpreter of 3.12+ has none: its pointer is NULL from
 * the first thread state's creation to init_interp_create_gil, and again
 * from _PyEval_FiniGIL to the process's end, while thread states still
 * lead to the interpreter. */
static __always_inline int WALK(gil_of)(const struct sample_target *t, __u64 tstate, struct task_struct *task, __u64 *gil)
{
	__u64 interp = 0;

	*gil = 0;
	if (!t->gil_size)
		return GIL_UNREADABLE;
	if (t->gil_address || t->interp_gil == PY_NO_FIELD) {
		*gil = t->gil_address;
		return *gil ? GIL_NOT_HOLDING : GIL_UNREADABLE;
	}
	if (WALK_READ(&interp, sizeof(interp), (const void *)(tstate + t->layout.tstate_interp), task) || !interp ||
	    WALK_READ(gil, sizeof(*gil), (const void *)(interp + t->interp_gil), task))
		return GIL_UNREADABLE;
	return GIL_NOT_HOLDING;
}

/* Whether the thread whose state is `tstate` holds the GIL at `gil`
 * (0: none exists), or GIL_UNREADABLE. */
static __always_inline int WALK(holds_gil)(const struct sample_target *t, __u64 tstate, __u64 gil, struct task_struct *task)
{
	__u64 holder = 0;
	__s32 locked = 0;

	if (!gil)
		return GIL_NOT_HOLDING;
	if (WALK_READ(&locked, sizeof(locked), (const void *)(gil + t->gil_locked), task) ||
	    WALK_READ(&holder, sizeof(holder), (const void *)(gil + t->gil_last_holder), task))
		return GIL_UNREADABLE;
	/* locked is -1 before the interpreter creates its GIL and after it
	 * destroys it (start-up and exit, seconds long in an emulated VM):
	 * then no thread holds one. 0 or 1 in a live GIL; anything else is
	 * not one. */
	if (locked == -1)
		return GIL_NOT_HOLDING;
	if (locked != 0 && locked != 1)
		return GIL_UNREADABLE;
	return locked == 1 && holder == tstate ? GIL_HOLDING : GIL_NOT_HOLDING;
}

/* --gil: true if the sample is to be left out (counted why). */
static __always_inline bool WALK(leave_out_for_gil)(const struct sample_target *t, struct walk_scratch *scratch,
						    __u32 tid, struct task_struct *task,
						    __u64 thread_pointer)
{
	__u64 tstate, gil;
	int holding;

	if (!cfg.gil_only)
		return false;
	tstate = WALK(thread_state)(t, scratch, tid, task, thread_pointer);
	if (!tstate) {
		count(SAMPLE_GIL_NOT_HELD);
		return true;
	}
	holding = WALK(gil_of)(t, tstate, task, &gil);
	if (holding != GIL_UNREADABLE)
		holding = WALK(holds_gil)(t, tstate, gil, task);
	if (holding == GIL_HOLDING)
		return false;
	/* A thread past the end of its Python work keeps its thread id, so the
	 * cached thread state still matches it after _PyThreadState_DeleteCurrent
	 * freed it; a large freed chunk's allocator links overwrite its interp.
	 * A state that no longer leads to the interpreter is no live thread's:
	 * it holds no GIL. */
	if (holding == GIL_UNREADABLE && t->interpreters_head &&
	    WALK(read_ptr)(tstate, t->layout.tstate_interp, task) != WALK(read_ptr)(t->interpreters_head, 0, task))
		holding = GIL_NOT_HOLDING;
	count(holding == GIL_UNREADABLE ? SAMPLE_GIL_UNREADABLE : SAMPLE_GIL_NOT_HELD);
	return true;
}

/* x86-64's futex system call: where a thread waiting for the GIL sleeps,
 * on the GIL's condition variable or mutex (both inside the GIL). */
#define SYSCALL_FUTEX 202

/* --idle --states: what the thread is doing (enum thread_state), and the
 * system call it sleeps in. For a thread that is not running, its entry
 * into the kernel saved its registers: orig_ax holds the system call's
 * number (negative for an interrupt), di its first argument. */
static __always_inline __u8 WALK(thread_state_of)(const struct sample_target *t, struct walk_scratch *scratch,
						  __u32 tid, struct task_struct *task,
						  __u64 thread_pointer, __s32 *syscall)
{
	__u64 tstate = WALK(thread_state)(t, scratch, tid, task, thread_pointer), gil = 0;
	struct pt_regs *regs;
	long nr;

	*syscall = -1;
	if (tstate && WALK(gil_of)(t, tstate, task, &gil) != GIL_UNREADABLE &&
	    WALK(holds_gil)(t, tstate, gil, task) == GIL_HOLDING)
		return THREAD_RUNNING;
	if (task->on_cpu)
		return THREAD_RUNNING_NO_GIL;
	regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs)
		return THREAD_RELEASED;
	nr = BPF_CORE_READ(regs, orig_ax);
	if (nr < 0)
		return THREAD_RELEASED;
	if (nr == SYSCALL_FUTEX && gil && BPF_CORE_READ(regs, di) - gil < t->gil_size)
		return THREAD_WAITING_FOR_GIL;
	*syscall = nr;
	return THREAD_RELEASED;
}
