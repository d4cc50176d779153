//! Naming one process's Python frames: its code objects, read from its
//! memory once and cached by address and the frame's globals (`CodeKey`),
//! and the line of each instruction.
//!
//! The target is untrusted and code objects come and go: a freed code
//! object's address is soon reused by another (at start-up, a module's
//! code object is freed when its import ends and the next function's takes
//! its place). So a new stack's frames are named from a cached object only
//! if it has the name and file name pointers BPF read from the sampled one
//! and ran with the same globals (module bodies all share the interned
//! name `<module>`, but each has its own file and runs with its own
//! module's dict, which outlives it); an object read later than BPF read
//! those, and found with others, names nothing (the frame is unreadable);
//! and every
//! cached object is checked once per drain (`Code::identity`, read for all
//! of them in two system calls); an object found changed is read again and
//! gets a new generation, by which the stacks named after the old one know
//! it.
//!
//! The cache's memory is bounded whatever the target does: a line table
//! above MAX_KEPT_LINE_TABLE is used and dropped, not kept, and past
//! CACHE_BYTES in all the cache is emptied; both are counted.

use foldhash::HashMap;
use std::rc::Rc;

use crate::python::reading::code::{instruction_offset, Code};
use crate::python::Layout;
use crate::model::samples::Frame;
use crate::process::proc::Memory;

/// Line tables up to this size stay cached with their code object; a
/// larger one (a huge generated function) is read again for each new
/// instruction seen in it.
pub const MAX_KEPT_LINE_TABLE: usize = 64 << 10;

/// Bytes of names and line tables one process's cache may hold.
pub const CACHE_BYTES: usize = 32 << 20;

/// What each cached object costs beyond its heap bytes (entry, maps), each
/// instruction named in it, and each line's frame beyond its names.
const ENTRY_OVERHEAD: usize = 256;
const INSTR_BYTES: usize = 64;
const LINE_BYTES: usize = 96;

/// What the caches had to give up, for the report's counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheCounts {
    /// Line tables too large to keep (read again when needed).
    pub line_tables_not_kept: u64,
    /// Times a process's cache reached CACHE_BYTES and was emptied.
    pub code_cache_flushes: u64,
}

impl CacheCounts {
    pub fn add(&mut self, other: &CacheCounts) {
        self.line_tables_not_kept += other.line_tables_not_kept;
        self.code_cache_flushes += other.code_cache_flushes;
    }
}

/// Which cached object names a frame: its code object's address and the
/// frame's globals (0 where the layout has no such field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CodeKey {
    pub code: u64,
    pub globals: u64,
}

struct Entry {
    /// None: what is at the address is not a readable code object.
    code: Option<Rc<Code>>,
    /// Which object this is, of those read at this address.
    generation: u64,
    /// The drain in which the object was last checked.
    checked: u64,
    /// The line table was dropped after use (too large to keep).
    table_dropped: bool,
    /// Instruction -> its line's frame.
    by_instr: HashMap<u64, Rc<Frame>>,
    /// Line -> frame, so that one line is one frame.
    by_line: HashMap<u32, Rc<Frame>>,
    /// What the entry holds, counted against CACHE_BYTES.
    bytes: usize,
}

pub struct CodeResolver {
    pid: u32,
    layout: Layout,
    mem: Option<Memory>,
    /// &PyCode_Type in the target, once its interpreter file is mapped.
    code_type: Option<u64>,
    codes: HashMap<CodeKey, Entry>,
    bytes: usize,
    /// Generations are unique across addresses, so that a flushed and
    /// re-read entry never repeats one.
    next_generation: u64,
    /// Code objects (re)read into the cache so far: a stack named when this
    /// was N names the same objects while it is still N (see `reads`).
    reads: u64,
    pub counts: CacheCounts,
}

impl CodeResolver {
    pub fn new(pid: u32, layout: Layout) -> Self {
        CodeResolver {
            pid,
            layout,
            mem: None,
            code_type: None,
            codes: HashMap::default(),
            bytes: 0,
            next_generation: 1,
            reads: 0,
            counts: CacheCounts::default(),
        }
    }

    /// The target's memory is readable from now on.
    pub fn located(&mut self, mem: Option<Memory>, code_type: Option<u64>) {
        self.mem = mem;
        self.code_type = code_type;
    }

