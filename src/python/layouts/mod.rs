//! Per-version CPython layouts: the offsets of the few fields pytrace reads.
//! Generated from each version's own headers by scripts/layout-offsets.sh
//! (never counted by hand). Everything version-specific that the BPF
//! programs need is here, so they never name a version.
//!
//! 3.9 to 3.12 are taken from the table as they are (3.11.2 and 3.11.7 give
//! the same one). From 3.13 the table is only a default: CPython keeps its
//! own offsets in `_Py_DebugOffsets` at the start of `_PyRuntime`, and
//! `resolve` takes every field that has from the target's binary, since
//! they may change between patch releases.

mod facts;
mod table;
pub mod heap;

pub use facts::VersionFacts;

/// How a version's code objects map bytecode offsets to lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// co_lnotab (3.9): (bytecode offset delta, line delta) byte pairs.
    Lnotab,
    /// co_linetable (3.10): (offset delta, line delta; -128 = none) pairs.
    Linetable310,
    /// co_linetable (3.11+): the location table of PEP 657.
    Locations,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: (u32, u32),
    /// The line table's format.
    pub line_format: LineFormat,
    /// Bytes per unit of f_lasti, where the frame records it (before 3.11:
    /// 1 in 3.9, which counts bytes; 2 in 3.10, which counts code units).
    /// From 3.11 frames record an instruction's address; 2, the code unit.
    pub lasti_unit: u32,
    pub runtime_interpreters_head: u32,
    pub interp_next: u32,
    pub interp_eval_frame: u32,
    pub interp_threads_head: u32,
    pub tstate_next: u32,
    pub tstate_interp: u32,
    pub tstate_thread_id: u32,
    /// Where a thread's running frame is: tstate->cframe (3.11, 3.12), then
    /// ->current_frame; or the frame itself (tstate->frame before 3.11).
    pub tstate_current: u32,
    pub cframe_current_frame: u32,
    /// The frame's current instruction: a pointer into the bytecode from
    /// 3.11 (prev_instr, then instr_ptr), f_lasti before.
    pub frame_instr: u32,
    /// Where a code object's bytecode starts (3.11+), else NO_FIELD.
    pub code_code: u32,
    /// The line table: co_linetable from 3.10, co_lnotab before.
    pub code_linetable: u32,
    pub bytes_size: u32,
    pub bytes_data: u32,
    /// _PyInterpreterFrame.owner (3.11+), else NO_FIELD.
    pub frame_owner: u32,
    /// The owner value of a frame the calling thread runs
    /// (FRAME_OWNED_BY_THREAD), and the first owner value of frames that
    /// run no Python code: the C stack's shim frames (FRAME_OWNED_BY_CSTACK,
    /// 3.12 and 3.13) and from 3.14 the interpreter's base frame
    /// (FRAME_OWNED_BY_INTERPRETER; 3.14's shims come after it, 3.15 has
    /// none). 3.11 has neither: one past its last owner. NO_FIELD where
    /// frames have no owner. scripts/layout-offsets.c checks that order.
    pub frame_owned_by_thread: u32,
    pub frame_owned_not_code: u32,
    /// The low bits of a frame's code reference that are flags, not
    /// address (Py_TAG_BITS): 3.14 makes `f_executable` a tagged
    /// _PyStackRef; before, a plain pointer (0).
    pub code_tag_bits: u32,
    /// _PyInterpreterFrame.is_entry (3.11 only): the frame began a C-level
    /// _PyEval_EvalFrameDefault call. Before 3.11 every frame does; from
    /// 3.12 a shim frame with a non-code owner marks where a call began.
    pub frame_is_entry: u32,
    pub frame_code: u32,
    /// PyHeapTypeObject._spec_cache.init (3.13+), else NO_FIELD.
    pub heaptype_spec_init: u32,
    /// PyFunctionObject.func_code.
    pub function_code: u32,
    /// The CALL_ALLOC_AND_ENTER_INIT opcode (3.13+), else NO_FIELD.
    pub opcode_alloc_and_enter_init: u32,
    /// 3.11 only: the BINARY_SUBSCR_GETITEM opcode and the heap type's
    /// cached `__getitem__` it calls (`_spec_cache.getitem`); before 3.11.4
    /// that instruction ignored the eval-frame hook (inlined_getitem.rs).
    pub opcode_binary_subscr_getitem: u32,
    pub heaptype_spec_getitem: u32,
    /// PyGenObject.gi_frame_state and .gi_iframe (3.13+, where
    /// generator_close.rs looks for close()'s fast path), else NO_FIELD.
    pub gen_frame_state: u32,
    pub gen_iframe: u32,
    pub frame_previous: u32,
    /// The frame's globals, its module's dict: a module body's code object
    /// is freed as its import ends and the next one's is often made at its
    /// address with the same interned name (`<module>`), while the dicts
    /// live on, one per module. The sampler hashes and sends it with each
    /// frame so that the two are told apart. Only from the table (no
    /// `_Py_DebugOffsets` field): `resolve` drops it when the target's
    /// frame offsets differ from the table's.
    pub frame_globals: u32,
    pub object_type: u32,
    pub code_flags: u32,
    pub code_filename: u32,
    pub code_name: u32,
    pub code_qualname: u32,
    pub code_firstlineno: u32,
    pub unicode_length: u32,
    pub unicode_hash: u32,
    pub unicode_state: u32,
    pub unicode_ascii_data: u32,
    pub unicode_compact_data: u32,
    /// The bit where a str's kind:3, compact:1 and ascii:1 bit-fields start
    /// in its state word: 2, or 8 in free-threaded builds (whose `interned`
    /// is a whole byte).
    pub unicode_kind_shift: u32,
    /// A free-threaded build (`--disable-gil`): a larger object header, so
    /// most offsets differ from the same version's default build.
    pub free_threaded: bool,
    /// The GIL (struct _gil_runtime_state) in _PyRuntime: to 3.11, where
    /// the runtime has one; else NO_FIELD.
    pub gil_in_runtime: u32,
    /// The pointer to its GIL in PyInterpreterState: 3.12+, where each
    /// interpreter may have its own; else NO_FIELD.
    pub gil_pointer_in_interp: u32,
    /// In the GIL: the PyThreadState that took it last (take_gil sets it,
    /// drop_gil leaves it).
    pub gil_last_holder: u32,
    /// In the GIL: an int, 1 while held.
    pub gil_locked: u32,
    /// In the GIL: the condition variable drop_gil signals as it lets go,
    /// and the one a forced switch waits on until another thread took it
    /// (`gil` on a stripped build probes where they are used).
    pub gil_cond: u32,
    pub gil_switch_cond: u32,
    pub gil_size: u32,
    /// `_PyThreadStateImpl.asyncio_running_task` (3.14+): the asyncio task
    /// the thread is running, or NULL; NO_FIELD before 3.14.
    pub tstate_asyncio_running_task: u32,
    /// A frame's local variables, its arguments first.
    pub frame_localsplus: u32,
    /// `_PyRuntime.interpreters.main`: the main interpreter.
    pub runtime_interpreters_main: u32,
    /// The collector's state in the interpreter, and in it the flag set for
    /// the length of every collection.
    pub interp_gc: u32,
    pub gc_collecting: u32,
    /// Each generation's running totals (collections, objects collected
    /// and uncollectable): where they are in the collector's state, inline
    /// or (`gc_stats_indirect`, 3.15) behind a pointer there.
    pub gc_stats: u32,
    pub gc_stats_indirect: bool,
    /// Per generation, inside those totals: its first entry, how many
    /// entries its ring has (1 before 3.15: no ring), and where the index of
    /// the newest entry is (NO_FIELD without a ring).
    pub gc_generation_items: [u32; 3],
    pub gc_generation_ring: [u32; 3],
    pub gc_generation_index: [u32; 3],
    /// One entry (struct gc_generation_stats) and its fields.
    pub gc_item_size: u32,
    pub gc_item_collections: u32,
    pub gc_item_collected: u32,
    pub gc_item_uncollectable: u32,
    /// The object internals `threading.Thread.name` takes to read.
    pub objects: ObjectLayout,
    /// Where each field above sits inside `_Py_DebugOffsets` (3.13+).
    pub debug_offsets: Option<DebugOffsets>,
}

