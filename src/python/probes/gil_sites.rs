//! Where `pytrace gil` can see the GIL taken and dropped in a build whose
//! symbol table is stripped (Debian's and Ubuntu's packages), which names
//! neither `take_gil` nor `drop_gil`: both are static functions of
//! Python/ceval_gil.c. Found from what such a build still exports, its
//! dynamic symbols and its PLT, each site only where two independent
//! sources agree on it: a uprobe is a write into the target's code, and one
//! at a wrong address would corrupt the instruction there.
//!
//! - `take_gil` stays out of line (it is large, and every hand-over goes
//!   through it): it is the one direct call target that both exported
//!   `PyEval_RestoreThread` and `PyEval_AcquireLock` share (3.9 to 3.15:
//!   each calls `take_gil(tstate)` and nothing else they share).
//! - `drop_gil` has an out-of-line copy, which the eval loop's hand-over
//!   calls: the one function both `PyEval_ReleaseThread` and
//!   `PyEval_ReleaseLock` reach, directly or through tail jumps, that
//!   signals the GIL's condition variable.
//! - But with link-time optimisation Debian's builds also copy `drop_gil`
//!   into `PyEval_SaveThread` and into callers that inline that (the 3.11
//!   has five such copies: in `PyEval_SaveThread`, `_Py_read` and three
//!   static functions), so no probe on a function sees every drop. Every
//!   copy lets go of the GIL by signalling the GIL's condition variable
//!   `cond` (`COND_SIGNAL(gil->cond)`, right after storing `locked = 0`),
//!   and a forced switch then waits on its `switch_cond`, through the
//!   interpreter's PLT stubs of `pthread_cond_signal` and
//!   `pthread_cond_wait`. A stub is found by its GOT slot (the .rela.plt
//!   relocation naming the function) and by code (the one `jmp
//!   *slot(%rip)` in the PLT); `PyEval_SaveThread` must call both stubs
//!   (its copy) or the `drop_gil` found. bpf/gil.bpf.c keeps only the calls
//!   whose first argument is the GIL's own `cond` or `switch_cond`.

use iced_x86::{FlowControl, Mnemonic, OpKind, Register};

use super::hex_list;
use crate::python::Python;
use crate::process::x86;

/// The probe sites of a stripped build (link-time addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GilSites {
    /// `take_gil`'s entry.
    pub take_gil: u64,
    /// The `jmp` of the PLT stub of `pthread_cond_signal`.
    pub cond_signal: u64,
    /// Every direct call of (or jump to) that stub in .text: where the
    /// signals are probed, so that the probes see what one on the stub
    /// would. The stub's `jmp *slot(%rip)` is
    /// single-stepped by the kernel (about 15 us a hit on this VM), a
    /// `call rel32` emulated (about 1 us). Empty when the sweep of .text
    /// could not be trusted: the stub is probed then.
    pub signal_calls: Vec<u64>,
    /// The `jmp` of the PLT stub of `pthread_cond_wait`.
    pub cond_wait: u64,
    /// The out-of-line `drop_gil`, which the eval loop's hand-over calls:
    /// both `PyEval_ReleaseThread` and `PyEval_ReleaseLock` reach it, and
    /// it signals the GIL's `cond`. Probed at its entry and return as in a
    /// build with symbols, so that a hand-over counts as waiting up to its
    /// end (seen only at the signal, a thread preempted right after it would
    /// count as released: 15 % of a spinner's time on a busy machine).
    pub drop_gil: u64,
}

/// Bytes of an exported function read at most: its dynamic symbol's size
/// bounds it, and these are all short (under 300 bytes in every build
/// seen); a larger size is not the function described above.
const CALLER_MAX_BYTES: usize = 1024;

/// Instructions looked at on the paths from a drop_gil candidate's start
/// for its COND_SIGNAL (the 3.11's is its 20th).
const DROP_GIL_BUDGET: usize = 200;

/// Instructions of a function that only adjusts some state before its
/// tail jump (3.13's `_PyThreadState_Detach`: 8).
const TAIL_JUMP_BUDGET: usize = 16;

