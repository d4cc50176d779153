//! Python thread names (`threading.Thread.name`), read from the target's
//! memory: sys.modules → the `threading` module's dict → `_active` (pthread
//! ident → Thread) → each Thread's `_name` and `_native_id` (its TID).
//! Before 3.14 `threading` never tells the kernel a thread's name, and from
//! 3.14 the kernel keeps only its first 15 bytes, so /proc's comm is not it.
//!
//! The target's memory may be garbage: every object's type is compared with
//! the type object pytrace trusts (PyDict_Type, PyUnicode_Type, PyLong_Type,
//! PyModule_Type in the interpreter's file), every size and count is
//! bounded, and anything that does not check out is refused, so the caller
//! keeps the kernel's name for that thread (and counts it).

use std::collections::HashMap;

use anyhow::{bail, ensure, Context, Result};

use super::code::read_str;
use crate::python::layouts::{InstanceDict, Layout, ObjectLayout, NO_FIELD};
use crate::python::{Python, RUNTIME_SYMBOL};
use crate::process::proc::Memory;

/// More entries than this in one dict (sys.modules, a module's namespace,
/// `_active`, a Thread's attributes) is garbage, or a process pytrace will
/// not walk: its threads keep the kernel's names.
const MAX_ENTRIES: u64 = 1 << 16;
/// No hash table pytrace reads is larger (2**20 slots).
const MAX_LOG2_SIZE: u8 = 20;
/// No object's attributes are further from its start than this.
const MAX_OBJECT_OFFSET: u64 = 1 << 12;
/// Longer names are cut (read_str refuses longer strs anyway).
const MAX_NAME_CHARS: usize = 256;

/// What reading the names found.
#[derive(Debug, Default)]
pub struct PythonThreadNames {
    /// TID → `threading.Thread.name`, for each thread whose Thread checked out.
    pub names: HashMap<u32, String>,
    /// Threads in `_active` whose name or TID did not check out (a name that
    /// is not a str, a thread not started yet, garbage).
    pub refused: u32,
}

/// The threads' Python names in process `pid`, or why they could not be
/// read (then every thread keeps the kernel's name).
pub fn read(pid: u32, python: &Python) -> Result<PythonThreadNames> {
    // Without the GIL, threading's dicts change under a reader with no
    // lock held, as threads come and go: not read.
    ensure!(!python.layout.free_threaded, "a free-threaded build's dicts are not read without their locks");
    let reader = dict_reader(pid, python)?;
    let runtime = python.symbol(RUNTIME_SYMBOL)?.wrapping_add(python.load_bias_in(pid)?);
    reader.names(runtime)
}

/// A reader of the target's dicts and strs, with every check above, for
/// another reader (the heap census names heap types by their `__module__`:
/// a class's dict, which rarely changes, even in a free-threaded build).
pub(crate) fn dict_reader(pid: u32, python: &Python) -> Result<Reader<'_>> {
    let layout = &python.layout;
    let bias = python.load_bias_in(pid)?;
    let type_at = |name: &str| python.symbol(name).map(|t| t.wrapping_add(bias));
    Ok(Reader {
        mem: Memory::open(pid)?,
        layout,
        o: &layout.objects,
        dict_type: type_at("PyDict_Type")?,
        str_type: type_at("PyUnicode_Type")?,
        int_type: type_at("PyLong_Type")?,
        module_type: type_at("PyModule_Type")?,
    })
}

pub(crate) struct Reader<'l> {
    mem: Memory,
    layout: &'l Layout,
    o: &'l ObjectLayout,
    dict_type: u64,
    pub(crate) str_type: u64,
    int_type: u64,
    module_type: u64,
}

