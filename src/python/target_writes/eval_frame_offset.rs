//! Where `interp->eval_frame` sits in the interpreter state: the one field
//! pytrace writes (eval_hook.rs), which `_Py_DebugOffsets` does not list.
//!
//! A wrong offset would make pytrace write a code address over some other
//! field of a production process, so the offset is used only when two
//! independent sources agree:
//! - the per-version table generated from CPython's headers (layouts/table.rs;
//!   from 3.13 a patch release may move the field, so alone it is a guess);
//! - the load in `_PyInterpreterState_GetEvalFrameFunc(interp)`, which
//!   returns `interp->eval_frame`;
//! - the store in `_PyInterpreterState_SetEvalFrameFunc(interp, f)`, which
//!   writes it.
//!
//! Both functions are decoded with iced-x86 (a full x86-64 decoder: a
//! frame-pointer build starts them with `push rbp; mov rbp, rsp`, Debian's
//! with endbr64, pyenv's 3.13 copies `interp` into rbp across a call), and
//! the field is the first 8-byte access at a constant offset from a
//! register still holding the first argument.

use iced_x86::{Code, Decoder, DecoderOptions, Instruction, InstructionInfoFactory, MemorySize, OpAccess, OpKind, Register};

pub const GET_SYMBOL: &str = "_PyInterpreterState_GetEvalFrameFunc";
pub const SET_SYMBOL: &str = "_PyInterpreterState_SetEvalFrameFunc";

/// More machine code than either function has in any build here (the
/// setter is 0x80 bytes in Debian's 3.15).
pub const MAX_CODE: usize = 512;

/// The offset, if two sources agree, and what each source said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalFrameOffset {
    pub agreed: Option<u32>,
    pub table: u32,
    pub getter: Option<u32>,
    pub setter: Option<u32>,
}

impl EvalFrameOffset {
    pub fn new(table: u32, getter_code: Option<&[u8]>, setter_code: Option<&[u8]>) -> Self {
        let getter = getter_code.and_then(|c| first_access(c, Access::Load));
        let setter = setter_code.and_then(|c| first_access(c, Access::Store));
        let agreed = match (getter, setter) {
            // Both functions: the build's own truth, even where a patch
            // release moved the field from the table's. Should they ever
            // disagree, something was misread and nothing is trusted.
            (Some(g), Some(s)) => (g == s).then_some(g),
            (Some(one), None) | (None, Some(one)) => (one == table).then_some(one),
            (None, None) => None,
        };
        EvalFrameOffset { agreed, table, getter, setter }
    }

    /// The sources, said for `pytrace info` and for a refusal.
    pub fn describe(&self) -> String {
        let said = |o: Option<u32>| o.map(|o| format!("{o:#x}")).unwrap_or_else(|| "no readable access".into());
        format!("headers table {:#x}, {GET_SYMBOL} {}, {SET_SYMBOL} {}", self.table, said(self.getter), said(self.setter))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Load,
    Store,
}

/// Registers a call may change (System V x86-64): `interp` no longer there.
const CALLER_SAVED: [Register; 9] =
    [Register::RAX, Register::RCX, Register::RDX, Register::RSI, Register::RDI, Register::R8, Register::R9, Register::R10, Register::R11];

/// The displacement of the first 8-byte load (`mov reg, [interp + d]`) or
/// store (`mov [interp + d], reg`) in a function whose first argument is
/// `interp`, following copies of it from register to register, in the
/// order the code is laid out.
fn first_access(code: &[u8], want: Access) -> Option<u32> {
    let mut holds_interp = vec![Register::RDI];
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return None;
        }
        if let Some(d) = interp_field(&instr, &holds_interp, want) {
            return Some(d);
        }
        // `mov r64, r64` from a register holding interp: a copy.
        let is_mov = instr.code() == Code::Mov_r64_rm64 || instr.code() == Code::Mov_rm64_r64;
        if is_mov && instr.op0_kind() == OpKind::Register && instr.op1_kind() == OpKind::Register {
            let (dst, src) = (instr.op0_register(), instr.op1_register());
            holds_interp.retain(|&r| r != dst);
            if holds_interp.contains(&src) {
                holds_interp.push(dst);
            }
            continue;
        }
        if instr.is_call_near() || instr.is_call_far() || instr.is_call_near_indirect() || instr.is_call_far_indirect() {
            holds_interp.retain(|r| !CALLER_SAVED.contains(r));
            continue;
        }
        // Anything else that writes a register overwrites interp there.
        for used in info.info(&instr).used_registers() {
            if !matches!(used.access(), OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess | OpAccess::None) {
                let full = used.register().full_register();
                holds_interp.retain(|&r| r != full);
            }
        }
        if holds_interp.is_empty() {
            return None;
        }
    }
    None
}

