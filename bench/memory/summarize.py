"""Turns probe-costs.sh's raw runs (python, site, rounds, repeat, cpu_s,
hits; one file or several) into the table of docs/design/memory.md: per site the hits per CPU-second of
plain work, the workload's CPU time with the probe (median, min-max), the
overhead against plain runs of the same size, and the cost of one hit."""
import collections
import statistics
import sys

runs = collections.defaultdict(list)
for path in sys.argv[1:]:  # several files: runs of separate tables (ONLY=...)
    for line in open(path):
        py, site, rounds, _rep, cpu, hits = line.split("\t")
        runs[(py, site, int(rounds))].append((float(cpu), int(hits)))

for table, title in (("", "bench/memory/alloc_heavy.py"), ("churn:", "bench/memory/pool_churn.py"),
                     ("rawchurn:", "bench/memory/raw_churn.py")):
  print(f"\n{title}\n")
  print("| Python | site | hits per CPU-s | CPU s plain | CPU s probed (min-max) | overhead | µs per hit |")
  print("|---|---|---:|---:|---:|---:|---:|")
  for (py, site, rounds), rs in runs.items():
    if not site.startswith(table) or site == table + "baseline" or (not table and ":" in site):
        continue
    base = [c for c, _ in runs[(py, table + "baseline", rounds)]]
    b = statistics.median(base)
    cpus = [c for c, _ in rs]
    c = statistics.median(cpus)
    hits = statistics.median(h for _, h in rs)
    rate = hits / b if b else 0
    over = (c / b - 1) * 100
    per_hit = (c - b) / hits * 1e6 if hits else float("nan")
    print(f"| {py} | {site.removeprefix(table)} | {rate:,.0f} | {b:.3f} | {c:.3f} ({min(cpus):.3f}-{max(cpus):.3f}) "
          f"| {over:+.1f} % | {per_hit:.2f} |")

# The compact table of docs/design/memory.md: per site and Python, the hit
# rate on alloc_heavy.py, the cost of a hit (from pool_churn.py where it
# drives the site, else from alloc_heavy.py) and the overhead that rate at
# that cost makes (rate x cost: the measured overheads of rare sites are
# inside the machine's noise). ± is the plain runs' spread over the hits.
def cell(py, site):
    rows = [k for k in runs if k[0] == py and k[1] == site]
    if not rows:
        return "", "", ""
    key = rows[0]
    rs = runs[key]
    b = statistics.median(c for c, _ in runs[(py, "baseline", key[2])])
    rate = statistics.median(h for _, h in rs) / b
    churn = [k for k in runs if k[0] == py and k[1] in ("churn:" + site, "rawchurn:" + site)]
    if churn:
        driver = churn[0][1].split(":")[0]
        rs, base = runs[churn[0]], [c for c, _ in runs[(py, driver + ":baseline", churn[0][2])]]
    else:
        base = [c for c, _ in runs[(py, "baseline", key[2])]]
    hits = statistics.median(h for _, h in rs)
    if not hits:
        return f"{rate:,.0f}", "", ""
    cost = (statistics.median(c for c, _ in rs) - statistics.median(base)) / hits * 1e6
    # what the plain runs' own spread (max - min) allows to resolve per hit
    resolution = (max(base) - min(base)) / hits * 1e6
    return f"{rate:,.0f}", f"{cost:.1f} ±{resolution:.1f}", f"{rate * cost / 1e4:.2f} %"


sites = []
for _py, site, _r in runs:
    if site != "baseline" and ":" not in site and site not in sites:
        sites.append(site)
print("\n| site | 3.12 hits/CPU-s | µs/hit | overhead | 3.14 hits/CPU-s | µs/hit | overhead |")
print("|---|---:|---:|---:|---:|---:|---:|")
for site in sites:
    print(f"| {site} | " + " | ".join(cell("3.12", site)) + " | " + " | ".join(cell("3.14", site)) + " |")
