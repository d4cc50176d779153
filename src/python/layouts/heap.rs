//! What `pytrace heap` reads that neither `_Py_DebugOffsets` nor the
//! generated table has yet: where the collector's generation heads sit in
//! its state, where obmalloc keeps its arena table, the arena and pool
//! sizes, and the type fields a census names and sizes objects by.
//!
//! Measured: printed by `offsetof`/`sizeof` from each build's own headers
//! (a program like bench/heap/offsets.c, compiled against pyenv's 3.9.18,
//! 3.10.13, 3.11.7, 3.12.1, 3.13.0 and sid's 3.13.18, 3.14.10, 3.15.2
//! headers, scripts/pythons.sh headers); the design (docs/design/heap.md)
//! has the table. They move between patch releases (sid's 3.13.18 moved
//! the generations from 24 to 20), so a field that did is a list of
//! candidates, each kept only if the target's memory proves it (the three
//! heads are lists: src/python/reading/heap/gc_lists.rs). Moving them into
//! scripts/layout-offsets.c is left to do.

/// Where obmalloc's state (its `mgmt.arenas` table) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Obmalloc {
    /// Static in obmalloc.c (3.9 to 3.11): the `arenas` and `maxarenas`
    /// symbols, in .symtab only (a stripped build has neither).
    Symbols,
    /// `interp->obmalloc` inline at this offset (3.12).
    Inline(u32),
    /// `interp->obmalloc` a pointer at this offset (3.13+).
    Pointer(u32),
    /// No obmalloc: a free-threaded build allocates every object from
    /// mimalloc's per-thread heaps (the `mimalloc` module below).
    Mimalloc,
}

#[derive(Debug, PartialEq, Eq)]
pub struct HeapLayout {
    pub version: (u32, u32),
    /// `generations[0]` and the permanent generation (`gc.freeze()`'s) in
    /// the collector's state (`interp->gc`), for each patch release's
    /// layout; each generation is `GENERATION_SIZE` bytes.
    pub generations: &'static [(u32, u32)],
    pub obmalloc: Obmalloc,
    /// log2 of an arena's and of a pool's size.
    pub arena_bits: u32,
    pub pool_bits: u32,
    /// The type flags that put two more words (a managed dict, a weakref
    /// list) before an object's PyGC_Head: 3.11's Py_TPFLAGS_MANAGED_DICT,
    /// 3.12+'s and Py_TPFLAGS_MANAGED_WEAKREF. sys.getsizeof counts them.
    pub pre_header_flags: u64,
    /// PyHeapTypeObject.ht_qualname.
    pub ht_qualname: u32,
    /// An int's digit count is its size word shifted right by this (3.12+'s
    /// lv_tag); None: the size word is the signed digit count.
    pub int_tag_shift: Option<u32>,
    /// How a dict's keys object says its size (dict.__sizeof__ counts it).
    pub dict_keys: DictKeys,
    /// How much larger the object header is than the default build's 16
    /// bytes (ob_refcnt, ob_type): 16 in a free-threaded build (ob_tid, its
    /// flags, two refcounts, ob_type), which moves every field after it,
    /// a type's included. The constants below are the default build's.
    pub object_shift: u64,
    /// The collector's header before a GC object, which sys.getsizeof
    /// counts: a PyGC_Head (16), or none in a free-threaded build, whose GC
    /// bits are in the object's own header.
    pub gc_header: u64,
}

/// PyDictKeysObject's header, as dict.__sizeof__ reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DictKeys {
    /// 3.9, 3.10: dk_refcnt, dk_size (slots), dk_lookup, dk_usable,
    /// dk_nentries (40 bytes); indices 1 to 8 bytes each by dk_size, and
    /// 24-byte entries, (2 × size) / 3 of them. A split dict's values
    /// array is as long as that.
    SizeWord,
    /// 3.11+: dk_refcnt, then u8s dk_log2_size, dk_log2_index_bytes and
    /// dk_kind, dk_version, dk_usable at 16, dk_nentries at 24 (32 bytes);
    /// entries of 24 bytes (general keys) or 16 (str keys). A split dict's
    /// values array is dk_nentries + dk_usable long.
    Log2,
}

