/* Prints the CPython struct offsets pytrace needs, for the Python whose
 * headers it is compiled against. scripts/layout-offsets.sh runs it for each
 * installed CPython and its output is pasted into src/python/layouts/table.rs,
 * so every number there comes from the real headers, never from a hand
 * count; scripts/layout-check.sh checks that the table still says so.
 *
 * Build: cc -DPy_BUILD_CORE -I$PREFIX/include/python3.X layout-offsets.c
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#else
#include <frameobject.h>
#endif
#include <internal/pycore_interp.h>
#include <opcode.h>
#include <internal/pycore_runtime.h>
#if __has_include(<internal/pycore_gil.h>)
#include <internal/pycore_gil.h>
#endif
#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_dict.h>
#include <internal/pycore_moduleobject.h>
#include <internal/pycore_object.h>
#else
#include <longintrepr.h>
/* 3.9 and 3.10 declare a dict's keys object in Objects/dict-common.h,
 * which is not installed: its head and entries as that file declares
 * them (thread_names.rs checks every value it reads from them). */
struct _dictkeysobject {
    Py_ssize_t dk_refcnt;
    Py_ssize_t dk_size;
    void *dk_lookup;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
};
typedef struct {
    Py_hash_t me_hash;
    PyObject *me_key;
    PyObject *me_value;
} PyDictKeyEntry;
#endif
#if PY_VERSION_HEX >= 0x030E0000
#include <internal/pycore_interpframe_structs.h>
#include <internal/pycore_stackref.h>
#include <internal/pycore_tstate.h>
#endif

#define FIELD(name, value) printf("    %s: %zu,\n", name, (size_t)(value))

