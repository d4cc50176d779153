//! Which addresses are type objects, and what each is called and how big
//! its instances are. A census trusts an object only through its type, so
//! a type is checked before any object counts under it: its own type is
//! PyType_Type, or a metaclass that reaches it in a few steps; its sizes
//! are in bounds; it lies in no arena (no type object is that small:
//! CPython's static types are in the binary, heap types exceed 512 bytes).
//! Each address is checked once and cached, refusals too.

use std::collections::HashMap;

use anyhow::{ensure, Result};

use super::{plausible, word};
use crate::process::proc::Memory;
use crate::python::layouts::heap::{HeapLayout, TP_BASICSIZE, TP_DICT, TP_FLAGS, TP_ITEMSIZE, TP_NAME};
use crate::python::reading::code::read_str;
use crate::python::reading::thread_names::Reader;
use crate::python::Layout;

/// Py_TPFLAGS_HEAPTYPE: a class made at run time (a `class` statement,
/// PyType_FromSpec), named by its `__module__` and `__qualname__`.
const HEAPTYPE: u64 = 1 << 9;
/// Py_TPFLAGS_HAVE_GC: instances carry a PyGC_Head and may be tracked.
pub const HAVE_GC: u64 = 1 << 14;
/// No instance is larger than this without its items, nor has items larger.
const MAX_BASICSIZE: u64 = 1 << 20;
const MAX_ITEMSIZE: u64 = 1 << 16;
/// A metaclass of a metaclass...: more steps than this to PyType_Type is garbage.
const MAX_META_STEPS: usize = 4;
/// Longer type names are cut here.
const MAX_NAME: usize = 256;
/// More distinct types than this is not a heap pytrace will census.
const MAX_TYPES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct TypeInfo {
    pub address: u64,
    /// `__module__` and `__qualname__`, as `type(o).__module__` gives them
    /// (static types: what their tp_name says, "builtins" without a dot).
    pub module: String,
    pub qualname: String,
    pub flags: u64,
    pub basicsize: u64,
    pub itemsize: u64,
    /// A heap type whose `__module__` or `__qualname__` could not be read
    /// (named by tp_name).
    pub unnamed: bool,
}

impl TypeInfo {
    pub fn has_gc(&self) -> bool {
        self.flags & HAVE_GC != 0
    }
}

/// The checked types met so far, by address.
pub struct Types<'a> {
    mem: &'a Memory,
    layout: &'a Layout,
    heap: &'a HeapLayout,
    dicts: Option<Reader<'a>>,
    pytype: u64,
    cache: HashMap<u64, Option<usize>>,
    /// The last address checked and its answer: a pool's blocks are mostly
    /// of one type, so most checks end here without a hash.
    last: (u64, Option<usize>),
    pub infos: Vec<TypeInfo>,
}

impl<'a> Types<'a> {
    /// `pytype` is PyType_Type's address in the target; `dicts` reads heap
    /// types' `__module__` (None: they are named by tp_name).
    pub fn new(mem: &'a Memory, layout: &'a Layout, heap: &'a HeapLayout, dicts: Option<Reader<'a>>, pytype: u64) -> Self {
        Self { mem, layout, heap, dicts, pytype, cache: HashMap::new(), last: (0, None), infos: Vec::new() }
    }

    /// The index in `infos` of the type at `addr`, if it is one. `in_arena`
    /// refuses, without a read, what lies in an allocator arena.
    pub fn check(&mut self, addr: u64, in_arena: impl Fn(u64) -> bool) -> Option<usize> {
        if addr == self.last.0 {
            return self.last.1;
        }
        if !plausible(addr) {
            return None;
        }
        if let Some(&known) = self.cache.get(&addr) {
            self.last = (addr, known);
            return known;
        }
        if in_arena(addr) {
            // Not cached: most such words are list pointers, never met again.
            return None;
        }
        let found = self.read(addr).ok().filter(|_| self.infos.len() < MAX_TYPES).map(|info| {
            self.infos.push(info);
            self.infos.len() - 1
        });
        if self.cache.len() < MAX_TYPES * 4 {
            self.cache.insert(addr, found);
        }
        self.last = (addr, found);
        found
    }

    fn read(&mut self, addr: u64) -> Result<TypeInfo> {
        // A free-threaded header moves every field after it (object_shift).
        let shift = self.heap.object_shift as usize;
        let mut head = [0u8; TP_FLAGS as usize + 8 + 16];
        let head = &mut head[..TP_FLAGS as usize + 8 + shift];
        self.mem.read(addr, head)?;
        let head = &*head;
        let mut meta = word(head, self.layout.object_type as usize);
        let mut steps = 0;
        while meta != self.pytype {
            ensure!(plausible(meta) && steps < MAX_META_STEPS, "not a type");
            meta = self.mem.read_u64(meta + self.layout.object_type as u64)?;
            steps += 1;
        }
        let (basicsize, itemsize) = (word(head, TP_BASICSIZE as usize + shift), word(head, TP_ITEMSIZE as usize + shift));
        ensure!(basicsize > 0 && basicsize <= MAX_BASICSIZE && itemsize <= MAX_ITEMSIZE, "sizes out of bounds");
        let flags = word(head, TP_FLAGS as usize + shift);
        let tp_name = self.c_name(word(head, TP_NAME as usize + shift)).unwrap_or_else(|| format!("<type {addr:#x}: unreadable name>"));
        let mut unnamed = false;
        let (module, qualname) = if flags & HEAPTYPE != 0 {
            match self.heap_name(addr) {
                Ok(names) => names,
                Err(_) => {
                    unnamed = true;
                    (String::from("?"), tp_name)
                }
            }
        } else {
            // type.__module__ and __qualname__ of a static type: split at its last dot.
            match tp_name.rsplit_once('.') {
                Some((module, name)) => (module.to_string(), name.to_string()),
                None => ("builtins".to_string(), tp_name),
            }
        };
        Ok(TypeInfo { address: addr, module, qualname, flags, basicsize, itemsize, unnamed })
    }

