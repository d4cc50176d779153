"""Drives obmalloc's slow paths as fast as it can, to time one uprobe hit on
them: each round fills about 100 fresh 16 KiB pools with 480-byte blocks (34 a pool)
(bytes objects, which have no free list) and frees them all, so every round
opens ~100 pools (allocate_from_new_pool), empties them (the pool-release path)
and may give an arena back. probe-costs.sh divides the CPU time a probe adds
by its hits. Prints `cpu_s=<process CPU seconds> rounds=<n>` like
alloc_heavy.py, and takes the same perf control FIFOs."""
import sys
import time

from alloc_heavy import perf_control

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
BLOCKS = 3400  # 3400 x 480 B = 1.6 MB: about 100 pools, more than one arena


def main():
    perf_control("enable")
    start = time.process_time()
    for _ in range(ROUNDS):
        blocks = [bytes(440) for _ in range(BLOCKS)]
        del blocks
    cpu = time.process_time() - start
    perf_control("disable")
    print("cpu_s=%.4f rounds=%d" % (cpu, ROUNDS))


if __name__ == "__main__":
    main()
