//! `pytrace dump`: every thread's Python stack (and with --native its C
//! frames) at this instant, like `py-spy dump`. It reads the threads with
//! the sampler's thread iterator, one pass (src/session/snapshot.rs);
//! nothing is written into the target.

use std::path::PathBuf;

use anyhow::Result;

use crate::report::dump::DumpReport;
use crate::report::{self, Output};
use crate::session;

pub struct Options {
    pub pid: u32,
    pub native: bool,
    /// --async: each thread's running asyncio task, and every pending task.
    pub async_tasks: bool,
    pub json: Option<PathBuf>,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let report = DumpReport::of_snapshot(session::snapshot(opts.pid, opts.native, opts.async_tasks)?);
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(0)
}
