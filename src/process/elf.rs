//! The few facts pytrace needs from an ELF file: symbol addresses, how
//! addresses map to file offsets, its USDT probes (.note.stapsdt), and the
//! shared libraries it asks for.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use goblin::elf::{program_header::PT_LOAD, Elf};

use super::files::{self, CheckedFile, FileId};

/// The instruction that starts functions in CET builds (Debian's 3.13+).
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

#[derive(Debug, Clone)]
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
    executable: bool,
}

/// A USDT probe from .note.stapsdt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// Link-time address of the probe's nop.
    pub pc: u64,
    /// Address of its semaphore, 0 if it has none.
    pub semaphore: u64,
}

pub struct ElfFile {
    /// A path that reaches this very file (/proc/self/fd/N of the checked
    /// file held open here): what libbpf attaches uprobes to.
    pub path: PathBuf,
    /// What the target calls it, for messages.
    pub name: String,
    /// Its identity: the target's mapping of it must have the same.
    pub id: FileId,
    /// Held open so that `path` stays this file.
    _file: CheckedFile,
    bytes: files::FileImage,
    /// Link-time address and size of each symbol.
    symbols: HashMap<String, (u64, u64)>,
    segments: Vec<Segment>,
    pub is_shared_object: bool,
    pub needed: Vec<String>,
    /// DT_RPATH (searched before LD_LIBRARY_PATH) and DT_RUNPATH (after it).
    pub rpaths: Vec<String>,
    pub runpaths: Vec<String>,
    pub usdt_probes: Vec<UsdtProbe>,
    /// R_X86_64_RELATIVE relocations (.rela.dyn) of a PIE or shared
    /// object: the link-time address the loader writes at each place. A
    /// table of addresses (the interpreter's opcode handlers) is zeros in
    /// such a file and holds these addends once loaded.
    relative_relocs: HashMap<u64, u64>,
    /// Each named section's file offset, size and link-time address (the
    /// few a reader looks up by name, such as _asyncio's `.AsyncioDebug`).
    sections: Vec<(String, u64, u64, u64)>,
    /// R_X86_64_JUMP_SLOT relocations (.rela.plt): the imported function
    /// each names, and the GOT slot the loader writes its address to, which
    /// the function's PLT stub jumps through.
    plt_slots: HashMap<String, u64>,
    /// R_X86_64_GLOB_DAT relocations (.rela.dyn): a function's GOT slot
    /// that a `.plt.got` stub jumps through (a call of an exported function
    /// of the file itself, bound at load: libpython's PyMem_RawMalloc).
    got_slots: HashMap<String, u64>,
    /// The addresses .dynsym defines: what the file exports (a static
    /// function never is).
    exported: std::collections::HashSet<u64>,
}

/// x86-64's "base address plus addend" relocation type.
const R_X86_64_RELATIVE: u32 = 8;
/// x86-64's "the address of a symbol, in a GOT slot of the PLT" type.
const R_X86_64_JUMP_SLOT: u32 = 7;
/// x86-64's "the address of a symbol, in a GOT slot" type.
const R_X86_64_GLOB_DAT: u32 = 6;

impl ElfFile {
    /// A file on pytrace's own command line (`info --binary`, tests).
    pub fn open(path: &Path) -> Result<Self> {
        Self::read(files::open_local(path)?)
    }