    /// Makes the cache hold, for each address, the object the target holds
    /// there now: cached objects are checked (their identities read in a
    /// batch) and read again if they changed; missing ones are read.
    /// Objects already checked in `drain` are not checked again.
    pub fn refresh(&mut self, keys: impl Iterator<Item = CodeKey>, drain: u64) {
        let mut seen = foldhash::HashSet::default();
        let mut to_check: Vec<(CodeKey, (u64, u64))> = Vec::new();
        let mut to_read: Vec<CodeKey> = Vec::new();
        for key in keys.filter(|&k| seen.insert(k)) {
            match self.codes.get_mut(&key) {
                Some(e) if e.checked == drain => {}
                Some(e) => {
                    e.checked = drain;
                    match &e.code {
                        Some(code) => to_check.push((key, code.identity())),
                        // Not a code object when last read: it may be one now.
                        None => to_read.push(key),
                    }
                }
                None => to_read.push(key),
            }
        }
        if !to_check.is_empty() {
            let names = read_words(self.pid, to_check.iter().map(|(k, _)| k.code + self.layout.code_qualname as u64));
            let hashes = read_words(self.pid, names.iter().map(|n| n.unwrap_or(0) + self.layout.unicode_hash as u64));
            for (i, (key, identity)) in to_check.iter().enumerate() {
                if (names[i], hashes[i]) != (Some(identity.0), Some(identity.1)) {
                    to_read.push(*key);
                }
            }
        }
        for key in to_read {
            self.read(key, drain);
        }
    }

    /// Makes the cache hold the objects a new stack's frames (code object
    /// and globals, the name and file name pointers BPF read from the
    /// object) refer to: an object cached under that key with those
    /// pointers is taken as the one sampled, and the drain's
    /// `check_all` checks it whole within a second; one cached with another
    /// name, or not cached, is read now. (Checking every cached object of
    /// each batch of new stacks against the target took two system calls,
    /// about 90 µs of a batch's 140 on a line-level workload here.)
    pub fn refresh_sampled(&mut self, frames: impl Iterator<Item = (CodeKey, u64, u64)>) {
        let mut to_read: Vec<CodeKey> = frames
            .filter(|&(key, name, file)| self.codes.get(&key).and_then(|e| e.code.as_ref()).is_none_or(|c| !c.is_sampled(name, file)))
            .map(|(key, _, _)| key)
            .collect();
        to_read.sort_unstable();
        to_read.dedup();
        for key in to_read {
            self.read(key, 0);
        }
    }

    /// Checks every cached object against the target, once per drain (two
    /// system calls for all of them): afterwards, if `reads` has not moved
    /// since a stack's frames were compared with the cache, none of its
    /// code objects changed, and the stack need not be looked at frame by
    /// frame. (Checking each counted stack's frames at every drain cost
    /// more than sampling itself at 1000 Hz on a deep workload.)
    pub fn check_all(&mut self, drain: u64) {
        let keys: Vec<CodeKey> = self.codes.keys().copied().collect();
        self.refresh(keys.into_iter(), drain);
    }

    /// How many objects have been read into the cache so far: unchanged
    /// between two moments, no cached name changed in between.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The frame of instruction `instr` in the code object cached for
    /// `key` (see `refresh`), and that object's generation; None when no
    /// code object could be read there, or when it is not the one sampled
    /// (BPF read that one's name and file name pointers, `name` and `file`,
    /// when it sent the stack).
    pub fn frame(&mut self, key: CodeKey, instr: u64, name: u64, file: u64) -> Option<(Rc<Frame>, u64)> {
        let addr = key.code;
        let entry = self.codes.get_mut(&key)?;
        let code = entry.code.clone().filter(|c| c.is_sampled(name, file))?;
        let generation = entry.generation;
        if let Some(frame) = entry.by_instr.get(&instr) {
            return Some((frame.clone(), generation));
        }
        let offset = instruction_offset(&self.layout, addr, instr);
        let line = match (entry.table_dropped, &self.mem) {
            (false, _) => code.line_at(offset),
            // Read again for this one instruction.
            (true, Some(mem)) => match Code::read(mem, &self.layout, addr) {
                Ok(full) if full.identity() == code.identity() => full.line_at(offset),
                _ => code.firstlineno,
            },
            (true, None) => code.firstlineno,
        };
        let mut added = INSTR_BYTES;
        let frame = entry
            .by_line
            .entry(line)
            .or_insert_with(|| {
                added += LINE_BYTES + code.qualname.len() + code.filename.len();
                Rc::new(Frame::Python { name: code.qualname.clone(), file: code.filename.clone(), line, first_line: code.firstlineno })
            })
            .clone();
        entry.by_instr.insert(instr, frame.clone());
        entry.bytes += added;
        self.bytes += added;
        if self.bytes > CACHE_BYTES {
            self.flush();
        }
        Some((frame, generation))
    }