/// What src/python/reading/thread_names.rs reads, from the interpreter's modules
/// dict down to a Thread's attributes: dicts (their keys object and
/// entries), a module's dict, a one-digit int, and where an instance keeps
/// its attributes. NO_FIELD where a version has no such thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectLayout {
    /// PyInterpreterState.modules (imports.modules from 3.12): sys.modules.
    pub interp_modules: u32,
    pub module_dict: u32,
    pub type_flags: u32,
    pub type_basicsize: u32,
    pub type_dictoffset: u32,
    /// PyHeapTypeObject.ht_cached_keys: the keys an instance's values
    /// (without a dict) go with.
    pub heaptype_cached_keys: u32,
    /// A positive int below 2**long_shift has `long_one_digit` in its size
    /// word (ob_size; from 3.12 lv_tag, the digit count above sign bits).
    pub long_size: u32,
    pub long_digits: u32,
    pub long_one_digit: u32,
    pub long_shift: u32,
    pub dict_keys: u32,
    pub dict_values: u32,
    /// The hash table's size: dk_size before 3.11, then its log2 (and the
    /// log2 of the bytes of its indices, which the entries follow).
    pub keys_size: u32,
    pub keys_log2_size: u32,
    pub keys_log2_index_bytes: u32,
    /// dk_kind (3.11+): DICT_KEYS_GENERAL entries carry the hash, the
    /// others (str keys) do not.
    pub keys_kind: u32,
    pub keys_kind_general: u32,
    pub keys_nentries: u32,
    pub keys_indices: u32,
    pub entry_size: u32,
    pub entry_key: u32,
    pub entry_value: u32,
    pub unicode_entry_size: u32,
    pub unicode_entry_key: u32,
    pub unicode_entry_value: u32,
    /// Where the values start in what ma_values points at.
    pub values_array: u32,
    pub instance_dict: InstanceDict,
    /// Bytes before the object of its dict pointer, and (3.11) of its
    /// values pointer (types with `flag_managed_dict`, 3.11+).
    pub managed_dict_before: u32,
    pub managed_values_before: u32,
    pub flag_managed_dict: u32,
    /// Py_TPFLAGS_INLINE_VALUES and PyDictValues.valid (3.13+).
    pub flag_inline_values: u32,
    pub values_valid: u32,
    /// PySetObject: its active entries, its table's mask (slots - 1) and
    /// the table, whose entries (setentry) hold a key pointer.
    pub set_used: u32,
    pub set_mask: u32,
    pub set_table: u32,
    pub set_entry_size: u32,
    pub set_entry_key: u32,
}

