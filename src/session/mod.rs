//! What every tracing subcommand does around its BPF program: check that
//! tracing is possible at all, find or start the target (`launch`), run
//! the session's poll loop (`driver`, through `Live`, run.rs, which holds
//! the session's libbpf objects: `Live::run`, the one driver of every
//! run), and decide when to stop (target exit, --duration, Ctrl-C or
//! SIGTERM). Whole runs, from the target to what was gathered, so that a
//! command only wires its options to one and its result to a report:
//! `run` (`Live`, and `Target::trace`, the run on one target gil,
//! imports, gc, sample and top share), `gil`, `imports`, `gc`, `sampling`
//! (one target or every CPython), `calls` (the calls program inside the
//! eval-frame hook's lifecycle, `hook`; shared by `calls`, `top --calls`
//! and `compare`), `compare` (calls and the sampler at once, a pair of
//! plans), and `snapshot` (one read of every thread, for `dump`).

mod calls;
mod compare;
pub mod driver;
mod gc;
mod gil;
mod hook;
mod imports;
mod launch;
mod run;
mod sampling;
mod snapshot;
mod memory;
mod heap;
pub mod agent;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::python::reading::thread_names;
use crate::python::Python;
use launch::Launched;
use run::Live;
use crate::process::proc;

pub use calls::{CallsOptions, CallsRun, CallsTarget};
pub use compare::trace_and_sample;
pub use gc::trace_gc;
pub use gil::trace_gil;
pub use imports::trace_imports;
pub use run::Run;
pub use sampling::{sample, sample_target};
pub use snapshot::snapshot;
pub use memory::{trace_memory, MemoryTarget};
pub use heap::{heap_census, HeapOptions};

pub use launch::Command as LaunchCommand;

pub enum TargetSpec {
    Pid(u32),
    Command(LaunchCommand),
}

static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);
/// How many stop signals came, and the last one.
static STOPS: AtomicU32 = AtomicU32::new(0);
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn request_stop(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
    STOPS.fetch_add(1, Ordering::SeqCst);
    STOP_REQUESTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C, SIGTERM, SIGHUP (a closed terminal or ssh session), SIGQUIT
/// and SIGUSR1/2 end tracing and still write the report (their default is
/// to kill pytrace, losing it). No SA_RESTART, so a blocked poll returns
/// at once.
pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to atomics.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = request_stop as *const () as usize;
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2] {
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
    let kernel = crate::kernel::Kernel::get();
    if let Some(why) = &kernel.btf_unreadable {
        bail!("could not read this kernel's BTF ({btf}): {why}");
    }
    kernel.require(crate::kernel::Feature::Ringbuf, "tracing")?;
    if !has_tracing_privileges() {
        bail!("{NEEDS_PRIVILEGES}");
    }
    Ok(())
}

/// What tracing asks of whoever runs pytrace, as it is said when missing.
pub const NEEDS_PRIVILEGES: &str = "tracing needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE): run pytrace with sudo";

pub fn has_tracing_privileges() -> bool {
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
    /// Whether `pid` still runs, asked at every check.
    exit_watch: proc::ExitWatch,
    launched: Option<Launched>,
    /// The exit status of the command we started.
    exit_status: Option<i32>,
    started: Instant,
    /// A command's --duration (which bounded the wait for its CPython too).
    duration: Option<Duration>,
    /// When the run must be done: its release plus --duration.
    deadline: Option<Instant>,
    /// When a stop was asked for while a command we started still ran (its
    /// group was sent SIGINT then).
    stop_seen: Option<Instant>,
    /// The CPython's CPU time when last seen running.
    cpu_last_ns: Option<u64>,
    /// When tracing stopped: the traced window is `started` to this, the
    /// detach after it excluded.
    stopped: Option<Instant>,
    /// The target's CPU time when it was let run (see `cpu_ns`).
    cpu_at_start_ns: Option<u64>,
    cpu_at_end_ns: Option<u64>,
}

