//! The one change pytrace makes inside a target: on CPython 3.11 and later it
//! points `interp->eval_frame` (the PEP 523 hook, normally NULL) at
//! `_PyEval_EvalFrameDefault` itself. CPython inlines Python-to-Python calls
//! only while the hook is NULL, so with it set every call enters
//! `_PyEval_EvalFrameDefault`, where the uprobe sees it; the code that runs is
//! the same.
//!
//! The rules around that one write:
//! - it is made only where the field's offset is agreed by two sources
//!   (eval_frame_offset.rs), never in a free-threaded build, and only by
//!   the hook's one owner (hook_owner.rs);
//! - each slot is read before it is written: NULL is set, our own value
//!   left by a dead run is adopted, anyone else's hook is left alone;
//! - the slots are read again while tracing and before restoring: if
//!   something else changed one, the report says its counts are incomplete;
//! - restoring writes NULL only where the slot still holds our value, in the
//!   target and in the children it forked while traced (they inherit it);
//! - a guardian process, forked before any BPF object exists, in a session
//!   of its own (so killing pytrace's process group spares it), restores
//!   when pytrace dies, even by SIGKILL.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::hook_owner::HookLock;
use crate::python::probes::eval_entry::EvalProbe;
use crate::python::{Python, EVAL_FRAME_SYMBOL, RUNTIME_SYMBOL};
use crate::process::elf::ElfFile;
use crate::process::proc::{self, Memory};

/// More interpreters than this in one process means the list is garbage.
const MAX_INTERPRETERS: usize = 256;

/// How many forked children the guardian keeps track of.
const MAX_CHILDREN: usize = 4096;

/// What the guardian reads on its pipe: a child PID to watch too
/// (CHILD then 4 bytes), that the hook is about to be set (ARMED; before
/// that there is nothing of ours to restore), or that pytrace restored
/// everything itself (DONE).
const CHILD: u8 = b'C';
const ARMED: u8 = b'A';
/// Carries (SCM_RIGHTS) the calls program's map of followed children.
const CHILDREN_MAP: u8 = b'M';
const DONE: u8 = b'D';
/// What the guardian sends back once it is in a session of its own, out of
/// reach of a kill of pytrace's process group.
const READY: u8 = b'R';

/// How long pytrace waits for the guardian to say READY.
const GUARDIAN_READY_WAIT: Duration = Duration::from_secs(10);

/// Waits for the guardian's READY on pytrace's end of their socket.
fn wait_until_ready(socket: libc::c_int) -> Result<()> {
    let mut pfd = libc::pollfd { fd: socket, events: libc::POLLIN, revents: 0 };
    // SAFETY: poll and read on the socket we own, into a local byte.
    let (ready, byte) = unsafe {
        let ready = libc::poll(&mut pfd, 1, GUARDIAN_READY_WAIT.as_millis() as libc::c_int);
        let mut byte = 0u8;
        (ready == 1 && libc::read(socket, (&mut byte as *mut u8).cast(), 1) == 1, byte)
    };
    match (ready, byte) {
        (true, READY) => Ok(()),
        (true, _) => bail!("the guardian process sent {byte:#x} instead of saying it was ready"),
        (false, _) => bail!("the guardian process did not start within {} s (it exited, or the machine is overloaded)", GUARDIAN_READY_WAIT.as_secs()),
    }
}

/// How long pytrace waits for the guardian to exit once told DONE. A
/// guardian still there then (stopped, or starved) has nothing left to do
/// and is killed, which frees the lock it shares.
const GUARDIAN_EXIT_WAIT: Duration = Duration::from_secs(3);

pub struct EvalHook {
    pid: u32,
    elf: Rc<ElfFile>,
    target_path: String,
    runtime_vaddr: u64,
    /// What the hook points at: the eval function, or a jump to it
    /// (python/probes/eval_entry.rs).
    hook_vaddr: u64,
    /// The eval function's own address, which `pytrace restore` also
    /// recognises as ours when the hook is a jump (a run that could not
    /// restore may have left either).
    function_vaddr: u64,
    /// The jump's 5 bytes in the file, when the hook is a jump: the
    /// target's own text must hold the same before the hook points there.
    jump: Option<[u8; 5]>,
    interpreters_head: u64,
    interp_next: u64,
    interp_eval_frame: u64,
    /// The slots pytrace set (or adopted), with what it wrote there.
    set: RefCell<Vec<(u64, u64)>>,
    /// The first change to a slot of ours that pytrace did not make.
    changed: RefCell<Option<String>>,
}