    /// Reads and parses a checked file (src/process/files.rs), keeping it open.
    pub fn read(file: CheckedFile) -> Result<Self> {
        let bytes = super::elf_image::read_declared(&file)?;
        let name = file.name.clone();
        let (symbols, segments, is_shared_object, needed, rpaths, runpaths, usdt_probes, relative_relocs, sections, plt_slots, got_slots, exported) = {
            let elf = Elf::parse(&bytes).with_context(|| format!("{name} is not an ELF file"))?;
            let mut symbols = HashMap::new();
            for (syms, strtab) in [(&elf.dynsyms, &elf.dynstrtab), (&elf.syms, &elf.strtab)] {
                for sym in syms.iter().filter(|s| s.st_value != 0) {
                    if let Some(name) = strtab.get_at(sym.st_name) {
                        symbols.entry(name.to_string()).or_insert((sym.st_value, sym.st_size));
                    }
                }
            }
            let segments = elf
                .program_headers
                .iter()
                .filter(|ph| ph.p_type == PT_LOAD)
                .map(|ph| Segment { vaddr: ph.p_vaddr, offset: ph.p_offset, filesz: ph.p_filesz, executable: ph.is_executable() })
                .collect();
            let needed = elf.libraries.iter().map(|s| s.to_string()).collect();
            let split = |paths: &[&str]| paths.iter().flat_map(|s| s.split(':')).map(str::to_string).collect::<Vec<_>>();
            // The loader ignores DT_RPATH where DT_RUNPATH is present.
            let (rpaths, runpaths) =
                if elf.runpaths.is_empty() { (split(&elf.rpaths), Vec::new()) } else { (Vec::new(), split(&elf.runpaths)) };
            let usdt_probes = parse_usdt_notes(&elf, &bytes);
            let relative_relocs = elf
                .dynrelas
                .iter()
                .filter(|r| r.r_type == R_X86_64_RELATIVE)
                .filter_map(|r| Some((r.r_offset, u64::try_from(r.r_addend?).ok()?)))
                .collect();
            let sections = elf
                .section_headers
                .iter()
                .filter(|sh| sh.sh_type != goblin::elf::section_header::SHT_NOBITS)
                .filter_map(|sh| Some((elf.shdr_strtab.get_at(sh.sh_name)?.to_string(), sh.sh_offset, sh.sh_size, sh.sh_addr)))
                .collect();
            let plt_slots = elf
                .pltrelocs
                .iter()
                .filter(|r| r.r_type == R_X86_64_JUMP_SLOT)
                .filter_map(|r| Some((elf.dynstrtab.get_at(elf.dynsyms.get(r.r_sym)?.st_name)?.to_string(), r.r_offset)))
                .collect();
            let got_slots = elf
                .dynrelas
                .iter()
                .filter(|r| r.r_type == R_X86_64_GLOB_DAT)
                .filter_map(|r| Some((elf.dynstrtab.get_at(elf.dynsyms.get(r.r_sym)?.st_name)?.to_string(), r.r_offset)))
                .collect();
            let exported = elf.dynsyms.iter().filter(|s| s.st_value != 0).map(|s| s.st_value).collect();
            (symbols, segments, elf.header.e_type == goblin::elf::header::ET_DYN, needed, rpaths, runpaths, usdt_probes, relative_relocs, sections, plt_slots, got_slots, exported)
        };
        Ok(Self {
            path: file.fd_path(),
            name,
            id: file.id,
            _file: file,
            bytes,
            symbols,
            segments,
            is_shared_object,
            needed,
            rpaths,
            runpaths,
            usdt_probes,
            relative_relocs,
            sections,
            plt_slots,
            got_slots,
            exported,
        })
    }

    /// The bytes a section holds in the file, by name (None: no such
    /// section, or one that runs past the file's end).
    pub fn section(&self, name: &str) -> Option<&[u8]> {
        let &(_, offset, size, _) = self.sections.iter().find(|(n, ..)| n == name)?;
        self.bytes.get(usize::try_from(offset).ok()?..usize::try_from(offset.checked_add(size)?).ok()?)
    }

    /// A section's link-time address and the bytes it holds in the file.
    pub fn section_at(&self, name: &str) -> Option<(u64, &[u8])> {
        let &(_, _, _, address) = self.sections.iter().find(|(n, ..)| n == name)?;
        Some((address, self.section(name)?))
    }

    /// Whether .dynsym names something at `address` (an exported function).
    pub fn is_exported(&self, address: u64) -> bool {
        self.exported.contains(&address)
    }

    /// The GOT slot through which the PLT stub of imported function `name`
    /// jumps (its R_X86_64_JUMP_SLOT relocation), if the file imports it so.
    pub fn plt_slot(&self, name: &str) -> Option<u64> {
        self.plt_slots.get(name).copied()
    }

    /// The GOT slot of function `name` a `.plt.got` stub jumps through
    /// (its R_X86_64_GLOB_DAT relocation), if the file has one.
    pub fn got_slot(&self, name: &str) -> Option<u64> {
        self.got_slots.get(name).copied()
    }

