#!/usr/bin/env bash
# The programs the tests read pytrace's outputs back with, as a user would:
# Go's pprof (golang-go, `go tool pprof`) and Graphviz for its -svg, for the
# --pprof files; tmux, a terminal for `pytrace top`. Debian's packages;
# safe to run again.
set -euo pipefail
packages=(golang-go graphviz tmux)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing the tests' tools: ${missing[*]}" >&2
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
fi