/// What install found in the target.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Slots pytrace set from NULL.
    pub set: usize,
    /// Slots that already held pytrace's value with no owner alive (left
    /// by a run that could not restore): taken over, restored at the end.
    pub adopted: usize,
    /// Slots holding another tool's hook, left as they were.
    pub foreign: Vec<u64>,
}

impl EvalHook {
    /// Refuses where the one write would rest on a guess. A free-threaded
    /// build is no exception to that rule and needs none of its own: its
    /// offsets are its own table's (chosen by `_Py_DebugOffsets.free_threaded`,
    /// a version without one is refused when the interpreter is read), the
    /// offset below still needs two sources, and CPython itself sets the
    /// field there with one plain store, which this write is
    /// (`_PyInterpreterState_SetEvalFrameFunc` in 3.13; tests/integration/free_threaded.rs
    /// counts calls exactly on four threads running in parallel).
    pub fn new(pid: u32, python: &Python) -> Result<Self> {
        let Some(eval_frame) = python.eval_frame_offset.agreed else {
            bail!(
                "could not find interp->eval_frame in {} with two sources agreeing ({}), so it will not write it: calls needs that hook on Python {}",
                python.target_path,
                python.eval_frame_offset.describe(),
                python.version
            );
        };
        let function_vaddr = python.symbol(EVAL_FRAME_SYMBOL)?;
        let (hook_vaddr, jump) = match python.eval_probe() {
            EvalProbe::TailJump(at) => (at, Some(python.elf.read_static(at, 5)?.try_into()?)),
            EvalProbe::Entry { .. } => (function_vaddr, None),
        };
        Ok(Self {
            pid,
            elf: python.elf.clone(),
            target_path: python.target_path.clone(),
            runtime_vaddr: python.symbol(RUNTIME_SYMBOL)?,
            hook_vaddr,
            function_vaddr,
            jump,
            interpreters_head: python.layout.runtime_interpreters_head as u64,
            interp_next: python.layout.interp_next as u64,
            interp_eval_frame: eval_frame as u64,
            set: RefCell::new(Vec::new()),
            changed: RefCell::new(None),
        })
    }

    /// Where the interpreter file is loaded in process `pid` now: read at
    /// each use, because with `--` the library is not mapped yet when the
    /// hook is planned; found by the file's identity, so a process that maps
    /// another file (replaced on disk, another libpython) is never written.
    fn load_bias(&self, pid: u32) -> Result<u64> {
        crate::python::load_bias_in(&self.elf, &self.target_path, pid)
    }

    /// The value pytrace writes: the run-time address of
    /// _PyEval_EvalFrameDefault, or of a jump to it.
    pub fn hook_value(&self, load_bias: u64) -> u64 {
        self.hook_vaddr.wrapping_add(load_bias)
    }

    /// A hook that points at a jump: the file says the jump is there
    /// (eval_entry.rs decoded it), and the target's text must say the same
    /// before the hook sends every call through it. Its first byte may be
    /// a uprobe's breakpoint (0xcc, pytrace's own, attached first).
    fn check_jump(&self, mem: &Memory, at: u64) -> Result<()> {
        let Some(file) = self.jump else { return Ok(()) };
        let mut live = [0u8; 5];
        mem.read(at, &mut live)?;
        if live[1..] != file[1..] || (live[0] != file[0] && live[0] != 0xcc) {
            bail!(
                "process {} holds {:02x?} at {at:#x}, where {} holds the jump to _PyEval_EvalFrameDefault ({:02x?}) that the eval-frame hook would point at: its code is not the file's, so pytrace will not set the hook",
                self.pid, live, self.target_path, file
            );
        }
        Ok(())
    }

