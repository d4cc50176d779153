//! Where `calls` puts its entry-and-return probe for every frame the eval
//! function runs, and so what the eval-frame hook points at.
//!
//! The kernel emulates a probed `push` or jump (about 1 µs a hit here) but
//! single-steps most other instructions out of line (15-19 µs). A return
//! probe must also sit where nothing has moved the stack yet, so that the
//! return address is on top of it. Most builds start
//! `_PyEval_EvalFrameDefault` with `endbr64; push`, and the probe goes on
//! the push (tracing::entry_probe_offset). Debian sid's 3.13.18 starts it
//! with `endbr64; sub $0x1a8,%rsp`: no instruction before the stack moves
//! is one the kernel emulates.
//!
//! On 3.11 and later pytrace sets the eval-frame hook anyway, to the
//! function's address (target_writes/eval_hook.rs), and every call of a
//! Python function goes through it. On such a build it points the hook at
//! a `jmp` to the function's entry found elsewhere in .text instead (a tail
//! call the compiler made). A call through the hook lands on the jump with
//! the same arguments and the return address on top of the stack, and goes
//! on into the function exactly as a direct call does; the probe sits on
//! the jump, which the kernel emulates.
//!
//! The jump must be a whole instruction in the compiler's stream (the
//! search decodes .text from its start): a breakpoint written onto bytes
//! that merely spell a jump inside another instruction would break that
//! instruction.

use iced_x86::Code;

use crate::python::{Python, EVAL_FRAME_SYMBOL};

/// Where calls' probe on the eval function sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalProbe {
    /// The function's entry (past a leading endbr64 before a push), which
    /// the kernel emulates or not.
    Entry { emulated: bool },
    /// A `jmp rel32` to the function at this link-time address: the hook
    /// points here, and the probe sits on it.
    TailJump(u64),
}

impl EvalProbe {
    /// For `pytrace info`: the site and what a call costs there.
    pub fn describe(&self) -> String {
        match self {
            EvalProbe::Entry { emulated: true } => "the eval function's entry, emulated by the kernel (1-3 us a call)".into(),
            EvalProbe::Entry { emulated: false } => {
                "the eval function's entry, single-stepped by the kernel (endbr64, then no push, starts the function, and no jump to it was found to point the hook at): measured 15-19 us a call, against 1-3 us where it is emulated".into()
            }
            EvalProbe::TailJump(at) => format!(
                "a jump to the eval function at {at:#x}, where the eval-frame hook points: its entry (endbr64, then no push) would be single-stepped by the kernel (15-19 us a call), the jump is emulated (1-3 us)"
            ),
        }
    }
}

impl Python {
    /// Where calls' entry-and-return probe on the eval function goes (see
    /// the module's comment), found once.
    pub fn eval_probe(&self) -> EvalProbe {
        *self.eval_probe.get_or_init(|| self.find_eval_probe())
    }

    fn find_eval_probe(&self) -> EvalProbe {
        let Ok(entry) = self.symbol(EVAL_FRAME_SYMBOL) else {
            return EvalProbe::Entry { emulated: false };
        };
        let emulated = self.elf.read_static(entry, 8).is_ok_and(crate::tracing::entry_probe_is_emulated);
        // Without the hook (3.9, 3.10) calls arrive at the entry itself.
        if emulated || !self.inlines_calls() {
            return EvalProbe::Entry { emulated };
        }
        self.jump_to(entry).map_or(EvalProbe::Entry { emulated: false }, EvalProbe::TailJump)
    }

    /// The first `jmp rel32` in .text whose target is `entry`.
    fn jump_to(&self, entry: u64) -> Option<u64> {
        let mut found = None;
        self.scan_text("a jump to the eval function", |i| {
            if found.is_none() && i.code() == Code::Jmp_rel32_64 && i.near_branch_target() == entry {
                found = Some(i.ip());
            }
        })
        .ok()?;
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(version: &str) -> Python {
        let root = std::env::var_os("PYTRACE_ROOT_SID").map(std::path::PathBuf::from).unwrap_or_else(|| "/var/cache/pytrace/root-sid".into());
        let path = root.join(format!("usr/bin/python{version}"));
        Python::from_executable(&path, None).unwrap().unwrap()
    }

    /// sid's 3.13.18 starts the eval function with `endbr64; sub rsp`: the
    /// probe moves to a jump to it. 3.14 and 3.15 start with `endbr64;
    /// push` and keep the entry.
    #[test]
    fn a_build_whose_entry_is_single_stepped_gets_a_jump() {
        let p313 = sid("3.13");
        let entry = p313.symbol(EVAL_FRAME_SYMBOL).unwrap();
        let EvalProbe::TailJump(at) = p313.eval_probe() else {
            panic!("sid's 3.13: {:?}", p313.eval_probe());
        };
        let bytes = p313.elf.read_static(at, 5).unwrap();
        let target = (at + 5).wrapping_add(i32::from_le_bytes(bytes[1..5].try_into().unwrap()) as i64 as u64);
        assert_eq!((bytes[0], target), (0xe9, entry), "the site at {at:#x} is a jmp rel32 to the entry");
        for version in ["3.14", "3.15"] {
            let p = sid(version);
            assert_eq!(p.eval_probe(), EvalProbe::Entry { emulated: true }, "sid's {version}");
        }
    }
}