impl Target {
    /// Finds the Python in a running process, or starts the command and
    /// holds it before its first Python instruction.
    pub fn prepare(spec: TargetSpec) -> Result<(Self, Python)> {
        preflight()?;
        // From here a stop signal ends the run cleanly, the wait for a
        // command's CPython included.
        install_signal_handlers();
        let (pid, python, launched, duration) = match spec {
            TargetSpec::Pid(pid) => (pid, Python::from_pid(pid)?, None, None),
            TargetSpec::Command(command) => {
                let (launched, python) = launch::launch(&command)?;
                (launched.pid, python, Some(launched), command.duration)
            }
        };
        let target = Self { pid, exit_watch: proc::ExitWatch::new(pid), launched, exit_status: None, started: Instant::now(), duration, deadline: None, stopped: None, stop_seen: None, cpu_last_ns: None, cpu_at_start_ns: None, cpu_at_end_ns: None };
        Ok((target, python))
    }

    /// Its working directory: the stack formats show its own files
    /// relative to it.
    pub fn cwd(&self) -> Option<String> {
        std::fs::read_link(format!("/proc/{}/cwd", self.pid)).ok().and_then(|p| p.to_str().map(str::to_string))
    }

    pub fn started_by_us(&self) -> bool {
        self.launched.is_some()
    }

    /// Lets a command we started run, once every probe is attached.
    pub fn release(&mut self) -> Result<()> {
        self.started = Instant::now();
        self.deadline = self.duration.map(|d| self.started + d);
        self.cpu_at_start_ns = proc::cpu_time_ns(self.pid);
        if let Some(l) = &mut self.launched {
            l.resume()?;
        }
        Ok(())
    }

    /// Lets a command we started run until its first frame evaluation,
    /// where the BPF program stops it; runs `at_stop`, then lets it go.
    pub fn release_at_first_eval(&mut self, at_stop: impl FnOnce() -> Result<()>) -> Result<()> {
        self.started = Instant::now();
        self.deadline = self.duration.map(|d| self.started + d);
        self.cpu_at_start_ns = proc::cpu_time_ns(self.pid);
        match &mut self.launched {
            Some(l) => l.resume_until_stop(at_stop),
            None => at_stop(),
        }
    }

    /// The traced window: from when the target was let run to when
    /// tracing stopped (or now, while it runs).
    pub fn elapsed(&self) -> Duration {
        self.stopped.unwrap_or_else(Instant::now).saturating_duration_since(self.started)
    }

    /// Tracing ends now, if it had not already.
    fn stop_clock(&mut self) {
        self.stopped.get_or_insert_with(Instant::now);
    }

    /// The CPU time the target used from when it was let run to when
    /// tracing ended, from the kernel's accounting: read then if it ran, or
    /// from its reaping if we started it. None when that cannot be known (a
    /// process we did not start exited, and its CPU time went with it):
    /// callers then estimate.
    pub fn cpu_ns(&self) -> Option<u64> {
        Some(self.cpu_at_end_ns?.saturating_sub(self.cpu_at_start_ns?))
    }

    /// False once tracing should end: the target exited, the duration ran
    /// out, or a stop was requested. With a command we started, a stop
    /// (Ctrl-C) sends its process group SIGINT and waits, still tracing its
    /// shutdown, for its CPython to exit; for at most STOP_STEP, or until a
    /// second stop signal.
    pub fn keep_going(&mut self, duration: Option<Duration>) -> bool {
        let going = self.still_going(duration);
        if !going {
            self.stop_clock();
        }
        if !going && self.cpu_at_end_ns.is_none() {
            self.cpu_at_end_ns = match &self.launched {
                Some(l) if self.exit_status.is_some() && l.pid == l.command_pid => l.cpu_at_exit_ns,
                _ if self.exit_watch.running() => proc::cpu_time_ns(self.pid),
                // A CPython the command started, gone: last seen running.
                Some(_) => self.cpu_last_ns,
                None => None,
            };
        }
        going
    }

