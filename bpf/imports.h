/* What `pytrace imports` shares between its BPF program and user space. */
#ifndef PYTRACE_IMPORTS_H
#define PYTRACE_IMPORTS_H

#include "python.h"

#define IMPORT_NAME_CAP 128

enum import_phase {
	IMPORT_START = 1,
	IMPORT_DONE = 2,
};

/* The start or end of one module's find-and-load; user space nests them
 * into a tree per thread. */
struct import_event {
	__u64 ts_ns;
	__u32 tid;
	__u8 phase;     /* enum import_phase */
	__u8 found;     /* on IMPORT_DONE: the module was found and loaded */
	__u8 name_kind; /* enum str_kind: a C string (USDT) or a str object's characters */
	__u8 pad;
	__u32 name_len; /* in characters */
	char name[IMPORT_NAME_CAP];
};

/* Uprobe mode (builds without the import probes): what the eval-function
 * probe reads, set by user space before loading. */
#define IMPORT_NAME_MATCH_MAX 32
/* Import stacks deeper than this (per thread, without uprobe sessions)
 * lose their ends. */
#define IMPORT_MAX_NESTING 64

struct imports_config {
	struct py_layout layout;
	__u64 code_type;     /* &PyCode_Type in the target, 0 if unknown */
	__u32 code_head;     /* bytes of a code object covering what is read */
	__u32 frame_localsplus;
	/* The names looked for, NUL-padded (IMPORT_NAME_MATCH_MAX at most):
	 * importlib's module, its function that imports, and its function
	 * that calls that one from Python (importlib.import_module's way). */
	char bootstrap_file[IMPORT_NAME_MATCH_MAX];
	char find_and_load[IMPORT_NAME_MATCH_MAX];
	char gcd_import[IMPORT_NAME_MATCH_MAX];
};

enum import_counter {
	IMPORT_EVENT_LOST,     /* ring buffer full */
	IMPORT_NAME_UNREADABLE, /* uprobe mode: an import whose module name could not be read */
	IMPORT_TOO_DEEP,       /* uprobe mode without sessions: nested deeper than IMPORT_MAX_NESTING */
	IMPORT_COUNTER_COUNT,
};

#endif