/// struct gc_generation: its list head (16 bytes), threshold and count.
pub const GENERATION_SIZE: u64 = 24;
/// Offsets in PyTypeObject, the same from 3.9 to 3.15 in every default build.
pub const TP_NAME: u64 = 24;
pub const TP_BASICSIZE: u64 = 32;
pub const TP_ITEMSIZE: u64 = 40;
pub const TP_FLAGS: u64 = 168;
pub const TP_DICT: u64 = 264;
/// struct arena_object's size and fields (obmalloc.c, 3.9 to 3.15).
pub const ARENA_OBJECT_SIZE: u64 = 48;
pub const MGMT_ARENAS: u64 = 512;
pub const MGMT_MAXARENAS: u64 = 520;
/// struct pool_header: ref.count (u32) at 0, freeblock at 8, szidx,
/// nextoffset, maxnextoffset (u32s) at 36, 40, 44; its size (POOL_OVERHEAD).
pub const POOL_OVERHEAD: u64 = 48;
/// obmalloc's ALIGNMENT on x86-64: block sizes are multiples of it.
pub const ALIGNMENT: u64 = 16;

/// PyDictObject's ma_keys and ma_values; PySetObject's mask, table and
/// smalltable (3.9 to 3.15); a setentry's size.
pub const DICT_MA_KEYS: usize = 32;
pub const DICT_MA_VALUES: usize = 40;
pub const SET_MASK: usize = 32;
pub const SET_TABLE: usize = 40;
pub const SET_SMALLTABLE: u64 = 64;
pub const SET_ENTRY_SIZE: u64 = 16;

const MANAGED_DICT: u64 = 1 << 4;
const MANAGED_WEAKREF: u64 = 1 << 3;

pub static HEAP_LAYOUTS: &[HeapLayout] = &[
    HeapLayout { version: (3, 9), generations: &[(24, 104)], obmalloc: Obmalloc::Symbols, arena_bits: 18, pool_bits: 12, pre_header_flags: 0, ht_qualname: 856, int_tag_shift: None, dict_keys: DictKeys::SizeWord, object_shift: 0, gc_header: 16 },
    HeapLayout { version: (3, 10), generations: &[(24, 104)], obmalloc: Obmalloc::Symbols, arena_bits: 20, pool_bits: 14, pre_header_flags: 0, ht_qualname: 864, int_tag_shift: None, dict_keys: DictKeys::SizeWord, object_shift: 0, gc_header: 16 },
    HeapLayout { version: (3, 11), generations: &[(24, 104)], obmalloc: Obmalloc::Symbols, arena_bits: 20, pool_bits: 14, pre_header_flags: MANAGED_DICT, ht_qualname: 864, int_tag_shift: None, dict_keys: DictKeys::Log2, object_shift: 0, gc_header: 16 },
    HeapLayout { version: (3, 12), generations: &[(24, 104)], obmalloc: Obmalloc::Inline(3960), arena_bits: 20, pool_bits: 14, pre_header_flags: MANAGED_DICT | MANAGED_WEAKREF, ht_qualname: 872, int_tag_shift: Some(3), dict_keys: DictKeys::Log2, object_shift: 0, gc_header: 16 },
    // 3.13.0 at 24; 3.13.18 at 20 (PyGC_Head became 4-byte aligned).
    HeapLayout { version: (3, 13), generations: &[(24, 104), (20, 104)], obmalloc: Obmalloc::Pointer(10800), arena_bits: 20, pool_bits: 14, pre_header_flags: MANAGED_DICT | MANAGED_WEAKREF, ht_qualname: 872, int_tag_shift: Some(3), dict_keys: DictKeys::Log2, object_shift: 0, gc_header: 16 },
    HeapLayout { version: (3, 14), generations: &[(24, 96)], obmalloc: Obmalloc::Pointer(10904), arena_bits: 20, pool_bits: 14, pre_header_flags: MANAGED_DICT | MANAGED_WEAKREF, ht_qualname: 872, int_tag_shift: Some(3), dict_keys: DictKeys::Log2, object_shift: 0, gc_header: 16 },
    HeapLayout { version: (3, 15), generations: &[(8, 80)], obmalloc: Obmalloc::Pointer(10880), arena_bits: 20, pool_bits: 14, pre_header_flags: MANAGED_DICT | MANAGED_WEAKREF, ht_qualname: 880, int_tag_shift: Some(3), dict_keys: DictKeys::Log2, object_shift: 0, gc_header: 16 },
];

/// Free-threaded builds: 3.13t (3.13.5t's headers). Its PyTypeObject and
/// the dict, set, list and int fields are the default build's moved by
/// the larger header (`object_shift`).
pub static FREE_THREADED_HEAP_LAYOUTS: &[HeapLayout] = &[
    HeapLayout { version: (3, 13), generations: &[], obmalloc: Obmalloc::Mimalloc, arena_bits: 0, pool_bits: 0, pre_header_flags: MANAGED_DICT | MANAGED_WEAKREF, ht_qualname: 888, int_tag_shift: Some(3), dict_keys: DictKeys::Log2, object_shift: 16, gc_header: 0 },
];