/// Calls of pthread_cond_signal's stub probed at most (CPython's builds
/// have 8 to 15); more, and the stub itself is probed.
const SIGNAL_CALLS_MAX: usize = 64;

/// Tail jumps followed from a function an exported one calls.
const TAIL_JUMP_CHAIN: usize = 3;

/// A PLT larger than this (65,536 stubs; CPython's has under 1,000) is
/// not decoded: the file is not what it claims.
const PLT_MAX_BYTES: usize = 1 << 20;

/// Why no site was taken, for the one sentence `gil` prints.
pub type Missing = String;

impl Python {
    /// The GIL's probe sites in a build without `take_gil` and `drop_gil`
    /// in a symbol table, or what was missing or did not agree.
    pub fn gil_sites(&self) -> Result<GilSites, Missing> {
        let take_gil = self.take_gil_by_callers()?;
        let cond_signal = self.plt_stub("pthread_cond_signal")?;
        let cond_wait = self.plt_stub("pthread_cond_wait")?;
        let drop_gil = self.drop_gil_by_callers(cond_signal).ok_or(
            "no function that both PyEval_ReleaseThread and PyEval_ReleaseLock reach signals the GIL's condition variable, so the eval loop's hand-overs could not be told from releases",
        )?;
        // PyEval_SaveThread, the way C code lets go of the GIL, must drop
        // it where the probes see: its own copy of drop_gil signalling and
        // waiting through the stubs, or a call of the drop_gil found.
        let save = self.reached("PyEval_SaveThread").ok_or("no exported PyEval_SaveThread to read")?;
        let inlined = save.iter().any(|&t| is_stub(t, cond_signal)) && save.iter().any(|&t| is_stub(t, cond_wait));
        if !inlined && !save.contains(&drop_gil) {
            return Err("PyEval_SaveThread neither signals the GIL through the PLT nor calls a drop_gil both PyEval_ReleaseThread and PyEval_ReleaseLock reach".into());
        }
        let signal_calls = self.signal_calls(cond_signal, drop_gil, &save).unwrap_or_default();
        Ok(GilSites { take_gil, cond_signal, cond_wait, drop_gil, signal_calls })
    }

    /// The calls of pthread_cond_signal's stub `cond_signal` that the probe
    /// on the stub would have seen: every direct call
    /// or jump to it in .text (the 3.11 has 8, sid's 3.13 15). Two sources
    /// must agree: the linear decode of .text must hold every signalling
    /// call that the path search from `drop_gil`'s own start finds, and
    /// PyEval_SaveThread's own call when it has a copy of drop_gil (`save`:
    /// what it calls). Err (the stub is probed then) if they do not, or if
    /// the calls are more than a CPython has.
    fn signal_calls(&self, cond_signal: u64, drop_gil: u64, save: &[u64]) -> Result<Vec<u64>, Missing> {
        let mut calls = Vec::new();
        self.scan_text("the calls of pthread_cond_signal", |i| {
            let branch = matches!(i.flow_control(), FlowControl::Call | FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch);
            if branch && i.op_count() == 1 && i.op0_kind() == OpKind::NearBranch64 && is_stub(i.near_branch_target(), cond_signal) && calls.len() <= SIGNAL_CALLS_MAX {
                calls.push(i.ip());
            }
        })?;
        if calls.len() > SIGNAL_CALLS_MAX {
            return Err(format!("{} calls of pthread_cond_signal, more than a CPython makes", calls.len()));
        }
        let own = self.signal_calls_from(drop_gil, cond_signal);
        if own.is_empty() || own.iter().any(|c| !calls.contains(c)) {
            return Err(format!("the decode of .text and drop_gil's own paths disagree on its signals ({} against {})", hex_list(&calls), hex_list(&own)));
        }
        if save.iter().any(|&t| is_stub(t, cond_signal)) {
            let from_save = self.elf.symbol("PyEval_SaveThread").map(|s| self.signal_calls_from(s, cond_signal)).unwrap_or_default();
            if from_save.is_empty() || from_save.iter().any(|c| !calls.contains(c)) {
                return Err("the decode of .text misses PyEval_SaveThread's signal".into());
            }
        }
        Ok(calls)
    }

