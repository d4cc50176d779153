//! Reading the target's x86-64 machine code, where a probe site is found by
//! the shape of the code around it (iced-x86 decodes it; nothing here
//! changes the target).

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

/// The instructions in `bytes`, which start at link-time address `address`,
/// up to the first one that does not decode (the end of the window, or
/// data).
pub fn decode(bytes: &[u8], address: u64) -> Vec<Instruction> {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    let mut out = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        out.push(instruction);
    }
    out
}

/// A general-purpose register's number as x86 encodes it (rax 0 … r15 15),
/// which the BPF programs map to their pt_regs field.
pub fn register_number(register: Register) -> Option<u32> {
    let full = register.full_register();
    full.is_gpr64().then(|| full.number() as u32)
}

/// Whether `instruction` writes `register` (as its destination operand):
/// enough for the straight-line stretches searched here, where the
/// instructions that matter are moves, arithmetic and compares.
pub fn writes_register(instruction: &Instruction, register: Register) -> bool {
    instruction.op_count() > 0
        && instruction.op0_kind() == OpKind::Register
        && instruction.op0_register().full_register() == register.full_register()
        && !matches!(instruction.mnemonic(), Mnemonic::Cmp | Mnemonic::Test)
}

/// A store of a register to `[base + displacement]` (no index): the base.
pub fn store_base(instruction: &Instruction, displacement: u64) -> Option<Register> {
    let is_store = instruction.mnemonic() == Mnemonic::Mov
        && instruction.op_count() == 2
        && instruction.op0_kind() == OpKind::Memory
        && instruction.op1_kind() == OpKind::Register;
    (is_store && instruction.memory_index() == Register::None && instruction.memory_displacement64() == displacement)
        .then(|| instruction.memory_base())
        .filter(|base| base.is_gpr64())
}

/// A load `mov reg, [base + displacement]` (no index): the destination.
pub fn load_destination(instruction: &Instruction, displacement: u64) -> Option<Register> {
    let is_load = instruction.mnemonic() == Mnemonic::Mov
        && instruction.op_count() == 2
        && instruction.op0_kind() == OpKind::Register
        && instruction.op1_kind() == OpKind::Memory;
    (is_load && instruction.memory_index() == Register::None && instruction.memory_displacement64() == displacement)
        .then(|| instruction.op0_register())
        .filter(|r| r.is_gpr64())
}

/// Whether control can leave a straight line of code at `instruction`
/// other than by falling through (a jump, call or return).
pub fn leaves_straight_line(instruction: &Instruction) -> bool {
    instruction.flow_control() != FlowControl::Next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_registers_stores_and_loads() {
        // mov 0x380(%rax),%r14; mov %rdx,0x20(%rbp); cmp $0x2,%eax; jg +0x10
        let code = [0x4c, 0x8b, 0xb0, 0x80, 0x03, 0, 0, 0x48, 0x89, 0x55, 0x20, 0x83, 0xf8, 0x02, 0x7f, 0x10];
        let insns = decode(&code, 0x1000);
        assert_eq!(insns.len(), 4);
        assert_eq!(load_destination(&insns[0], 0x380), Some(Register::R14));
        assert_eq!(register_number(Register::R14), Some(14));
        assert_eq!(store_base(&insns[1], 0x20), Some(Register::RBP));
        assert_eq!(store_base(&insns[1], 0x28), None);
        assert!(!writes_register(&insns[2], Register::RAX), "a compare writes nothing");
        assert!(insns[3].is_jcc_short_or_near() && leaves_straight_line(&insns[3]));
        assert_eq!(insns[3].near_branch_target(), 0x1000 + 16 + 0x10);
        assert_eq!(register_number(Register::EAX), Some(0));
    }
}
