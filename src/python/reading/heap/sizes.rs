//! An object's size as `sys.getsizeof` gives it, from the object's first
//! bytes and its checked type: `__sizeof__` plus the collector's header
//! (16 bytes, none in a free-threaded build; and 16 more for a managed
//! dict or weakref slot, 3.11+).
//! The default `__sizeof__` is `tp_basicsize + |ob_size| × tp_itemsize`;
//! str, int, list, dict, set and frozenset override it and get their own
//! rule here. A dict's rule reads its keys object (one bounded read, cached
//! by address: instances' split dicts share one); a set's is in its header.
//! Other types that allocate beside the object (their subclasses too) are
//! counted by the default, a lower bound: docs/commands/heap.md says which.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::types::TypeInfo;
use super::word;
use crate::process::proc::Memory;
use crate::python::layouts::heap::{DictKeys, HeapLayout, DICT_MA_KEYS, DICT_MA_VALUES, SET_ENTRY_SIZE, SET_MASK, SET_SMALLTABLE, SET_TABLE};
use crate::python::Layout;

/// A dict or set table of more slots than this is garbage, not a size.
const MAX_SLOTS: u64 = 1 << 32;
/// Keys objects remembered per walk; past this each dict reads its own.
const MAX_CACHED_KEYS: usize = 1 << 20;

/// What dict's and set's rules need: the target's memory (a dict's keys
/// object) and the three types' addresses.
pub struct Tables<'a> {
    pub mem: &'a Memory,
    pub dict_type: u64,
    pub set_type: u64,
    pub frozenset_type: u64,
}

/// A keys object's part of its dicts' sizes: (its own bytes when a dict
/// owns it, the values array of a split dict sharing it); None: unreadable
/// or out of bounds.
type KeysSizes = Option<(bool, u64, u64)>;

/// The bytes of an object header this module reads: a str's data start
/// (48 before 3.12) and a list's `allocated` (32) are inside; 16 more in
/// a free-threaded build (`object_shift`).
pub const NEEDED: usize = 48;

pub struct Sizes<'a> {
    layout: &'a Layout,
    heap: &'a HeapLayout,
    pub str_type: u64,
    pub int_type: u64,
    pub list_type: u64,
    tables: Option<Tables<'a>>,
    keys: RefCell<HashMap<u64, KeysSizes>>,
    /// Dicts and sets whose table could not be read or was out of bounds:
    /// sized by the default rule, a lower bound.
    pub tables_unread: Cell<u64>,
}

impl<'a> Sizes<'a> {
    pub fn new(layout: &'a Layout, heap: &'a HeapLayout, str_type: u64, int_type: u64, list_type: u64) -> Self {
        Self { layout, heap, str_type, int_type, list_type, tables: None, keys: RefCell::new(HashMap::new()), tables_unread: Cell::new(0) }
    }

    /// Sizes dicts, sets and frozensets exactly, reading dicts' keys objects.
    pub fn with_tables(self, tables: Tables<'a>) -> Self {
        Self { tables: Some(tables), ..self }
    }

    /// `object` holds at least NEEDED bytes from the object's start, at
    /// `address` in the target (less only where the block ends: then the
    /// default rule).
    pub fn bytes(&self, info: &TypeInfo, address: u64, object: &[u8]) -> u64 {
        let header = if info.has_gc() { self.heap.gc_header + if info.flags & self.heap.pre_header_flags != 0 { 16 } else { 0 } } else { 0 };
        // Fields after the object header, moved in a free-threaded build.
        let shift = self.heap.object_shift as usize;
        let size_word = || (object.len() >= 24 + shift).then(|| word(object, 16 + shift));
        let own = if info.address == self.str_type && object.len() >= NEEDED {
            self.str_bytes(info, object)
        } else if info.address == self.int_type && self.heap.int_tag_shift.is_some() {
            // 3.12+: the digit count is lv_tag's high bits; zero keeps one digit.
            let digits = size_word().map_or(1, |tag| (tag >> self.heap.int_tag_shift.unwrap_or(0)).max(1));
            info.basicsize + digits.min(1 << 20) * info.itemsize
        } else if info.address == self.list_type && object.len() >= 40 + shift {
            // list.__sizeof__: the item array as allocated.
            info.basicsize + word(object, 32 + shift).min(1 << 32) * 8
        } else if let Some(own) = self.table_bytes(info, address, object) {
            own
        } else if info.itemsize > 0 {
            // A count past 2**31 is no size word but a pointer (a frame's
            // f_back sits there): the default rule then counts no items.
            let items = size_word().map(|n| (n as i64).unsigned_abs()).filter(|&n| n < 1 << 31).unwrap_or(0);
            info.basicsize + items * info.itemsize
        } else {
            info.basicsize
        };
        own + header
    }

