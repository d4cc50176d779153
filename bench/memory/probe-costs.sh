#!/usr/bin/env bash
# Measures what each candidate site for `pytrace memory` costs (docs/design/memory.md):
# how often it fires per CPU-second of bench/memory/alloc_heavy.py and what a
# uprobe on it costs the workload. A site is counted by a perf counting event
# (a uprobe through tracefs, a syscall tracepoint or the page-faults software
# event), one site per run, so a run's extra CPU time is that site's cost:
# the uprobe's trap and perf's count, not a BPF program's work.
#
#   bench/memory/probe-costs.sh [REPEATS] [ROUNDS]    (defaults 5 and 600)
#
# A second table times one hit of the slow paths with pool_churn.py, which
# opens and empties ~100k pools a run: alloc_heavy.py hits them too rarely for
# their cost to stand out of a loaded machine's noise; raw_churn.py does the
# same for the raw allocator and libc's malloc/free (a million each a run).
#
# Runs pyenv 3.12 (symbols) and sid's 3.14 (stripped, in the chroot of
# scripts/pythons.sh; its static sites are found through the build-id debug
# file that Debian's python3.14-dbg ships, for measuring only). Sites that
# fire on every allocation run ROUNDS/60 rounds, the rest ROUNDS; each is
# compared with plain runs of the same size, interleaved with them. Prints a
# markdown table; raw runs go to $OUT (default /tmp/memory-probe-costs.tsv).
# ONLY=churn or ONLY=rawchurn runs one driver's table alone (summarize.py
# takes several $OUT files). Needs perf, gdb, binutils and sid's root
# (scripts/pythons.sh root-sid). On demand, as root; not in CI. About 40
# minutes on two loaded CPUs (the raw table's single-stepped probes take
# 16 s a run).
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats=${1:-5}
rounds=${2:-600}
small=$((rounds / 60))
out=${OUT:-/tmp/memory-probe-costs.tsv}
cache=${PYTRACE_CACHE:-/var/cache/pytrace}
group=memdesign
tracefs=/sys/kernel/tracing
work=$(mktemp -d)
cleanup() {
  perf probe -q -d "$group:*" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
: > "$out"

pyenv312=$(scripts/pythons.sh pyenv-3.12)
lib312=$(dirname "$(dirname "$pyenv312")")/lib/libpython3.12.so.1.0
sid=$(scripts/pythons.sh root-sid)
sidpy=$sid/usr/bin/python3.14
hostlibc=/lib/x86_64-linux-gnu/libc.so.6
sidlibc=$sid/lib/x86_64-linux-gnu/libc.so.6
cp bench/memory/alloc_heavy.py bench/memory/pool_churn.py bench/memory/raw_churn.py "$sid/tmp/"
churn_rounds=${CHURN_ROUNDS:-1000}
raw_rounds=${RAW_ROUNDS:-1000000}
# ONLY=churn or ONLY=rawchurn runs that driver's table alone
only=${ONLY:-}

# The stripped 3.14's static functions, from the debug file of the same
# build id (python3.14-dbg carries it); a site inlined into a bigger function
# is the first instruction addr2line puts inside it.
sid_debug() {
  local id dir=$cache/memdesign-dbg
  id=$(readelf -n "$sidpy" | awk '/Build ID/{print $3}')
  local f=$dir/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug
  if [ ! -f "$f" ]; then
    local apt=$cache/apt-sid
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
    local v
    v=$(chroot "$sid" dpkg-query -W -f '${Version}' python3.14-minimal)
    (cd "$work" && apt-get -qq "${opts[@]}" download "python3.14-dbg=$v" >&2)
    mkdir -p "$dir" && dpkg-deb -x "$work"/python3.14-dbg_*.deb "$dir"
  fi
  echo "$f"
}
# a function's address by the debug file's DWARF (some static functions
# are in no symbol table), without the 0x
sym_addr() {
  gdb -nx -batch -ex "info address $2" "$1" 2>/dev/null \
    | sed -n 's/.* is a function at address 0x\([0-9a-f]*\)\..*/\1/p'
}
# first instruction of an inlined function inside [start, start+len)
inlined_addr() { # debugfile binary func inline
  local dbg=$1 bin=$2 func=$3 inl=$4 start
  start=$(sym_addr "$dbg" "$func")
  objdump -d "$bin" --start-address=0x$start --stop-address=$(printf 0x%x $((0x$start + 2048))) \
    | awk '/^ +[0-9a-f]+:/{sub(":","",$1); print "0x"$1}' \
    | addr2line -i -f -a -e "$dbg" \
    | awk -v f="$inl" '/^0x/{a=$1; first=1; next} first{first=0; if ($1==f){print a; exit}}'
}
# a virtual address of an executable to the file offset tracefs takes
file_offset() { # binary vaddr
  local a=$(( $2 )) off vaddr size
  while read -r off vaddr size; do
    if (( a >= vaddr && a < vaddr + size )); then printf '0x%x\n' $(( a - vaddr + off )); return; fi
  done < <(readelf -lW "$1" | awk '$1=="LOAD" {print $2, $3, $5}')
}
add_uprobe() { # name binary offset
  echo "p:$group/$1 $2:$3" >> $tracefs/uprobe_events
}

dbg=$(sid_debug)
sid_call_after() { # the first `call` to TARGET (a hex address) inside FUNC of the debug file
  local start
  start=$(sym_addr "$dbg" "$1")
  objdump -d "$sidpy" --start-address=0x$start --stop-address=$(printf 0x%x $((0x$start + 1024))) \
    | awk -v t="$2" '/^ +[0-9a-f]+:/ && /call/ && $0 ~ t {sub(":","",$1); print "0x"$1; exit}'
}

first_jcc() { # the first conditional jump at or after a function's entry
  objdump -d --no-show-raw-insn "$sidpy" --start-address="$1" --stop-address=$(printf 0x%x $(($1 + 64))) \
    | awk '$2 ~ /^j/ && $2 != "jmp" {sub(":","",$1); print "0x"$1; exit}'
}

# the sites pool_churn.py drives hard enough to time one hit
churn_site() {
  case $1 in
    allocate_from_new_pool*|insert_to_freepool|_PyMem_Arena*|sys_mmap|sys_munmap) echo churn ;;
    PyMem_RawMalloc|PyMem_RawFree|libc_malloc|libc_free|obmalloc_big_malloc_callsite) echo rawchurn ;;
  esac
}