    /// check_jump on the target as it is now: a running process is
    /// refused before any probe is attached (install checks again).
    pub fn check_target_code(&self) -> Result<()> {
        if self.jump.is_none() {
            return Ok(());
        }
        let ours = self.hook_value(self.load_bias(self.pid)?);
        self.check_jump(&Memory::open(self.pid)?, ours)
    }

    fn eval_frame_slots(&self, mem: &Memory, bias: u64) -> Result<Vec<u64>> {
        let runtime = self.runtime_vaddr.wrapping_add(bias);
        let mut interp = mem.read_u64(runtime + self.interpreters_head)?;
        let mut slots = Vec::new();
        while interp != 0 && slots.len() < MAX_INTERPRETERS {
            let slot = interp + self.interp_eval_frame;
            // A list that loops back (garbage, or crafted) ends where it
            // repeats: a slot seen twice would read as set by someone else.
            if slots.contains(&slot) {
                break;
            }
            slots.push(slot);
            interp = mem.read_u64(interp + self.interp_next)?;
        }
        Ok(slots)
    }

    /// Sets the hook in every interpreter where it is NULL, reading each
    /// slot just before writing it. The caller owns the hook (HookLock).
    pub fn install(&self) -> Result<Installed> {
        let bias = self.load_bias(self.pid)?;
        let ours = self.hook_value(bias);
        let mem = Memory::open(self.pid)?;
        self.check_jump(&mem, ours)?;
        let mut installed = Installed::default();
        for slot in self.eval_frame_slots(&mem, bias)? {
            match mem.read_u64(slot)? {
                0 => {
                    mem.write_u64(slot, ours)?;
                    self.set.borrow_mut().push((slot, ours));
                    installed.set += 1;
                }
                v if v == ours => {
                    self.set.borrow_mut().push((slot, ours));
                    installed.adopted += 1;
                }
                // Ours too, from a run that hooked the function itself
                // (where this one hooks a jump to it): pointed at the jump.
                v if v == self.function_vaddr.wrapping_add(bias) => {
                    mem.write_u64(slot, ours)?;
                    self.set.borrow_mut().push((slot, ours));
                    installed.adopted += 1;
                }
                other => installed.foreign.push(other),
            }
        }
        Ok(installed)
    }

    /// Sets the hook in the interpreters created since `install` (a
    /// subinterpreter made while traced starts with NULL there, and 3.11+
    /// inlines its calls), by install's rules: only a slot holding NULL,
    /// read just before it is written. Forgets the slots of interpreters
    /// that are gone, so that a new one at a freed one's address is hooked
    /// and a freed slot is never read as "changed". Returns how many it set.
    pub fn install_new(&self) -> Result<usize> {
        let bias = self.load_bias(self.pid)?;
        let ours = self.hook_value(bias);
        let mem = Memory::open(self.pid)?;
        let live = self.eval_frame_slots(&mem, bias)?;
        self.set.borrow_mut().retain(|(slot, _)| live.contains(slot));
        let mut added = 0;
        for slot in live {
            if self.set.borrow().iter().any(|&(s, _)| s == slot) {
                continue;
            }
            if mem.read_u64(slot)? == 0 {
                mem.write_u64(slot, ours)?;
                self.set.borrow_mut().push((slot, ours));
                added += 1;
            }
        }
        Ok(added)
    }

    /// Reads back every slot pytrace set in an interpreter that still
    /// exists: the first one found changed by someone else is remembered
    /// (`changed`). A target that exited has nothing to check.
    pub fn verify(&self) {
        if self.changed.borrow().is_some() || self.set.borrow().is_empty() {
            return;
        }
        let Ok(mem) = Memory::open(self.pid) else { return };
        let Ok(bias) = self.load_bias(self.pid) else { return };
        let Ok(live) = self.eval_frame_slots(&mem, bias) else { return };
        for &(slot, ours) in self.set.borrow().iter().filter(|(slot, _)| live.contains(slot)) {
            match mem.read_u64(slot) {
                Ok(v) if v != ours => {
                    let found = if v == 0 { "NULL".to_string() } else { format!("{v:#x}") };
                    *self.changed.borrow_mut() = Some(format!(
                        "interp->eval_frame in process {} was changed by something other than pytrace while it traced (found {found}): calls CPython ran inline after that were not seen, so counts are incomplete",
                        self.pid
                    ));
                    return;
                }
                _ => {}
            }
        }
    }