impl Reader<'_> {
    fn names(&self, runtime: u64) -> Result<PythonThreadNames> {
        let interp = self.mem.read_u64_non_null(runtime + self.layout.runtime_interpreters_main as u64).context("no main interpreter")?;
        ensure!(interp != 0, "the interpreter has not started");
        let modules = self.mem.read_u64_non_null(interp + self.o.interp_modules as u64)?;
        let Some(threading) = self.dict_get(modules, "threading")? else {
            // No thread was started through `threading`: nothing to name.
            return Ok(PythonThreadNames::default());
        };
        ensure!(self.type_of(threading)? == self.module_type, "sys.modules['threading'] is not a module");
        let namespace = self.mem.read_u64_non_null(threading + self.o.module_dict as u64)?;
        let active = self.dict_get(namespace, "_active")?.context("threading has no _active")?;
        let mut found = PythonThreadNames::default();
        for (_ident, thread) in self.dict_items(active)? {
            match self.thread_name(thread) {
                Ok((tid, name)) => {
                    found.names.insert(tid, name);
                }
                Err(_) => found.refused += 1,
            }
        }
        Ok(found)
    }

    /// A Thread's (TID, name) from its `_native_id` and `_name`.
    fn thread_name(&self, thread: u64) -> Result<(u32, String)> {
        let (mut tid, mut name) = (None, None);
        for (key, value) in self.attributes(thread)? {
            if self.type_of(key)? != self.str_type {
                continue;
            }
            match self.str(key)?.as_str() {
                "_name" => {
                    ensure!(self.type_of(value)? == self.str_type, "_name is not a str");
                    name = Some(self.str(value)?.chars().take(MAX_NAME_CHARS).collect());
                }
                "_native_id" => tid = Some(self.small_int(value)?),
                _ => {}
            }
        }
        Ok((tid.context("no _native_id")?, name.context("no _name")?))
    }

    /// An instance's attributes as (key, value) pairs, wherever its version
    /// keeps them (layouts.rs's InstanceDict).
    fn attributes(&self, obj: u64) -> Result<Vec<(u64, u64)>> {
        let o = self.o;
        let ty = self.type_of(obj)?;
        if o.instance_dict == InstanceDict::TypeOffset {
            let offset = self.mem.read_u64_non_null(ty + o.type_dictoffset as u64)? as i64;
            ensure!(offset > 0 && (offset as u64) < MAX_OBJECT_OFFSET, "no instance dict");
            return self.dict_items(self.mem.read_u64_non_null(obj + offset as u64)?);
        }
        let flags = self.mem.read_u64_non_null(ty + o.type_flags as u64)?;
        ensure!(flags & o.flag_managed_dict as u64 != 0, "no managed dict");
        let dict = self.mem.read_u64_non_null(obj.wrapping_sub(o.managed_dict_before as u64))?;
        let values = match o.instance_dict {
            // _PyDictOrValues_SetValues stores the values' address minus one.
            InstanceDict::TaggedValues if dict & 1 == 1 => dict + 1,
            _ if dict != 0 => return self.dict_items(dict),
            InstanceDict::ValuesPointer => self.mem.read_u64_non_null(obj.wrapping_sub(o.managed_values_before as u64))?,
            InstanceDict::InlineValues => {
                ensure!(o.flag_inline_values != NO_FIELD && flags & o.flag_inline_values as u64 != 0, "no inline values");
                let size = self.mem.read_u64_non_null(ty + o.type_basicsize as u64)?;
                ensure!(size > 0 && size < MAX_OBJECT_OFFSET, "garbage tp_basicsize");
                let values = obj + size;
                ensure!(self.mem.read_u8(values + o.values_valid as u64)? == 1, "inline values not valid");
                values
            }
            _ => bail!("no attributes"),
        };
        ensure!(values != 0, "no values");
        let keys = self.mem.read_u64_non_null(ty + o.heaptype_cached_keys as u64)?;
        self.keys_items(keys, Some(values + o.values_array as u64))
    }

    /// `dict[name]` for a str `name`, or None if it has no such key.
    pub(crate) fn dict_get(&self, dict: u64, name: &str) -> Result<Option<u64>> {
        for (key, value) in self.dict_items(dict)? {
            if self.type_of(key)? == self.str_type && self.str(key).is_ok_and(|k| k == name) {
                return Ok(Some(value));
            }
        }
        Ok(None)
    }

    /// A dict's (key, value) pairs, combined or split.
    fn dict_items(&self, dict: u64) -> Result<Vec<(u64, u64)>> {
        ensure!(self.type_of(dict)? == self.dict_type, "not a dict");
        let keys = self.mem.read_u64_non_null(dict + self.o.dict_keys as u64)?;
        let values = self.mem.read_u64_non_null(dict + self.o.dict_values as u64)?;
        self.keys_items(keys, (values != 0).then(|| values + self.o.values_array as u64))
    }

    /// The (key, value) pairs of a keys object, whose values are in its
    /// entries or, for a split table, in the array at `values`.
    fn keys_items(&self, keys: u64, values: Option<u64>) -> Result<Vec<(u64, u64)>> {
        let o = self.o;
        let (size, index_bytes, general) = if o.keys_size != NO_FIELD {
            let size = self.mem.read_u64_non_null(keys + o.keys_size as u64)?;
            ensure!(size.is_power_of_two() && size <= 1 << MAX_LOG2_SIZE, "garbage dict size");
            // Objects/dict-common.h's DK_IXSIZE: the narrowest index that holds the size.
            let width = match size {
                0..=0xff => 1,
                0x100..=0xffff => 2,
                _ => 4,
            };
            (size, size * width, true)
        } else {
            let log2 = self.mem.read_u8(keys + o.keys_log2_size as u64)?;
            let log2_index = self.mem.read_u8(keys + o.keys_log2_index_bytes as u64)?;
            ensure!(log2 <= MAX_LOG2_SIZE && (log2..=log2 + 3).contains(&log2_index), "garbage dict size");
            (1u64 << log2, 1u64 << log2_index, self.mem.read_u8(keys + o.keys_kind as u64)? as u32 == o.keys_kind_general)
        };
        let count = self.mem.read_u64_non_null(keys + o.keys_nentries as u64)?;
        ensure!(count <= size && count <= MAX_ENTRIES, "garbage or huge dict ({count} entries)");
        let (entry_size, key_at, value_at) =
            if general { (o.entry_size, o.entry_key, o.entry_value) } else { (o.unicode_entry_size, o.unicode_entry_key, o.unicode_entry_value) };
        let mut entries = vec![0u8; (count * entry_size as u64) as usize];
        self.mem.read(keys + o.keys_indices as u64 + index_bytes, &mut entries)?;
        let split = match values {
            Some(at) => {
                let mut words = vec![0u8; count as usize * 8];
                self.mem.read(at, &mut words)?;
                Some(words)
            }
            None => None,
        };
        let word_at = |bytes: &[u8], at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap());
        let mut items = Vec::new();
        for (i, entry) in entries.chunks_exact(entry_size as usize).enumerate() {
            let key = word_at(entry, key_at as usize);
            let value = match &split {
                Some(words) => word_at(words, i * 8),
                None => word_at(entry, value_at as usize),
            };
            if key != 0 && value != 0 {
                items.push((key, value));
            }
        }
        Ok(items)
    }

    /// A positive int below 2**30 (a TID is below 2**22).
    fn small_int(&self, obj: u64) -> Result<u32> {
        ensure!(self.type_of(obj)? == self.int_type, "not an int");
        ensure!(self.mem.read_u64_non_null(obj + self.o.long_size as u64)? == self.o.long_one_digit as u64, "not a one-digit positive int");
        let mut digit = [0u8; 4];
        self.mem.read(obj + self.o.long_digits as u64, &mut digit)?;
        let value = u32::from_ne_bytes(digit);
        ensure!(value > 0 && value >> self.o.long_shift == 0, "garbage int digit");
        Ok(value)
    }

    /// A str object's text (a compact str, at most 4096 characters).
    pub(crate) fn str(&self, obj: u64) -> Result<String> {
        read_str(&self.mem, self.layout, obj)
    }

    pub(crate) fn type_of(&self, obj: u64) -> Result<u64> {
        self.mem.read_u64_non_null(obj + self.layout.object_type as u64)
    }
}

