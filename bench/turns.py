"""One copy of a workload taking turns with another on one CPU, for what a
profiler costs a whole workload measured to a fraction of a percent on a
machine whose speed drifts (scripts/bench.py's `*_turns` tables).

Two copies run, both pinned to CPU 0, passing one token back and forth
through pipes: each waits for it, runs PER_TURN rounds of WORK, and hands
it on. A profiler is attached to one of them only. Whatever the machine
does over seconds (another tenant, the host's clock) falls on both copies
alike, a turn apart (about 10 ms); only what the profiler costs its own
copy tells them apart. Two copies with nothing attached read the method's
own noise.

    python3 turns.py WORK TURNS PER_TURN IN_FD OUT_FD [PAUSE_AT]

WORK is `alloc` (bench/memory/alloc_heavy.py's rounds: dict, list and str
building, json round trips) or `calls` (fixtures/callgraph.py's rounds:
pure Python calls). Warms up and prints "ready"; after TURNS turns prints
two lines, each turn's CPU seconds (time.process_time: user plus system,
so a uprobe's trap or a sample's BPF program on this thread is counted)
and each turn's wall seconds (which also count the time the copy was
stopped, as py-spy stops it to read it).

With PAUSE_AT (given to the second copy only), that copy keeps the token
after its turn PAUSE_AT and prints "paused": both copies wait while the
caller moves its profiler from one copy to the other, then the caller
hands the first copy the token again. A run traced half on each copy
cancels whatever makes one process of a run faster than the other (each
has its own layout in memory: up to 10 % here).
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "memory"))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

WARM_UP_TURNS = 3


def work(name):
    """The round function of WORK: called with the round's number."""
    if name == "alloc":
        import alloc_heavy
        kept = []
        return lambda n: alloc_heavy.one_round(n, kept)
    if name == "calls":
        import callgraph
        return lambda n: callgraph.one_round()
    sys.exit(f"turns.py: no work named {name!r} (alloc, calls)")


def main(name, turns, per_turn, token_in, token_out, pause_at=0):
    os.sched_setaffinity(0, {0})
    one_round = work(name)
    n = 0
    for _ in range(per_turn * WARM_UP_TURNS):
        one_round(n)
        n += 1
    print("ready", flush=True)
    cpu, wall = [], []
    for turn in range(1, turns + 1):
        if os.read(token_in, 1) != b"t":
            sys.exit("turns.py: the token's pipe closed")
        started_cpu, started_wall = time.process_time(), time.monotonic()
        for _ in range(per_turn):
            one_round(n)
            n += 1
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.monotonic() - started_wall)
        if turn == pause_at:
            print("paused", flush=True)
            continue
        try:
            os.write(token_out, b"t")
        except BrokenPipeError:
            pass  # the other copy's turns are over: it has gone
    print(" ".join("%.6f" % c for c in cpu), flush=True)
    print(" ".join("%.6f" % w for w in wall), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:7]))
