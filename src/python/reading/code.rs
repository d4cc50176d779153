//! Code objects read from the target's memory by user space: name, file,
//! first line, and the line of an instruction (decoding the line table, an
//! unbounded loop that has no place in BPF).

use anyhow::{bail, Context, Result};

use crate::bpf::calls::types::str_kind;
use crate::python::layouts::{Layout, LineFormat, NO_FIELD};
use super::strings;
use crate::process::proc::Memory;

/// Line tables longer than this are not read (a garbage length).
const MAX_LINETABLE: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct Code {
    /// What identifies this code object at its address (see `still_at`).
    identity: (u64, u64),
    /// Its file name's address (co_filename).
    filename_at: u64,
    pub qualname: String,
    pub filename: String,
    pub firstlineno: u32,
    linetable: Vec<u8>,
    format: LineFormat,
}

/// Reads a compact str object.
pub fn read_str(mem: &Memory, layout: &Layout, addr: u64) -> Result<String> {
    let length = mem.read_u64(addr + layout.unicode_length as u64)?;
    let mut state = [0u8; 4];
    mem.read(addr + layout.unicode_state as u64, &mut state)?;
    let state = u32::from_ne_bytes(state);
    let shift = layout.unicode_kind_shift;
    let (kind, compact, ascii) = ((state >> shift) & 7, (state >> (shift + 3)) & 1 == 1, (state >> (shift + 4)) & 1 == 1);
    if !compact || length > 4096 || !matches!(kind, 1 | 2 | 4) {
        bail!("not a readable str at {addr:#x}");
    }
    let data = addr + if ascii { layout.unicode_ascii_data } else { layout.unicode_compact_data } as u64;
    let mut bytes = vec![0u8; (length * kind as u64) as usize];
    mem.read(data, &mut bytes)?;
    let captured_as = match (kind, ascii) {
        (1, true) => str_kind::STR_ASCII,
        (1, false) => str_kind::STR_UCS1,
        (2, _) => str_kind::STR_UCS2,
        _ => str_kind::STR_UCS4,
    };
    strings::decode(captured_as.0 as u8, length as u32, &bytes).with_context(|| format!("garbage in the str at {addr:#x}"))
}

impl Code {
    /// Reads the code object at `addr`, or fails if it is not one.
    pub fn read(mem: &Memory, layout: &Layout, addr: u64) -> Result<Self> {
        let field = |offset: u32| addr + offset as u64;
        let identity = identity(mem, layout, addr)?;
        let qualname = read_str(mem, layout, identity.0)?;
        let filename_at = mem.read_u64(field(layout.code_filename))?;
        let filename = read_str(mem, layout, filename_at)?;
        let mut line = [0u8; 4];
        mem.read(field(layout.code_firstlineno), &mut line)?;
        let table = mem.read_u64(field(layout.code_linetable))?;
        let size = mem.read_u64(table + layout.bytes_size as u64)?;
        if size > MAX_LINETABLE {
            bail!("line table of {size} bytes at {table:#x}");
        }
        let mut linetable = vec![0u8; size as usize];
        mem.read(table + layout.bytes_data as u64, &mut linetable)?;
        Ok(Code { identity, filename_at, qualname, filename, firstlineno: i32::from_ne_bytes(line).max(0) as u32, linetable, format: layout.line_format })
    }

    /// What identifies it at its address: its name's address and that
    /// str's hash. A freed code object's address is soon reused by another
    /// (measured: 300 functions made and freed in turn shared two
    /// addresses), so a cache of names by address must read these again
    /// and compare (the sampler does, for many objects at once).
    pub fn identity(&self) -> (u64, u64) {
        self.identity
    }

    /// Whether this is the object BPF sampled, by the name and file name
    /// pointers it read from it (module bodies share their name, `<module>`).
    pub fn is_sampled(&self, name: u64, file: u64) -> bool {
        (self.identity.0, self.filename_at) == (name, file)
    }

    /// Bytes this object holds on the heap (names and line table), for the
    /// sampler's cache budget.
    pub fn heap_bytes(&self) -> usize {
        self.qualname.len() + self.filename.len() + self.linetable.len()
    }

