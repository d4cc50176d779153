//! Where `pytrace memory --allocations` attaches: the entry points every
//! object and mem allocation passes through, with the size an argument.
//!
//! In Objects/obmalloc.c (3.8 to 3.15) `PyObject_Malloc`, `_Calloc`,
//! `_Realloc` and `PyMem_Malloc`, `_Calloc`, `_Realloc` each call their
//! domain's allocator through its pointer (`_PyObject_Malloc` by default,
//! for both domains), never one another: probed once each, no byte is
//! counted twice. The raw domain (`PyMem_RawMalloc`...) is left out:
//! `_PyObject_Malloc` calls it for every allocation over 512 bytes, which
//! the object entry already counted; what the interpreter asks of it
//! directly (thread states, arenas' bookkeeping) is not an object's.
//!
//! Each wrapper starts with a sign check of its size and a conditional
//! jump (3.12: `mov %rdi,%rsi; test %rdi,%rdi; js`), which every call runs
//! and the kernel emulates (about 1 µs a hit, where the entry's `mov` is
//! single-stepped): the probe goes there when the instructions before it
//! leave the argument registers as they were and nothing in the function
//! jumps back between the entry and it; else at the entry.
//!
//! A stripped build with link-time optimisation copies the allocator into
//! its callers, past these entries: there each copy whose code shows the
//! size asked is probed instead (alloc_sites_stripped.rs, `copy_size`),
//! and the copies that do not are counted in the report.

use iced_x86::{FlowControl, Mnemonic, OpKind, Register};

use super::alloc_sites::{AllocSites, CopySize};
use crate::process::x86;
use crate::python::Python;

/// Instructions from a wrapper's entry to its first conditional jump.
const ENTRY_BUDGET: usize = 8;

/// Bytes of a wrapper read at most (3.12's are 32-80 bytes).
const WRAPPER_MAX_BYTES: usize = 256;

/// How a wrapper's arguments give the size asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `(size)`
    Malloc,
    /// `(nelem, elsize)`: their product.
    Calloc,
    /// `(ptr, size)`: the new size.
    Realloc,
    /// Inside an inlined copy of the object allocator (a stripped build):
    /// where its code holds the size.
    Copy(CopySize),
}

impl Kind {
    /// The argument registers the probe reads.
    fn arguments(self) -> &'static [Register] {
        match self {
            Kind::Malloc => &[Register::RDI],
            Kind::Calloc | Kind::Realloc => &[Register::RDI, Register::RSI],
            Kind::Copy(_) => &[],
        }
    }
}

/// One probe site: a wrapper's link-time address to attach at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub function: &'static str,
    pub kind: Kind,
    pub at: u64,
    /// At the entry, single-stepped (no conditional jump found).
    pub stepped: bool,
}

const WRAPPERS: [(&str, Kind); 6] = [
    ("PyObject_Malloc", Kind::Malloc),
    ("PyObject_Calloc", Kind::Calloc),
    ("PyObject_Realloc", Kind::Realloc),
    ("PyMem_Malloc", Kind::Malloc),
    ("PyMem_Calloc", Kind::Calloc),
    ("PyMem_Realloc", Kind::Realloc),
];

impl Python {
    /// The `--allocations` probes' sites, or the one sentence saying why
    /// there are none. `found`: the memory run's own sites (on a stripped
    /// build, what its search found of the inlined copies, named in the
    /// refusal).
    pub fn allocation_sites(&self, found: &AllocSites) -> Result<Vec<Site>, String> {
        let path = &self.target_path;
        // `_PyObject_Malloc` is static: named only where the symbol table
        // was kept, which is where the wrappers are calls, not copies.
        if self.elf.symbol("_PyObject_Malloc").is_none() {
            return copy_sites(path, found);
        }
        let mut sites = Vec::new();
        for (function, kind) in WRAPPERS {
            let (Some(entry), Some(code)) = (self.elf.symbol(function), self.elf.function_code(function, WRAPPER_MAX_BYTES)) else {
                return Err(format!("`--allocations` found no {function} in {path}"));
            };
            let code = x86::decode(code, entry);
            let site = first_jump(&code, kind).map_or(Site { function, kind, at: entry, stepped: true }, |at| Site { function, kind, at, stepped: false });
            sites.push(site);
        }
        Ok(sites)
    }
}