# site list: python name rounds event (events added below)
sites=$work/sites
{
  for f in allocate_from_new_pool insert_to_freepool _PyMem_ArenaAlloc _PyMem_ArenaFree \
           PyMem_RawMalloc PyMem_RawRealloc PyMem_RawFree; do
    perf probe -q -x "$lib312" -a "$group:p312_$f=$f"
    echo "3.12 $f $rounds $group:p312_$f $(churn_site "$f")"
  done
  for f in _PyObject_Malloc _PyObject_Free; do
    perf probe -q -x "$lib312" -a "$group:p312_$f=$f"
    echo "3.12 $f $small $group:p312_$f"
  done
  for f in malloc free; do
    perf probe -q -x "$hostlibc" -a "$group:p312_libc_$f=$f"
    echo "3.12 libc_$f $rounds $group:p312_libc_$f rawchurn"
  done

  newpool=0x$(sym_addr "$dbg" allocate_from_new_pool)
  s14() { # name vaddr rounds
    add_uprobe "s314_$1" "$sidpy" "$(file_offset "$sidpy" "$2")"
    echo "3.14 $1 $3 $group:s314_$1 $(churn_site "$1")"
  }
  s14 allocate_from_new_pool "$newpool" "$rounds"
  # its first conditional jump, which every call runs: the kernel emulates a
  # jump, where it single-steps the entry's endbr64
  s14 allocate_from_new_pool_first_jcc "$(first_jcc "$newpool")" "$rounds"
  # or every direct call to it (LTO inlined obmalloc's fast path into each
  # allocating function): a call rel32 is emulated too
  local_i=0
  for a in $(objdump -d --no-show-raw-insn "$sidpy" | awk -v t="${newpool#0x}" \
               '$2 ~ /^(call|jmp)$/ && $3 == t {sub(":","",$1); print "0x"$1}'); do
    local_i=$((local_i + 1))
    add_uprobe "s314_newpool_call_$local_i" "$sidpy" "$(file_offset "$sidpy" "$a")"
  done
  echo "3.14 allocate_from_new_pool_${local_i}_callsites $rounds $group:s314_newpool_call_* churn"
  s14 insert_to_freepool "$(inlined_addr "$dbg" "$sidpy" _PyObject_Free insert_to_freepool)" "$rounds"
  # obmalloc's path above 512 bytes, inlined too: every `call malloc@plt` /
  # `call free@plt` right after a guard comparing the raw allocator's pointer
  # with _PyMem_RawMalloc / _PyMem_RawFree (209 and 83 places in 3.14.10)
  guarded_calls() { # raw function, libc function
    local guard
    guard=$(sym_addr "$dbg" "$1")
    objdump -d --no-show-raw-insn "$sidpy" | G="cmp    \$0x$guard,%rax" F="<$2@plt>" awk '
      index($0, ENVIRON["G"]) {n = 8}
      n > 0 {n--; if ($2 == "call" && index($0, ENVIRON["F"])) {sub(":", "", $1); print "0x"$1; n = 0}}'
  }
  for pair in "_PyMem_RawMalloc malloc" "_PyMem_RawFree free"; do
    set -- $pair
    local_i=0
    for a in $(guarded_calls "$1" "$2"); do
      local_i=$((local_i + 1))
      add_uprobe "s314_big_$2_$local_i" "$sidpy" "$(file_offset "$sidpy" "$a")"
    done
    echo "3.14 obmalloc_big_$2_${local_i}_callsites $rounds $group:s314_big_$2_* rawchurn"
  done
  s14 _PyMem_ArenaAlloc 0x$(sym_addr "$dbg" _PyMem_ArenaAlloc) "$rounds"
  s14 _PyMem_ArenaFree 0x$(sym_addr "$dbg" _PyMem_ArenaFree) "$rounds"
  s14 PyMem_RawMalloc 0x$(sym_addr "$dbg" PyMem_RawMalloc) "$rounds"
  s14 PyMem_RawFree 0x$(sym_addr "$dbg" PyMem_RawFree) "$rounds"
  s14 obmalloc_big_malloc_callsite "$(sid_call_after _PyObject_Malloc 'malloc@plt')" "$rounds"
  s14 PyObject_Malloc 0x$(sym_addr "$dbg" PyObject_Malloc) "$small"
  s14 _PyObject_Malloc 0x$(sym_addr "$dbg" _PyObject_Malloc) "$small"
  s14 _PyObject_Free 0x$(sym_addr "$dbg" _PyObject_Free) "$small"
  for f in malloc free; do
    perf probe -q -x "$sidlibc" -a "$group:s314_libc_$f=$f"
    echo "3.14 libc_$f $rounds $group:s314_libc_$f rawchurn"
  done
  for py in 3.12 3.14; do
    for e in mmap munmap brk madvise; do echo "$py sys_$e $rounds syscalls:sys_enter_$e $(churn_site "sys_$e")"; done
    echo "$py page-faults $rounds page-faults churn"
  done
} > "$sites"
grep "" "$sites" >&2