    /// Why the counts are incomplete, if the hook was changed under us.
    pub fn changed(&self) -> Option<String> {
        self.changed.borrow().clone()
    }

    /// What the main interpreter's eval_frame holds now.
    pub fn state(&self) -> Result<HookState> {
        let bias = self.load_bias(self.pid)?;
        let mem = Memory::open(self.pid)?;
        let Some(&slot) = self.eval_frame_slots(&mem, bias)?.first() else {
            return Ok(HookState::Unset);
        };
        Ok(match mem.read_u64(slot)? {
            0 => HookState::Unset,
            v if v == self.hook_value(bias) || v == self.function_vaddr.wrapping_add(bias) => HookState::Ours,
            v => HookState::Other(v),
        })
    }

    /// Puts NULL back wherever the hook of process `pid` (the target, or a
    /// child it forked, which maps the same file) holds our value; returns
    /// how many. A process that is gone has nothing to restore.
    pub fn restore_in(&self, pid: u32) -> Result<usize> {
        if !proc::is_running(pid) {
            return Ok(0);
        }
        let gone = |e: anyhow::Error| if proc::is_running(pid) { Err(e) } else { Ok(0) };
        let bias = match self.load_bias(pid) {
            Ok(bias) => bias,
            // A child that exec'd another program runs no hook of ours.
            Err(_) if pid != self.pid => return Ok(0),
            Err(e) => return gone(e),
        };
        let ours = self.hook_value(bias);
        let restore = || -> Result<usize> {
            let mem = Memory::open(pid)?;
            let mut restored = 0;
            for slot in self.eval_frame_slots(&mem, bias)? {
                if mem.read_u64(slot)? == ours {
                    mem.write_u64(slot, 0)?;
                    restored += 1;
                }
            }
            Ok(restored)
        };
        restore().or_else(gone)
    }

    /// Restores the target, checking first that every slot pytrace set
    /// still holds its value (else `changed` says so).
    pub fn restore(&self) -> Result<usize> {
        self.verify();
        self.restore_in(self.pid)
    }

