//! obmalloc's probe sites in a stripped build with link-time optimisation
//! (Debian's 3.11, sid's 3.13-3.15), which names neither
//! `allocate_from_new_pool` nor `_PyObject_Malloc` and copies the object
//! allocator into every caller (docs/design/memory.md, "Finding the sites
//! on stripped builds"). Each fact is taken only where two independent
//! sources agree: a uprobe at a wrong address would corrupt the target.
//!
//! - The exported `PyObject_Malloc` holds a copy of the allocator guarded
//!   by `mov slot(%rip),%rax; cmp $X,%rax; jne`: X is the out-of-line
//!   `_PyObject_Malloc`, the allocator this copy stands for while the
//!   pointer in `slot` (`_PyRuntime.allocators.standard.obj.malloc`, 3.11's
//!   static `_PyObject.malloc`) is X. The session checks that pointer in
//!   the target (`AllocSites::guards`).
//! - `allocate_from_new_pool` is the one direct call, not into the PLT, of
//!   that copy, and must be the one of X as well.
//! - Its call sites are every direct call of it in .text (171 in Debian's
//!   3.11, 211 in sid's 3.14: one per inlined copy). Each is probed at the
//!   first branch after the call (a `jcc` or `jmp`, both emulated by the
//!   kernel: about 1 µs, where the call's own entry `endbr64` is
//!   single-stepped at 18.8 µs), on the straight line where rax still holds
//!   the block returned: the pool is that block rounded down to the pool
//!   size. No other code may join that line (the fast path often shares
//!   the `test %rax; jne` that follows, millions of times a second), or
//!   the branch is not used: the return address itself is probed instead
//!   (single-stepped, 19 µs, but only on pool openings), and a call whose
//!   return address other code jumps to is refused.
//! - Allocations over 512 bytes: the copies hand them to libc through
//!   `call malloc@plt` right after a guard on the raw allocator's pointer
//!   (`cmp $_PyMem_RawMalloc`), which the exported `PyMem_RawMalloc` and
//!   `PyObject_Malloc`'s copy must both show. Every such guarded call with
//!   no other code joining between guard and call is probed at the first
//!   branch after it (rax: the chunk, whose size BPF reads from its
//!   header). One join is allowed on that line: the hooked path's (from
//!   the guard's `jne`, an indirect call of whatever allocator the pointer
//!   holds, then a jump back), where rax is also an allocation's result.
//!   Any other join leaves the call out, counted.

use std::collections::HashMap;
use std::ops::Range;

use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind, Register};

use super::alloc_sites::{AllocSites, Guard};
use super::hex_list;
use crate::process::x86;
use crate::python::Python;

/// Bytes of an exported allocator function read at most (PyObject_Malloc:
/// 0xf7 to 0x141 bytes in the builds seen).
const EXPORTED_MAX_BYTES: usize = 1024;

/// Instructions searched on the paths from `_PyObject_Malloc`'s start
/// for its calls (about 100 in the builds seen).
const OUT_OF_LINE_BUDGET: usize = 400;

/// Instructions between a guard's `cmp` and the guarded call (3.14:
/// `jne; test; mov; mov; cmovne; call`).
const GUARD_WINDOW: usize = 8;

/// Moves a compiler puts between a guard's `cmp` and its `jne` (sid's
/// 3.14: a spill, `mov %r11,0x8(%rsp)`).
const MOVES_BEFORE_JNE: usize = 2;

/// Instructions between a guard's load of the allocator pointer and its
/// compare.
const LOAD_WINDOW: usize = 4;

/// Instructions between a call and the branch after it (3.14: `mov; mov;
/// jmp` after allocate_from_new_pool; up to 8 moves restoring spilled
/// registers before the `jne` in 3.11's copies).
const RETURN_WINDOW: usize = 12;

/// Instructions on a guard's hooked path, from its `jne` to the jump back
/// (3.11: `mov; call *%rax; jmp`; sid's 3.14: up to 6 spills and 2 moves
/// before `call *%rax`, 6 restores after it, `jmp`).
const HOOKED_WINDOW: usize = 24;

