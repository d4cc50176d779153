//! One ELF file with code a target runs (the executable, libpython, a C
//! extension, libc, the vDSO): what unwinding through it and naming its
//! functions need, read once however many processes map it.

use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::process::files::CheckedFile;
use gimli::{BaseAddresses, EhFrame, EhFrameHdr, EndianSlice, LittleEndian, UnwindSection};
use goblin::elf::{program_header::PF_X, program_header::PT_LOAD, Elf};

/// Section bytes handed to framehop; shared by every process's copy of the
/// module.
pub type Bytes = Arc<[u8]>;

pub struct ModuleFile {
    /// The file name, as reports show it (`libz.so.1.2.13`).
    pub name: String,
    /// Where blazesym opens it (/proc/self/fd/N of `file`); None for the
    /// vDSO, which is only in memory.
    pub path: Option<PathBuf>,
    /// The checked file, held open so that `path` stays this very file.
    file: Option<CheckedFile>,
    /// (p_vaddr - p_offset) of each executable segment with its file range:
    /// maps a mapping's file offset to link-time addresses.
    exec_segments: Vec<(Range<u64>, u64)>,
    pub text: Option<(Range<u64>, Bytes)>,
    pub eh_frame: Option<(Range<u64>, Bytes)>,
    pub eh_frame_hdr: Option<(Range<u64>, Bytes)>,
    pub got: Option<Range<u64>>,
    /// Function symbols (start, size, name), for files blazesym cannot
    /// open (the vDSO); empty for the others.
    own_symbols: Vec<(u64, u64, String)>,
    /// Link-time address -> start of the function whose unwind entry (FDE)
    /// covers it, None where no entry does.
    fde_starts: RefCell<HashMap<u64, Option<u64>>>,
    /// _PyEval_EvalFrameDefault's (start, size), if this file has it.
    eval_function: Option<(u64, u64)>,
    /// Starts of the unwind entries of its cold parts (see eval_cold_parts).
    eval_cold: OnceCell<HashSet<u64>>,
}

/// Distinct jump targets from the interpreter loop into one unnamed unwind
/// entry that make it the loop's cold part rather than a tail-called
/// function (which is jumped to at its start only).
const COLD_PART_JUMPS: usize = 8;

impl ModuleFile {
    /// A file opened through the target (src/process/files.rs).
    pub fn read(file: CheckedFile, name: String) -> Result<Self> {
        let bytes = crate::process::elf_image::read_declared(&file)?;
        let mut module = Self::parse(&bytes, name, Some(file.fd_path()), false)?;
        module.file = Some(file);
        Ok(module)
    }

    /// The vDSO, from the target's memory: its ELF image is mapped whole.
    pub fn from_memory(bytes: &[u8]) -> Result<Self> {
        Self::parse(bytes, "[vdso]".into(), None, true)
    }

    fn parse(bytes: &[u8], name: String, path: Option<PathBuf>, own_symbols: bool) -> Result<Self> {
        let elf = Elf::parse(bytes).with_context(|| format!("{name} is not an ELF file"))?;
        let exec_segments = elf
            .program_headers
            .iter()
            .filter(|ph| ph.p_type == PT_LOAD && ph.p_flags & PF_X != 0)
            .map(|ph| (ph.p_offset..ph.p_offset + ph.p_filesz, ph.p_vaddr.wrapping_sub(ph.p_offset)))
            .collect();
        let section = |want: &str| {
            elf.section_headers.iter().find(|sh| elf.shdr_strtab.get_at(sh.sh_name) == Some(want)).map(|sh| {
                let range = sh.sh_addr..sh.sh_addr + sh.sh_size;
                let data = if sh.sh_type == goblin::elf::section_header::SHT_NOBITS {
                    None
                } else {
                    bytes.get(sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize).map(Bytes::from)
                };
                (range, data)
            })
        };
        let with_data = |want: &str| section(want).and_then(|(r, d)| Some((r, d?)));
        let symbols = if own_symbols {
            let mut syms: Vec<(u64, u64, String)> = elf
                .dynsyms
                .iter()
                .filter(|s| s.is_function() && s.st_value != 0)
                .filter_map(|s| Some((s.st_value, s.st_size, elf.dynstrtab.get_at(s.st_name)?.to_string())))
                .collect();
            syms.sort();
            syms
        } else {
            Vec::new()
        };
        let eval_function = elf
            .dynsyms
            .iter()
            .find(|s| s.is_function() && elf.dynstrtab.get_at(s.st_name) == Some(crate::python::EVAL_FRAME_SYMBOL))
            .map(|s| (s.st_value, s.st_size));
        Ok(ModuleFile {
            name,
            path,
            file: None,
            exec_segments,
            text: with_data(".text"),
            eh_frame: with_data(".eh_frame"),
            eh_frame_hdr: with_data(".eh_frame_hdr"),
            got: section(".got").map(|(r, _)| r),
            own_symbols: symbols,
            fde_starts: RefCell::new(HashMap::new()),
            eval_function,
            eval_cold: OnceCell::new(),
        })
    }

    /// Whether the unwind entry starting at `fde_start` is a cold part of
    /// _PyEval_EvalFrameDefault: code the compiler split off the function
    /// (`.cold`), which a stripped file leaves unnamed. Debian's 3.13-3.15
    /// (GCC 16, PGO) run much of the loop there: without this, their eval
    /// frames were not recognised and --native paired nothing.
    pub fn is_eval_cold_part(&self, fde_start: u64) -> bool {
        self.eval_cold.get_or_init(|| self.eval_cold_parts()).contains(&fde_start)
    }

