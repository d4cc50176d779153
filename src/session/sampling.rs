//! A `sample` run from start to end: one target (found or started), or
//! every CPython on the machine (`--all`), sampled until it exits, the
//! duration runs out or a stop signal comes, with the progress line
//! following. What comes back is everything the profile is made from.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;

use super::{preflight, Live, Progress, Run, Target, TargetSpec};
use crate::python::Python;
use crate::tracing::sample::{self, Options, SampleData, Targets};

/// What a sample run gathered, and about what.
pub struct SampleRun {
    pub data: SampleData,
    /// The target's PID; 0 for every process (`--all`).
    pub pid: u32,
    /// Its Python's version; "any" for every process.
    pub version: String,
    pub elapsed: Duration,
    /// The target's CPU time while sampled (`Target::cpu_ns`).
    pub cpu_ns: Option<u64>,
    /// With --threads: each thread's name, read while it lived.
    pub thread_names: Option<HashMap<u32, String>>,
    /// The target's working directory, where its own files are.
    pub cwd: Option<String>,
    run: Option<Run>,
}

impl SampleRun {
    /// pytrace's exit code (`Run::exit_code`); 0 for every process.
    pub fn exit_code(&self) -> i32 {
        self.run.as_ref().map_or(0, Run::exit_code)
    }
}

/// Samples `target`, or every CPython on the machine if None.
pub fn sample(target: Option<TargetSpec>, duration: Option<Duration>, opts: &Options) -> Result<SampleRun> {
    match target {
        Some(spec) => {
            let (target, python) = Target::prepare(spec)?;
            let pid = target.pid;
            let cwd = target.cwd();
            let mut progress = Progress::new(opts.threads.then_some((pid, &python)));
            let (run, data) = sample_target(target, &python, duration, opts, |session, elapsed| {
                progress.tick(session.total(), elapsed);
                Ok(true)
            })?;
            let (cpu_ns, thread_names) = (run.cpu_ns(), progress.finish());
            Ok(SampleRun { data, pid, version: run.version.clone(), elapsed: run.elapsed, cpu_ns, thread_names, cwd, run: Some(run) })
        }
        None => {
            preflight()?;
            let mut progress = Progress::new(None);
            let live = Live::everywhere(duration);
            // Threads are told apart for one target only.
            let opts = Options { threads: false, ..*opts };
            let plan = sample::Plan { targets: Targets::All, opts: &opts };
            let data = live.run(
                plan,
                |_, target| target.release(),
                |session| {
                    progress.tick(session.total(), live.elapsed());
                    Ok(true)
                },
                |_, _| {},
            )?;
            let (elapsed, thread_names) = (live.elapsed(), progress.finish());
            Ok(SampleRun { data, pid: 0, version: "any".into(), elapsed, cpu_ns: None, thread_names, cwd: None, run: None })
        }
    }
}

/// Samples `target` (made ready by `Target::prepare`), whose Python is
/// `python`, until it exits, the duration runs out, a stop signal comes or
/// `each` (given the session and the time run so far, between polls: a
/// live view) says stop. `each` is dropped before the run ends.
pub fn sample_target(target: Target, python: &Python, duration: Option<Duration>, opts: &Options, each: impl FnMut(&sample::Session, Duration) -> Result<bool>) -> Result<(Run, SampleData)> {
    let plan = sample::Plan { targets: Targets::One(target.pid, python), opts };
    target.trace(python, "sample", duration, plan, |_, target| target.release(), each)
}
