//! A `dump` read: every thread's Python stack (and with `native` its C
//! frames) at one instant, with the thread names and states, in one pass of
//! the sampler's thread iterator; with --async (3.14+) the asyncio task
//! each thread runs and every pending task. Nothing is written into the
//! target.

use std::collections::HashMap;

use anyhow::{bail, Result};

use crate::kernel::{Feature, Kernel};
use crate::process::proc;
use crate::python::reading::asyncio_tasks::{self, TaskList};
use crate::python::reading::thread_names;
use crate::python::Python;
use crate::report::dump::Snapshot;
use crate::tracing::sample::{self, Options, Targets};

/// Reads every thread of `pid` once; with `async_tasks` each thread's
/// running asyncio task (as its stack is read) and then every pending task.
pub fn snapshot(pid: u32, native: bool, async_tasks: bool) -> Result<Snapshot> {
    super::preflight()?;
    // The thread iterator reads other threads' memory: said before
    // anything is loaded.
    Kernel::get().require(Feature::CopyFromUserTask, "pytrace dump")?;
    let python = Python::from_pid(pid)?;
    if let Some(refusal) = async_tasks.then(|| asyncio_tasks::unsupported(&python, "dump --async")).flatten() {
        bail!(refusal);
    }
    let opts = Options { hz: 1, kernel: false, idle: true, native, threads: true, gil: false, states: false, async_tasks };
    let data = sample::snapshot(Targets::One(pid, &python), &opts)?;
    // The lists are read after the stacks: a task may have started or
    // ended in between (each stack's own task was read with it).
    let tasks = async_tasks.then(|| TaskList::read(pid, &python, &data.thread_states).map_err(|e| format!("{e:#}")));
    let samples = data.samples;
    let mut os_names = HashMap::new();
    proc::thread_names(pid, &mut os_names);
    let mut names = os_names.clone();
    let name_source = thread_names::merge_settled(pid, &python, &mut names);
    let states = samples.iter().map(|s| (s.tid, proc::thread_state(pid, s.tid))).collect();
    Ok(Snapshot { pid, version: python.version.to_string(), samples, os_names, names, name_source, states, tasks })
}