    /// The unwind entries the loop jumps into (jcc rel32, jmp rel32, read
    /// off its bytes) at COLD_PART_JUMPS or more distinct places.
    fn eval_cold_parts(&self) -> HashSet<u64> {
        let (Some((start, size)), Some((text, bytes))) = (self.eval_function, &self.text) else { return HashSet::new() };
        let (Some(from), Some(to)) = (start.checked_sub(text.start), (start + size).checked_sub(text.start)) else { return HashSet::new() };
        let Some(code) = bytes.get(from as usize..(to as usize).min(bytes.len())) else { return HashSet::new() };
        let mut targets: HashMap<u64, HashSet<u64>> = HashMap::new();
        for i in 0..code.len() {
            let (len, rel) = match code[i..] {
                [0x0f, 0x80..=0x8f, a, b, c, d, ..] => (6, i32::from_le_bytes([a, b, c, d])),
                [0xe9, a, b, c, d, ..] => (5, i32::from_le_bytes([a, b, c, d])),
                _ => continue,
            };
            let target = (start + i as u64 + len).wrapping_add(rel as i64 as u64);
            if (start..start + size).contains(&target) || !text.contains(&target) {
                continue;
            }
            if let Some(fde) = self.function_start(target) {
                targets.entry(fde).or_default().insert(target);
            }
        }
        targets.into_iter().filter(|(_, t)| t.len() >= COLD_PART_JUMPS).map(|(fde, _)| fde).collect()
    }

    /// Run-time minus link-time addresses for a mapping of this file that
    /// starts at `start` with file offset `offset`.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        // The segment this mapping holds (mappings start at a page boundary at or
        // below the segment's own file offset).
        let (_, delta) = self.exec_segments.iter().find(|(file, _)| file.start < offset + 4096 && offset < file.end)?;
        // Link-time address of the mapping's first byte: offset + delta.
        Some(start.wrapping_sub(offset.wrapping_add(*delta)))
    }

    /// The file it was read from, with its identity (device, inode, size,
    /// mtime); None for the vDSO.
    pub fn file(&self) -> Option<&CheckedFile> {
        self.file.as_ref()
    }

    /// Link-time addresses from the lowest to the highest byte of its
    /// executable segments: where its unwind entries may point.
    pub fn code_span(&self) -> Option<Range<u64>> {
        let start = self.exec_segments.iter().map(|(file, delta)| file.start.wrapping_add(*delta)).min()?;
        let end = self.exec_segments.iter().map(|(file, delta)| file.end.wrapping_add(*delta)).max()?;
        Some(start..end)
    }

    /// The start of the function whose unwind entry covers `svma` (a
    /// link-time address), or None: code without unwind information, which
    /// must not be unwound through by guess.
    pub fn function_start(&self, svma: u64) -> Option<u64> {
        if let Some(&known) = self.fde_starts.borrow().get(&svma) {
            return known;
        }
        let start = self.lookup_fde(svma);
        let mut cache = self.fde_starts.borrow_mut();
        if cache.len() > 100_000 {
            cache.clear();
        }
        cache.insert(svma, start);
        start
    }

    fn lookup_fde(&self, svma: u64) -> Option<u64> {
        let (hdr_range, hdr) = self.eh_frame_hdr.as_ref()?;
        let (eh_range, eh) = self.eh_frame.as_ref()?;
        let mut bases = BaseAddresses::default().set_eh_frame_hdr(hdr_range.start).set_eh_frame(eh_range.start);
        if let Some((text, _)) = &self.text {
            bases = bases.set_text(text.start);
        }
        if let Some(got) = &self.got {
            bases = bases.set_got(got.start);
        }
        let hdr = EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8).ok()?;
        let eh_frame = EhFrame::new(eh, LittleEndian);
        let fde = hdr.table()?.fde_for_address(&eh_frame, &bases, svma, EhFrame::<EndianSlice<LittleEndian>>::cie_from_offset).ok()?;
        Some(fde.initial_address())
    }

    /// The function holding `svma`, from this file's own symbols (the vDSO's).
    pub fn own_symbol(&self, svma: u64) -> Option<&str> {
        let i = self.own_symbols.partition_point(|(start, _, _)| *start <= svma).checked_sub(1)?;
        let (start, size, name) = &self.own_symbols[i];
        (svma < start + size.max(&1)).then_some(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pytrace's own executable: built with unwind tables, like every
    /// Debian binary.
    #[test]
    fn finds_unwind_entries_and_the_load_bias_of_this_executable() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let m = ModuleFile::read(crate::process::files::open_local(&exe).unwrap(), "pytrace".into()).unwrap();
        assert!(m.eh_frame.is_some() && m.eh_frame_hdr.is_some());
        let here = finds_unwind_entries_and_the_load_bias_of_this_executable as fn() as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe_name = exe.to_string_lossy().to_string();
        let (start, offset) = maps
            .lines()
            .filter(|l| l.ends_with(&exe_name) && l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (u64::from_str_radix(f[0].split('-').next().unwrap(), 16).unwrap(), u64::from_str_radix(f[2], 16).unwrap())
            })
            .next()
            .unwrap();
        let bias = m.bias(start, offset).unwrap();
        let svma = here - bias;
        assert!(m.text.as_ref().unwrap().0.contains(&svma), "{svma:#x} in .text");
        let fn_start = m.function_start(svma).expect("an unwind entry covers this test function");
        assert!(fn_start <= svma && svma - fn_start < 4096, "{fn_start:#x} starts the function holding {svma:#x}");
    }
}
