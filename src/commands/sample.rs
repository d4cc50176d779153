//! `pytrace sample`: a statistical profile from a perf event on every CPU,
//! as a table, folded stacks, a flamegraph, speedscope or JSON.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::kernel::{Feature, Kernel};
use crate::report::profile::{Format, FrameView, Outputs, Profile};
use crate::report::PythonInfo;
use crate::session::{self, TargetSpec};
use crate::tracing::sample::Options as SampleOptions;

pub struct Options {
    /// None: every CPython process on the machine (--all).
    pub target: Option<TargetSpec>,
    pub duration: Option<Duration>,
    /// How to sample: a flag cli.rs puts here reaches the sampler as is.
    pub sampling: SampleOptions,
    /// How stacks name Python frames; the target's cwd is filled in here.
    pub view: FrameView,
    pub top: usize,
    /// Each format asked for, with its path ("-": standard output).
    pub outputs: Vec<(Format, PathBuf)>,
}

pub fn run(opts: Options) -> Result<i32> {
    // Before a command is started or a process touched.
    if opts.sampling.idle {
        Kernel::get().require(Feature::CopyFromUserTask, "sample --idle")?;
    }
    let outputs = Outputs::create(&opts.outputs)?;
    let run = session::sample(opts.target, opts.duration, &opts.sampling)?;
    let python = PythonInfo { version: run.version.clone(), mode: "sample".into() };
    let elapsed_ns = run.elapsed.as_nanos() as u64;
    let mut profile = Profile::new(run.pid, python, opts.sampling.hz, elapsed_ns, run.data.counters.clone(), &run.data.samples, run.thread_names.as_ref());
    profile.bpf_ns_per_sample = run.data.bpf_ns_per_sample;
    profile.cpu_ns = run.cpu_ns;
    profile.view = FrameView { cwd: run.cwd.clone(), ..opts.view };
    outputs.write(&profile, opts.top)?;
    Ok(run.exit_code())
}
