//! A calls run from start to end, the one `calls`, `top --calls` and
//! `compare` share: the target found or started, its mode chosen and the
//! eval-frame hook owned (hook.rs) before any BPF object exists; the calls
//! program (and, for `compare`, the sampler beside it) attached; the hook
//! set as the target is let run and watched between polls; counting
//! stopped, the hook put back, then the probes detached, on every path
//! out, errors included.

use std::mem::MaybeUninit;
use std::time::Duration;

use anyhow::Result;

use super::hook::HookedRelease;
use super::{Live, Target, TargetSpec};
use crate::model::functions::CallsData;
use crate::model::hook::HookOutcome;
use crate::python::Python;
use crate::report::PythonInfo;
use crate::tracing::calls::{self as tracer, Mode, Plan};
use crate::tracing::{Start, Tracing};

/// What a calls run counts beyond calls, and for how long.
#[derive(Default)]
pub struct CallsOptions {
    pub duration: Option<Duration>,
    /// Attach programs that return at once (scripts/bench.sh's floor).
    pub empty_probe: bool,
    /// Count caller->callee edges too (`calls --pstats`).
    pub count_edges: bool,
}

/// A target made ready for a calls run: found or started (and held), its
/// mode chosen, and the eval-frame hook owned, with its guardian forked.
pub struct CallsTarget {
    target: Target,
    mode: Mode,
    hook: HookedRelease,
}

/// What a calls run was (what it gathered comes beside it), and what
/// happened to the hook.
pub struct CallsRun {
    pub pid: u32,
    pub version: String,
    /// How the calls were seen.
    pub mode: Mode,
    pub elapsed: Duration,
    pub hook: HookOutcome,
    target: Target,
}

impl CallsRun {
    /// Its Python and mode, as reports name them.
    pub fn python_info(&self) -> PythonInfo {
        PythonInfo { version: self.version.clone(), mode: self.mode.name().into() }
    }

    /// The target's CPU time while traced (`Target::cpu_ns`).
    pub fn cpu_ns(&self) -> Option<u64> {
        self.target.cpu_ns()
    }

    /// pytrace's exit code (`Target::exit_code`).
    pub fn exit_code(&self) -> i32 {
        self.target.exit_code()
    }
}

impl CallsTarget {
    /// Finds or starts the target and owns its hook, in `requested` mode or
    /// the one `calls` picks for its Python. Call before any BPF object or
    /// thread exists (the guardian is forked here).
    pub fn prepare(spec: TargetSpec, requested: Option<Mode>) -> Result<(Self, Python)> {
        let (target, python) = Target::prepare(spec)?;
        let (mode, _why) = tracer::choose_mode(&python, requested)?;
        // 3.11+ inlines calls unless the eval-frame hook is set (eval_hook.rs).
        let hook = HookedRelease::new(&target, &python, mode)?;
        Ok((CallsTarget { target, mode, hook }, python))
    }

    pub fn pid(&self) -> u32 {
        self.target.pid
    }

    /// The target's working directory (`Target::cwd`).
    pub fn cwd(&self) -> Option<String> {
        self.target.cwd()
    }

    /// Counts calls until the target exits, the duration runs out, a stop
    /// signal comes or `each` (given the session and the time run so far,
    /// between polls) says stop. `each` is dropped once the probes are
    /// detached; the hook is put back before that, so a warning restoring
    /// prints can land on a live screen `each` owns (rare: the target's
    /// memory refused the write).
    pub fn trace(self, python: &Python, opts: &CallsOptions, mut each: impl FnMut(&tracer::Session<'_, '_>, Duration) -> Result<bool>) -> (CallsRun, Result<CallsData>) {
        let attached_as = self.mode.name().to_string();
        // `move`: the closure, and `each` with it, is used up by the drive.
        self.run(python, opts, &attached_as, move |calls, hooked| hooked.drive(calls, |session| each(session, hooked.live.elapsed())))
    }

    /// Counts calls with another program (`beside`, named `beside_name`,
    /// started once the calls program is attached, in an object held here)
    /// on the same poll: both are attached before the target runs and
    /// detached before either is read, so they cover the same time.
    pub fn trace_beside<B: Start>(self, python: &Python, opts: &CallsOptions, beside_name: &str, beside: B) -> (CallsRun, Result<(CallsData, B::Data)>) {
        let attached_as = format!("{} and {beside_name}", self.mode.name());
        self.run(python, opts, &attached_as, |calls, hooked| {
            let mut object = MaybeUninit::uninit();
            let beside = beside.start(&mut object)?;
            hooked.drive((calls, beside), |_| Ok(true))
        })
    }

    /// The lifecycle both share; `drive` runs the started calls session.
    /// The hook is put back as the window ends, before the probes are
    /// detached (or here, if the run failed before that): the run comes back
    /// either way (what the hook went through, the exit code), beside what
    /// it gathered or why that failed.
    fn run<D>(self, python: &Python, opts: &CallsOptions, attached_as: &str, drive: impl FnOnce(tracer::Session<'_, '_>, &Hooked<'_, '_>) -> Result<D>) -> (CallsRun, Result<D>) {
        let CallsTarget { mut target, mode, hook } = self;
        let pid = target.pid;
        let on_child = |child| hook.watch_child(child);
        let on_children_map = |map: std::os::fd::BorrowedFd<'_>| hook.share_children_map(map);
        let stop_at_first_eval = hook.stop_at_first_eval(&target);
        let plan = Plan { pid, python, mode, stop_at_first_eval, empty_probe: opts.empty_probe, count_edges: opts.count_edges, on_child: &on_child, on_children_map: &on_children_map };
        let live = Live::new(&mut target, python, attached_as, opts.duration);
        let mut object = MaybeUninit::uninit();
        let result = tracer::Session::start(&mut object, &plan).and_then(|calls| drive(calls, &Hooked { live: &live, hook: &hook }));
        let elapsed = live.elapsed();
        drop(live);
        let outcome = hook.restore(&target);
        (CallsRun { pid, version: python.version.to_string(), mode, elapsed, hook: outcome, target }, result)
    }
}

/// A run's poll loop with the hook around it: set as the target is let
/// run, read back between polls.
struct Hooked<'l, 't> {
    live: &'l Live<'t>,
    hook: &'l HookedRelease,
}

impl Hooked<'_, '_> {
    /// The hook is put back as the window ends, before the probes go.
    fn drive<T: Tracing>(&self, session: T, mut each: impl FnMut(&T) -> Result<bool>) -> Result<T::Data> {
        self.live.drive_and_end(
            session,
            |session, target| self.hook.release(target, || session.start_counting()),
            |session| {
                self.hook.watch();
                each(session)
            },
            |_, target| self.hook.put_back(target),
        )
    }
}