    /// A heap type's `__module__` (its dict's str) and `__qualname__`.
    fn heap_name(&self, addr: u64) -> Result<(String, String)> {
        let qualname = read_str(self.mem, self.layout, self.mem.read_u64_non_null(addr + self.heap.ht_qualname as u64)?)?;
        let dicts = self.dicts.as_ref().ok_or_else(|| anyhow::anyhow!("no dict reader"))?;
        let dict = self.mem.read_u64_non_null(addr + TP_DICT + self.heap.object_shift)?;
        let module = dicts.dict_get(dict, "__module__")?.ok_or_else(|| anyhow::anyhow!("no __module__"))?;
        ensure!(dicts.type_of(module)? == dicts.str_type, "__module__ is not a str");
        Ok((dicts.str(module)?, qualname))
    }

    /// A C string of at most MAX_NAME bytes, printable UTF-8, read without
    /// crossing into the next page (which may be unmapped).
    fn c_name(&self, at: u64) -> Option<String> {
        if at == 0 || at >= super::USER_END {
            return None;
        }
        let to_page_end = 4096 - (at % 4096) as usize;
        let mut bytes = vec![0u8; MAX_NAME.min(to_page_end)];
        self.mem.read(at, &mut bytes).ok()?;
        if !bytes.contains(&0) && bytes.len() < MAX_NAME {
            let mut more = vec![0u8; MAX_NAME - bytes.len()];
            if self.mem.read(at + bytes.len() as u64, &mut more).is_ok() {
                bytes.extend(more);
            }
        }
        let end = bytes.iter().position(|&b| b == 0)?;
        let name = std::str::from_utf8(&bytes[..end]).ok()?;
        (!name.is_empty() && !name.chars().any(char::is_control)).then(|| name.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layouts::{for_build, heap::for_version};

    /// A crafted static type in this process's own memory, read through
    /// /proc/self/mem as a target's would be: its type is `meta` (itself
    /// when None, standing for PyType_Type), its tp_name `name`.
    struct Crafted {
        ty: Vec<u64>,
        other: Vec<u64>,
    }

    impl Crafted {
        fn new(name: u64) -> Self {
            let mut c = Crafted { ty: vec![0; 40], other: vec![0; 40] };
            c.ty[1] = c.addr();
            c.ty[3] = name;
            c.ty[4] = 32;
            c.ty[21] = HAVE_GC;
            c
        }
        fn addr(&self) -> u64 {
            self.ty.as_ptr() as u64
        }
        /// The type checked, with PyType_Type at `pytype`.
        fn check_with(&self, pytype: u64) -> Option<TypeInfo> {
            let layout = for_build(3, 12, false).unwrap();
            let heap = for_version((3, 12)).unwrap();
            let mem = Memory::open(std::process::id()).unwrap();
            let mut types = Types::new(&mem, layout, heap, None, pytype);
            types.check(self.addr(), |_| false).map(|i| types.infos[i].clone())
        }
        fn check(&self) -> Option<TypeInfo> {
            self.check_with(self.addr())
        }
    }

    #[test]
    fn a_readable_name_splits_at_its_last_dot() {
        let name = b"collections.OrderedDict\0".to_vec();
        let info = Crafted::new(name.as_ptr() as u64).check().unwrap();
        assert_eq!((info.module.as_str(), info.qualname.as_str(), info.basicsize), ("collections", "OrderedDict", 32));
    }

    /// A crafted target's type names: not UTF-8, control characters, no
    /// end within MAX_NAME bytes, NULL, unmapped. Each type still counts,
    /// under a name that says its own was unreadable, and none is read past
    /// MAX_NAME.
    #[test]
    fn a_type_whose_name_is_garbage_counts_under_a_name_that_says_so() {
        let not_utf8 = b"\xff\xfe\x80abc\0".to_vec();
        let control = b"ab\x07c\0".to_vec();
        let endless = vec![b'a'; MAX_NAME * 2];
        for (what, name) in [
            ("not UTF-8", not_utf8.as_ptr() as u64),
            ("control characters", control.as_ptr() as u64),
            ("no end within MAX_NAME", endless.as_ptr() as u64),
            ("NULL", 0),
            ("unmapped", 0xdead_0000_0000),
        ] {
            let c = Crafted::new(name);
            let info = c.check().unwrap_or_else(|| panic!("{what}: the type was refused"));
            assert_eq!(info.qualname, format!("<type {:#x}: unreadable name>", c.addr()), "{what}");
            assert_eq!(info.module, "builtins", "{what}");
        }
    }

    /// A type whose type chain loops without reaching PyType_Type, and one
    /// with sizes out of bounds, are refused (nothing counts under them).
    #[test]
    fn a_looping_metatype_chain_or_a_size_out_of_bounds_is_refused() {
        let name = b"Fake\0".to_vec();
        let mut c = Crafted::new(name.as_ptr() as u64);
        let pytype = c.other.as_ptr() as u64 + 8 * 20; // never reached
        c.ty[1] = c.other.as_ptr() as u64;
        c.other[1] = c.addr();
        assert!(c.check_with(pytype).is_none());
        let mut c = Crafted::new(name.as_ptr() as u64);
        c.ty[4] = MAX_BASICSIZE + 1;
        assert!(c.check().is_none());
    }
}
