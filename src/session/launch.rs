//! Starting the target ourselves (`pytrace … -- python3 script.py`), held
//! still until every probe is attached, and ended with pytrace.
//!
//! The command runs in a process group of its own, under ptrace (seized,
//! following every fork, clone and exec) only until some process of its
//! tree execs a CPython: a wrapper that execs it (pyenv's shims), a shell
//! that forks it, `env`, a launcher written in any language. At that exec
//! stop no Python code has run and no library is mapped yet; uprobes
//! attached by file then apply as the interpreter maps it. Every other
//! process of the tree is let go then; `resume` lets the CPython go too.
//!
//! When pytrace stops before the command, the command's process group gets
//! SIGINT, then SIGTERM, then SIGKILL, each after STOP_STEP, unless
//! --keep-running says to leave it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::python::Python;

/// A command to start, and how long the whole run may last.
pub struct Command {
    pub argv: Vec<String>,
    /// --duration: it bounds the wait for a CPython too.
    pub duration: Option<Duration>,
    /// Leave the command running when pytrace stops first.
    pub keep_running: bool,
    /// Give the command the terminal (when pytrace has it), as a shell
    /// does its foreground job; not for a subcommand that reads keys.
    pub give_terminal: bool,
}

/// How long each step of stopping the command (SIGINT, SIGTERM) is given
/// before the next.
pub const STOP_STEP: Duration = Duration::from_secs(3);

/// After this long with no CPython yet, pytrace says it is waiting.
const QUIET_WAIT: Duration = Duration::from_secs(1);

pub struct Launched {
    /// The command itself, our child, and its process group.
    pub command_pid: u32,
    /// The CPython found in its tree (the command itself, or a descendant).
    pub pid: u32,
    /// The CPython is still traced and stopped (or running traced): not yet let go.
    held: bool,
    /// The command's exit status, once reaped.
    exit_status: Option<i32>,
    /// The CPU time the command used in all, known once it is reaped.
    pub cpu_at_exit_ns: Option<u64>,
    keep_running: bool,
    /// The terminal whose foreground process group we gave the command.
    terminal_handed: bool,
}

/// Finds `program` on PATH the way a shell would.
fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program)).filter(|p| is_executable(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

fn wait(pid: libc::pid_t) -> Result<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child or tracee.
        if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } == pid {
            return Ok(status);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("waitpid failed");
        }
    }
}

/// The ptrace event of a stop, 0 for a signal-delivery stop.
fn event_of(status: libc::c_int) -> libc::c_int {
    status >> 16
}

/// What a tracee of the launch tree is followed with: every new process or
/// thread is traced from its start, and every exec stops it.
const FOLLOW: libc::c_int = libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK | libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_EXITKILL;

/// Starts the command and returns it with its CPython stopped at its exec.
pub fn launch(command: &Command) -> Result<(Launched, Python)> {
    let program = command.argv.first().context("no command given after --")?;
    let path = resolve(program).with_context(|| format!("command not found: {program}"))?;
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let c_args: Vec<CString> = command.argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>()?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    let started = Instant::now();

    // The child waits on `gate` until it is seized, so its exec is seen.
    let mut gate = [0; 2];
    // SAFETY: pipe2 into a local array.
    if unsafe { libc::pipe2(gate.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("failed to create a pipe");
    }
    // SAFETY: between fork and exec the child only makes system calls.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("failed to fork");
    }
    if pid == 0 {
        unsafe {
            libc::setpgid(0, 0);
            libc::close(gate[1]);
            let mut byte = 0u8;
            while libc::read(gate[0], (&mut byte as *mut u8).cast(), 1) < 0 {}
            libc::execv(c_path.as_ptr(), c_argv.as_ptr());
            libc::_exit(127);
        }
    }
    // SAFETY: our child; both sides set its group so neither order races.
    unsafe {
        libc::setpgid(pid, pid);
        libc::close(gate[0]);
    }
    let mut launched = Launched {
        command_pid: pid as u32,
        pid: pid as u32,
        held: true,
        exit_status: None,
        cpu_at_exit_ns: None,
        keep_running: command.keep_running,
        terminal_handed: false,
    };
    // SAFETY: seizing our own child, blocked before its exec.
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, FOLLOW as libc::c_long) };
    let seize_error = std::io::Error::last_os_error();
    // Before it runs anything that could read the terminal.
    if seized == 0 && command.give_terminal {
        launched.hand_terminal();
    }
    // SAFETY: closing our end lets the child exec.
    unsafe { libc::close(gate[1]) };
    if seized != 0 {
        return Err(seize_error).context("failed to trace the command");
    }
    let python = launched.follow_until_python(program, command.duration.map(|d| started + d))?;
    Ok((launched, python))
}

