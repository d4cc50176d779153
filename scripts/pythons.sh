#!/usr/bin/env bash
# Provides the CPython interpreters the tests run on, and prints where they
# are. Everything it builds goes to a cache outside the repo
# ($PYTRACE_CACHE, default /var/cache/pytrace) and is reused when present.
#
#   scripts/pythons.sh nodtrace-3.11   a CPython 3.11 without USDT probes and
#                                      with a shared libpython, like pyenv's
#                                      and the official Docker images'
#   scripts/pythons.sh root-3.9        a Debian bullseye root file system
#                                      with its python3.9 (USDT probes), run
#                                      by the tests with chroot, as a
#                                      Python in a container is seen
#   scripts/pythons.sh root-sid        a Debian sid root with python3.13,
#                                      python3.14 and python3.15, the same way
#   scripts/pythons.sh root-trixie     a Debian trixie root with its python3.13
#                                      (3.13.5) and libpython3.13, plus
#                                      /usr/local/bin/python3.13-shared: the same
#                                      interpreter from the stripped shared
#                                      library (a PIE), as embedding programs
#                                      run it
#   scripts/pythons.sh pyenv-3.10      pyenv's CPython 3.10, 3.12 and 3.13
#   scripts/pythons.sh pyenv-3.12      (shared libpython, symbol tables, no
#   scripts/pythons.sh pyenv-3.13      probes), which every machine here has
#                                      (also pyenv-3.9 and pyenv-3.11)
#   scripts/pythons.sh headers         the include prefixes of every CPython
#                                      src/python/layouts/table.rs has a row
#                                      for, one a line (scripts/layout-check.sh)
#   scripts/pythons.sh freethreaded    a free-threaded CPython (3.13t,
#                                      ./configure --disable-gil) built from
#                                      Debian trixie's python3.13 source
#                                      package: no USDT probes, a symbol
#                                      table, the interpreter in the executable
#
# For nodtrace-3.11 pyenv's 3.11 is used when installed; otherwise it is
# built from Debian's own python3.11 source package (about 10 minutes on two
# cores, once).
set -euo pipefail

cache=${PYTRACE_CACHE:-/var/cache/pytrace}

nodtrace_311() {
  local found
  found=$(ls -d "${HOME:-/root}"/.pyenv/versions/3.11.*/bin/python3.11 2>/dev/null | head -n 1 || true)
  if [ -n "$found" ]; then
    echo "$found"
    return
  fi
  local prefix=$cache/python-3.11-nodtrace
  if [ -x "$prefix/bin/python3.11" ]; then
    echo "$prefix/bin/python3.11"
    return
  fi
  echo "building CPython 3.11 without probes into $prefix (once)" >&2
  if [ ! -f /etc/apt/sources.list.d/pytrace-deb-src.sources ]; then
    # The same archive as the binary packages, for source (the security
    # pool serves no source here, so the release suite is used).
    sed -n '/^Types:/,/^$/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
      | sed 's/^Types: deb$/Types: deb-src/' > /etc/apt/sources.list.d/pytrace-deb-src.sources
    apt-get update -qq
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev build-essential libffi-dev \
    libssl-dev zlib1g-dev libbz2-dev liblzma-dev libexpat1-dev >/dev/null
  local work
  work=$(mktemp -d)
  (cd "$work" && apt-get source -qq --download-only python3.11/bookworm >/dev/null 2>&1 \
    && tar xf python3.11_*.orig.tar.* && cd Python-3.11* \
    && ./configure -q --prefix="$prefix" --enable-shared LDFLAGS="-Wl,-rpath,$prefix/lib" >/dev/null \
    && make -s -j"$(nproc)" >/dev/null 2>&1 && make -s install >/dev/null 2>&1)
  rm -rf "$work"
  echo "$prefix/bin/python3.11"
}

# A minimal Debian root with the given CPythons, made once by debootstrap.
debian_root() {
  local suite=$1 root=$cache/root-$1 package missing=0
  shift
  for package in "$@"; do
    # An interpreter by its executable, a library package by its dpkg record.
    [ -x "$root/usr/bin/$package" ] || [ -e "$root/var/lib/dpkg/info/$package:amd64.list" ] || missing=1
  done
  if [ $missing = 1 ]; then
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    echo "making $root with debootstrap (once)" >&2
    rm -rf "$root"
    mkdir -p "$cache"
    debootstrap --variant=minbase --include="$(IFS=,; echo "$*")" "$suite" "$root" http://deb.debian.org/debian >&2
  fi
  echo "$root"
}

# A program that runs the interpreter from libpython3.13.so, built once in
# the trixie root: Debian's python3.13 executable has the interpreter linked
# in, and pytrace must also find it in a stripped shared library.
shared_313() {
  local root=$1 bin=$1/usr/local/bin/python3.13-shared
  [ -x "$bin" ] && return
  local work
  work=$(mktemp -d)
  printf 'int Py_BytesMain(int, char **);\nint main(int argc, char **argv) { return Py_BytesMain(argc, argv); }\n' > "$work/main.c"
  # Linked against the root's library; its own dependencies resolve in the root at run time.
  cc -O2 -o "$bin" "$work/main.c" "$root/usr/lib/x86_64-linux-gnu/libpython3.13.so.1.0" -Wl,--allow-shlib-undefined
  rm -rf "$work"
}

