//! A `dump` read: every thread's Python stack (and with `native` its C
//! frames) at one instant, with the thread names and states, in one pass of
//! the sampler's thread iterator. Nothing is written into the target.

use std::collections::HashMap;

use anyhow::Result;

use crate::kernel::{Feature, Kernel};
use crate::process::proc;
use crate::python::{thread_names, Python};
use crate::report::dump::Snapshot;
use crate::tracing::sample::{self, Options, Targets};

/// Reads every thread of `pid` once.
pub fn snapshot(pid: u32, native: bool) -> Result<Snapshot> {
    super::preflight()?;
    // The thread iterator reads other threads' memory: said before
    // anything is loaded.
    Kernel::get().require(Feature::CopyFromUserTask, "pytrace dump")?;
    let python = Python::from_pid(pid)?;
    let opts = Options { hz: 1, kernel: false, idle: true, native, threads: true, gil: false, states: false, async_tasks: false };
    let samples = sample::snapshot(Targets::One(pid, &python), &opts)?.samples;
    let mut os_names = HashMap::new();
    proc::thread_names(pid, &mut os_names);
    let mut names = os_names.clone();
    let name_source = thread_names::merge(pid, &python, &mut names);
    let states = samples.iter().map(|s| (s.tid, proc::thread_state(pid, s.tid))).collect();
    Ok(Snapshot { pid, version: python.version.to_string(), samples, os_names, names, name_source, states })
}
