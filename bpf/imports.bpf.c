// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace imports`: the start and end of each module import, where
 * `python -X importtime` measures them: around the C call of importlib's
 * _find_and_load(name, import_) that import_find_and_load makes for a
 * module not in sys.modules. Either CPython's import__find__load__start/done
 * USDT probes, which fire right there, or, on builds without them, a uprobe
 * on _PyEval_EvalFrameDefault: a call from C always enters it afresh, so the
 * evaluations of _find_and_load's code object are those calls (below). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "imports.h"
#include "counters.bpf.h"
#include "ring.bpf.h"
#include "python_read.bpf.h"
#include "python_code.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES);
} events SEC(".maps");

DEFINE_COUNTERS(IMPORT_COUNTER_COUNT);

struct import_event _import_event = {};
enum import_counter _import_counter = 0;
enum import_phase _import_phase = 0;
enum str_kind _str_kind = 0;

const volatile struct imports_config cfg = {};

/* One import's start or end; `name` is a C string (USDT), or, with
 * `pystr`, a str object. */
static __always_inline void send(__u8 phase, const void *name, int found, int pystr)
{
	struct import_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	long n;

	if (!ev) {
		count(IMPORT_EVENT_LOST);
		return;
	}
	ev->ts_ns = bpf_ktime_get_ns();
	ev->tid = (__u32)bpf_get_current_pid_tgid();
	ev->phase = phase;
	ev->found = found;
	if (pystr) {
		ev->name_kind = read_pystr(&cfg.layout, name, ev->name, IMPORT_NAME_CAP, &ev->name_len);
		if (ev->name_kind == STR_UNREADABLE)
			count(IMPORT_NAME_UNREADABLE);
	} else {
		n = bpf_probe_read_user_str(ev->name, IMPORT_NAME_CAP, name);
		ev->name_kind = STR_UTF8;
		ev->name_len = n > 0 ? n - 1 : 0;
	}
	bpf_ringbuf_submit(ev, ring_submit_flags(&events));
}

SEC("usdt")
int BPF_USDT(usdt_import_start, const char *name)
{
	send(IMPORT_START, name, 0, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_import_done, const char *name, int found)
{
	send(IMPORT_DONE, name, found, 0);
	return 0;
}

/* Uprobe mode. Which code objects are importlib's _find_and_load, by
 * (code object, qualname object): reading the names costs two more reads of
 * the target per evaluation, and a code object freed and replaced at the
 * same address has another qualname object (or the same name anyway). */
struct code_id {
	__u64 code;
	__u64 qualname;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct code_id);
	__type(value, __u8);
} is_import_code SEC(".maps");

/* Whether the str object at `str` is the compact ASCII string `want`, a
 * NUL-padded name from the config. */
static __always_inline int str_is(const void *str, const volatile char *want)
{
	const volatile struct py_layout *l = &cfg.layout;
	char data[IMPORT_NAME_MATCH_MAX] = {};
	__u64 length = 0;
	__u32 state = 0, shift = l->unicode_kind_shift & 15, n = 0;

	for (int i = 0; i < IMPORT_NAME_MATCH_MAX; i++) {
		if (!want[i])
			break;
		n++;
	}
	if (!str ||
	    bpf_probe_read_user(&length, sizeof(length), (const char *)str + l->unicode_length) ||
	    bpf_probe_read_user(&state, sizeof(state), (const char *)str + l->unicode_state))
		return 0;
	if (length != n || !PY_STATE_COMPACT(state, shift) || !PY_STATE_ASCII(state, shift))
		return 0;
	if (bpf_probe_read_user(data, IMPORT_NAME_MATCH_MAX, (const char *)str + l->unicode_ascii_data))
		return 0;
	for (int i = 0; i < IMPORT_NAME_MATCH_MAX; i++) {
		if (i >= n)
			break;
		if (data[i] != want[i])
			return 0;
	}
	return 1;
}

/* Reads the head of the code object at `code`: non-zero if it is not one.
 * Fills its qualname and filename objects' addresses. */
static __always_inline int code_names(const void *code, __u64 *qualname, __u64 *filename)
{
	const volatile struct py_layout *l = &cfg.layout;
	__u64 words[CODE_HEAD_MAX / 8];
	char *head = (char *)words;
	__u32 size = cfg.code_head;

	if (read_code_head(l, cfg.code_type, code, words, size))
		return -1;
	*qualname = FIELD(head, size, l->code_qualname, __u64);
	*filename = FIELD(head, size, l->code_filename, __u64);
	return 0;
}

