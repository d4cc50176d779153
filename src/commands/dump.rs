//! `pytrace dump`: every thread's Python stack (and with --native its C
//! frames) at this instant, like `py-spy dump`. It reads the threads with
//! the sampler's thread iterator, one pass; nothing is written into the
//! target.

use std::path::PathBuf;

use anyhow::Result;

use crate::python::Python;
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
    let sample_opts = SampleOptions { hz: 1, kernel: false, idle: true, native: opts.native, threads: true, gil: false, states: false };
    let data = sample::snapshot(Targets::One(opts.pid, &python), &sample_opts)?;
    let mut threads: Vec<ThreadStack> = data
        .samples
        .into_iter()
        .map(|s| {
            let (name, state) = thread_status(opts.pid, s.tid);
            ThreadStack { tid: s.tid, name, state, frames: s.frames.into_iter().rev().collect() }
        })
        .collect();
    // The main thread (its TID is the PID) first, then by TID.
    threads.sort_by_key(|t| (t.tid != opts.pid, t.tid));
    let report = DumpReport { pid: opts.pid, python: PythonInfo { version: python.version.to_string(), mode: "dump".into() }, threads };
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(0)
}

/// A thread's name and state as /proc has them ("?" when it has exited).
fn thread_status(pid: u32, tid: u32) -> (String, String) {
    let dir = format!("/proc/{pid}/task/{tid}");
    let name = std::fs::read_to_string(format!("{dir}/comm")).map(|n| n.trim().to_string()).unwrap_or_else(|_| "?".into());
    let state = std::fs::read_to_string(format!("{dir}/stat"))
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
        .unwrap_or_else(|| "exited".into());
    (name, state)
}
