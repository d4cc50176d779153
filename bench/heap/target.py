"""A known heap for bench/heap/read-rate.py: N instances of its own class
(each with a dict of attributes), N/10 lists and dicts, M strings of known
length, M ints and M floats. It measures itself (gc.get_objects() counts and
sys.getsizeof sums, keyed by the type's address, which is id(type) in
CPython) after building, prints them as one JSON line, then "ready", and
waits on stdin so that an outside reader sees a quiet heap. It needs no
file, so it also runs as `python -c` inside a chroot."""
import gc, json, sys

n, m = int(sys.argv[-2]), int(sys.argv[-1])

class Leaf:
    def __init__(self, i):
        self.i = i
        self.name = "leaf"

leaves = [Leaf(i) for i in range(n)]
lists = [[i] for i in range(n // 10)]
dicts = [{"k": i} for i in range(n // 10)]
strings = ["s%015d" % i for i in range(m)]          # 16 ASCII characters each
ints = [10**12 + i for i in range(m)]               # two 30-bit digits, outside the small-int cache
floats = [i + 0.5 for i in range(m)]
gc.collect()

counts, sizes, names = {}, {}, {}
for o in gc.get_objects():
    t = id(type(o))
    counts[t] = counts.get(t, 0) + 1
    sizes[t] = sizes.get(t, 0) + sys.getsizeof(o)
    names[t] = type(o).__qualname__
own = {}
for kind, objs in (("str", strings), ("int", ints), ("float", floats)):
    own[kind] = {"type": id(type(objs[0])), "count": len(objs), "bytes": sum(map(sys.getsizeof, objs))}
print(json.dumps({"gc_counts": counts, "gc_bytes": sizes, "names": names, "own": own,
                  "freeze_count": gc.get_freeze_count() if hasattr(gc, "get_freeze_count") else 0}))
print("ready", flush=True)
sys.stdin.read()
