//! Finding the caller of a function that has no unwind information (the
//! hand-written assembly kernels of OpenBLAS, say) by scanning the copied
//! stack for its return address, as careful unwinders do (Breakpad's and
//! LLDB's stack scan). A word of the stack is taken for the return address
//! only if it points into a module's .text right after a call instruction,
//! decoded from the module file (not from the target's memory), and, for a
//! direct call, only if that call's target could be the function being left.
//! unwind.rs then checks every return address after it the same way, so a
//! stale word left on the stack gives no frames at all rather than wrong ones.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind};

use super::module::ModuleFile;

/// Words of the stack looked at above the stack pointer (64 KiB, more than
/// BPF copies): OpenBLAS's dgemm_kernel_HASWELL takes 28.8 KiB of stack
/// (`sub $0x7080,%rsp`, then aligns it to a page) for its packed blocks.
pub const MAX_SCAN_WORDS: usize = 8192;

/// The longest x86-64 call instruction (a REX prefix, FF /2 with a SIB
/// byte and a 32-bit displacement is 8 bytes; 15 is the ISA's bound).
const MAX_CALL_LEN: usize = 15;

/// How far into a function without unwind information a direct call's
/// target may be from the address it was left at: OpenBLAS's biggest
/// kernels are a few tens of KiB.
const MAX_FUNCTION_SIZE: u64 = 256 * 1024;

/// The call instruction ending right before `return_svma` in `file`'s
/// .text, if there is one.
pub fn call_before(file: &ModuleFile, return_svma: u64) -> Option<Instruction> {
    let (text, bytes) = file.text.as_ref()?;
    if !text.contains(&return_svma) || return_svma == text.start {
        return None;
    }
    let end = (return_svma - text.start) as usize;
    call_ending(&bytes[end.saturating_sub(MAX_CALL_LEN)..end], return_svma)
}

/// The shortest instruction that ends `code` (which ends at `end_ip`) and
/// decodes as a call: the bytes before a return address are not known to
/// start an instruction, so every length is tried.
fn call_ending(code: &[u8], end_ip: u64) -> Option<Instruction> {
    (2..=code.len()).find_map(|len| {
        let window = &code[code.len() - len..];
        let instruction = Decoder::with_ip(64, window, end_ip - len as u64, DecoderOptions::NONE).decode();
        let is_call = matches!(instruction.flow_control(), FlowControl::Call | FlowControl::IndirectCall);
        (!instruction.is_invalid() && instruction.len() == len && is_call).then_some(instruction)
    })
}

/// Whether `call`, found before a return address, could have entered the
/// function holding `left_svma` (in `left`, a module without unwind
/// information there; `same_module`: the call is in `left` too): an indirect call could have; a direct one only if
/// its target is in the same module, at or before `left_svma` by at most a
/// function's size, and also without unwind information.
pub fn could_call(call: &Instruction, same_module: bool, left: &ModuleFile, left_svma: u64) -> bool {
    if call.flow_control() == FlowControl::IndirectCall {
        return true;
    }
    if call.op0_kind() != OpKind::NearBranch64 || !same_module {
        return false;
    }
    let target = call.near_branch64();
    target <= left_svma && left_svma - target < MAX_FUNCTION_SIZE && left.function_start(target).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_before(code: &[u8]) -> Option<(FlowControl, usize)> {
        call_ending(code, 0x1000).map(|i| (i.flow_control(), i.len()))
    }

    /// The call forms OpenBLAS's drivers use, each ending where the
    /// return address points, and bytes that end in no call.
    #[test]
    fn finds_the_call_ending_at_a_return_address() {
        // nop; call rel32
        assert_eq!(decode_before(&[0x90, 0xe8, 0x10, 0x00, 0x00, 0x00]), Some((FlowControl::Call, 5)));
        // mov rax, [rip+x]; call qword ptr [rax+0x358] (the gotoblas table)
        assert_eq!(decode_before(&[0x48, 0x8b, 0x05, 0, 0, 0, 0, 0xff, 0x90, 0x58, 0x03, 0x00, 0x00]), Some((FlowControl::IndirectCall, 6)));
        // call r11, found as `call rbx` (its last two bytes): either way a
        // call ends there, which is all a scan asks of an indirect call.
        assert_eq!(decode_before(&[0x90, 0x41, 0xff, 0xd3]), Some((FlowControl::IndirectCall, 2)));
        // add rsp, 8; ret: no call
        assert_eq!(decode_before(&[0x48, 0x83, 0xc4, 0x08, 0xc3]), None);
        // mov eax, 1 (whose last bytes are no call either)
        assert_eq!(decode_before(&[0xb8, 0x01, 0x00, 0x00, 0x00]), None);
    }
}
