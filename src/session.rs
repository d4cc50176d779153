//! What every tracing subcommand does around its BPF program: check that
//! tracing is possible at all, find or start the target, and decide when to
//! stop (target exit, --duration, Ctrl-C or SIGTERM).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::python::eval_hook::{EvalHook, Guardian};
use crate::python::Python;
use crate::target::launch::{self, Launched};
use crate::target::proc;
use crate::tracing::Mode;

pub enum TargetSpec {
    Pid(u32),
    Command(Vec<String>),
}

static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_: libc::c_int) {
    STOP_REQUESTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end tracing and still write the report. No SA_RESTART,
/// so a blocked poll returns at once.
pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = request_stop as *const () as usize;
        for sig in [libc::SIGINT, libc::SIGTERM] {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Whether Ctrl-C or SIGTERM asked pytrace to stop.
pub fn stop_requested() -> bool {
    STOP_REQUESTED.load(Ordering::SeqCst)
}

/// Why tracing cannot work on this machine, said before touching the target.
pub fn preflight() -> Result<()> {
    let btf = crate::kernel::btf_path();
    if !std::path::Path::new(&btf).exists() {
        bail!("this kernel has no BTF ({btf} is missing): pytrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y");
    }
    crate::kernel::Kernel::get().require(crate::kernel::Feature::Ringbuf, "pytrace")?;
    if !has_tracing_privileges() {
        bail!("tracing needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE): run pytrace with sudo");
    }
    Ok(())
}

fn has_tracing_privileges() -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    const CAP_SYS_PTRACE: u32 = 19;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| effective & (1 << cap) != 0;
    has(CAP_SYS_PTRACE) && (has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)))
}

pub struct Target {
    pub pid: u32,
    launched: Option<Launched>,
    exit_status: Option<i32>,
    started: Instant,
}

impl Target {
    /// Finds the Python in a running process, or starts the command and
    /// holds it before its first Python instruction.
    pub fn prepare(spec: TargetSpec) -> Result<(Self, Python)> {
        preflight()?;
        let (pid, python, launched) = match spec {
            TargetSpec::Pid(pid) => (pid, Python::from_pid(pid)?, None),
            TargetSpec::Command(argv) => {
                let (launched, python) = launch::launch(&argv)?;
                (launched.pid, python, Some(launched))
            }
        };
        Ok((Self { pid, launched, exit_status: None, started: Instant::now() }, python))
    }

    pub fn started_by_us(&self) -> bool {
        self.launched.is_some()
    }

    /// Lets a command we started run, once every probe is attached.
    pub fn release(&mut self) -> Result<()> {
        self.started = Instant::now();
        if let Some(l) = &mut self.launched {
            l.resume()?;
        }
        Ok(())
    }

    /// Lets a command we started run until its first frame evaluation,
    /// where the BPF program stops it; runs `at_stop`, then lets it go.
    pub fn release_at_first_eval(&mut self, at_stop: impl FnOnce() -> Result<()>) -> Result<()> {
        self.started = Instant::now();
        match &mut self.launched {
            Some(l) => l.resume_until_stop(at_stop),
            None => at_stop(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// False once tracing should end: the target exited, the duration ran
    /// out, or a stop was requested.
    pub fn keep_going(&mut self, duration: Option<Duration>) -> bool {
        if STOP_REQUESTED.load(Ordering::SeqCst) {
            return false;
        }
        if duration.is_some_and(|d| self.started.elapsed() >= d) {
            return false;
        }
        match &mut self.launched {
            Some(l) => {
                if let Some(status) = l.try_wait() {
                    self.exit_status = Some(status);
                    return false;
                }
                true
            }
            None => proc::is_running(self.pid),
        }
    }

    /// The exit status of a command we started, once it has exited.
    pub fn exit_status(&self) -> Option<i32> {
        self.exit_status
    }

    /// The line a script waits for before it starts the traced work.
    pub fn say_attached(&self, python: &Python, mode: &str) {
        eprintln!("pytrace: attached to PID {} (Python {}, {mode} mode)", self.pid, python.version);
    }

    /// Whether the target is still alive (for restoring what we changed).
    pub fn is_running(&self) -> bool {
        self.exit_status.is_none() && proc::is_running(self.pid)
    }
}

/// The eval-frame hook around a calls session (src/python/eval_hook.rs): on
/// 3.11+ in uprobe mode it is set once the probes are attached and restored
/// at the end; a guardian restores it if pytrace dies first.
pub struct HookedRelease {
    hook: Option<EvalHook>,
    guardian: Option<Guardian>,
    armed: std::cell::Cell<bool>,
}

impl HookedRelease {
    /// Forks the guardian if the hook is needed: call before any BPF object
    /// or thread exists.
    pub fn new(target: &Target, python: &Python, mode: Mode) -> Result<Self> {
        let hook = if mode == Mode::Uprobe && python.inlines_calls() { Some(EvalHook::new(target.pid, python)?) } else { None };
        let guardian = hook.as_ref().map(EvalHook::spawn_guardian).transpose()?;
        Ok(HookedRelease { hook, guardian, armed: std::cell::Cell::new(false) })
    }

    /// A command we start has no interpreter yet to set the hook in: the BPF
    /// program stops it at its first frame evaluation and `release` sets it then.
    pub fn stop_at_first_eval(&self, target: &Target) -> bool {
        self.hook.is_some() && target.started_by_us()
    }

    /// Once every probe is attached: sets the hook and lets the target run.
    pub fn release(&self, target: &mut Target) -> Result<()> {
        self.armed.set(self.hook.is_some());
        match &self.hook {
            Some(hook) if target.started_by_us() => target.release_at_first_eval(|| hook.install().map(drop)),
            Some(hook) => {
                hook.install()?;
                target.release()
            }
            None => target.release(),
        }
    }

    /// Puts the hook back (once the probes are detached), and ends the guardian.
    pub fn restore(self, target: &Target) {
        if let Some(hook) = self.hook.as_ref().filter(|_| self.armed.get()) {
            if target.is_running() {
                if let Err(e) = hook.restore() {
                    eprintln!("pytrace: warning: could not restore interp->eval_frame in PID {}: {e:#}", target.pid);
                }
            }
        }
        drop(self.guardian);
    }
}