/// The facts read from the exported functions, before the sweep of .text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// `allocate_from_new_pool`.
    pub new_pool: u64,
    /// The object allocator's guard: X = `_PyObject_Malloc`.
    pub object: Guard,
    /// The raw allocator's guard: `_PyMem_RawMalloc`.
    pub raw: Guard,
    /// Its calloc's: the next slot of the same PyMemAllocatorEx, holding
    /// `_PyMem_RawCalloc` in the file's initialiser (sid's copies compare
    /// with that; the exported PyMem_RawCalloc only jumps through it).
    pub raw_calloc: Option<Guard>,
}

impl Python {
    /// The sites of a stripped LTO build, or the one sentence saying which
    /// sources are missing or disagree.
    pub fn stripped_alloc_sites(&self) -> Result<AllocSites, String> {
        let path = &self.target_path;
        let agreed = self.agreed_allocator()?;
        let malloc_slot = self.elf.plt_slot("malloc").ok_or_else(|| format!("{path} imports no malloc through its PLT, where obmalloc's big allocations would go"))?;
        let calloc_slot = self.elf.plt_slot("calloc");
        let code = self.decoded_text("obmalloc's inlined allocator copies")?;
        let mut stubs = std::collections::HashMap::new();
        let mut stub_of = |target: u64| {
            *stubs.entry(target).or_insert_with(|| {
                if self.is_plt_stub_of(target, Some(malloc_slot)) {
                    Libc::Malloc
                } else if self.is_plt_stub_of(target, calloc_slot) {
                    Libc::Calloc
                } else {
                    Libc::Other
                }
            })
        };
        let sites = sweep(&code, &agreed, &mut stub_of)?;
        Ok(sites)
    }

    /// `allocate_from_new_pool` and the two guards, where the exported
    /// `PyObject_Malloc`, the out-of-line `_PyObject_Malloc` it guards on
    /// and the exported `PyMem_RawMalloc` agree.
    fn agreed_allocator(&self) -> Result<Agreed, String> {
        let path = &self.target_path;
        let exported = |name: &str| -> Result<(u64, Vec<Instruction>), String> {
            let at = self.elf.symbol(name).ok_or_else(|| format!("{path} exports no {name}"))?;
            let code = self.elf.function_code(name, EXPORTED_MAX_BYTES).ok_or_else(|| format!("{path}'s {name} is in no loaded segment"))?;
            Ok((at, x86::decode(code, at)))
        };
        let (malloc_at, malloc) = exported("PyObject_Malloc")?;
        let (_, raw_malloc) = exported("PyMem_RawMalloc")?;
        let guards = guards(&malloc);
        let [object, raw, ..] = guards[..] else {
            return Err(format!(
                "{path}'s PyObject_Malloc holds no inlined copy of obmalloc guarded on the object and raw allocators (found {} guards): a build pytrace does not know",
                guards.len()
            ));
        };
        let raw_exported = guards_of(&raw_malloc).ok_or_else(|| format!("{path}'s PyMem_RawMalloc holds no guard on the raw allocator's pointer"))?;
        if raw_exported != raw {
            return Err(format!(
                "{path}'s PyObject_Malloc and PyMem_RawMalloc disagree on the raw allocator: {:#x} in {:#x} against {:#x} in {:#x}",
                raw.expected, raw.slot, raw_exported.expected, raw_exported.slot
            ));
        }
        let text = self.elf.segment_range(malloc_at).ok_or_else(|| format!("{path}'s PyObject_Malloc is in no loaded segment"))?;
        if !text.contains(&object.expected) {
            return Err(format!("{path}'s PyObject_Malloc guards on {:#x}, outside its code", object.expected));
        }
        let plt = self.plt_sections();
        let in_copy = own_calls(&malloc, &text, &plt);
        let out_of_line = self.own_calls_from(object.expected, &text, &plt);
        let calloc_slot = raw.slot + 8;
        let raw_calloc = self.elf.initial_word(calloc_slot).filter(|f| text.contains(f)).map(|expected| Guard { slot: calloc_slot, expected });
        agreed_new_pool(&in_copy, &out_of_line)
            .map(|new_pool| Agreed { new_pool, object, raw, raw_calloc })
            .map_err(|why| format!("{path}'s PyObject_Malloc and the _PyObject_Malloc it guards on ({:#x}) {why}", object.expected))
    }

