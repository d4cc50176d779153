//! Where 3.13's inlined `__init__` calls can be counted. Its
//! CALL_ALLOC_AND_ENTER_INIT instruction (a call of a Python class at a site
//! it has specialized) runs `__init__` inline even with the eval-frame hook
//! set, so that frame never enters `_PyEval_EvalFrameDefault` (3.14 checks
//! the hook there). The instruction first allocates the instance, with the
//! class as first argument; a probe there (`inlined_init` in
//! bpf/calls.bpf.c) reads the class's cached `__init__` and counts one call.

use super::layouts::NO_FIELD;
use super::Python;

/// Where to put that probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitProbe {
    /// `_PyType_NewManagedObject`, by name (a build with a symbol table):
    /// its entry, where the class is the first argument.
    Function(u64),
    /// The allocation call inside the instruction's handler (a stripped
    /// build, which inlines that function): the `call` itself, where the
    /// class is already in the first argument's register.
    CallSite(u64),
}

/// Handler bytes searched for the allocation call.
const HANDLER_WINDOW: usize = 512;

impl Python {
    pub fn inlined_init_probe(&self) -> Option<InitProbe> {
        *self.inlined_init.get_or_init(|| self.find_inlined_init_probe())
    }

    fn find_inlined_init_probe(&self) -> Option<InitProbe> {
        // 3.13's free-threaded build does not specialize at all
        // (ENABLE_SPECIALIZATION is 0 there): every __init__ call enters the
        // eval function.
        if (self.version.major, self.version.minor) != (3, 13) || self.layout.free_threaded {
            return None;
        }
        if let Some(addr) = self.elf.symbol("_PyType_NewManagedObject") {
            return Some(InitProbe::Function(addr));
        }
        self.allocation_call_site().map(InitProbe::CallSite)
    }

    /// In a stripped build: the interpreter's table of opcode handlers
    /// (`opcode_targets`, 256 addresses into the code, a static initialiser
    /// in a non-PIE executable) gives CALL_ALLOC_AND_ENTER_INIT's handler.
    /// That handler reads the class's cached `__init__` (a load at
    /// `_spec_cache.init`'s offset) and then makes its first call, the
    /// allocation. Only an answer every table candidate agrees on is taken:
    /// a wrong site would count calls that were not made.
    fn allocation_call_site(&self) -> Option<u64> {
        let l = &self.layout;
        if l.opcode_alloc_and_enter_init == NO_FIELD || l.heaptype_spec_init == NO_FIELD {
            return None;
        }
        let eval = self.elf.symbol(super::EVAL_FRAME_SYMBOL)?;
        let code = self.elf.segment_range(eval)?;
        let opcode = l.opcode_alloc_and_enter_init as usize;
        let mut found = None;
        for (_, bytes) in self.elf.segment_bytes() {
            let words: Vec<u64> = bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap())).collect();
            let mut run = 0;
            for (i, &w) in words.iter().enumerate() {
                run = if code.contains(&w) { run + 1 } else { 0 };
                if run < 256 {
                    continue;
                }
                // A table of 256 code addresses ends at word i.
                let table = &words[i + 1 - 256..=i];
                let Some(site) = self.handler_allocation_call(table[opcode]) else { continue };
                match found {
                    None => found = Some(site),
                    Some(other) if other == site => {}
                    Some(_) => return None,
                }
            }
        }
        found
    }

    /// The first `call rel32` to a function (CET builds start every one
    /// with endbr64, which tells a call from an 0xe8 byte inside another
    /// instruction) after a `mov disp32(reg), reg` whose displacement is
    /// `_spec_cache.init`'s offset, in a handler's code.
    fn handler_allocation_call(&self, handler: u64) -> Option<u64> {
        let code = self.elf.read_static(handler, HANDLER_WINDOW).ok()?;
        let disp = self.layout.heaptype_spec_init.to_le_bytes();
        let load = code.windows(7).position(|w| {
            matches!(w[0], 0x48 | 0x49 | 0x4c | 0x4d) && w[1] == 0x8b && w[2] >> 6 == 0b10 && w[2] & 7 != 4 && w[3..7] == disp
        })?;
        (load + 7..code.len().saturating_sub(5)).find_map(|i| {
            let [0xe8, a, b, c, d] = code[i..i + 5] else { return None };
            let at = handler + i as u64;
            let target = (at + 5).wrapping_add(i32::from_le_bytes([a, b, c, d]) as i64 as u64);
            let starts = self.elf.read_static(target, 4).ok()?;
            (starts == crate::target::elf::ENDBR64).then_some(at)
        })
    }
}