impl Launched {
    /// The command's group gets the terminal (as a shell gives its
    /// foreground job), when pytrace has it: the command reads the terminal
    /// and Ctrl-C reaches it there, once.
    fn hand_terminal(&mut self) {
        // SAFETY: terminal calls on fd 0; SIGTTOU is blocked around them.
        unsafe {
            if libc::isatty(0) != 1 || libc::tcgetpgrp(0) != libc::getpgrp() {
                return;
            }
            self.terminal_handed = with_sigttou_ignored(|| libc::tcsetpgrp(0, self.command_pid as libc::pid_t) == 0);
        }
    }

    /// Takes the terminal back for pytrace's own group.
    fn take_terminal_back(&mut self) {
        if std::mem::take(&mut self.terminal_handed) {
            // SAFETY: as in hand_terminal.
            unsafe { with_sigttou_ignored(|| libc::tcsetpgrp(0, libc::getpgrp()) == 0) };
        }
    }

    /// Follows the command's tree until one of its processes execs a
    /// supported CPython, which is left stopped there and traced alone.
    /// Fails, stopping the command, if it exits first, if `deadline`
    /// (--duration) passes, or if a stop signal comes.
    fn follow_until_python(&mut self, program: &str, deadline: Option<Instant>) -> Result<Python> {
        let command = self.command_pid as libc::pid_t;
        let started = Instant::now();
        let mut traced: Vec<libc::pid_t> = vec![command];
        let mut said_waiting = false;
        let mut command_execed = false;
        loop {
            if super::stop_requested() {
                self.kill_tree(&traced);
                bail!("stopped before {program} (PID {command}) started a CPython");
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.kill_tree(&traced);
                bail!("{program} (PID {command}) started no CPython within the --duration of {:.1} s; it was stopped", started.elapsed().as_secs_f64());
            }
            if !said_waiting && started.elapsed() >= QUIET_WAIT {
                said_waiting = true;
                let until = match deadline {
                    Some(d) => format!("for up to {:.1} s more (--duration)", d.saturating_duration_since(Instant::now()).as_secs_f64()),
                    None => "until it does, exits, or pytrace is stopped".into(),
                };
                crate::console::err(&format!("pytrace: waiting for {program} (PID {command}) to start a CPython, {until}\n"));
            }
            let mut status = 0;
            // SAFETY: collecting stops and exits of our tracees.
            let who = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
            if who == 0 || (who < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted) {
                std::thread::sleep(if said_waiting { Duration::from_millis(10) } else { Duration::from_millis(1) });
                continue;
            }
            if who < 0 {
                return Err(std::io::Error::last_os_error()).context("waitpid failed");
            }
            if let Some(code) = exit_code(status) {
                traced.retain(|&t| t != who);
                if who == command {
                    self.held = false;
                    self.exit_status = Some(code);
                    // Whatever it left behind in its group goes with it.
                    self.kill_tree(&traced);
                    if !command_execed && code == 127 {
                        bail!("could not execute {program}");
                    }
                    if libc::WIFSIGNALED(status) {
                        bail!("{program} was killed by signal {} before starting Python", libc::WTERMSIG(status));
                    }
                    bail!("{program} exited with status {code} before starting Python");
                }
                continue;
            }
            if !traced.contains(&who) {
                traced.push(who);
            }
            let mut deliver = 0;
            match event_of(status) {
                libc::PTRACE_EVENT_EXEC => {
                    command_execed |= who == command;
                    match crate::process::proc::exe_path(who as u32).and_then(|(exe, _)| Python::from_executable(Path::new(&exe), Some(who as u32))) {
                        Ok(Some(python)) => {
                            self.pid = who as u32;
                            self.let_go_of_all_but(who, &traced);
                            return Ok(python);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.kill_tree(&traced);
                            return Err(e);
                        }
                    }
                }
                libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                    let mut child: libc::c_ulong = 0;
                    // SAFETY: the new process's PID, written into a local.
                    if unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, who, 0, &mut child as *mut libc::c_ulong) } == 0 && !traced.contains(&(child as libc::pid_t)) {
                        traced.push(child as libc::pid_t);
                    }
                }
                0 => deliver = libc::WSTOPSIG(status),
                // A new tracee's first stop, a group stop, or an exit event.
                _ => {}
            }
            // SAFETY: resuming our stopped tracee, passing on its signal.
            unsafe { libc::ptrace(libc::PTRACE_CONT, who, 0, deliver as libc::c_long) };
        }
    }

    /// The CPython `python` is kept, stopped and traced with no following;
    /// every other process of the tree is detached and runs on untraced.
    fn let_go_of_all_but(&mut self, python: libc::pid_t, traced: &[libc::pid_t]) {
        // SAFETY: our tracee, stopped at its exec.
        unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, python, 0, libc::PTRACE_O_EXITKILL as libc::c_long) };
        let mut others: Vec<libc::pid_t> = traced.iter().copied().filter(|&t| t != python).collect();
        while let Some(tracee) = others.pop() {
            // SAFETY: stopping a tracee so it can be detached.
            if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tracee, 0, 0) } != 0 {
                continue;
            }
            let Ok(status) = wait(tracee) else { continue };
            if let Some(code) = exit_code(status) {
                if tracee == self.command_pid as libc::pid_t {
                    self.exit_status = Some(code);
                }
                continue;
            }
            let mut deliver = 0;
            match event_of(status) {
                libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                    let mut child: libc::c_ulong = 0;
                    // SAFETY: as in follow_until_python.
                    if unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tracee, 0, &mut child as *mut libc::c_ulong) } == 0 {
                        others.push(child as libc::pid_t);
                    }
                }
                0 => deliver = libc::WSTOPSIG(status),
                _ => {}
            }
            // SAFETY: our stopped tracee; a signal it was getting goes with it.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tracee, 0, deliver as libc::c_long) };
        }
    }

    /// SIGKILL to the command's group and every process of its tree we
    /// trace, then reaps the command.
    fn kill_tree(&mut self, traced: &[libc::pid_t]) {
        // SAFETY: signals to processes we started and trace.
        unsafe {
            libc::kill(-(self.command_pid as libc::pid_t), libc::SIGKILL);
            for &t in traced {
                libc::kill(t, libc::SIGKILL);
            }
        }
        self.held = false;
        self.reap_blocking();
        self.take_terminal_back();
    }

    /// Waits for the command's exit (it was sent SIGKILL).
    fn reap_blocking(&mut self) {
        while self.try_wait().is_none() && self.is_child_alive() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether our child still exists (running or a zombie to reap).
    fn is_child_alive(&self) -> bool {
        // SAFETY: signal 0 only checks existence.
        unsafe { libc::kill(self.command_pid as libc::pid_t, 0) == 0 }
    }

    /// Lets the CPython run, no longer traced.
    pub fn resume(&mut self) -> Result<()> {
        if self.held {
            // SAFETY: our traced CPython, stopped at an exec.
            if unsafe { libc::ptrace(libc::PTRACE_DETACH, self.pid as libc::pid_t, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error()).context("failed to let the command run");
            }
            self.held = false;
        }
        Ok(())
    }

    /// Lets the CPython run, still traced, until it stops itself with
    /// SIGSTOP (the BPF program does that at its first frame evaluation);
    /// runs `at_stop` then, and lets it go. Other signals are passed on. A
    /// CPython that exits first simply exits.
    pub fn resume_until_stop(&mut self, at_stop: impl FnOnce() -> Result<()>) -> Result<()> {
        let pid = self.pid as libc::pid_t;
        let mut deliver = 0;
        loop {
            // SAFETY: our traced, stopped CPython.
            unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver as libc::c_long) };
            let status = wait(pid)?;
            if let Some(code) = exit_code(status) {
                self.held = false;
                if pid == self.command_pid as libc::pid_t {
                    self.exit_status = Some(code);
                }
                return Ok(());
            }
            let signal = libc::WSTOPSIG(status);
            deliver = if event_of(status) != 0 { 0 } else { signal };
            if deliver == libc::SIGSTOP {
                at_stop()?;
                return self.resume();
            }
        }
    }

    /// Whether the CPython still runs.
    pub fn python_running(&mut self) -> bool {
        if self.pid == self.command_pid {
            return self.try_wait().is_none();
        }
        crate::process::proc::is_running(self.pid)
    }

    /// The command's exit status once it has exited (reaping it), else
    /// None. Reaping also gives the CPU time it used in all (`cpu_at_exit_ns`).
    pub fn try_wait(&mut self) -> Option<i32> {
        if self.exit_status.is_some() {
            return self.exit_status;
        }
        let mut status = 0;
        // SAFETY: polling our own child; rusage is written by the kernel.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(self.command_pid as libc::pid_t, &mut status, libc::WNOHANG | libc::__WALL, &mut usage) };
        if r != self.command_pid as libc::pid_t {
            return None;
        }
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        self.cpu_at_exit_ns = Some(ns(usage.ru_utime) + ns(usage.ru_stime));
        self.exit_status = exit_code(status);
        if self.exit_status.is_some() {
            self.take_terminal_back();
        }
        self.exit_status
    }

    /// Waits for the command to exit by itself, until `deadline` or a stop
    /// signal; its status if it did.
    pub fn wait_until(&mut self, deadline: Option<Instant>) -> Option<i32> {
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if super::stop_requested() || deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` to the command's process group (its whole tree, but
    /// for processes that left the group, such as daemons).
    pub fn signal_group(&self, signal: libc::c_int) {
        if self.exit_status.is_none() {
            // SAFETY: a signal to the group of the command we started.
            unsafe { libc::kill(-(self.command_pid as libc::pid_t), signal) };
        }
    }

    /// pytrace stops before the command: unless --keep-running, its group
    /// gets SIGINT (unless `interrupted`, it had it already), SIGTERM and
    /// SIGKILL, each STOP_STEP after the last, until the command exits.
    /// Its exit status, or None if it was left running.
    pub fn stop(&mut self, interrupted: bool) -> Option<i32> {
        if let Some(status) = self.try_wait() {
            return Some(status);
        }
        if self.keep_running {
            self.take_terminal_back();
            let _ = self.resume();
            return None;
        }
        let steps: &[libc::c_int] = if interrupted { &[libc::SIGTERM, libc::SIGKILL] } else { &[libc::SIGINT, libc::SIGTERM, libc::SIGKILL] };
        for &signal in steps {
            self.signal_group(signal);
            if signal == libc::SIGKILL {
                // SAFETY: the command itself, should it have left its group.
                unsafe { libc::kill(self.command_pid as libc::pid_t, libc::SIGKILL) };
                self.held = false;
                self.reap_blocking();
                return self.exit_status;
            }
            let step_end = Instant::now() + STOP_STEP;
            while Instant::now() < step_end {
                if let Some(status) = self.try_wait() {
                    return Some(status);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.exit_status
    }

    pub fn keep_running(&self) -> bool {
        self.keep_running
    }
}

/// Runs `f` with SIGTTOU ignored: a background process group may then set
/// the terminal's foreground group.
unsafe fn with_sigttou_ignored(f: impl FnOnce() -> bool) -> bool {
    let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    let done = f();
    libc::signal(libc::SIGTTOU, old);
    done
}

/// A shell's exit code for a wait status: the code, or 128 + the signal.
fn exit_code(status: libc::c_int) -> Option<i32> {
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Some(128 + libc::WTERMSIG(status))
    } else {
        None
    }
}

impl Drop for Launched {
    /// On an error path: a command that never got to run is killed with
    /// its tree; one that ran is stopped as at the end of a run.
    fn drop(&mut self) {
        if self.exit_status.is_some() {
            self.take_terminal_back();
            return;
        }
        if self.held {
            self.kill_tree(&[self.pid as libc::pid_t]);
        } else {
            self.stop(false);
        }
        self.take_terminal_back();
    }
}
