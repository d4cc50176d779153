#!/usr/bin/env bash
# Runs every test: unit tests and the integration tests (one binary, built
# from tests/integration/), which load real BPF programs into the kernel
# against real CPython processes (run as root), then
# the kernel smoke matrix, the same programs in VMs of older kernels. Each
# stage prints how long it took ("stage NAME: N s"): CI has 90 minutes in all.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

# Runs a command as stage NAME, and says how long it took, failed or not.
stage() {
  local name=$1 started=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "stage $name: $((SECONDS - started)) s$([ $status = 0 ] || echo " (failed, status $status)")" >&2
  return $status
}

stage install scripts/install.sh --no-demo
# What the tests read outputs back with: go tool pprof, Graphviz, tmux,
# headless Chromium with the speedscope app, snakeviz and gprof2dot.
stage test-tools scripts/test-tools.sh
# The second CPython 3.11 the tests need: no USDT probes, shared libpython.
PYTRACE_NODTRACE_PYTHON=$(stage nodtrace-3.11 scripts/pythons.sh nodtrace-3.11)
# Debian bullseye's CPython 3.9 in a chroot, as a containerised Python.
PYTRACE_ROOT_39=$(stage root-3.9 scripts/pythons.sh root-3.9)
# Debian sid's CPython 3.13, 3.14 and 3.15, likewise.
PYTRACE_ROOT_SID=$(stage root-sid scripts/pythons.sh root-sid)
# Debian trixie's CPython 3.13.5, and its stripped shared libpython3.13.
PYTRACE_ROOT_TRIXIE=$(stage root-trixie scripts/pythons.sh root-trixie)
# A free-threaded CPython 3.13t (--disable-gil, no probes), built once from
# Debian's source (the first build takes the longest).
PYTRACE_FREETHREADED_PYTHON=$(stage freethreaded scripts/pythons.sh freethreaded)
export PYTRACE_NODTRACE_PYTHON PYTRACE_ROOT_39 PYTRACE_ROOT_SID PYTRACE_ROOT_TRIXIE PYTRACE_FREETHREADED_PYTHON

# Each test stage runs whatever the others give, so one run shows every
# failure; the script fails if any did.
failed=()
# The documentation's relative links, anchors and command examples: no
# build, no download, so it runs first.
stage docs-check scripts/docs-check.sh || failed+=(docs-check)
# Every row of the layout table regenerated from its CPython's own headers
# (fetched and cached once) and compared: the table says what they say.
stage layout-check scripts/layout-check.sh || failed+=(layout-check)
# Its output is kept: a failing test's message is printed again at the
# end, where a reader of the log's tail (past the kernels stage) sees it.
cargo_test() {
  mkdir -p target
  cargo test --release --locked --no-fail-fast 2>&1 | tee target/cargo-test.log
}
stage cargo-test cargo_test || failed+=(cargo-test)
# Debian's 5.10, 6.1 and 6.12 kernels (fetched and cached once), each
# running the smoke tests in a VM; it prints the time per kernel.
stage kernels scripts/kernels.sh test || failed+=(kernels)
if [[ " ${failed[*]} " == *" cargo-test "* ]]; then
  # Each failed test's captured output (40 lines at most), from the
  # "---- NAME stdout ----" sections cargo prints after a binary's run.
  echo "cargo-test's failures, again:" >&2
  awk '/^---- .* ----$/ { p = 1; n = 0 } /^failures:$/ { p = 0 } p && n++ < 40' target/cargo-test.log >&2
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "scripts/test.sh: failed: ${failed[*]}" >&2
  exit 1
fi
