"""Sampling cost, pytrace against py-spy, side by side in one run (called by
scripts/bench.sh). For each profiler and rate: the target's slowdown on a
fixed workload, the profiler process's own CPU per sample (start-up
included), and for pytrace the BPF program's run time per sample
(kernel.bpf_stats_enabled).

    python3 bench_sample.py PYTRACE PY_SPY PYTHON REPEATS
Prints markdown table rows."""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

PYTRACE, PY_SPY, PYTHON, REPEATS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "callgraph.py")
ROUNDS = "400000"
# The target sleeps this long before working, for the profiler to attach.
# (Not a signal: py-spy's ptrace attach holds a signalled target stopped.)
DELAY = "1.5"


def start_target():
    return subprocess.Popen([PYTHON, FIXTURE, "--rounds", ROUNDS, "--delay", DELAY, "--timing"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish_target(p):
    _, err = p.communicate()
    return float(re.search(r"workload_seconds=([0-9.]+)", err).group(1))


def wait_for(stream, pattern):
    for line in stream:
        if re.search(pattern, line):
            return
    raise RuntimeError(f"never saw {pattern!r}")


def cpu_of(proc):
    _, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime


def untraced():
    return finish_target(start_target())


def pytrace(hz, extra=()):
    out = tempfile.NamedTemporaryFile(suffix=".json")
    target = start_target()
    prof = subprocess.Popen([PYTRACE, "sample", "-p", str(target.pid), "-r", str(hz), "--json", out.name, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(prof.stderr, "attached to PID")
    seconds = finish_target(target)
    prof.stderr.close()
    cpu = cpu_of(prof)
    report = json.load(open(out.name))
    return seconds, cpu, report["samples"], report.get("bpf_ns_per_sample")


def py_spy(hz):
    out = tempfile.NamedTemporaryFile(suffix=".txt")
    target = start_target()
    prof = subprocess.Popen([PY_SPY, "record", "--pid", str(target.pid), "-r", str(hz), "--format", "raw", "-o", out.name],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # py-spy says nothing when its stderr is not a terminal: the target's
    # delay leaves it time to attach.
    seconds = finish_target(target)
    prof.stderr.close()
    cpu = cpu_of(prof)
    samples = sum(int(l.rsplit(" ", 1)[1]) for l in open(out.name) if l.strip())
    return seconds, cpu, samples, None


# Interleaved: each repeat runs the untraced target and every profiler
# once, so drift on a shared machine hits them alike.
PROFILERS = ("pytrace", "pytrace --native", "py-spy")
results = {(name, hz): [] for hz in (99, 1000) for name in PROFILERS}
bases = []
for _ in range(REPEATS):
    bases.append(untraced())
    for hz in (99, 1000):
        results[("pytrace", hz)].append(pytrace(hz))
        results[("pytrace --native", hz)].append(pytrace(hz, ["--native"]))
        results[("py-spy", hz)].append(py_spy(hz))
base = statistics.median(bases)
for hz in (99, 1000):
    for name in PROFILERS:
        runs = results[(name, hz)]
        seconds = statistics.median(r[0] for r in runs)
        per_sample = statistics.median(r[1] / max(r[2], 1) * 1e6 for r in runs)
        samples = statistics.median(r[2] for r in runs)
        bpf = [r[3] for r in runs if r[3] is not None]
        bpf_text = f"{statistics.median(bpf) / 1000:.1f}" if bpf else "–"
        print(f"| {name} | {hz} | {samples:.0f} | {per_sample:.1f} | {bpf_text} | {(seconds / base - 1) * 100:+.1f}% |")
