/* What `pytrace imports` shares between its BPF program and user space. */
#ifndef PYTRACE_IMPORTS_H
#define PYTRACE_IMPORTS_H

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
	__u8 phase;   /* enum import_phase */
	__u8 found;   /* on IMPORT_DONE: the module was found and loaded */
	__u16 name_len;
	char name[IMPORT_NAME_CAP];
};

enum import_counter {
	IMPORT_EVENT_LOST,  /* ring buffer full */
	IMPORT_COUNTER_COUNT,
};

#endif
