//! `pytrace dump`: every thread's Python stack (and with --native its C
//! frames) at this instant, like `py-spy dump`. It reads the threads with
//! the sampler's thread iterator, one pass; nothing is written into the
//! target.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::process::proc;
use crate::python::{thread_names, Python};
use crate::report::dump::{DumpReport, ThreadStack};
use crate::report::{self, Output, PythonInfo};
use crate::tracing::sample::{self, Options as SampleOptions, Targets};

pub struct Options {
    pub pid: u32,
    pub native: bool,
    pub json: Option<PathBuf>,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    crate::session::preflight()?;
    // One pass of --idle's thread iterator, which reads other threads'
    // memory: said before anything is loaded.
    crate::kernel::Kernel::get().require(crate::kernel::Feature::CopyFromUserTask, "pytrace dump")?;
    let python = Python::from_pid(opts.pid)?;
    let sample_opts = SampleOptions { hz: 1, kernel: false, idle: true, native: opts.native, threads: true, gil: false, states: false, async_tasks: false };
    let data = sample::snapshot(Targets::One(opts.pid, &python), &sample_opts)?;
    let mut kernel_names = HashMap::new();
    proc::thread_names(opts.pid, &mut kernel_names);
    let mut names = kernel_names.clone();
    let name_source = thread_names::merge(opts.pid, &python, &mut names);
    let mut threads: Vec<ThreadStack> = data
        .samples
        .into_iter()
        .map(|s| {
            let state = thread_state(opts.pid, s.tid);
            let os_name = kernel_names.get(&s.tid).cloned().unwrap_or_else(|| "?".into());
            let name = names.get(&s.tid).cloned().unwrap_or_else(|| os_name.clone());
            ThreadStack { tid: s.tid, name, os_name, state, frames: s.frames.into_iter().rev().collect() }
        })
        .collect();
    // The main thread (its TID is the PID) first, then by TID.
    threads.sort_by_key(|t| (t.tid != opts.pid, t.tid));
    let python_info = PythonInfo { version: python.version.to_string(), mode: "dump".into() };
    let report = DumpReport { pid: opts.pid, python: python_info, threads, thread_names: name_source };
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(0)
}

/// A thread's state as /proc has it ("exited" when it has).
fn thread_state(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string)))
        .map(|code| match code.as_str() {
            "R" => "running".to_string(),
            "S" => "sleeping".to_string(),
            "D" => "waiting on disk".to_string(),
            "T" | "t" => "stopped".to_string(),
            "Z" => "exiting".to_string(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "exited".into())
}