    /// Link-time address of a symbol, from .dynsym or .symtab.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).map(|&(addr, _)| addr)
    }

    /// A function symbol's machine code, as far as the symbol's size says
    /// (at most `max` bytes).
    pub fn function_code(&self, name: &str, max: usize) -> Option<&[u8]> {
        let &(addr, size) = self.symbols.get(name)?;
        let len = (size as usize).clamp(1, max);
        let segment = self.segment_range(addr)?;
        self.read_static(addr, len.min((segment.end - addr) as usize)).ok()
    }

    /// File offset of a link-time address, as uprobes want it.
    pub fn file_offset(&self, vaddr: u64) -> Result<u64> {
        self.segments
            .iter()
            .find(|s| vaddr >= s.vaddr && vaddr < s.vaddr + s.filesz)
            .map(|s| vaddr - s.vaddr + s.offset)
            .with_context(|| format!("address {vaddr:#x} is in no loaded segment of {}", self.name))
    }

    /// Bytes stored in the file at a link-time address (read-only data).
    pub fn read_static(&self, vaddr: u64, len: usize) -> Result<&[u8]> {
        let offset = self.file_offset(vaddr)? as usize;
        self.bytes
            .get(offset..offset + len)
            .with_context(|| format!("{len} bytes at {vaddr:#x} run past the end of {}", self.name))
    }

    /// Difference between run-time and link-time addresses, given where the
    /// file's first page is mapped.
    pub fn load_bias(&self, first_page: u64) -> Result<u64> {
        let Some(first) = self.segments.iter().find(|s| s.offset == 0).or(self.segments.first()) else {
            bail!("{} has no loadable segment", self.name);
        };
        Ok(first_page.wrapping_sub(first.vaddr & !0xfff))
    }

    /// The bytes of each loadable segment that holds no code: read-only
    /// data (strings such as PY_VERSION) and data, as declared, never the
    /// rest of the file (which pytrace does not read, see elf_image.rs).
    pub fn data_segments(&self) -> impl Iterator<Item = &[u8]> {
        self.segments.iter().filter(|s| !s.executable).filter_map(|s| self.bytes.get(s.offset as usize..s.offset.checked_add(s.filesz)? as usize))
    }

    /// The loadable segment holding `vaddr`, as link-time addresses.
    pub fn segment_range(&self, vaddr: u64) -> Option<std::ops::Range<u64>> {
        self.segments.iter().map(|s| s.vaddr..s.vaddr + s.filesz).find(|r| r.contains(&vaddr))
    }

    /// Each loadable segment's link-time address and its bytes in the file.
    pub fn segment_bytes(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.segments
            .iter()
            .filter_map(|s| Some((s.vaddr, self.bytes.get(s.offset as usize..(s.offset + s.filesz) as usize)?)))
    }

    /// Each loadable segment's link-time address and its 8-byte words as
    /// the loader leaves them, less the load bias: a word a RELATIVE
    /// relocation targets holds its addend (a link-time address), as the
    /// same table does in the file of a non-PIE executable.
    pub fn segment_words(&self) -> impl Iterator<Item = (u64, Vec<u64>)> + '_ {
        self.segment_bytes().map(|(vaddr, bytes)| {
            // From the first 8-byte aligned address: tables of pointers are aligned.
            let skip = (vaddr.wrapping_neg() % 8) as usize;
            let start = vaddr + skip as u64;
            let words = bytes
                .get(skip..)
                .unwrap_or_default()
                .chunks_exact(8)
                .enumerate()
                .map(|(i, w)| {
                    let at = start + 8 * i as u64;
                    self.relative_relocs.get(&at).copied().unwrap_or_else(|| u64::from_le_bytes(w.try_into().unwrap()))
                })
                .collect();
            (start, words)
        })
    }

    /// The 8-byte word at link-time address `vaddr` as the loader leaves
    /// it, less the load bias (a RELATIVE relocation's addend where one
    /// targets it): a static initialiser's pointer before the process runs.
    pub fn initial_word(&self, vaddr: u64) -> Option<u64> {
        if let Some(&addend) = self.relative_relocs.get(&vaddr) {
            return Some(addend);
        }
        Some(u64::from_le_bytes(self.read_static(vaddr, 8).ok()?.try_into().ok()?))
    }

    pub fn has_usdt(&self, provider: &str, name: &str) -> bool {
        self.usdt_probes.iter().any(|p| p.provider == provider && p.name == name)
    }
}

/// Each stapsdt note's descriptor is three addresses (pc, base, semaphore)
/// followed by NUL-terminated provider, name and argument strings.
fn parse_usdt_notes(elf: &Elf, bytes: &[u8]) -> Vec<UsdtProbe> {
    let mut probes = Vec::new();
    let Some(notes) = elf.iter_note_sections(bytes, Some(".note.stapsdt")) else {
        return probes;
    };
    for note in notes.flatten() {
        if note.n_type != 3 || note.desc.len() < 24 {
            continue;
        }
        let word = |i: usize| u64::from_le_bytes(note.desc[i * 8..i * 8 + 8].try_into().unwrap());
        let mut strings = note.desc[24..].split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned());
        let (Some(provider), Some(name)) = (strings.next(), strings.next()) else { continue };
        probes.push(UsdtProbe { provider, name, pc: word(0), semaphore: word(2) });
    }
    probes
}