# perf counts only while the workload works: it opens the FIFOs (in the sid
# root's /tmp too, so that the chroot sees them) to turn counting on and off.
rm -f "$sid/tmp/perf-ctl" "$sid/tmp/perf-ack"
mkfifo "$sid/tmp/perf-ctl" "$sid/tmp/perf-ack"
trap 'cleanup; rm -f "$sid/tmp/perf-ctl" "$sid/tmp/perf-ack"' EXIT
run() { # python rounds event [script] -> "cpu_s hits"
  local cmd script=${4:-alloc_heavy.py}
  if [ "$1" = 3.12 ]; then cmd=(env PERF_CTL_FIFO="$sid/tmp/perf-ctl" PERF_ACK_FIFO="$sid/tmp/perf-ack"
                               "$pyenv312" "bench/memory/$script" "$2")
  else cmd=(env PERF_CTL_FIFO=/tmp/perf-ctl PERF_ACK_FIFO=/tmp/perf-ack
            chroot "$sid" python3.14 "/tmp/$script" "$2"); fi
  perf stat -x, -o "$work/stat" --delay=-1 --control "fifo:$sid/tmp/perf-ctl,$sid/tmp/perf-ack" \
    -e "$3" -- "${cmd[@]}" > "$work/stdout"
  local cpu hits
  cpu=$(sed -n 's/^cpu_s=\([0-9.]*\).*/\1/p' "$work/stdout")
  # a site of several uprobes (every call site) is the sum of their counts
  hits=$(awk -F, 'NF>3 && $1 ~ /^[0-9]+$/ {n += $1} END {print n + 0}' "$work/stat")
  echo "$cpu ${hits:-0}"
}

for rep in $(seq "$repeats"); do
  for py in 3.12 3.14; do
    for r in $([ -z "$only" ] && echo "$rounds" "$small"); do
      echo -e "$py\tbaseline\t$r\t$rep\t$(run "$py" "$r" page-faults | tr ' ' '\t')" >> "$out"
    done
    while read -r p name r ev _; do
      [ "$p" = "$py" ] && [ -z "$only" ] || continue
      echo -e "$py\t$name\t$r\t$rep\t$(run "$py" "$r" "$ev" | tr ' ' '\t')" >> "$out"
    done < "$sites"
    # the slow paths' cost per hit, where a driver makes them many
    for driver in churn rawchurn; do
      script=pool_churn.py n=$churn_rounds
      [ $driver = rawchurn ] && script=raw_churn.py n=$raw_rounds
      [ -n "$only" ] && [ "$only" != "$driver" ] && continue
      echo -e "$py\t$driver:baseline\t$n\t$rep\t$(run "$py" "$n" page-faults $script | tr ' ' '\t')" >> "$out"
      while read -r p name _ ev flag; do
        [ "$p" = "$py" ] && [ "$flag" = "$driver" ] || continue
        echo -e "$py\t$driver:$name\t$n\t$rep\t$(run "$py" "$n" "$ev" $script | tr ' ' '\t')" >> "$out"
      done < "$sites"
    done
  done
  echo "repeat $rep done" >&2
done
python3 bench/memory/summarize.py "$out"
