//! Which bytes of a target's ELF file pytrace reads: only what the file
//! declares and pytrace uses, each range bounded by what declares it.
//!
//! A target's file can be huge and still a working binary (a Python with
//! 480 MB of data appended, or a build with giant .debug_* sections), so
//! reading it whole (as pytrace did, up to 512 MiB) let a target decide
//! how much memory every pytrace run spends. Read here:
//! - the ELF header, then its program and section header tables, each
//!   bounded by its declared count and entry size;
//! - the file range of every loadable segment (code and data: symbols,
//!   the opcode table, version strings and unwind tables live there), the
//!   dynamic and note segments;
//! - the section-name table, the symbol tables with their string tables,
//!   and the note sections (.note.stapsdt is not loaded).
//!
//! Nothing else (.debug_*, .comment, appended data) is read. Every range
//! must lie inside the file, and together they are capped by
//! files::MAX_READ_BYTES; else one sentence names the file and the range.

use std::ops::Range;

use anyhow::{bail, Result};
use goblin::container::{Container, Ctx};
use goblin::elf::program_header::{ProgramHeader, PT_DYNAMIC, PT_INTERP, PT_LOAD, PT_NOTE};
use goblin::elf::section_header::{SectionHeader, SHT_DYNSYM, SHT_NOBITS, SHT_NOTE, SHT_SYMTAB};
use goblin::elf::Elf;

use super::files::{CheckedFile, FileImage};

/// More section headers than this is no file pytrace meets (libpython has
/// some 40; the extended numbering allows millions).
const MAX_SECTIONS: u64 = 1 << 16;

/// The ranges of `file` pytrace uses, read into an image at their own
/// offsets (zeros elsewhere, costing nothing); goblin parses the image.
pub fn read_declared(file: &CheckedFile) -> Result<FileImage> {
    let not_elf = || anyhow::anyhow!("{} is not an ELF file", file.name);
    // The 64-byte header of a 64-bit file; a 32-bit one's is shorter.
    let head = file.read_at(0, file.size.min(64) as usize, "ELF header")?;
    let header = Elf::parse_header(&head).map_err(|_| not_elf())?;
    let container = header.container().map_err(|_| not_elf())?;
    let ctx = Ctx::new(container, header.endianness().map_err(|_| not_elf())?);
    let header_len = if container == Container::Big { 64 } else { 52 };
    let mut ranges = vec![("ELF header".to_string(), 0..header_len)];

    let phdr_size = ProgramHeader::size(ctx) as u64;
    let phdrs = if header.e_phnum == 0 {
        Vec::new()
    } else {
        if u64::from(header.e_phentsize) != phdr_size {
            bail!("{}'s program headers are {} bytes each, not the {phdr_size} of its class", file.name, header.e_phentsize);
        }
        let range = bounded(file, "program header table", header.e_phoff, u64::from(header.e_phnum) * phdr_size)?;
        let bytes = file.read_at(range.start, (range.end - range.start) as usize, "program header table")?;
        ranges.push(("program header table".into(), range));
        ProgramHeader::parse(&bytes, 0, header.e_phnum as usize, ctx).map_err(|_| not_elf())?
    };
    for (i, ph) in phdrs.iter().enumerate() {
        let kind = match ph.p_type {
            PT_LOAD => "loadable",
            PT_DYNAMIC => "dynamic",
            PT_NOTE => "note",
            PT_INTERP => "interpreter",
            _ => continue,
        };
        let what = format!("{kind} segment {i}");
        ranges.push((what.clone(), bounded(file, &what, ph.p_offset, ph.p_filesz)?));
    }

    let shdr_size = SectionHeader::size(ctx) as u64;
    let shdrs = if header.e_shoff == 0 {
        Vec::new()
    } else {
        if u64::from(header.e_shentsize) != shdr_size {
            bail!("{}'s section headers are {} bytes each, not the {shdr_size} of its class", file.name, header.e_shentsize);
        }
        // A count of 0 with a table: the real count is section 0's size.
        let first = bounded(file, "section header table", header.e_shoff, shdr_size)?;
        let first = file.read_at(first.start, shdr_size as usize, "section header table")?;
        let first = SectionHeader::parse_from(&first, 0, 1, ctx).map_err(|_| not_elf())?;
        let count = if header.e_shnum == 0 { first.first().map_or(0, |s| s.sh_size) } else { u64::from(header.e_shnum) };
        if count > MAX_SECTIONS {
            bail!("{} declares {count} sections, more than the {MAX_SECTIONS} pytrace reads", file.name);
        }
        let range = bounded(file, "section header table", header.e_shoff, count * shdr_size)?;
        let bytes = file.read_at(range.start, (range.end - range.start) as usize, "section header table")?;
        ranges.push(("section header table".into(), range));
        SectionHeader::parse_from(&bytes, 0, count as usize, ctx).map_err(|_| not_elf())?
    };
    // Section names, for messages and for the readers that look sections up.
    let names = shdrs.get(usize::from(header.e_shstrndx)).filter(|_| header.e_shstrndx != 0).map(|sh| {
        bounded(file, "section-name table", sh.sh_offset, sh.sh_size).and_then(|r| file.read_at(r.start, (r.end - r.start) as usize, "section-name table").map(|b| (r, b)))
    });
    let names = match names.transpose()? {
        Some((range, bytes)) => {
            ranges.push(("section-name table".into(), range));
            bytes
        }
        None => Vec::new(),
    };
    let name_of = |sh: &SectionHeader| {
        names.get(sh.sh_name..).and_then(|s| s.split(|&b| b == 0).next()).map(|s| String::from_utf8_lossy(s).into_owned()).unwrap_or_default()
    };
    for sh in shdrs.iter().filter(|sh| matches!(sh.sh_type, SHT_SYMTAB | SHT_DYNSYM | SHT_NOTE)) {
        let what = format!("section {}", name_of(sh));
        ranges.push((what.clone(), bounded(file, &what, sh.sh_offset, sh.sh_size)?));
        if sh.sh_type != SHT_NOTE {
            // Its string table.
            if let Some(strings) = shdrs.get(sh.sh_link as usize).filter(|s| s.sh_type != SHT_NOBITS) {
                let what = format!("section {}", name_of(strings));
                ranges.push((what.clone(), bounded(file, &what, strings.sh_offset, strings.sh_size)?));
            }
        }
    }
    file.read_ranges(&ranges)
}

/// `len` bytes at `offset` as a range, if they lie inside `file` and
/// within the read cap; else the sentence that says which do not.
fn bounded(file: &CheckedFile, what: &str, offset: u64, len: u64) -> Result<Range<u64>> {
    let cap = super::files::MAX_READ_BYTES;
    match offset.checked_add(len) {
        Some(end) if end <= file.size && len <= cap => Ok(offset..end),
        Some(end) if end <= file.size => bail!("{}'s {what} declares {} MiB, more than the {} MiB pytrace reads of one file", file.name, len >> 20, cap >> 20),
        _ => bail!("{}'s {what} ({len} bytes at offset {offset}) runs past its end ({} bytes)", file.name, file.size),
    }
}
