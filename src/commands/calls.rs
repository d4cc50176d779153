//! `pytrace calls`: exact per-function call counts and latencies.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::python::eval_hook::EvalHook;
use crate::report::calls::{CallsReport, SortKey};
use crate::report::PythonInfo;
use crate::report::{self, Output};
use crate::session::{self, Target, TargetSpec};
use crate::tracing::calls::{self as tracer, Mode, Plan};

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub mode: Option<Mode>,
    pub top: Option<usize>,
    pub sort: SortKey,
    pub json: Option<PathBuf>,
    pub empty_probe: bool,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let (mut target, python) = Target::prepare(opts.target)?;
    let (mode, _why) = tracer::choose_mode(&python, opts.mode)?;

    // 3.11+ inlines calls unless the eval-frame hook is set (eval_hook.rs).
    // The guardian is forked now, before any BPF object or thread exists.
    let hook = if mode == Mode::Uprobe && python.inlines_calls() {
        Some(EvalHook::new(target.pid, &python)?)
    } else {
        None
    };
    let guardian = hook.as_ref().map(EvalHook::spawn_guardian).transpose()?;
    session::install_signal_handlers();

    let pid = target.pid;
    let by_us = target.started_by_us();
    // A command we start has no interpreter yet to set the hook in: the BPF
    // program stops it at its first frame evaluation and we set it then.
    let plan = Plan { pid, python: &python, mode, stop_at_first_eval: hook.is_some() && by_us, empty_probe: opts.empty_probe };
    let target_cell = std::cell::RefCell::new(&mut target);
    let hook_armed = std::cell::Cell::new(false);
    let result = tracer::run(
        &plan,
        || {
            let mut target = target_cell.borrow_mut();
            hook_armed.set(hook.is_some());
            match &hook {
                Some(hook) if by_us => target.release_at_first_eval(|| hook.install().map(drop))?,
                Some(hook) => {
                    hook.install()?;
                    target.release()?;
                }
                None => target.release()?,
            }
            target.say_attached(&python, mode.name());
            Ok(())
        },
        || Ok(target_cell.borrow_mut().keep_going(opts.duration)),
    );
    let elapsed = target.elapsed();
    if let Some(hook) = hook.as_ref().filter(|_| hook_armed.get()) {
        if target.is_running() {
            if let Err(e) = hook.restore() {
                eprintln!("pytrace: warning: could not restore interp->eval_frame in PID {pid}: {e:#}");
            }
        }
    }
    drop(guardian);
    let data = result?;

    let mut report = CallsReport::new(
        pid,
        PythonInfo { version: python.version.to_string(), mode: mode.name().into() },
        elapsed.as_nanos() as u64,
        data,
        opts.sort,
    );
    report.caveats = tracer::caveats(&python, mode);
    report::emit(json.as_mut(), || report.to_json(), || report.to_table(opts.top))?;
    Ok(target.exit_status().unwrap_or(0))
}
