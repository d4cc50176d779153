"""bench/memory/alloc_heavy.py's rounds, run in blocks of BLOCK rounds for
SECONDS, each block's CPU time written as it ends, for a cost measured
inside one process (scripts/bench.py's memory_cost_paired): a profiler
attached by PID for some windows and not for others, the blocks inside its
windows against those outside them. Run-to-run spread on a shared machine
(±25 % here between whole runs) then cancels out.

    python3 alloc_blocks.py SECONDS OUT

Each line of OUT: the block's start and end (time.monotonic, the clock
bench.py's time.monotonic reads) and its CPU seconds (time.process_time:
user plus system, so a uprobe's trap on this thread is counted).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alloc_heavy  # noqa: E402

BLOCK = 20


def main(seconds, out_path):
    kept = []
    n = 0
    end = time.monotonic() + seconds
    with open(out_path, "w") as out:
        print("ready", flush=True)
        while time.monotonic() < end:
            cpu, started = time.process_time(), time.monotonic()
            for _ in range(BLOCK):
                alloc_heavy.one_round(n, kept)
                n += 1
            out.write("%.4f %.4f %.6f\n" % (started, time.monotonic(), time.process_time() - cpu))
            out.flush()


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2])