/// Where an instance's attributes are when its type has a managed dict
/// (before 3.11: always at the type's tp_dictoffset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceDict {
    /// A dict pointer at tp_dictoffset (3.9, 3.10).
    TypeOffset,
    /// The dict pointer, or NULL and a values pointer one word before (3.11).
    ValuesPointer,
    /// The dict pointer, or the values' address minus one (odd: 3.12).
    TaggedValues,
    /// The dict pointer, or NULL and the values inline after tp_basicsize
    /// (3.13+).
    InlineValues,
}

/// Positions, inside `_Py_DebugOffsets`, of the u64 that holds each field's
/// offset. The fields it has no entry for (eval_frame, co_flags, the str
/// hash, the compact str data) come from the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugOffsets {
    pub version: u32,
    pub runtime_interpreters_head: u32,
    pub interp_next: u32,
    pub interp_threads_head: u32,
    pub tstate_next: u32,
    pub tstate_interp: u32,
    pub tstate_thread_id: u32,
    pub tstate_current: u32,
    pub frame_instr: u32,
    pub frame_owner: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub code_code: u32,
    pub code_linetable: u32,
    pub code_filename: u32,
    pub code_name: u32,
    pub code_qualname: u32,
    pub code_firstlineno: u32,
    pub object_type: u32,
    pub bytes_size: u32,
    pub bytes_data: u32,
    pub unicode_length: u32,
    pub unicode_state: u32,
    pub unicode_ascii_data: u32,
    /// Not an offset: whether the build is free-threaded (0 or 1).
    pub free_threaded: u32,
    pub frame_localsplus: u32,
    pub interp_gc: u32,
    pub gc_collecting: u32,
    /// 3.15+ (NO_FIELD before: the table's offset stands).
    pub gc_stats: u32,
    pub interp_modules: u32,
}

