//! Starting the target ourselves (`pytrace … -- python3 script.py`), held
//! still until every probe is attached.
//!
//! The child runs under ptrace only until it execs a CPython: wrappers such
//! as pyenv's shims (shell scripts that exec the real interpreter) are
//! followed through each exec. At that exec stop no Python code has run and
//! no library is mapped yet; uprobes attached by file then apply as the
//! interpreter maps it. `resume` detaches and lets it run.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::python::Python;

pub struct Launched {
    pub pid: u32,
    /// Still traced and stopped (or running traced): not yet let go.
    held: bool,
    exit_status: Option<i32>,
    /// The CPU time the child used in all, known once it is reaped.
    pub cpu_at_exit_ns: Option<u64>,
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
        // SAFETY: waiting for our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } == pid {
            return Ok(status);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("waitpid failed");
        }
    }
}

/// Starts the command and returns it stopped at the exec of a CPython, with
/// that CPython.
pub fn launch(argv: &[String]) -> Result<(Launched, Python)> {
    let program = argv.first().context("no command given after --")?;
    let path = resolve(program).with_context(|| format!("command not found: {program}"))?;
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let c_args: Vec<CString> = argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>()?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());

    // SAFETY: between fork and exec the child only makes system calls.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("failed to fork");
    }
    if pid == 0 {
        unsafe {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            libc::execv(c_path.as_ptr(), c_argv.as_ptr());
            libc::_exit(127);
        }
    }
    let python = wait_for_python(pid, program)?;
    Ok((Launched { pid: pid as u32, held: true, exit_status: None, cpu_at_exit_ns: None }, python))
}

/// Follows the child through its execs until it is a CPython; kills it and
/// fails if it exits or is not supported.
fn wait_for_python(pid: libc::pid_t, program: &str) -> Result<Python> {
    let kill = || unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut s = 0;
        libc::waitpid(pid, &mut s, libc::__WALL);
    };
    let mut first = true;
    loop {
        let status = wait(pid)?;
        if libc::WIFEXITED(status) {
            let code = libc::WEXITSTATUS(status);
            if first && code == 127 {
                bail!("could not execute {program}");
            }
            bail!("{program} exited with status {code} before starting Python");
        }
        if libc::WIFSIGNALED(status) {
            bail!("{program} was killed by signal {} before starting Python", libc::WTERMSIG(status));
        }
        let stop = libc::WSTOPSIG(status);
        let exec_stop = first || (status >> 8) == (libc::SIGTRAP | (libc::PTRACE_EVENT_EXEC << 8));
        let mut deliver = 0;
        if first {
            // SAFETY: our traced child, stopped.
            unsafe {
                libc::ptrace(
                    libc::PTRACE_SETOPTIONS,
                    pid,
                    0,
                    (libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL) as libc::c_long,
                )
            };
            first = false;
        } else if !exec_stop {
            deliver = stop;
        }
        if exec_stop {
            let (exe, _) = crate::process::proc::exe_path(pid as u32)?;
            match Python::from_executable(Path::new(&exe), Some(pid as u32)) {
                Ok(Some(python)) => return Ok(python),
                Ok(None) => {}
                Err(e) => {
                    kill();
                    return Err(e);
                }
            }
        }
        // SAFETY: resume our stopped child, passing on any signal it got.
        unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver as libc::c_long) };
    }
}

impl Launched {
    /// Lets the child run, no longer traced.
    pub fn resume(&mut self) -> Result<()> {
        if self.held {
            // SAFETY: our traced child, stopped at an exec.
            if unsafe { libc::ptrace(libc::PTRACE_DETACH, self.pid as libc::pid_t, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error()).context("failed to let the command run");
            }
            self.held = false;
        }
        Ok(())
    }

    /// Lets the child run, still traced, until it stops itself with SIGSTOP
    /// (the BPF program does that at its first frame evaluation); runs
    /// `at_stop` then, and lets it go. Other signals are passed on. A child
    /// that exits first simply exits.
    pub fn resume_until_stop(&mut self, at_stop: impl FnOnce() -> Result<()>) -> Result<()> {
        let pid = self.pid as libc::pid_t;
        let mut deliver = 0;
        loop {
            // SAFETY: our traced, stopped child.
            unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver as libc::c_long) };
            let status = wait(pid)?;
            if let Some(code) = exit_code(status) {
                self.held = false;
                self.exit_status = Some(code);
                return Ok(());
            }
            let signal = libc::WSTOPSIG(status);
            deliver = if status >> 16 != 0 { 0 } else { signal };
            if deliver == libc::SIGSTOP {
                at_stop()?;
                return self.resume();
            }
        }
    }

    /// The exit status once the child has exited (reaping it), else None.
    /// Reaping also gives the CPU time it used in all (`cpu_at_exit_ns`).
    pub fn try_wait(&mut self) -> Option<i32> {
        if self.exit_status.is_some() {
            return self.exit_status;
        }
        let mut status = 0;
        // SAFETY: polling our own child; rusage is written by the kernel.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(self.pid as libc::pid_t, &mut status, libc::WNOHANG | libc::__WALL, &mut usage) };
        if r != self.pid as libc::pid_t {
            return None;
        }
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        self.cpu_at_exit_ns = Some(ns(usage.ru_utime) + ns(usage.ru_stime));
        self.exit_status = exit_code(status);
        self.exit_status
    }
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
    /// A child that never got to run is not left stopped behind us.
    fn drop(&mut self) {
        if self.held {
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
                let mut s = 0;
                libc::waitpid(self.pid as libc::pid_t, &mut s, libc::__WALL);
            }
        }
    }
}
