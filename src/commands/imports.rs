//! `pytrace imports`: every module import as a timed tree.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::imports::{build_tree, ImportsReport};
use crate::report::{self, Output, ReportKind};
use crate::session::{self, TargetSpec};
use crate::tracing::imports;

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub top: Option<usize>,
    pub json: Option<PathBuf>,
    /// --mode: None picks the USDT probes where they exist.
    pub mode: Option<imports::Mode>,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let (run, data) = session::trace_imports(opts.target, opts.duration, opts.mode)?;
    let (tree, unfinished) = build_tree(&data.events);
    let report = ImportsReport {
        kind: ReportKind::Imports,
        pid: run.pid,
        python: run.python_info(),
        duration_ns: run.elapsed.as_nanos() as u64,
        lost_events: data.counters.lost(),
        counters: data.counters,
        unfinished,
        imports: tree,
    };
    report::emit(json.as_mut(), || report.to_json(), || report.to_table(opts.top))?;
    Ok(run.exit_code())
}
