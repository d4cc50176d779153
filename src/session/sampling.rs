//! A `sample` run from start to end: one target (found or started), or
//! every CPython on the machine (`--all`), sampled until it exits, the
//! duration runs out or a stop signal comes, with the progress line
//! following. What comes back is everything the profile is made from.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::time::Duration;

use anyhow::Result;

use super::{preflight, Live, Progress, Target, TargetSpec};
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
    target: Option<Target>,
}

impl SampleRun {
    /// pytrace's exit code (`Target::exit_code`); 0 for every process.
    pub fn exit_code(&self) -> i32 {
        self.target.as_ref().map_or(0, Target::exit_code)
    }
}

/// Samples `target`, or every CPython on the machine if None.
pub fn sample(target: Option<TargetSpec>, duration: Option<Duration>, opts: &Options) -> Result<SampleRun> {
    match target {
        Some(spec) => {
            let (mut target, python) = Target::prepare(spec)?;
            let pid = target.pid;
            let cwd = target.cwd();
            let mut progress = Progress::new(opts.threads.then_some((pid, &python)));
            let live = Live::new(&mut target, &python, "sample", duration);
            let data = sample_with(&live, Targets::One(pid, &python), opts, &mut progress)?;
            let elapsed = live.elapsed();
            drop(live);
            let (cpu_ns, thread_names) = (target.cpu_ns(), progress.finish());
            Ok(SampleRun { data, pid, version: python.version.to_string(), elapsed, cpu_ns, thread_names, cwd, target: Some(target) })
        }
        None => {
            preflight()?;
            let mut progress = Progress::new(None);
            let live = Live::everywhere(duration);
            // Threads are told apart for one target only.
            let data = sample_with(&live, Targets::All, &Options { threads: false, ..*opts }, &mut progress)?;
            let (elapsed, thread_names) = (live.elapsed(), progress.finish());
            Ok(SampleRun { data, pid: 0, version: "any".into(), elapsed, cpu_ns: None, thread_names, cwd: None, target: None })
        }
    }
}

/// Samples `targets` until `live` says stop, the progress line following.
fn sample_with(live: &Live, targets: Targets, opts: &Options, progress: &mut Progress) -> Result<SampleData> {
    let mut object = MaybeUninit::uninit();
    let session = sample::Session::start(&mut object, targets, opts)?;
    live.drive(session, |_, target| target.release(), |session| {
        progress.tick(session.total(), live.elapsed());
        Ok(true)
    })
}
