//! The one change pytrace makes inside a target: on CPython 3.11 and later it
//! points `interp->eval_frame` (the PEP 523 hook, normally NULL) at
//! `_PyEval_EvalFrameDefault` itself. CPython inlines Python-to-Python calls
//! only while the hook is NULL, so with it set every call enters
//! `_PyEval_EvalFrameDefault`, where the uprobe sees it; the code that runs is
//! the same. Restoring means writing NULL back, and only where the hook still
//! holds our value.
//!
//! A guardian process, forked before any BPF object exists, restores the hook
//! when pytrace dies, even by SIGKILL.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::{Python, EVAL_FRAME_SYMBOL, RUNTIME_SYMBOL};
use crate::target::elf::ElfFile;
use crate::target::proc::{self, Memory};

/// More interpreters than this in one process means the list is garbage.
const MAX_INTERPRETERS: usize = 256;

pub struct EvalHook {
    pid: u32,
    elf_path: PathBuf,
    target_path: String,
    runtime_vaddr: u64,
    hook_vaddr: u64,
    interpreters_head: u64,
    interp_next: u64,
    interp_eval_frame: u64,
}

impl EvalHook {
    pub fn new(pid: u32, python: &Python) -> Result<Self> {
        Ok(Self {
            pid,
            elf_path: python.elf.path.clone(),
            target_path: python.target_path.clone(),
            runtime_vaddr: python.symbol(RUNTIME_SYMBOL)?,
            hook_vaddr: python.symbol(EVAL_FRAME_SYMBOL)?,
            interpreters_head: python.layout.runtime_interpreters_head as u64,
            interp_next: python.layout.interp_next as u64,
            interp_eval_frame: python.layout.interp_eval_frame as u64,
        })
    }

    /// Where the interpreter file is loaded now; read at each use, because
    /// with `--` the library is not mapped yet when the hook is planned.
    fn load_bias(&self) -> Result<u64> {
        let first_page = proc::file_mappings(self.pid)?
            .into_iter()
            .find(|m| m.path == self.target_path && m.offset == 0)
            .with_context(|| format!("{} is not mapped in process {}", self.target_path, self.pid))?
            .start;
        ElfFile::open(&self.elf_path)?.load_bias(first_page)
    }

    /// The value pytrace writes: the run-time address of _PyEval_EvalFrameDefault.
    pub fn hook_value(&self, load_bias: u64) -> u64 {
        self.hook_vaddr.wrapping_add(load_bias)
    }

    fn eval_frame_slots(&self, mem: &Memory, bias: u64) -> Result<Vec<u64>> {
        let runtime = self.runtime_vaddr.wrapping_add(bias);
        let mut interp = mem.read_u64(runtime + self.interpreters_head)?;
        let mut slots = Vec::new();
        while interp != 0 && slots.len() < MAX_INTERPRETERS {
            slots.push(interp + self.interp_eval_frame);
            interp = mem.read_u64(interp + self.interp_next)?;
        }
        Ok(slots)
    }

    /// Sets the hook in every interpreter where it is NULL; returns how many.
    pub fn install(&self) -> Result<usize> {
        let bias = self.load_bias()?;
        let mem = Memory::open(self.pid)?;
        let mut changed = 0;
        for slot in self.eval_frame_slots(&mem, bias)? {
            if mem.read_u64(slot)? == 0 {
                mem.write_u64(slot, self.hook_value(bias))?;
                changed += 1;
            }
        }
        Ok(changed)
    }

    /// What the main interpreter's eval_frame holds now.
    pub fn state(&self) -> Result<HookState> {
        let bias = self.load_bias()?;
        let mem = Memory::open(self.pid)?;
        let Some(&slot) = self.eval_frame_slots(&mem, bias)?.first() else {
            return Ok(HookState::Unset);
        };
        Ok(match mem.read_u64(slot)? {
            0 => HookState::Unset,
            v if v == self.hook_value(bias) => HookState::Ours,
            _ => HookState::Other,
        })
    }

    /// Puts NULL back wherever the hook holds our value; returns how many.
    pub fn restore(&self) -> Result<usize> {
        if !proc::is_running(self.pid) {
            return Ok(0);
        }
        let bias = self.load_bias()?;
        let mem = Memory::open(self.pid)?;
        let mut restored = 0;
        for slot in self.eval_frame_slots(&mem, bias)? {
            if mem.read_u64(slot)? == self.hook_value(bias) {
                mem.write_u64(slot, 0)?;
                restored += 1;
            }
        }
        Ok(restored)
    }

    /// Forks the guardian. Call before any BPF object or thread exists: the
    /// child must hold no BPF link (it would keep the probes attached) and
    /// fork only copies the calling thread.
    pub fn spawn_guardian(&self) -> Result<Guardian> {
        let mut fds = [0; 2];
        // SAFETY: plain system calls on fds we own.
        unsafe {
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(std::io::Error::last_os_error()).context("failed to create the guardian's pipe");
            }
            let parent = libc::getpid();
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()).context("failed to fork the guardian"),
                0 => {
                    libc::close(fds[1]);
                    self.guard(parent, fds[0]);
                }
                _ => {
                    libc::close(fds[0]);
                    Ok(Guardian { pipe: fds[1] })
                }
            }
        }
    }

    /// The guardian's whole life: wait until pytrace is gone, restore, exit.
    fn guard(&self, parent: libc::pid_t, pipe: libc::c_int) -> ! {
        // SAFETY: system calls in a single-threaded child.
        unsafe {
            // Ctrl-C and friends are for pytrace; the guardian outlives it.
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
                libc::signal(sig, libc::SIG_IGN);
            }
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            let pidfd = libc::syscall(libc::SYS_pidfd_open, parent, 0) as libc::c_int;
            let mut byte = 0u8;
            while libc::read(pipe, (&mut byte as *mut u8).cast(), 1) > 0 {}
            // EOF: pytrace closed its end or died. Wait until it has fully
            // exited, so its BPF links are gone before the hook is removed.
            if pidfd >= 0 {
                let mut pfd = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
                libc::poll(&mut pfd, 1, 10_000);
            }
            let code = match self.restore() {
                Ok(_) => 0,
                Err(e) => {
                    eprintln!("pytrace guardian: could not restore process {}: {e:#}", self.pid);
                    1
                }
            };
            libc::_exit(code);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookState {
    /// NULL: CPython's default (on 3.11+, calls are inlined).
    Unset,
    /// _PyEval_EvalFrameDefault: pytrace's hook, tracing now or left behind.
    Ours,
    /// Another function: someone else's PEP 523 hook (a debugger, a JIT).
    Other,
}

impl HookState {
    pub fn describe(self) -> &'static str {
        match self {
            HookState::Unset => "not set",
            HookState::Ours => "set to _PyEval_EvalFrameDefault (pytrace calls is tracing this process)",
            HookState::Other => "set by another tool (a debugger or JIT's PEP 523 hook)",
        }
    }
}

/// pytrace's end of the guardian's pipe; dropping it (or dying) releases it.
pub struct Guardian {
    pipe: libc::c_int,
}

impl Drop for Guardian {
    fn drop(&mut self) {
        // SAFETY: we own this fd.
        unsafe { libc::close(self.pipe) };
    }
}