    /// What exported function `name` calls or jumps to (PLT stubs too),
    /// and where those go on by tail jumps.
    fn reached(&self, name: &str) -> Option<Vec<u64>> {
        let code = self.elf.function_code(name, CALLER_MAX_BYTES)?;
        let mut targets = direct_targets(code, self.elf.symbol(name)?);
        for mut t in targets.clone() {
            for _ in 0..TAIL_JUMP_CHAIN {
                let Some(next) = self.tail_jump(t).filter(|j| !targets.contains(j)) else { break };
                targets.push(next);
                t = next;
            }
        }
        Some(targets)
    }

    /// The direct targets of exported function `name` in its own segment,
    /// PLT stubs and exported functions left out.
    fn exported_targets(&self, name: &str) -> Result<Vec<u64>, Missing> {
        let code = self.elf.function_code(name, CALLER_MAX_BYTES).ok_or_else(|| format!("no exported {name} to read"))?;
        let address = self.elf.symbol(name).ok_or_else(|| format!("no exported {name}"))?;
        let segment = self.elf.segment_range(address).ok_or_else(|| format!("{name} is in no loaded segment"))?;
        let plt = self.plt_ranges();
        // take_gil and drop_gil are static: nothing exported is either
        // (_Py_FatalErrorFunc, which both callers may call, is).
        Ok(direct_targets(code, address).into_iter().filter(|t| segment.contains(t) && !plt.iter().any(|p| p.contains(t)) && !self.elf.is_exported(*t)).collect())
    }

    fn take_gil_by_callers(&self) -> Result<u64, Missing> {
        let restore = self.exported_targets("PyEval_RestoreThread")?;
        let acquire = self.exported_targets("PyEval_AcquireLock")?;
        agreed_target(&restore, &acquire).ok_or_else(|| {
            format!(
                "PyEval_RestoreThread (calls {}) and PyEval_AcquireLock (calls {}) do not agree on one function that would be take_gil",
                hex_list(&restore),
                hex_list(&acquire)
            )
        })
    }

    /// The one function both `PyEval_ReleaseThread` and
    /// `PyEval_ReleaseLock` reach, directly or through tail jumps (3.13+:
    /// `PyEval_ReleaseThread` jumps to `_PyThreadState_Detach`, which jumps
    /// to `drop_gil`, in Debian's 3.14 through `detach_thread`), that calls the `pthread_cond_signal` stub
    /// `cond_signal` on the paths from its start (drop_gil's COND_SIGNAL);
    /// None if none or several do.
    fn drop_gil_by_callers(&self, cond_signal: u64) -> Option<u64> {
        let release = self.reached("PyEval_ReleaseThread")?;
        let release_lock = self.reached("PyEval_ReleaseLock")?;
        let shared: Vec<u64> = release.into_iter().filter(|t| release_lock.contains(t) && !self.elf.is_exported(*t) && self.signals_gil(*t, cond_signal)).collect();
        match shared[..] {
            [only] => Some(only),
            _ => None,
        }
    }

    /// Where a short function ends in a direct jump (a tail call) before
    /// any call or return, within TAIL_JUMP_BUDGET instructions.
    fn tail_jump(&self, start: u64) -> Option<u64> {
        let code = self.elf.segment_range(start)?;
        let bytes = self.elf.read_static(start, 96.min((code.end - start) as usize)).ok()?;
        for i in x86::decode(bytes, start).into_iter().take(TAIL_JUMP_BUDGET) {
            match i.flow_control() {
                FlowControl::Next => continue,
                FlowControl::UnconditionalBranch if i.op0_kind() == OpKind::NearBranch64 && code.contains(&i.near_branch_target()) => return Some(i.near_branch_target()),
                _ => return None,
            }
        }
        None
    }

    /// Whether the code from `start` calls the stub `cond_signal`.
    fn signals_gil(&self, start: u64, cond_signal: u64) -> bool {
        !self.signal_calls_from(start, cond_signal).is_empty()
    }

