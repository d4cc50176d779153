//! Where `pytrace memory` attaches in obmalloc (docs/design/memory.md):
//! after each call of `allocate_from_new_pool` (a pool opened) and around
//! `_PyObject_Malloc`'s call of the raw allocator (an allocation over 512
//! bytes), each at an instruction the kernel emulates: the call itself
//! (`call rel32`) and the first conditional jump after it, which every
//! return runs and where rax still holds what was returned.
//!
//! With the static functions' symbols (pyenv's builds) the sites are read
//! from `_PyObject_Malloc` and `_PyObject_Calloc`; a stripped build with
//! link-time optimisation is searched in alloc_sites_stripped.rs.

use iced_x86::{FlowControl, Mnemonic, OpKind, Register};

use super::alloc_sites_stripped::{branch_after, JoinPoints};
use crate::process::x86;
use crate::python::Python;

/// Instructions between a call and the conditional jump that tests what
/// it returned (3.12: `test %rax,%rax; jne`, or `mov %rax,%rcx; test; jne`).
const AFTER_CALL_BUDGET: usize = 4;

/// Bytes of an allocator function read at most.
const FUNCTION_MAX_BYTES: usize = 4096;

/// A pool's header, from Objects/obmalloc.c (every version pytrace
/// supports): `szidx`, the pool's size class, is its 10th 32-bit word.
pub const POOL_SZIDX_OFFSET: u32 = 36;
/// Blocks in use: the first word (`ref.count`).
pub const POOL_COUNT_OFFSET: u32 = 0;
/// The header's size: blocks start after it.
pub const POOL_HEADER_BYTES: u64 = 48;

/// Where a probe on an inlined copy of the object allocator finds the
/// size asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopySize {
    /// A register (x86 number), plus one where it holds the size less one
    /// (`lea -0x1(%size),%rax; cmp $0x1ff,%rax`).
    Register { number: u32, plus_one: bool },
    /// A size the compiler folded in: `exact` where the code moves it into
    /// a register, else only its size class is left in the code and this
    /// is the class's block size (the size asked rounded up to 16 bytes).
    Constant { bytes: u32, exact: bool },
    /// A register holding twice the size class (the index into
    /// `usedpools`), set before the copy: the class's block size.
    PoolIndex { number: u32 },
}

/// One probe site on an inlined copy: an instruction the kernel emulates
/// (a conditional jump) that every call through the copy runs once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySite {
    pub at: u64,
    pub size: CopySize,
}

/// Link-time addresses of the probe sites.
#[derive(Debug, Clone, Default)]
pub struct AllocSites {
    /// The conditional jumps after each call of allocate_from_new_pool.
    pub pool_opened: Vec<u64>,
    /// The branch after each of obmalloc's calls of the raw allocator's
    /// malloc (`_PyObject_Malloc`'s of PyMem_RawMalloc; a stripped build's
    /// guarded `call malloc@plt`), reached by no other code but the hooked
    /// path's return.
    pub raw_returned: Vec<u64>,
    /// Calls of the raw malloc or calloc left out: other code joins the
    /// line between the call and the branch after it.
    pub raw_joined: usize,
    /// The allocator pointers the sites stand for (stripped builds): each
    /// slot must hold its expected function in the target, or its copies
    /// of obmalloc never run.
    pub guards: Vec<Guard>,
    /// Calls of malloc@plt left out: no raw allocator's guard before them
    /// (not obmalloc's, or a shape not recognised).
    pub unguarded_mallocs: usize,
    /// The branch after each of obmalloc's calls of the raw allocator's
    /// calloc over 512 bytes (`_PyObject_Calloc`'s; `bytes(n)` comes this
    /// way).
    pub calloc_returned: Vec<u64>,
    /// Each guarded call of libc's realloc (a stripped build's), reached
    /// only past its guard: `--allocations` probes the call itself, the
    /// size asked in rsi.
    pub realloc_calls: Vec<u64>,
    /// Of `pool_opened`, return addresses the kernel single-steps (no
    /// branch after the call that only it reaches).
    pub pool_stepped: usize,
    /// Inlined copies of the object allocator (past its guard) whose size
    /// asked a probe can read (alloc_sites_stripped.rs, `copy_size`):
    /// where `--allocations` probes a stripped build.
    pub object_sized: Vec<CopySite>,
    /// Copies past the object allocator's guard whose size was not read
    /// (calloc's and realloc's shapes, a size computed out of sight):
    /// `--allocations` does not see what they allocate, and says how many.
    pub object_unsized: usize,
}

impl AllocSites {
    /// The branch after a call of the raw malloc (or `calloc`), `after`
    /// starting past the call: probed if only that call reaches it (BPF
    /// reads the chunk it returned there, with no probe on the call), else
    /// counted in raw_joined.
    fn raw_site(&mut self, after: &[iced_x86::Instruction], joins: &JoinPoints, calloc: bool) {
        match branch_after(after, Some(joins), None) {
            Some(jump) if calloc => self.calloc_returned.push(jump),
            Some(jump) => self.raw_returned.push(jump),
            None => self.raw_joined += 1,
        }
    }
}

/// `mov slot(%rip),%rax; cmp $expected,%rax; jne`: the code after it runs
/// only while the allocator pointer at `slot` is `expected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    pub slot: u64,
    pub expected: u64,
}

