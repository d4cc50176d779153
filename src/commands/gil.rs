//! `pytrace gil`: per thread, the time it held the GIL, waited for it and
//! ran without it.

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::gil::{function_rows, GilReport, ThreadRow};
use crate::report::{self, Output, PythonInfo, ReportKind};
use crate::session::{Live, Target, TargetSpec};
use crate::tracing::gil;

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub json: Option<PathBuf>,
}


pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let (mut target, python) = Target::prepare(opts.target)?;
    // A command pytrace started and cannot measure never runs.
    let probes = gil::probe_points(&python)?;

    let pid = target.pid;
    let live = Live::new(&mut target, &python, "uprobe", opts.duration);
    let mut object = MaybeUninit::uninit();
    let session = gil::Session::start(&mut object, pid, &python, probes)?;
    let release = |session: &gil::Session, target: &mut Target| {
        session.open()?;
        target.release()
    };
    let data = live.drive(session, release, |_| Ok(true))?;
    drop(live);
    let threads: Vec<ThreadRow> = data.threads.into_iter().map(ThreadRow::from_thread).collect();
    let report = GilReport {
        kind: ReportKind::Gil,
        pid,
        python: PythonInfo { version: python.version.to_string(), mode: probes.describe().into() },
        duration_ns: data.window_ns,
        held_ns: threads.iter().map(|t| t.thread.held_ns).sum(),
        lost_events: data.counters.lost(),
        counters: data.counters,
        threads,
        functions: function_rows(data.functions),
    };
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(target.exit_code())
}
