//! An object's size as `sys.getsizeof` gives it, from the object's first
//! bytes and its checked type: `__sizeof__` plus the collector's header
//! (16 bytes, and 16 more for a managed dict or weakref slot, 3.11+).
//! The default `__sizeof__` is `tp_basicsize + |ob_size| × tp_itemsize`;
//! str, int and list override it and get their own rule here. Other types
//! that allocate beside the object (dict's table, set's) are counted by
//! the default, a lower bound: docs/commands/heap.md says which.

use super::types::TypeInfo;
use super::word;
use crate::python::layouts::heap::HeapLayout;
use crate::python::Layout;

/// The bytes of an object header this module reads: a str's data start
/// (48 before 3.12) and a list's `allocated` (32) are inside.
pub const NEEDED: usize = 48;

pub struct Sizes<'a> {
    layout: &'a Layout,
    heap: &'a HeapLayout,
    pub str_type: u64,
    pub int_type: u64,
    pub list_type: u64,
}

impl<'a> Sizes<'a> {
    pub fn new(layout: &'a Layout, heap: &'a HeapLayout, str_type: u64, int_type: u64, list_type: u64) -> Self {
        Self { layout, heap, str_type, int_type, list_type }
    }

    /// `object` holds at least NEEDED bytes from the object's start (less
    /// only where the block ends: then the default rule).
    pub fn bytes(&self, info: &TypeInfo, object: &[u8]) -> u64 {
        let header = if info.has_gc() { 16 + if info.flags & self.heap.pre_header_flags != 0 { 16 } else { 0 } } else { 0 };
        let size_word = || (object.len() >= 24).then(|| word(object, 16));
        let own = if info.address == self.str_type && object.len() >= NEEDED {
            self.str_bytes(info, object)
        } else if info.address == self.int_type && self.heap.int_tag_shift.is_some() {
            // 3.12+: the digit count is lv_tag's high bits; zero keeps one digit.
            let digits = size_word().map_or(1, |tag| (tag >> self.heap.int_tag_shift.unwrap_or(0)).max(1));
            info.basicsize + digits.min(1 << 20) * info.itemsize
        } else if info.address == self.list_type && object.len() >= 40 {
            // list.__sizeof__: the item array as allocated.
            info.basicsize + word(object, 32).min(1 << 32) * 8
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
