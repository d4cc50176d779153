// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Reading a user register that user space named by number, for probes
 * inside a function's body (calls' inlined frames, memory's inlined
 * allocator copies), where the value sits in whatever register the
 * compiler chose. */
#ifndef PYTRACE_REGISTERS_BPF_H
#define PYTRACE_REGISTERS_BPF_H

/* A general-purpose register by its x86 number (rax 0 ... r15 15), as
 * user space found it in the code around a probe site. */
static __always_inline __u64 register_value(const struct pt_regs *regs, __u32 number)
{
	/* Loaded one by one at constant offsets, as the verifier wants for the
	 * context (a switch compiles into one load at a computed offset). */
	__u64 by_number[16] = {
		regs->ax, regs->cx, regs->dx, regs->bx, regs->sp, regs->bp, regs->si, regs->di,
		regs->r8, regs->r9, regs->r10, regs->r11, regs->r12, regs->r13, regs->r14, regs->r15,
	};

	if (number >= 16)
		return 0;
	barrier_var(number); /* keeps the mask below, which the verifier needs */
	return by_number[number & 15];
}

#endif
