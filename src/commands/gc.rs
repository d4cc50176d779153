//! `pytrace gc`: every garbage collection's pause, per generation.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::model::events::Collection;
use crate::report::gc::{event_line, GcTotals};
use crate::report::{self, Output};
use crate::session::{self, TargetSpec};
use crate::tracing::gc;

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    /// Print one line per collection as it happens.
    pub events: bool,
    pub json: Option<PathBuf>,
    /// --mode: None picks the USDT probes where they exist.
    pub mode: Option<gc::Mode>,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let totals = RefCell::new(GcTotals::default());
    let event_lines_failed = RefCell::new(None);
    let on_collection = |c: &Collection, since_attach_ns| {
        totals.borrow_mut().add(c);
        if opts.events {
            if let Err(e) = crate::console::out(&format!("{}\n", event_line(since_attach_ns, c))) {
                *event_lines_failed.borrow_mut() = Some(e);
                return false;
            }
        }
        true
    };
    let (run, data) = session::trace_gc(opts.target, opts.duration, opts.mode, on_collection)?;
    if let Some(e) = event_lines_failed.into_inner() {
        // Standard output is gone: the JSON file is still written.
        if let Some(out) = json.as_mut().filter(|out| !matches!(out, Output::Stdout)) {
            let report = totals.into_inner().into_report(run.pid, run.python_info(), run.elapsed.as_nanos() as u64, data.counters);
            out.write_all(report.to_json().as_bytes())?;
        }
        return Err(e);
    }
    let report = totals.into_inner().into_report(run.pid, run.python_info(), run.elapsed.as_nanos() as u64, data.counters);
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(run.exit_code())
}
