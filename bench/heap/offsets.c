/* The offsets bench/heap/read-rate.py and read-ft.py use, printed by the
 * compiler from a CPython's own headers (the numbers in
 * docs/design/heap.md). Built by hand, one binary per version:
 *
 *   I=~/.pyenv/versions/3.12.1/include/python3.12
 *   cc -I$I -I$I/internal -o /tmp/offsets bench/heap/offsets.c && /tmp/offsets
 *
 * Debian's headers (scripts/pythons.sh's headers-sid) also need their
 * multiarch pyconfig.h: -I to a directory holding x86_64-linux-gnu/python3.X
 * (never all of that root's usr/include, whose libc headers are not this
 * compiler's). 3.13t adds -I$I/internal/mimalloc. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"
#ifdef Py_GIL_DISABLED
#include "internal/pycore_tstate.h"
#endif

#define SHOW(name, value) printf("%s=%zu\n", name, (size_t)(value))

int main(void) {
    printf("version=%d.%d.%d\n", PY_MAJOR_VERSION, PY_MINOR_VERSION, PY_MICRO_VERSION);
    SHOW("runtime_main", offsetof(_PyRuntimeState, interpreters.main));
    SHOW("interp_gc", offsetof(PyInterpreterState, gc));
    SHOW("gc_generations", offsetof(struct _gc_runtime_state, generations));
    SHOW("gc_permanent", offsetof(struct _gc_runtime_state, permanent_generation));
    SHOW("gc_generation_size", sizeof(struct gc_generation));
    SHOW("tp_name", offsetof(PyTypeObject, tp_name));
    SHOW("tp_basicsize", offsetof(PyTypeObject, tp_basicsize));
    SHOW("tp_itemsize", offsetof(PyTypeObject, tp_itemsize));
    SHOW("tp_flags", offsetof(PyTypeObject, tp_flags));
    SHOW("tp_dict", offsetof(PyTypeObject, tp_dict));
    SHOW("ht_qualname", offsetof(PyHeapTypeObject, ht_qualname));
#if PY_VERSION_HEX >= 0x030C0000
    /* 3.12+: obmalloc's state is the interpreter's (before: static in obmalloc.c). */
    SHOW("interp_obmalloc", offsetof(PyInterpreterState, obmalloc));
    SHOW("obmalloc_arenas", offsetof(struct _obmalloc_state, mgmt.arenas));
    SHOW("obmalloc_maxarenas", offsetof(struct _obmalloc_state, mgmt.maxarenas));
    SHOW("arena_object_size", sizeof(struct arena_object));
    SHOW("pool_header_size", sizeof(struct pool_header));
    SHOW("pool_szidx", offsetof(struct pool_header, szidx));
    SHOW("pool_nextoffset", offsetof(struct pool_header, nextoffset));
#endif
#ifdef Py_GIL_DISABLED
    SHOW("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    SHOW("tstate_next", offsetof(PyThreadState, next));
    SHOW("tstate_mimalloc", offsetof(_PyThreadStateImpl, mimalloc));
    SHOW("mimalloc_heaps", offsetof(struct _mimalloc_thread_state, heaps));
    SHOW("heap_size", sizeof(mi_heap_t));
    SHOW("heap_pages", offsetof(mi_heap_t, pages));
    SHOW("page_queue_size", sizeof(mi_page_queue_t));
    SHOW("MI_BIN_FULL", MI_BIN_FULL);
    SHOW("page_capacity", offsetof(mi_page_t, capacity));
    SHOW("page_free", offsetof(mi_page_t, free));
    SHOW("page_used", offsetof(mi_page_t, used));
    SHOW("page_xblock_size", offsetof(mi_page_t, xblock_size));
    SHOW("page_local_free", offsetof(mi_page_t, local_free));
    SHOW("page_xthread_free", offsetof(mi_page_t, xthread_free));
    SHOW("page_next", offsetof(mi_page_t, next));
    SHOW("segment_slices", offsetof(mi_segment_t, slices));
    SHOW("slice_size", sizeof(mi_slice_t));
    SHOW("ob_gc_bits", offsetof(PyObject, ob_gc_bits));
#if MI_ENCODE_FREELIST
    SHOW("MI_ENCODE_FREELIST", 1);
#else
    SHOW("MI_ENCODE_FREELIST", 0);  /* undefined or 0: free lists hold plain pointers */
#endif
#endif
    return 0;
}