    /// The calls of the stub `cond_signal` on the paths from `start`.
    fn signal_calls_from(&self, start: u64, cond_signal: u64) -> Vec<u64> {
        let Some(code) = self.elf.segment_range(start) else { return Vec::new() };
        let read = |at: u64| self.elf.read_static(at, 64.min((code.end - at) as usize)).ok().map(<[u8]>::to_vec);
        let mut calls = x86::search_paths(read, code.clone(), start, (), DROP_GIL_BUDGET, |_| true, |i, _| {
            (i.mnemonic() == Mnemonic::Call && i.op0_kind() == OpKind::NearBranch64 && is_stub(i.near_branch_target(), cond_signal)).then_some(i.ip())
        });
        calls.sort_unstable();
        calls.dedup();
        calls
    }

    /// The link-time ranges of the sections holding PLT stubs.
    fn plt_ranges(&self) -> Vec<std::ops::Range<u64>> {
        [".plt", ".plt.sec"].iter().filter_map(|s| self.elf.section_at(s)).map(|(at, bytes)| at..at + bytes.len() as u64).collect()
    }

    /// The `jmp` of `function`'s PLT stub: the one jump through its GOT
    /// slot (its .rela.plt relocation) in the PLT sections, at a stub's
    /// start or past its `endbr64`.
    fn plt_stub(&self, function: &str) -> Result<u64, Missing> {
        let slot = self.elf.plt_slot(function).ok_or_else(|| format!("no PLT relocation for {function}"))?;
        let mut jumps = Vec::new();
        let mut stubs = Vec::new();
        for section in [".plt", ".plt.sec"] {
            let Some((at, bytes)) = self.elf.section_at(section) else { continue };
            if bytes.len() > PLT_MAX_BYTES {
                return Err(format!("its {section} is {} bytes, more than a PLT", bytes.len()));
            }
            jumps.extend(plt_jumps_through(bytes, at, slot));
            stubs.extend(plt_stub_starts(bytes, at));
        }
        let [jump] = jumps[..] else {
            return Err(format!("{} jumps through {function}'s GOT slot in the PLT, not one", jumps.len()));
        };
        if !stubs.iter().any(|&s| is_stub(s, jump)) {
            return Err(format!("{function}'s PLT jump starts no stub"));
        }
        Ok(jump)
    }
}

/// Whether a call to `target` enters the stub whose jump is at `jump`
/// (the jump itself, or the endbr64 before it).
fn is_stub(target: u64, jump: u64) -> bool {
    target == jump || target + 4 == jump
}

/// The direct call and jump targets of one function's code (conditional
/// branches left out: in a build split into hot and cold parts they lead
/// to the function's own cold part).
fn direct_targets(code: &[u8], address: u64) -> Vec<u64> {
    let mut targets = Vec::new();
    for i in x86::decode(code, address) {
        let direct = i.op_count() == 1 && i.op0_kind() == OpKind::NearBranch64;
        if direct && matches!(i.flow_control(), FlowControl::Call | FlowControl::UnconditionalBranch) && !targets.contains(&i.near_branch_target()) {
            targets.push(i.near_branch_target());
        }
    }
    targets
}

/// The one target both callers share, or None if none or several do.
fn agreed_target(one: &[u64], other: &[u64]) -> Option<u64> {
    match one.iter().filter(|t| other.contains(t)).collect::<Vec<_>>()[..] {
        [&only] => Some(only),
        _ => None,
    }
}

/// The addresses of `jmp qword ptr [rip+…]` instructions in a PLT section
/// whose memory operand is `slot`.
fn plt_jumps_through(bytes: &[u8], at: u64, slot: u64) -> Vec<u64> {
    x86::decode(bytes, at)
        .into_iter()
        .filter(|i| i.mnemonic() == Mnemonic::Jmp && i.op0_kind() == OpKind::Memory && i.memory_base() == Register::RIP && i.ip_rel_memory_address() == slot)
        .map(|i| i.ip())
        .collect()
}

