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
//!   no other code joining between guard and call is probed (rdi: the
//!   size) with the first branch after it (rax: the chunk); BPF pairs
//!   them per thread, so a join there (the hooked path's return) is only
//!   an unpaired return.

use std::collections::HashSet;
use std::ops::Range;

use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind, Register};

use super::alloc_sites::{AllocSites, Guard};
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

/// Instructions between a guard's load of the allocator pointer and its
/// compare.
const LOAD_WINDOW: usize = 4;

/// Instructions between a call and the branch after it (3.14: `mov; mov;
/// jmp` after allocate_from_new_pool; up to 8 moves restoring spilled
/// registers before the `jne` in 3.11's copies).
const RETURN_WINDOW: usize = 12;

/// A .text larger than this (CPython's is 2-4 MB) is not decoded.
const TEXT_MAX_BYTES: usize = 64 << 20;

/// How many bytes at .text's end may fail to decode (alignment padding).
const TEXT_TAIL_SLACK: u64 = 64;

/// The facts read from the exported functions, before the sweep of .text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// `allocate_from_new_pool`.
    pub new_pool: u64,
    /// The object allocator's guard: X = `_PyObject_Malloc`.
    pub object: Guard,
    /// The raw allocator's guard: `_PyMem_RawMalloc`.
    pub raw: Guard,
}

impl Python {
    /// The sites of a stripped LTO build, or the one sentence saying which
    /// sources are missing or disagree.
    pub fn stripped_alloc_sites(&self) -> Result<AllocSites, String> {
        let path = &self.target_path;
        let agreed = self.agreed_allocator()?;
        let malloc_slot = self.elf.plt_slot("malloc").ok_or_else(|| format!("{path} imports no malloc through its PLT, where obmalloc's big allocations would go"))?;
        let (text_at, text) = self.elf.section_at(".text").ok_or_else(|| format!("{path} has no .text section to search for obmalloc's inlined copies"))?;
        if text.len() > TEXT_MAX_BYTES {
            return Err(format!("{path}'s .text is {} bytes, more than a CPython's", text.len()));
        }
        let code = x86::decode(text, text_at);
        let end = code.last().map_or(text_at, Instruction::next_ip);
        if end + TEXT_TAIL_SLACK < text_at + text.len() as u64 {
            return Err(format!("{path}'s .text does not decode past {end:#x}: its inlined allocator copies cannot all be found"));
        }
        let mut stubs = std::collections::HashMap::new();
        let is_malloc = |target: u64, stubs: &mut std::collections::HashMap<u64, bool>| *stubs.entry(target).or_insert_with(|| self.is_plt_stub_of(target, Some(malloc_slot)));
        let sites = sweep(&code, &agreed, |t| is_malloc(t, &mut stubs))?;
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
        agreed_new_pool(&in_copy, &out_of_line)
            .map(|new_pool| Agreed { new_pool, object, raw })
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
        if !compares || code.get(k + 1).is_none_or(|j| j.mnemonic() != Mnemonic::Jne) {
            continue;
        }
        let register = cmp.op0_register();
        for load in code[k.saturating_sub(LOAD_WINDOW)..k].iter().rev() {
            let loads = load.mnemonic() == Mnemonic::Mov && load.op_count() == 2 && load.op0_kind() == OpKind::Register && load.op0_register() == register && load.op1_kind() == OpKind::Memory && load.is_ip_rel_memory_operand();
            if loads {
                out.push((k + 1, Guard { slot: load.ip_rel_memory_address(), expected: cmp.immediate32to64() as u64 }));
                break;
            }
            if x86::writes_register(load, register) || x86::leaves_straight_line(load) {
                break;
            }
        }
    }
    out
}

fn guards(code: &[Instruction]) -> Vec<Guard> {
    guard_sites(code).into_iter().map(|(_, g)| g).collect()
}

/// The first guard of a function, if any.
fn guards_of(code: &[Instruction]) -> Option<Guard> {
    guards(code).first().copied()
}

