// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* `pytrace imports`: the start and end of each module import, from CPython's
 * import__find__load__start/done USDT probes, which fire exactly where
 * `python -X importtime` measures (around importlib's _find_and_load). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "imports.h"
#include "counters.bpf.h"
#include "ring.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES);
} events SEC(".maps");

DEFINE_COUNTERS(IMPORT_COUNTER_COUNT);

struct import_event _import_event = {};
enum import_counter _import_counter = 0;
enum import_phase _import_phase = 0;

static __always_inline void send(__u8 phase, const char *name, int found)
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
	n = bpf_probe_read_user_str(ev->name, IMPORT_NAME_CAP, name);
	ev->name_len = n > 0 ? n - 1 : 0;
	bpf_ringbuf_submit(ev, ring_submit_flags(&events));
}

SEC("usdt")
int BPF_USDT(usdt_import_start, const char *name)
{
	send(IMPORT_START, name, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_import_done, const char *name, int found)
{
	send(IMPORT_DONE, name, found);
	return 0;
}