    pub fn line_table_len(&self) -> usize {
        self.linetable.len()
    }

    /// Drops the line table (a cache keeps a large one only while it is
    /// used): `line_at` then answers the first line.
    pub fn forget_line_table(&mut self) {
        self.linetable = Vec::new();
    }

    /// The source line of the instruction at byte offset `offset` in the
    /// bytecode, or the first line when the table does not say.
    pub fn line_at(&self, offset: u64) -> u32 {
        let line = match self.format {
            LineFormat::Lnotab => lnotab_line(&self.linetable, self.firstlineno as i64, offset),
            LineFormat::Linetable310 => linetable310_line(&self.linetable, self.firstlineno as i64, offset),
            LineFormat::Locations => locations_line(&self.linetable, self.firstlineno as i64, offset / 2),
        };
        line.filter(|&l| l > 0).map(|l| l as u32).unwrap_or(self.firstlineno)
    }
}

/// A code object's qualname address and that str's hash.
fn identity(mem: &Memory, layout: &Layout, addr: u64) -> Result<(u64, u64)> {
    let qualname = mem.read_u64(addr + layout.code_qualname as u64)?;
    Ok((qualname, mem.read_u64(qualname + layout.unicode_hash as u64)?))
}

/// Byte offset of a frame's instruction in its code's bytecode, from what
/// the sampler recorded: an address (3.11+) or f_lasti (3.9, 3.10).
pub fn instruction_offset(layout: &Layout, code_addr: u64, recorded: u64) -> u64 {
    if layout.code_code == NO_FIELD {
        // f_lasti, counted in the layout's instruction unit.
        let lasti = recorded as i32 as i64;
        return lasti.max(0) as u64 * layout.lasti_unit as u64;
    }
    recorded.saturating_sub(code_addr + layout.code_code as u64)
}

fn lnotab_line(table: &[u8], first: i64, offset: u64) -> Option<i64> {
    let (mut addr, mut line) = (0u64, first);
    for pair in table.chunks_exact(2) {
        addr += pair[0] as u64;
        if addr > offset {
            break;
        }
        line += pair[1] as i8 as i64;
    }
    Some(line)
}

fn linetable310_line(table: &[u8], first: i64, offset: u64) -> Option<i64> {
    let (mut start, mut line) = (0u64, first);
    for pair in table.chunks_exact(2) {
        let end = start + pair[0] as u64;
        let delta = pair[1] as i8;
        if delta != -128 {
            line += delta as i64;
        }
        if offset >= start && offset < end {
            return (delta != -128).then_some(line);
        }
        start = end;
    }
    None
}