/// What `_Py_DebugOffsets` starts with.
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// No CPython object is this large: an offset past it is garbage.
const MAX_OFFSET: u64 = 1 << 16;

impl DebugOffsets {
    /// How many bytes of `_PyRuntime` hold every position here.
    pub fn span(&self) -> usize {
        let last = [
            self.version, self.runtime_interpreters_head, self.interp_next, self.interp_threads_head,
            self.tstate_next, self.tstate_interp, self.tstate_thread_id, self.tstate_current,
            self.frame_instr, self.frame_owner, self.frame_code, self.frame_previous, self.code_code,
            self.code_linetable, self.code_filename, self.code_name, self.code_qualname,
            self.code_firstlineno, self.object_type, self.bytes_size, self.bytes_data,
            self.unicode_length, self.unicode_state, self.unicode_ascii_data, self.free_threaded,
            self.frame_localsplus, self.interp_gc, self.gc_collecting, self.gc_stats, self.interp_modules,
        ];
        last.iter().filter(|&&at| at != NO_FIELD).max().copied().unwrap_or(0) as usize + 8
    }
}

/// Whether the binary whose `_PyRuntime` starts with `runtime` is a
/// free-threaded build, as its `_Py_DebugOffsets` says (3.13+; every build
/// before is not). None if it holds no `_Py_DebugOffsets`.
pub fn free_threaded_build(runtime: &[u8]) -> Option<bool> {
    // The cookie, the version, then free_threaded, in every version that has them.
    let word = runtime.get(16..24)?;
    (runtime.get(..8)? == DEBUG_COOKIE).then(|| u64::from_le_bytes(word.try_into().unwrap()) != 0)
}

impl Layout {
    /// What this version does that no offset says (facts.rs). Every row of
    /// the table has one (a unit test checks).
    pub fn facts(&self) -> &'static VersionFacts {
        facts::for_version(self.version).expect("every layout row has a facts row")
    }

    /// Where the offsets come from, for `pytrace info`.
    pub fn source(&self) -> String {
        match self.debug_offsets {
            Some(_) => "the interpreter's own _Py_DebugOffsets".into(),
            None => format!("built-in table for {} (from its headers)", self.build_name()),
        }
    }

    /// "3.13" or, free-threaded, "3.13t" (the suffix CPython gives its
    /// executable).
    pub fn build_name(&self) -> String {
        format!("{}.{}{}", self.version.0, self.version.1, if self.free_threaded { "t" } else { "" })
    }

    /// This version's layout for a binary whose `_PyRuntime` starts with
    /// `runtime` (3.13+: the target's own `_Py_DebugOffsets`; ignored before).
    pub fn resolve(&self, runtime: &[u8]) -> Result<Layout, String> {
        let Some(d) = self.debug_offsets else { return Ok(self.clone()) };
        if runtime.len() < d.span() || &runtime[..8] != DEBUG_COOKIE {
            return Err("its _PyRuntime does not start with _Py_DebugOffsets".into());
        }
        let word = |at: u32| u64::from_le_bytes(runtime[at as usize..at as usize + 8].try_into().unwrap());
        let hex = word(d.version);
        if (hex >> 24, (hex >> 16) & 0xff) != (self.version.0 as u64, self.version.1 as u64) {
            return Err(format!("its _Py_DebugOffsets are for version {:#x}", hex));
        }
        if (word(d.free_threaded) != 0) != self.free_threaded {
            return Err(format!("its _Py_DebugOffsets say free_threaded = {}, the table {}", word(d.free_threaded), self.free_threaded));
        }
        let field = |at: u32| -> Result<u32, String> {
            let value = word(at);
            if value >= MAX_OFFSET {
                return Err(format!("its _Py_DebugOffsets hold a garbage offset ({value:#x})"));
            }
            Ok(value as u32)
        };
        let mut l = self.clone();
        l.runtime_interpreters_head = field(d.runtime_interpreters_head)?;
        l.interp_next = field(d.interp_next)?;
        l.interp_threads_head = field(d.interp_threads_head)?;
        l.tstate_next = field(d.tstate_next)?;
        l.tstate_interp = field(d.tstate_interp)?;
        l.tstate_thread_id = field(d.tstate_thread_id)?;
        l.tstate_current = field(d.tstate_current)?;
        l.frame_instr = field(d.frame_instr)?;
        l.frame_owner = field(d.frame_owner)?;
        l.frame_code = field(d.frame_code)?;
        l.frame_previous = field(d.frame_previous)?;
        if (l.frame_code, l.frame_previous, l.frame_instr) != (self.frame_code, self.frame_previous, self.frame_instr) {
            // The frame's layout moved in this patch release: the table's
            // f_globals may no longer be where it says.
            l.frame_globals = NO_FIELD;
        }
        l.code_code = field(d.code_code)?;
        l.code_linetable = field(d.code_linetable)?;
        l.code_filename = field(d.code_filename)?;
        l.code_name = field(d.code_name)?;
        l.code_qualname = field(d.code_qualname)?;
        l.code_firstlineno = field(d.code_firstlineno)?;
        l.object_type = field(d.object_type)?;
        l.bytes_size = field(d.bytes_size)?;
        l.bytes_data = field(d.bytes_data)?;
        l.unicode_length = field(d.unicode_length)?;
        l.unicode_state = field(d.unicode_state)?;
        // A compact str's data follows PyCompactUnicodeObject, which is
        // PyASCIIObject plus a fixed tail (utf8_length, utf8).
        let ascii = field(d.unicode_ascii_data)?;
        l.unicode_compact_data = ascii + (self.unicode_compact_data - self.unicode_ascii_data);
        l.unicode_ascii_data = ascii;
        // interpreters.main follows interpreters.head in struct pyinterpreters.
        l.runtime_interpreters_main = l.runtime_interpreters_head + (self.runtime_interpreters_main - self.runtime_interpreters_head);
        l.frame_localsplus = field(d.frame_localsplus)?;
        l.interp_gc = field(d.interp_gc)?;
        l.gc_collecting = field(d.gc_collecting)?;
        if d.gc_stats != NO_FIELD {
            l.gc_stats = field(d.gc_stats)?;
        }
        l.objects.interp_modules = field(d.interp_modules)?;
        Ok(l)
    }
}

