//! `pytrace gil`: per thread, the time it held the GIL, waited for it and
//! ran without it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::gil::{function_rows, GilReport, ThreadRow};
use crate::report::{self, Output, ReportKind};
use crate::session::{self, TargetSpec};

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub json: Option<PathBuf>,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let (run, data) = session::trace_gil(opts.target, opts.duration)?;
    let threads: Vec<ThreadRow> = data.threads.into_iter().map(ThreadRow::from_thread).collect();
    let report = GilReport {
        kind: ReportKind::Gil,
        pid: run.pid,
        python: run.python_info(),
        duration_ns: data.window_ns,
        held_ns: threads.iter().map(|t| t.thread.held_ns).sum(),
        lost_events: data.counters.lost(),
        counters: data.counters,
        threads,
        functions: function_rows(data.functions),
    };
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(run.exit_code())
}
