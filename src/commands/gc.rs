//! `pytrace gc`: every garbage collection's pause, per generation.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::PythonInfo;
use crate::report::gc::{event_line, GcTotals};
use crate::report::{self, Output};
use crate::session::{self, Live, Target, TargetSpec};
use crate::tracing::{self, gc};

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
    let (mut target, python) = Target::prepare(opts.target)?;
    let (mode, _why) = gc::choose_mode(&python, opts.mode)?;
    session::install_signal_handlers();

    let pid = target.pid;
    let mut totals = GcTotals::default();
    let attached_at = std::cell::Cell::new(tracing::monotonic_ns());
    let started_by_us = target.started_by_us();
    let live = Live::new(&mut target, opts.duration);
    let data = gc::run(
        pid,
        &python,
        mode,
        started_by_us,
        |at_first_eval| {
            live.attached(&python, mode.name(), |target| {
                match at_first_eval {
                    Some(at_stop) => target.release_at_first_eval(at_stop)?,
                    None => target.release()?,
                }
                attached_at.set(tracing::monotonic_ns());
                Ok(())
            })
        },
        || Ok(live.keep_going()),
        |c| {
            if opts.events {
                println!("{}", event_line(c.start_ns.saturating_sub(attached_at.get()), &c));
            }
            totals.add(&c);
        },
    )?;
    let elapsed = target.elapsed();
    let report = totals.into_report(
        pid,
        PythonInfo { version: python.version.to_string(), mode: mode.name().into() },
        elapsed.as_nanos() as u64,
        data.counters,
    );
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(target.exit_code())
}