    /// Forks the guardian, which then shares `lock`. Call before any BPF
    /// object or thread exists: the child must hold no BPF link (it would
    /// keep the probes attached) and fork only copies the calling thread.
    pub fn spawn_guardian(&self, lock: HookLock) -> Result<Guardian> {
        let mut fds = [0; 2];
        // SAFETY: plain system calls on fds we own.
        unsafe {
            // A socket, not a pipe: it can pass the guardian a map's fd.
            if libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) != 0 {
                return Err(std::io::Error::last_os_error()).context("failed to create the guardian's socket");
            }
            let parent = libc::getpid();
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()).context("failed to fork the guardian"),
                0 => {
                    libc::close(fds[1]);
                    self.guard(parent, fds[0], lock);
                }
                pid => {
                    libc::close(fds[0]);
                    let guardian = Guardian { pipe: fds[1], pid, lock: Some(lock), children: Vec::new() };
                    // Nothing is written into the target before the guardian
                    // has left pytrace's process group: on a loaded machine
                    // it ran that late (after the hook was set), so a kill of
                    // the group in between killed both and left the hook set.
                    wait_until_ready(fds[1])?;
                    Ok(guardian)
                }
            }
        }
    }

    /// The guardian's whole life: wait until pytrace is done or gone;
    /// restore if it did not; release the lock; exit.
    fn guard(&self, parent: libc::pid_t, pipe: libc::c_int, lock: HookLock) -> ! {
        // SAFETY: system calls in a single-threaded child.
        unsafe {
            // Its own session: killing pytrace's process group (systemd,
            // container stops, some shells' Ctrl-C) does not reach it.
            libc::setsid();
            libc::prctl(libc::PR_SET_NAME, c"pytrace-guard".as_ptr() as libc::c_ulong, 0, 0, 0);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE, libc::SIGQUIT] {
                libc::signal(sig, libc::SIG_IGN);
            }
            libc::write(pipe, [READY].as_ptr().cast(), 1);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            let pidfd = libc::syscall(libc::SYS_pidfd_open, parent, 0) as libc::c_int;
            let mut children: Vec<(u32, u64)> = Vec::new();
            let mut done = false;
            let mut armed = false;
            let mut children_map: Option<std::os::fd::OwnedFd> = None;
            let mut byte = 0u8;
            while let Some(fd) = receive_byte(pipe, &mut byte) {
                match byte {
                    DONE => done = true,
                    ARMED => armed = true,
                    CHILDREN_MAP => children_map = fd.or(children_map),
                    CHILD => {
                        let mut pid = [0u8; 4];
                        if libc::read(pipe, pid.as_mut_ptr().cast(), 4) != 4 {
                            break;
                        }
                        let pid = u32::from_ne_bytes(pid);
                        if children.len() < MAX_CHILDREN {
                            if let Ok(start) = proc::start_time(pid) {
                                children.push((pid, start));
                            }
                        }
                    }
                    _ => {}
                }
            }
            let mut code = 0;
            if !done && armed {
                // pytrace died. Wait until it has fully exited, so its BPF
                // links are gone before the hook is removed.
                if pidfd >= 0 {
                    let mut pfd = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
                    libc::poll(&mut pfd, 1, 10_000);
                }
                if let Err(e) = self.restore_in(self.pid) {
                    crate::console::err(&format!("pytrace guardian: could not restore interp->eval_frame in process {}: {e:#}\n", self.pid));
                    code = 1;
                }
                // Children forked since pytrace's last poll, daemons
                // reparented away included: the map has them all.
                if let Some(map) = &children_map {
                    for pid in map_keys(map, MAX_CHILDREN) {
                        if children.len() < MAX_CHILDREN && !children.iter().any(|&(p, _)| p == pid) {
                            if let Ok(start) = proc::start_time(pid) {
                                children.push((pid, start));
                            }
                        }
                    }
                }
                self.restore_children(&children);
            }
            lock.release();
            libc::_exit(code);
        }
    }

    /// Children the target forked while traced inherited the hook: each
    /// still the same process (start time) and running our hook gets NULL
    /// back; so do their own children, found by parent PID.
    pub fn restore_children(&self, known: &[(u32, u64)]) {
        let mut all: Vec<u32> = known.iter().filter(|&&(pid, start)| proc::start_time(pid).is_ok_and(|s| s == start)).map(|&(pid, _)| pid).collect();
        let mut roots = all.clone();
        roots.push(self.pid);
        for pid in proc::descendants(&roots, MAX_CHILDREN) {
            if !all.contains(&pid) {
                all.push(pid);
            }
        }
        for pid in all {
            if let Err(e) = self.restore_in(pid) {
                crate::console::err(&format!("pytrace: could not restore interp->eval_frame in process {pid}, a child of {}: {e:#}\n", self.pid));
            }
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
    Other(u64),
}

impl HookState {
    /// For `pytrace info`: with the live pytrace that owns the hook, here
    /// or in an ancestor it was inherited from (owner, traced process), and
    /// the pytrace whose killed run left its lock file, if any. Only that
    /// record makes a hook "stale": without it, it may be the build's own.
    pub fn describe(self, pid: u32, owner: Option<(u32, u32)>, left_by: Option<u32>) -> String {
        match (self, owner, left_by) {
            (HookState::Unset, _, _) => "not set".into(),
            (HookState::Ours, Some((owner, traced)), _) if traced == pid => {
                format!("set to _PyEval_EvalFrameDefault by pytrace PID {owner} (pytrace calls is tracing this process)")
            }
            (HookState::Ours, Some((owner, traced)), _) => format!(
                "set to _PyEval_EvalFrameDefault, inherited from process {traced}, which pytrace PID {owner} is tracing: that run puts it back in this process too when it ends"
            ),
            (HookState::Ours, None, Some(left_by)) => format!(
                "set to _PyEval_EvalFrameDefault by pytrace PID {left_by}, which ended without putting it back (stale); `pytrace restore -p {pid}` puts NULL back"
            ),
            (HookState::Ours, None, None) => format!(
                "set to _PyEval_EvalFrameDefault, by no pytrace run on record for this process (left by a run on a parent it forked from, or set by the build or another tool); `pytrace restore -p {pid}` puts NULL back"
            ),
            (HookState::Other(v), _, _) => format!("set by another tool to {v:#x} (a debugger or JIT's PEP 523 hook)"),
        }
    }
}

/// pytrace's end of the guardian: its pipe, and the lock they share.
pub struct Guardian {
    pipe: libc::c_int,
    pid: libc::pid_t,
    lock: Option<HookLock>,
    /// Children of the target told to the guardian, with their start times.
    pub children: Vec<(u32, u64)>,
}

impl Guardian {
    /// Tells the guardian about a child the target forked.
    pub fn watch_child(&mut self, child: u32) {
        let Ok(start) = proc::start_time(child) else { return };
        if self.children.len() >= MAX_CHILDREN || self.children.contains(&(child, start)) {
            return;
        }
        self.children.push((child, start));
        let mut message = [CHILD, 0, 0, 0, 0];
        message[1..].copy_from_slice(&child.to_ne_bytes());
        // SAFETY: a write to our pipe; a short write means the guardian is gone.
        unsafe { libc::write(self.pipe, message.as_ptr().cast(), message.len()) };
    }

    /// Hands the guardian the calls program's map of followed children
    /// (the fd travels in the message, so the map outlives pytrace).
    pub fn share_children_map(&self, map: std::os::fd::BorrowedFd<'_>) {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let fds = [map];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        // The space is sized for exactly this message: it always fits.
        control.push(SendAncillaryMessage::ScmRights(&fds));
        // SAFETY: self.pipe is our open end of the socket until `finish` or
        // drop closes it, and neither can run during this borrow.
        let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.pipe) };
        // A failed send means the guardian is gone, as for the writes above.
        let _ = sendmsg(socket, &[std::io::IoSlice::new(&[CHILDREN_MAP])], &mut control, SendFlags::NOSIGNAL);
    }

    /// The hook is about to be set: from now on, should pytrace die, the
    /// guardian restores.
    pub fn arm(&self) {
        // SAFETY: a write to our pipe.
        unsafe { libc::write(self.pipe, [ARMED].as_ptr().cast(), 1) };
    }

    /// pytrace restored everything itself: the guardian exits without
    /// touching the target (killed if it has not within
    /// GUARDIAN_EXIT_WAIT); then the lock is released.
    pub fn finish(mut self) {
        // SAFETY: a write to and close of our pipe, then reaping our child.
        unsafe {
            libc::write(self.pipe, [DONE].as_ptr().cast(), 1);
            libc::close(self.pipe);
            self.pipe = -1;
            let deadline = Instant::now() + GUARDIAN_EXIT_WAIT;
            let mut status = 0;
            loop {
                let r = libc::waitpid(self.pid, &mut status, libc::WNOHANG);
                if r == self.pid || (r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)) {
                    break;
                }
                if Instant::now() >= deadline {
                    crate::console::err(&format!(
                        "pytrace: warning: the guardian (PID {}) did not exit within {} s of being told the hook was restored (stopped?); it was killed\n",
                        self.pid,
                        GUARDIAN_EXIT_WAIT.as_secs()
                    ));
                    libc::kill(self.pid, libc::SIGKILL);
                    while libc::waitpid(self.pid, &mut status, 0) < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {}
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some(lock) = self.lock.take() {
            lock.release();
        }
    }
}

impl Drop for Guardian {
    /// Without `finish` (an error path), closing the pipe makes the
    /// guardian restore, as if pytrace had died.
    fn drop(&mut self) {
        if self.pipe >= 0 {
            // SAFETY: we own this fd.
            unsafe { libc::close(self.pipe) };
        }
    }
}

/// Reads one byte from the guardian's socket into `byte`, with the fd it
/// carries if any: None at the end (pytrace closed it, or died). The fd is
/// kept only when the control data came whole (no MSG_CTRUNC) and holds
/// exactly one SOL_SOCKET/SCM_RIGHTS descriptor; any other fds received are
/// closed.
fn receive_byte(socket: libc::c_int, byte: &mut u8) -> Option<Option<std::os::fd::OwnedFd>> {
    use rustix::io::Errno;
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
    // SAFETY: the guardian owns `socket` for its whole life (closed only by
    // its exit), so the borrow cannot outlive it.
    let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(socket) };
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match recvmsg(socket, &mut [std::io::IoSliceMut::new(std::slice::from_mut(byte))], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(received) => break received,
            Err(Errno::INTR) => continue,
            Err(_) => return None,
        }
    };
    if received.bytes != 1 {
        return None;
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        // Some fds did not fit (the kernel closed those); what did fit is
        // closed when `control` drops: not the one message that was sent.
        return Some(None);
    }
    // rustix yields ScmRights only for SOL_SOCKET/SCM_RIGHTS messages; fds
    // not taken here are closed as the iterators drop.
    let mut fds: Vec<std::os::fd::OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    match fds.len() {
        1 => Some(fds.pop()),
        _ => Some(None),
    }
}

