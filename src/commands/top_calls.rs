//! `pytrace top --calls`: the live view of `pytrace calls`: exact calls per
//! second, self time and latency percentiles per function, from the calls
//! session's kernel map read every second, with the eval-frame hook owned
//! and restored as `calls` does.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::top::{read_keys, Keys, Options, Screen};
use crate::report::top::{CallsSortBy, CallsTopView};
use crate::session::{HookedRelease, Live, Target};
use crate::tracing::calls::{self as tracer, Plan};

const REDRAW_EVERY: Duration = Duration::from_secs(1);

pub fn run(opts: Options) -> Result<i32> {
    if !std::io::stdout().is_terminal() {
        bail!("pytrace top draws on a terminal and standard output is not one: use `pytrace calls` to write a report");
    }
    let (mut target, python) = Target::prepare(opts.target)?;
    let (mode, _why) = tracer::choose_mode(&python, None)?;
    // 3.11+ inlines calls unless the eval-frame hook is set (eval_hook.rs).
    let hook = HookedRelease::new(&target, &python, mode)?;
    let pid = target.pid;
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok().and_then(|p| p.to_str().map(str::to_string));
    let mut view = CallsTopView::new(format!("pytrace top --calls: PID {pid}, Python {}", python.version), cwd);
    let on_child = |child| hook.watch_child(child);
    let plan = Plan { pid, python: &python, mode, stop_at_first_eval: hook.stop_at_first_eval(&target), empty_probe: false, count_edges: false, on_child: &on_child };
    let live = Live::new(&mut target, &python, mode.name(), opts.duration);
    // Entered once the target is attached and the line scripts wait for
    // is printed, so that line is not drawn over.
    let screen: RefCell<Option<Screen>> = RefCell::new(None);
    let mut last_update: Option<Instant> = None;
    let mut object = MaybeUninit::uninit();
    let result = tracer::Session::start(&mut object, &plan).and_then(|session| {
        live.drive(
            session,
            |_, target| hook.release(target),
            |session| {
                hook.watch();
                let mut screen = screen.borrow_mut();
                let Screen(terminal) = screen.get_or_insert_with(|| Screen(ratatui::init()));
                let mut redraw = match read_keys()? {
                    Keys::Quit => return Ok(false),
                    Keys::Sort(column) => {
                        view.sort_by([CallsSortBy::RateNow, CallsSortBy::CallsAll, CallsSortBy::SelfNow, CallsSortBy::P99][column]);
                        true
                    }
                    Keys::None => false,
                };
                if last_update.is_none_or(|t| t.elapsed() >= REDRAW_EVERY) {
                    view.update(session.functions_so_far()?, live.elapsed());
                    view.lost = session.lost_so_far()?;
                    last_update = Some(Instant::now());
                    redraw = true;
                }
                if redraw {
                    terminal.draw(|frame| view.draw(frame))?;
                }
                Ok(true)
            },
        )
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