/// Where the stubs of a PLT section start: every 16 bytes (the x86-64
/// psABI's stub size, in .plt and .plt.sec alike).
fn plt_stub_starts(bytes: &[u8], at: u64) -> Vec<u64> {
    (0..bytes.len() as u64).step_by(16).map(|o| at + o).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian 3.11's PyEval_RestoreThread (0x528c90) and PyEval_AcquireLock
    /// (0x4f0ead), as objdump shows them:
    ///   push %rbx; test %rdi,%rdi; je <cold>; mov %rdi,%rbx; call 4f92c0 <take_gil>; ...
    ///   ...; call 4f0e77 <_Py_FatalErrorFunc>; jmp 4f92c0 <take_gil>
    #[test]
    fn callers_agree_on_the_one_function_both_call() {
        let restore = [0x53, 0x48, 0x85, 0xff, 0x0f, 0x84, 0x33, 0x78, 0xf0, 0xff, 0x48, 0x89, 0xfb, 0xe8, 0x1e, 0x06, 0xfd, 0xff, 0x5b, 0xc3];
        let targets = direct_targets(&restore, 0x528c90);
        assert_eq!(targets, [0x4f92c0], "the je to the cold part is not a call");
        // call rel32 at 0x4f0eb0 to 0x4f0e77, then jmp rel32 at 0x4f0eb5 to 0x4f92c0.
        let mut acquire = vec![0x90, 0x90, 0x90];
        acquire.extend([0xe8, 0xc2, 0xff, 0xff, 0xff]);
        acquire.extend([0xe9, 0x06, 0x84, 0x00, 0x00]);
        let others = direct_targets(&acquire, 0x4f0ead);
        assert_eq!(others, [0x4f0e77, 0x4f92c0]);
        assert_eq!(agreed_target(&targets, &others), Some(0x4f92c0));
    }

    #[test]
    fn callers_that_disagree_or_share_two_functions_give_nothing() {
        assert_eq!(agreed_target(&[0x4f92c0], &[0x4f0e77, 0x4f92d0]), None, "no shared target");
        assert_eq!(agreed_target(&[0x1000, 0x2000], &[0x2000, 0x1000]), None, "two shared targets: neither is taken");
        assert_eq!(agreed_target(&[], &[0x1000]), None);
    }

    /// Debian 3.11's stub of pthread_cond_signal, at 0x41f460:
    ///   ff 25 b2 6d 52 00   jmp *0x526db2(%rip)   # GOT slot 0x946218
    ///   68 43 00 00 00      push $0x43
    ///   e9 b0 fb ff ff      jmp 41f020
    #[test]
    fn finds_the_plt_jump_through_a_slot() {
        let stub = [0xff, 0x25, 0xb2, 0x6d, 0x52, 0x00, 0x68, 0x43, 0, 0, 0, 0xe9, 0xb0, 0xfb, 0xff, 0xff];
        let mut plt = stub.to_vec();
        plt.extend(stub);
        assert_eq!(plt_jumps_through(&plt, 0x41f460, 0x946218), [0x41f460]);
        assert_eq!(plt_jumps_through(&plt, 0x41f460, 0x946228), [0x41f470], "the next stub, 16 bytes on, jumps through the next slot's address");
        assert!(plt_jumps_through(&plt, 0x41f460, 0x946220).is_empty());
    }
}

/// The search against the truth where there is one: on builds that keep
/// their symbol table (pyenv's), it must find the very functions the table
/// names, or nothing; and on Debian's stripped 3.11, the same sites as the
/// disassembly shows (objdump, addresses pasted in the comments).
#[cfg(test)]
mod on_real_builds {
    use std::path::{Path, PathBuf};

    use crate::python::Python;

