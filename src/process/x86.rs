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

/// Whether some instruction in `bytes` could address memory at
/// `displacement`, judged from the raw bytes before any decoding: x86
/// encodes a displacement that fits in a signed byte as that byte or as
/// four bytes starting with it, and any other as its four bytes, little
/// endian. A cheap test that rules out most of the windows a search by
/// shape would otherwise decode.
pub fn may_encode_displacement(bytes: &[u8], displacement: u64) -> bool {
    match i32::try_from(displacement) {
        Ok(small) if (-128..128).contains(&small) => bytes.contains(&(small as u8)),
        Ok(wide) => bytes.windows(4).any(|w| w == wide.to_le_bytes()),
        Err(_) => true,
    }
}

/// Whether control can leave a straight line of code at `instruction`
/// other than by falling through (a jump, call or return).
pub fn leaves_straight_line(instruction: &Instruction) -> bool {
    instruction.flow_control() != FlowControl::Next
}

/// Every site `check` finds on the paths from `start`: jumps to their
/// target, conditional branches both ways while `branches(state)` says so
/// and else only by falling through (calls are stepped over), within
/// `code` (link-time addresses), breadth first, each address once, until
/// `budget` instructions have been looked at. A
/// compiler may split one handler of the eval loop into pieces joined by
/// jumps, so a straight line from its start does not see all of it.
/// `read` gives the bytes at an address; `State` is what a path has seen.
pub fn search_paths<State: Clone, Found: PartialEq>(
    read: impl Fn(u64) -> Option<Vec<u8>>,
    code: std::ops::Range<u64>,
    start: u64,
    initial: State,
    budget: usize,
    branches: impl Fn(&State) -> bool,
    mut check: impl FnMut(&Instruction, &mut State) -> Option<Found>,
) -> Vec<Found> {
    let mut found = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut queue = std::collections::VecDeque::from([(start, initial)]);
    let mut looked = 0;
    'paths: while let Some((at, mut state)) = queue.pop_front() {
        if !code.contains(&at) || !seen.insert(at) {
            continue;
        }
        let Some(bytes) = read(at) else { continue };
        let instructions = decode(&bytes, at);
        let Some(end) = instructions.last().map(|i| i.next_ip()) else { continue };
        for instruction in instructions {
            looked += 1;
            if looked > budget {
                break 'paths;
            }
            if let Some(site) = check(&instruction, &mut state) {
                if !found.contains(&site) {
                    found.push(site);
                }
            }
            match instruction.flow_control() {
                FlowControl::Next | FlowControl::Call => continue,
                FlowControl::ConditionalBranch => {
                    if branches(&state) {
                        queue.push_back((instruction.near_branch_target(), state.clone()));
                    }
                    queue.push_back((instruction.next_ip(), state));
                }
                FlowControl::UnconditionalBranch if instruction.op0_kind() == OpKind::NearBranch64 => {
                    queue.push_back((instruction.near_branch_target(), state));
                }
                _ => {}
            }
            continue 'paths;
        }
        // The window ended inside a straight line: it goes on from there.
        queue.push_front((end, state));
    }
    found
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
        assert!(may_encode_displacement(&code, 0x380) && may_encode_displacement(&code, 0x20));
        assert!(!may_encode_displacement(&code, 0x388) && !may_encode_displacement(&code, 0x21));
        assert_eq!(register_number(Register::R14), Some(14));
        assert_eq!(store_base(&insns[1], 0x20), Some(Register::RBP));
        assert_eq!(store_base(&insns[1], 0x28), None);
        assert!(!writes_register(&insns[2], Register::RAX), "a compare writes nothing");
        assert!(insns[3].is_jcc_short_or_near() && leaves_straight_line(&insns[3]));
        assert_eq!(insns[3].near_branch_target(), 0x1000 + 16 + 0x10);
        assert_eq!(register_number(Register::EAX), Some(0));
    }

    #[test]
    fn paths_follow_both_ways_of_a_branch_and_jumps() {
        // 0x1000: je 0x1010; jmp 0x1020 / 0x1010: nop; ret / 0x1020: call 0x2000; ret
        let mut code = [0x90u8; 0x30];
        code[0..2].copy_from_slice(&[0x74, 0x0e]);
        code[2..4].copy_from_slice(&[0xeb, 0x1c]);
        code[0x11] = 0xc3;
        code[0x20..0x25].copy_from_slice(&[0xe8, 0xdb, 0x0f, 0, 0]);
        code[0x25] = 0xc3;
        let read = |at: u64| code.get((at - 0x1000) as usize..).map(|b| b.to_vec());
        let calls = search_paths(read, 0x1000..0x1030, 0x1000, (), 100, |_| true, |i, _| (i.mnemonic() == Mnemonic::Call).then(|| i.near_branch_target()));
        assert_eq!(calls, [0x2000]);
        let nops = search_paths(read, 0x1000..0x1030, 0x1000, (), 100, |_| true, |i, _| (i.mnemonic() == Mnemonic::Nop).then(|| i.ip()));
        assert_eq!(nops, [0x1010], "the branch target's nop; the jump skips the others");
    }
}