/* Whether `code` is importlib._bootstrap's function named `name`. */
static __always_inline int is_bootstrap_function(const void *code, const volatile char *name, int cache)
{
	struct code_id id = { .code = (__u64)code };
	__u64 filename = 0;
	__u8 verdict, *known;

	if (code_names(code, &id.qualname, &filename))
		return 0;
	if (cache && (known = bpf_map_lookup_elem(&is_import_code, &id)))
		return *known;
	verdict = str_is((const void *)id.qualname, name) && str_is((const void *)filename, cfg.bootstrap_file);
	if (cache)
		bpf_map_update_elem(&is_import_code, &id, &verdict, BPF_ANY);
	return verdict;
}

/* If this evaluation is an import, -X importtime's way: the module name's
 * str object; else 0. */
static __always_inline const void *import_starting(const void *tstate, const void *frame)
{
	const volatile struct py_layout *l = &cfg.layout;
	const void *code, *caller, *caller_code;

	code = (const void *)PY_CODE_ADDRESS((__u64)read_ptr(frame, l->frame_code), l);
	if (!is_bootstrap_function(code, cfg.find_and_load, 1))
		return 0;
	/* importlib.import_module calls _find_and_load from Python, through
	 * _gcd_import: -X importtime does not see those imports, and that call
	 * enters the eval function only before 3.11 or with an eval-frame hook
	 * set. */
	caller = running_frame(&cfg.layout, tstate);
	if (caller) {
		caller_code = (const void *)PY_CODE_ADDRESS((__u64)read_ptr(caller, l->frame_code), l);
		if (is_bootstrap_function(caller_code, cfg.gcd_import, 0))
			return 0;
	}
	/* Its first argument, `name`: a tagged stack reference from 3.14. */
	return (const void *)PY_CODE_ADDRESS((__u64)read_ptr(frame, cfg.frame_localsplus), &cfg.layout);
}

extern bool bpf_session_is_return(void) __ksym __weak;
extern __u64 *bpf_session_cookie(void) __ksym __weak;

/* Entry and return of _PyEval_EvalFrameDefault as one uprobe session
 * (Linux 6.13+): the return probe runs only for imports (the entry returns
 * 1 for everything else), and the cookie carries the module name's object,
 * which the C caller keeps alive until the call returns. */
SEC("uprobe.session")
int BPF_UPROBE(eval_frame, const void *tstate, const void *frame)
{
	__u64 *cookie = bpf_session_cookie();
	const void *name;

	if (bpf_session_is_return()) {
		if (cookie && *cookie)
			send(IMPORT_DONE, (const void *)*cookie, PT_REGS_RC(ctx) != 0, 1);
		return 0;
	}
	name = import_starting(tstate, frame);
	if (!name || !cookie)
		return 1;
	*cookie = (__u64)name;
	send(IMPORT_START, name, 0, 1);
	return 0;
}

/* Older kernels: a uprobe and a uretprobe on every evaluation. A return is
 * an import's when the stack pointer is one word above the import's entry
 * (the return address popped). */
struct open_imports {
	__u32 depth;
	__u32 pad;
	__u64 sp[IMPORT_MAX_NESTING];
	__u64 name[IMPORT_MAX_NESTING];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct open_imports);
} open_imports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct open_imports);
} empty_imports SEC(".maps");

SEC("uprobe")
int BPF_UPROBE(eval_entry, const void *tstate, const void *frame)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), zero = 0, depth;
	const void *name = import_starting(tstate, frame);
	struct open_imports *open;

	if (!name)
		return 0;
	open = bpf_map_lookup_elem(&open_imports, &tid);
	if (!open) {
		struct open_imports *empty = bpf_map_lookup_elem(&empty_imports, &zero);

		if (!empty)
			return 0;
		bpf_map_update_elem(&open_imports, &tid, empty, BPF_NOEXIST);
		open = bpf_map_lookup_elem(&open_imports, &tid);
		if (!open)
			return 0;
	}
	depth = open->depth;
	if (depth >= IMPORT_MAX_NESTING) {
		count(IMPORT_TOO_DEEP);
		return 0;
	}
	open->sp[depth] = PT_REGS_SP(ctx);
	open->name[depth] = (__u64)name;
	open->depth = depth + 1;
	send(IMPORT_START, name, 0, 1);
	return 0;
}

SEC("uretprobe")
int BPF_URETPROBE(eval_return, long result)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), top;
	struct open_imports *open = bpf_map_lookup_elem(&open_imports, &tid);

	if (!open || open->depth == 0 || open->depth > IMPORT_MAX_NESTING)
		return 0;
	top = (open->depth - 1) & (IMPORT_MAX_NESTING - 1);
	if (open->sp[top] + 8 != PT_REGS_SP(ctx))
		return 0;
	open->depth = top;
	send(IMPORT_DONE, (const void *)open->name[top], result != 0, 1);
	return 0;
}