/// A stripped build's: one probe in each inlined copy of the object
/// allocator whose size its code shows (alloc_sites_stripped.rs), read
/// through the attach cookie, and one after each of obmalloc's calls of
/// libc's realloc (a list's growth past 512 bytes goes there); or why
/// there are none.
fn copy_sites(path: &str, found: &AllocSites) -> Result<Vec<Site>, String> {
    let kernel = crate::kernel::Kernel::get();
    if !kernel.has(crate::kernel::Feature::AttachCookie) {
        return Err(format!(
            "`--allocations` on {path}, a stripped build whose allocator link-time optimisation copied into its callers, probes each copy where its size sits, which the probe learns from its cookie: {}",
            kernel.lacks(crate::kernel::Feature::AttachCookie, "that")
        ));
    }
    if found.object_sized.is_empty() {
        return Err(format!(
            "`--allocations` found no inlined copy of the object allocator in {path} whose size its code shows ({} copies without)",
            found.object_unsized
        ));
    }
    let copies = found.object_sized.iter().map(|c| Site { function: "an inlined copy of obmalloc", kind: Kind::Copy(c.size), at: c.at, stepped: false });
    // Probed on the call itself (a rel32 call, which the kernel emulates),
    // where realloc's two arguments are still in their registers.
    let reallocs = found.realloc_calls.iter().map(|&at| Site { function: "obmalloc's call of realloc", kind: Kind::Realloc, at, stepped: false });
    Ok(copies.chain(reallocs).collect())
}

/// The first conditional jump of a wrapper whose code is `code`, if every
/// instruction before it is a move or a compare that leaves `kind`'s
/// argument registers as they were, and no branch of the wrapper lands
/// after the entry and up to it (it would be run twice, or without the
/// entry's arguments).
fn first_jump(code: &[iced_x86::Instruction], kind: Kind) -> Option<u64> {
    let entry = code.first()?.ip();
    let mut jump = None;
    for i in code.iter().take(ENTRY_BUDGET) {
        if i.flow_control() == FlowControl::ConditionalBranch {
            jump = Some(i.ip());
            break;
        }
        let harmless = matches!(i.mnemonic(), Mnemonic::Mov | Mnemonic::Test | Mnemonic::Cmp) && i.flow_control() == FlowControl::Next;
        if !harmless || kind.arguments().iter().any(|&r| x86::writes_register(i, r)) {
            return None;
        }
    }
    let jump = jump?;
    let lands_before = code.iter().any(|i| {
        matches!(i.op0_kind(), OpKind::NearBranch64) && matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch) && {
            let target = i.near_branch_target();
            target > entry && target <= jump
        }
    });
    (!lands_before).then_some(jump)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pyenv 3.12.1's PyObject_Malloc and PyObject_Calloc (objdump):
    /// `mov %rdi,%rsi; test %rdi,%rdi; js +0x18` and `test %rsi,%rsi; je`.
    const MALLOC_312: [u8; 8] = [0x48, 0x89, 0xfe, 0x48, 0x85, 0xff, 0x78, 0x18];
    const CALLOC_312: [u8; 5] = [0x48, 0x85, 0xf6, 0x74, 0x14];

    #[test]
    fn the_sign_check_is_the_site_when_the_size_is_untouched() {
        assert_eq!(first_jump(&x86::decode(&MALLOC_312, 0x1000), Kind::Malloc), Some(0x1006));
        assert_eq!(first_jump(&x86::decode(&CALLOC_312, 0x1000), Kind::Calloc), Some(0x1003));
    }

    #[test]
    fn an_argument_overwritten_before_the_jump_means_the_entry() {
        // `mov %rdi,%rsi` overwrites realloc's size (rsi) before `test; js`.
        assert_eq!(first_jump(&x86::decode(&MALLOC_312, 0x1000), Kind::Realloc), None);
    }

    #[test]
    fn a_jump_back_before_the_site_means_the_entry() {
        // test %rdi,%rdi; js -2 (to itself, after the entry); the entry's
        // own address is allowed (a loop back to the whole wrapper).
        let back = [0x48, 0x85, 0xff, 0x78, 0xfe];
        assert_eq!(first_jump(&x86::decode(&back, 0x1000), Kind::Malloc), None);
    }
}
