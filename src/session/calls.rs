//! A calls run from start to end, the one `calls`, `top --calls` and
//! `compare` share: the target found or started, its mode chosen and the
//! eval-frame hook owned (hook.rs) before any BPF object exists; the calls
//! program (and, for `compare`, the sampler beside it: a pair of plans)
//! attached by the one driver (`Live::run`, run.rs); the hook set as the
//! target is let run and watched between polls; counting stopped, the hook
//! put back, then the probes detached, on every path out, errors included.

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
    pub fn trace(self, python: &Python, opts: &CallsOptions, each: impl FnMut(&tracer::Session<'_>, Duration) -> Result<bool>) -> (CallsRun, Result<CallsData>) {
        let attached_as = self.mode.name().to_string();
        let plan = self.plan(python, opts);
        self.run(python, opts.duration, &attached_as, plan, each)
    }

    /// Counts calls with another program (`beside`, named `beside_name`)
    /// on the same poll, as a pair of plans: `beside` starts once the calls
    /// program is attached, both are attached before the target runs and
    /// detached before either is read, so they cover the same time.
    pub fn trace_beside<B: Start>(self, python: &Python, opts: &CallsOptions, beside_name: &str, beside: B) -> (CallsRun, Result<(CallsData, B::Data)>) {
        let attached_as = format!("{} and {beside_name}", self.mode.name());
        let plan = (self.plan(python, opts), beside);
        self.run(python, opts.duration, &attached_as, plan, |_, _| Ok(true))
    }

    /// The calls program's plan on this target: it owns what tells the
    /// hook's guardian of the target's children.
    fn plan<'p>(&self, python: &'p Python, opts: &CallsOptions) -> Plan<'p> {
        Plan {
            pid: self.target.pid,
            python,
            mode: self.mode,
            stop_at_first_eval: self.hook.stop_at_first_eval(&self.target),
            empty_probe: opts.empty_probe,
            count_edges: opts.count_edges,
            children: self.hook.children(),
        }
    }

    /// The lifecycle both share, around the driver (`Live::run`): the hook
    /// set as the target is let run, read back between polls, and put back
    /// as the window ends, before the probes are detached (or here, if the
    /// run failed before that): the run comes back either way (what the
    /// hook went through, the exit code), beside what it gathered or why
    /// that failed.
    fn run<P: Start>(self, python: &Python, duration: Option<Duration>, attached_as: &str, plan: P, mut each: impl FnMut(&P::Session<'_>, Duration) -> Result<bool>) -> (CallsRun, Result<P::Data>) {
        let CallsTarget { mut target, mode, hook } = self;
        let pid = target.pid;
        let live = Live::new(&mut target, python, attached_as, duration);
        let (on_hook, on_live) = (&hook, &live);
        let result = live.run(
            plan,
            |session, target| on_hook.release(target, || session.start_counting(), || session.hook_set()),
            // `move`: `each` goes with the drive, once the probes are detached.
            move |session| {
                on_hook.watch();
                each(session, on_live.elapsed())
            },
            |_, target| on_hook.put_back(target),
        );
        let elapsed = live.elapsed();
        drop(live);
        let outcome = hook.restore(&target);
        (CallsRun { pid, version: python.version.to_string(), mode, elapsed, hook: outcome, target }, result)
    }
}
