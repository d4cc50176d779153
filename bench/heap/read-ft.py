"""The free-threaded half of the experiment behind docs/design/heap.md:
enumerate a 3.13t target's objects from outside through its mimalloc pages,
as CPython's own gc.get_objects() does inside (gc_free_threading.c visits
each thread's GC heaps with mi_heap_visit_blocks), and compare the counts.

Every thread state holds its mimalloc heaps (object, GC, GC with a
pre-header); each heap's page queues (pages[0..MI_BIN_FULL]) list its
pages; a page's blocks start at its slice (64 KiB) plus an offset set by
the block size (_mi_segment_page_start_from_slice); the blocks on its three
free lists (free, local_free, xthread_free) are free (`used` counts
those on neither of the first two: checked per page), every other block
below `capacity` holds an object, GC-tracked when ob_gc_bits has bit 0.
Offsets: 3.13.5t, offsetof() from its headers. Run by hand:

  python3 bench/heap/read-ft.py PYTHON3.13t N M
"""
import json, os, struct, subprocess, sys, tempfile, time

PY, N, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
RUNTIME_MAIN, INTERP_THREADS_HEAD, TSTATE_NEXT = 640, 7344, 8
TSTATE_MIMALLOC, HEAPS, HEAP_SIZE, HEAP_PAGES, QUEUE_SIZE, BIN_FULL = 344, 8, 3064, 1040, 24, 74
HEAP_OBJECT, HEAP_GC, HEAP_GC_PRE = 1, 2, 3
PAGE_CAPACITY, PAGE_FREE, PAGE_USED, PAGE_XBLOCK, PAGE_LOCAL_FREE, PAGE_XTHREAD_FREE, PAGE_XHEAP, PAGE_NEXT = 10, 16, 24, 28, 32, 40, 48, 56
SEGMENT_SIZE, SLICE_SIZE, SEGMENT_SLICES, SLICE_STRUCT = 1 << 25, 1 << 16, 264, 96
OB_GC_BITS, OB_TYPE, TRACKED, FROZEN = 11, 24, 1, 8

# PY may be a command ("chroot ROOT python3.14"): the target runs as -c.
code = open(os.path.join(os.path.dirname(__file__), "target.py")).read()
target = subprocess.Popen(PY.split() + ["-c", code, str(N), str(M)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    truth = json.loads(target.stdout.readline())
    assert target.stdout.readline().strip() == "ready"
    pid = target.pid
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    nreads = [0, 0]

    def read(addr, size):
        if not 0 < addr < 1 << 47:
            raise OSError(f"not an address: {addr:#x}")
        nreads[0] += 1
        nreads[1] += size
        data = os.pread(mem, size, addr)
        if len(data) != size:
            raise OSError(f"short read at {addr:#x}")
        return data

    def u64(addr):
        return struct.unpack("<Q", read(addr, 8))[0]

    exe = os.readlink(f"/proc/{pid}/exe")
    base = next(int(l.split("-")[0], 16) for l in open(f"/proc/{pid}/maps") if l.rstrip().endswith(exe) and l.split()[2] == "00000000")
    sym = subprocess.check_output(["nm", "--defined-only", exe], text=True)
    runtime = base + int(next(l.split()[0] for l in sym.splitlines() if l.endswith(" _PyRuntime")), 16)
    interp = u64(runtime + RUNTIME_MAIN)

    t0 = time.monotonic()
    counts = {"tracked": {}, "frozen": {}, "untracked_gc": {}, "plain": {}}
    pages = blocks = inconsistent = 0
    tstate, nthreads = u64(interp + INTERP_THREADS_HEAD), 0
    while tstate and nthreads < 4096:
        nthreads += 1
        for kind in (HEAP_OBJECT, HEAP_GC, HEAP_GC_PRE):
            heap = tstate + TSTATE_MIMALLOC + HEAPS + kind * HEAP_SIZE
            queues = read(heap + HEAP_PAGES, (BIN_FULL + 1) * QUEUE_SIZE)
            for b in range(BIN_FULL + 1):
                page, steps = struct.unpack_from("<Q", queues, b * QUEUE_SIZE)[0], 0
                while page and steps < 1 << 20:
                    steps += 1
                    pages += 1
                    head = read(page, PAGE_NEXT + 8)
                    capacity = struct.unpack_from("<H", head, PAGE_CAPACITY)[0]
                    used, xblock = struct.unpack_from("<II", head, PAGE_USED)
                    segment = page & ~(SEGMENT_SIZE - 1)
                    idx = (page - segment - SEGMENT_SLICES) // SLICE_STRUCT
                    offset = 3 * xblock if 8 <= xblock <= 64 else xblock if xblock <= 512 else 0
                    start = segment + idx * SLICE_SIZE + offset
                    area = read(start, capacity * xblock) if capacity else b""
                    free = set()
                    for at in (PAGE_FREE, PAGE_LOCAL_FREE, PAGE_XTHREAD_FREE):
                        f, n = struct.unpack_from("<Q", head, at)[0] & ~3, 0
                        while f and n <= capacity and start <= f < start + capacity * xblock and (f - start) % xblock == 0:
                            free.add(f)
                            f, n = struct.unpack_from("<Q", area, f - start)[0], n + 1
                        if at == PAGE_LOCAL_FREE and used != capacity - len(free):
                            # `used` counts every block on neither `free` nor
                            # `local_free` (xthread_free's, freed by other threads and
                            # not yet collected, included): a page that changed, or a
                            # bad walk.
                            inconsistent += 1
                    pre = 16 if kind == HEAP_GC_PRE else 0
                    for i in range(capacity):
                        blk = start + i * xblock
                        if blk in free:
                            continue
                        blocks += 1
                        o = i * xblock + pre
                        tp = struct.unpack_from("<Q", area, o + OB_TYPE)[0]
                        bits = area[o + OB_GC_BITS]
                        key = "plain" if kind == HEAP_OBJECT else ("frozen" if bits & FROZEN else "tracked") if bits & TRACKED else "untracked_gc"
                        counts[key][tp] = counts[key].get(tp, 0) + 1
                    page = struct.unpack_from("<Q", head, PAGE_NEXT)[0]
        tstate = u64(tstate + TSTATE_NEXT)
    walk_s = time.monotonic() - t0
    total = sum(counts["tracked"].values())
    print(f"CPython 3.13t: {nthreads} thread(s), {pages} pages, {blocks} allocated blocks, {nreads[0]} reads ({nreads[1] / 2**20:.0f} MiB) in {walk_s:.1f} s (Python); "
          f"{inconsistent} pages whose used count disagreed with their free list")
    print(f"gc.get_objects(): {sum(truth['gc_counts'].values())}; tracked blocks in the GC heaps: {total}; frozen {sum(counts['frozen'].values())}")
    for t, want in sorted(truth["gc_counts"].items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {truth['names'][t]:<28} get_objects {want:>9}  pages {counts['tracked'].get(int(t), 0):>9}")
    for kind, own in truth["own"].items():
        print(f"  {kind:<6} fixture's own {own['count']:>9}; object heap {counts['plain'].get(own['type'], 0):>9}")
finally:
    target.kill()
    target.wait()