/// The field's offset if `instr` is the wanted 8-byte access through a
/// register holding interp (no index register, no segment override).
fn interp_field(instr: &Instruction, holds_interp: &[Register], want: Access) -> Option<u32> {
    let (memory_op, register_op) = match (want, instr.code()) {
        (Access::Load, Code::Mov_r64_rm64) => (1, 0),
        (Access::Store, Code::Mov_rm64_r64) => (0, 1),
        _ => return None,
    };
    if instr.op_kind(memory_op) != OpKind::Memory || instr.op_kind(register_op) != OpKind::Register {
        return None;
    }
    if instr.memory_size() != MemorySize::UInt64
        || instr.memory_index() != Register::None
        || instr.segment_prefix() != Register::None
        || !holds_interp.contains(&instr.memory_base())
    {
        return None;
    }
    let d = instr.memory_displacement64();
    (d < 1 << 20).then_some(d as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each function's bytes as objdump shows them in the build named.

    /// Debian's 3.11.2: mov 0x590(%rdi),%rax; test; jne; mov $..,%eax; ret
    const DEBIAN_311_GET: &[u8] = &[0x48, 0x8b, 0x87, 0x90, 0x05, 0, 0, 0x48, 0x85, 0xc0, 0x75, 0x05, 0xb8, 0xf0, 0xb0, 0x52, 0x00, 0xc3];
    /// cmp $..,%rsi; jne; xor %esi,%esi; mov %rsi,0x590(%rdi); ret
    const DEBIAN_311_SET: &[u8] =
        &[0x48, 0x81, 0xfe, 0xf0, 0xb0, 0x52, 0x00, 0x75, 0x02, 0x31, 0xf6, 0x48, 0x89, 0xb7, 0x90, 0x05, 0, 0, 0xc3];
    /// Debian's 3.14: endbr64; mov 0x2148(%rdi),%rax; mov $..,%edx; test; cmove; ret
    const DEBIAN_314_GET: &[u8] = &[
        0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x87, 0x48, 0x21, 0, 0, 0xba, 0x80, 0x8b, 0x59, 0, 0x48, 0x85, 0xc0, 0x48, 0x0f, 0x44, 0xc2, 0xc3,
    ];
    /// pyenv's 3.13.0 setter: push %rbp; xor; push %rbx; mov %rsi,%rbx;
    /// sub $8,%rsp; cmp ..(%rip),%rsi; cmove %rax,%rbx;
    /// cmp %rbx,0x2118(%rdi); je; mov %rdi,%rbp; call ..;
    /// movzbl 0x2f262(%rax),%edx; cmp $0xff,%dl; je; add $1,%edx;
    /// mov %dl,0x2f262(%rax); mov %rbx,0x2118(%rbp); ...
    const PYENV_313_SET: &[u8] = &[
        0x55, 0x31, 0xc0, 0x53, 0x48, 0x89, 0xf3, 0x48, 0x83, 0xec, 0x08, 0x48, 0x3b, 0x35, 0x5e, 0x63, 0x25, 0x00, 0x48, 0x0f, 0x44, 0xd8,
        0x48, 0x39, 0x9f, 0x18, 0x21, 0, 0, 0x74, 0x24, 0x48, 0x89, 0xfd, 0xe8, 0xf9, 0x5d, 0xdf, 0xff, 0x0f, 0xb6, 0x90, 0x62, 0xf2, 0x02,
        0x00, 0x80, 0xfa, 0xff, 0x74, 0x09, 0x83, 0xc2, 0x01, 0x88, 0x90, 0x62, 0xf2, 0x02, 0x00, 0x48, 0x89, 0x9d, 0x18, 0x21, 0, 0, 0x48,
        0x83, 0xc4, 0x08, 0x5b, 0x5d, 0xc3,
    ];

    #[test]
    fn reads_the_field_off_both_functions() {
        assert_eq!(first_access(DEBIAN_311_GET, Access::Load), Some(0x590));
        assert_eq!(first_access(DEBIAN_311_SET, Access::Store), Some(0x590));
        assert_eq!(first_access(DEBIAN_314_GET, Access::Load), Some(0x2148));
        // Through rbp, after a call that clobbered rdi; the byte store
        // through rax before it (another struct) is not it.
        assert_eq!(first_access(PYENV_313_SET, Access::Store), Some(0x2118));
    }

    #[test]
    fn frame_pointer_prologues_are_followed() {
        // push %rbp; mov %rsp,%rbp; mov 0x590(%rdi),%rax; pop %rbp; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x8b, 0x87, 0x90, 0x05, 0, 0, 0x5d, 0xc3];
        assert_eq!(first_access(&code, Access::Load), Some(0x590));
        // mov %rdi,%rbx; mov 0x590(%rbx),%rax
        assert_eq!(first_access(&[0x48, 0x89, 0xfb, 0x48, 0x8b, 0x83, 0x90, 0x05, 0, 0], Access::Load), Some(0x590));
    }

    #[test]
    fn other_code_gives_no_offset() {
        // A load through rsi (not interp), then rdi overwritten (mov (%rsi),%rdi), then a load through it.
        let code = [0x48, 0x8b, 0x86, 0x90, 0x05, 0, 0, 0x48, 0x8b, 0x3e, 0x48, 0x8b, 0x87, 0x90, 0x05, 0, 0];
        assert_eq!(first_access(&code, Access::Load), None);
        // A call clobbers rdi.
        let code = [0xe8, 0, 0, 0, 0, 0x48, 0x8b, 0x87, 0x90, 0x05, 0, 0];
        assert_eq!(first_access(&code, Access::Load), None);
        // A 4-byte load is not the pointer field.
        assert_eq!(first_access(&[0x8b, 0x87, 0x90, 0x05, 0, 0], Access::Load), None);
        assert_eq!(first_access(&[0x0f, 0x0b], Access::Load), None);
    }

    #[test]
    fn the_offset_is_used_only_where_two_sources_agree() {
        let both = EvalFrameOffset::new(0x590, Some(DEBIAN_311_GET), Some(DEBIAN_311_SET));
        assert_eq!(both.agreed, Some(0x590));
        // A patch release moved the field: both functions say so, the table is stale.
        assert_eq!(EvalFrameOffset::new(0x580, Some(DEBIAN_311_GET), Some(DEBIAN_311_SET)).agreed, Some(0x590));
        // One function and the table.
        assert_eq!(EvalFrameOffset::new(0x590, Some(DEBIAN_311_GET), None).agreed, Some(0x590));
        assert_eq!(EvalFrameOffset::new(0x590, None, Some(DEBIAN_311_SET)).agreed, Some(0x590));
        // One source alone, or two that disagree: no offset.
        assert_eq!(EvalFrameOffset::new(0x580, Some(DEBIAN_311_GET), None).agreed, None);
        assert_eq!(EvalFrameOffset::new(0x590, None, None).agreed, None);
        // mov %rsi,0x2148(%rdi); ret: the two functions disagree.
        let other_store = [0x48, 0x89, 0xb7, 0x48, 0x21, 0, 0, 0xc3];
        assert_eq!(EvalFrameOffset::new(0x590, Some(DEBIAN_311_GET), Some(&other_store)).agreed, None);
        assert!(both.describe().contains("0x590"));
    }
}