int main(void)
{
    printf("// CPython %s, from its headers by scripts/layout-offsets.sh\n", PY_VERSION);
    printf("Layout {\n");
    printf("    version: (%d, %d),\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    /* What the version's code objects and frames say in their own units:
     * the line table's format and the bytes in one unit of f_lasti. */
#if PY_VERSION_HEX >= 0x030B0000
    printf("    line_format: LineFormat::Locations,\n");
    printf("    lasti_unit: 2,\n");
#elif PY_VERSION_HEX >= 0x030A0000
    printf("    line_format: LineFormat::Linetable310,\n");
    printf("    lasti_unit: 2,\n");
#else
    printf("    line_format: LineFormat::Lnotab,\n");
    printf("    lasti_unit: 1,\n");
#endif
    FIELD("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    FIELD("interp_next", offsetof(PyInterpreterState, next));
    FIELD("interp_eval_frame", offsetof(PyInterpreterState, eval_frame));
#if PY_VERSION_HEX >= 0x030B0000
    FIELD("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#else
    FIELD("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#endif
    FIELD("tstate_next", offsetof(PyThreadState, next));
    FIELD("tstate_interp", offsetof(PyThreadState, interp));
    FIELD("tstate_thread_id", offsetof(PyThreadState, thread_id));
    /* The frame running on a thread: tstate->cframe->current_frame in 3.11
     * and 3.12, tstate->current_frame from 3.13, tstate->frame before. */
#if PY_VERSION_HEX >= 0x030D0000
    FIELD("tstate_current", offsetof(PyThreadState, current_frame));
    printf("    cframe_current_frame: NO_FIELD,\n");
#elif PY_VERSION_HEX >= 0x030B0000
    FIELD("tstate_current", offsetof(PyThreadState, cframe));
    FIELD("cframe_current_frame", offsetof(_PyCFrame, current_frame));
#else
    FIELD("tstate_current", offsetof(PyThreadState, frame));
    printf("    cframe_current_frame: NO_FIELD,\n");
#endif
    /* The instruction a frame is at: an address inside the code object's
     * bytecode from 3.11 (code_code is where that starts), an index in
     * bytes (f_lasti, in code units from 3.10) before. */
#if PY_VERSION_HEX >= 0x030D0000
    FIELD("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
    FIELD("code_code", offsetof(PyCodeObject, co_code_adaptive));
#elif PY_VERSION_HEX >= 0x030B0000
    FIELD("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
    FIELD("code_code", offsetof(PyCodeObject, co_code_adaptive));
#else
    FIELD("frame_instr", offsetof(PyFrameObject, f_lasti));
    printf("    code_code: NO_FIELD,\n");
#endif
#if PY_VERSION_HEX >= 0x030A0000
    FIELD("code_linetable", offsetof(PyCodeObject, co_linetable));
#else
    FIELD("code_linetable", offsetof(PyCodeObject, co_lnotab));
#endif
    FIELD("bytes_size", offsetof(PyVarObject, ob_size));
    FIELD("bytes_data", offsetof(PyBytesObject, ob_sval));
#if PY_VERSION_HEX >= 0x030B0000
    FIELD("frame_owner", offsetof(_PyInterpreterFrame, owner));
    /* Which owners mean what: the calling thread's own frame, and the first
     * owner of the frames that run no Python code (every owner from there
     * on is one, every owner before it runs code). */
    FIELD("frame_owned_by_thread", FRAME_OWNED_BY_THREAD);
#if PY_VERSION_HEX >= 0x030E0000
    /* 3.14's shims (FRAME_OWNED_BY_CSTACK) come after it; 3.15 has none. */
    _Static_assert(FRAME_OWNED_BY_FRAME_OBJECT < FRAME_OWNED_BY_INTERPRETER && FRAME_OWNED_BY_GENERATOR < FRAME_OWNED_BY_INTERPRETER,
                   "the interpreter's own frames' owner comes last");
#if PY_VERSION_HEX < 0x030F0000
    _Static_assert(FRAME_OWNED_BY_CSTACK > FRAME_OWNED_BY_INTERPRETER, "the C stack's shims come after the interpreter's frames");
#endif
    FIELD("frame_owned_not_code", FRAME_OWNED_BY_INTERPRETER);
#elif PY_VERSION_HEX >= 0x030C0000
    _Static_assert(FRAME_OWNED_BY_FRAME_OBJECT < FRAME_OWNED_BY_CSTACK && FRAME_OWNED_BY_GENERATOR < FRAME_OWNED_BY_CSTACK,
                   "the C stack's shim frames' owner comes last");
    FIELD("frame_owned_not_code", FRAME_OWNED_BY_CSTACK);
#else
    _Static_assert(FRAME_OWNED_BY_GENERATOR < FRAME_OWNED_BY_FRAME_OBJECT, "the frame object's owner comes last");
    FIELD("frame_owned_not_code", FRAME_OWNED_BY_FRAME_OBJECT + 1);
#endif
#else
    /* Before 3.11 a generator's creation never enters the eval loop. */
    printf("    frame_owner: NO_FIELD,\n");
    printf("    frame_owned_by_thread: NO_FIELD,\n");
    printf("    frame_owned_not_code: NO_FIELD,\n");
#endif
    /* A frame's code reference: a tagged _PyStackRef from 3.14, whose low
     * Py_TAG_BITS are flags; a plain pointer before. */
#if PY_VERSION_HEX >= 0x030E0000
    FIELD("code_tag_bits", Py_TAG_BITS);
#else
    FIELD("code_tag_bits", 0);
#endif
    /* Which frames began a C-level _PyEval_EvalFrameDefault call (for
     * `sample --native`): 3.11 flags them with is_entry. Before 3.11 every
     * frame has its own call; from 3.12 a shim frame owned by the C stack
     * (a non-code owner) sits just outside each call's first frame. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
    FIELD("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#else
    printf("    frame_is_entry: NO_FIELD,\n");
#endif
    /* A heap type's cached __init__ (the CALL_ALLOC_AND_ENTER_INIT
     * specialization's, 3.13+) and a function's code object: calls counts
     * 3.13's inlined __init__ calls through them. */
#if PY_VERSION_HEX >= 0x030D0000
    FIELD("heaptype_spec_init", offsetof(PyHeapTypeObject, _spec_cache.init));
#else
    printf("    heaptype_spec_init: NO_FIELD,\n");
#endif
    FIELD("function_code", offsetof(PyFunctionObject, func_code));
    /* The opcode whose handler pytrace finds in a stripped 3.13 (see
     * Python::inlined_init_probe). */
#if PY_VERSION_HEX >= 0x030D0000
    FIELD("opcode_alloc_and_enter_init", CALL_ALLOC_AND_ENTER_INIT);
#else
    printf("    opcode_alloc_and_enter_init: NO_FIELD,\n");
#endif
    /* 3.11 before 3.11.4 runs __getitem__ inline at BINARY_SUBSCR_GETITEM
     * even with the eval-frame hook set (gh-104405): pytrace finds that
     * handler by its opcode, and checks it loads the cached __getitem__. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
    FIELD("opcode_binary_subscr_getitem", BINARY_SUBSCR_GETITEM);
    FIELD("heaptype_spec_getitem", offsetof(PyHeapTypeObject, _spec_cache.getitem));
#else
    printf("    opcode_binary_subscr_getitem: NO_FIELD,\n");
    printf("    heaptype_spec_getitem: NO_FIELD,\n");
#endif
    /* A generator's state and frame: where close()'s fast path (3.13+)
     * skips running the frame. */
#if PY_VERSION_HEX >= 0x030D0000
    FIELD("gen_frame_state", offsetof(PyGenObject, gi_frame_state));
    FIELD("gen_iframe", offsetof(PyGenObject, gi_iframe));
#else
    printf("    gen_frame_state: NO_FIELD,\n");
    printf("    gen_iframe: NO_FIELD,\n");
#endif
#if PY_VERSION_HEX >= 0x030D0000
    FIELD("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    FIELD("frame_previous", offsetof(_PyInterpreterFrame, previous));
    FIELD("frame_globals", offsetof(_PyInterpreterFrame, f_globals));
#elif PY_VERSION_HEX >= 0x030B0000
    FIELD("frame_code", offsetof(_PyInterpreterFrame, f_code));
    FIELD("frame_previous", offsetof(_PyInterpreterFrame, previous));
    FIELD("frame_globals", offsetof(_PyInterpreterFrame, f_globals));
#else
    FIELD("frame_code", offsetof(PyFrameObject, f_code));
    FIELD("frame_previous", offsetof(PyFrameObject, f_back));
    FIELD("frame_globals", offsetof(PyFrameObject, f_globals));
#endif
    FIELD("object_type", offsetof(PyObject, ob_type));
    FIELD("code_flags", offsetof(PyCodeObject, co_flags));
    FIELD("code_filename", offsetof(PyCodeObject, co_filename));
    FIELD("code_name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX >= 0x030B0000
    FIELD("code_qualname", offsetof(PyCodeObject, co_qualname));
#else
    FIELD("code_qualname", offsetof(PyCodeObject, co_name));
#endif
    FIELD("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    FIELD("unicode_length", offsetof(PyASCIIObject, length));
    FIELD("unicode_hash", offsetof(PyASCIIObject, hash));
    FIELD("unicode_state", offsetof(PyASCIIObject, state));
    FIELD("unicode_ascii_data", sizeof(PyASCIIObject));
    FIELD("unicode_compact_data", sizeof(PyCompactUnicodeObject));
    /* Where a str's kind:3, compact:1, ascii:1 bit-fields start in its
     * state word: after interned:2, or after a whole byte where interned is
     * an unsigned char (free-threaded builds). Found by setting the field,
     * since offsetof cannot name a bit-field. */
    {
        PyASCIIObject probe;
        uint32_t word;
        memset(&probe, 0, sizeof(probe));
        probe.state.kind = 1;
        memcpy(&word, (char *)&probe + offsetof(PyASCIIObject, state), sizeof(word));
        FIELD("unicode_kind_shift", __builtin_ctz(word));
    }
#ifdef Py_GIL_DISABLED
    printf("    free_threaded: true,\n");
#else
    printf("    free_threaded: false,\n");
#endif
    /* The GIL `sample --gil` reads from outside (tracing/sample/discovery.rs):
     * one in the runtime to 3.11, a pointer to it in each interpreter from
     * 3.12; in it, the thread state that took it last and whether it is
     * held. */
#if PY_VERSION_HEX >= 0x030C0000
    printf("    gil_in_runtime: NO_FIELD,\n");
    FIELD("gil_pointer_in_interp", offsetof(PyInterpreterState, ceval.gil));
#else
    FIELD("gil_in_runtime", offsetof(_PyRuntimeState, ceval.gil));
    printf("    gil_pointer_in_interp: NO_FIELD,\n");
#endif
    FIELD("gil_last_holder", offsetof(struct _gil_runtime_state, last_holder));
    FIELD("gil_locked", offsetof(struct _gil_runtime_state, locked));
    /* `gil` on a stripped build (python/probes/gil_sites.rs): drop_gil signals
     * `cond` as it lets go; a forced switch waits on `switch_cond`. */
    FIELD("gil_cond", offsetof(struct _gil_runtime_state, cond));
    FIELD("gil_switch_cond", offsetof(struct _gil_runtime_state, switch_cond));
    FIELD("gil_size", sizeof(struct _gil_runtime_state));
    /* `sample --async` (3.14+): the asyncio task a thread is running, in
     * the thread state's private part (_asyncio sets it around each step of
     * a task). The task object's own layout is in _asyncio's debug section,
     * read from the target's file (python/reading/asyncio_tasks.rs). */
#if PY_VERSION_HEX >= 0x030E0000
    FIELD("tstate_asyncio_running_task", offsetof(_PyThreadStateImpl, asyncio_running_task));
#else
    printf("    tstate_asyncio_running_task: NO_FIELD,\n");
#endif
    /* A frame's local variables (its arguments first): `pytrace imports`
     * without USDT probes reads the module name, importlib's
     * _find_and_load's first argument, there. */
#if PY_VERSION_HEX >= 0x030B0000
    FIELD("frame_localsplus", offsetof(_PyInterpreterFrame, localsplus));
#else
    FIELD("frame_localsplus", offsetof(PyFrameObject, f_localsplus));
#endif
    /* The main interpreter, and its collector's state: `pytrace gc`
     * without USDT probes watches `collecting` (set for the length of each
     * collection) and reads each generation's running totals before and
     * after. */
    FIELD("runtime_interpreters_main", offsetof(_PyRuntimeState, interpreters.main));
    FIELD("interp_gc", offsetof(PyInterpreterState, gc));
    FIELD("gc_collecting", offsetof(struct _gc_runtime_state, collecting));
    FIELD("gc_stats", offsetof(struct _gc_runtime_state, generation_stats));
#if PY_VERSION_HEX >= 0x030F0000
    /* 3.15: a pointer to a struct gc_stats holding, per generation, a ring
     * of totals whose newest entry is at `index`. */
    printf("    gc_stats_indirect: true,\n");
    printf("    gc_generation_items: [%zu, %zu, %zu],\n", offsetof(struct gc_stats, young.items),
           offsetof(struct gc_stats, old[0].items), offsetof(struct gc_stats, old[1].items));
    printf("    gc_generation_ring: [%d, %d, %d],\n", GC_YOUNG_STATS_SIZE, GC_OLD_STATS_SIZE, GC_OLD_STATS_SIZE);
    printf("    gc_generation_index: [%zu, %zu, %zu],\n", offsetof(struct gc_stats, young.index),
           offsetof(struct gc_stats, old[0].index), offsetof(struct gc_stats, old[1].index));
#else
    /* Before: an array of totals, one per generation, in the state itself. */
    printf("    gc_stats_indirect: false,\n");
    printf("    gc_generation_items: [0, %zu, %zu],\n", sizeof(struct gc_generation_stats),
           2 * sizeof(struct gc_generation_stats));
    printf("    gc_generation_ring: [1, 1, 1],\n");
    printf("    gc_generation_index: [NO_FIELD, NO_FIELD, NO_FIELD],\n");
#endif
    FIELD("gc_item_size", sizeof(struct gc_generation_stats));
    FIELD("gc_item_collections", offsetof(struct gc_generation_stats, collections));
    FIELD("gc_item_collected", offsetof(struct gc_generation_stats, collected));
    FIELD("gc_item_uncollectable", offsetof(struct gc_generation_stats, uncollectable));
    /* What `threading.Thread.name` takes to read (src/python/reading/thread_names.rs):
     * the interpreter's modules dict, a module's dict, dicts' keys and
     * values, a one-digit int, and where an instance keeps its attributes. */
#define OBJ(name, value) printf("        %s: %zu,\n", name, (size_t)(value))
#define OBJ_NONE(name) printf("        %s: NO_FIELD,\n", name)
    printf("    objects: ObjectLayout {\n");
#if PY_VERSION_HEX >= 0x030C0000
    OBJ("interp_modules", offsetof(PyInterpreterState, imports.modules));
#else
    OBJ("interp_modules", offsetof(PyInterpreterState, modules));
#endif
#if PY_VERSION_HEX >= 0x030B0000
    OBJ("module_dict", offsetof(PyModuleObject, md_dict));
#else
    /* PyModuleObject is private to Objects/moduleobject.c: md_dict follows the object header. */
    OBJ("module_dict", sizeof(PyObject));
#endif
    OBJ("type_flags", offsetof(PyTypeObject, tp_flags));
    OBJ("type_basicsize", offsetof(PyTypeObject, tp_basicsize));
    OBJ("type_dictoffset", offsetof(PyTypeObject, tp_dictoffset));
    OBJ("heaptype_cached_keys", offsetof(PyHeapTypeObject, ht_cached_keys));
    /* A positive int below 2**PyLong_SHIFT: its size word (ob_size, or from
     * 3.12 lv_tag, which holds the digit count above the sign bits) and its
     * one digit. */
#if PY_VERSION_HEX >= 0x030C0000
    OBJ("long_size", offsetof(PyLongObject, long_value.lv_tag));
    OBJ("long_digits", offsetof(PyLongObject, long_value.ob_digit));
    OBJ("long_one_digit", 1 << _PyLong_NON_SIZE_BITS);
#else
    OBJ("long_size", offsetof(PyVarObject, ob_size));
    OBJ("long_digits", offsetof(PyLongObject, ob_digit));
    OBJ("long_one_digit", 1);
#endif
    OBJ("long_shift", PyLong_SHIFT);
    OBJ("dict_keys", offsetof(PyDictObject, ma_keys));
    OBJ("dict_values", offsetof(PyDictObject, ma_values));
    /* The keys object: its hash table's size (dk_size before 3.11, then
     * its log2 and the log2 of the index bytes), its entries' count and
     * kind, where the indices start (the entries follow them). */
#if PY_VERSION_HEX >= 0x030B0000
    OBJ_NONE("keys_size");
    OBJ("keys_log2_size", offsetof(PyDictKeysObject, dk_log2_size));
    OBJ("keys_log2_index_bytes", offsetof(PyDictKeysObject, dk_log2_index_bytes));
    OBJ("keys_kind", offsetof(PyDictKeysObject, dk_kind));
    OBJ("keys_kind_general", DICT_KEYS_GENERAL);
#else
    OBJ("keys_size", offsetof(PyDictKeysObject, dk_size));
    OBJ_NONE("keys_log2_size");
    OBJ_NONE("keys_log2_index_bytes");
    OBJ_NONE("keys_kind");
    OBJ_NONE("keys_kind_general");
#endif
    OBJ("keys_nentries", offsetof(PyDictKeysObject, dk_nentries));
    OBJ("keys_indices", offsetof(PyDictKeysObject, dk_indices));
    OBJ("entry_size", sizeof(PyDictKeyEntry));
    OBJ("entry_key", offsetof(PyDictKeyEntry, me_key));
    OBJ("entry_value", offsetof(PyDictKeyEntry, me_value));
    /* 3.11+: str-keyed tables hold entries without the hash. */
#if PY_VERSION_HEX >= 0x030B0000
    OBJ("unicode_entry_size", sizeof(PyDictUnicodeEntry));
    OBJ("unicode_entry_key", offsetof(PyDictUnicodeEntry, me_key));
    OBJ("unicode_entry_value", offsetof(PyDictUnicodeEntry, me_value));
    OBJ("values_array", offsetof(PyDictValues, values));
#else
    OBJ_NONE("unicode_entry_size");
    OBJ_NONE("unicode_entry_key");
    OBJ_NONE("unicode_entry_value");
    /* ma_values points at the values themselves. */
    OBJ("values_array", 0);
#endif
    /* Where an instance's attributes are: a dict at the type's
     * tp_dictoffset before 3.11; from 3.11 (types with
     * Py_TPFLAGS_MANAGED_DICT) a dict pointer before the object, and when
     * that is NULL the values alone: behind a pointer one word further
     * before (3.11), tagged in the dict pointer's low bit (3.12), or inline
     * after tp_basicsize with a `valid` byte (3.13+); their keys are the
     * type's cached keys. */
#if PY_VERSION_HEX >= 0x030D0000
    printf("        instance_dict: InstanceDict::InlineValues,\n");
    OBJ("managed_dict_before", -MANAGED_DICT_OFFSET);
    OBJ_NONE("managed_values_before");
    OBJ("flag_managed_dict", Py_TPFLAGS_MANAGED_DICT);
    OBJ("flag_inline_values", Py_TPFLAGS_INLINE_VALUES);
    OBJ("values_valid", offsetof(PyDictValues, valid));
#elif PY_VERSION_HEX >= 0x030C0000
    printf("        instance_dict: InstanceDict::TaggedValues,\n");
    /* 3.12 names only the weakref slot; _PyObject_DictOrValuesPointer is the word after it. */
    OBJ("managed_dict_before", -MANAGED_WEAKREF_OFFSET - sizeof(PyObject *));
    OBJ_NONE("managed_values_before");
    OBJ("flag_managed_dict", Py_TPFLAGS_MANAGED_DICT);
    OBJ_NONE("flag_inline_values");
    OBJ_NONE("values_valid");
#elif PY_VERSION_HEX >= 0x030B0000
    printf("        instance_dict: InstanceDict::ValuesPointer,\n");
    OBJ("managed_dict_before", -MANAGED_DICT_OFFSET);
    /* _PyObject_ValuesPointer: the word before the dict pointer. */
    OBJ("managed_values_before", -MANAGED_DICT_OFFSET + sizeof(PyObject *));
    OBJ("flag_managed_dict", Py_TPFLAGS_MANAGED_DICT);
    OBJ_NONE("flag_inline_values");
    OBJ_NONE("values_valid");
#else
    printf("        instance_dict: InstanceDict::TypeOffset,\n");
    OBJ_NONE("managed_dict_before");
    OBJ_NONE("managed_values_before");
    OBJ_NONE("flag_managed_dict");
    OBJ_NONE("flag_inline_values");
    OBJ_NONE("values_valid");
#endif
    /* A set (asyncio keeps the tasks awaiting one task in a set once there
     * are several): its active entries' count, its table's mask, and the
     * table of (key, hash) entries; an empty or deleted slot's key is NULL
     * or the dummy key. */
    OBJ("set_used", offsetof(PySetObject, used));
    OBJ("set_mask", offsetof(PySetObject, mask));
    OBJ("set_table", offsetof(PySetObject, table));
    OBJ("set_entry_size", sizeof(setentry));
    OBJ("set_entry_key", offsetof(setentry, key));
    printf("    },\n");
#if PY_VERSION_HEX >= 0x030D0000
    /* 3.13+: where each of those fields sits inside _Py_DebugOffsets, the
     * table CPython keeps at the start of _PyRuntime, so pytrace reads the
     * target's own offsets (they have changed between patch releases). */
#define DEBUG(name, member) printf("        %s: %zu,\n", name, offsetof(_Py_DebugOffsets, member))
    printf("    debug_offsets: Some(DebugOffsets {\n");
    DEBUG("version", version);
    DEBUG("runtime_interpreters_head", runtime_state.interpreters_head);
    DEBUG("interp_next", interpreter_state.next);
    DEBUG("interp_threads_head", interpreter_state.threads_head);
    DEBUG("tstate_next", thread_state.next);
    DEBUG("tstate_interp", thread_state.interp);
    DEBUG("tstate_thread_id", thread_state.thread_id);
    DEBUG("tstate_current", thread_state.current_frame);
    DEBUG("frame_instr", interpreter_frame.instr_ptr);
    DEBUG("frame_owner", interpreter_frame.owner);
    DEBUG("frame_code", interpreter_frame.executable);
    DEBUG("frame_previous", interpreter_frame.previous);
    DEBUG("code_code", code_object.co_code_adaptive);
    DEBUG("code_linetable", code_object.linetable);
    DEBUG("code_filename", code_object.filename);
    DEBUG("code_name", code_object.name);
    DEBUG("code_qualname", code_object.qualname);
    DEBUG("code_firstlineno", code_object.firstlineno);
    DEBUG("object_type", pyobject.ob_type);
    DEBUG("bytes_size", bytes_object.ob_size);
    DEBUG("bytes_data", bytes_object.ob_sval);
    DEBUG("unicode_length", unicode_object.length);
    DEBUG("unicode_state", unicode_object.state);
    DEBUG("unicode_ascii_data", unicode_object.asciiobject_size);
    DEBUG("free_threaded", free_threaded);
    DEBUG("frame_localsplus", interpreter_frame.localsplus);
    DEBUG("interp_gc", interpreter_state.gc);
    DEBUG("gc_collecting", gc.collecting);
    DEBUG("interp_modules", interpreter_state.imports_modules);
#if PY_VERSION_HEX >= 0x030F0000
    DEBUG("gc_stats", gc.generation_stats);
#else
    printf("        gc_stats: NO_FIELD,\n");
#endif
    printf("    }),\n");
#else
    printf("    debug_offsets: None,\n");
#endif
    printf("}\n");
    return 0;
}
