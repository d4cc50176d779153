//! Where `close()` of a suspended generator or coroutine is a call that
//! never runs. Closing one throws GeneratorExit into its frame, which
//! cProfile counts as a call; from 3.13, when the frame is suspended at a
//! `yield` with no `try` around it, close() skips the frame and just marks
//! the generator done (a fast path in genobject.c's gen_close). Since
//! gh-140373 (3.13.10, 3.14.1, 3.15) the fast path is taken only when no
//! sys.monitoring tool listens for PY_UNWIND, so under cProfile the frame
//! does run and cProfile counts the call, while a traced process without a
//! profiler skips it: on Debian sid's 3.13.18, 3.14.10 and 3.15.2, 3 of the
//! 4 resumptions cProfile counts of a generator driven by next, send and
//! close entered `_PyEval_EvalFrameDefault`. pytrace counts the skipped one
//! where the fast path decides, so its counts equal cProfile's.
//!
//! gen_close is static (no symbol in a stripped build) and the check is
//! inlined into it, but `_PyEval_NoToolsForUnwind`, exported (PyAPI_FUNC)
//! by the same change and so in every build that has it, holds the same check, `interp->monitors.tools[PY_UNWIND] == 0`: its
//! displacement identifies the inlined copies. After each copy, gen_close
//! tests the RESUME instruction's "exception depth 1" bit, then branches to
//! the fast path, which starts by storing the generator's new state. The
//! probe sits on the last branch into the fast path (the kernel emulates
//! branches), `skipped_close` in bpf/calls_inline.bpf.h reads the flags to see
//! whether it is taken and the register that holds the generator. On
//! Debian sid's 3.14.10:
//!
//!     cmpb   $0x0,0x36815(%rax)   ; a tool listens for PY_UNWIND?
//!     jne    slow
//!     testb  $0x4,0x1(%rcx)       ; RESUME's depth-1 bit
//!     je     slow                 ; <- probe: fast path when ZF is clear
//!     movb   $0x1,0x43(%r8)       ; gen->gi_frame_state = ...: %r8 is gen

use iced_x86::{Instruction, Mnemonic, OpKind, Register};

use crate::python::layouts::NO_FIELD;
use crate::python::Python;
use crate::process::x86;

/// What pytrace knows about close()'s fast path in one build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseProbe {
    /// The branches into the fast path: counting there makes counts exact.
    Sites(Vec<CloseSite>),
    /// Before 3.13, or a build from before gh-140373: close() takes the
    /// fast path under cProfile too, so neither counts those calls.
    NotNeeded,
    /// A fast path of a shape not recognised: such calls go uncounted.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseSite {
    /// A conditional branch (je or jne).
    pub address: u64,
    /// The register (x86 number) that holds the generator there.
    pub gen_register: u32,
    /// The zero flag's value when the fast path is taken.
    pub fast_when_zf: bool,
}

const NO_TOOLS_SYMBOL: &str = "_PyEval_NoToolsForUnwind";
/// Bytes decoded after each copy of the check; the fast path's branch is
/// within a dozen instructions of it.
const CHECK_WINDOW: usize = 96;

impl Python {
    pub fn skipped_close_probe(&self) -> CloseProbe {
        self.skipped_close.get_or_init(|| self.find_skipped_close_probe()).clone()
    }

