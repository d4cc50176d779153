/* CPython object layout, as offsets. User space fills one of these per target
 * from src/python/layouts.rs and puts it in each program's read-only config,
 * so the BPF code never names a Python version. Shared with Rust through the
 * skeleton's generated types. */
#ifndef PYTRACE_PYTHON_H
#define PYTRACE_PYTHON_H

/* The offset of a field a version does not have. */
#define PY_NO_FIELD 0xffffffffu

/* co_flags of code whose call makes a generator, coroutine or async
 * generator instead of running it. */
#define PY_CO_GENERATOR_LIKE (0x20 | 0x80 | 0x200)

/* _PyInterpreterFrame.owner of a frame run by the calling thread. */
#define PY_FRAME_OWNED_BY_THREAD 0
/* Owners from this value on mark frames that run no Python code: the C
 * stack's shim frames (owner 3 in 3.12 and 3.13, 4 in 3.14) and, from 3.14,
 * the interpreter's base frame (3). 3.11 has neither. */
#define PY_FRAME_OWNED_NOT_CODE 3

/* A frame's code object address: from 3.14 f_executable is a tagged
 * _PyStackRef whose low bits are flags (1 in 3.14, up to 3 in 3.15).
 * Objects are 8-byte aligned, so clearing the low 3 bits is right for every
 * version. */
#define PY_CODE_ADDRESS(word) ((word) & ~7ULL)

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
};

/* How a BPF program captured a string's bytes (decoded by src/python/strings.rs). */
enum str_kind {
	STR_UNREADABLE = 0,
	STR_UTF8 = 1,   /* C string (USDT arguments) */
	STR_ASCII = 2,  /* compact ASCII PyUnicode */
	STR_UCS1 = 3,   /* compact Latin-1 PyUnicode */
	STR_UCS2 = 4,
	STR_UCS4 = 5,
};

#endif
