//! Where the BPF programs attach, beyond the USDT probes and the exported
//! symbols: sites found by reading the interpreter's machine code (the GIL's
//! static functions, specialized instructions that run a call without
//! entering `_PyEval_EvalFrameDefault`, a generator close that never runs).

pub mod eval_entry;
pub mod generator_close;
pub mod gil_sites;
pub mod inlined_getitem;
pub mod inlined_init;
pub mod opcode_table;
pub mod alloc_sites;
pub mod alloc_sites_stripped;
pub mod allocation_sites;

/// Addresses for a refusal's sentence: "0x1a2b, 0x3c4d", or "nothing".
fn hex_list(addresses: &[u64]) -> String {
    if addresses.is_empty() {
        return "nothing".into();
    }
    addresses.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", ")
}

/// A .text larger than this (CPython's is 2-4 MB) is not decoded.
const TEXT_MAX_BYTES: usize = 64 << 20;

/// How many bytes at .text's end may fail to decode (alignment padding).
const TEXT_TAIL_SLACK: u64 = 64;

impl crate::python::Python {
    /// Every instruction of the interpreter's .text, decoded from its start
    /// (GCC puts no data between functions, and pads them with nops that
    /// decode), each handed to `each` and none kept (a 3 MB .text is
    /// ~700,000 instructions, 28 MB as a vector); or why not: `for_what`
    /// names the search in the sentence. A decode that stops short of the
    /// end is refused: what lies after it could not be searched.
    pub(crate) fn scan_text(&self, for_what: &str, mut each: impl FnMut(&iced_x86::Instruction)) -> Result<(), String> {
        let path = &self.target_path;
        let (text_at, text) = self.elf.section_at(".text").ok_or_else(|| format!("{path} has no .text section to search for {for_what}"))?;
        if text.len() > TEXT_MAX_BYTES {
            return Err(format!("{path}'s .text is {} bytes, more than a CPython's", text.len()));
        }
        let mut decoder = iced_x86::Decoder::with_ip(64, text, text_at, iced_x86::DecoderOptions::NONE);
        let mut instruction = iced_x86::Instruction::default();
        let mut end = text_at;
        while decoder.can_decode() {
            decoder.decode_out(&mut instruction);
            if instruction.is_invalid() {
                break;
            }
            end = instruction.next_ip();
            each(&instruction);
        }
        if end + TEXT_TAIL_SLACK < text_at + text.len() as u64 {
            return Err(format!("{path}'s .text does not decode past {end:#x}: {for_what} cannot all be found"));
        }
        Ok(())
    }
}