    /// dict's, set's and frozenset's `__sizeof__` (not their subclasses'),
    /// or None for another type. A table that cannot be read or is out of
    /// bounds is counted (`tables_unread`) and sized by the default rule.
    fn table_bytes(&self, info: &TypeInfo, address: u64, object: &[u8]) -> Option<u64> {
        let tables = self.tables.as_ref()?;
        let shift = self.heap.object_shift as usize;
        let own = if info.address == tables.dict_type {
            (object.len() >= DICT_MA_VALUES + 8 + shift).then(|| self.dict_extra(tables.mem, word(object, DICT_MA_KEYS + shift), word(object, DICT_MA_VALUES + shift) != 0)).flatten()
        } else if info.address == tables.set_type || info.address == tables.frozenset_type {
            // Counted only when the table is not the inline smalltable.
            (object.len() >= SET_TABLE + 8 + shift).then(|| {
                let (mask, table) = (word(object, SET_MASK + shift), word(object, SET_TABLE + shift));
                let at_small = table == address.wrapping_add(SET_SMALLTABLE + shift as u64);
                let slots = mask.wrapping_add(1);
                (slots.is_power_of_two() && slots <= MAX_SLOTS).then_some(if at_small { 0 } else { slots * SET_ENTRY_SIZE })
            }).flatten()
        } else {
            return None;
        };
        Some(info.basicsize + own.unwrap_or_else(|| {
            self.tables_unread.set(self.tables_unread.get() + 1);
            0
        }))
    }

    /// What dict.__sizeof__ adds to tp_basicsize: the keys object if this
    /// dict owns it (dk_refcnt 1; a split table's shared keys are counted
    /// with the class), and a split dict's values array.
    fn dict_extra(&self, mem: &Memory, keys: u64, split: bool) -> Option<u64> {
        if !super::plausible(keys) {
            return None;
        }
        let cached = self.keys.borrow().get(&keys).copied();
        let sizes = match cached {
            Some(sizes) => sizes,
            None => {
                let sizes = self.read_keys(mem, keys);
                let mut cache = self.keys.borrow_mut();
                if cache.len() < MAX_CACHED_KEYS {
                    cache.insert(keys, sizes);
                }
                sizes
            }
        };
        let (owned, own_bytes, values) = sizes?;
        Some(if owned { own_bytes } else { 0 } + if split { values } else { 0 })
    }

    /// A keys object's header, read and bounded: (dk_refcnt == 1, its
    /// bytes, a split dict's values array's bytes).
    fn read_keys(&self, mem: &Memory, keys: u64) -> KeysSizes {
        let mut head = [0u8; 32];
        mem.read(keys, &mut head).ok()?;
        let owned = word(&head, 0) == 1;
        let usable_fraction = |slots: u64| (slots << 1) / 3;
        match self.heap.dict_keys {
            DictKeys::SizeWord => {
                let slots = word(&head, 8);
                if !slots.is_power_of_two() || slots > MAX_SLOTS {
                    return None;
                }
                let index_bytes = match slots {
                    0..=0xff => 1,
                    0x100..=0xffff => 2,
                    0x1_0000..=0xffff_ffff => 4,
                    _ => 8,
                };
                let usable = usable_fraction(slots);
                Some((owned, 40 + index_bytes * slots + 24 * usable, usable * 8))
            }
            DictKeys::Log2 => {
                let (log2_size, log2_index_bytes, kind) = (head[8] as u64, head[9] as u64, head[10]);
                if log2_size > 32 || log2_index_bytes > log2_size + 3 || kind > 2 {
                    return None;
                }
                let (usable, entries) = (word(&head, 16), word(&head, 24));
                if usable > MAX_SLOTS || entries > MAX_SLOTS {
                    return None;
                }
                // DICT_KEYS_GENERAL (0) has hashes in its entries.
                let entry = if kind == 0 { 24 } else { 16 };
                Some((owned, 32 + (1 << log2_index_bytes) + usable_fraction(1 << log2_size) * entry, (entries + usable) * 8))
            }
        }
    }

    /// A compact str: its data's start (by ASCII or not) and its
    /// characters and terminator at their width; else the default.
    fn str_bytes(&self, info: &TypeInfo, object: &[u8]) -> u64 {
        let l = self.layout;
        let length = word(object, l.unicode_length as usize).min(1 << 32);
        let state = super::word32(object, l.unicode_state as usize);
        let shift = l.unicode_kind_shift;
        let (kind, compact, ascii) = ((state >> shift) & 7, (state >> (shift + 3)) & 1 == 1, (state >> (shift + 4)) & 1 == 1);
        if !compact || !matches!(kind, 1 | 2 | 4) {
            return info.basicsize;
        }
        let data = if ascii { l.unicode_ascii_data } else { l.unicode_compact_data } as u64;
        data + (length + 1) * kind as u64
    }
}
