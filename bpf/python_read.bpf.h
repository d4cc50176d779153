/* Bounded reads of CPython objects from the target's memory, shared by every
 * BPF program. The target is untrusted: each read can fail, and each helper
 * reports failure instead of guessing. Unbounded work (line tables, UTF-8
 * decoding) is left to user space. */
#ifndef PYTRACE_PYTHON_READ_BPF_H
#define PYTRACE_PYTHON_READ_BPF_H

#include "python.h"

/* Layouts come from `const volatile` config in .rodata, which user space
 * fills after compilation. A pointer to them must stay volatile too: through
 * a plain const pointer clang folds every offset to its initial zero. */

static __always_inline void *read_ptr(const void *base, __u32 offset)
{
	void *value = 0;

	if (bpf_probe_read_user(&value, sizeof(value), (const char *)base + offset))
		return 0;
	return value;
}

/* PyASCIIObject.state bit-fields: interned (2 bits, or a byte when
 * free-threaded), then kind:3, compact:1, ascii:1 from `shift` on. */
#define PY_STATE_KIND(state, shift) (((state) >> (shift)) & 7)
#define PY_STATE_COMPACT(state, shift) (((state) >> ((shift) + 3)) & 1)
#define PY_STATE_ASCII(state, shift) (((state) >> ((shift) + 4)) & 1)

/* Copies a compact str object's characters into buf (at most cap bytes) and
 * returns its enum str_kind; *len gets its length in characters. */
static __always_inline __u8 read_pystr(const volatile struct py_layout *layout, const void *str, char *buf,
				       __u32 cap, __u32 *len)
{
	__u64 length = 0;
	__u32 state = 0;
	__u32 data, kind, shift = layout->unicode_kind_shift & 15;
	__u64 bytes;
	__u8 result;

	*len = 0;
	if (!str)
		return STR_UNREADABLE;
	if (bpf_probe_read_user(&length, sizeof(length), (const char *)str + layout->unicode_length) ||
	    bpf_probe_read_user(&state, sizeof(state), (const char *)str + layout->unicode_state))
		return STR_UNREADABLE;
	if (!PY_STATE_COMPACT(state, shift) || length > (1 << 20))
		return STR_UNREADABLE;
	kind = PY_STATE_KIND(state, shift);
	if (PY_STATE_ASCII(state, shift)) {
		data = layout->unicode_ascii_data;
		result = STR_ASCII;
	} else {
		data = layout->unicode_compact_data;
		if (kind == 1)
			result = STR_UCS1;
		else if (kind == 2)
			result = STR_UCS2;
		else if (kind == 4)
			result = STR_UCS4;
		else
			return STR_UNREADABLE;
	}
	bytes = length * kind;
	if (bytes > cap)
		bytes = cap;
	/* Keep clang from testing a copy of bytes and passing another. */
	barrier_var(bytes);
	if (bytes > cap)
		return STR_UNREADABLE;
	if (bytes && bpf_probe_read_user(buf, bytes, (const char *)str + data))
		return STR_UNREADABLE;
	*len = length;
	return result;
}

#endif
