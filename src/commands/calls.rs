//! `pytrace calls`: exact per-function call counts and latencies.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::calls::{CallsOutputs, CallsReport, SortKey};
use crate::session::{CallsOptions, CallsTarget, TargetSpec};
use crate::tracing::calls::{self as tracer, Mode};

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
    let outputs = CallsOutputs::create(opts.json.as_deref(), opts.pprof.as_deref(), opts.pstats.as_deref())?;
    let (target, python) = CallsTarget::prepare(opts.target, opts.mode)?;
    let counting = CallsOptions { duration: opts.duration, empty_probe: opts.empty_probe, count_edges: outputs.wants_edges() };
    let (run, data) = target.trace(&python, &counting, |_, _| Ok(true));
    let report = CallsReport::new(run.pid, run.python_info(), run.elapsed.as_nanos() as u64, data?, opts.sort).noting(tracer::caveats(&python, run.mode), &run.hook);
    outputs.write(&report, opts.top)?;
    Ok(run.exit_code())
}
