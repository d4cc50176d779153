#!/usr/bin/env bash
# Runs one integration-test module's filtered tests RUNS times in a row
# beside one CPU-bound neighbour per CPU, and fails on the first failure:
# how a claim that tests hold "on a loaded machine" is checked (issue #22
# asked it of gil's thread-name tests). On demand, not in CI: it is the load
# that CI must not carry. MODULE is a module of tests/integration (gil);
# a FILTER keeps that module's tests whose path (as `--list` prints it,
# pyenv_3_12::attached_by_pid_...) contains it; no FILTER, all of them.
#
#   scripts/under-load.sh RUNS MODULE [FILTER...]
#   scripts/under-load.sh 20 gil attached_by_pid nodtrace_3_11::threads_own_measures
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 RUNS MODULE [FILTER...]" >&2; exit 2; }
runs=$1 module=$2
shift 2
cd "$(dirname "$0")/.."
cargo test -q --release --locked --test integration --no-run
# The module's tests that a filter picks, by exact path: libtest's own
# filters are substrings of the whole path, which cannot say "in this
# module and containing this".
tests=()
while read -r name; do
  if [ $# = 0 ]; then tests+=("$name"); continue; fi
  for filter in "$@"; do
    case "$name" in *"$filter"*) tests+=("$name"); break ;; esac
  done
done < <(cargo test -q --release --locked --test integration -- --list 2>/dev/null | sed -n "s/^\($module::.*\): test\$/\1/p")
[ ${#tests[@]} -gt 0 ] || { echo "scripts/under-load.sh: no test of module $module matches ${*:-anything}" >&2; exit 2; }
echo "${#tests[@]} tests: ${tests[*]}"
neighbours=()
for _ in $(seq "$(nproc)"); do
  python3 -c 'while True: pass' &
  neighbours+=($!)
done
trap 'kill "${neighbours[@]}" 2>/dev/null' EXIT
log=$(mktemp /tmp/pytrace-under-load-XXXXXX)
for i in $(seq "$runs"); do
  start=$(date +%s)
  if ! cargo test -q --release --locked --test integration -- --exact "${tests[@]}" > "$log" 2>&1; then
    cat "$log"
    echo "scripts/under-load.sh: run $i of $runs failed (load $(cut -d' ' -f1 /proc/loadavg)); its output is above" >&2
    exit 1
  fi
  echo "run $i of $runs passed in $(( $(date +%s) - start )) s (load $(cut -d' ' -f1 /proc/loadavg))"
done
rm -f "$log"
echo "$runs runs in a row passed beside $(nproc) CPU-bound neighbours"
