"""The experiment behind docs/design/heap.md: read a CPython 3.9 to 3.13
target's heap from outside, through /proc/PID/mem, two ways, and time both.

1. The allocator walk: every obmalloc arena in one read (1 MiB), its pools
   parsed locally (pool_header, free-block list, nextoffset), every
   allocated block classified by its ob_type: a non-GC object at the
   block's start, or a GC object after its PyGC_Head (and, for types with a
   managed dict (3.11+) or weakref (3.12+), after the two pre-header words).
2. The GC lists: the three generations and the permanent one, one small
   read per object (its PyGC_Head and ob_type), pointer by pointer.

It checks both against the target's own measure (bench/heap/target.py:
gc.get_objects() counts by type, sys.getsizeof sums) and prints the read
rates. Offsets: pyenv's 3.9.18 to 3.13.0 and sid's 3.13.18, 3.14.10 and
3.15.2, from their headers (offsetof, by
a small C program; see the design doc). Not part of pytrace: a
measurement, run by hand:

  python3 bench/heap/read-rate.py PYTHON N M
  python3 bench/heap/read-rate.py "chroot /var/cache/pytrace/root-sid python3.14" N M

With READ_COST=BINARY (read-cost.c, built by hand with cc -O2), it also
times the reads themselves without Python's overhead, over the arenas.
"""
import bisect, json, os, struct, subprocess, sys, tempfile, time

PY, N, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
FULL = subprocess.check_output(PY.split() + ["-c", "import sys; print(sys.version.split()[0])"], text=True).strip()
VER = ".".join(FULL.split(".")[:2])
MANAGED_311, MANAGED_312 = 1 << 4, (1 << 4) | (1 << 3)  # the flags that put two words before the PyGC_Head
# offsetof(...) from each build's own headers (see the design doc). 3.9 to
# 3.11 keep obmalloc's state static in obmalloc.c (`arenas`, `maxarenas`),
# found here by the library's .symtab (pyenv keeps it).
V39 = dict(runtime_main=40, interp_gc=616, gens=24, permanent=104, obmalloc=None, arena_bits=18, pool_bits=12, managed=0)
V312 = dict(V39, runtime_main=48, interp_gc=112, obmalloc=3960, obmalloc_pointer=False, arena_bits=20, pool_bits=14, managed=MANAGED_312)
V313 = dict(V312, runtime_main=640, interp_gc=7400, obmalloc=10800, obmalloc_pointer=True)
OFF = {
    "3.9": V39,
    "3.10": dict(V39, arena_bits=20, pool_bits=14),
    "3.11": dict(V39, runtime_main=48, interp_gc=648, arena_bits=20, pool_bits=14, managed=MANAGED_311),
    "3.12": V312,
    "3.13.0": V313,
    # Debian sid's 3.13.18: PyGC_Head became Py_ALIGNED(1 << _PyObject_ALIGNMENT_SHIFT),
    # 4-byte aligned here, so the generations moved from 24 to 20 in a patch release.
    "3.13.18": dict(V313, gens=20),
    "3.14": dict(V313, runtime_main=816, interp_gc=7408, permanent=96, obmalloc=10904),
    "3.15": dict(V313, runtime_main=944, interp_gc=7400, gens=8, permanent=80, obmalloc=10880),
}
OFF = OFF.get(FULL) or OFF[VER]
GC_GENERATIONS, GEN_SIZE, GC_PERMANENT = OFF["gens"], 24, OFF["permanent"]
MGMT_ARENAS, MGMT_MAXARENAS = 512, 520
ARENA_SIZE, POOL_SIZE, POOL_OVERHEAD, ALIGNMENT = 1 << OFF["arena_bits"], 1 << OFF["pool_bits"], 48, 16
TP_NAME, TP_BASICSIZE, TP_ITEMSIZE, TP_FLAGS = 24, 32, 40, 168
HAVE_GC, MANAGED = 1 << 14, OFF["managed"]

