//! `pytrace gc`: every garbage collection's pause, per generation.

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::model::events::Collection;
use crate::report::PythonInfo;
use crate::report::gc::{event_line, GcTotals};
use crate::report::{self, Output};
use crate::session::{Live, Target, TargetSpec};
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

    let pid = target.pid;
    let totals = RefCell::new(GcTotals::default());
    let attached_at = Cell::new(tracing::monotonic_ns());
    let on_collection = |c: Collection| {
        if opts.events {
            println!("{}", event_line(c.start_ns.saturating_sub(attached_at.get()), &c));
        }
        totals.borrow_mut().add(&c);
    };
    let started_by_us = target.started_by_us();
    let live = Live::new(&mut target, &python, mode.name(), opts.duration);
    let mut object = MaybeUninit::uninit();
    let session = gc::Session::start(&mut object, pid, &python, mode, started_by_us, &on_collection)?;
    let release = |session: &gc::Session, target: &mut Target| {
        // Watchpoint mode on a command we started: its interpreter exists
        // only once it runs Python; it stops there for the watchpoint.
        match session.waits_for_first_eval() {
            true => target.release_at_first_eval(|| session.watch_at_first_eval())?,
            false => target.release()?,
        }
        session.released();
        attached_at.set(tracing::monotonic_ns());
        Ok(())
    };
    let data = live.drive(session, release, |_| Ok(true))?;
    let report = totals.into_inner().into_report(
        pid,
        PythonInfo { version: python.version.to_string(), mode: mode.name().into() },
        live.elapsed().as_nanos() as u64,
        data.counters,
    );
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    drop(live);
    Ok(target.exit_code())
}
