//! The unwind tables and mappings BPF unwinds native stacks by
//! (bpf/native_unwind.bpf.h; docs/design/native-unwind.md, step 2): every
//! file's rows in one array map, each file a contiguous range shared by the
//! processes mapping it, and per process a sorted array of its executable
//! mappings. A file whose table is refused (the rows map is full of tables
//! in use) or cannot be built is loaded without rows: BPF then sends that
//! sample's stack for user space to unwind.

use std::collections::HashMap;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::module::ModuleFile;
use super::table::{TableCache, UnwindRow, UnwindTable};
use crate::bpf::sample::types::{native_mapping, native_mappings};

/// Rows the map holds (8 bytes each: 8 MiB of kernel memory with
/// --native). Debian 12's libpython3.11 has 74k, libc 28k.
pub const UNWIND_ROWS: u32 = 1 << 20;

/// Processes whose mappings BPF holds at once (native_slots' size,
/// MAX_NATIVE_PROCESSES in sample.h).
pub const NATIVE_PROCESSES: u32 = 64;

/// BPF's binary searches: ROW_SEARCH_STEPS reach 2^22 rows a table.
const MAX_TABLE_ROWS: usize = 1 << 22;

/// What loading tables gave, for the report's counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct TableCounts {
    /// Files loaded without rows: their table refused (no room) or not
    /// built (no .eh_frame, unreadable); their samples unwind in user space.
    pub files_without_table: u64,
    /// Executable mappings past the per-process limit BPF searches.
    pub mappings_left_out: u64,
    /// Processes past the number whose mappings BPF holds at once.
    pub processes_left_out: u64,
}

/// A table's rows in the map.
struct Placement {
    rows: Range<u32>,
    /// Processes whose mappings point at them.
    users: u32,
    /// Held so that the cache keeps it (a table in use is never evicted).
    _table: Arc<UnwindTable>,
}

/// The rows map as memory: written in place, no system call per row.
struct RowsMemory {
    ptr: *mut UnwindRow,
    len: usize,
    bytes: usize,
    _map: MapHandle,
}

impl RowsMemory {
    fn map(map: &libbpf_rs::MapMut<'_>) -> Result<Self> {
        let handle = MapHandle::try_from(map).context("failed to duplicate the unwind rows map")?;
        let len = map.max_entries() as usize;
        let bytes = (len * std::mem::size_of::<UnwindRow>()).next_multiple_of(4096);
        // SAFETY: maps the array's own memory (BPF_F_MMAPABLE), shared with
        // the kernel; unmapped on drop.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, handle.as_fd().as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            bail!("failed to map the unwind rows map: {}", std::io::Error::last_os_error());
        }
        Ok(RowsMemory { ptr: ptr.cast(), len, bytes, _map: handle })
    }

    fn write(&mut self, at: u32, rows: &[UnwindRow]) {
        let at = at as usize;
        if at.checked_add(rows.len()).is_none_or(|end| end > self.len) {
            return;
        }
        // SAFETY: in bounds (checked above); rows are plain data, and BPF
        // reads this range only once a mapping points at it.
        unsafe { std::ptr::copy_nonoverlapping(rows.as_ptr(), self.ptr.add(at), rows.len()) };
    }
}

impl Drop for RowsMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

/// One mapping of a process, as the unwinder found it.
pub struct MappedFile<'a> {
    pub range: Range<u64>,
    pub bias: u64,
    pub file: &'a ModuleFile,
}

pub struct KernelTables {
    memory: RowsMemory,
    slots: MapHandle,
    mappings: MapHandle,
    cache: TableCache,
    /// By the table's address (Arc::as_ptr), held while placed.
    placed: HashMap<usize, Placement>,
    free: RowSpace,
    /// pid -> (its slot, the placements its mappings use).
    processes: HashMap<u32, (u32, Vec<usize>)>,
    free_slots: Vec<u32>,
    pub counts: TableCounts,
}

impl KernelTables {
    pub fn new(rows: &libbpf_rs::MapMut<'_>, slots: &libbpf_rs::MapMut<'_>, mappings: &libbpf_rs::MapMut<'_>) -> Result<Self> {
        let memory = RowsMemory::map(rows)?;
        let capacity = memory.len as u32;
        let max_slots = mappings.max_entries();
        Ok(KernelTables {
            memory,
            slots: MapHandle::try_from(slots).context("failed to duplicate the native slots map")?,
            mappings: MapHandle::try_from(mappings).context("failed to duplicate the native mappings map")?,
            cache: TableCache::new(capacity as usize),
            placed: HashMap::new(),
            free: RowSpace::new(capacity),
            processes: HashMap::new(),
            free_slots: (0..max_slots).rev().collect(),
            counts: TableCounts::default(),
        })
    }