    /// pyenv's build (its 3.11 is the one without USDT probes).
    fn pyenv(version: &str) -> PathBuf {
        let which = if version == "3.11" { "nodtrace-3.11".to_string() } else { format!("pyenv-{version}") };
        let out = std::process::Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg(&which).output().unwrap();
        assert!(out.status.success(), "scripts/pythons.sh {which}: {}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    }

    #[test]
    fn finds_what_the_symbol_table_names() {
        for version in ["3.10", "3.11", "3.12"] {
            let python = Python::from_executable(&pyenv(version), None).unwrap().unwrap();
            let sites = python.gil_sites().unwrap_or_else(|e| panic!("{version}: {e}"));
            assert_eq!(Some(sites.take_gil), python.elf.symbol("take_gil"), "{version}");
            assert_eq!(Some(sites.drop_gil), python.elf.symbol("drop_gil"), "{version}");
        }
    }

    /// pyenv's 3.13 (no link-time optimisation): PyEval_RestoreThread calls
    /// _PyThreadState_Attach, PyEval_AcquireLock _PyEval_AcquireLock, each
    /// of which calls take_gil. The two share no target, so nothing is
    /// taken (`gil` uses its symbol table instead).
    #[test]
    fn callers_that_share_no_target_give_no_site() {
        let python = Python::from_executable(&pyenv("3.13"), None).unwrap().unwrap();
        let missing = python.gil_sites().unwrap_err();
        assert!(missing.contains("do not agree on one function that would be take_gil"), "{missing}");
    }

    #[test]
    fn finds_debians_311_sites() {
        let python = Python::from_executable(Path::new("/usr/bin/python3.11"), None).unwrap().unwrap();
        assert!(python.elf.symbol("take_gil").is_none(), "Debian's 3.11 is stripped");
        let sites = python.gil_sites().unwrap();
        // 528c9d: call 4f92c0 (in PyEval_RestoreThread); 4f0ec4: jmp 4f92c0 (PyEval_AcquireLock)
        assert_eq!(sites.take_gil, 0x4f92c0);
        // 466f66 and 4f0be0: jmp 634310 (PyEval_ReleaseThread, PyEval_ReleaseLock)
        assert_eq!(sites.drop_gil, 0x634310);
        // 41f460: jmp *0x526db2(%rip)  # 946218 <pthread_cond_signal@GLIBC_2.3.2>
        assert_eq!(sites.cond_signal, 0x41f460);
        assert_eq!(sites.cond_wait, 0x420700);
    }

    /// The calls the signal probes go on are every call of (or jump to)
    /// pthread_cond_signal's stub that objdump, an independent decoder,
    /// shows in .text, on Debian's 3.11 and sid's 3.13 to 3.15 (8 to 15 of
    /// them).
    #[test]
    fn signal_calls_are_every_call_objdump_shows() {
        let sid = std::env::var_os("PYTRACE_ROOT_SID").map(PathBuf::from).unwrap_or_else(|| "/var/cache/pytrace/root-sid".into());
        let mut builds = vec![PathBuf::from("/usr/bin/python3.11")];
        builds.extend(["3.13", "3.14", "3.15"].map(|v| sid.join(format!("usr/bin/python{v}"))));
        for build in builds {
            let python = Python::from_executable(&build, None).unwrap().unwrap();
            let sites = python.gil_sites().unwrap_or_else(|e| panic!("{}: {e}", build.display()));
            let out = std::process::Command::new("objdump").args(["-d", "--no-show-raw-insn", "-j", ".text"]).arg(&build).output().unwrap();
            assert!(out.status.success(), "objdump {}", build.display());
            let stub = format!("{:x} <pthread_cond_signal@plt>", sites.cond_signal);
            let shown: Vec<u64> = String::from_utf8_lossy(&out.stdout)
                .lines()
                // "  4f9370:\tcall   41f460 <pthread_cond_signal@plt>", or a jmp or jcc
                .filter(|l| l.ends_with(&stub) && l.split('\t').nth(1).is_some_and(|op| op.starts_with("call") || op.starts_with('j')))
                .map(|l| u64::from_str_radix(l.trim().split(':').next().unwrap(), 16).unwrap())
                .collect();
            assert!(shown.len() >= 4, "{}: objdump shows {} calls of {stub}", build.display(), shown.len());
            assert_eq!(sites.signal_calls, shown, "{}", build.display());
        }
    }
}