    /// The direct calls into `text`, not into the PLT, on the paths from
    /// `start` (an out-of-line function whose size no symbol gives).
    fn own_calls_from(&self, start: u64, text: &Range<u64>, plt: &[Range<u64>]) -> Vec<u64> {
        let read = |at: u64| self.elf.read_static(at, 64.min((text.end - at) as usize)).ok().map(<[u8]>::to_vec);
        x86::search_paths(read, text.clone(), start, (), OUT_OF_LINE_BUDGET, |_| true, |i, _| own_call(i, text, plt))
    }

    /// The link-time ranges of the sections holding PLT stubs.
    fn plt_sections(&self) -> Vec<Range<u64>> {
        [".plt", ".plt.sec", ".plt.got"].iter().filter_map(|s| self.elf.section_at(s)).map(|(at, bytes)| at..at + bytes.len() as u64).collect()
    }
}

/// The one function the inlined copy and the out-of-line allocator both
/// call (allocate_from_new_pool), or why there is none.
fn agreed_new_pool(in_copy: &[u64], out_of_line: &[u64]) -> Result<u64, String> {
    match (in_copy, out_of_line) {
        ([a], [b]) if a == b => Ok(*a),
        ([a], [b]) => Err(format!("call different functions ({a:#x} and {b:#x}) where allocate_from_new_pool would be")),
        _ => Err(format!("do not each call one function of their own (they call {} and {})", hex_list(in_copy), hex_list(out_of_line))),
    }
}

/// A direct call into `text` outside the PLT: its target.
fn own_call(i: &Instruction, text: &Range<u64>, plt: &[Range<u64>]) -> Option<u64> {
    let target = i.near_branch_target();
    (i.mnemonic() == Mnemonic::Call && i.op0_kind() == OpKind::NearBranch64 && text.contains(&target) && !plt.iter().any(|p| p.contains(&target))).then_some(target)
}