/// The offset of a field this version does not have.
pub const NO_FIELD: u32 = u32::MAX;

pub use table::LAYOUTS;

/// The table for a version's default build.
#[cfg(test)]
pub fn for_version(major: u32, minor: u32) -> Option<&'static Layout> {
    for_build(major, minor, false)
}

/// The table for a version's default or free-threaded build.
pub fn for_build(major: u32, minor: u32, free_threaded: bool) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.version == (major, minor) && l.free_threaded == free_threaded)
}

/// "3.13", for error messages about free-threaded builds.
pub fn free_threaded_versions() -> String {
    let names: Vec<String> = LAYOUTS.iter().filter(|l| l.free_threaded).map(Layout::build_name).collect();
    names.join(", ")
}

/// The table's first and last versions ("3.9 to 3.15"), for error messages.
pub fn supported_range() -> String {
    let first = LAYOUTS.first().map(|l| l.version).unwrap_or_default();
    let last = LAYOUTS.last().map(|l| l.version).unwrap_or_default();
    format!("{}.{} to {}.{}", first.0, first.1, last.0, last.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new version is a row in table.rs and a row in facts.rs: neither
    /// without the other.
    #[test]
    fn every_layout_has_its_facts() {
        for layout in LAYOUTS {
            assert_eq!(layout.facts().version, layout.version);
        }
        for facts in facts::FACTS {
            assert!(for_build(facts.version.0, facts.version.1, false).is_some(), "{:?} has facts but no layout", facts.version);
        }
    }

    #[test]
    fn versions_are_sorted_and_unique() {
        for pair in LAYOUTS.windows(2) {
            let key = |l: &Layout| (l.version, l.free_threaded);
            assert!(key(&pair[0]) < key(&pair[1]), "{:?} before {:?}", key(&pair[0]), key(&pair[1]));
        }
        assert_eq!(supported_range(), "3.9 to 3.15");
    }

    /// A `_PyRuntime` start holding `layout`'s own offsets, as CPython
    /// writes them.
    fn runtime_for(layout: &Layout) -> Vec<u8> {
        let d = layout.debug_offsets.unwrap();
        let mut bytes = vec![0u8; d.span()];
        let mut put = |at: u32, value: u64| bytes[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
        put(d.version, ((layout.version.0 as u64) << 24) | ((layout.version.1 as u64) << 16) | 0x02f0);
        put(d.free_threaded, layout.free_threaded as u64);
        if d.gc_stats != NO_FIELD {
            put(d.gc_stats, layout.gc_stats as u64);
        }
        for (at, value) in [
            (d.runtime_interpreters_head, layout.runtime_interpreters_head),
            (d.interp_next, layout.interp_next),
            (d.interp_threads_head, layout.interp_threads_head),
            (d.tstate_next, layout.tstate_next),
            (d.tstate_interp, layout.tstate_interp),
            (d.tstate_thread_id, layout.tstate_thread_id),
            (d.tstate_current, layout.tstate_current),
            (d.frame_instr, layout.frame_instr),
            (d.frame_owner, layout.frame_owner),
            (d.frame_code, layout.frame_code),
            (d.frame_previous, layout.frame_previous),
            (d.code_code, layout.code_code),
            (d.code_linetable, layout.code_linetable),
            (d.code_filename, layout.code_filename),
            (d.code_name, layout.code_name),
            (d.code_qualname, layout.code_qualname),
            (d.code_firstlineno, layout.code_firstlineno),
            (d.object_type, layout.object_type),
            (d.bytes_size, layout.bytes_size),
            (d.bytes_data, layout.bytes_data),
            (d.unicode_length, layout.unicode_length),
            (d.unicode_state, layout.unicode_state),
            (d.unicode_ascii_data, layout.unicode_ascii_data),
            (d.frame_localsplus, layout.frame_localsplus),
            (d.interp_gc, layout.interp_gc),
            (d.gc_collecting, layout.gc_collecting),
            (d.interp_modules, layout.objects.interp_modules),
        ] {
            put(at, value as u64);
        }
        bytes[..8].copy_from_slice(DEBUG_COOKIE);
        bytes
    }

    #[test]
    fn debug_offsets_override_the_table() {
        for table in LAYOUTS.iter().filter(|l| l.debug_offsets.is_some()) {
            assert_eq!(&table.resolve(&runtime_for(table)).unwrap(), table, "{:?}", table.version);

            // A patch release that moved fields: the target's offsets win.
            let mut moved = table.clone();
            moved.tstate_current += 8;
            moved.code_qualname += 16;
            moved.unicode_ascii_data += 8;
            moved.unicode_compact_data += 8;
            moved.runtime_interpreters_head += 8;
            moved.runtime_interpreters_main += 8;
            moved.interp_gc += 16;
            moved.frame_localsplus += 8;
            moved.objects.interp_modules += 8;
            assert_eq!(table.resolve(&runtime_for(&moved)).unwrap(), moved);

            // A frame whose fields moved: the table's f_globals, which the
            // target's offsets do not give, is no longer trusted.
            let mut frame_moved = table.clone();
            frame_moved.frame_previous += 8;
            let resolved = table.resolve(&runtime_for(&frame_moved)).unwrap();
            assert_eq!((resolved.frame_previous, resolved.frame_globals), (frame_moved.frame_previous, NO_FIELD));

            // A free-threaded build's offsets are not the default build's.
            let mut other_build = table.clone();
            other_build.free_threaded = !table.free_threaded;
            assert!(table.resolve(&runtime_for(&other_build)).unwrap_err().contains("free_threaded"));
            assert_eq!(free_threaded_build(&runtime_for(&other_build)), Some(other_build.free_threaded));
        }
    }

    #[test]
    fn bad_debug_offsets_are_refused() {
        let table = for_version(3, 13).unwrap();
        let good = runtime_for(table);
        let mut cookie = good.clone();
        cookie[0] = b'X';
        assert!(table.resolve(&cookie).unwrap_err().contains("_Py_DebugOffsets"));
        assert!(table.resolve(&good[..16]).is_err());
        let other = runtime_for(for_version(3, 14).unwrap());
        assert!(table.resolve(&other).is_err(), "3.14's offsets accepted for 3.13");
        let mut garbage = good.clone();
        let at = table.debug_offsets.unwrap().code_name as usize;
        garbage[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(table.resolve(&garbage).unwrap_err().contains("garbage"));
        // Before 3.13 the table stands as it is.
        let old = for_version(3, 11).unwrap();
        assert_eq!(&old.resolve(&[]).unwrap(), old);
    }
}
