//! Every run, through one driver: the run made (`Live`), the session
//! started in the libbpf objects it holds and driven (driver.rs) until the
//! target exits, the duration runs out or a stop signal comes, then the
//! run ended (a command we started waited for or stopped) before anything
//! is reported. `Target::trace` is the run on one target that gil,
//! imports, gc, sample and top share; the calls run (calls.rs) and `sample
//! --all` (sampling.rs) make their `Live` themselves. What comes back is
//! what the run was, beside what it gathered.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{driver, install_signal_handlers, stop_requested, Target};
use crate::python::Python;
use crate::report::PythonInfo;
use crate::tracing::{Objects, Start};

/// What a run on one target was (what it gathered comes beside it).
pub struct Run {
    pub pid: u32,
    pub version: String,
    /// How the target was seen, as the report names it.
    pub mode: String,
    /// The traced window (`Target::elapsed`).
    pub elapsed: Duration,
    target: Target,
}

impl Run {
    /// Its Python and mode, as reports name them.
    pub fn python_info(&self) -> PythonInfo {
        PythonInfo { version: self.version.clone(), mode: self.mode.clone() }
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

impl Target {
    /// Runs `plan`'s session on this target, whose Python is `python`,
    /// seen in `mode` ("attached to PID N (Python V, MODE mode)"): once it
    /// is attached, `release` lets the target run (`Target::release`, or
    /// what the session needs first); `each` (given the session and the
    /// time run so far, between polls) may end the run early. `each` is
    /// dropped once the probes are detached, before the run ends.
    pub(super) fn trace<P: Start>(
        mut self,
        python: &Python,
        mode: &str,
        duration: Option<Duration>,
        plan: P,
        release: impl FnOnce(&P::Session<'_>, &mut Target) -> Result<()>,
        mut each: impl FnMut(&P::Session<'_>, Duration) -> Result<bool>,
    ) -> Result<(Run, P::Data)> {
        let pid = self.pid;
        let live = Live::new(&mut self, python, mode, duration);
        // `move`: `each` goes with the drive, before the run ends.
        let on_live = &live;
        let data = live.run(plan, release, move |session| each(session, on_live.elapsed()), |_, _| {})?;
        let elapsed = live.elapsed();
        drop(live);
        Ok((Run { pid, version: python.version.to_string(), mode: mode.into(), elapsed, target: self }, data))
    }
}

/// One run of a tracing session on its target, through the session driver
/// (driver.rs): let the target run once the probes are attached (and say
/// so), then poll until the target exits, the duration runs out or a stop
/// signal comes. `everywhere` is the run with no one target (`sample
/// --all`). One per run, made only inside `session/` (`Target::trace`,
/// the calls run, `sample --all`): no command sees it.
pub(super) struct Live<'t> {
    target: Option<RefCell<&'t mut Target>>,
    /// What the line scripts wait for says after "attached to PID N".
    attached_as: String,
    duration: Option<Duration>,
    /// When an `everywhere` run began: once attached (and every Python
    /// found at start located), so that its window holds no start-up time
    /// in which nothing was sampled.
    started: Cell<Instant>,
    /// When the run was made (its attach is timed from here).
    made: Instant,
    /// When an `everywhere` run stopped.
    stopped: Cell<Option<Instant>>,
}

impl Drop for Live<'_> {
    /// The probes are detached by now: a command we started that still
    /// runs is waited for or stopped (`Target::end_command`).
    fn drop(&mut self) {
        if let Some(target) = &self.target {
            target.borrow_mut().end_command();
        }
    }
}

impl<'t> Live<'t> {
    /// A run on `target`, whose Python is `python`, seen in `mode`. Ctrl-C
    /// and SIGTERM end it from here on.
    pub(super) fn new(target: &'t mut Target, python: &Python, mode: &str, duration: Option<Duration>) -> Self {
        install_signal_handlers();
        let attached_as = format!("(Python {}, {mode} mode)", python.version);
        Live { target: Some(RefCell::new(target)), attached_as, duration, started: Cell::new(Instant::now()), made: Instant::now(), stopped: Default::default() }
    }

    /// A run on every CPython on the machine: it ends at the duration or a
    /// stop signal.
    pub(super) fn everywhere(duration: Option<Duration>) -> Self {
        install_signal_handlers();
        Live { target: None, attached_as: String::new(), duration, started: Cell::new(Instant::now()), made: Instant::now(), stopped: Default::default() }
    }

    /// Starts `plan`'s session in libbpf objects held here, for the whole
    /// drive, then drives it (driver.rs): once it is attached, lets the
    /// target run with `release` (`Target::release`, or what the session
    /// needs first) and says so, then polls while `each` (given the
    /// session, between polls) and `keep_going` say go on; once the traced
    /// window has ended, runs `ending` (given the session and the target:
    /// put back what the run changed in it) before the probes are detached.
    /// The start-and-drive sequence of every run, so that no caller holds a
    /// BPF object.
    pub(super) fn run<P: Start>(
        &self,
        plan: P,
        release: impl FnOnce(&P::Session<'_>, &mut Target) -> Result<()>,
        mut each: impl FnMut(&P::Session<'_>) -> Result<bool>,
        ending: impl FnOnce(&P::Session<'_>, &Target),
    ) -> Result<P::Data> {
        let mut objects = P::Objects::empty();
        let session = plan.start(&mut objects)?;
        driver::drive(
            session,
            |session| self.attached(|target| release(session, target)),
            |session| Ok(each(session)? && self.keep_going()),
            |session| {
                self.stop_clock();
                if let Some(target) = &self.target {
                    ending(session, &target.borrow());
                }
            },
        )
    }

    fn stop_clock(&self) {
        match &self.target {
            Some(target) => target.borrow_mut().stop_clock(),
            None => {
                self.stopped.set(Some(self.stopped.get().unwrap_or_else(Instant::now)));
            }
        }
    }

    fn attached(&self, release: impl FnOnce(&mut Target) -> Result<()>) -> Result<()> {
        let took = self.made.elapsed();
        // After the line scripts wait for, which stays the first.
        let say_took = || {
            if took > crate::tracing::SAY_SLOW_STEP {
                crate::console::err(&format!("pytrace: attaching took {:.1} s (not part of the traced time)\n", took.as_secs_f64()));
            }
        };
        let Some(target) = &self.target else {
            self.started.set(Instant::now());
            crate::console::err("pytrace: sampling every CPython process\n");
            say_took();
            return Ok(());
        };
        let mut target = target.borrow_mut();
        release(&mut target)?;
        // The line a script waits for before it starts the traced work.
        crate::console::err(&format!("pytrace: attached to PID {} {}\n", target.pid, self.attached_as));
        say_took();
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
            None => self.stopped.get().unwrap_or_else(Instant::now).saturating_duration_since(self.started.get()),
        }
    }
}
