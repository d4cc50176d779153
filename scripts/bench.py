"""Every benchmark of pytrace against its peers, side by side in one run on
one machine (called by scripts/bench.sh, which builds and installs what it
needs). The machine is shared and absolute times drift, so each table
interleaves the runs it compares and reports medians and ratios.

    python3 scripts/bench.py PYTRACE PY_SPY NODTRACE_PYTHON SID_ROOT REPEATS

Prints the markdown of bench/results.md on stdout, progress on stderr.
"""
import json
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

PYTRACE, PY_SPY, NODTRACE, SID_ROOT, REPEATS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
# How long the --all memory row runs (issue #12 asks for 10 minutes).
MEMORY_SECONDS = int(os.environ.get("PYTRACE_BENCH_MEMORY_SECONDS", "600"))
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
# The fixtures, copied into the sid root so its Pythons can run them.
INSIDE = "/pytrace-bench"
CALL_ROUNDS = 2000
SAMPLE_ROUNDS = 200000
# A target sleeps this long before its workload, for a profiler to attach.
# (Not a signal: py-spy's ptrace attach holds a signalled target stopped.)
DELAY = 1.5
TMP = tempfile.mkdtemp()


def progress(text):
    print(f"bench: {text}", file=sys.stderr, flush=True)


class Python:
    def __init__(self, label, exe, root=None):
        self.label, self.exe, self.root = label, exe, root

    def argv(self, script, *args):
        if self.root:
            return ["chroot", self.root, self.exe, f"{INSIDE}/{script}", *map(str, args)]
        return [self.exe, os.path.join(FIXTURES, script), *map(str, args)]

    def out_path(self, name):
        """A file the target writes: (as the target names it, as we do)."""
        if self.root:
            return f"{INSIDE}/{name}", os.path.join(self.root, INSIDE[1:], name)
        path = os.path.join(TMP, name)
        return path, path


DEBIAN = Python("Debian 3.11.2 (probes)", "/usr/bin/python3.11")
NO_PROBES = Python("3.11 without probes, shared libpython", NODTRACE)
# pyenv's 3.12 (scripts/pythons.sh pyenv-3.12, passed on by bench.sh).
PYENV_312 = os.environ["PYTRACE_BENCH_PYENV_312"]
# memray installed for pyenv's 3.12 by bench.sh (memray runs the script
# with its own interpreter).
MEMRAY = os.environ["PYTRACE_BENCH_MEMRAY"]
SID_315 = Python("Debian sid 3.15 (chroot)", "/usr/bin/python3.15", SID_ROOT)
# Debian's 3.13 builds (the calls table): sid's 3.13.18 starts its eval
# function with `endbr64; sub rsp`, where the kernel would single-step the
# probe, so calls points the eval-frame hook at a jump to it (eval_entry.rs);
# trixie's 3.13.5 starts it with `endbr64; push`, in the executable and in
# its stripped shared libpython (scripts/pythons.sh root-trixie).
TRIXIE_ROOT = os.environ["PYTRACE_BENCH_TRIXIE"]
SID_313 = Python("Debian sid 3.13.18 (chroot; the hook on a jump)", "/usr/bin/python3.13", SID_ROOT)
TRIXIE_313 = Python("Debian trixie 3.13.5 (chroot)", "/usr/bin/python3.13", TRIXIE_ROOT)
TRIXIE_313_SHARED = Python("Debian trixie 3.13.5, stripped shared libpython (chroot)", "/usr/local/bin/python3.13-shared", TRIXIE_ROOT)


def median(values):
    return statistics.median(values) if values else float("nan")


def fastest(values):
    """The workload's time to compare: on a shared machine interference only
    ever adds time, so the fastest of the repeats is the least disturbed."""
    return min(values) if values else float("nan")


def workload_seconds(stderr_text):
    return float(re.search(r"workload_seconds=([0-9.]+)", stderr_text).group(1))


def start(argv, stdout=subprocess.DEVNULL):
    return subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True)


def wait_for(stream, pattern):
    for line in stream:
        if re.search(pattern, line):
            return
    raise RuntimeError(f"never saw {pattern!r}")


def usage_of(proc):
    """CPU seconds and peak RSS (MiB) of a finished child."""
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def attach_pytrace(args, pid):
    prof = start([PYTRACE, *args, "-p", str(pid)])
    wait_for(prof.stderr, "attached to PID")
    return prof


def timed_target(python, script, *args):
    return start(python.argv(script, *args, "--delay", DELAY, "--timing"))


# --- calls -----------------------------------------------------------------

def calls_runs(python, modes):
    """Workload seconds: untraced, under cProfile, and under each pytrace mode
    (attached by PID during the target's delay, so every mode starts alike)."""
    runs = {name: [] for name in ["untraced", "cProfile", *modes]}
    calls = None
    for _ in range(REPEATS):
        target = timed_target(python, "callgraph.py", "--rounds", CALL_ROUNDS)
        runs["untraced"].append(workload_seconds(target.communicate()[1]))
        inside, _ = python.out_path("cp.json")
        target = start(python.argv("callgraph.py", "--rounds", CALL_ROUNDS, "--timing", "--cprofile", inside))
        runs["cProfile"].append(workload_seconds(target.communicate()[1]))
        for name, args in modes.items():
            report = os.path.join(TMP, "calls.json")
            target = timed_target(python, "callgraph.py", "--rounds", CALL_ROUNDS)
            prof = attach_pytrace(["calls", "--json", report, *args], target.pid)
            runs[name].append(workload_seconds(target.communicate()[1]))
            prof.stderr.read()
            prof.wait()
            if name == "pytrace uprobe":
                functions = json.load(open(report))["functions"]
                calls = sum(f["calls"] for f in functions if f["file"].endswith("callgraph.py") and f["name"] not in ("<module>", "Shape", "Square"))
    return {k: fastest(v) for k, v in runs.items()}, calls