/// PEP 657 location table (Objects/locations.md): entries of a header byte
/// `1 cccc lll` (code, length - 1 in code units) and code-specific data.
fn locations_line(table: &[u8], first: i64, unit: u64) -> Option<i64> {
    let mut at = 0;
    let mut next = || -> Option<u8> {
        let b = table.get(at).copied();
        at += 1;
        b
    };
    let (mut start, mut line) = (0u64, first);
    loop {
        let head = next()?;
        if head & 0x80 == 0 {
            return None; // not at an entry: a corrupt table
        }
        let code = (head >> 3) & 15;
        let end = start + (head & 7) as u64 + 1;
        let varint = |next: &mut dyn FnMut() -> Option<u8>| -> Option<u64> {
            let (mut value, mut shift) = (0u64, 0);
            loop {
                let b = next()?;
                value |= ((b & 63) as u64) << shift;
                if b & 64 == 0 {
                    return Some(value);
                }
                shift += 6;
                if shift > 60 {
                    return None;
                }
            }
        };
        let svarint = |v: u64| if v & 1 == 1 { -((v >> 1) as i64) } else { (v >> 1) as i64 };
        let has_line = match code {
            15 => false,
            14 => {
                line += svarint(varint(&mut next)?);
                for _ in 0..3 {
                    varint(&mut next)?;
                }
                true
            }
            13 => {
                line += svarint(varint(&mut next)?);
                true
            }
            10..=12 => {
                line += code as i64 - 10;
                next()?;
                next()?;
                true
            }
            _ => {
                next()?;
                true
            }
        };
        if unit >= start && unit < end {
            return has_line.then_some(line);
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    // From the same function compiled by each version, with the expected
    // lines printed by that version's own co_lines() / dis.findlinestarts:
    //   def f(x):            # line 2
    //       a = x + 1        # 3
    //       if a > 3:        # 4
    //           return [i    # 5
    //                   for i in range(a)]   # 6, then 5
    //       b = a * 2        # 7
    //       return b         # 8

    #[test]
    fn decodes_the_311_location_table() {
        let table = hex("8000d80809884189058041d80708883182758075f002011023f000011023dd191e987199189c18f003011023f100011023f400011023f000010923e00809884189058041d80b0c8048");
        // (start byte, end byte, line) from 3.11.2's co_lines().
        let expected = [(0, 2, 2), (2, 12, 3), (12, 24, 4), (24, 28, 5), (28, 56, 6), (56, 74, 5), (74, 84, 7), (84, 88, 8)];
        for (start, end, line) in expected {
            for offset in (start..end).step_by(2) {
                assert_eq!(locations_line(&table, 2, offset / 2), Some(line), "byte {offset}");
            }
        }
    }

    #[test]
    fn decodes_the_310_line_table_and_the_39_lnotab() {
        let table = hex("080108010601060106ff08020401");
        for (start, end, line) in [(0, 8, 3), (8, 16, 4), (16, 22, 5), (22, 28, 6), (28, 34, 5), (34, 42, 7), (42, 46, 8)] {
            for offset in start..end {
                assert_eq!(linetable310_line(&table, 2, offset), Some(line), "byte {offset}");
            }
        }
        let lnotab = hex("000108010801060106ff06020801");
        for (offset, line) in [(0, 3), (8, 4), (16, 5), (22, 6), (28, 5), (34, 7), (42, 8), (45, 8)] {
            assert_eq!(lnotab_line(&lnotab, 2, offset), Some(line), "byte {offset}");
        }
    }

    /// A small deterministic generator, so the garbage is the same each run.
    fn garbage(seed: &mut u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                *seed as u8
            })
            .collect()
    }

    /// The target is untrusted memory: line tables of random bytes, at any
    /// offset, must give a line or none, never a panic or a hang.
    #[test]
    fn random_line_tables_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for round in 0..20_000 {
            let table = garbage(&mut seed, round % 64);
            let offset = seed % 512;
            let _ = locations_line(&table, 1, offset);
            let _ = linetable310_line(&table, 1, offset);
            let _ = lnotab_line(&table, 1, offset);
        }
    }

    /// Code::read pointed at arbitrary places of a live process (this one:
    /// its stack, its heap, unmapped addresses) returns an error or a code
    /// object, never panics.
    #[test]
    fn reading_code_objects_from_garbage_addresses_never_panics() {
        let mem = Memory::open(std::process::id()).unwrap();
        let layout = crate::python::layouts::for_version(3, 11).unwrap();
        let on_stack = 0u64;
        let on_heap = Box::new([0x41u8; 4096]);
        let mut seed = 12345u64;
        let mut addresses = vec![0, 8, u64::MAX - 7, &on_stack as *const u64 as u64, on_heap.as_ptr() as u64];
        for _ in 0..2_000 {
            let noise = u64::from_le_bytes(garbage(&mut seed, 8).try_into().unwrap());
            addresses.push(on_heap.as_ptr() as u64 + noise % 4096);
            addresses.push(noise);
        }
        for addr in addresses {
            if let Ok(code) = Code::read(&mem, layout, addr) {
                let _ = code.line_at(addr % 1000);
            }
        }
    }

    #[test]
    fn garbage_tables_give_no_line_instead_of_panicking() {
        assert_eq!(locations_line(&[0x01, 0x02], 5, 0), None);
        assert_eq!(locations_line(&[0xf0], 5, 3), None);
        assert_eq!(locations_line(&[], 5, 0), None);
        assert_eq!(linetable310_line(&[7], 5, 0), None);
    }
}
