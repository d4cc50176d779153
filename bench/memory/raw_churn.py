"""Drives the allocations above obmalloc's 512-byte limit as fast as it can, to
time one uprobe hit on the raw allocator and libc's malloc/free: each round
makes and drops a bytearray of 1000 bytes, whose buffer obmalloc hands to the
raw allocator (malloc) and back (free). Prints `cpu_s=... rounds=...` like
alloc_heavy.py, and takes the same perf control FIFOs."""
import sys
import time

from alloc_heavy import perf_control

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000000


def main():
    perf_control("enable")
    start = time.process_time()
    for _ in range(ROUNDS):
        bytearray(1000)
    cpu = time.process_time() - start
    perf_control("disable")
    print("cpu_s=%.4f rounds=%d" % (cpu, ROUNDS))


if __name__ == "__main__":
    main()
