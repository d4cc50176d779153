/* CPython object layout, as offsets. User space fills one of these per target
 * from src/python/layouts/mod.rs and puts it in each program's read-only config,
 * so the BPF code never names a Python version. Shared with Rust through the
 * skeleton's generated types. */
#ifndef PYTRACE_PYTHON_H
#define PYTRACE_PYTHON_H

/* The offset of a field a version does not have. */
#define PY_NO_FIELD 0xffffffffu

/* co_flags of code whose call makes a generator, coroutine or async
 * generator instead of running it. */
#define PY_CO_GENERATOR_LIKE (0x20 | 0x80 | 0x200)

/* A frame's code object address, from its code reference `word`: from 3.14
 * f_executable is a tagged _PyStackRef whose low code_tag_bits are flags. */
#define PY_CODE_ADDRESS(word, layout) ((word) & ~(__u64)(layout)->code_tag_bits)

struct py_layout {
	/* PyThreadState */
	__u32 tstate_interp;
	/* The running frame: *(tstate + tstate_current), then, unless
	 * cframe_current_frame is PY_NO_FIELD, *(that + cframe_current_frame). */
	__u32 tstate_current;
	__u32 cframe_current_frame;
	/* PyInterpreterState */
	__u32 interp_eval_frame;
	/* Python frame (PyFrameObject up to 3.10, _PyInterpreterFrame after) */
	__u32 frame_code;
	__u32 frame_owner; /* PY_NO_FIELD before 3.11 */
	/* PyObject */
	__u32 object_type;
	/* PyCodeObject */
	__u32 code_flags;
	__u32 code_filename;
	__u32 code_qualname;
	__u32 code_firstlineno;
	/* PyASCIIObject / PyCompactUnicodeObject */
	__u32 unicode_length;
	__u32 unicode_hash;
	__u32 unicode_state;
	__u32 unicode_ascii_data;
	__u32 unicode_compact_data;
	/* Where kind:3, compact:1, ascii:1 start in the state word (2, or 8
	 * in free-threaded builds). */
	__u32 unicode_kind_shift;
	/* Values, not offsets (src/python/layouts/facts.rs): the frame owner
	 * of a frame the calling thread runs, and the first owner of frames
	 * that run no Python code (the C stack's shims, 3.14's base frame);
	 * the low bits of a frame's code reference that are flags. */
	__u32 frame_owned_by_thread;
	__u32 frame_owned_not_code;
	__u32 code_tag_bits;
};

/* How a BPF program captured a string's bytes (decoded by src/python/reading/strings.rs). */
enum str_kind {
	STR_UNREADABLE = 0,
	STR_UTF8 = 1,   /* C string (USDT arguments) */
	STR_ASCII = 2,  /* compact ASCII PyUnicode */
	STR_UCS1 = 3,   /* compact Latin-1 PyUnicode */
	STR_UCS2 = 4,
	STR_UCS4 = 5,
};

#endif
