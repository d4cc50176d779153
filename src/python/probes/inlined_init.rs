//! Where 3.13's inlined `__init__` calls can be counted. Its
//! CALL_ALLOC_AND_ENTER_INIT instruction (a call of a Python class at a site
//! it has specialized) runs `__init__` inline even with the eval-frame hook
//! set, so that frame never enters `_PyEval_EvalFrameDefault` (3.14 checks
//! the hook there). The instruction first allocates the instance, with the
//! class as first argument; a probe there (`inlined_init` in
//! bpf/calls_inline.bpf.h) reads the class's cached `__init__` and counts one call.

use iced_x86::{Mnemonic, OpKind};

use crate::python::layouts::NO_FIELD;
use crate::python::Python;
use crate::process::x86;

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

/// Instructions looked at on the paths from the handler's start.
const HANDLER_BUDGET: usize = 600;

impl Python {
    pub fn inlined_init_probe(&self) -> Option<InitProbe> {
        *self.inlined_init.get_or_init(|| self.find_inlined_init_probe())
    }

    fn find_inlined_init_probe(&self) -> Option<InitProbe> {
        // 3.13's free-threaded build does not specialize at all
        // (ENABLE_SPECIALIZATION is 0 there): every __init__ call enters the
        // eval function.
        if !self.layout.facts().init_inlined_past_hook || self.layout.free_threaded {
            return None;
        }
        if let Some(addr) = self.elf.symbol("_PyType_NewManagedObject") {
            return Some(InitProbe::Function(addr));
        }
        self.allocation_call_site().map(InitProbe::CallSite)
    }

    /// In a stripped build: the interpreter's table of opcode handlers
    /// (opcode_table.rs) gives CALL_ALLOC_AND_ENTER_INIT's handler. That
    /// handler reads the class's cached `__init__` (a load at
    /// `_spec_cache.init`'s offset) and then makes its first call, the
    /// allocation.
    fn allocation_call_site(&self) -> Option<u64> {
        let l = &self.layout;
        if l.opcode_alloc_and_enter_init == NO_FIELD || l.heaptype_spec_init == NO_FIELD {
            return None;
        }
        let opcode = l.opcode_alloc_and_enter_init as usize;
        self.agreed_by_handler_tables(|table| self.handler_allocation_call(table[opcode]))
    }

    /// On the paths from a handler's start (x86::search_paths: a
    /// compiler may split the handler into pieces joined by jumps, as the
    /// shared libpython3.13 of Debian 13 does): the first direct `call`
    /// after a load at `_spec_cache.init`'s offset, branches after the load
    /// being left (they give up the specialization). Every path must find
    /// the same call.
    fn handler_allocation_call(&self, handler: u64) -> Option<u64> {
        let init = self.layout.heaptype_spec_init as u64;
        let eval = self.elf.symbol(crate::python::EVAL_FRAME_SYMBOL)?;
        let code = self.elf.segment_range(eval)?;
        let read = |at: u64| self.elf.read_static(at, 64.min((code.end - at) as usize)).ok().map(<[u8]>::to_vec);
        // A path's state: 0 before the load, 1 after it, 2 past the first call after it.
        let sites = x86::search_paths(read, code.clone(), handler, 0u8, HANDLER_BUDGET, |state| *state == 0, |i, state| {
            match *state {
                0 => {
                    if x86::load_destination(i, init).is_some() {
                        *state = 1;
                    }
                    None
                }
                1 if i.mnemonic() == Mnemonic::Call && i.op0_kind() == OpKind::NearBranch64 && code.contains(&i.near_branch_target()) => {
                    *state = 2;
                    Some(i.ip())
                }
                _ => None,
            }
        });
        match sites[..] {
            [site] => Some(site),
            _ => None,
        }
    }
}
