//! `pytrace imports`: every module import as a timed tree.

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::PythonInfo;
use crate::report::imports::{build_tree, ImportsReport};
use crate::report::{self, Output};
use crate::session::{Live, Target, TargetSpec};
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
    let (mut target, python) = Target::prepare(opts.target)?;
    let (mode, _why) = imports::choose_mode(&python, opts.mode)?;

    let pid = target.pid;
    let live = Live::new(&mut target, &python, mode.name(), opts.duration);
    let mut object = MaybeUninit::uninit();
    let session = imports::Session::start(&mut object, pid, &python, mode)?;
    let data = live.drive(session, |_, target| target.release(), |_| Ok(true))?;
    let (tree, unfinished) = build_tree(&data.events);
    let report = ImportsReport {
        kind: crate::report::ReportKind::Imports,
        pid,
        python: PythonInfo { version: python.version.to_string(), mode: mode.name().into() },
        duration_ns: live.elapsed().as_nanos() as u64,
        lost_events: data.counters.lost(),
        counters: data.counters,
        unfinished,
        imports: tree,
    };
    report::emit(json.as_mut(), || report.to_json(), || report.to_table(opts.top))?;
    drop(live);
    Ok(target.exit_code())
}
