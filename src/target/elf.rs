//! The few facts pytrace needs from an ELF file: symbol addresses, how
//! addresses map to file offsets, its USDT probes (.note.stapsdt), and the
//! shared libraries it asks for.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use goblin::elf::{program_header::PT_LOAD, Elf};

/// The instruction that starts functions in CET builds (Debian's 3.13+).
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

#[derive(Debug, Clone)]
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
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
    /// Where we opened it (in our mount namespace).
    pub path: PathBuf,
    bytes: Vec<u8>,
    symbols: HashMap<String, u64>,
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
}

/// x86-64's "base address plus addend" relocation type.
const R_X86_64_RELATIVE: u32 = 8;

impl ElfFile {
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))?;
        let (symbols, segments, is_shared_object, needed, rpaths, runpaths, usdt_probes, relative_relocs) = {
            let elf = Elf::parse(&bytes).with_context(|| format!("{} is not an ELF file", path.display()))?;
            let mut symbols = HashMap::new();
            for (syms, strtab) in [(&elf.dynsyms, &elf.dynstrtab), (&elf.syms, &elf.strtab)] {
                for sym in syms.iter().filter(|s| s.st_value != 0) {
                    if let Some(name) = strtab.get_at(sym.st_name) {
                        symbols.entry(name.to_string()).or_insert(sym.st_value);
                    }
                }
            }
            let segments = elf
                .program_headers
                .iter()
                .filter(|ph| ph.p_type == PT_LOAD)
                .map(|ph| Segment { vaddr: ph.p_vaddr, offset: ph.p_offset, filesz: ph.p_filesz })
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
            (symbols, segments, elf.header.e_type == goblin::elf::header::ET_DYN, needed, rpaths, runpaths, usdt_probes, relative_relocs)
        };
        Ok(Self {
            path: path.to_path_buf(),
            bytes,
            symbols,
            segments,
            is_shared_object,
            needed,
            rpaths,
            runpaths,
            usdt_probes,
            relative_relocs,
        })
    }

    /// Link-time address of a symbol, from .dynsym or .symtab.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).copied()
    }

    /// File offset of a link-time address, as uprobes want it.
    pub fn file_offset(&self, vaddr: u64) -> Result<u64> {
        self.segments
            .iter()
            .find(|s| vaddr >= s.vaddr && vaddr < s.vaddr + s.filesz)
            .map(|s| vaddr - s.vaddr + s.offset)
            .with_context(|| format!("address {vaddr:#x} is in no loaded segment of {}", self.path.display()))
    }

    /// Bytes stored in the file at a link-time address (read-only data).
    pub fn read_static(&self, vaddr: u64, len: usize) -> Result<&[u8]> {
        let offset = self.file_offset(vaddr)? as usize;
        self.bytes
            .get(offset..offset + len)
            .with_context(|| format!("{len} bytes at {vaddr:#x} run past the end of {}", self.path.display()))
    }

    /// Difference between run-time and link-time addresses, given where the
    /// file's first page is mapped.
    pub fn load_bias(&self, first_page: u64) -> Result<u64> {
        let Some(first) = self.segments.iter().find(|s| s.offset == 0).or(self.segments.first()) else {
            bail!("{} has no loadable segment", self.path.display());
        };
        Ok(first_page.wrapping_sub(first.vaddr & !0xfff))
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
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

/// Finds a shared library the way the dynamic loader would, enough for
/// CPython: RPATH, LD_LIBRARY_PATH, RUNPATH (both with $ORIGIN; a
/// LD_LIBRARY_PATH pointing at another copy of libpython wins over the
/// RUNPATH pyenv's executables carry), ld.so.conf, then the default
/// directories. `root` prefixes every path (a target's /proc root, or ""
/// for ours).
pub fn find_library(exe: &ElfFile, exe_dir: &Path, name: &str, root: &str) -> Option<PathBuf> {
    let origin = |d: &String| d.replace("$ORIGIN", &exe_dir.to_string_lossy()).replace("${ORIGIN}", &exe_dir.to_string_lossy());
    let mut dirs: Vec<String> = exe.rpaths.iter().map(origin).collect();
    if let Ok(paths) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(paths.split(':').filter(|d| !d.is_empty()).map(str::to_string));
    }
    dirs.extend(exe.runpaths.iter().map(origin));
    dirs.extend(ld_so_conf_dirs(root));
    for d in ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"] {
        dirs.push(d.to_string());
    }
    dirs.iter().map(|d| PathBuf::from(format!("{root}{d}/{name}"))).find(|p| p.exists())
}

fn ld_so_conf_dirs(root: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut files = vec![PathBuf::from(format!("{root}/etc/ld.so.conf"))];
    if let Ok(entries) = std::fs::read_dir(format!("{root}/etc/ld.so.conf.d")) {
        let mut confs: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        confs.sort();
        files.extend(confs);
    }
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
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
        assert!(me.symbol("no_such_symbol_anywhere").is_none());
    }

    #[test]
    fn finds_libc_like_the_loader() {
        let me = ElfFile::open(&std::env::current_exe().unwrap()).unwrap();
        assert!(me.needed.iter().any(|n| n.starts_with("libc.so")));
        let libc = find_library(&me, Path::new("/"), "libc.so.6", "").expect("libc is installed");
        assert!(libc.exists());
    }
}
