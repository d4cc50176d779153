//! What every tracing subcommand does around its BPF program: check that
//! tracing is possible at all, find or start the target (`launch`), run
//! the session's poll loop (`driver`, through `Live`), and decide when to
//! stop (target exit, --duration, Ctrl-C or SIGTERM). Whole runs, from the
//! target to what was gathered, so that a command only wires its options
//! to one and its result to a report: `calls` (the calls program inside
//! the eval-frame hook's lifecycle, `hook`; shared by `calls`, `top
//! --calls` and `compare`), `compare` (calls and the sampler at once),
//! `sampling` (one target or every CPython), `gc`, and `snapshot` (one
//! read of every thread, for `dump`).

mod calls;
mod compare;
pub mod driver;
mod gc;
mod hook;
mod launch;
mod sampling;
mod snapshot;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::python::{thread_names, Python};
use launch::Launched;
use crate::process::proc;
use crate::tracing::Tracing;

pub use calls::{CallsOptions, CallsRun, CallsTarget};
pub use compare::trace_and_sample;
pub use gc::trace_gc;
pub use sampling::sample;
pub use snapshot::snapshot;

pub enum TargetSpec {
    Pid(u32),
    Command(Vec<String>),
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

/// How long a command pytrace started may take to exit after Ctrl-C (which
/// reaches it too, through the terminal's process group) before pytrace
/// stops waiting for its exit status. A second Ctrl-C stops waiting at once.
const COMMAND_EXIT_GRACE: Duration = Duration::from_secs(10);

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
    /// When a stop was asked for while a command we started still ran.
    stop_seen: Option<Instant>,
    /// The target's CPU time when it was let run (see `cpu_ns`).
    cpu_at_start_ns: Option<u64>,
    cpu_at_end_ns: Option<u64>,
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
        Ok((Self { pid, launched, exit_status: None, started: Instant::now(), stop_seen: None, cpu_at_start_ns: None, cpu_at_end_ns: None }, python))
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
        self.cpu_at_start_ns = proc::cpu_time_ns(self.pid);
        match &mut self.launched {
            Some(l) => l.resume_until_stop(at_stop),
            None => at_stop(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
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
    /// (Ctrl-C) waits, still tracing, for the command to exit (the terminal
    /// sent it the signal too), so that pytrace returns its exit status;
    /// for at most COMMAND_EXIT_GRACE, or until a second stop signal.
    pub fn keep_going(&mut self, duration: Option<Duration>) -> bool {
        let going = self.still_going(duration);
        if !going && self.cpu_at_end_ns.is_none() {
            self.cpu_at_end_ns = match &self.launched {
                Some(l) if self.exit_status.is_some() => l.cpu_at_exit_ns,
                _ if proc::is_running(self.pid) => proc::cpu_time_ns(self.pid),
                _ => None,
            };
        }
        going
    }

    fn still_going(&mut self, duration: Option<Duration>) -> bool {
        if STOP_REQUESTED.load(Ordering::SeqCst) {
            let Some(l) = &mut self.launched else { return false };
            if let Some(status) = l.try_wait() {
                self.exit_status = Some(status);
                return false;
            }
            let since = *self.stop_seen.get_or_insert_with(Instant::now);
            return since.elapsed() < COMMAND_EXIT_GRACE && STOPS.load(Ordering::SeqCst) < 2;
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

    /// pytrace's own exit code: the command's status if it exited (130
    /// when Ctrl-C killed it, as a shell says); a command still running
    /// after a stop signal gets the shell's code for that signal, and a
    /// sentence; otherwise 0.
    pub fn exit_code(&self) -> i32 {
        if let Some(status) = self.exit_status {
            return status;
        }
        let signal = STOP_SIGNAL.load(Ordering::SeqCst);
        if self.launched.is_some() && signal != 0 {
            eprintln!("pytrace: the command (PID {}) had not exited {} s after the stop signal; it was left running", self.pid, COMMAND_EXIT_GRACE.as_secs());
            return 128 + signal;
        }
        0
    }

    /// Whether the target is still alive (for restoring what we changed).
    pub fn is_running(&self) -> bool {
        self.exit_status.is_none() && proc::is_running(self.pid)
    }
}

/// One run of a tracing session on its target, through the session driver
/// (driver.rs): let the target run once the probes are attached (and say
/// so), then poll until the target exits, the duration runs out or a stop
/// signal comes. `everywhere` is the run with no one target (`sample
/// --all`). One per run, so a command only wires its session to this.
pub struct Live<'t> {
    target: Option<RefCell<&'t mut Target>>,
    /// What the line scripts wait for says after "attached to PID N".
    attached_as: String,
    duration: Option<Duration>,
    /// When an `everywhere` run began: once attached (and every Python
    /// found at start located), so that its window holds no start-up time
    /// in which nothing was sampled.
    started: Cell<Instant>,
}

impl<'t> Live<'t> {
    /// A run on `target`, whose Python is `python`, seen in `mode`. Ctrl-C
    /// and SIGTERM end it from here on.
    pub fn new(target: &'t mut Target, python: &Python, mode: &str, duration: Option<Duration>) -> Self {
        install_signal_handlers();
        let attached_as = format!("(Python {}, {mode} mode)", python.version);
        Live { target: Some(RefCell::new(target)), attached_as, duration, started: Cell::new(Instant::now()) }
    }

    /// A run on every CPython on the machine: it ends at the duration or a
    /// stop signal.
    pub fn everywhere(duration: Option<Duration>) -> Self {
        install_signal_handlers();
        Live { target: None, attached_as: String::new(), duration, started: Cell::new(Instant::now()) }
    }

    /// Runs `session` (driver.rs): once it is attached, lets the target
    /// run with `release` (`Target::release`, or what the session needs
    /// first), says so, then polls while `each` (given the session, between
    /// polls) and `keep_going` say go on.
    pub fn drive<T: Tracing>(&self, session: T, release: impl FnOnce(&T, &mut Target) -> Result<()>, mut each: impl FnMut(&T) -> Result<bool>) -> Result<T::Data> {
        driver::drive(session, |session| self.attached(|target| release(session, target)), |session| Ok(each(session)? && self.keep_going()))
    }

    fn attached(&self, release: impl FnOnce(&mut Target) -> Result<()>) -> Result<()> {
        let Some(target) = &self.target else {
            self.started.set(Instant::now());
            eprintln!("pytrace: sampling every CPython process");
            return Ok(());
        };
        let mut target = target.borrow_mut();
        release(&mut target)?;
        // The line a script waits for before it starts the traced work.
        eprintln!("pytrace: attached to PID {} {}", target.pid, self.attached_as);
        Ok(())
    }

    /// See `Target::keep_going`.
    pub fn keep_going(&self) -> bool {
        match &self.target {
            Some(target) => target.borrow_mut().keep_going(self.duration),
            None => !stop_requested() && self.duration.is_none_or(|d| self.started.get().elapsed() < d),
        }
    }

    /// How long the target has run since it was let go.
    pub fn elapsed(&self) -> Duration {
        match &self.target {
            Some(target) => target.borrow().elapsed(),
            None => self.started.get().elapsed(),
        }
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
        Progress { tty: std::io::stderr().is_terminal(), threads_of, names: HashMap::new(), last: Instant::now() }
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
            eprint!("\rpytrace sample: {samples} samples, {:.1} s ", elapsed.as_secs_f64());
            let _ = std::io::stderr().flush();
        }
    }

    pub fn finish(mut self) -> Option<HashMap<u32, String>> {
        if self.tty {
            eprintln!();
        }
        let (pid, python) = self.threads_of?;
        thread_names::merge(pid, python, &mut self.names);
        Some(self.names)
    }
}
