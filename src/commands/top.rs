//! `pytrace top`: a live view of where the target spends CPU time, like
//! `py-spy top` and Linux `top`: the sampler runs as for `sample`, and
//! every second the profile so far is redrawn in the terminal.

use std::time::Duration;

use anyhow::Result;

use crate::python::reading::asyncio_tasks;
use crate::report::terminal::{require_terminal, LiveScreen};
use crate::report::top::TopView;
use crate::session::{self, Target, TargetSpec};
use crate::tracing::sample::{Options as SampleOptions, Session};

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub hz: u64,
    /// Exact counts from the calls session instead of samples.
    pub calls: bool,
    /// Samples under their asyncio task's root frame (3.14+).
    pub async_tasks: bool,
}

pub fn run(opts: Options) -> Result<i32> {
    if opts.calls {
        return super::top_calls::run(opts.target, opts.duration);
    }
    require_terminal("use `pytrace sample` to write a profile")?;
    let (target, python) = Target::prepare(opts.target)?;
    if let Some(refusal) = opts.async_tasks.then(|| asyncio_tasks::unsupported(&python, "top --async")).flatten() {
        anyhow::bail!(refusal);
    }
    let mut view = TopView::new(format!("pytrace top: PID {}, Python {}", target.pid, python.version), opts.hz, target.cwd());
    // Moved into the round: the terminal is put back as the probes go,
    // before a command we started is waited for or stopped.
    let mut screen = LiveScreen::default();
    let round = move |session: &Session, elapsed| {
        screen.round(&mut view, |view| {
            view.update_from(&session.samples_so_far(), session.total(), elapsed);
            Ok(())
        })
    };
    let sampling = SampleOptions { hz: opts.hz, kernel: false, idle: false, native: false, threads: false, gil: false, states: false, async_tasks: opts.async_tasks };
    let (run, _) = session::sample_target(target, &python, opts.duration, &sampling, round)?;
    Ok(run.exit_code())
}