fn own_calls(code: &[Instruction], text: &Range<u64>, plt: &[Range<u64>]) -> Vec<u64> {
    let mut out = Vec::new();
    for t in code.iter().filter_map(|i| own_call(i, text, plt)) {
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// The allocator guards in a straight stretch of code, in order: a load
/// `mov slot(%rip),%reg`, within LOAD_WINDOW instructions a `cmp
/// $expected,%reg` with nothing writing reg between, then a `jne` (the
/// pointer is not the expected function: call it through the pointer).
/// Returns each guard with the index of its `jne`.
fn guard_sites(code: &[Instruction]) -> Vec<(usize, Guard)> {
    let mut out = Vec::new();
    for (k, cmp) in code.iter().enumerate() {
        let compares = cmp.mnemonic() == Mnemonic::Cmp && cmp.op_count() == 2 && cmp.op0_kind() == OpKind::Register && cmp.op0_register().is_gpr64() && cmp.op1_kind() == OpKind::Immediate32to64;
        if !compares {
            continue;
        }
        // The jne, after at most MOVES_BEFORE_JNE moves (which keep the flags).
        let Some(jne) = (k + 1..code.len()).take(MOVES_BEFORE_JNE + 1).find(|&j| code[j].mnemonic() != Mnemonic::Mov) else { continue };
        if code[jne].mnemonic() != Mnemonic::Jne {
            continue;
        }
        let register = cmp.op0_register();
        for load in code[k.saturating_sub(LOAD_WINDOW)..k].iter().rev() {
            let loads = load.mnemonic() == Mnemonic::Mov && load.op_count() == 2 && load.op0_kind() == OpKind::Register && load.op0_register() == register && load.op1_kind() == OpKind::Memory && load.is_ip_rel_memory_operand();
            if loads {
                out.push((jne, Guard { slot: load.ip_rel_memory_address(), expected: cmp.immediate32to64() as u64 }));
                break;
            }
            if x86::writes_register(load, register) || x86::leaves_straight_line(load) {
                break;
            }
        }
    }
    out
}

/// Instructions from a copy's guard to its size check's `lea` (Debian's
/// 3.11: none; its exported PyObject_Malloc puts a `sub` before the `cmp`).
const SIZE_CHECK_WINDOW: usize = 4;

/// An inlined copy's size check, on the straight line after its guard's
/// `jne` (`after` starts there): `lea -0x1(%size),%rax`, then, past
/// instructions that leave rax alone, `cmp $0x1ff,%rax; ja`. Returns the
/// `ja` (emulated by the kernel; every call through the copy reaches it,
/// rax + 1 the size asked) and the size's register.
fn size_check(after: &[Instruction]) -> Option<(u64, Register)> {
    let at = after.iter().take(SIZE_CHECK_WINDOW).position(|i| i.mnemonic() == Mnemonic::Lea)?;
    let lea = &after[at];
    let minus_one = lea.op0_register() == Register::RAX && lea.memory_index() == Register::None && lea.memory_displacement64() == u64::MAX && lea.memory_base().is_gpr64();
    if !minus_one || after[..at].iter().any(|i| i.flow_control() != FlowControl::Next) {
        return None;
    }
    for (k, i) in after.iter().enumerate().skip(at + 1).take(SIZE_CHECK_WINDOW) {
        if i.mnemonic() == Mnemonic::Cmp && i.op0_register() == Register::RAX && i.op1_kind() == OpKind::Immediate32to64 && i.immediate32to64() == 0x1ff {
            let ja = after.get(k + 1).filter(|j| j.mnemonic() == Mnemonic::Ja)?;
            return Some((ja.ip(), lea.memory_base()));
        }
        if i.flow_control() != FlowControl::Next || x86::writes_register(i, Register::RAX) {
            return None;
        }
    }
    None
}

fn guards(code: &[Instruction]) -> Vec<Guard> {
    guard_sites(code).into_iter().map(|(_, g)| g).collect()
}

/// The first guard of a function, if any.
fn guards_of(code: &[Instruction]) -> Option<Guard> {
    guards(code).first().copied()
}

/// Every direct branch target in `code` (where other code joins a line),
/// with how many branches jump there.
pub(super) fn join_points(code: &[Instruction]) -> HashMap<u64, usize> {
    let mut joins = HashMap::new();
    for i in code.iter().filter(|i| matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch) && i.op0_kind() == OpKind::NearBranch64) {
        *joins.entry(i.near_branch_target()).or_insert(0) += 1;
    }
    joins
}

/// The first branch after a call (`after` starts right after it), on the
/// straight line within RETURN_WINDOW instructions, with rax unwritten:
/// emulated by the kernel, and where rax is what the call returned. With
/// `joins`, None if other code can enter the line between, but by one
/// branch to `allowed`.
pub(super) fn branch_after(after: &[Instruction], joins: Option<&HashMap<u64, usize>>, allowed: Option<u64>) -> Option<u64> {
    for i in after.iter().take(RETURN_WINDOW) {
        if let Some(&n) = joins.and_then(|j| j.get(&i.ip())) {
            if Some(i.ip()) != allowed || n != 1 {
                return None;
            }
        }
        let emulated = i.op0_kind() == OpKind::NearBranch64 && matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch);
        if emulated {
            return Some(i.ip());
        }
        if i.flow_control() != FlowControl::Next || x86::writes_register(i, Register::RAX) {
            return None;
        }
    }
    None
}

/// Whether the call at `code[k]` runs only past `raw`'s guard: its `jne`
/// within GUARD_WINDOW instructions before, and nothing joining or leaving
/// the line between. Returns the `jne`'s target (the hooked path).
fn guarded_by(code: &[Instruction], k: usize, raw: Guard, joins: &HashMap<u64, usize>) -> Option<u64> {
    let from = k.saturating_sub(GUARD_WINDOW + LOAD_WINDOW + 1);
    let window = &code[from..k];
    let &(jne, _) = guard_sites(window).iter().rev().find(|(_, g)| *g == raw)?;
    let alone = window[jne + 1..].iter().chain(std::iter::once(&code[k])).all(|i| !joins.contains_key(&i.ip())) && window[jne + 1..].iter().all(|i| !x86::leaves_straight_line(i));
    alone.then(|| window[jne].near_branch_target())
}

