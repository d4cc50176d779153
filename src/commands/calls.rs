//! `pytrace calls`: exact per-function call counts and latencies.

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::calls::{CallsReport, SortKey};
use crate::report::PythonInfo;
use crate::report::{self, Output};
use crate::session::{HookedRelease, Live, Target, TargetSpec};
use crate::tracing::calls::{self as tracer, Mode, Plan};

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub mode: Option<Mode>,
    pub top: Option<usize>,
    pub sort: SortKey,
    pub json: Option<PathBuf>,
    pub pprof: Option<PathBuf>,
    pub pstats: Option<PathBuf>,
    pub empty_probe: bool,
}

pub fn run(opts: Options) -> Result<i32> {
    let outputs: Vec<&std::path::Path> = [&opts.json, &opts.pprof, &opts.pstats].into_iter().flatten().map(|p| p.as_path()).collect();
    report::output::check_distinct(&[], &outputs)?;
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let mut pprof = opts.pprof.as_deref().map(Output::create).transpose()?;
    let mut pstats = opts.pstats.as_deref().map(Output::create).transpose()?;
    let (mut target, python) = Target::prepare(opts.target)?;
    let (mode, _why) = tracer::choose_mode(&python, opts.mode)?;
    // 3.11+ inlines calls unless the eval-frame hook is set (eval_hook.rs).
    let hook = HookedRelease::new(&target, &python, mode)?;

    let pid = target.pid;
    let on_child = |child| hook.watch_child(child);
    let plan =
        Plan { pid, python: &python, mode, stop_at_first_eval: hook.stop_at_first_eval(&target), empty_probe: opts.empty_probe, count_edges: pstats.is_some(), on_child: &on_child };
    let live = Live::new(&mut target, &python, mode.name(), opts.duration);
    let mut object = MaybeUninit::uninit();
    let result = tracer::Session::start(&mut object, &plan).and_then(|session| {
        live.drive(session, |_, target| hook.release(target), |_| {
            hook.watch();
            Ok(true)
        })
    });
    let elapsed = live.elapsed();
    drop(live);
    let outcome = hook.restore(&target);
    let data = result?;

    let mut report = CallsReport::new(
        pid,
        PythonInfo { version: python.version.to_string(), mode: mode.name().into() },
        elapsed.as_nanos() as u64,
        data,
        opts.sort,
    );
    report.caveats = tracer::caveats(&python, mode);
    report.caveats.extend(outcome.notes);
    report.incomplete = outcome.incomplete;
    if let Some(out) = pprof.as_mut() {
        out.write_all(&report.to_pprof()?)?;
    }
    if let Some(out) = pstats.as_mut() {
        out.write_all(&report.to_pstats())?;
    }
    report::emit(json.as_mut(), || report.to_json(), || report.to_table(opts.top))?;
    Ok(target.exit_code())
}
