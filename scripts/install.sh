#!/usr/bin/env bash
# Sets up a Debian machine (as root) for pytrace, builds it, and runs the
# demo on fixtures/demo.py: `pytrace calls`, then `pytrace sample` writing
# target/demo-flamegraph.svg. Safe to run again.
#
#   scripts/install.sh            install, build, run the demo
#   scripts/install.sh --no-demo  install and build only
set -euo pipefail
cd "$(dirname "$0")/.."

# clang builds the BPF programs; bpftool dumps the kernel's BTF into
# vmlinux.h; libelf and zlib are linked by the vendored libbpf; python3.11 is
# Debian's CPython with USDT probes (python3.11-dev its headers, which
# scripts/layout-check.sh checks the layout table's 3.11 row against);
# util-linux gives setpriv and debootstrap the other Pythons' roots
# (scripts/pythons.sh) to the tests; GNU time measures pytrace's peak memory
# in tests/integration/safety.rs; libjemalloc2 is the preloaded malloc that
# tests/integration/memory.rs checks `memory` refuses; binutils' readelf is
# what the unwind tables' tests (src/native/table.rs) check the rows against,
# and reads unwind entries for tests/integration/native_truth.rs, where gdb
# walks the stacks `sample --native`'s are held against (gcc builds its C
# fixture).
packages=(clang llvm bpftool libelf-dev zlib1g-dev pkg-config make gcc python3.11 python3.11-dev util-linux debootstrap time libjemalloc2 binutils gdb)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

export PATH="$HOME/.cargo/bin:$PATH"
# The one Rust version the code needs is Cargo.toml's rust-version.
needed=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
if ! command -v cargo >/dev/null; then
  echo "pytrace needs Rust $needed or newer (cargo): install it with rustup, then run this again" >&2
  exit 1
fi
have=$(rustc --version | awk '{print $2}')
if ! printf '%s\n%s\n' "$needed" "$have" | sort -V -C; then
  echo "pytrace needs Rust $needed or newer, and this rustc is $have: run 'rustup update', then run this again" >&2
  exit 1
fi

cargo build --release --locked

if [ "${1:-}" != "--no-demo" ]; then
  echo "demo: exact calls, then a flamegraph of fixtures/demo.py" >&2
  target/release/pytrace calls --top 15 -- /usr/bin/python3.11 fixtures/demo.py
  target/release/pytrace sample -r 999 --top 10 --flamegraph target/demo-flamegraph.svg \
    -- /usr/bin/python3.11 fixtures/demo.py 100000
  echo "flamegraph written to target/demo-flamegraph.svg (open it in a browser)" >&2
fi
