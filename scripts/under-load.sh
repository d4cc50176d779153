#!/usr/bin/env bash
# Runs one integration-test file's filtered tests RUNS times in a row beside
# one CPU-bound neighbour per CPU, and fails on the first failure: how a
# claim that tests hold "on a loaded machine" is checked (issue #22 asked it
# of gil's thread-name tests). On demand, not in CI: it is the load that CI
# must not carry.
#
#   scripts/under-load.sh RUNS FILE [FILTER...]
#   scripts/under-load.sh 20 gil attached_by_pid threads_own_measures_3_11
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 RUNS FILE [FILTER...]" >&2; exit 2; }
runs=$1 file=$2
shift 2
cd "$(dirname "$0")/.."
cargo test -q --release --locked --test "$file" --no-run
neighbours=()
for _ in $(seq "$(nproc)"); do
  python3 -c 'while True: pass' &
  neighbours+=($!)
done
trap 'kill "${neighbours[@]}" 2>/dev/null' EXIT
log=$(mktemp /tmp/pytrace-under-load-XXXXXX)
for i in $(seq "$runs"); do
  start=$(date +%s)
  if ! cargo test -q --release --locked --test "$file" -- "$@" > "$log" 2>&1; then
    cat "$log"
    echo "scripts/under-load.sh: run $i of $runs failed (load $(cut -d' ' -f1 /proc/loadavg)); its output is above" >&2
    exit 1
  fi
  echo "run $i of $runs passed in $(( $(date +%s) - start )) s (load $(cut -d' ' -f1 /proc/loadavg))"
done
rm -f "$log"
echo "$runs runs in a row passed beside $(nproc) CPU-bound neighbours"
