/* A code object's head, read from the target in one go and picked apart by
 * offset, as every BPF program that names functions does (calls, imports):
 * each read of the target costs about 150 ns, more than the rest of a
 * probe. The target is untrusted: the head's size is bounded and a field
 * the layout puts past it reads as 0. */
#ifndef PYTRACE_PYTHON_CODE_BPF_H
#define PYTRACE_PYTHON_CODE_BPF_H

#include "python.h"

/* The most bytes read from a code object (user space sizes each read to
 * cover the fields its layout names, at most this). */
#define CODE_HEAD_MAX 192

/* A field of a block read from the target, or 0 if the layout puts it
 * outside the block. Sizes (checked against the buffers first) and offsets
 * come from frozen rodata, so the verifier sees constants. */
#define FIELD(block, size, offset, type)                                                     \
	((offset) <= (size) - sizeof(type) ? *(type *)((block) + (offset)) : 0)

/* Reads the first `size` bytes of the object at `code` into `words`
 * (CODE_HEAD_MAX bytes, 8-byte aligned for FIELD's 8-byte loads). Non-zero
 * if it cannot be read, or is not a code object: its type is not
 * `code_type`, the target's &PyCode_Type (0: unknown, not checked). */
static __always_inline int read_code_head(const volatile struct py_layout *l, __u64 code_type, const void *code,
					  __u64 *words, __u32 size)
{
	if (!code || size > CODE_HEAD_MAX || size < 8 || bpf_probe_read_user(words, size, code))
		return -1;
	if (code_type && FIELD((char *)words, size, l->object_type, __u64) != code_type)
		return -1;
	return 0;
}

#define NAME_HEAD_MAX 64

static __always_inline __u64 fingerprint_mix(__u64 h, __u64 v)
{
	h ^= v;
	h *= 0x9e3779b97f4a7c15ULL;
	return h ^ (h >> 29);
}

/* What tells apart two functions whose code objects had the same address:
 * their name and file objects' addresses, and the name's hash and first 16
 * bytes (its hash may not be computed yet), read in one go. */
static __always_inline __u64 code_fingerprint(const volatile struct py_layout *l, const void *qualname,
					      const void *filename)
{
	__u32 from = l->unicode_hash, to = l->unicode_ascii_data + 16;
	__u64 name[NAME_HEAD_MAX / 8] = {}, h = fingerprint_mix((__u64)qualname, (__u64)filename);
	__u32 size = to - from;

	if (to <= from || size > NAME_HEAD_MAX || bpf_probe_read_user(name, size, (const char *)qualname + from))
		return h;
	/* Words past `size` stay zero. */
	for (int i = 0; i < NAME_HEAD_MAX / 8; i++)
		h = fingerprint_mix(h, name[i]);
	return h;
}

/* The frame running on the thread whose PyThreadState is at `tstate`: the
 * caller of a frame about to be evaluated. */
static __always_inline const void *running_frame(const volatile struct py_layout *l, const void *tstate)
{
	const void *current = read_ptr(tstate, l->tstate_current);

	if (current && l->cframe_current_frame != PY_NO_FIELD)
		current = read_ptr(current, l->cframe_current_frame);
	return current;
}

#endif
