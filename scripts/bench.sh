#!/usr/bin/env bash
# Every benchmark, pytrace against its peers (cProfile, py-spy, memray, tracemalloc, CPython
# 3.15's profiling.sampling, a bare uprobe), side by side in one run:
# scripts/bench.py does the measuring; this installs what it needs (py-spy
# in a venv in the cache, memray in one of pyenv's 3.12, the Pythons of scripts/pythons.sh) and turns on
# kernel.bpf_stats_enabled for the run. Writes bench/results.md. On demand,
# not in CI: about 35 minutes with 3 repeats on two CPUs.
#
#   scripts/bench.sh [REPEATS]      (default 3) every table but memory's
#   scripts/bench.sh memory         the memory table alone: pytrace's RSS over
#                                   a long `sample --all` (10 minutes, or
#                                   PYTRACE_BENCH_MEMORY_SECONDS) and --idle
#                                   run; prints it, bench/results.md untouched
#
# PYTRACE_BENCH_SECTIONS=aliasing_table,steady_cost_table (bench.py's
# function names) runs only those and prints them, leaving
# bench/results.md alone. PYTRACE_BENCH_BEFORE=path/to/an/older/pytrace
# (and PYTRACE_BENCH_BEFORE_NAME=its commit) adds it beside this build in
# memory_event_cost: a change's effect, measured in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
if [ "$repeats" = memory ]; then
  export PYTRACE_BENCH_SECTIONS=memory_table
  repeats=1
fi
pytrace=target/release/pytrace
[ -x "$pytrace" ] || cargo build --release --locked >&2
nodtrace=$(scripts/pythons.sh nodtrace-3.11)
work=$(mktemp -d)
venv=${PYTRACE_CACHE:-/var/cache/pytrace}/bench-venv
[ -x "$venv/bin/py-spy" ] || { /usr/bin/python3.11 -m venv "$venv" && "$venv/bin/pip" install -q py-spy; } >&2
sid=$(scripts/pythons.sh root-sid)
# trixie's 3.13.5, and its stripped shared libpython: the calls table's
# builds beside sid's 3.13.18, whose eval function starts otherwise.
PYTRACE_BENCH_TRIXIE=$(scripts/pythons.sh root-trixie)
export PYTRACE_BENCH_TRIXIE
PYTRACE_BENCH_PYENV_312=$(scripts/pythons.sh pyenv-3.12)
export PYTRACE_BENCH_PYENV_312
# memray for the memory cost table, in a venv of pyenv's 3.12: memray runs
# the workload with the interpreter it is installed in.
venv312=${PYTRACE_CACHE:-/var/cache/pytrace}/bench-venv-312
[ -x "$venv312/bin/memray" ] || { "$PYTRACE_BENCH_PYENV_312" -m venv "$venv312" && "$venv312/bin/pip" install -q memray==1.20.0; } >&2
export PYTRACE_BENCH_MEMRAY=$venv312/bin/memray
stats_before=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled="$stats_before"; rm -rf "$work"' EXIT
python3 scripts/bench.py "$pytrace" "$venv/bin/py-spy" "$nodtrace" "$sid" "$repeats" > "$work/results.md"
if [ -z "${PYTRACE_BENCH_SECTIONS:-}" ]; then
  cp "$work/results.md" bench/results.md
fi
cat "$work/results.md"
