//! `pytrace top --calls`: the live view of `pytrace calls`: exact calls per
//! second, self time and latency percentiles per function, from the calls
//! session's kernel map read every second, with the eval-frame hook owned
//! and restored as `calls` does.

use std::mem::MaybeUninit;

use anyhow::Result;

use super::top::Options;
use crate::report::terminal::{require_terminal, LiveScreen};
use crate::report::top::CallsTopView;
use crate::session::{HookedRelease, Live, Target};
use crate::tracing::calls::{self as tracer, Plan};

pub fn run(opts: Options) -> Result<i32> {
    require_terminal("use `pytrace calls` to write a report")?;
    let (mut target, python) = Target::prepare(opts.target)?;
    let (mode, _why) = tracer::choose_mode(&python, None)?;
    // 3.11+ inlines calls unless the eval-frame hook is set (eval_hook.rs).
    let hook = HookedRelease::new(&target, &python, mode)?;
    let pid = target.pid;
    let mut view = CallsTopView::new(format!("pytrace top --calls: PID {pid}, Python {}", python.version), target.cwd());
    let on_child = |child| hook.watch_child(child);
    let plan = Plan { pid, python: &python, mode, stop_at_first_eval: hook.stop_at_first_eval(&target), empty_probe: false, count_edges: false, on_child: &on_child };
    let live = Live::new(&mut target, &python, mode.name(), opts.duration);
    let mut screen = LiveScreen::default();
    let mut object = MaybeUninit::uninit();
    let result = tracer::Session::start(&mut object, &plan).and_then(|session| {
        live.drive(session, |_, target| hook.release(target), |session| {
            hook.watch();
            screen.round(&mut view, |view| {
                view.update(session.functions_so_far()?, live.elapsed());
                view.lost = session.lost_so_far()?;
                Ok(())
            })
        })
    });
    drop(live);
    // The terminal first, so what restoring the hook says is readable.
    drop(screen);
    let outcome = hook.restore(&target);
    for note in outcome.notes.iter().chain(&outcome.incomplete) {
        eprintln!("pytrace: {note}");
    }
    result?;
    Ok(target.exit_code())
}