/// POOL_SIZE: 16 KiB from 3.10 on 64-bit builds (USE_LARGE_POOLS with the
/// radix tree), 4 KiB before.
pub fn pool_size(python: &Python) -> u64 {
    if python.version.minor >= 10 {
        16 << 10
    } else {
        4 << 10
    }
}

impl Python {
    /// The memory probes' sites, or the one sentence saying why there are none.
    pub fn alloc_sites(&self) -> Result<AllocSites, String> {
        let path = &self.target_path;
        let Some(new_pool) = self.elf.symbol("allocate_from_new_pool") else {
            return self.stripped_alloc_sites();
        };
        let raw_malloc = self.elf.symbol("PyMem_RawMalloc");
        let raw_slots = [self.elf.plt_slot("PyMem_RawMalloc"), self.elf.got_slot("PyMem_RawMalloc")];
        let raw_calloc = self.elf.symbol("PyMem_RawCalloc");
        let calloc_slots = [self.elf.plt_slot("PyMem_RawCalloc"), self.elf.got_slot("PyMem_RawCalloc")];
        let mut sites = AllocSites::default();
        for function in ["_PyObject_Malloc", "_PyObject_Calloc"] {
            let (Some(at), Some(code)) = (self.elf.symbol(function), self.elf.function_code(function, FUNCTION_MAX_BYTES)) else { continue };
            let code = x86::decode(code, at);
            let joins = JoinPoints::of(&code);
            for (i, call) in code.iter().enumerate() {
                if call.mnemonic() != Mnemonic::Call || call.op0_kind() != OpKind::NearBranch64 {
                    continue;
                }
                let target = call.near_branch_target();
                if target == new_pool {
                    sites.pool_opened.extend(jump_after(&code[i + 1..]));
                } else if function == "_PyObject_Malloc" && (Some(target) == raw_malloc || raw_slots.iter().any(|&slot| self.is_plt_stub_of(target, slot))) {
                    sites.raw_site(&code[i + 1..], &joins, false);
                } else if function == "_PyObject_Calloc" && (Some(target) == raw_calloc || calloc_slots.iter().any(|&slot| self.is_plt_stub_of(target, slot))) {
                    sites.raw_site(&code[i + 1..], &joins, true);
                }
            }
        }
        if sites.pool_opened.is_empty() {
            return Err(format!("no call of allocate_from_new_pool followed by a test of what it returned in {path}'s _PyObject_Malloc or _PyObject_Calloc"));
        }
        if sites.raw_returned.is_empty() {
            return Err(format!("no call of PyMem_RawMalloc followed by a branch only it reaches in {path}'s _PyObject_Malloc"));
        }
        Ok(sites)
    }

    /// Whether `target` is a PLT stub jumping through GOT slot `slot`
    /// (`.plt`/`.plt.sec`: a JUMP_SLOT's; `.plt.got`: a GLOB_DAT's).
    pub(super) fn is_plt_stub_of(&self, target: u64, slot: Option<u64>) -> bool {
        let Some(slot) = slot else { return false };
        let Ok(bytes) = self.elf.read_static(target, 16) else { return false };
        x86::decode(bytes, target).iter().take(2).any(|i| {
            i.mnemonic() == Mnemonic::Jmp && i.op0_kind() == OpKind::Memory && i.is_ip_rel_memory_operand() && i.ip_rel_memory_address() == slot
        })
    }
}

/// Checks in process `pid` that each allocator pointer the sites stand for
/// holds the function the code guards on (read from the target's memory,
/// or, before a command pytrace started has run, the file's initialiser):
/// else the object allocator was replaced (PYTHONMALLOC, debug hooks,
/// tracemalloc) and obmalloc's copies would not run.
pub fn check_guards(python: &Python, sites: &AllocSites, pid: u32) -> Result<(), String> {
    let memory = python.load_bias_in(pid).ok().and_then(|bias| Some((bias, crate::process::proc::Memory::open(pid).ok()?)));
    for guard in &sites.guards {
        let (held, expected) = match &memory {
            Some((bias, memory)) => (memory.read_u64(guard.slot.wrapping_add(*bias)).map_err(|e| format!("{e:#}"))?, guard.expected.wrapping_add(*bias)),
            None => (python.elf.initial_word(guard.slot).ok_or_else(|| format!("{:#x} is not in {}'s data", guard.slot, python.target_path))?, guard.expected),
        };
        if held != expected {
            return Err(format!(
                "process {pid}'s allocator pointer at {:#x} holds {held:#x}, not obmalloc's {expected:#x} that its code expects: another allocator or a hook (PYTHONMALLOC, tracemalloc) replaced it, and `pytrace memory` watches obmalloc's own code",
                guard.slot
            ));
        }
    }
    Ok(())
}

/// The first conditional jump in `after`, if no instruction before it
/// writes rax (which then still holds what the call returned).
fn jump_after(after: &[iced_x86::Instruction]) -> Option<u64> {
    for i in after.iter().take(AFTER_CALL_BUDGET) {
        if i.flow_control() == FlowControl::ConditionalBranch {
            return Some(i.ip());
        }
        if i.flow_control() != FlowControl::Next || x86::writes_register(i, Register::RAX) {
            return None;
        }
    }
    None
}