    /// The generation of the object cached for `key`, if any.
    pub fn generation(&self, key: CodeKey) -> Option<u64> {
        self.codes.get(&key).filter(|e| e.code.is_some()).map(|e| e.generation)
    }

    /// (Re)reads the object at `key.code` into the cache (as "no code
    /// object" if it cannot be read).
    fn read(&mut self, key: CodeKey, drain: u64) {
        let addr = key.code;
        let mut had_code = false;
        if let Some(old) = self.codes.remove(&key) {
            self.bytes = self.bytes.saturating_sub(old.bytes);
            had_code = old.code.is_some();
        }
        let Some(mem) = &self.mem else { return };
        let layout = &self.layout;
        // A frame caught while it is set up or torn down can point at
        // anything: only a real code object gets a name.
        let is_code = self.code_type.is_none_or(|t| mem.read_u64(addr + layout.object_type as u64).ok() == Some(t));
        let code = if is_code { Code::read(mem, layout, addr).ok() } else { None };
        let generation = self.next_generation;
        self.next_generation += 1;
        let mut entry = Entry {
            code: None,
            generation,
            checked: drain,
            table_dropped: false,
            by_instr: HashMap::default(),
            by_line: HashMap::default(),
            bytes: ENTRY_OVERHEAD,
        };
        if let Some(mut c) = code {
            if c.line_table_len() > MAX_KEPT_LINE_TABLE {
                self.counts.line_tables_not_kept += 1;
                entry.table_dropped = true;
                c.forget_line_table();
            }
            entry.bytes += c.heap_bytes();
            entry.code = Some(Rc::new(c));
        }
        // Still no code object there changes no stack's names.
        if had_code || entry.code.is_some() {
            self.reads += 1;
        }
        if self.bytes + entry.bytes > CACHE_BYTES {
            self.flush();
        }
        self.bytes += entry.bytes;
        self.codes.insert(key, entry);
    }

    /// Empties the cache: what is still in use is read again when next met.
    fn flush(&mut self) {
        self.codes.clear();
        self.bytes = 0;
        self.counts.code_cache_flushes += 1;
    }
}

/// Reads one u64 at each address, in as few system calls as the readable
/// addresses allow (process_vm_readv stops at the first that is not).
fn read_words(pid: u32, addrs: impl Iterator<Item = u64>) -> Vec<Option<u64>> {
    let addrs: Vec<u64> = addrs.collect();
    let mut out = vec![None; addrs.len()];
    let mut values = vec![0u64; addrs.len()];
    let mut at = 0;
    while at < addrs.len() {
        // IOV_MAX is 1024 on Linux.
        let end = (at + 1024).min(addrs.len());
        let local: Vec<libc::iovec> = values[at..end].iter_mut().map(|v| libc::iovec { iov_base: (v as *mut u64).cast(), iov_len: 8 }).collect();
        let remote: Vec<libc::iovec> = addrs[at..end].iter().map(|&a| libc::iovec { iov_base: a as *mut libc::c_void, iov_len: 8 }).collect();
        // SAFETY: each local iovec points at one u64 of `values`, which
        // outlives the call; remote addresses are only read by the kernel.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, local.as_ptr(), local.len() as _, remote.as_ptr(), remote.len() as _, 0) };
        let whole = if n > 0 { n as usize / 8 } else { 0 };
        for i in 0..whole {
            out[at + i] = Some(values[at + i]);
        }
        // The one after the last read is unreadable (or the call failed):
        // skip it and go on.
        at += whole + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses of this process, readable and not, in one batch.
    #[test]
    fn reads_words_in_a_batch_past_unreadable_ones() {
        let words = [11u64, 22, 33];
        let addrs = [&words[0] as *const u64 as u64, 8, &words[1] as *const u64 as u64, u64::MAX - 7, &words[2] as *const u64 as u64];
        let got = read_words(std::process::id(), addrs.into_iter());
        assert_eq!(got, vec![Some(11), None, Some(22), None, Some(33)]);
    }
}
