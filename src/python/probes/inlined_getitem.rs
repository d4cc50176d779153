//! Where 3.11.0 to 3.11.3 run `__getitem__` without entering
//! `_PyEval_EvalFrameDefault`. Their specialized BINARY_SUBSCR_GETITEM
//! (`obj[i]` on a class whose `__getitem__` is a Python function, once the
//! site has warmed up) pushes the function's frame and jumps into it inside
//! the running evaluation, without checking the eval-frame hook that every
//! other inlined call checks (gh-104405, fixed in 3.11.4). Measured on
//! Debian 12's 3.11.2: 2 of 200 such calls reached the eval function.
//!
//! The handler, found through the opcode table (opcode_table.rs), loads the
//! class's cached `__getitem__` (`_spec_cache.getitem`), checks that the
//! call can go ahead (any check that fails leaves for the generic
//! instruction, which does call through the hook), then fills in the new
//! frame. pytrace probes the first conditional branch after the new frame's
//! code object is stored in it: every check is behind, and a register holds
//! the new frame (`inline_frame` in bpf/calls_inline.bpf.h reads it there). On
//! Debian's 3.11.2 (CPython's own source has the same order):
//!
//!     mov    0x380(%rax),%r14     ; getitem = type->_spec_cache.getitem
//!     cmp    %eax,0x80(%r14)      ; func_version check, else deopt
//!     ...                          ; stack-space check, else deopt
//!     mov    %rdx,0x20(%rbp)      ; new_frame->f_code = code
//!     ...
//!     cmp    $0x2,%eax
//!     jg     …                    ; <- probe: %rbp is the new frame

use iced_x86::Register;

use crate::python::layouts::NO_FIELD;
use crate::python::Python;
use crate::process::x86;

/// Where to count inlined `__getitem__` calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineFrameProbe {
    /// A conditional branch in the handler (the kernel emulates those).
    pub address: u64,
    /// The register (x86 number) that holds the new frame there.
    pub frame_register: u32,
}

/// Handler bytes searched: the handler is about 400 bytes on Debian's build.
const HANDLER_WINDOW: usize = 768;

impl Python {
    /// Whether this build has the bug at all: 3.11 before 3.11.4 (a build
    /// whose patch release is unknown is taken to have it).
    pub fn inlines_getitem_unhooked(&self) -> bool {
        let fixed_in = self.layout.facts().getitem_inlined_past_hook_before;
        fixed_in.is_some_and(|fixed| self.version.micro.is_none_or(|micro| micro < fixed))
    }

    pub fn inlined_getitem_probe(&self) -> Option<InlineFrameProbe> {
        *self.inlined_getitem.get_or_init(|| self.find_inlined_getitem_probe())
    }

    fn find_inlined_getitem_probe(&self) -> Option<InlineFrameProbe> {
        let l = &self.layout;
        if !self.inlines_getitem_unhooked() || l.opcode_binary_subscr_getitem == NO_FIELD || l.heaptype_spec_getitem == NO_FIELD {
            return None;
        }
        let opcode = l.opcode_binary_subscr_getitem as usize;
        self.agreed_by_handler_tables(|table| self.new_frame_branch(table[opcode]))
    }

    /// In one candidate handler: the load of the cached `__getitem__`, then
    /// the store of a code object into a frame at `frame_code`'s offset,
    /// then the first conditional branch, with the frame register unchanged
    /// in between and no jump, call or return before it.
    fn new_frame_branch(&self, handler: u64) -> Option<InlineFrameProbe> {
        let l = &self.layout;
        let bytes = self.elf.read_static(handler, HANDLER_WINDOW).ok()?;
        // Most candidate tables are runs of other code pointers: decoding
        // every window of them was a sixth of a `calls` run's CPU.
        if !x86::may_encode_displacement(bytes, l.heaptype_spec_getitem as u64) {
            return None;
        }
        let code = x86::decode(bytes, handler);
        let load = code.iter().position(|i| x86::load_destination(i, l.heaptype_spec_getitem as u64).is_some())?;
        let (store, frame) =
            code.iter().enumerate().skip(load + 1).find_map(|(n, i)| Some((n, x86::store_base(i, l.frame_code as u64)?)))?;
        if frame == Register::RSP {
            return None;
        }
        let after = &code[store + 1..];
        let branch = after.iter().position(x86::leaves_straight_line)?;
        let jcc = &after[branch];
        if !jcc.is_jcc_short_or_near() || after[..branch].iter().any(|i| x86::writes_register(i, frame)) {
            return None;
        }
        Some(InlineFrameProbe { address: jcc.ip(), frame_register: x86::register_number(frame)? })
    }
}