    fn find_skipped_close_probe(&self) -> CloseProbe {
        if !self.layout.facts().close_may_skip_frame || self.layout.gen_frame_state == NO_FIELD {
            return CloseProbe::NotNeeded;
        }
        // Exported (PyAPI_FUNC) with the change: a build without it predates it.
        let Some(function) = self.elf.symbol(NO_TOOLS_SYMBOL) else { return CloseProbe::NotNeeded };
        let Some(tools) = self.unwind_tools_displacement(function) else { return CloseProbe::Unknown };
        let Some(eval) = self.elf.symbol(crate::python::EVAL_FRAME_SYMBOL) else { return CloseProbe::Unknown };
        let Some(text) = self.elf.segment_range(eval) else { return CloseProbe::Unknown };
        let Ok(bytes) = self.elf.read_static(text.start, (text.end - text.start) as usize) else { return CloseProbe::Unknown };
        // `cmpb $0x0, disp32(%reg)`: 80 /7 with a 32-bit displacement, then the 0.
        let disp = tools.to_le_bytes();
        let mut sites = Vec::new();
        for at in 0..bytes.len().saturating_sub(7) {
            let [0x80, modrm, d0, d1, d2, d3, 0] = bytes[at..at + 7] else { continue };
            if modrm & 0xf8 != 0xb8 || modrm & 7 == 4 || [d0, d1, d2, d3] != disp[..4] {
                continue;
            }
            // An optional REX.B prefix (base r8 to r15) starts the instruction one byte earlier.
            let start = if at > 0 && bytes[at - 1] == 0x41 { at - 1 } else { at };
            let window = &bytes[start..(start + CHECK_WINDOW).min(bytes.len())];
            if let Some(site) = self.fast_path_branch(window, text.start + start as u64) {
                sites.push(site);
            }
        }
        if sites.is_empty() {
            CloseProbe::Unknown
        } else {
            CloseProbe::Sites(sites)
        }
    }

    /// `_PyEval_NoToolsForUnwind` loads `tstate->interp` and compares one
    /// byte of it with 0 (3.15 first looks at the code object's own
    /// monitors): that byte's displacement.
    fn unwind_tools_displacement(&self, function: u64) -> Option<u32> {
        let code = x86::decode(self.elf.read_static(function, 64).ok()?, function);
        code.iter().take(16).find_map(|i| {
            let compares_zero = i.mnemonic() == Mnemonic::Cmp
                && i.op0_kind() == OpKind::Memory
                && i.memory_size().size() == 1
                && i.memory_index() == Register::None
                && i.memory_displacement64() > 0xff
                && i.op1_kind() == OpKind::Immediate8
                && i.immediate8() == 0;
            compares_zero.then(|| i.memory_displacement64() as u32)
        })
    }

    /// After one copy of the check (the first instruction of `window`):
    /// the test of a byte at `[reg + 1]` (the RESUME instruction's oparg),
    /// then the conditional branches; the one whose target or fall-through
    /// stores the generator's state is the way into the fast path.
    fn fast_path_branch(&self, window: &[u8], address: u64) -> Option<CloseSite> {
        let code = x86::decode(window, address);
        let test = code.iter().take(6).position(|i| {
            i.mnemonic() == Mnemonic::Test
                && i.op0_kind() == OpKind::Memory
                && i.memory_size().size() == 1
                && i.memory_displacement64() == 1
                && i.op1_kind() == OpKind::Immediate8
        })?;
        for (n, jump) in code.iter().enumerate().skip(test + 1).take(4) {
            if !x86::leaves_straight_line(jump) {
                continue;
            }
            if !matches!(jump.mnemonic(), Mnemonic::Je | Mnemonic::Jne) {
                return None;
            }
            let taken = self.stores_gen_state_at(jump.near_branch_target());
            let fallthrough = code.get(n + 1).and_then(|next| self.gen_state_store(next));
            let (gen, fast_when_taken) = match (taken, fallthrough) {
                (Some(gen), None) => (gen, true),
                (None, Some(gen)) => (gen, false),
                _ => continue,
            };
            // je is taken when ZF is set, jne when it is clear.
            let fast_when_zf = (jump.mnemonic() == Mnemonic::Je) == fast_when_taken;
            return Some(CloseSite { address: jump.ip(), gen_register: x86::register_number(gen)?, fast_when_zf });
        }
        None
    }

    fn stores_gen_state_at(&self, address: u64) -> Option<Register> {
        let bytes = self.elf.read_static(address, 16).ok()?;
        self.gen_state_store(x86::decode(bytes, address).first()?)
    }

    /// `movb $imm, gi_frame_state(%reg)`: the register holding the generator.
    fn gen_state_store(&self, i: &Instruction) -> Option<Register> {
        let stores = i.mnemonic() == Mnemonic::Mov
            && i.op0_kind() == OpKind::Memory
            && i.memory_size().size() == 1
            && i.memory_index() == Register::None
            && i.memory_displacement64() == self.layout.gen_frame_state as u64
            && i.op1_kind() == OpKind::Immediate8;
        stores.then(|| i.memory_base()).filter(|r| r.is_gpr64() && *r != Register::RSP)
    }
}