# PY may be a command ("chroot ROOT python3.14"): the target runs as -c.
code = open(os.path.join(os.path.dirname(__file__), "target.py")).read()
target = subprocess.Popen(PY.split() + ["-c", code, str(N), str(M)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    t0 = time.monotonic()
    truth = json.loads(target.stdout.readline())
    assert target.stdout.readline().strip() == "ready"
    build_s = time.monotonic() - t0
    pid = target.pid
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    reads = [0, 0]  # calls, bytes

    def read(addr, size):
        if not 0 < addr < 1 << 47:  # a user-space address, or it is no pointer
            raise OSError(f"not an address: {addr:#x}")
        reads[0] += 1
        reads[1] += size
        data = os.pread(mem, size, addr)
        if len(data) != size:
            raise OSError(f"short read at {addr:#x}")
        return data

    def u64(addr):
        return struct.unpack("<Q", read(addr, 8))[0]

    # _PyRuntime: the dynamic symbol, plus the load bias of the file that holds it.
    maps = [l.split() for l in open(f"/proc/{pid}/maps")]
    # The file holding _PyRuntime (libpython, else the executable), read
    # through the process's own mapping, as pytrace does (a chroot's too).
    files = [l for l in maps if len(l) > 5 and l[5].startswith("/") and int(l[2], 16) == 0]
    holder = next((l for l in files if "libpython" in l[5]), None) or next(l for l in files if os.path.basename(l[5]).startswith("python" + VER))
    start, end = (int(x, 16) for x in holder[0].split("-"))
    path = f"/proc/{pid}/map_files/{start:x}-{end:x}"
    with open(path, "rb") as f:
        dynamic = struct.unpack_from("<H", f.read(18), 16)[0] == 3  # ET_DYN: symbols are relative to where it is mapped
    bias = int(holder[0].split("-")[0], 16) if dynamic else 0
    sym = subprocess.check_output(["nm", "-D", "--defined-only", path], text=True)
    runtime = int(next(l.split()[0] for l in sym.splitlines() if l.endswith(" _PyRuntime")), 16) + bias
    pytype = int(next(l.split()[0] for l in sym.splitlines() if l.endswith(" PyType_Type")), 16) + bias
    interp = u64(runtime + OFF["runtime_main"])

    types = {}  # address -> (flags, basicsize, itemsize, name) or None

    def checked_type(addr):
        """A type object: its own type is PyType_Type, or a metaclass whose
        type is (two steps), with sizes in bounds."""
        if addr in types:
            return types[addr]
        # No type object lives in an arena (a heap type is far larger than
        # the 512-byte blocks; static types are in the binary): refused
        # without a read, and not cached (most are a GC head's prev).
        if in_arena(addr):
            return None
        info = None
        if addr and addr % 8 == 0 and addr < 1 << 47:
            try:
                head = read(addr, TP_FLAGS + 8)
                meta = struct.unpack_from("<Q", head, 8)[0]
                if meta == pytype or (meta and u64(meta + 8) == pytype):
                    flags = struct.unpack_from("<Q", head, TP_FLAGS)[0]
                    basic, item = struct.unpack_from("<qq", head, TP_BASICSIZE)
                    if 0 < basic < 1 << 20 and 0 <= item < 1 << 16:
                        name_at = struct.unpack_from("<Q", head, TP_NAME)[0]
                        name = read(name_at, 128) if name_at < 1 << 47 else b"?"
                        name = name
                        info = (flags, basic, item, name.split(b"\0")[0].decode("utf-8", "replace"))
            except OSError:
                pass
        types[addr] = info
        return info

    # 1. The allocator walk.
    t1 = time.monotonic()
    if OFF["obmalloc"] is None:
        local = subprocess.run(["nm", "--defined-only", path], text=True, capture_output=True).stdout.splitlines()
        at = {l.split()[2]: int(l.split()[0], 16) + bias for l in local if len(l.split()) == 3}
        if "arenas" not in at:
            # A stripped build: the first 4-byte then 8-byte RIP-relative loads in
            # _PyObject_DebugMallocStats are maxarenas and arenas (its arena loop).
            # Only a guess until the pools it leads to give gc.get_objects()'s counts.
            func = int(next(l.split()[0] for l in sym.splitlines() if l.endswith(" _PyObject_DebugMallocStats")), 16)
            code = subprocess.check_output(["objdump", "-d", "--no-show-raw-insn", f"--start-address={func:#x}",
                                            f"--stop-address={func + 0x600:#x}", path], text=True)
            loads = [(l.split("%")[-1].split()[0] if "%" in l else "", int(l.split("#")[1].split()[0], 16))
                     for l in code.splitlines() if "(%rip)," in l and "\tmov " in l and "#" in l]
            four = next(i for i, (reg, _) in enumerate(loads) if reg.endswith("d"))
            eight = next(a for reg, a in loads[four + 1:] if reg.startswith("r") and not reg.endswith("d"))
            at = {"maxarenas": loads[four][1] + bias, "arenas": eight + bias}
            print(f"stripped: maxarenas at {at['maxarenas']:#x}, arenas at {at['arenas']:#x}, from _PyObject_DebugMallocStats's code")
        arenas, maxarenas = u64(at["arenas"]), struct.unpack("<I", read(at["maxarenas"], 4))[0]
    else:
        ob = u64(interp + OFF["obmalloc"]) if OFF["obmalloc_pointer"] else interp + OFF["obmalloc"]
        arenas, maxarenas = u64(ob + MGMT_ARENAS), struct.unpack("<I", read(ob + MGMT_MAXARENAS, 4))[0]
    table = read(arenas, maxarenas * 48)
    starts = sorted(a for a in (struct.unpack_from("<Q", table, i * 48)[0] for i in range(maxarenas)) if a)

    def in_arena(addr):
        i = bisect.bisect_right(starts, addr) - 1
        return i >= 0 and addr < starts[i] + ARENA_SIZE
    alloc = {"tracked": {}, "untracked_gc": {}, "plain": {}}
    alloc_bytes = {}
    skipped = inconsistent_pools = narenas = unlinked = 0
    deferred = []
    check_members = N + M < 200_000  # a set of every list member costs ~60 B each here
    pool_heads, members, permanent = [], set(), 0
    read_s = 0.0
    for i in range(maxarenas):
        address, pool_address = struct.unpack_from("<QQ", table, i * 48)
        if not address:
            continue
        narenas += 1
        r0 = time.monotonic()
        arena = read(address, ARENA_SIZE)
        read_s += time.monotonic() - r0
        first = (address + POOL_SIZE - 1) & ~(POOL_SIZE - 1)
        for pool in range(first, min(pool_address, address + ARENA_SIZE), POOL_SIZE):
            base = pool - address
            count, freeblock = struct.unpack_from("<IxxxxQ", arena, base)
            if count == 0:
                continue
            szidx, nextoffset, maxnext = struct.unpack_from("<III", arena, base + 36)
            size = (szidx + 1) * ALIGNMENT
            free, f, steps = set(), freeblock, 0
            while f and steps <= POOL_SIZE // size:
                if not pool <= f < pool + POOL_SIZE:
                    break
                free.add(f)
                f = struct.unpack_from("<Q", arena, f - address)[0]
                steps += 1
            blocks = [pool + o for o in range(POOL_OVERHEAD, min(nextoffset, POOL_SIZE - size + 1), size) if pool + o not in free]
            if len(blocks) != count:
                inconsistent_pools += 1
            for b in blocks:
                at = b - address
                t = checked_type(struct.unpack_from("<Q", arena, at + 8)[0])
                if t and not t[0] & HAVE_GC:
                    key, obj = "plain", b
                else:
                    key = None
                    for pre in (16, 32):  # PyGC_Head; with the managed dict/weakref words before it
                        if at + pre + 16 > len(arena):
                            continue
                        t = checked_type(struct.unpack_from("<Q", arena, at + pre + 8)[0])
                        if t and t[0] & HAVE_GC and (pre == 32) == bool(t[0] & MANAGED):
                            gc_next, gc_prev = struct.unpack_from("<QQ", arena, at + pre - 16)
                            head = b + pre - 16
                            if not gc_next:
                                key, obj = "untracked_gc", b + pre
                            elif address <= gc_next < address + ARENA_SIZE - 16:
                                # A list member: its next's prev is itself (a raw buffer
                                # holding a type pointer is not).
                                back = struct.unpack_from("<Q", arena, gc_next - address + 8)[0] & ~3
                                key, obj = ("tracked" if back == head else None), b + pre
                                if key is None:
                                    unlinked += 1
                            else:
                                # Its next is in another arena or outside pools:
                                # checked after the arenas, one read each.
                                deferred.append((head, gc_next, b, b + pre))
                                key = "deferred"
                            break
                    if key is None:
                        skipped += 1
                        continue
                    if key == "deferred":
                        continue
                tp = struct.unpack_from("<Q", arena, obj - address + 8)[0]
                if key == "tracked" and check_members:
                    pool_heads.append(obj - 16)
                alloc[key][tp] = alloc[key].get(tp, 0) + 1
                flags, basic, item, _ = types[tp]
                nbytes = basic + (abs(struct.unpack_from("<q", arena, obj - address + 16)[0]) * item if item else 0) + (obj - b)
                alloc_bytes[tp] = alloc_bytes.get(tp, 0) + nbytes
    # The links that left their arena: one read of the next head's prev each.
    for head, gc_next, b, obj in deferred:
        try:
            back = u64(gc_next + 8) & ~3
        except OSError:
            back = None
        if back == head:
            tp = u64(obj + 8)
            if check_members:
                pool_heads.append(head)
            alloc["tracked"][tp] = alloc["tracked"].get(tp, 0) + 1
            flags, basic, item, _ = types[tp]
            nbytes = basic + (abs(struct.unpack("<q", read(obj + 16, 8))[0]) * item if item else 0) + (obj - b)
            alloc_bytes[tp] = alloc_bytes.get(tp, 0) + nbytes
        else:
            unlinked += 1
    walk1_s = time.monotonic() - t1
    arena_bytes = narenas * ARENA_SIZE
    walk1_reads = list(reads)

    # 2. The GC lists, pointer by pointer.
    t2 = time.monotonic()
    listed, outside = {}, 0
    gcstate = interp + OFF["interp_gc"]
    heads = [gcstate + GC_GENERATIONS + g * GEN_SIZE for g in range(3)] + [gcstate + GC_PERMANENT]
    bound = 50_000_000
    for h, head in enumerate(heads):
        node, steps = u64(head), 0
        while node != head and steps < bound:
            gc_next, _, _, tp = struct.unpack("<QQQQ", read(node, 32))
            if check_members:
                members.add(node)
            permanent += h == 3
            if h < 3:
                listed[tp] = listed.get(tp, 0) + 1
            node, steps = gc_next & ~1, steps + 1
    walk2_s = time.monotonic() - t2
    walk2_calls = reads[0] - walk1_reads[0]

    tracked_total = sum(alloc["tracked"].values())
    truth_total = sum(truth["gc_counts"].values())
    listed_total = sum(listed.values())
    print(f"CPython {FULL}: N={N} instances, M={M} str/int/float; target built its heap in {build_s:.1f} s")
    print(f"gc.get_objects(): {truth_total} objects; GC lists walked: {listed_total}; tracked blocks in pools: {tracked_total} "
          f"(so outside pools: {listed_total + permanent - tracked_total}, the permanent generation counted)")
    print(f"allocator walk: {narenas} arenas read in {read_s:.2f} s ({arena_bytes / 2**20 / max(read_s, 1e-9):.0f} MiB/s), "
          f"{walk1_reads[0]} reads in all ({walk1_reads[1] / 2**20:.0f} MiB), {walk1_s:.1f} s with the parsing (in Python); "
          f"{skipped} blocks unclassified, {inconsistent_pools} pools whose count disagreed; "
          f"{unlinked} GC-looking blocks refused (next's prev not them), {len(deferred)} links left to another arena or outside pools")
    print(f"GC lists: {walk2_calls} reads of 32 bytes in {walk2_s:.2f} s = {walk2_calls / walk2_s / 1e3:.0f} k reads/s "
          f"({walk2_s / max(walk2_calls, 1) * 1e6:.2f} us each, Python's own overhead included)")
    print(f"permanent generation: {permanent} objects (the target's gc.get_freeze_count(): {truth['freeze_count']})")
    if check_members:
        print(f"tracked blocks in pools that are no list member: {sum(1 for h in pool_heads if h not in members)} of {len(pool_heads)}")
    for t, want in sorted(truth["gc_counts"].items(), key=lambda kv: -kv[1])[:8]:
        got = listed.get(int(t), 0)
        pool = alloc["tracked"].get(int(t), 0)
        print(f"  {truth['names'][t]:<28} get_objects {want:>9}  lists {got:>9}  pools {pool:>9}")
    for kind, own in truth["own"].items():
        got = alloc["plain"].get(own["type"], 0)
        mine = alloc_bytes.get(own["type"], 0)
        print(f"  {kind:<6} fixture's own {own['count']:>9} ({own['bytes']} B by getsizeof); pools {got:>9} objects, {mine} B by basicsize+|ob_size|*itemsize")
    for t in sorted(alloc["tracked"], key=lambda t: -alloc["tracked"][t])[:6]:
        want = truth["gc_bytes"].get(str(t))
        print(f"  bytes {types[t][3]:<22} getsizeof sum {want}  basicsize formula {alloc_bytes.get(t)} (tracked and untracked blocks)")
    print(f"  untracked GC-type blocks by type: " + ", ".join(f"{types[t][3]}={c}" for t, c in sorted(alloc['untracked_gc'].items(), key=lambda kv: -kv[1])[:5]))
    if os.environ.get("READ_COST"):
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write("".join(f"{a:x}\n" for a in starts))
            f.flush()
            print("read-cost.c:", subprocess.check_output([os.environ["READ_COST"], str(pid), f.name], text=True).strip())
    print(f"pytrace-side peak RSS of this script: {int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) // 1024} MiB")
finally:
    target.kill()
    target.wait()