/// Where a guard's hooked path, starting at `from` (its `jne`'s target),
/// jumps back: a straight line through one indirect call (of the
/// allocator the pointer holds) to a direct `jmp`, with rax (that call's
/// result) unwritten after the call. None for any other shape (a tail
/// call, a branch, no call, rax overwritten).
fn hooked_return(code: &[Instruction], from: u64) -> Option<u64> {
    let start = code.binary_search_by_key(&from, Instruction::ip).ok()?;
    let mut called = false;
    for i in code[start..].iter().take(HOOKED_WINDOW) {
        match i.flow_control() {
            FlowControl::Next if called && x86::writes_register(i, Register::RAX) => return None,
            FlowControl::Next => {}
            FlowControl::IndirectCall if !called => called = true,
            FlowControl::UnconditionalBranch if called && i.op0_kind() == OpKind::NearBranch64 => return Some(i.near_branch_target()),
            _ => return None,
        }
    }
    None
}

/// The sites in the decoded .text: each call of allocate_from_new_pool's
/// branch after it, each guarded `call malloc@plt` and its branch after.
/// What a PLT stub a call enters imports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Libc {
    Malloc,
    Calloc,
    Other,
}

fn sweep(code: &[Instruction], agreed: &Agreed, mut stub_of: impl FnMut(u64) -> Libc) -> Result<AllocSites, String> {
    let joins = join_points(code);
    let mut sites = AllocSites::default();
    let (mut joined, mut unguarded) = (Vec::new(), 0);
    for (k, call) in code.iter().enumerate() {
        if call.mnemonic() != Mnemonic::Call || call.op0_kind() != OpKind::NearBranch64 {
            continue;
        }
        let target = call.near_branch_target();
        if target == agreed.new_pool {
            // Else the return address itself, single-stepped (about 19
            // µs, on pool openings only: 1-2 thousand a second) when
            // nothing else jumps there.
            match branch_after(&code[k + 1..], Some(&joins), None) {
                Some(at) => sites.pool_opened.push(at),
                None if !joins.contains_key(&call.next_ip()) => {
                    sites.pool_opened.push(call.next_ip());
                    sites.pool_stepped += 1;
                }
                None => joined.push(call.ip()),
            }
        } else {
            let (guard, returned) = match stub_of(target) {
                Libc::Malloc => (Some(agreed.raw), &mut sites.raw_returned),
                Libc::Calloc => (agreed.raw_calloc, &mut sites.calloc_returned),
                Libc::Other => continue,
            };
            let Some(hooked) = guard.and_then(|g| guarded_by(code, k, g, &joins)) else {
                unguarded += 1;
                continue;
            };
            match branch_after(&code[k + 1..], Some(&joins), hooked_return(code, hooked)) {
                Some(at) => returned.push(at),
                None => sites.raw_joined += 1,
            }
        }
    }
    if !joined.is_empty() {
        return Err(format!(
            "{} of the {} calls of allocate_from_new_pool ({:#x}) have no branch after them that only they reach (at {}): pool openings there could not be told from ordinary allocations",
            joined.len(),
            joined.len() + sites.pool_opened.len(),
            agreed.new_pool,
            hex_list(&joined)
        ));
    }
    if sites.pool_opened.is_empty() || sites.raw_returned.is_empty() {
        return Err(format!("no call of allocate_from_new_pool ({:#x}) or no guarded call of malloc found in .text", agreed.new_pool));
    }
    for (jne, guard) in guard_sites(code) {
        if guard != agreed.object {
            continue;
        }
        match size_check(&code[jne + 1..]) {
            Some(site) => sites.object_sized.push(site),
            None => sites.object_unsized += 1,
        }
    }
    sites.guards = [Some(agreed.object), Some(agreed.raw), agreed.raw_calloc].into_iter().flatten().collect();
    sites.unguarded_mallocs = unguarded;
    Ok(sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian 3.11's PyObject_Malloc from 0x4fb3f6, as objdump shows it:
    ///   4fb3f6: call 4fb540 <allocate_from_new_pool>; test %rax,%rax; jne 4fb3b0
    ///   4fb400: mov 0x45ec61(%rip),%rax  # 95a068: _PyMem_Raw.malloc
    ///           mov 0x45ec52(%rip),%rdi; cmp $0x4f7350,%rax; jne 4fb440
    ///   4fb416: test %rbx,%rbx; mov $1,%edi; cmovne %rbx,%rdi; call 41f610 <malloc@plt>
    ///   4fb427: test %rax,%rax; je 4260bf
    ///   4fb430: addq $1,0x588f68(%rip); pop %rbx; ret; mov %rbx,%rsi; pop %rbx; jmp *%rax
    ///   4fb440: mov %rbx,%rsi; call *%rax; jmp 4fb427  (the hooked path)
    const AT: u64 = 0x4fb3f6;
    const CODE: [u8; 81] = [
        0xe8, 0x45, 0x01, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x75, 0xb0, // call; test; jne
        0x48, 0x8b, 0x05, 0x61, 0xec, 0x45, 0x00, 0x48, 0x8b, 0x3d, 0x52, 0xec, 0x45, 0x00, // mov; mov
        0x48, 0x3d, 0x50, 0x73, 0x4f, 0x00, 0x75, 0x2a, // cmp; jne
        0x48, 0x85, 0xdb, 0xbf, 0x01, 0x00, 0x00, 0x00, 0x48, 0x0f, 0x45, 0xfb, 0xe8, 0xe9, 0x41, 0xf2, 0xff, // test; mov; cmovne; call
        0x48, 0x85, 0xc0, 0x0f, 0x84, 0x8f, 0xac, 0xf2, 0xff, // test; je
        0x48, 0x83, 0x05, 0x68, 0x8f, 0x58, 0x00, 0x01, 0x5b, 0xc3, // addq; pop; ret
        0x48, 0x89, 0xde, 0x5b, 0xff, 0xe0, // mov; pop; jmp *%rax
        0x48, 0x89, 0xde, 0xff, 0xd0, 0xeb, 0xe0, // mov; call *%rax; jmp 4fb427
    ];
    const RAW: Guard = Guard { slot: 0x95a068, expected: 0x4f7350 };
    const AGREED: Agreed = Agreed { new_pool: 0x4fb540, object: Guard { slot: 0x959f48, expected: 0x4fb450 }, raw: RAW, raw_calloc: None };
    fn stub(target: u64) -> Libc {
        if target == 0x41f610 { Libc::Malloc } else { Libc::Other }
    }

    #[test]
    fn reads_the_raw_guard_and_the_sites_after_calls() {
        let code = x86::decode(&CODE, AT);
        assert_eq!(guards(&code), [RAW]);
        let sites = sweep(&code, &AGREED, stub).unwrap();
        assert_eq!(sites.pool_opened, [0x4fb3fe], "the jne after the call");
        assert_eq!(sites.raw_returned, [0x4fb42a], "the je after the call, which the hooked path joins too");
        assert_eq!((sites.pool_stepped, sites.unguarded_mallocs, sites.raw_joined), (0, 0, 0));
    }

    /// The line after a raw call may be joined by its guard's hooked path
    /// alone (rax there is that allocator's result): a second branch to
    /// the same place, another join, or a hooked path of another shape
    /// leaves the call out, counted.
    #[test]
    fn only_the_hooked_path_may_join_the_line_after_a_raw_call() {
        let code = x86::decode(&CODE, AT);
        assert_eq!(hooked_return(&code, 0x4fb440), Some(0x4fb427));
        assert_eq!(hooked_return(&code, 0x4fb43a), None, "a tail call does not come back");
        // mov %rbx,%rsi; call *%rax; mov %rbx,%rax; jmp 4fb427: rax is no longer the result.
        let overwritten = x86::decode(&[0x48, 0x89, 0xde, 0xff, 0xd0, 0x48, 0x89, 0xd8, 0xeb, 0xdd], 0x4fb440);
        assert_eq!(hooked_return(&overwritten, 0x4fb440), None, "rax written after the call");
        let before = |bytes: &[u8]| x86::decode(bytes, 0x4fb3f2)[0];
        for (join, what) in [(before(&[0xeb, 0x33]), "a second jump to the hooked path's target"), (before(&[0xeb, 0x36]), "a jump to the branch itself")] {
            let mut joined = code.clone();
            joined.insert(0, join);
            let err = sweep(&joined, &AGREED, stub).unwrap_err();
            assert!(err.contains("no guarded call of malloc"), "{what}: {err}");
        }
        // The hooked path ending in a branch elsewhere is no hooked path.
        let mut other = code.clone();
        let last = other.len() - 1;
        other[last] = x86::decode(&[0xeb, 0xe3], 0x4fb445)[0]; // jmp 4fb42a
        assert_eq!(hooked_return(&other, 0x4fb440), Some(0x4fb42a));
        assert!(sweep(&other, &AGREED, stub).is_ok(), "a hooked path may join at the branch too");
    }

    /// A copy's size check after its guard, Debian 3.11's at 0x5000d5:
    ///   5000cf: jne 50078e
    ///   5000d5: lea -0x1(%rsi),%rax; cmp $0x1ff,%rax; ja 50042f
    /// and the exported PyObject_Malloc's, with a `sub` between:
    ///   4fb450: lea -0x1(%rsi),%rax; sub $0x18,%rsp; cmp $0x1ff,%rax; ja 4fb52e
    #[test]
    fn reads_a_copys_size_check() {
        let copy = x86::decode(&[0x48, 0x8d, 0x46, 0xff, 0x48, 0x3d, 0xff, 0x01, 0x00, 0x00, 0x0f, 0x87, 0x4a, 0x03, 0x00, 0x00], 0x5000d5);
        assert_eq!(size_check(&copy), Some((0x5000df, Register::RSI)));
        let exported = x86::decode(&[0x48, 0x8d, 0x46, 0xff, 0x48, 0x83, 0xec, 0x18, 0x48, 0x3d, 0xff, 0x01, 0x00, 0x00, 0x0f, 0x87, 0xca, 0x00, 0x00, 0x00], 0x4fb450);
        assert_eq!(size_check(&exported), Some((0x4fb45e, Register::RSI)));
        // A write to rax between (here `lea -0x2(%rsi),%rax`) is not the check.
        let other = x86::decode(&[0x48, 0x8d, 0x46, 0xff, 0x48, 0x8d, 0x46, 0xfe, 0x48, 0x3d, 0xff, 0x01, 0x00, 0x00, 0x0f, 0x87, 0xca, 0x00, 0x00, 0x00], 0x4fb450);
        assert_eq!(size_check(&other), None);
    }

    /// Other code jumping to the branch after the call (as the fast path
    /// does in many of sid's copies) moves the probe to the return address;
    /// jumping to the return address itself leaves no site: refused.
    #[test]
    fn a_joined_line_moves_the_site_or_refuses() {
        let mut code = x86::decode(&CODE, AT);
        let jump_to = |target: u64| x86::decode(&[0xeb, (target.wrapping_sub(0x4fb3f4) as u8)], 0x4fb3f2)[0];
        code.insert(0, jump_to(0x4fb3fe));
        let sites = sweep(&code, &AGREED, stub).unwrap();
        assert_eq!((sites.pool_opened.as_slice(), sites.pool_stepped), (&[0x4fb3fb][..], 1), "the return address, single-stepped");
        code[0] = jump_to(0x4fb3fb);
        let sites = sweep(&code, &AGREED, stub);
        assert!(sites.unwrap_err().contains("1 of the 1 calls of allocate_from_new_pool (0x4fb540) have no branch after them"));
    }

    /// A guard on another allocator pointer, or a join between guard and
    /// call, leaves the malloc call out (not obmalloc's, or not only).
    #[test]
    fn a_malloc_call_without_the_raw_guard_is_left_out() {
        let code = x86::decode(&CODE, AT);
        let other = Agreed { raw: Guard { slot: 0x95a068, expected: 0x4f7360 }, ..AGREED };
        assert!(sweep(&code, &other, stub).unwrap_err().contains("no guarded call of malloc"));
        let mut joined = code.clone();
        joined.insert(0, x86::decode(&[0xeb, 0x22], 0x4fb3f2)[0]); // jmp 0x4fb416, past the guard
        assert!(sweep(&joined, &AGREED, stub).unwrap_err().contains("no guarded call of malloc"));
    }

    #[test]
    fn the_copy_and_the_out_of_line_allocator_must_call_one_same_function() {
        assert_eq!(agreed_new_pool(&[0x4fb540], &[0x4fb540]), Ok(0x4fb540));
        assert!(agreed_new_pool(&[0x4fb540], &[0x4fb550]).unwrap_err().contains("call different functions (0x4fb540 and 0x4fb550)"));
        assert!(agreed_new_pool(&[0x4fb540, 0x500000], &[0x4fb540]).unwrap_err().contains("do not each call one function of their own"));
        assert!(agreed_new_pool(&[], &[0x4fb540]).unwrap_err().contains("they call nothing and 0x4fb540"));
    }
}

/// The search on the real stripped builds: the sites it finds against the
/// disassembly (objdump, addresses pasted in the comments) and the counts
/// of the design's survey (docs/design/memory.md).
#[cfg(test)]
mod on_real_builds {
    use std::path::Path;

    use super::Guard;
    use crate::python::Python;

    fn sid(version: &str) -> std::path::PathBuf {
        let root = std::env::var_os("PYTRACE_ROOT_SID").map(std::path::PathBuf::from).unwrap_or_else(|| "/var/cache/pytrace/root-sid".into());
        root.join(format!("usr/bin/python{version}"))
    }

    /// Every stripped build: two allocator guards, every call of the one
    /// allocate_from_new_pool probed, and the raw calls found; on Debian's
    /// 3.11 the addresses objdump shows.
    #[test]
    fn finds_the_sites_of_debians_and_sids_builds() {
        for path in [Path::new("/usr/bin/python3.11").to_path_buf(), sid("3.13"), sid("3.14"), sid("3.15")] {
            let python = Python::from_executable(&path, None).unwrap().unwrap();
            assert!(python.elf.symbol("allocate_from_new_pool").is_none(), "{} is stripped", path.display());
            let s = python.alloc_sites().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(s.guards.len() >= 2, "{}", path.display());
            // The design's survey: 171 to 254 inlined copies, each a call.
            assert!((170..=260).contains(&s.pool_opened.len()), "{}: {} pool sites", path.display(), s.pool_opened.len());
            assert!(s.pool_stepped <= 3, "{}: {} single-stepped pool sites", path.display(), s.pool_stepped);
            // 165, 203, 160, 156; the joined: 0, 2 (sid's 3.13: a second
            // branch to the line after the call, besides the hooked path's), 0, 0.
            assert!(s.raw_returned.len() >= 150 && s.raw_joined <= 2, "{}: {} raw sites, {} joined", path.display(), s.raw_returned.len(), s.raw_joined);
        }
        let python = Python::from_executable(Path::new("/usr/bin/python3.11"), None).unwrap().unwrap();
        let s = python.alloc_sites().unwrap();
        // 4fb36b: cmp $0x4fb450,%rax after mov 0x45ebe7(%rip),%rax  # 959f48
        // 4fb40e: cmp $0x4f7350,%rax after mov 0x45ec61(%rip),%rax  # 95a068
        assert_eq!(s.guards[..2], [Guard { slot: 0x959f48, expected: 0x4fb450 }, Guard { slot: 0x95a068, expected: 0x4f7350 }]);
        // 4fb3f6: call 4fb540; 4fb3fb: test %rax,%rax; 4fb3fe: jne 4fb3b0
        assert!(s.pool_opened.contains(&0x4fb3fe));
        // 4fb422: call 41f610 <malloc@plt>; 4fb427: test; 4fb42a: je
        assert!(s.raw_returned.contains(&0x4fb42a));
    }
}
