#!/usr/bin/env bash
# Runs every test: unit tests and the integration tests, which load real BPF
# programs into the kernel against real CPython processes (run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

scripts/install.sh --no-demo
# What the tests read outputs back with (go tool pprof, Graphviz).
scripts/test-tools.sh
# The second CPython 3.11 the tests need: no USDT probes, shared libpython.
PYTRACE_NODTRACE_PYTHON=$(scripts/pythons.sh nodtrace-3.11)
# Debian bullseye's CPython 3.9 in a chroot, as a containerised Python.
PYTRACE_ROOT_39=$(scripts/pythons.sh root-3.9)
# Debian sid's CPython 3.13, 3.14 and 3.15, likewise.
PYTRACE_ROOT_SID=$(scripts/pythons.sh root-sid)
# Debian trixie's CPython 3.13.5, and its stripped shared libpython3.13.
PYTRACE_ROOT_TRIXIE=$(scripts/pythons.sh root-trixie)
# A free-threaded CPython 3.13t (--disable-gil, no probes), built once from
# Debian's source: the first build prints how long it took.
started=$SECONDS
PYTRACE_FREETHREADED_PYTHON=$(scripts/pythons.sh freethreaded)
echo "free-threaded CPython ready in $((SECONDS - started)) s: $PYTRACE_FREETHREADED_PYTHON" >&2
export PYTRACE_NODTRACE_PYTHON PYTRACE_ROOT_39 PYTRACE_ROOT_SID PYTRACE_ROOT_TRIXIE PYTRACE_FREETHREADED_PYTHON

cargo test --release --locked
