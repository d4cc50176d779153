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

use std::ops::Range;

use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind, Register};

use super::alloc_sites::{AllocSites, CopySite, CopySize, Guard};
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
    /// Its realloc's, the slot after (`_PyMem_RawRealloc`): obmalloc's
    /// reallocations of blocks over 512 bytes call libc's realloc past it.
    pub raw_realloc: Option<Guard>,
    /// The mem domain's guard (PyMem_Malloc's copies: `_PyMem.malloc`, on
    /// the same X), where the exported PyMem_Malloc shows one.
    pub mem: Option<Guard>,
    /// Where `usedpools` is, if the exported PyObject_Malloc's copy and the
    /// out-of-line allocator index it at the same place: what gives a
    /// constant-size copy its size class.
    pub usedpools: Option<Pools>,
}

/// Where obmalloc's `usedpools` array is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pools {
    /// At a constant address (3.11's static array).
    Static(u64),
    /// `at` bytes into the obmalloc state that the interpreter points to
    /// from `state` bytes into itself (3.13-3.15: `mov 0x2a98(%rax),%r15`,
    /// then `mov (%r15,%rax,8),%rax`).
    InState { state: u64, at: u64 },
}

impl Python {
    /// The sites of a stripped LTO build, or the one sentence saying which
    /// sources are missing or disagree.
    pub fn stripped_alloc_sites(&self) -> Result<AllocSites, String> {
        let path = &self.target_path;
        let agreed = self.agreed_allocator()?;
        let malloc_slot = self.elf.plt_slot("malloc").ok_or_else(|| format!("{path} imports no malloc through its PLT, where obmalloc's big allocations would go"))?;
        let calloc_slot = self.elf.plt_slot("calloc");
        let realloc_slot = self.elf.plt_slot("realloc");
        let text = Text::of(self)?;
        let mut stubs = std::collections::HashMap::new();
        let mut stub_of = |target: u64| {
            *stubs.entry(target).or_insert_with(|| {
                if self.is_plt_stub_of(target, Some(malloc_slot)) {
                    Libc::Malloc
                } else if self.is_plt_stub_of(target, calloc_slot) {
                    Libc::Calloc
                } else if self.is_plt_stub_of(target, realloc_slot) {
                    Libc::Realloc
                } else {
                    Libc::Other
                }
            })
        };
        sweep(&text, &agreed, &mut stub_of)
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
        let realloc_slot = raw.slot + 16;
        let raw_realloc = self.elf.initial_word(realloc_slot).filter(|f| text.contains(f)).map(|expected| Guard { slot: realloc_slot, expected });
        let mem = exported("PyMem_Malloc").ok().and_then(|(_, code)| guards_of(&code)).filter(|g| g.expected == object.expected && g.slot != object.slot);
        let read = |at: u64| self.elf.read_static(at, 64.min((text.end - at) as usize)).ok().map(<[u8]>::to_vec);
        let out_of_line_pools = x86::search_paths(read, text.clone(), object.expected, StateLoads::default(), OUT_OF_LINE_BUDGET, |_| true, |i, loads| loads.see(i));
        let mut loads = StateLoads::default();
        let usedpools = match (malloc.iter().find_map(|i| loads.see(i)), out_of_line_pools.first()) {
            (Some(a), Some(b)) if a == *b => Some(a),
            _ => None,
        };
        agreed_new_pool(&in_copy, &out_of_line)
            .map(|new_pool| Agreed { new_pool, object, raw, raw_calloc, raw_realloc, mem, usedpools })
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

/// `cmp $imm32,%reg64`: how a guard compares the pointer it loaded with
/// the function it expects.
fn guard_compare(cmp: &Instruction) -> bool {
    cmp.mnemonic() == Mnemonic::Cmp && cmp.op_count() == 2 && cmp.op0_kind() == OpKind::Register && cmp.op0_register().is_gpr64() && cmp.op1_kind() == OpKind::Immediate32to64
}

/// The allocator guards in a straight stretch of code, in order: a load
/// `mov slot(%rip),%reg`, within LOAD_WINDOW instructions a `cmp
/// $expected,%reg` with nothing writing reg between, then a `jne` (the
/// pointer is not the expected function: call it through the pointer).
/// Returns each guard with the index of its `jne`.
fn guard_sites(code: &[Instruction]) -> Vec<(usize, Guard)> {
    let mut out = Vec::new();
    for (k, cmp) in code.iter().enumerate() {
        if !guard_compare(cmp) {
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

/// Straight-line instructions searched after a copy's guard for what
/// gives its size (Debian's 3.11: the check comes first; sid's 3.13-3.15
/// load the interpreter's obmalloc state first, 3 to 6 moves).
const SIZE_WINDOW: usize = 12;

/// Size classes of obmalloc's pools (512 bytes in steps of 16, 3.8-3.15):
/// a slot of `usedpools` past them is no pool list.
const SIZE_CLASSES: u64 = 32;

/// What an inlined copy's code shows of the size asked, on the straight
/// line after its guard's `jne` (at `jne`; `after` starts past it), and
/// where a probe reads it; None if nothing does (counted unsized):
/// - `cmp $0x1ff,%reg; ja` (or `jbe`): obmalloc's own check
///   `nbytes - 1 < 512`, so reg + 1 is the size on every path that reaches
///   the jump, which is probed;
/// - `cmp $0x200,%reg; ja` (or `jbe`): the same check where the compiler
///   knows the size is not 0 (PyBytes_FromStringAndSize's copy): reg;
///   signed (`jg`, `jle`) where it knows the size is not negative (sid's
///   PyUnicode_FromString);
/// - `lea -0x1(%reg),%e..; shr $0x4,%e..` with no check before it: a
///   size the compiler knows is at most 512, turned into its size class.
///   The `jne` is probed, so reg must be written by nothing between;
/// - with no check, a load of `usedpools[index]` by a register set before
///   the guard (sid's PyDict_SetItem: `mov $0xe,%eax` before it, `mov
///   (%r9,%rax,8),%rdx` after): the `jne`, the class's block size from
///   that register;
/// - with no check, a load of a `usedpools` slot at a constant address
///   (3.11's static array, `usedpools` agreed by two sources): a constant
///   size, of which the code keeps only the class. The `jne` is probed,
///   with the class's block size.
fn copy_size(jne: u64, after: &[Instruction], usedpools: Option<Pools>) -> Option<CopySite> {
    let mut loads = StateLoads::default();
    for (k, i) in after.iter().enumerate().take(SIZE_WINDOW) {
        let next = after.get(k + 1);
        if i.mnemonic() == Mnemonic::Cmp && i.op0_kind() == OpKind::Register && i.op0_register().is_gpr64() && i.op1_kind() == OpKind::Immediate32to64 {
            let plus_one = match i.immediate32to64() {
                0x1ff => true,
                0x200 => false,
                _ => return None,
            };
            let jump = next.filter(|j| matches!(j.mnemonic(), Mnemonic::Ja | Mnemonic::Jbe | Mnemonic::Jg | Mnemonic::Jle))?;
            return Some(CopySite { at: jump.ip(), size: CopySize::Register { number: x86::register_number(i.op0_register())?, plus_one } });
        }
        if i.mnemonic() == Mnemonic::Lea && i.memory_index() == Register::None && i.memory_displacement64() == u64::MAX && i.memory_base().is_gpr64() {
            let (base, class) = (i.memory_base(), i.op0_register().full_register());
            let shifts = next.is_some_and(|s| s.mnemonic() == Mnemonic::Shr && s.op0_kind() == OpKind::Register && s.op0_register().full_register() == class && s.op1_kind() == OpKind::Immediate8 && s.immediate8() == 4);
            if shifts {
                // Written between: only a constant move is understood (sid's
                // 3.13: `mov $0x1c,%edx` before `lea -0x1(%rdx),%esi`).
                return match after[..k].iter().rev().find(|w| x86::writes_register(w, base)) {
                    None => Some(CopySite { at: jne, size: CopySize::Register { number: x86::register_number(base)?, plus_one: false } }),
                    Some(w) => constant_move(w).filter(|&b| (1..=SIZE_CLASSES * 16).contains(&b)).map(|b| CopySite { at: jne, size: CopySize::Constant { bytes: b as u32, exact: true } }),
                };
            }
        }
        if let Some(index) = pool_index(i, usedpools, &loads).filter(|&r| !after[..k].iter().any(|w| x86::writes_register(w, r))) {
            return Some(CopySite { at: jne, size: CopySize::PoolIndex { number: x86::register_number(index)? } });
        }
        let slot = match usedpools {
            _ if !(i.mnemonic() == Mnemonic::Mov && i.op1_kind() == OpKind::Memory && i.memory_index() == Register::None) => None,
            Some(Pools::Static(pools)) if i.is_ip_rel_memory_operand() => i.ip_rel_memory_address().checked_sub(pools),
            Some(Pools::InState { state, at }) if loads.state_in(i.memory_base()) == Some(state) => i.memory_displacement64().checked_sub(at),
            _ => None,
        };
        if let Some(slot) = slot.filter(|&o| o < SIZE_CLASSES * 16 && o % 16 == 0) {
            return Some(CopySite { at: jne, size: CopySize::Constant { bytes: (slot / 16 + 1) as u32 * 16, exact: false } });
        }
        loads.see(i);
        if i.flow_control() != FlowControl::Next {
            return None;
        }
    }
    None
}

/// A load of `usedpools[index]` (`mov (%r9,%rax,8),%rdx` with r9 the
/// obmalloc state, or 3.11's `mov 0x959d20(,%rax,8),%rax`): the index's
/// register.
fn pool_index(i: &Instruction, usedpools: Option<Pools>, loads: &StateLoads) -> Option<Register> {
    (usedpools.is_some() && loads.indexed(i) == usedpools).then(|| i.memory_index())
}

/// `mov $imm,%reg`: imm.
fn constant_move(i: &Instruction) -> Option<u64> {
    let moves = i.mnemonic() == Mnemonic::Mov && i.op_count() == 2 && i.op0_kind() == OpKind::Register;
    let immediate = matches!(i.op1_kind(), OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64);
    (moves && immediate).then(|| i.immediate(1))
}

/// What a straight line loaded from memory at a displacement with no
/// index (`mov 0x2a98(%rax),%r15`), per register, to tell an indexed load
/// of `usedpools` by a size class where it is.
#[derive(Debug, Clone, Copy, Default)]
struct StateLoads([Option<u64>; 16]);

impl StateLoads {
    /// The obmalloc state's offset in the interpreter, if `base` holds
    /// what a load from that offset gave.
    fn state_in(&self, base: Register) -> Option<u64> {
        x86::register_number(base).and_then(|n| self.0[n as usize])
    }

    /// Where `i` indexes `usedpools` by a size class, if it does (3.11:
    /// `lea (%rdi,%rdi,1),%eax; mov 0x959d20(,%rax,8),%rax`; 3.13-3.15
    /// `mov (%r15,%rax,8),%rax` after `mov 0x2a98(%rax),%r15`).
    fn indexed(&self, i: &Instruction) -> Option<Pools> {
        let indexed = i.mnemonic() == Mnemonic::Mov && i.op_count() == 2 && i.op0_kind() == OpKind::Register && i.op1_kind() == OpKind::Memory && i.memory_index().is_gpr64() && i.memory_index_scale() == 8;
        match i.memory_base() {
            _ if !indexed => None,
            Register::None => Some(Pools::Static(i.memory_displacement64())),
            base => self.state_in(base).map(|state| Pools::InState { state, at: i.memory_displacement64() }),
        }
    }

    /// `i` seen: what it writes is remembered (a plain load's
    /// displacement, or nothing); returns `indexed(i)`.
    fn see(&mut self, i: &Instruction) -> Option<Pools> {
        let found = self.indexed(i);
        let written = (i.op_count() > 0 && i.op0_kind() == OpKind::Register && !matches!(i.mnemonic(), Mnemonic::Cmp | Mnemonic::Test)).then(|| x86::register_number(i.op0_register())).flatten();
        if let Some(n) = written {
            let plain = i.mnemonic() == Mnemonic::Mov && i.op1_kind() == OpKind::Memory && !i.is_ip_rel_memory_operand() && i.memory_index() == Register::None && i.memory_base().is_gpr64();
            self.0[n as usize] = plain.then(|| i.memory_displacement64());
        }
        found
    }
}

fn guards(code: &[Instruction]) -> Vec<Guard> {
    guard_sites(code).into_iter().map(|(_, g)| g).collect()
}

/// The first guard of a function, if any.
fn guards_of(code: &[Instruction]) -> Option<Guard> {
    guards(code).first().copied()
}

/// Every direct branch target in a .text (where other code joins a line),
/// once per branch that jumps there: sorted, and searched by halves. A
/// CPython's .text has some 300,000 branches, and a hash map of them was
/// the costliest step of the memory probes' site search.
pub(super) struct JoinPoints(Vec<u64>);

impl JoinPoints {
    pub(super) fn of(code: &[Instruction]) -> Self {
        Self::sorted(code.iter().filter_map(direct_branch_target).collect())
    }

    fn sorted(mut targets: Vec<u64>) -> Self {
        targets.sort_unstable();
        JoinPoints(targets)
    }

    /// How many branches jump to `ip`.
    pub(super) fn count(&self, ip: u64) -> usize {
        let from = self.0.partition_point(|&t| t < ip);
        self.0[from..].iter().take_while(|&&t| t == ip).count()
    }

    pub(super) fn contains(&self, ip: u64) -> bool {
        self.0.binary_search(&ip).is_ok()
    }
}

/// Where a direct jump or conditional branch goes (other code joins there).
fn direct_branch_target(i: &Instruction) -> Option<u64> {
    (matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch) && i.op0_kind() == OpKind::NearBranch64).then(|| i.near_branch_target())
}

/// The code `sweep` searches, read in two passes: once whole, in order,
/// and then again in short windows around what the first pass found. A
/// CPython's .text is some 700,000 instructions: held decoded at once (28
/// MB), it cost `memory` much of its start-up, mostly in the kernel zeroing
/// its pages.
trait Listing {
    /// Hands each instruction, in order, to `each` with its index; once.
    fn scan(&self, each: &mut dyn FnMut(usize, &Instruction)) -> Result<(), String>;
    /// The instructions of indexes `from..to` (after `scan`), clipped to
    /// the listing's end.
    fn window(&self, from: usize, to: usize) -> Vec<Instruction>;
    /// The index of the instruction that starts at `ip`, if one does.
    fn index_of(&self, ip: u64) -> Option<usize>;
}

/// Code decoded already (the exported functions, the unit tests).
impl Listing for [Instruction] {
    fn scan(&self, each: &mut dyn FnMut(usize, &Instruction)) -> Result<(), String> {
        self.iter().enumerate().for_each(|(k, i)| each(k, i));
        Ok(())
    }

    fn window(&self, from: usize, to: usize) -> Vec<Instruction> {
        self[from.min(self.len())..to.min(self.len())].to_vec()
    }

    fn index_of(&self, ip: u64) -> Option<usize> {
        self.binary_search_by_key(&ip, Instruction::ip).ok()
    }
}

/// What the sweep looks for in .text, as its refusals name it.
const SEARCHED: &str = "obmalloc's inlined allocator copies";

/// The interpreter's .text: the scan keeps only where each instruction
/// starts (4 bytes each), from which a window is decoded again.
struct Text<'a> {
    python: &'a Python,
    at: u64,
    bytes: &'a [u8],
    starts: std::cell::OnceCell<Vec<u32>>,
}

impl<'a> Text<'a> {
    fn of(python: &'a Python) -> Result<Self, String> {
        let (at, bytes) = python.elf.section_at(".text").ok_or_else(|| format!("{} has no .text section to search for {SEARCHED}", python.target_path))?;
        Ok(Text { python, at, bytes, starts: std::cell::OnceCell::new() })
    }
}

impl Listing for Text<'_> {
    fn scan(&self, each: &mut dyn FnMut(usize, &Instruction)) -> Result<(), String> {
        // A 4 GB .text is refused by scan_text long before offsets overflow.
        let mut starts = Vec::with_capacity(self.bytes.len() / 4);
        self.python.scan_text(SEARCHED, |i| {
            each(starts.len(), i);
            starts.push((i.ip() - self.at) as u32);
        })?;
        self.starts.set(starts).map_err(|_| "the .text was scanned twice".to_string())
    }

    fn window(&self, from: usize, to: usize) -> Vec<Instruction> {
        let Some(starts) = self.starts.get() else { return Vec::new() };
        let (from, to) = (from.min(starts.len()), to.min(starts.len()));
        let Some(&offset) = starts.get(from) else { return Vec::new() };
        let mut decoder = iced_x86::Decoder::with_ip(64, &self.bytes[offset as usize..], self.at + offset as u64, iced_x86::DecoderOptions::NONE);
        (from..to).map(|_| decoder.decode()).collect()
    }

    fn index_of(&self, ip: u64) -> Option<usize> {
        let offset = u32::try_from(ip.checked_sub(self.at)?).ok()?;
        self.starts.get()?.binary_search(&offset).ok()
    }
}

/// The first branch after a call (`after` starts right after it), on the
/// straight line within RETURN_WINDOW instructions, with rax unwritten:
/// emulated by the kernel, and where rax is what the call returned. With
/// `joins`, None if other code can enter the line between, but by one
/// branch to `allowed`.
pub(super) fn branch_after(after: &[Instruction], joins: Option<&JoinPoints>, allowed: Option<u64>) -> Option<u64> {
    for i in after.iter().take(RETURN_WINDOW) {
        let n = joins.map_or(0, |j| j.count(i.ip()));
        if n > 0 && (Some(i.ip()) != allowed || n != 1) {
            return None;
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
fn guarded_by(code: &[Instruction], k: usize, raw: Guard, joins: &JoinPoints) -> Option<u64> {
    let from = k.saturating_sub(GUARD_WINDOW + LOAD_WINDOW + 1);
    let window = &code[from..k];
    let &(jne, _) = guard_sites(window).iter().rev().find(|(_, g)| *g == raw)?;
    let alone = window[jne + 1..].iter().chain(std::iter::once(&code[k])).all(|i| !joins.contains(i.ip())) && window[jne + 1..].iter().all(|i| !x86::leaves_straight_line(i));
    alone.then(|| window[jne].near_branch_target())
}

/// Where a guard's hooked path, starting at `from` (its `jne`'s target),
/// jumps back: a straight line through one indirect call (of the
/// allocator the pointer holds) to a direct `jmp`, with rax (that call's
/// result) unwritten after the call. None for any other shape (a tail
/// call, a branch, no call, rax overwritten).
fn hooked_return(code: &(impl Listing + ?Sized), from: u64) -> Option<u64> {
    let start = code.index_of(from)?;
    let mut called = false;
    for i in code.window(start, start + HOOKED_WINDOW).iter() {
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
    Realloc,
    Other,
}

/// What a direct call in .text calls, for the sweep.
#[derive(Clone, Copy)]
enum Callee {
    NewPool,
    Libc(Libc),
}

/// Instructions before a call that `guarded_by` looks at.
const BEFORE_CALL: usize = GUARD_WINDOW + LOAD_WINDOW + 1;

/// The first pass finds every branch target (join points), the calls of
/// allocate_from_new_pool and of libc's allocators, and the compares with
/// a sized guard's function; the second looks at each of those in its
/// window, as if the whole .text were at hand.
fn sweep(code: &(impl Listing + ?Sized), agreed: &Agreed, mut stub_of: impl FnMut(u64) -> Libc) -> Result<AllocSites, String> {
    let sized: Vec<u64> = [Some(agreed.object), agreed.mem].into_iter().flatten().map(|g| g.expected).collect();
    let (mut targets, mut calls, mut compares) = (Vec::new(), Vec::new(), Vec::new());
    code.scan(&mut |k, i| {
        targets.extend(direct_branch_target(i));
        if i.mnemonic() == Mnemonic::Call && i.op0_kind() == OpKind::NearBranch64 {
            let target = i.near_branch_target();
            let callee = match target == agreed.new_pool {
                true => Some(Callee::NewPool),
                false => Some(stub_of(target)).filter(|&l| l != Libc::Other).map(Callee::Libc),
            };
            calls.extend(callee.map(|c| (k, c)));
        }
        if guard_compare(i) && sized.contains(&(i.immediate32to64() as u64)) {
            compares.push(k);
        }
    })?;
    let joins = JoinPoints::sorted(targets);
    let mut sites = AllocSites::default();
    let (mut joined, mut unguarded) = (Vec::new(), 0);
    for (at, callee) in calls {
        let from = at.saturating_sub(BEFORE_CALL);
        let window = code.window(from, at + 1 + RETURN_WINDOW);
        let k = at - from;
        let call = &window[k];
        let libc = match callee {
            Callee::NewPool => {
                // Else the return address itself, single-stepped (about 19
                // µs, on pool openings only: 1-2 thousand a second) when
                // nothing else jumps there.
                match branch_after(&window[k + 1..], Some(&joins), None) {
                    Some(at) => sites.pool_opened.push(at),
                    None if !joins.contains(call.next_ip()) => {
                        sites.pool_opened.push(call.next_ip());
                        sites.pool_stepped += 1;
                    }
                    None => joined.push(call.ip()),
                }
                continue;
            }
            Callee::Libc(libc) => libc,
        };
        let (guard, returned) = match libc {
            Libc::Malloc => (Some(agreed.raw), &mut sites.raw_returned),
            Libc::Calloc => (agreed.raw_calloc, &mut sites.calloc_returned),
            Libc::Realloc => {
                // The call itself, which only the guarded line reaches
                // (--allocations reads its size argument there).
                if agreed.raw_realloc.and_then(|g| guarded_by(&window, k, g, &joins)).is_some() {
                    sites.realloc_calls.push(call.ip());
                }
                continue;
            }
            Libc::Other => continue,
        };
        let Some(hooked) = guard.and_then(|g| guarded_by(&window, k, g, &joins)) else {
            unguarded += 1;
            continue;
        };
        match branch_after(&window[k + 1..], Some(&joins), hooked_return(code, hooked)) {
            Some(at) => returned.push(at),
            None => sites.raw_joined += 1,
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
    for at in compares {
        // The compare's load before it; its jne, and the size after that.
        let from = at.saturating_sub(LOAD_WINDOW);
        let window = code.window(from, at + MOVES_BEFORE_JNE + SIZE_WINDOW + 3);
        let k = at - from;
        // Only this compare's guard: the window may hold another's.
        for (jne, guard) in guard_sites(&window).into_iter().filter(|&(jne, _)| jne > k && jne <= k + MOVES_BEFORE_JNE + 1) {
            if guard != agreed.object && Some(guard) != agreed.mem {
                continue;
            }
            match copy_size(window[jne].ip(), &window[jne + 1..], agreed.usedpools) {
                Some(site) => sites.object_sized.push(site),
                None => sites.object_unsized += 1,
            }
        }
    }
    sites.guards = [Some(agreed.object), Some(agreed.raw), agreed.raw_calloc, agreed.raw_realloc, agreed.mem].into_iter().flatten().collect();
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
    const AGREED: Agreed = Agreed { new_pool: 0x4fb540, object: Guard { slot: 0x959f48, expected: 0x4fb450 }, raw: RAW, raw_calloc: None, raw_realloc: None, mem: None, usedpools: None };
    fn stub(target: u64) -> Libc {
        if target == 0x41f610 { Libc::Malloc } else { Libc::Other }
    }

    #[test]
    fn reads_the_raw_guard_and_the_sites_after_calls() {
        let code = x86::decode(&CODE, AT);
        assert_eq!(guards(&code), [RAW]);
        let sites = sweep(&code[..], &AGREED, stub).unwrap();
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
        assert_eq!(hooked_return(&code[..], 0x4fb440), Some(0x4fb427));
        assert_eq!(hooked_return(&code[..], 0x4fb43a), None, "a tail call does not come back");
        // mov %rbx,%rsi; call *%rax; mov %rbx,%rax; jmp 4fb427: rax is no longer the result.
        let overwritten = x86::decode(&[0x48, 0x89, 0xde, 0xff, 0xd0, 0x48, 0x89, 0xd8, 0xeb, 0xdd], 0x4fb440);
        assert_eq!(hooked_return(&overwritten[..], 0x4fb440), None, "rax written after the call");
        let before = |bytes: &[u8]| x86::decode(bytes, 0x4fb3f2)[0];
        for (join, what) in [(before(&[0xeb, 0x33]), "a second jump to the hooked path's target"), (before(&[0xeb, 0x36]), "a jump to the branch itself")] {
            let mut joined = code.clone();
            joined.insert(0, join);
            let err = sweep(&joined[..], &AGREED, stub).unwrap_err();
            assert!(err.contains("no guarded call of malloc"), "{what}: {err}");
        }
        // The hooked path ending in a branch elsewhere is no hooked path.
        let mut other = code.clone();
        let last = other.len() - 1;
        other[last] = x86::decode(&[0xeb, 0xe3], 0x4fb445)[0]; // jmp 4fb42a
        assert_eq!(hooked_return(&other[..], 0x4fb440), Some(0x4fb42a));
        assert!(sweep(&other[..], &AGREED, stub).is_ok(), "a hooked path may join at the branch too");
    }

    /// A copy's size check after its guard, Debian 3.11's at 0x5000d5:
    ///   5000cf: jne 50078e
    ///   5000d5: lea -0x1(%rsi),%rax; cmp $0x1ff,%rax; ja 50042f
    /// and the exported PyObject_Malloc's, with a `sub` between:
    ///   4fb450: lea -0x1(%rsi),%rax; sub $0x18,%rsp; cmp $0x1ff,%rax; ja 4fb52e
    /// The `ja` is probed, and rax + 1 is the size on every path to it.
    #[test]
    fn reads_a_copys_size_check() {
        let rax_plus_one = CopySize::Register { number: 0, plus_one: true };
        let copy = x86::decode(&[0x48, 0x8d, 0x46, 0xff, 0x48, 0x3d, 0xff, 0x01, 0x00, 0x00, 0x0f, 0x87, 0x4a, 0x03, 0x00, 0x00], 0x5000d5);
        assert_eq!(copy_size(0x5000cf, &copy, None), Some(CopySite { at: 0x5000df, size: rax_plus_one }));
        let exported = x86::decode(&[0x48, 0x8d, 0x46, 0xff, 0x48, 0x83, 0xec, 0x18, 0x48, 0x3d, 0xff, 0x01, 0x00, 0x00, 0x0f, 0x87, 0xca, 0x00, 0x00, 0x00], 0x4fb450);
        assert_eq!(copy_size(0x4fb44a, &exported, None), Some(CopySite { at: 0x4fb45e, size: rax_plus_one }));
        // Another compare first (`cmp $0x100,%rax; ja`) is not the check.
        let other = x86::decode(&[0x48, 0x3d, 0x00, 0x01, 0x00, 0x00, 0x0f, 0x87, 0xca, 0x00, 0x00, 0x00], 0x4fb450);
        assert_eq!(copy_size(0x4fb44a, &other, None), None);
    }

    /// PyBytes_FromStringAndSize's copy in Debian's 3.11 compares the size
    /// itself (never 0 there: it adds the header):
    ///   527d0a: lea 0x21(%rdx),%r12; cmp $0x4fb450,%rax; jne 527e75
    ///   527d1a: cmp $0x200,%r12; ja 527e34
    #[test]
    fn reads_a_size_compared_whole() {
        let copy = x86::decode(&[0x49, 0x81, 0xfc, 0x00, 0x02, 0x00, 0x00, 0x0f, 0x87, 0x0d, 0x01, 0x00, 0x00], 0x527d1a);
        assert_eq!(copy_size(0x527d14, &copy, None), Some(CopySite { at: 0x527d21, size: CopySize::Register { number: 12, plus_one: false } }));
    }

    /// A size the compiler knows is small goes straight to its class
    /// (Debian's 3.11 at 0x501f41: `lea -0x1(%rsi),%edi; shr $0x4,%edi`):
    /// the `jne` is probed, rsi the size. Sid's 3.13 at 0x58714d moves a
    /// constant in first (`mov $0x1c,%edx; ...; lea -0x1(%rdx),%esi`): that
    /// constant, exactly.
    #[test]
    fn reads_a_small_size_and_a_constant_one() {
        let small = x86::decode(&[0x8d, 0x7e, 0xff, 0xc1, 0xef, 0x04], 0x501f41);
        assert_eq!(copy_size(0x501f3b, &small, None), Some(CopySite { at: 0x501f3b, size: CopySize::Register { number: 6, plus_one: false } }));
        // mov $0x1c,%edx; lea -0x1(%rdx),%esi; shr $0x4,%esi
        let constant = x86::decode(&[0xba, 0x1c, 0x00, 0x00, 0x00, 0x8d, 0x72, 0xff, 0xc1, 0xee, 0x04], 0x587153);
        assert_eq!(copy_size(0x58714d, &constant, None), Some(CopySite { at: 0x58714d, size: CopySize::Constant { bytes: 0x1c, exact: true } }));
        // add $0x8,%rdx instead: written, not a constant.
        let added = x86::decode(&[0x48, 0x83, 0xc2, 0x08, 0x8d, 0x72, 0xff, 0xc1, 0xee, 0x04], 0x587153);
        assert_eq!(copy_size(0x58714d, &added, None), None);
    }

    /// A constant size folded into the class: Debian 3.11's copy at 0x4fe80a
    /// loads usedpools' slot of class 7 (0x959d90, usedpools at 0x959d20):
    ///   4fe80a: mov 0x45b57f(%rip),%rax; mov 0x10(%rax),%rsi; cmp %rax,%rsi; je
    /// 128-byte blocks. Without the agreed usedpools, or a slot outside it, none.
    #[test]
    fn reads_a_constant_copys_class() {
        let copy = x86::decode(&[0x48, 0x8b, 0x05, 0x7f, 0xb5, 0x45, 0x00, 0x48, 0x8b, 0x70, 0x10, 0x48, 0x39, 0xc6], 0x4fe80a);
        assert_eq!(copy_size(0x4fe804, &copy, Some(Pools::Static(0x959d20))), Some(CopySite { at: 0x4fe804, size: CopySize::Constant { bytes: 128, exact: false } }));
        assert_eq!(copy_size(0x4fe804, &copy, None), None);
        assert_eq!(copy_size(0x4fe804, &copy, Some(Pools::Static(0x959d28))), None, "not on a slot's boundary");
        assert_eq!(copy_size(0x4fe804, &copy, Some(Pools::Static(0x959b00))), None, "past the classes");
    }

    /// Other code jumping to the branch after the call (as the fast path
    /// does in many of sid's copies) moves the probe to the return address;
    /// jumping to the return address itself leaves no site: refused.
    #[test]
    fn a_joined_line_moves_the_site_or_refuses() {
        let mut code = x86::decode(&CODE, AT);
        let jump_to = |target: u64| x86::decode(&[0xeb, (target.wrapping_sub(0x4fb3f4) as u8)], 0x4fb3f2)[0];
        code.insert(0, jump_to(0x4fb3fe));
        let sites = sweep(&code[..], &AGREED, stub).unwrap();
        assert_eq!((sites.pool_opened.as_slice(), sites.pool_stepped), (&[0x4fb3fb][..], 1), "the return address, single-stepped");
        code[0] = jump_to(0x4fb3fb);
        let sites = sweep(&code[..], &AGREED, stub);
        assert!(sites.unwrap_err().contains("1 of the 1 calls of allocate_from_new_pool (0x4fb540) have no branch after them"));
    }

    /// A guard on another allocator pointer, or a join between guard and
    /// call, leaves the malloc call out (not obmalloc's, or not only).
    #[test]
    fn a_malloc_call_without_the_raw_guard_is_left_out() {
        let code = x86::decode(&CODE, AT);
        let other = Agreed { raw: Guard { slot: 0x95a068, expected: 0x4f7360 }, ..AGREED };
        assert!(sweep(&code[..], &other, stub).unwrap_err().contains("no guarded call of malloc"));
        let mut joined = code.clone();
        joined.insert(0, x86::decode(&[0xeb, 0x22], 0x4fb3f2)[0]); // jmp 0x4fb416, past the guard
        assert!(sweep(&joined[..], &AGREED, stub).unwrap_err().contains("no guarded call of malloc"));
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

    use super::{CopySize, Guard};
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
            // `--allocations`' copies: 173 of 177 on Debian's 3.11, 245 of
            // 271, 199 of 224 and 206 of 236 on sid's 3.13-3.15, each shape
            // seen (the size less one, whole, and a constant's class); and
            // its guarded realloc calls: 10, 16, 11 and 9.
            assert!(s.realloc_calls.len() >= 8, "{}: {} realloc calls", path.display(), s.realloc_calls.len());
            let all = s.object_sized.len() + s.object_unsized;
            let kinds = |f: fn(&CopySize) -> bool| s.object_sized.iter().any(|c| f(&c.size));
            assert!(s.object_sized.len() * 10 >= all * 8, "{}: {} of {all} copies sized", path.display(), s.object_sized.len());
            assert!(kinds(|c| matches!(c, CopySize::Register { plus_one: true, .. })) && kinds(|c| matches!(c, CopySize::Register { plus_one: false, .. })) && kinds(|c| matches!(c, CopySize::Constant { exact: false, .. })), "{}", path.display());
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