/// The target's thread names: the kernel's (/proc comm) for every thread
/// /proc lists, replaced by the Python name where one was read. Returns how
/// many threads keep the kernel's name for want of a readable Python one,
/// and why none could be read at all, if so.
///
/// Called again on the same map (`sample --threads` reads every half
/// second), a Python name read once stays: a thread leaves
/// `threading._active` before its OS thread ends, and a read in between, or
/// one while the interpreter shuts down, must not put the kernel's name back.
pub fn merge(pid: u32, python: &Python, names: &mut HashMap<u32, String>) -> NameSource {
    merge_reading(pid, read(pid, python), names)
}

/// `merge` for a report of one moment (`dump`), which has no later reading
/// to make up for one caught mid-change: see `read_settled`.
pub fn merge_settled(pid: u32, python: &Python, names: &mut HashMap<u32, String>) -> NameSource {
    merge_reading(pid, read_settled(pid, python), names)
}

fn merge_reading(pid: u32, reading: Result<PythonThreadNames>, names: &mut HashMap<u32, String>) -> NameSource {
    let mut kernel_names = HashMap::new();
    crate::process::proc::thread_names(pid, &mut kernel_names);
    for (tid, comm) in kernel_names {
        names.entry(tid).or_insert(comm);
    }
    match reading {
        Ok(found) => {
            let mut source = NameSource { from_python: 0, refused: found.refused, failure: None };
            for (tid, name) in found.names {
                // Only a TID that is the target's own thread: a garbage
                // _native_id names nothing.
                if let Some(slot) = names.get_mut(&tid) {
                    *slot = name;
                    source.from_python += 1;
                }
            }
            source
        }
        Err(e) => NameSource { from_python: 0, refused: 0, failure: Some(format!("{e:#}")) },
    }
}

