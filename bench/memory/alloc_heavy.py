"""An allocation-heavy workload of fixed size: dict, list and str building and
json round trips, the kind issue #24's 3 % bound is about. It keeps a rolling
window of what it built alive, so the heap both churns (most objects die
young) and holds a few MiB, as a server's caches do; ROUNDS (its argument) fixes the work.

Prints one line: `cpu_s=<process CPU seconds of the work> rounds=<n>`
(time.process_time: user plus system time, so a uprobe's trap, which runs in
the kernel on this thread, is counted; wall time is not, on a shared machine).
"""
import json
import os
import sys
import time

KEEP = 64  # rounds of results kept alive: a few MiB of retained heap


def build_records(seed):
    records = []
    for i in range(200):
        records.append({
            "id": seed * 1000 + i,
            "name": "user-%d-%d" % (seed, i),
            "tags": ["t%d" % (i % 7), "k%d" % (i % 13), str(seed)],
            "score": i * 0.5,
            "nested": {"a": i, "b": [i, i + 1, i + 2]},
        })
    return records


def text_work(records):
    parts = [r["name"].upper() + ":" + ",".join(r["tags"]) for r in records]
    blob = "\n".join(parts)
    return blob.split("\n")


def round_trip(records):
    encoded = json.dumps(records)
    return json.loads(encoded)


def perf_control(command):
    """Counts only the work: probe-costs.sh runs perf stat with its counters
    off (--delay=-1) and a control FIFO, which this turns on and off."""
    ctl, ack = os.environ.get("PERF_CTL_FIFO"), os.environ.get("PERF_ACK_FIFO")
    if ctl and ack:
        with open(ctl, "w") as c:
            c.write(command + "\n")
        with open(ack) as a:
            a.readline()


def one_round(n, kept):
    """Round n's work; its results join `kept`, the last KEEP rounds'."""
    records = build_records(n)
    lines = text_work(records)
    decoded = round_trip(records)
    index = {r["id"]: r for r in decoded}
    kept.append((lines, index))
    if len(kept) > KEEP:
        kept.pop(0)


def main():
    # Read here, not at import: bench/turns.py imports
    # this file for one_round with arguments of its own.
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    kept = []
    perf_control("enable")
    start = time.process_time()
    for n in range(rounds):
        one_round(n, kept)
    cpu = time.process_time() - start
    perf_control("disable")
    print("cpu_s=%.4f rounds=%d" % (cpu, rounds))


if __name__ == "__main__":
    main()