/// Every direct branch target in `code`: where other code joins a line.
fn join_points(code: &[Instruction]) -> HashSet<u64> {
    code.iter()
        .filter(|i| matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch) && i.op0_kind() == OpKind::NearBranch64)
        .map(Instruction::near_branch_target)
        .collect()
}

/// The first branch after a call (`after` starts right after it), on the
/// straight line within RETURN_WINDOW instructions, with rax unwritten:
/// emulated by the kernel, and where rax is what the call returned. With
/// `joins`, None if other code can enter the line between.
fn branch_after(after: &[Instruction], joins: Option<&HashSet<u64>>) -> Option<u64> {
    for i in after.iter().take(RETURN_WINDOW) {
        if joins.is_some_and(|j| j.contains(&i.ip())) {
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
/// the line between.
fn guarded_by(code: &[Instruction], k: usize, raw: Guard, joins: &HashSet<u64>) -> bool {
    let from = k.saturating_sub(GUARD_WINDOW + LOAD_WINDOW + 1);
    let window = &code[from..k];
    let Some(&(jne, _)) = guard_sites(window).iter().rev().find(|(_, g)| *g == raw) else { return false };
    window[jne + 1..].iter().chain(std::iter::once(&code[k])).all(|i| !joins.contains(&i.ip())) && window[jne + 1..].iter().all(|i| !x86::leaves_straight_line(i))
}

/// The sites in the decoded .text: each call of allocate_from_new_pool's
/// branch after it, each guarded `call malloc@plt` and its branch after.
fn sweep(code: &[Instruction], agreed: &Agreed, mut is_malloc: impl FnMut(u64) -> bool) -> Result<AllocSites, String> {
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
            match branch_after(&code[k + 1..], Some(&joins)) {
                Some(at) => sites.pool_opened.push(at),
                None if !joins.contains(&call.next_ip()) => {
                    sites.pool_opened.push(call.next_ip());
                    sites.pool_stepped += 1;
                }
                None => joined.push(call.ip()),
            }
        } else if is_malloc(target) {
            if !guarded_by(code, k, agreed.raw, &joins) {
                unguarded += 1;
                continue;
            }
            if let Some(at) = branch_after(&code[k + 1..], None) {
                sites.raw_calls.push(call.ip());
                sites.raw_returned.push(at);
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
    if sites.pool_opened.is_empty() || sites.raw_calls.is_empty() {
        return Err(format!("no call of allocate_from_new_pool ({:#x}) or no guarded call of malloc found in .text", agreed.new_pool));
    }
    sites.guards = vec![agreed.object, agreed.raw];
    sites.unguarded_mallocs = unguarded;
    Ok(sites)
}

fn hex_list(addresses: &[u64]) -> String {
    if addresses.is_empty() {
        return "nothing".into();
    }
    addresses.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", ")
}

/// The search on the real stripped builds: the sites it finds against the
/// disassembly (objdump, addresses pasted in the comments) and the counts
/// of the design's survey (docs/design/memory.md).
#[cfg(test)]
mod on_real_builds {
    use std::path::Path;

    use crate::python::Python;

    fn sid(version: &str) -> std::path::PathBuf {
        let root = std::env::var_os("PYTRACE_ROOT_SID").map(std::path::PathBuf::from).unwrap_or_else(|| "/var/cache/pytrace/root-sid".into());
        root.join(format!("usr/bin/python{version}"))
    }

    #[test]
    fn survey() {
        for path in [Path::new("/usr/bin/python3.11").to_path_buf(), sid("3.13"), sid("3.14"), sid("3.15")] {
            let python = Python::from_executable(&path, None).unwrap().unwrap();
            let started = std::time::Instant::now();
            match python.stripped_alloc_sites() {
                Ok(s) => eprintln!("{}: {} pool sites, {} raw calls, {} unguarded, {} stepped, guards {:x?}, {:?}", path.display(), s.pool_opened.len(), s.raw_calls.len(), s.unguarded_mallocs, s.pool_stepped, s.guards, started.elapsed()),
                Err(e) => eprintln!("{}: {e}", path.display()),
            }
        }
    }
}
