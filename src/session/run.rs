//! The run on one target that gil, imports, gc, sample and top share:
//! the run made (`Live`), the session started in the object it holds and
//! driven until the target exits, the duration runs out or a stop signal
//! comes, then the run ended (a command we started waited for or stopped)
//! before anything is reported. What comes back is what the run was, beside
//! what it gathered.

use std::time::Duration;

use anyhow::Result;

use super::{Live, Target};
use crate::python::Python;
use crate::report::PythonInfo;
use crate::tracing::Start;

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
        let data = live.run(plan, release, move |session| each(session, on_live.elapsed()))?;
        let elapsed = live.elapsed();
        drop(live);
        Ok((Run { pid, version: python.version.to_string(), mode: mode.into(), elapsed, target: self }, data))
    }
}