    /// Loads `pid`'s mappings (sorted by start), placing the tables of the
    /// files not placed yet, and releases the tables it no longer maps.
    pub fn publish<'a>(&mut self, pid: u32, mapped: impl Iterator<Item = MappedFile<'a>>) {
        let slot = match self.processes.get(&pid) {
            Some((slot, _)) => *slot,
            None => match self.free_slots.pop() {
                Some(slot) => {
                    self.processes.insert(pid, (slot, Vec::new()));
                    slot
                }
                None => {
                    self.counts.processes_left_out += 1;
                    return;
                }
            },
        };
        // SAFETY: native_mappings is plain data; all zeroes is empty.
        let mut value: native_mappings = unsafe { std::mem::zeroed() };
        let mut used = Vec::new();
        let mut count = 0;
        for m in mapped {
            if count == value.m.len() {
                self.counts.mappings_left_out += 1;
                continue;
            }
            let placed = self.place(m.file);
            let entry = &mut value.m[count];
            entry.start = m.range.start;
            entry.end = m.range.end;
            if let Some((key, rows, base)) = placed {
                entry.table_start = base.wrapping_add(m.bias);
                entry.first_row = rows.start;
                entry.rows = rows.end - rows.start;
                used.push(key);
            }
            count += 1;
        }
        value.count = count as u32;
        // SAFETY: native_mappings is plain data, read as its bytes.
        let bytes = unsafe { std::slice::from_raw_parts((&value as *const native_mappings).cast::<u8>(), std::mem::size_of::<native_mappings>()) };
        let written = self.mappings.update(&slot.to_ne_bytes(), bytes, MapFlags::ANY).is_ok()
            && self.slots.update(&pid.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY).is_ok();
        if !written {
            // BPF keeps the old mappings; their tables stay placed.
            for key in used {
                self.release(key);
            }
            return;
        }
        let old = std::mem::replace(&mut self.processes.get_mut(&pid).expect("inserted above").1, used);
        for key in old {
            self.release(key);
        }
    }

    /// Forgets an exited process: its slot and the tables only it used.
    pub fn forget(&mut self, pid: u32) {
        let Some((slot, used)) = self.processes.remove(&pid) else { return };
        let _ = self.slots.delete(&pid.to_ne_bytes());
        self.free_slots.push(slot);
        for key in used {
            self.release(key);
        }
    }

    /// The file's table in the rows map, placed now if it is not yet (one
    /// more user either way): its key, rows and link-time base.
    fn place(&mut self, file: &ModuleFile) -> Option<(usize, Range<u32>, u64)> {
        let Ok(table) = self.cache.get(file) else {
            self.counts.files_without_table += 1;
            return None;
        };
        let key = Arc::as_ptr(&table) as usize;
        if let Some(p) = self.placed.get_mut(&key) {
            p.users += 1;
            return Some((key, p.rows.clone(), table.base));
        }
        let len = table.rows.len();
        let Some(rows) = (len > 0 && len <= MAX_TABLE_ROWS).then(|| self.free.allocate(len as u32)).flatten() else {
            self.counts.files_without_table += 1;
            return None;
        };
        self.memory.write(rows.start, &table.rows);
        let base = table.base;
        self.placed.insert(key, Placement { rows: rows.clone(), users: 1, _table: table });
        Some((key, rows, base))
    }

    fn release(&mut self, key: usize) {
        let Some(p) = self.placed.get_mut(&key) else { return };
        p.users -= 1;
        if p.users > 0 {
            return;
        }
        let rows = p.rows.clone();
        self.placed.remove(&key);
        self.free.release(rows);
    }

}

/// The rows map's free rows: ranges, sorted, none touching another.
struct RowSpace {
    free: Vec<Range<u32>>,
}

impl RowSpace {
    fn new(capacity: u32) -> Self {
        RowSpace { free: std::iter::once(0..capacity).filter(|r| !r.is_empty()).collect() }
    }

    /// First fit. (The cache's budget is the map's size, but free rows may
    /// be in pieces: a table that fits in none is loaded without rows.)
    fn allocate(&mut self, len: u32) -> Option<Range<u32>> {
        let i = self.free.iter().position(|r| r.end - r.start >= len)?;
        let start = self.free[i].start;
        self.free[i].start += len;
        if self.free[i].is_empty() {
            self.free.remove(i);
        }
        Some(start..start + len)
    }

    fn release(&mut self, rows: Range<u32>) {
        let i = self.free.partition_point(|r| r.start < rows.start);
        self.free.insert(i, rows);
        // Merged with the neighbours it touches.
        if i + 1 < self.free.len() && self.free[i].end == self.free[i + 1].start {
            self.free[i].end = self.free[i + 1].end;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].end == self.free[i].start {
            self.free[i - 1].end = self.free[i].end;
            self.free.remove(i);
        }
    }
}

// The layouts BPF and this file share.
const _: () = assert!(std::mem::size_of::<native_mapping>() == 32);

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables placed and freed in any order leave the rows whole again,
    /// and a table fits only in one free piece.
    #[test]
    fn freed_rows_merge_back() {
        let mut space = RowSpace::new(100);
        let a = space.allocate(30).unwrap();
        let b = space.allocate(30).unwrap();
        let c = space.allocate(30).unwrap();
        assert_eq!((a.clone(), b.clone(), c.clone()), (0..30, 30..60, 60..90));
        assert_eq!(space.allocate(11), None, "10 rows are left");
        space.release(a);
        space.release(c);
        assert_eq!(space.allocate(41), None, "30 and 40 free rows, apart");
        space.release(b);
        assert_eq!(space.free, vec![0..100]);
        assert_eq!(space.allocate(100), Some(0..100));
        assert!(space.free.is_empty());
    }
}
