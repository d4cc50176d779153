//! `pytrace top --calls`: the live view of `pytrace calls`: exact calls per
//! second, self time and latency percentiles per function, from the calls
//! session's kernel map read every second, with the eval-frame hook owned
//! and restored as `calls` does.

use std::time::Duration;

use anyhow::Result;

use crate::report::terminal::{require_terminal, LiveScreen};
use crate::report::top::CallsTopView;
use crate::session::{CallsOptions, CallsTarget, TargetSpec};
use crate::tracing::calls as tracer;

/// Takes the target and duration alone (not `top::Options`, which holds
/// the sampler's rate): `top` calls here, and nothing here calls back.
pub fn run(spec: TargetSpec, duration: Option<Duration>) -> Result<i32> {
    require_terminal("use `pytrace calls` to write a report")?;
    let (target, python) = CallsTarget::prepare(spec, None)?;
    let mut view = CallsTopView::new(format!("pytrace top --calls: PID {}, Python {}", target.pid(), python.version), target.cwd());
    // Moved into the round: it goes, and the terminal is put back, before
    // the hook is restored, so what restoring says is readable.
    let mut screen = LiveScreen::default();
    let round = move |session: &tracer::Session, elapsed| {
        screen.round(&mut view, |view| {
            view.update(session.functions_so_far()?, elapsed);
            view.lost = session.lost_so_far()?;
            Ok(())
        })
    };
    let (run, counted) = target.trace(&python, &CallsOptions { duration, ..Default::default() }, round);
    for note in run.hook.notes.iter().chain(&run.hook.incomplete) {
        crate::console::err(&format!("pytrace: {note}\n"));
    }
    counted?;
    Ok(run.exit_code())
}
