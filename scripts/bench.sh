#!/usr/bin/env bash
# What tracing costs the target, measured side by side in one run: the same
# workload (fixtures/callgraph.py) untraced, under cProfile, and under
# `pytrace calls`, on each local CPython 3.11. The machine is shared and
# absolute times drift, so the table reports per-call costs from medians of
# interleaved runs, and ratios. Writes bench/results.md too.
#
#   scripts/bench.sh [ROUNDS] [REPEATS]      (default 2000 rounds, 5 repeats)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2000}
repeats=${2:-5}
pytrace=target/release/pytrace
[ -x "$pytrace" ] || cargo build --release --locked >&2
nodtrace=$(scripts/pythons.sh nodtrace-3.11)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

seconds() { grep -o 'workload_seconds=[0-9.]*' | cut -d= -f2; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

rows=""
for spec in "debian:/usr/bin/python3.11" "no-probes:$nodtrace"; do
  label=${spec%%:*}
  python=${spec#*:}
  : > "$work/base"; : > "$work/cprofile"; : > "$work/pytrace"
  for _ in $(seq "$repeats"); do
    "$python" fixtures/callgraph.py --rounds "$rounds" --timing 2>&1 | seconds >> "$work/base"
    "$python" fixtures/callgraph.py --rounds "$rounds" --timing --cprofile "$work/cp.json" 2>&1 | seconds >> "$work/cprofile"
    "$pytrace" calls --json "$work/calls.json" -- "$python" fixtures/callgraph.py --rounds "$rounds" --timing 2>&1 >/dev/null \
      | seconds >> "$work/pytrace"
  done
  # Python calls the workload makes, as pytrace counted them (equal to
  # cProfile's count of Python functions; the integration tests prove it).
  calls=$(python3 -c "import json,sys; print(sum(f['calls'] for f in json.load(open(sys.argv[1]))['functions'] if f['file'].endswith('callgraph.py') and f['name'] not in ('<module>','Shape','Square')))" "$work/calls.json")
  base=$(median < "$work/base"); cprof=$(median < "$work/cprofile"); traced=$(median < "$work/pytrace")
  rows+=$(python3 - "$label" "$python" "$calls" "$base" "$cprof" "$traced" <<'PY'
import sys
label, python, calls, base, cprof, traced = sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(float, sys.argv[4:])
per = lambda t: (t - base) / calls * 1e9
print(f"| {label} ({python}) | {calls:,} | {base*1e9/calls:.0f} | {per(cprof):.0f} | {per(traced):.0f} | {traced/base:.1f}x | {cprof/base:.1f}x | {per(traced)/per(cprof):.1f} |")
PY
)
  rows+=$'\n'
done

# gc tracing: the GC fixture untraced and under `pytrace gc`; the cost per
# collection is small next to the collection itself.
gc_rows=""
for spec in "debian:/usr/bin/python3.11" "no-probes:$nodtrace"; do
  label=${spec%%:*}
  python=${spec#*:}
  : > "$work/gc_base"; : > "$work/gc_traced"
  for _ in $(seq "$repeats"); do
    "$python" fixtures/gc_cycles.py --rounds 1000000 --timing 2>&1 | seconds >> "$work/gc_base"
    "$pytrace" gc --json "$work/gc.json" -- "$python" fixtures/gc_cycles.py --rounds 1000000 --timing 2>&1 >/dev/null \
      | seconds >> "$work/gc_traced"
  done
  collections=$(python3 -c "import json,sys; print(sum(g['collections'] for g in json.load(open(sys.argv[1]))['generations']))" "$work/gc.json")
  mode=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['python']['mode'])" "$work/gc.json")
  base=$(median < "$work/gc_base"); traced=$(median < "$work/gc_traced")
  gc_rows+=$(python3 - "$label" "$mode" "$collections" "$base" "$traced" <<'PY'
import sys
label, mode, n, base, traced = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
print(f"| {label} | {mode} | {n:,} | {base:.3f} | {traced:.3f} | {(traced / base - 1) * 100:+.1f}% | {(traced - base) / n * 1e9:.0f} |")
PY
)
  gc_rows+=$'\n'
done

# Sampling: pytrace against py-spy (installed into a venv in the cache).
venv=${PYTRACE_CACHE:-/var/cache/pytrace}/bench-venv
[ -x "$venv/bin/py-spy" ] || { /usr/bin/python3.11 -m venv "$venv" && "$venv/bin/pip" install -q py-spy; } >&2
stats_before=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
sample_rows=$(python3 scripts/bench_sample.py "$pytrace" "$venv/bin/py-spy" /usr/bin/python3.11 "$repeats")
sysctl -qw kernel.bpf_stats_enabled="$stats_before"
sample_table="| profiler | Hz | samples | profiler CPU per sample (µs) | BPF per sample (µs) | target slowdown |
|---|---|---|---|---|---|
$sample_rows"

gc_table="| CPython 3.11 | gc mode | collections | s untraced | s under pytrace gc | slowdown | ns added per collection |
|---|---|---|---|---|---|---|
$gc_rows"

table="| CPython 3.11 | Python calls | ns/call untraced | cProfile ns/call added | pytrace ns/call added | pytrace slowdown | cProfile slowdown | pytrace / cProfile cost |
|---|---|---|---|---|---|---|---|
$rows"
{
  echo "# Benchmarks: what pytrace costs the target, against its peers"
  echo
  echo "\`scripts/bench.sh $rounds $repeats\` on $(date -u +%Y-%m-%d), kernel $(uname -r), $(nproc) CPUs."
  echo "Workload: fixtures/callgraph.py, $rounds rounds; medians of $repeats interleaved runs."
  echo "\"ns/call added\" is (traced time - untraced time) / Python calls."
  echo
  echo "$table"
  echo
  echo "## pytrace sample against py-spy (Debian's 3.11, fixtures/callgraph.py 400000 rounds, attached by PID)"
  echo
  echo "py-spy in its default mode (it pauses the target to read each sample). pytrace's BPF time is"
  echo "its program's run time over the samples received, in the target's (and other processes') context."
  echo
  echo "$sample_table"
  echo
  echo "## pytrace gc on fixtures/gc_cycles.py (1000000 rounds)"
  echo
  echo "$gc_table"
} | tee bench/results.md
