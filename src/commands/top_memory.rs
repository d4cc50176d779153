//! `pytrace top --memory`: the live view of `pytrace memory`: per Python
//! stack, the bytes live now and grown since the start, from the memory
//! session's rows read every second; the run ends as `memory`'s does.

use std::time::Duration;

use anyhow::Result;

use crate::report::terminal::{require_terminal, LiveScreen, REDRAW_EVERY};
use crate::report::top_memory::MemoryTopView;
use crate::session::{MemoryTarget, TargetSpec};
use crate::tracing::memory::Options as MemoryOptions;

/// Takes the target, duration and byte sampling alone (not
/// `top::Options`, which holds the sampler's rate): `top` calls here, and
/// nothing here calls back.
pub fn run(spec: TargetSpec, duration: Option<Duration>, every: u64) -> Result<i32> {
    require_terminal("use `pytrace memory` to write a report")?;
    // The live view read as often as the screen is drawn.
    let opts = MemoryOptions { every, interval: REDRAW_EVERY, allocations: false };
    let (target, python) = MemoryTarget::prepare(spec, &opts)?;
    let mut view = MemoryTopView::new(format!("pytrace top --memory: PID {}, Python {}", target.pid(), python.version), target.cwd());
    // Moved into the round: it goes, and the terminal is put back, as the
    // probes go, before a command we started is waited for or stopped.
    let mut screen = LiveScreen::default();
    let round = move |read_rows: &dyn Fn() -> Result<_>, elapsed| {
        screen.round(&mut view, |view| {
            view.update(read_rows()?, elapsed);
            Ok(())
        })
    };
    let run = target.watch(&python, duration, opts, round)?;
    Ok(run.exit_code())
}