pyenv_version() {
  local found
  found=$(ls -d "$(pyenv root 2>/dev/null || echo "${HOME:-/root}/.pyenv")"/versions/"$1".*/bin/python"$1" 2>/dev/null | head -n 1 || true)
  if [ -z "$found" ]; then
    echo "no pyenv CPython $1 under \$(pyenv root)/versions: install it with 'pyenv install $1'" >&2
    exit 1
  fi
  echo "$found"
}

# Debian has no free-threaded package; its python3.13 source builds one.
# (python3.14's source is listed in sid's index but not served by the mirror
# CI uses, so 3.13 is the free-threaded version here.) The source comes
# through an apt configuration of its own, so the machine's apt sources stay
# as they are. Prints how long the build took: CI runs it once per machine.
freethreaded() {
  local prefix=$cache/python-3.13t
  if [ -x "$prefix/bin/python3.13t" ]; then
    echo "$prefix/bin/python3.13t"
    return
  fi
  echo "building free-threaded CPython 3.13t into $prefix (once)" >&2
  local started=$SECONDS apt_dir=$cache/apt-trixie-src work
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq dpkg-dev build-essential \
    libffi-dev libssl-dev zlib1g-dev libbz2-dev liblzma-dev libexpat1-dev >/dev/null
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    > "$apt_dir/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq >&2
  work=$(mktemp -d)
  (cd "$work" && apt-get "${apt_opts[@]}" source -qq --download-only python3.13/trixie >&2 \
    && tar xf python3.13_*.orig.tar.xz && cd Python-3.13* \
    && ./configure -q --prefix="$prefix" --disable-gil --without-ensurepip --disable-test-modules >/dev/null \
    && make -s -j"$(nproc)" >/dev/null 2>&1 && make -s install >/dev/null 2>&1)
  rm -rf "$work"
  [ -x "$prefix/bin/python3.13t" ] || { echo "the free-threaded build failed" >&2; exit 1; }
  echo "built free-threaded CPython 3.13t in $((SECONDS - started)) s" >&2
  echo "$prefix/bin/python3.13t"
}

# The C headers of each CPython the layout table has a row for, as include
# prefixes (PREFIX/include/python3.X), one a line: pyenv's 3.9, 3.10 and
# 3.12, the machine's own python3.11-dev, the free-threaded build's, and
# sid's libpython3.13/3.14/3.15-dev at the versions installed in the sid
# root (the Pythons the tests run), unpacked from their packages into the
# cache, never installed. The packages come through an apt configuration of
# its own, as freethreaded's source does.
headers() {
  local v
  for v in 3.9 3.10 3.12; do
    dirname "$(dirname "$(pyenv_version "$v")")"
  done
  [ -f /usr/include/python3.11/Python.h ] || { echo "no /usr/include/python3.11: install python3.11-dev (scripts/install.sh does)" >&2; exit 1; }
  echo /usr
  dirname "$(dirname "$(freethreaded)")"
  local root out=$cache/headers-sid
  root=$(debian_root sid python3.13 python3.14 python3.15)
  local wanted=()
  for v in 3.13 3.14 3.15; do
    local version
    version=$(sed -n "/^Package: libpython$v-stdlib$/,/^$/s/^Version: //p" "$root/var/lib/dpkg/status")
    [ -n "$version" ] || { echo "the sid root has no libpython$v-stdlib" >&2; exit 1; }
    [ "$(cat "$out/$v.version" 2>/dev/null)" = "$version" ] || wanted+=("libpython$v-dev=$version")
  done
  if [ ${#wanted[@]} -gt 0 ]; then
    local apt_dir=$cache/apt-sid work started=$SECONDS
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$out"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" > "$apt_dir/sources.list"
    # sid's Release file is past its Valid-Until on the mirror.
    local apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root
      -o Acquire::Check-Valid-Until=false)
    apt-get "${apt_opts[@]}" update -qq >&2
    work=$(mktemp -d)
    (cd "$work" && apt-get "${apt_opts[@]}" download -qq "${wanted[@]}" >&2) \
      || { rm -rf "$work"; echo "could not download ${wanted[*]} (the sid root's versions) from the mirror: remake the sid root (scripts/pythons.sh root-sid) to match the mirror" >&2; exit 1; }
    local deb
    for deb in "$work"/*.deb; do
      dpkg-deb -x "$deb" "$out"
      v=$(basename "$deb" | sed -E 's/^libpython([0-9.]+)-dev_.*/\1/')
      dpkg-deb -f "$deb" Version > "$out/$v.version"
    done
    rm -rf "$work"
    echo "unpacked ${wanted[*]} in $((SECONDS - started)) s" >&2
  fi
  echo "$out/usr"
}

case "${1:-}" in
  nodtrace-3.11) nodtrace_311 ;;
  root-3.9) debian_root bullseye python3.9 ;;
  root-sid) debian_root sid python3.13 python3.14 python3.15 ;;
  root-trixie)
    root=$(debian_root trixie python3.13 libpython3.13)
    shared_313 "$root"
    echo "$root" ;;
  pyenv-3.9) pyenv_version 3.9 ;;
  pyenv-3.10) pyenv_version 3.10 ;;
  pyenv-3.11) pyenv_version 3.11 ;;
  pyenv-3.12) pyenv_version 3.12 ;;
  pyenv-3.13) pyenv_version 3.13 ;;
  freethreaded) freethreaded ;;
  headers) headers ;;
  *) echo "usage: $0 nodtrace-3.11|root-3.9|root-sid|root-trixie|pyenv-3.9|pyenv-3.10|pyenv-3.11|pyenv-3.12|pyenv-3.13|freethreaded|headers" >&2; exit 2 ;;
esac
