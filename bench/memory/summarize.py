"""Turns probe-costs.sh's raw runs (python, site, rounds, repeat, cpu_s, hits)
into the table of docs/design/memory.md: per site the hits per CPU-second of
plain work, the workload's CPU time with the probe (median, min-max), the
overhead against plain runs of the same size, and the cost of one hit."""
import collections
import statistics
import sys

runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    py, site, rounds, _rep, cpu, hits = line.split("\t")
    runs[(py, site, int(rounds))].append((float(cpu), int(hits)))

print("| Python | site | hits per CPU-s | CPU s plain | CPU s probed (min-max) | overhead | µs per hit |")
print("|---|---|---:|---:|---:|---:|---:|")
for (py, site, rounds), rs in runs.items():
    if site == "baseline":
        continue
    base = [c for c, _ in runs[(py, "baseline", rounds)]]
    b = statistics.median(base)
    cpus = [c for c, _ in rs]
    c = statistics.median(cpus)
    hits = statistics.median(h for _, h in rs)
    rate = hits / b if b else 0
    over = (c / b - 1) * 100
    per_hit = (c - b) / hits * 1e6 if hits else float("nan")
    print(f"| {py} | {site} | {rate:,.0f} | {b:.3f} | {c:.3f} ({min(cpus):.3f}-{max(cpus):.3f}) "
          f"| {over:+.1f} % | {per_hit:.2f} |")