/// The keys (PIDs) of a BPF hash map keyed by u32, at most `max`.
fn map_keys(map: &std::os::fd::OwnedFd, max: usize) -> Vec<u32> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct NextKey {
        map_fd: u32,
        _pad: u32,
        key: u64,
        next_key: u64,
    }
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    let mut keys = Vec::new();
    let mut key: Option<u32> = None;
    let mut next: u32 = 0;
    while keys.len() < max {
        let attr = NextKey {
            map_fd: map.as_raw_fd() as u32,
            _pad: 0,
            key: key.as_ref().map_or(0, |k| k as *const u32 as u64),
            next_key: &mut next as *mut u32 as u64,
        };
        // SAFETY: the bpf(2) command reads `attr` and writes `next`.
        let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_GET_NEXT_KEY, &attr as *const NextKey, std::mem::size_of::<NextKey>()) };
        if r != 0 {
            break;
        }
        keys.push(next);
        key = Some(next);
    }
    keys
}

/// Puts NULL back by hand (`pytrace restore`): only where the hook holds
/// this process's _PyEval_EvalFrameDefault (or the jump to it that
/// eval_entry.rs chooses), and only with no live owner.
pub fn restore_by_hand(pid: u32, python: &Python) -> Result<String> {
    if let Some(owner) = HookLock::owner(pid) {
        bail!("pytrace PID {owner} is tracing calls in process {pid} now and puts its eval-frame hook back when it ends: `pytrace restore` is for a hook left behind");
    }
    let lock = HookLock::acquire(pid)?;
    let hook = EvalHook::new(pid, python)?;
    let result = (|| -> Result<String> {
        let bias = hook.load_bias(pid)?;
        let mem = Memory::open(pid)?;
        let ours = hook.hook_value(bias);
        let function = hook.function_vaddr.wrapping_add(bias);
        let mut restored = 0;
        let mut foreign = Vec::new();
        for slot in hook.eval_frame_slots(&mem, bias)? {
            match mem.read_u64(slot)? {
                v if v == ours || v == function => {
                    mem.write_u64(slot, 0)?;
                    restored += 1;
                }
                0 => {}
                other => foreign.push(format!("{other:#x}")),
            }
        }
        match (restored, foreign.is_empty()) {
            (0, true) => Ok(format!("nothing to restore: interp->eval_frame of process {pid} is not set")),
            (0, false) => bail!(
                "interp->eval_frame of process {pid} holds {}, not _PyEval_EvalFrameDefault ({function:#x}){}: that is another tool's hook, left as it is",
                foreign.join(", "),
                if ours == function { String::new() } else { format!(" or pytrace's jump to it ({ours:#x})") }
            ),
            (n, _) => Ok(format!("restored interp->eval_frame to NULL in {n} interpreter(s) of process {pid}")),
        }
    })();
    lock.release();
    result
}