def calls_table():
    rows = []
    for python in (DEBIAN, NO_PROBES, SID_315, SID_313, TRIXIE_313, TRIXIE_313_SHARED):
        progress(f"calls on {python.label}")
        modes = {"floor": ["--empty-probe"], "pytrace uprobe": ["--mode", "uprobe"]}
        if python is SID_315:
            modes["pytrace usdt"] = ["--mode", "usdt"]
        t, calls = calls_runs(python, modes)
        added = {k: (v - t["untraced"]) / calls * 1e9 for k, v in t.items()}
        usdt = f"{added['pytrace usdt']:.0f}" if "pytrace usdt" in added else "– (no working probes)"
        rows.append(
            f"| {python.label} | {calls:,} | {t['untraced'] / calls * 1e9:.0f} | {added['cProfile']:.0f} | {added['floor']:.0f} "
            f"| {added['pytrace uprobe']:.0f} | {usdt} | {added['pytrace uprobe'] / added['cProfile']:.1f}x "
            f"| {added['pytrace uprobe'] - added['floor']:.0f} |"
        )
    return (
        "| CPython | Python calls | ns/call untraced | cProfile +ns/call | bare uprobe (floor) +ns/call | pytrace uprobe +ns/call "
        "| pytrace usdt +ns/call | pytrace / cProfile | pytrace above floor (ns) |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


# --- sample ----------------------------------------------------------------

def folded_samples(path, names=()):
    """Total samples in a folded file, and samples whose stack has each name."""
    total, per = 0, {n: 0 for n in names}
    for line in open(path):
        stack, _, count = line.strip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        for n in names:
            if re.search(rf"(^|[;:\s(]){n}([\s(:;]|$)", stack):
                per[n] += int(count)
    return total, per


def start_profiling_sampling(python, hz, name, pid, *extra):
    """CPython 3.15's own sampler, run inside `python`'s root and attached to
    `pid` at `hz` in CPU mode, writing collapsed stacks to `name`: (the
    process, the output's path as we see it)."""
    inside, out = python.out_path(name)
    prof = start(["chroot", python.root, python.exe, "-m", "profiling.sampling", "attach", "-r", str(hz), *extra,
                  "--mode", "cpu", "--collapsed", "-o", inside, str(pid)])
    return prof, out


def run_sampler(sampler, python, hz, target):
    """Attaches `sampler` to a started target; returns (profiler CPU s, peak
    RSS MiB, samples, BPF ns per sample or None, path of its output)."""
    if sampler.startswith("pytrace"):
        out = os.path.join(TMP, "sample.json")
        native = ["--native"] if sampler.endswith("--native") else []
        prof = attach_pytrace(["sample", "-r", str(hz), "--json", out, *native], target.pid)
    elif sampler.startswith("py-spy"):
        out = os.path.join(TMP, "pyspy.txt")
        native = ["--native"] if sampler.endswith("--native") else []
        prof = start([PY_SPY, "record", "--pid", str(target.pid), "-r", str(hz), "--format", "raw", "-o", out, *native])
    else:  # CPython 3.15's own profiling.sampling, run inside the root
        prof, out = start_profiling_sampling(python, hz, "stdlib.folded", target.pid)
    target.wait()
    prof.stderr.close()
    cpu, rss = usage_of(prof)
    if sampler.startswith("pytrace"):
        report = json.load(open(out))
        return cpu, rss, report["samples"], report.get("bpf_ns_per_sample"), out
    samples = folded_samples(out)[0] if os.path.exists(out) else 0
    return cpu, rss, samples, None, out


def sample_cost_table():
    rows = []
    for python, samplers in ((DEBIAN, ["pytrace", "pytrace --native", "py-spy", "py-spy --native"]),
                             (SID_315, ["pytrace", "py-spy", "profiling.sampling"])):
        progress(f"sampling cost on {python.label}")
        bases, results = [], {(s, hz): [] for s in samplers for hz in (99, 1000)}
        for _ in range(REPEATS):
            target = timed_target(python, "callgraph.py", "--rounds", SAMPLE_ROUNDS)
            bases.append(workload_seconds(target.communicate()[1]))
            for hz in (99, 1000):
                for s in samplers:
                    target = timed_target(python, "callgraph.py", "--rounds", SAMPLE_ROUNDS)
                    cpu, rss, samples, bpf, _ = run_sampler(s, python, hz, target)
                    seconds = workload_seconds(target.stderr.read())
                    results[(s, hz)].append((seconds, cpu, samples, bpf))
        base = fastest(bases)
        for hz in (99, 1000):
            for s in samplers:
                runs = results[(s, hz)]
                samples = median([r[2] for r in runs])
                if samples == 0:
                    rows.append(f"| {python.label} | {s} | {hz} | 0 | – | – | it took no samples (unsupported version?) |")
                    continue
                per = median([r[1] / max(r[2], 1) * 1e6 for r in runs])
                bpf = [r[3] for r in runs if r[3]]
                bpf_text = f"{median(bpf) / 1000:.1f}" if bpf else "–"
                slow = (fastest([r[0] for r in runs]) / base - 1) * 100
                rows.append(f"| {python.label} | {s} | {hz} | {samples:.0f} | {per:.1f} | {bpf_text} | {slow:+.1f}% |")
    return (
        "| CPython | profiler | Hz | samples | profiler CPU per sample (µs) | BPF per sample (µs) | target slowdown |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


SPLIT_NAMES = ("sixty", "thirty", "ten")
# What fixtures/cpu_split.py gives each of them, in percent of its CPU.
SPLIT_SHARES = {"sixty": 60.0, "thirty": 30.0, "ten": 10.0}


def split_samples(python, sampler, hz, cpu_seconds):
    """fixtures/cpu_split.py run for `cpu_seconds` of CPU on `python`, with
    `sampler` (pytrace, py-spy or profiling.sampling) attached by PID at
    `hz`: the samples each of its three functions got (zeros when the
    sampler wrote nothing)."""
    # Spinning from the start (py-spy's ptrace attach would hold a target
    # that waits for a signal stopped): the few ms before a sampler
    # attaches do not change the shares.
    target = start(python.argv("cpu_split.py", "--cpu-seconds", cpu_seconds))
    time.sleep(0.3)
    if sampler == "pytrace":
        out = os.path.join(TMP, "split.json")
        prof = attach_pytrace(["sample", "-r", str(hz), "--json", out], target.pid)
    elif sampler == "py-spy":
        out = os.path.join(TMP, "split.txt")
        prof = start([PY_SPY, "record", "--pid", str(target.pid), "-r", str(hz), "--format", "raw", "-o", out])
    else:
        prof, out = start_profiling_sampling(python, hz, "split.folded", target.pid)
    target.wait()
    prof.stderr.close()
    prof.wait()
    if sampler == "pytrace":
        functions = json.load(open(out))["functions"]
        return {n: next((f["total_samples"] for f in functions if f["name"] == n), 0) for n in SPLIT_NAMES}
    return folded_samples(out, SPLIT_NAMES)[1] if os.path.exists(out) else {n: 0 for n in SPLIT_NAMES}


def accuracy_table():
    """The 60/30/10 fixture, 4 CPU-seconds at 1000 Hz: each sampler's largest
    share error, in percentage points."""
    rows = []
    names, want = SPLIT_NAMES, SPLIT_SHARES
    for python, samplers in ((DEBIAN, ["pytrace", "py-spy"]), (SID_315, ["pytrace", "py-spy", "profiling.sampling"])):
        progress(f"accuracy on {python.label}")
        for s in samplers:
            errors, counted = [], []
            for _ in range(REPEATS):
                per = split_samples(python, s, 1000, 4)
                total = sum(per.values())
                if total == 0:
                    continue
                counted.append(total)
                errors.append(max(abs(per[n] * 100 / total - want[n]) for n in names))
            if not errors:
                rows.append(f"| {python.label} | {s} | 0 | – | took no samples |")
                continue
            rows.append(f"| {python.label} | {s} | {median(counted):.0f} | {median(errors):.2f} | {max(errors):.2f} |")
    return (
        "| CPython | sampler | samples in the three functions | median worst share error (points) | largest (points) |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )


def cpu_of_running(pid):
    """CPU seconds a running process has used so far, over its threads: in
    nanoseconds from each thread's schedstat where the kernel keeps it
    (/proc/PID/stat counts 10 ms ticks, too coarse for a profiler's few
    milliseconds a second), else user + system from /proc/PID/stat."""
    if os.path.exists(f"/proc/{pid}/schedstat"):
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                pass  # a thread that just exited
        return total / 1e9
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bpf_run_ns(pid):
    """Run time so far (kernel.bpf_stats_enabled) of every BPF program a
    process holds, from its file descriptors' fdinfo: read twice, it gives
    the BPF time of a window while the process still runs."""
    total = 0
    fd_dir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                info = f.read()
        except OSError:
            continue
        found = re.search(r"^run_time_ns:\s+(\d+)", info, re.M)
        if found and "prog_type:" in info:
            total += int(found.group(1))
    return total


STEADY_SECONDS = 12
STEADY_FROM = 4
STEADY_TO = 10
# How old the target is when a sampler attaches: past its first seconds,
# in which pytrace names a young process's new stacks at once
# (bpf/sample_walk_base.bpf.h, YOUNG_NS), as it imports. The same wait
# for every sampler.
STEADY_TARGET_AGE = 6


def steady_cost_table():
    """Steady-state cost at 1000 Hz, attached by PID to a CPU-bound target
    (callgraph.py, STEADY_TARGET_AGE seconds old) on Debian's 3.11 and on sid's 3.15, where CPython's own
    profiling.sampling runs too: each profiler samples for STEADY_SECONDS;
    its CPU (and pytrace's BPF run time) is read at STEADY_FROM and
    STEADY_TO seconds, while it still runs, and that difference over the
    samples taken in between (its samples times the window's share of its
    sampling time) is its steady cost per sample: start-up and shut-down
    (resolving and writing the profile) left out. The whole run's CPU after
    start-up, shut-down included, is shown beside it."""
    rows = []
    runs = ((DEBIAN, ["pytrace", "pytrace --native", "py-spy", "py-spy --native"]),
            (SID_315, ["pytrace", "py-spy", "profiling.sampling"]))
    results = {(python.label, s): [] for python, samplers in runs for s in samplers}
    progress("steady-state sampling cost at 1000 Hz")
    for _ in range(REPEATS):
        for python, samplers in runs:
            for s in samplers:
                target = start(python.argv("callgraph.py", "--rounds", 100000000))
                time.sleep(STEADY_TARGET_AGE)
                native = ["--native"] if s.endswith("--native") else []
                is_pytrace = s.startswith("pytrace")
                if is_pytrace:
                    out = os.path.join(TMP, "steady.json")
                    prof = start([PYTRACE, "sample", "-p", str(target.pid), "-r", "1000", "-d", str(STEADY_SECONDS), "--json", out, *native])
                    wait_for(prof.stderr, "attached to PID")
                elif s.startswith("py-spy"):
                    out = os.path.join(TMP, "steady.txt")
                    prof = start([PY_SPY, "record", "--pid", str(target.pid), "-r", "1000", "-d", str(STEADY_SECONDS), "--format", "raw", "-o", out, *native])
                else:  # CPython 3.15's own sampler, run inside the root
                    prof, out = start_profiling_sampling(python, 1000, "steady.folded", target.pid, "-d", str(STEADY_SECONDS))
                began = time.monotonic()
                marks = []
                for at in (STEADY_FROM, STEADY_TO):
                    time.sleep(max(0.0, began + at - time.monotonic()))
                    marks.append((time.monotonic(), cpu_of_running(prof.pid), bpf_run_ns(prof.pid) if is_pytrace else 0))
                prof.stderr.read()
                cpu_end, _ = usage_of(prof)
                target.kill()
                target.wait()
                if is_pytrace:
                    samples = json.load(open(out))["samples"]
                else:
                    samples = folded_samples(out)[0] if os.path.exists(out) else 0
                (t0, cpu0, bpf0), (t1, cpu1, bpf1) = marks
                in_window = samples * (t1 - t0) / STEADY_SECONDS
                after_start = samples * (STEADY_SECONDS - STEADY_FROM) / STEADY_SECONDS
                if in_window > 0:
                    results[(python.label, s)].append({
                        "samples": samples,
                        "ms_per_s": (cpu1 - cpu0) / (t1 - t0) * 1e3,
                        "cpu_us": (cpu1 - cpu0) / in_window * 1e6,
                        "bpf_us": (bpf1 - bpf0) / in_window / 1e3 if is_pytrace else None,
                        "with_exit_us": (cpu_end - cpu0) / after_start * 1e6,
                        "load": os.getloadavg()[0],
                    })
    # Medians, with the range over the repeats: the machine is shared, and
    # the spread says how far one run can be trusted.
    def spread(values, digits=1):
        text = f"{median(values):.{digits}f}"
        return text if len(values) < 2 else f"{text} ({min(values):.{digits}f}–{max(values):.{digits}f})"
    for python, samplers in runs:
        for s in samplers:
            r = results[(python.label, s)]
            if not r:
                rows.append(f"| {python.label} | {s} | 0 | – | – | – | – | – | – |")
                continue
            bpf = [x["bpf_us"] for x in r if x["bpf_us"] is not None]
            totals = [x["cpu_us"] + (x["bpf_us"] or 0) for x in r]
            loads = [x["load"] for x in r]
            rows.append(
                f"| {python.label} | {s} | {median([x['samples'] for x in r]):.0f} | {spread([x['ms_per_s'] for x in r])} | {spread([x['cpu_us'] for x in r])} "
                f"| {spread(bpf) if bpf else '–'} | {spread(totals)} | {spread([x['with_exit_us'] for x in r])} | {min(loads):.1f}–{max(loads):.1f} |"
            )
    # Per second too: a profiler's fixed costs (waking to read, draining)
    # spread over fewer samples when the target gets less than a CPU.
    return (
        f"| CPython | profiler | samples in {STEADY_SECONDS} s | profiler CPU, steady (ms per s) | profiler CPU per sample, steady (µs) | BPF per sample, steady (µs) "
        "| total per sample, steady (µs) | profiler CPU per sample with its exit (µs) | load average at the end |\n"
        "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


# Rates for the aliasing table: exact multiples of the workload's 10 ms
# period (10, 50, 100 Hz), exact divisors (200, 500, 1000 Hz), rates near
# them (97, 199, 499, 997 Hz) and the default (99 Hz).
ALIAS_RATES = (10, 50, 97, 99, 100, 199, 200, 499, 500, 997, 1000)


def alias_seconds(hz):
    """CPU-seconds of the workload at a rate: about 1,500 samples, 4 s at
    least, 40 s at most (10 Hz then gives 400)."""
    return min(40, max(4, 1500 / hz))


def aliasing_table():
    """fixtures/cpu_split.py (60/30/10 of every 10 ms of CPU) by PID under
    each sampler at each rate, the samplers one after the other for each
    rate: the largest share error, and one standard error of it."""
    rows = []
    names, want = SPLIT_NAMES, SPLIT_SHARES
    for hz in ALIAS_RATES:
        progress(f"aliasing at {hz} Hz")
        cells = []
        for s in ("pytrace", "py-spy"):
            seconds = alias_seconds(hz)
            per = split_samples(DEBIAN, s, hz, seconds)
            total = sum(per.values())
            if total == 0:
                cells.append("0 | – ")
                continue
            worst = max(names, key=lambda n: abs(per[n] * 100 / total - want[n]))
            error = abs(per[worst] * 100 / total - want[worst])
            se = (want[worst] / 100 * (1 - want[worst] / 100) / total) ** 0.5 * 100
            cells.append(f"{total} | {error:.1f} ({se:.1f})")
        rows.append(f"| {hz} | {seconds:.1f} | " + " | ".join(cells) + " |")
    return (
        "| Hz | CPU-s | pytrace samples | pytrace worst error, points (1 SE) | py-spy samples | py-spy worst error, points (1 SE) |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_trace(prof, seconds):
    """The RSS of `prof`, a run of `seconds`, every 30 s (a trend rather
    than two points) until it exits: the trace, its reading at or after
    60 s (early, past warm-up), and its last (late)."""
    began = time.monotonic()
    trace = []
    while time.monotonic() - began < seconds - 5:
        time.sleep(min(30, seconds - 5 - (time.monotonic() - began)))
        trace.append((time.monotonic() - began, rss_mib(prof.pid)))
    early = next(((t, r) for t, r in trace if t >= 60), trace[0])
    prof.stderr.read()
    usage_of(prof)
    return trace, early, trace[-1]


def memory_command_rss_row(seconds, python=DEBIAN, extra=()):
    """`pytrace memory` itself over a long run: bench/memory/alloc_heavy.py
    (rolling caches, json round trips: pools open and close, big buffers
    come and go) on `python`, at --every 4096 so that about
    a hundred times more events are kept than by default, the kept blocks
    re-read every second. RSS every 30 s, as for `sample --all`. `extra`:
    more of memory's flags (--allocations)."""
    mode = " ".join(["memory", "--every", "4096", *extra])
    progress(f"memory: `pytrace {mode}` for {seconds} s")
    script = os.path.join(HERE, "..", "bench", "memory", "alloc_heavy.py")
    # Niced: the workload spins a CPU for the whole run.
    target = start(["nice", "-n", "10", python.exe, script, str(10**9)])
    time.sleep(1.5)
    out = os.path.join(TMP, "mem-memory.json")
    prof = start([PYTRACE, *mode.split(), "-p", str(target.pid), "-d", str(seconds), "--json", out])
    trace, early, late = rss_trace(prof, seconds)
    target.kill()
    target.wait()
    report = json.load(open(out))
    counters = report["counters"]
    kept = sum(row["grown"]["kept"] for row in report["stacks"])
    progress(f"memory: `pytrace {mode}` RSS every 30 s (MiB): " + " ".join(f"{t:.0f}s={r:.1f}" for t, r in trace))
    progress(f"memory: `pytrace {mode}` counters: {counters}")
    probed = f"{report['allocations']['events']:,} allocator calls probed; " if "allocations" in report else ""
    return (f"| `{mode}`, alloc_heavy.py on {python.label} ({probed}{kept:,} events kept, {len(report['stacks'])} stacks; "
            f"lost: {report['lost_events']}) | {kept} | {early[0]:.0f} s: {early[1]:.1f} | "
            f"{late[0]:.0f} s: {late[1]:.1f} | {(late[1] - early[1]) / max(1, late[0] - early[0]) * 1024:.1f} KiB/s |")


def memory_table():
    """pytrace's resident memory over long runs: `sample --all -r 99` over
    20 processes for MEMORY_SECONDS (RSS at 1 minute and at the end), and
    `sample --idle -r 999` on 200 sleeping threads for 60 s (RSS at 10 s
    and 60 s)."""
    rows = []
    seconds = MEMORY_SECONDS
    progress(f"memory: --all over 20 processes for {seconds} s")
    targets = [start(DEBIAN.argv("cpu_split.py", "--seconds", seconds + 30)) for _ in range(20)]
    time.sleep(1.5)
    out = os.path.join(TMP, "mem-all.json")
    prof = start([PYTRACE, "sample", "--all", "-r", "99", "-d", str(seconds), "--json", out])
    trace, early, late = rss_trace(prof, seconds)
    for t in targets:
        t.kill()
        t.wait()
    report = json.load(open(out))
    # Pythons other work on the machine started and ended during the run:
    # --all samples them too, and their stacks stay in the profile.
    others = report["counters"].get("processes_exited", 0)
    rows.append(f"| `sample --all -r 99`, 20 processes ({others} other Pythons came and went) | {report['samples']} | {early[0]:.0f} s: {early[1]:.1f} | {late[0]:.0f} s: {late[1]:.1f} | {(late[1] - early[1]) / max(1, late[0] - early[0]) * 1024:.1f} KiB/s |")
    progress("memory: RSS every 30 s (MiB): " + " ".join(f"{t:.0f}s={r:.1f}" for t, r in trace))

    rows.append(memory_command_rss_row(seconds))
    # --allocations needs a symbol table (a stripped build's allocator is
    # copied into its callers).
    rows.append(memory_command_rss_row(seconds, NO_PROBES, ["--allocations"]))

    progress("memory: --idle on 200 sleeping threads for 60 s")
    target = start(DEBIAN.argv("many_threads.py", 200, 90, "--sleep"))
    time.sleep(1.5)
    out = os.path.join(TMP, "mem-idle.json")
    prof = start([PYTRACE, "sample", "--idle", "-r", "999", "-p", str(target.pid), "-d", "60", "--json", out])
    time.sleep(10)
    early = rss_mib(prof.pid)
    time.sleep(45)
    late = rss_mib(prof.pid)
    prof.stderr.read()
    usage_of(prof)
    target.kill()
    target.wait()
    samples = json.load(open(out))["samples"]
    rows.append(f"| `sample --idle -r 999`, 200 sleeping threads | {samples} | 10 s: {early:.1f} | 55 s: {late:.1f} | {(late - early) / 45 * 1024:.1f} KiB/s |")
    return (
        "| run | samples (memory: events kept) | RSS early (MiB) | RSS late (MiB) | growth |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )


def scale_table():
    """pytrace against py-spy at 99 Hz for 8 s: one target with 100 threads,
    and 20 targets at once (pytrace: one `sample --all`; py-spy: one per
    process)."""
    rows = []
    seconds = 8
    progress("scale: 100 threads")
    for s in ("pytrace", "py-spy"):
        cpus, rsss, counts = [], [], []
        for _ in range(REPEATS):
            target = start(DEBIAN.argv("many_threads.py", 100, seconds + 3))
            time.sleep(1)
            if s == "pytrace":
                out = os.path.join(TMP, "threads.json")
                prof = start([PYTRACE, "sample", "-p", str(target.pid), "-r", "99", "-d", str(seconds), "--json", out])
            else:
                out = os.path.join(TMP, "threads.txt")
                prof = start([PY_SPY, "record", "--pid", str(target.pid), "-r", "99", "-d", str(seconds), "--format", "raw", "-o", out])
            prof.stderr.read()
            cpu, rss = usage_of(prof)
            target.kill()
            target.wait()
            samples = json.load(open(out))["samples"] if s == "pytrace" else folded_samples(out)[0]
            cpus.append(cpu), rsss.append(rss), counts.append(samples)
        rows.append(f"| 1 process, 100 threads | {s} (1 process) | {median(counts):.0f} | {median(cpus):.2f} | {median(rsss):.0f} |")
    progress("scale: 20 processes")
    for s in ("pytrace", "py-spy"):
        cpus, rsss, counts = [], [], []
        for _ in range(REPEATS):
            targets = [start(DEBIAN.argv("cpu_split.py", "--seconds", seconds + 4)) for _ in range(20)]
            time.sleep(1.5)
            if s == "pytrace":
                out = os.path.join(TMP, "all.json")
                profs = [start([PYTRACE, "sample", "--all", "-r", "99", "-d", str(seconds), "--json", out])]
            else:
                outs = [os.path.join(TMP, f"p{i}.txt") for i in range(20)]
                profs = [start([PY_SPY, "record", "--pid", str(t.pid), "-r", "99", "-d", str(seconds), "--format", "raw", "-o", o])
                         for t, o in zip(targets, outs)]
            for p in profs:
                p.stderr.read()
            usage = [usage_of(p) for p in profs]
            for t in targets:
                t.kill()
                t.wait()
            if s == "pytrace":
                samples = json.load(open(out))["samples"]
            else:
                samples = sum(folded_samples(o)[0] for o in outs if os.path.exists(o))
            cpus.append(sum(u[0] for u in usage)), rsss.append(sum(u[1] for u in usage)), counts.append(samples)
        what = "1 process (--all)" if s == "pytrace" else "20 processes"
        rows.append(f"| 20 processes at once | {s} ({what}) | {median(counts):.0f} | {median(cpus):.2f} | {median(rsss):.0f} |")
    return (
        f"| target | profiler | samples | profiler CPU (s, {seconds} s run) | profiler peak RSS (MiB, summed) |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )


def attach_table():
    """Seconds from starting pytrace to its 'attached' line, by PID, on a
    target waiting for a signal (so it is idle)."""
    rows = []
    for python in (DEBIAN, NO_PROBES, SID_315, SID_313, TRIXIE_313, TRIXIE_313_SHARED):
        progress(f"attach time on {python.label}")
        for sub in (["calls"], ["sample"], ["gc"]):
            times = []
            for _ in range(REPEATS):
                target = start(python.argv("callgraph.py", "--rounds", 1, "--wait"), stdout=subprocess.PIPE)
                target.stdout.readline()
                t0 = time.monotonic()
                prof = attach_pytrace([*sub, "--json", os.path.join(TMP, "attach.json")], target.pid)
                times.append(time.monotonic() - t0)
                prof.send_signal(2)
                prof.stderr.read()
                prof.wait()
                target.kill()
                target.wait()
            rows.append(f"| {python.label} | {sub[0]} | {median(times) * 1000:.0f} | {max(times) * 1000:.0f} |")
    return "| CPython | subcommand | median (ms) | slowest (ms) |\n|---|---|---|---|\n" + "\n".join(rows)


def gc_table():
    rows = []
    for python, mode in ((DEBIAN, "usdt"), (DEBIAN, "watchpoint"), (NO_PROBES, "watchpoint")):
        progress(f"gc --mode {mode} on {python.label}")
        base, traced, report = [], [], None
        for _ in range(REPEATS):
            target = start(python.argv("gc_cycles.py", "--rounds", 1000000, "--timing"))
            base.append(workload_seconds(target.communicate()[1]))
            report = os.path.join(TMP, "gc.json")
            target = start([PYTRACE, "gc", "--mode", mode, "--json", report, "--", *python.argv("gc_cycles.py", "--rounds", 1000000, "--timing")])
            traced.append(workload_seconds(target.communicate()[1]))
        r = json.load(open(report))
        n = sum(g["collections"] for g in r["generations"])
        b, t = fastest(base), fastest(traced)
        rows.append(f"| {python.label} | {r['python']['mode']} | {n:,} | {b:.3f} | {t:.3f} | {(t / b - 1) * 100:+.1f}% | {(t - b) / n * 1e9:.0f} |")
    return (
        "| CPython | gc mode | collections | s untraced | s under pytrace gc | slowdown | ns added per collection |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


# --- calls a build makes without entering the eval function ---------------

BYPASSED_COUNT = 200000


def bypassed_table():
    """What pytrace adds per call where it counts a call at the place a build
    bypasses _PyEval_EvalFrameDefault, next to an ordinary traced call:
    3.11.2's inlined __getitem__ against a plain call, and a generator
    close() whose frame 3.14 skips (close loop minus the same loop without
    the close)."""
    sid_314 = Python("Debian sid 3.14 (chroot)", "/usr/bin/python3.14", SID_ROOT)
    cases = [(DEBIAN, "getitem", "call"), (sid_314, "close", "keep")]
    rows = []
    for python, what, baseline in cases:
        progress(f"bypassed calls ({what}) on {python.label}")
        t = {}
        for name in (what, baseline):
            untraced, traced = [], []
            for _ in range(REPEATS):
                argv = python.argv("bypassed_calls.py", "--what", name, "--count", BYPASSED_COUNT, "--timing")
                untraced.append(workload_seconds(start(argv).communicate()[1]))
                target = start([PYTRACE, "calls", "--", *argv])
                traced.append(workload_seconds(target.communicate()[1]))
            t[name] = (fastest(untraced), fastest(traced))
        per = lambda name: (t[name][1] - t[name][0]) / BYPASSED_COUNT * 1e9
        if what == "getitem":
            rows.append(f"| {python.label} | inlined `__getitem__` (BINARY_SUBSCR_GETITEM) | {per(what):.0f} | plain call: {per(baseline):.0f} |")
        else:
            rows.append(f"| {python.label} | `close()` skipping a generator's frame | {per(what) - per(baseline):.0f} | – |")
    return (
        "| CPython | call | pytrace +ns per such call | an ordinary traced call, +ns |\n|---|---|---|---|\n" + "\n".join(rows)
    )


def imports_table():
    """What `imports` costs a program that imports nothing while it runs:
    none with the USDT probes; a probe hit per evaluation entered from C
    (3.11) in uprobe mode, which builds without the probes get."""
    rows = []
    for python, mode in ((DEBIAN, "usdt"), (DEBIAN, "uprobe"), (NO_PROBES, "uprobe")):
        progress(f"imports --mode {mode} on {python.label}")
        base, traced = [], []
        for _ in range(REPEATS):
            target = start(python.argv("callgraph.py", "--rounds", CALL_ROUNDS, "--timing"))
            base.append(workload_seconds(target.communicate()[1]))
            target = start([PYTRACE, "imports", "--mode", mode, "--json", os.path.join(TMP, "imports.json"), "--",
                            *python.argv("callgraph.py", "--rounds", CALL_ROUNDS, "--timing")])
            traced.append(workload_seconds(target.communicate()[1]))
        b, t = fastest(base), fastest(traced)
        rows.append(f"| {python.label} | {mode} | {b:.3f} | {t:.3f} | {(t / b - 1) * 100:+.1f}% |")
    return (
        "| CPython | imports mode | s untraced | s under pytrace imports | slowdown |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )


# --- gil: what each GIL release and take costs under `pytrace gil` ------------

GIL_SWITCHES = 200000


def gil_table():
    """fixtures/gil_switches.py untraced and under `pytrace gil`, interleaved:
    one thread releasing and taking the GIL back (nobody else wants it) and
    two threads handing it to each other. The probes run in the target's
    context, so the added time is the cost."""
    rows = []
    # take_gil and drop_gil by symbol, and Debian's stripped 3.11, where gil
    # probes them found by code search and the inlined drops at the PLT
    # stub of pthread_cond_signal.
    pythons = (Python("3.11 without probes (symbols)", NODTRACE), Python("pyenv 3.12", PYENV_312), Python("Debian 3.11 (stripped: code search)", DEBIAN.exe))
    for python in pythons:
        for threads in (1, 2):
            progress(f"gil, {threads} thread(s), on {python.label}")
            argv = python.argv("gil_switches.py", "--switches", GIL_SWITCHES, "--threads", threads, "--timing")
            base, traced, report = [], [], os.path.join(TMP, "gil.json")
            for _ in range(REPEATS):
                base.append(workload_seconds(start(argv).communicate()[1]))
                traced.append(workload_seconds(start([PYTRACE, "gil", "--json", report, "--", *argv]).communicate()[1]))
            r = json.load(open(report))
            switches = sum(t["switches"] for t in r["threads"])
            b, t = fastest(base), fastest(traced)
            what = "release and take back" if threads == 1 else "2 threads releasing"
            rows.append(f"| {python.label} | {what} | {switches:,} | {b / GIL_SWITCHES * 1e6:.2f} | {t / GIL_SWITCHES * 1e6:.2f} | "
                        f"{(t - b) / GIL_SWITCHES * 1e6:+.2f} |")
    return (
        "| CPython | workload | switches seen | µs per release untraced | µs under pytrace gil | µs added |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


# --- uprobes: what the kernel takes per hit, by the instruction probed --------

PROBE_SITE_CALLS = 100000
PROBE_SITES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "probe_sites")


def file_offset(binary, address):
    """The file offset of link-time `address` in `binary`, from its section
    headers (what a uprobe wants)."""
    for line in subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 5 and fields[0].startswith("[") and fields[2] == "PROGBITS":
            at, off, size = int(fields[3], 16), int(fields[4], 16), int(fields[5], 16)
            if at <= address < at + size:
                return address - at + off
    raise SystemExit(f"{address:#x} is in no section of {binary}")


def probe_site_table():
    """bench/probe_sites: a loop calling a function through the PLT, untraced
    and with one bare tracefs uprobe (no BPF) on each instruction of the
    path in turn. The time added per call is the kernel's handling of one
    hit there: whether it emulates the instruction or single-steps it out of
    line. This is why pytrace probes past an endbr64 and at the calls of a
    PLT stub rather than at the stub."""
    work = os.path.join(TMP, "probe_sites")
    os.makedirs(work, exist_ok=True)
    lib, main = os.path.join(work, "libbump.so"), os.path.join(work, "main")
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-o", lib, os.path.join(PROBE_SITES_DIR, "lib.c")], check=True)
    subprocess.run(["gcc", "-O2", "-o", main, os.path.join(PROBE_SITES_DIR, "main.c"), "-L", work, "-lbump",
                    f"-Wl,-rpath,{work}", "-Wl,-z,now"], check=True)
    dis = subprocess.run(["objdump", "-d", main], capture_output=True, text=True, check=True).stdout
    stub = next(int(l.split()[0], 16) for l in dis.splitlines() if l.endswith("<bump@plt>:"))
    call = next(int(l.split(":")[0], 16) for l in dis.splitlines() if "call" in l and l.endswith("<bump@plt>"))
    bump = next(int(l.split()[0], 16) for l in subprocess.run(["nm", "-D", lib], capture_output=True, text=True, check=True).stdout.splitlines() if l.endswith(" bump"))
    sites = [
        ("`call rel32` to the PLT stub (the caller's call)", main, call),
        ("`jmp *slot(%rip)` (the PLT stub)", main, stub),
        ("`endbr64` (the function's first instruction)", lib, bump),
        ("`push %rbx` (right after the endbr64)", lib, bump + 4),
        ("`addl $1,(%rdi)` (an add to memory)", lib, bump + 5),
    ]
    def tracefs_write(name, text):
        # One write, appending (open(..., "a") seeks, which tracefs refuses).
        fd = os.open(os.path.join("/sys/kernel/tracing", name), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def per_call():
        return float(subprocess.run([main, str(PROBE_SITE_CALLS)], capture_output=True, text=True, check=True).stdout)

    base = fastest([per_call() for _ in range(REPEATS)])
    rows = []
    for what, binary, address in sites:
        progress(f"probe sites: {what}")
        tracefs_write("uprobe_events", f"p:pytrace_bench/site {binary}:{file_offset(binary, address):#x}\n")
        try:
            tracefs_write("events/pytrace_bench/site/enable", "1")
            probed = fastest([per_call() for _ in range(REPEATS)])
        finally:
            tracefs_write("events/pytrace_bench/site/enable", "0")
            tracefs_write("uprobe_events", "-:pytrace_bench/site\n")
        rows.append(f"| {what} | {base:.1f} | {probed:.1f} | {(probed - base) / 1000:+.2f} |")
    return (
        "| instruction probed | ns per call untraced | ns per call probed | µs added per hit |\n"
        "|---|---|---|---|\n" + "\n".join(rows)
    )


# --- dump: how long a one-off look at a busy target takes -------------------

DUMP_RUNS = 20
DUMP_THREADS = 4
DUMP_DEPTH = 60


# What a run costs beyond its steady samples or events (issue #27: <= 0.1 s
# of CPU): each subcommand run for FIXED_SHORT and FIXED_LONG seconds on one
# target; its CPU is a + b * seconds, so the fixed part a is
# short - (long - short) * FIXED_SHORT / (FIXED_LONG - FIXED_SHORT).
FIXED_SHORT, FIXED_LONG = 1, 5
FIXED_RUNS = [
    ("sample -r 99", ["sample", "-r", "99"]),
    ("sample -r 1000", ["sample", "-r", "1000"]),
    ("sample --native", ["sample", "--native"]),
    ("sample --idle -r 999", ["sample", "--idle", "-r", "999"]),
    ("calls", ["calls"]),
    ("gc", ["gc"]),
    ("imports", ["imports"]),
    ("gil", ["gil"]),
    ("memory", ["memory"]),
]


def child_cpu(argv):
    """CPU seconds (user + system) of one run of `argv` to its exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def fixed_cost_table():
    """Each subcommand by PID on one CPU-bound target (Debian's 3.11,
    fixtures/cpu_split.py), FIXED_SHORT and FIXED_LONG seconds in turn,
    REPEATS times; `dump` once per round. Medians."""
    target = start(DEBIAN.argv("cpu_split.py", "--seconds", 100000))
    time.sleep(1.5)
    pid = str(target.pid)
    load_before = os.getloadavg()[0]
    rows = []
    try:
        for label, args in FIXED_RUNS:
            progress(f"fixed cost: {label}")
            short, long = [], []
            for _ in range(REPEATS):
                short.append(child_cpu([PYTRACE, *args, "-p", pid, "-d", str(FIXED_SHORT), "--json", os.path.join(TMP, "fixed.json")]))
                long.append(child_cpu([PYTRACE, *args, "-p", pid, "-d", str(FIXED_LONG), "--json", os.path.join(TMP, "fixed.json")]))
            a, b = median(short), median(long)
            fixed = a - (b - a) * FIXED_SHORT / (FIXED_LONG - FIXED_SHORT)
            steady = (b - a) / (FIXED_LONG - FIXED_SHORT)
            rows.append(f"| `{label}` | {a:.3f} | {b:.3f} | {steady * 1000:.1f} | **{fixed:.3f}** |")
        progress("fixed cost: dump")
        dumps = [child_cpu([PYTRACE, "dump", "-p", pid]) for _ in range(max(3, REPEATS))]
        rows.append(f"| `dump` | – | – | – | **{median(dumps):.3f}** |")
    finally:
        target.kill()
        target.wait()
    load_after = os.getloadavg()[0]
    return (
        f"Load average {load_before:.1f} before, {load_after:.1f} after.\n\n"
        f"| run | CPU s, {FIXED_SHORT} s run | CPU s, {FIXED_LONG} s run | steady CPU ms per second | fixed CPU s |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )


def nearest_rank(values, fraction):
    """The value at `fraction` of the sorted values (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def dump_table():
    """Wall time of `pytrace dump -p` and `py-spy dump --pid`, alternating,
    on a target whose every thread spins deep in its stack: first the busy
    target alone (its threads outnumber the CPUs), then beside one
    CPU-bound neighbour per CPU. The tools start at normal priority and
    compete for the CPUs as a user's command would. Every dump must exit 0
    and show every thread (counted in its output), or the table fails."""
    progress(f"dump, {max(DUMP_RUNS, REPEATS)} runs of each, alone and beside neighbours")
    rows = []
    for neighbour_count in (0, os.cpu_count()):
        neighbours = [start([DEBIAN.exe, "-c", "while True: pass"]) for _ in range(neighbour_count)]
        target = start(DEBIAN.argv("busy_deep_threads.py", DUMP_THREADS, DUMP_DEPTH), stdout=subprocess.PIPE)
        try:
            if target.stdout.readline().strip() != "ready":
                raise RuntimeError("busy_deep_threads.py did not start")
            pid = str(target.pid)
            tools = {"pytrace": [PYTRACE, "dump", "-p", pid], "py-spy": [PY_SPY, "dump", "--pid", pid]}
            times = {name: [] for name in tools}
            cpu = {name: [] for name in tools}
            load_before = os.getloadavg()[0]
            for _ in range(max(DUMP_RUNS, REPEATS)):
                for name, argv in tools.items():
                    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
                    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    times[name].append(time.monotonic() - t0)
                    # Only this dump was reaped since `before` (the target and
                    # the neighbours are reaped at the end): its CPU alone.
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                    # Both print a "Thread TID (...)" line per thread.
                    threads = len(re.findall(r"^Thread \d+ ", done.stdout, re.M))
                    if done.returncode != 0 or threads != DUMP_THREADS + 1:
                        raise RuntimeError(f"{name} dump exited {done.returncode} with {threads} threads: {done.stderr.strip()}")
            load_after = os.getloadavg()[0]
        finally:
            for proc in (target, *neighbours):
                proc.kill()
                proc.wait()
        rows += [f"| {neighbour_count} | {name} | {len(t)} | {min(t) * 1000:.0f} | {median(t) * 1000:.0f} | {nearest_rank(t, 0.95) * 1000:.0f} | "
                 f"{max(t) * 1000:.0f} | {median(cpu[name]) * 1000:.0f} | {load_before:.1f} / {load_after:.1f} |" for name, t in times.items()]
    return (
        "| neighbours | tool | runs | wall min (ms) | wall median (ms) | wall p95 (ms) | wall max (ms) | CPU median (ms) | load before / after |\n"
        "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


# The tables that run a Python of the sid root: only they need it set up
# (a run of other tables alone leaves the shared root and its /proc alone).
SID_TABLES = {"calls_table", "sample_cost_table", "steady_cost_table", "accuracy_table", "attach_table", "bypassed_table"}


# --- memory: its cost beside memray and tracemalloc ---------------------------

MEMORY_ROUNDS = 1000
MEMORY_REPEATS = max(5, REPEATS)


def workload_cpu(argv):
    """A bench/memory workload's own CPU seconds of its work (user plus
    system: a uprobe's trap runs on the target's thread), from its cpu_s=
    line."""
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
    return float(re.search(r"cpu_s=([0-9.]+)", out.stdout).group(1))


def workload_cpu_table(modes, what, last_column, cell):
    """Each mode (name: argv) run MEMORY_REPEATS times,
    interleaved, its workload's CPU seconds read from its cpu_s= line; a
    row per mode with the median, the range and `cell(median, untraced
    median)` under `last_column` (empty for the untraced row)."""
    runs = {name: [] for name in modes}
    for i in range(MEMORY_REPEATS):
        for name, argv in modes.items():
            progress(f"{what} {i + 1}/{MEMORY_REPEATS}: {name}")
            runs[name].append(workload_cpu([str(a) for a in argv]))
    base = median(runs["untraced"])
    rows = [f"| mode | workload CPU s, median | range | {last_column} |", "|---|---|---|---|"]
    for name, values in runs.items():
        rows.append(f"| {name} | {median(values):.3f} | {min(values):.3f}-{max(values):.3f} | {'' if name == 'untraced' else cell(median(values), base)} |")
    return "\n".join(rows)


def memory_cost_table():
    """Each mode in turn, MEMORY_REPEATS times interleaved, on pyenv's 3.12
    (symbols: `pytrace memory`'s sites are found there): the workload's CPU
    seconds, median and range, and the median's slowdown over the plain
    runs' median."""
    python = PYENV_312
    script = os.path.join(HERE, "..", "bench", "memory", "alloc_heavy.py")
    memray_out = os.path.join(TMP, "memray.bin")
    modes = {
        "untraced": [python, script, MEMORY_ROUNDS],
        "`pytrace memory` (default, one event per 512 KiB)": [PYTRACE, "memory", "--json", os.path.join(TMP, "memory.json"), "--", python, script, MEMORY_ROUNDS],
        "tracemalloc (`-X tracemalloc`, 1 frame)": [python, "-X", "tracemalloc", script, MEMORY_ROUNDS],
        "memray 1.20 (`memray run`, its defaults)": [MEMRAY, "run", "-f", "-q", "-o", memray_out, script, MEMORY_ROUNDS],
        "`pytrace memory --allocations` (a probe on every object allocation)": [PYTRACE, "memory", "--allocations", "--json", os.path.join(TMP, "memory-allocations.json"), "--", python, script, MEMORY_ROUNDS],
    }
    return workload_cpu_table(modes, "memory cost", "slowdown (medians)", lambda m, base: f"{(m / base - 1) * 100:+.1f} %")


# --- whole-workload cost, two copies in turns (bench/turns.py) -------------

TURNS = 400


def second_libpython():
    """A directory with a copy of pyenv's 3.12 libpython, for the second
    copy of bench/turns.py (its RUNPATH yields to LD_LIBRARY_PATH): two
    copies that map one file share its text in the CPU's caches, turn
    after turn, except the pages a uprobe's breakpoint made private to the
    traced copy, which would charge the probes for the lost sharing."""
    own = os.path.join(TMP, "second-libpython")
    if not os.path.isdir(own):
        os.makedirs(own)
        lib = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(PYENV_312))), "lib", "libpython3.12.so.1.0")
        shutil.copy2(lib, os.path.join(own, "libpython3.12.so.1.0"))
    return own


def turns_run(work, per_turn, traced_first, argv_prefix, attach=None, swap=False):
    """One run of bench/turns.py: two copies of `work` on CPU 0 taking
    turns, the first or the second of them traced: started under
    argv_prefix (the untraced one under pyenv's 3.12), or with
    `attach(pid)` (a profiler started on CPU 1 and attached) once both are
    warm. With `swap`, the profiler is stopped (SIGINT) half way, with
    both copies waiting, and attached to the other copy for the second
    half (nothing attached: the same halves, for the method's noise).
    Returns, for "cpu" and "wall", each half's (traced, untraced) seconds
    per turn: one half, or two with `swap`."""
    script = os.path.join(HERE, "..", "bench", "turns.py")
    second_env = dict(os.environ, LD_LIBRARY_PATH=second_libpython())
    to_first_r, to_first_w = os.pipe()
    to_second_r, to_second_w = os.pipe()
    half = TURNS // 2
    copies = []
    for index, (token_in, token_out) in enumerate([(to_first_r, to_second_w), (to_second_r, to_first_w)]):
        traced = (index == 0) == traced_first
        prefix = list(argv_prefix) if traced else [PYENV_312]
        pause = [half] if swap and index == 1 else []
        argv = [str(a) for a in [*prefix, script, work, TURNS, per_turn, token_in, token_out, *pause]]
        copies.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, pass_fds=(token_in, token_out),
                                       env=second_env if index == 1 else None))
    for fd in (to_first_r, to_second_r, to_second_w):
        os.close(fd)
    first, second = (copies[0], copies[1]) if traced_first else (copies[1], copies[0])
    profs = []
    try:
        for copy in copies:
            assert copy.stdout.readline().strip() == "ready"
        if attach is not None:
            profs.append(attach(first.pid))
        os.write(to_first_w, b"t")
        if swap:
            assert copies[1].stdout.readline().strip() == "paused"
            if attach is not None:
                profs[0].send_signal(signal.SIGINT)
                profs[0].stderr.read()
                profs[0].wait()
                profs.append(attach(second.pid))
            os.write(to_first_w, b"t")
        measured = [[[float(x) for x in copy.stdout.readline().split()] for _ in ("cpu", "wall")] for copy in copies]
        for copy in copies:
            copy.wait()
        if any(len(turns) != TURNS for copy in measured for turns in copy):
            raise RuntimeError(f"bench/turns.py: a copy ended before its {TURNS} turns")
        for prof in profs:
            prof.stderr.read()
            prof.wait()
    finally:
        os.close(to_first_w)
        for proc in [*copies, *profs]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    a, b = measured if traced_first else measured[::-1]
    out = {}
    for k, name in enumerate(("cpu", "wall")):
        if swap:
            out[name] = [(a[k][:half], b[k][:half]), (b[k][half:], a[k][half:])]
        else:
            out[name] = [(a[k], b[k])]
    return out


def turns_table(what, modes, measure, work, per_turn):
    """Each mode (name: turns_run's keywords) MEMORY_REPEATS times, the
    modes taking turns run by run (so the machine's drift over minutes falls
    on all alike) and the traced copy alternating between the first and the
    second. A run's slowdown is the traced turns' seconds (`measure`: cpu
    or wall) over the untraced ones'; with `swap`, the geometric mean of
    its two halves', which cancels a run's difference between its two
    processes (each has its own layout in memory). The table gives the
    median run, the runs' mean with a 95 % bootstrap interval over runs,
    and the runs' range."""
    import random
    rows = ["| traced copy | runs | turns | slowdown: median run | mean of runs | 95 % interval (runs) | runs' range |",
            "|---|---|---|---|---|---|---|"]
    rng = random.Random(24)
    runs = {name: [] for name in modes}
    turns = {name: 0 for name in modes}
    for i in range(MEMORY_REPEATS):
        for name, mode in modes.items():
            progress(f"{what} in turns {i + 1}/{MEMORY_REPEATS}: {name}")
            halves = turns_run(work, per_turn, i % 2 == 0, **mode)[measure]
            ratio = math.prod(sum(t) / sum(u) for t, u in halves) ** (1 / len(halves))
            runs[name].append(ratio - 1)
            turns[name] += sum(len(t) for t, _ in halves)
    for name, done in runs.items():
        done = sorted(done)
        mean = lambda xs: sum(xs) / len(xs)
        boot = sorted(mean(rng.choices(done, k=len(done))) for _ in range(2000))
        rows.append(f"| {name} | {len(done)} | {turns[name]} | {statistics.median(done) * 100:+.2f} % | {mean(done) * 100:+.2f} % | "
                    f"{boot[50] * 100:+.2f} % to {boot[1949] * 100:+.2f} % | {done[0] * 100:+.2f} % to {done[-1] * 100:+.2f} % |")
    return "\n".join(rows)


def attach_on_cpu1(argv, pattern=None):
    """A profiler's attach for turns_run: `argv + [pid]` started on CPU 1
    (the copies have CPU 0), waited for until its stderr says `pattern`,
    or for a second."""
    def attach(pid):
        prof = start(["taskset", "-c", "1", *argv(pid)])
        if pattern:
            wait_for(prof.stderr, pattern)
        else:
            time.sleep(1.0)
        return prof
    return attach


MEMORY_TURN_ROUNDS = 5


def memory_cost_turns():
    """alloc_heavy.py's work in turns: each memory profiler on one copy."""
    memray_out = os.path.join(TMP, "memray-turns.bin")
    json_out = os.path.join(TMP, "memory-turns.json")
    pytrace = lambda *args: attach_on_cpu1(lambda pid: [PYTRACE, "memory", *args, "-d", "600", "--json", json_out, "-p", str(pid)], "attached to PID")
    modes = {
        "nothing attached to either copy (the method's own noise)": {"argv_prefix": [PYENV_312]},
        "`pytrace memory -p` (default, one event per 512 KiB)": {"argv_prefix": [PYENV_312], "attach": pytrace()},
        "tracemalloc (`-X tracemalloc`, 1 frame)": {"argv_prefix": [PYENV_312, "-X", "tracemalloc"]},
        "memray 1.20 (`memray run`, its defaults)": {"argv_prefix": [MEMRAY, "run", "-f", "-q", "-o", memray_out]},
        "`pytrace memory --allocations -p`": {"argv_prefix": [PYENV_312], "attach": pytrace("--allocations")},
    }
    return turns_table("memory cost", modes, "cpu", "alloc", MEMORY_TURN_ROUNDS)


SAMPLE_TURN_ROUNDS = 350


def sample_slowdown_turns():
    """callgraph.py's work in turns: each sampler at 99 Hz on one copy, its
    slowdown in wall time (py-spy stops the copy while it reads it)."""
    json_out = os.path.join(TMP, "sample-turns.json")
    pyspy_out = os.path.join(TMP, "pyspy-turns.txt")
    modes = {
        "nothing attached to either copy (the method's own noise)": {"argv_prefix": [PYENV_312], "swap": True},
        "`pytrace sample -r 99 -p`": {"argv_prefix": [PYENV_312], "swap": True, "attach": attach_on_cpu1(
            lambda pid: [PYTRACE, "sample", "-r", "99", "-d", "600", "--json", json_out, "-p", str(pid)], "attached to PID")},
        "py-spy 0.4.3 (`record -r 99 --pid`, its default: stops the target to read it)": {"argv_prefix": [PYENV_312], "swap": True, "attach": attach_on_cpu1(
            lambda pid: [PY_SPY, "record", "-r", "99", "--pid", str(pid), "--format", "raw", "-o", pyspy_out])},
    }
    return turns_table("sample slowdown", modes, "wall", "calls", SAMPLE_TURN_ROUNDS)


MEMORY_EVENT_ROUNDS = 1000000


def memory_event_cost():
    """bench/memory/raw_churn.py (MEMORY_EVENT_ROUNDS bytearrays of 1000
    bytes made and dropped: one allocation over obmalloc's 512-byte limit
    each, the event nearly all of alloc_heavy.py's are) on pyenv's 3.12,
    every mode MEMORY_REPEATS times interleaved: the workload's CPU
    seconds, and the cost of one such allocation, (median - untraced
    median) / rounds. With PYTRACE_BENCH_BEFORE set to another build of
    pytrace (an earlier commit's), it runs beside this one, for a change's
    effect measured in one run."""
    python = PYENV_312
    script = os.path.join(HERE, "..", "bench", "memory", "raw_churn.py")
    rounds = MEMORY_EVENT_ROUNDS
    memray_out = os.path.join(TMP, "memray-churn.bin")
    modes = {
        "untraced": [python, script, rounds],
        "`pytrace memory` (its default mode)": [PYTRACE, "memory", "--json", os.path.join(TMP, "memory-churn.json"), "--", python, script, rounds],
        "memray 1.20 (`memray run`, its defaults)": [MEMRAY, "run", "-f", "-q", "-o", memray_out, script, rounds],
        "tracemalloc (`-X tracemalloc`, 1 frame)": [python, "-X", "tracemalloc", script, rounds],
    }
    before = os.environ.get("PYTRACE_BENCH_BEFORE")
    if before:
        modes[f"`pytrace memory`, built from {os.environ.get('PYTRACE_BENCH_BEFORE_NAME', before)}"] = [before, "memory", "--json", os.path.join(TMP, "memory-churn-before.json"), "--", python, script, rounds]
    return workload_cpu_table(modes, "memory event cost", "per allocation over 512 B", lambda m, base: f"{(m - base) / rounds * 1e6:+.2f} µs")


ALLOCATION_COST_ROUNDS = 300
STRIPPED_311 = "/usr/bin/python3.11"


def allocations_call_cost():
    """alloc_heavy.py (ALLOCATION_COST_ROUNDS rounds) under `pytrace memory
    --allocations` on pyenv's 3.12 (by symbol: the allocator's six entry
    points) and on Debian's stripped 3.11 (its inlined copies of the
    allocator, probed at a jump each), each beside that Python's untraced
    runs and tracemalloc, MEMORY_REPEATS interleaved runs of each: the
    workload's CPU seconds, the medians' slowdown, and for pytrace the
    median's excess over the untraced median per allocator call its report
    says it probed."""
    script = os.path.join(HERE, "..", "bench", "memory", "alloc_heavy.py")
    rounds = ALLOCATION_COST_ROUNDS
    out = os.path.join(TMP, "memory-allocation-cost.json")
    modes = []
    for build, python in [("pyenv's 3.12 (by symbol)", PYENV_312), ("Debian's 3.11 (stripped)", STRIPPED_311)]:
        modes += [(build, "untraced", [python, script, rounds], False),
                  (build, "tracemalloc (`-X tracemalloc`, 1 frame)", [python, "-X", "tracemalloc", script, rounds], False),
                  (build, "`pytrace memory --allocations`", [PYTRACE, "memory", "--allocations", "--json", out, "--", python, script, rounds], True)]
    runs = {(build, name): [] for build, name, _, _ in modes}
    for i in range(MEMORY_REPEATS):
        for build, name, argv, reports in modes:
            progress(f"allocation call cost {i + 1}/{MEMORY_REPEATS}: {build}, {name}")
            cpu, calls = workload_cpu([str(a) for a in argv]), 0
            if reports:
                with open(out) as f:
                    calls = json.load(f)["allocations"]["events"]
            runs[(build, name)].append((cpu, calls))
    rows = ["| build | mode | workload CPU s, median | range | slowdown (medians) | per allocator call probed |",
            "|---|---|---|---|---|---|"]
    for (build, name), values in runs.items():
        cpus = [cpu for cpu, _ in values]
        base, m = median([cpu for cpu, _ in runs[(build, "untraced")]]), median(cpus)
        calls = median([n for _, n in values])
        slowdown = "" if name == "untraced" else f"{(m / base - 1) * 100:+.0f} %"
        per_call = f"{(m - base) / calls * 1e6:.2f} µs ({calls:,.0f} calls)" if calls else ""
        rows.append(f"| {build} | {name} | {m:.3f} | {min(cpus):.3f}-{max(cpus):.3f} | {slowdown} | {per_call} |")
    return "\n".join(rows)


def main():
    only = os.environ.get("PYTRACE_BENCH_SECTIONS")
    uses_sid = not only or bool(SID_TABLES & set(only.split(",")))
    proc = os.path.join(SID_ROOT, "proc")
    if uses_sid:
        for root in (SID_ROOT, TRIXIE_ROOT):
            shutil.copytree(FIXTURES, os.path.join(root, INSIDE[1:]), dirs_exist_ok=True)
        # profiling.sampling runs inside the root and reads /proc/PID/maps.
        subprocess.run(["mount", "-t", "proc", "proc", proc], check=True)
    try:
        sections = [
            ("`calls`: what each traced call costs the target", calls_table,
             f"fixtures/callgraph.py, {CALL_ROUNDS} rounds, every profiler attached by PID during the target's start delay "
             "(cProfile runs in-process). \"+ns/call\" is (traced time - untraced time) / Python calls. The floor is "
             "`pytrace calls --empty-probe`: the same uprobe session with a program that returns at once, i.e. what the kernel "
             "charges for the probe alone."),
            ("`sample`: profiler CPU per sample and target slowdown", sample_cost_table,
             f"fixtures/callgraph.py, {SAMPLE_ROUNDS} rounds, attached by PID. py-spy in its default mode (it pauses the "
             "target for each sample); profiling.sampling is CPython 3.15's own sampler (`python3.15 -m profiling.sampling "
             "attach --mode cpu`). Profiler CPU includes its start-up. pytrace's BPF time is the program's run time "
             "(kernel.bpf_stats_enabled) over the samples received; it runs in the target's context."),
            ("Accuracy: the known 60/30/10 CPU split", accuracy_table,
             "fixtures/cpu_split.py for 4 CPU-seconds at 1000 Hz; the error is the largest of the three shares' distance "
             "from 60, 30 and 10 percent."),
            ("`sample`: steady-state cost per sample at 1000 Hz", steady_cost_table,
             f"fixtures/callgraph.py (CPU-bound) on Debian's 3.11 and on sid's 3.15 (there with CPython's own profiling.sampling, "
             f"`attach --mode cpu`, run inside the root), attached by PID at 1000 Hz. Each profiler runs for {STEADY_SECONDS} s "
             f"on a fresh target; its CPU, and pytrace's BPF run time (kernel.bpf_stats_enabled, from its programs' fdinfo), is read "
             f"{STEADY_FROM} s and {STEADY_TO} s after it attached, while it samples, over the samples taken in between: start-up and "
             "shut-down are left out; total is the two added. The BPF time is spent in the target's context, and includes the "
             "program's runs for other tasks the CPUs' clocks fire in. \"With its exit\" is the profiler's CPU from "
             f"{STEADY_FROM} s to its exit (resolving and writing the profile) over the samples after {STEADY_FROM} s."),
            ("Aliasing: a periodic workload's shares at every rate", aliasing_table,
             "fixtures/cpu_split.py splits every 10 ms of its CPU time 60/30/10, attached by PID on Debian's 3.11. "
             "A strictly periodic sampler locks in phase with it at rates whose period is a multiple of 10 ms (10, 50, 100 Hz) "
             "or a divisor (200, 500, 1000 Hz), and nearly so near them. Each cell: samples in the three functions, and the "
             "largest share's distance from 60/30/10 with its binomial standard error (an error within 2-3 standard errors "
             "is noise). The target is not alone on the machine: other load makes its CPU time and wall time drift apart, "
             "which hides aliasing that an idle machine shows."),
            ("Memory over long runs", memory_table,
             "pytrace's resident memory (VmRSS) during one run, early and late. The counts are aggregated in the kernel and "
             "user space keeps one entry per distinct stack, so memory follows the number of distinct stacks, not of samples."),
            ("`memory`: cost to an allocation-heavy workload", memory_cost_table,
             f"bench/memory/alloc_heavy.py ({MEMORY_ROUNDS} rounds of dict, list and str building and json round trips, "
             f"a few MiB held) on pyenv's 3.12, {MEMORY_REPEATS} interleaved runs of each mode, every profiler starting "
             "the workload. Its CPU seconds are its own (time.process_time around the work: user and system, so the "
             "uprobes' traps count); median, range, and the medians' slowdown over the untraced runs. memray runs in "
             "its defaults (malloc-level hooks, Python stacks, no --native, --trace-python-allocators off)."),
            ("`memory`: its cost to a whole workload, two copies in turns", memory_cost_turns,
             f"bench/turns.py: two copies of alloc_heavy.py's work on pyenv's 3.12, both pinned to CPU 0, "
             f"taking turns of {MEMORY_TURN_ROUNDS} rounds (about 10 ms) {TURNS} times each, a token passed "
             "between them through pipes; one copy is traced (pytrace attached by PID once both are warm, itself on "
             f"CPU 1; tracemalloc and memray from the copy's start), the first copy in odd runs and the second in even "
             f"ones, {MEMORY_REPEATS} runs of each mode, the modes taking turns run by run. The machine's drift over seconds falls on both copies alike, a "
             "turn apart, which whole runs (±25 % here) and one process's blocks (null runs off by 10 %, bench/results.md) could not "
             "cancel. The second copy maps its own copy of libpython (LD_LIBRARY_PATH): two copies of one file share its "
             "text in the CPU's caches, except the pages a uprobe's breakpoint makes private to the traced copy, which "
             "would charge pytrace for sharing a process alone never has. Slowdown: a run's traced turns' CPU seconds (user plus system) over its untraced "
             "ones'; the median run, and the runs' mean with a bootstrap interval over runs. The first row "
             "attaches nothing: "
             "the method's own noise."),
            ("`sample -r 99`: a whole workload's slowdown, two copies in turns", sample_slowdown_turns,
             f"bench/turns.py: two copies of fixtures/callgraph.py's rounds on pyenv's 3.12, both pinned to CPU 0, taking "
             f"turns of {SAMPLE_TURN_ROUNDS} rounds {TURNS} times each (the method of the `memory` table of the same name, "
             f"above); one copy has a sampler attached by PID at 99 Hz, itself on CPU 1, the first copy in odd runs and "
             f"the second in even ones, {MEMORY_REPEATS} runs of each, the modes taking turns run by run. Half way through "
             "a run, with both copies waiting, the sampler is stopped and attached to the other copy: a run's two "
             "processes can differ by up to 10 % (each has its own layout in memory), which the geometric mean of the "
             "two halves' ratios cancels. The slowdown is in wall time (the copies own CPU 0 "
             "in turns, so a turn's wall time is its CPU plus any time it was stopped, as py-spy stops it to read "
             "it), the traced turns' over the untraced ones'; the median run, and the runs' mean with a bootstrap "
             "interval over runs. pytrace's CPU clock fires on CPU 0 whichever copy "
             "runs there: its program's early exit for the other copy falls on both."),
            ("`memory`: what one big allocation costs", memory_event_cost,
             f"bench/memory/raw_churn.py ({MEMORY_EVENT_ROUNDS:,} bytearrays of 1000 bytes made and dropped, each an "
             f"allocation over obmalloc's 512-byte limit: the event nearly all of alloc_heavy.py's are) on pyenv's 3.12, "
             f"{MEMORY_REPEATS} interleaved runs of each mode, each profiler starting the workload. Its CPU seconds are its "
             "own (time.process_time around the loop); the cost per allocation is the median's excess over the untraced "
             "median, divided by the allocations. A per-event cost is resolved where a whole workload's few percent are "
             "not (the tables above): the workload's share follows from its event rate."),
            ("`memory --allocations`: what one allocator call costs, by symbol and on a stripped build", allocations_call_cost,
             f"bench/memory/alloc_heavy.py, {ALLOCATION_COST_ROUNDS} rounds, on pyenv's 3.12 (the allocator's entry points "
             "probed) and on Debian's stripped 3.11 (each inlined copy of the allocator probed at a jump, its big "
             f"allocations and its realloc calls), {MEMORY_REPEATS} interleaved runs of each mode, each profiler starting "
             "the workload. Its CPU seconds are its own (time.process_time around the loop). Per call: the median's excess "
             "over that Python's untraced median, divided by the allocator calls the report counts (those of the "
             "interpreter's start-up too, so a slight underestimate)."),
            ("Scale: many threads, many processes", scale_table,
             "Debian's 3.11 at 99 Hz. pytrace profiles every process with one BPF program (`sample --all`); py-spy needs one "
             "process per target. CPU and peak RSS are summed over the profiler processes."),
            ("Attach time", attach_table, "From starting `pytrace SUB -p PID` to its \"attached\" line."),
            ("`gc`: cost per collection", gc_table, "fixtures/gc_cycles.py, 1000000 rounds, started by pytrace."),
            ("`calls` where a build bypasses the eval function", bypassed_table,
             f"fixtures/bypassed_calls.py, {BYPASSED_COUNT} iterations, started by pytrace; CPU time of the loop (the probes "
             "run in the target's context). The close row is the close loop's added time minus that of the same loop "
             "without close()."),
            ("`gil`: cost per GIL release and switch", gil_table,
             f"fixtures/gil_switches.py, {GIL_SWITCHES} GIL releases (select() with a zero timeout), started by pytrace; "
             "wall time of the workload, per release. Each release is a drop_gil and a take_gil: four probe hits. "
             "\"switches seen\" is `pytrace gil`'s count of acquisitions after another thread held the GIL: with two "
             "threads the one that lets go mostly takes the GIL back before the other wakes, so few releases are "
             "switches, and a release costs the same either way."),
            ("uprobes: cost per hit by the instruction probed", probe_site_table,
             f"bench/probe_sites: a C loop calling a function through the PLT {PROBE_SITE_CALLS} times, untraced and "
             "with one bare tracefs uprobe (no BPF program) on one instruction of the path; CPU time of the loop per "
             "call. The kernel emulates some instructions at a probe (a call or jump to a fixed address, push) and "
             "single-steps the others out of line, which costs several times more; pytrace puts its probes where the "
             "kernel emulates (past an endbr64, at the calls of a PLT stub)."),
            ("`imports`: cost to a program running Python calls", imports_table,
             f"fixtures/callgraph.py, {CALL_ROUNDS} rounds (no imports while it runs), started by pytrace."),
            ("Fixed cost: what a run costs beyond its steady work", fixed_cost_table,
             f"Each subcommand attached by PID to fixtures/cpu_split.py on Debian's 3.11 for {FIXED_SHORT} s and for "
             f"{FIXED_LONG} s ({REPEATS} runs of each, medians): its CPU (user + system, start to exit) is a fixed part plus "
             "a steady part per second, and the fixed part is what the two durations' difference leaves at zero seconds "
             "(loading and verifying BPF programs, finding probe sites, attaching, resolving and writing the report). "
             "`dump` is all fixed."),
            ("`dump`: response time on a busy target", dump_table,
             f"fixtures/busy_deep_threads.py on Debian's 3.11: {DUMP_THREADS} threads and the main thread each "
             f"{DUMP_DEPTH} frames deep, all spinning: first alone (more spinning threads than CPUs), then beside one "
             "CPU-bound Python per CPU. `pytrace dump -p PID` and "
             f"`py-spy dump --pid PID` (its default: it pauses the target while it reads) run in turn, "
             f"{DUMP_RUNS} times each at normal priority; wall time from start to exit (p95 by nearest rank), and the "
             "tool's own CPU time (user + system)."),
        ]
        # PYTRACE_BENCH_SECTIONS=steady_cost_table,aliasing_table runs only those.
        # The memory table runs 10 minutes: only on its own (`scripts/bench.sh memory`).
        wanted = only.split(",") if only else [t.__name__ for _, t, _ in sections if t is not memory_table]
        sections = [(title, table(), how) for title, table, how in sections if table.__name__ in wanted]
    finally:
        if uses_sid:
            subprocess.run(["umount", proc])
            for root in (SID_ROOT, TRIXIE_ROOT):
                shutil.rmtree(os.path.join(root, INSIDE[1:]), ignore_errors=True)
        shutil.rmtree(TMP, ignore_errors=True)
    print("# Benchmarks: pytrace against its peers, measured side by side\n")
    kernel = os.uname().release
    print(f"`scripts/bench.sh {REPEATS}` on {time.strftime('%Y-%m-%d', time.gmtime())}, kernel {kernel}, "
          f"{os.cpu_count()} CPUs; {REPEATS} interleaved runs of everything. Workload times (and so slowdowns and "
          "per-call costs) are the fastest run's, since interference on a shared machine only adds time; CPU per "
          "sample, samples and errors are medians. Compare rows within a table, not across runs.\n")
    for title, table, how in sections:
        print(f"## {title}\n\n{how}\n\n{table}\n")


if __name__ == "__main__":
    main()
