#!/usr/bin/env bash
# Prints src/python/layouts/table.rs entries for each CPython whose headers are
# installed under the given prefixes (default: every pyenv version and
# Debian's /usr). Regenerate the table with it; never edit offsets by hand.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefixes=("$@")
if [ ${#prefixes[@]} -eq 0 ]; then
  prefixes=(/usr "$HOME"/.pyenv/versions/3.*)
fi
for prefix in "${prefixes[@]}"; do
  for inc in "$prefix"/include/python3.*; do
    [ -f "$inc/internal/pycore_interp.h" ] || continue
    out=$(mktemp)
    # Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>.
    cc -I "$inc" -I "$prefix/include" -I "$prefix/include/x86_64-linux-gnu/$(basename "$inc")" \
      "$here/layout-offsets.c" -o "$out"
    "$out"
    rm -f "$out"
  done
done