/// Finds a shared library the way the dynamic loader of process `pid` (at
/// its exec, or pytrace itself) will, enough for CPython: RPATH, the
/// process's LD_LIBRARY_PATH, RUNPATH (both with $ORIGIN; a LD_LIBRARY_PATH
/// pointing at another copy of libpython wins over the RUNPATH pyenv's
/// executables carry), ld.so.conf, then the default directories, all inside
/// its root (see files::open_in_root: no path leads out of it). Returns the
/// path as the process names it.
pub fn find_library(exe: &ElfFile, exe_dir: &Path, name: &str, pid: u32) -> Option<String> {
    let origin = |d: &String| d.replace("$ORIGIN", &exe_dir.to_string_lossy()).replace("${ORIGIN}", &exe_dir.to_string_lossy());
    let mut dirs: Vec<String> = exe.rpaths.iter().map(origin).collect();
    let ld_library_path = environment_variable(pid, "LD_LIBRARY_PATH").unwrap_or_default();
    dirs.extend(ld_library_path.split(':').filter(|d| !d.is_empty()).map(str::to_string));
    dirs.extend(exe.runpaths.iter().map(origin));
    dirs.extend(ld_so_conf_dirs(pid));
    for d in ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"] {
        dirs.push(d.to_string());
    }
    dirs.iter().map(|d| format!("{d}/{name}")).find(|p| files::exists_in_root(pid, p))
}

/// A process's environment is at most this large to pytrace (the kernel
/// allows more; the loader variables sit among the first ones in practice).
const MAX_ENVIRON_BYTES: u64 = 1 << 20;

/// One variable of process `pid`'s environment as it was at its exec (the
/// loader reads it then, as CPython reads PYTHONMALLOC).
pub fn environment_variable(pid: u32, name: &str) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/environ")).ok()?.take(MAX_ENVIRON_BYTES).read_to_end(&mut bytes).ok()?;
    let prefix = format!("{name}=");
    bytes.split(|&b| b == 0).find_map(|entry| entry.strip_prefix(prefix.as_bytes())).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// ld.so.conf and ld.so.preload are at most this large; more is not a
/// loader's configuration.
const MAX_CONF_BYTES: u64 = 1 << 20;

/// A loader configuration file inside process `pid`'s root, as text; None
/// if missing, unreadable or larger than MAX_CONF_BYTES (checked before
/// reading: a larger "configuration" is never read).
fn loader_conf(pid: u32, path: &str) -> Option<String> {
    let file = files::open_in_root(pid, path).ok()?;
    let bytes = (file.size <= MAX_CONF_BYTES).then(|| file.read_all().ok())??;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The first library that process `pid`'s loader preloads (LD_PRELOAD in
/// its environment at exec, /etc/ld.so.preload in its root) and that
/// defines `symbol`, found as find_library finds one. A library pytrace
/// cannot find or read is not assumed to.
pub fn preloaded_definer(exe: &ElfFile, exe_dir: &Path, symbol: &str, pid: u32) -> Option<String> {
    let from_env = environment_variable(pid, "LD_PRELOAD").unwrap_or_default();
    let from_file = loader_conf(pid, "/etc/ld.so.preload").unwrap_or_default();
    let names = from_env.split([':', ' ']).chain(from_file.split_whitespace()).filter(|n| !n.is_empty());
    names.map(str::to_string).find(|name| {
        let path = if name.contains('/') { Some(name.clone()) } else { find_library(exe, exe_dir, name, pid) };
        let Some(file) = path.and_then(|p| files::open_in_root(pid, &p).ok()) else { return false };
        ElfFile::read(file).is_ok_and(|lib| lib.symbol(symbol).is_some())
    })
}

fn ld_so_conf_dirs(pid: u32) -> Vec<String> {
    let mut dirs = Vec::new();
    let read = |path: &str| loader_conf(pid, path);
    let mut texts = vec![read("/etc/ld.so.conf")];
    let mut confs: Vec<String> = files::list_dir_in_root(pid, "/etc/ld.so.conf.d", 256).iter().map(|n| format!("/etc/ld.so.conf.d/{n}")).collect();
    confs.sort();
    texts.extend(confs.iter().map(|c| read(c)));
    for text in texts.into_iter().flatten() {
        for line in text.lines().map(str::trim) {
            if line.starts_with('/') {
                dirs.push(line.to_string());
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_symbols_and_maps_them_to_file_offsets() {
        let me = ElfFile::open(&std::env::current_exe().unwrap()).unwrap();
        let main = me.symbol("main").expect("a test binary has main");
        let offset = me.file_offset(main).unwrap();
        assert!(offset > 0 && offset < std::fs::metadata(&me.path).unwrap().len());
        assert!(me.function_code("main", 64).is_some_and(|code| !code.is_empty() && code.len() <= 64));
        assert!(me.symbol("no_such_symbol_anywhere").is_none());
    }

    #[test]
    fn finds_libc_like_the_loader() {
        let me = ElfFile::open(&std::env::current_exe().unwrap()).unwrap();
        assert!(me.needed.iter().any(|n| n.starts_with("libc.so")));
        let libc = find_library(&me, Path::new("/"), "libc.so.6", std::process::id()).expect("libc is installed");
        assert!(Path::new(&libc).exists());
    }
}