/// How many times a reading that refused a thread, or failed, is taken
/// again, 10 ms apart.
const READINGS_AGAIN: u32 = 2;

/// `read`, taken again while it refuses a thread or fails, keeping the
/// reading that named the most threads. The target runs meanwhile, and a
/// reading caught while the dicts it walks change is refused: CI once saw
/// all five of a 3.15 fixture's threads refused in one `dump` (never in
/// the runs here; the likeliest cause is the keys every Thread's inline
/// attributes share, resized as one Thread gains an attribute). A refusal
/// that is no race (a `_name` that is no str) is the same at every
/// reading, and costs two readings more.
fn read_settled(pid: u32, python: &Python) -> Result<PythonThreadNames> {
    let mut best = read(pid, python);
    for _ in 0..READINGS_AGAIN {
        if matches!(&best, Ok(found) if found.refused == 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        let again = read(pid, python);
        // Most names, then fewest refused; any reading beats a failure.
        let score = |r: &Result<PythonThreadNames>| r.as_ref().ok().map(|f| (f.names.len(), std::cmp::Reverse(f.refused)));
        if score(&again) > score(&best) {
            best = again;
        }
    }
    best
}

/// Where the names `merge` gave came from, for the report.
#[derive(Debug, Default, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct NameSource {
    /// Threads named by `threading.Thread.name`.
    pub from_python: u32,
    /// Threads in `threading._active` whose Thread did not check out.
    pub refused: u32,
    /// Why no Python name could be read at all, if so.
    pub failure: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layouts::LAYOUTS;

    /// Garbage where every pointer leads (random words in this process,
    /// unmapped addresses, NULL): every version's reader refuses it, never
    /// panics, never loops.
    #[test]
    fn garbage_is_refused_without_panicking() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let words: Vec<u64> = (0..4096).map(|_| next()).collect();
        // Some words point back into the buffer, so reads go on a while.
        let base = words.as_ptr() as u64;
        let words: Vec<u64> = words.iter().map(|w| if w % 3 == 0 { base + (w % 4000) * 8 } else { *w }).collect();
        let base = words.as_ptr() as u64;
        for layout in LAYOUTS {
            let reader = Reader {
                mem: Memory::open(std::process::id()).unwrap(),
                layout,
                o: &layout.objects,
                dict_type: words[1],
                str_type: words[2],
                int_type: words[3],
                module_type: words[4],
            };
            for start in [0, 8, u64::MAX - 7, base, base + 800, base + 16_000] {
                assert!(reader.names(start).is_err() || start == base, "{:?} at {start:#x}", layout.version);
                let _ = reader.attributes(start);
                let _ = reader.dict_items(start);
                let _ = reader.keys_items(start, Some(base));
                let _ = reader.small_int(start);
            }
        }
    }
}