    fn still_going(&mut self, duration: Option<Duration>) -> bool {
        let Some(l) = &mut self.launched else {
            return !STOP_REQUESTED.load(Ordering::SeqCst) && duration.is_none_or(|d| self.started.elapsed() < d) && self.exit_watch.running();
        };
        let python_running = l.python_running();
        if python_running && l.pid != l.command_pid {
            self.cpu_last_ns = proc::cpu_time_ns(l.pid).or(self.cpu_last_ns);
        }
        if let Some(status) = l.try_wait() {
            self.exit_status = Some(status);
        }
        if !python_running {
            return false;
        }
        if STOP_REQUESTED.load(Ordering::SeqCst) {
            if l.keep_running() {
                return false;
            }
            let since = *self.stop_seen.get_or_insert_with(|| {
                l.signal_group(libc::SIGINT);
                Instant::now()
            });
            return since.elapsed() < launch::STOP_STEP && STOPS.load(Ordering::SeqCst) < 2;
        }
        duration.is_none_or(|d| self.started.elapsed() < d)
    }

    /// Once tracing has ended, a command we started that still runs: one
    /// whose CPython exited is waited for (until the deadline or a stop
    /// signal); otherwise, or past that, it is stopped (`Launched::stop`),
    /// unless --keep-running.
    fn end_command(&mut self) {
        let Some(l) = &mut self.launched else { return };
        if self.exit_status.is_some() {
            return;
        }
        let mut status = None;
        if !STOP_REQUESTED.load(Ordering::SeqCst) && !l.python_running() {
            status = l.wait_until(self.deadline);
        }
        self.exit_status = status.or_else(|| l.stop(self.stop_seen.is_some()));
    }

    /// pytrace's own exit code: the command's status if it exited (130
    /// when SIGINT ended it, as a shell says); a command left running
    /// (--keep-running) after a stop signal gets the shell's code for that
    /// signal, and a sentence; otherwise 0.
    pub fn exit_code(&self) -> i32 {
        if let Some(status) = self.exit_status {
            return status;
        }
        let Some(l) = &self.launched else { return 0 };
        crate::console::err(&format!("pytrace: the command (PID {}) was left running (--keep-running)\n", l.command_pid));
        match STOP_SIGNAL.load(Ordering::SeqCst) {
            0 => 0,
            signal => 128 + signal,
        }
    }

    /// Whether the target is still alive (for restoring what we changed).
    pub fn is_running(&self) -> bool {
        self.exit_watch.running()
    }
}

/// A sample run's live progress line (on a terminal), and the target's
/// thread names for --threads (Python's where they can be read, else the
/// kernel's), read while the threads still exist.
pub struct Progress<'p> {
    tty: bool,
    threads_of: Option<(u32, &'p Python)>,
    names: HashMap<u32, String>,
    last: Instant,
}

impl<'p> Progress<'p> {
    pub fn new(threads_of: Option<(u32, &'p Python)>) -> Self {
        #[allow(clippy::disallowed_methods)]
        let tty = std::io::stderr().is_terminal();
        Progress { tty, threads_of, names: HashMap::new(), last: Instant::now() }
    }

    pub fn tick(&mut self, samples: u64, elapsed: Duration) {
        if self.last.elapsed() < Duration::from_millis(500) {
            return;
        }
        self.last = Instant::now();
        if let Some((pid, python)) = self.threads_of {
            thread_names::merge(pid, python, &mut self.names);
        }
        if self.tty {
            crate::console::err_rewind_line();
            crate::console::err(&format!("pytrace sample: {samples} samples, {:.1} s ", elapsed.as_secs_f64()));
        }
    }

    pub fn finish(mut self) -> Option<HashMap<u32, String>> {
        if self.tty {
            crate::console::err("\n");
        }
        let (pid, python) = self.threads_of?;
        thread_names::merge(pid, python, &mut self.names);
        Some(self.names)
    }
}