/// The row of `version`'s default build, if `heap` knows it.
pub fn for_version(version: (u32, u32)) -> Option<&'static HeapLayout> {
    HEAP_LAYOUTS.iter().find(|l| l.version == version)
}

/// The row of `version`'s free-threaded build, if `heap` knows it.
pub fn for_free_threaded(version: (u32, u32)) -> Option<&'static HeapLayout> {
    FREE_THREADED_HEAP_LAYOUTS.iter().find(|l| l.version == version)
}

/// The free-threaded build's mimalloc structures, 3.13.5t's: `offsetof`
/// and `sizeof` from its headers (bench/heap/offsets.c with
/// -I…/internal/mimalloc), the numbers bench/heap/read-ft.py uses.
/// src/python/reading/heap/mimalloc.rs reads them.
pub mod mimalloc {
    /// PyInterpreterState.mimalloc.abandoned_pool, and in that
    /// mi_abandoned_pool_t its two segment lists: `abandoned_visited` (a
    /// plain pointer) and `abandoned` (tagged: its low bits, those of
    /// MI_SEGMENT_MASK, count pops).
    pub const INTERP_ABANDONED_POOL: u64 = 10816;
    pub const POOL_ABANDONED_VISITED: u64 = 0;
    pub const POOL_ABANDONED: u64 = 64;
    /// The collector's young count (interp->gc.generations[0].count, an
    /// i32) and each thread's share not yet added to it
    /// (_PyThreadStateImpl.gc.alloc_count, an isize): record_allocation
    /// buffers the count per thread.
    pub const INTERP_YOUNG_COUNT: u64 = 7400 + 24 + 20;
    pub const TSTATE_ALLOC_COUNT: u64 = 336;
    /// _PyThreadStateImpl.mimalloc.heaps: one mi_heap_t per tag.
    pub const TSTATE_HEAPS: u64 = 344 + 8;
    pub const HEAP_SIZE: u64 = 3064;
    /// mi_heap_t.pages: MI_BIN_FULL + 1 page queues (the last holds full
    /// pages), each a first page, a last and a block size.
    pub const HEAP_PAGES: u64 = 1040;
    pub const PAGE_QUEUE_SIZE: usize = 24;
    pub const BIN_FULL: usize = 74;
    /// The heap tags (_Py_MIMALLOC_HEAP_*): objects without GC, GC objects,
    /// GC objects with a 16-byte pre-header (a managed dict and weakref).
    pub const TAG_OBJECT: u8 = 1;
    pub const TAG_GC: u8 = 2;
    pub const TAG_GC_PRE: u8 = 3;
    /// mi_page_t: slice_count, slice_offset (u32s); the byte whose bits 3
    /// to 6 are the owning heap's tag; capacity (u16), free, used (u32),
    /// xblock_size (u32), local_free, xthread_free (its 2 low bits are the
    /// delayed-free state), next.
    pub const PAGE_SLICE_COUNT: usize = 0;
    pub const PAGE_SLICE_OFFSET: usize = 4;
    pub const PAGE_TAG_BYTE: usize = 8;
    pub const PAGE_CAPACITY: usize = 10;
    pub const PAGE_FREE: usize = 16;
    pub const PAGE_USED: usize = 24;
    pub const PAGE_XBLOCK_SIZE: usize = 28;
    pub const PAGE_LOCAL_FREE: usize = 32;
    pub const PAGE_XTHREAD_FREE: usize = 40;
    pub const PAGE_NEXT: usize = 56;
    /// The bytes of mi_page_t a census reads (through `next`).
    pub const PAGE_HEADER_LEN: usize = 64;
    /// mi_segment_t: abandoned_next, slice_entries, and its slices (each a
    /// mi_page_t); a segment is SEGMENT_SIZE-aligned, in SLICE_SIZE slices.
    pub const SEGMENT_ABANDONED_NEXT: u64 = 176;
    pub const SEGMENT_SLICE_ENTRIES: usize = 248;
    pub const SEGMENT_SLICES: u64 = 264;
    pub const SLICE_STRUCT_SIZE: u64 = 96;
    pub const SLICES_PER_SEGMENT: u64 = 512;
    pub const SEGMENT_SIZE: u64 = 1 << 25;
    pub const SLICE_SIZE: u64 = 1 << 16;
    /// The free-threaded PyObject header's ob_gc_bits: _PyGC_BITS_TRACKED
    /// and _PyGC_BITS_FROZEN (gc.freeze()).
    pub const OB_GC_BITS: usize = 11;
    pub const GC_BITS_TRACKED: u8 = 1;
    pub const GC_BITS_FROZEN: u8 = 8;
    /// The pre-header of TAG_GC_PRE's blocks.
    pub const PRE_HEADER: u64 = 16;
}
