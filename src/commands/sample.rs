//! `pytrace sample`: a statistical profile from a perf event on every CPU,
//! as a table, folded stacks, a flamegraph, speedscope or JSON.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::mem::MaybeUninit;
use std::time::Duration;

use anyhow::Result;

use crate::report::PythonInfo;
use crate::report::profile::{Format, FrameView, Profile};
use crate::report::Output;
use crate::session::{self, Live, Progress, Target, TargetSpec};
use crate::tracing::sample::{self, Options as SampleOptions, Targets};

pub struct Options {
    /// None: every CPython process on the machine (--all).
    pub target: Option<TargetSpec>,
    pub duration: Option<Duration>,
    pub hz: u64,
    pub kernel: bool,
    pub native: bool,
    pub idle: bool,
    pub threads: bool,
    pub gil: bool,
    pub states: bool,
    /// How stacks name Python frames; run() fills in the target's cwd.
    pub view: FrameView,
    pub top: usize,
    pub flamegraph: Option<PathBuf>,
    pub folded: Option<PathBuf>,
    pub speedscope: Option<PathBuf>,
    pub pprof: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

pub fn run(mut opts: Options) -> Result<i32> {
    // Before a command is started or a process touched.
    if opts.idle {
        crate::kernel::Kernel::get().require(crate::kernel::Feature::CopyFromUserTask, "sample --idle")?;
    }
    // Every output is created before sampling starts, so a bad path fails now.
    let paths: Vec<&std::path::Path> = [&opts.flamegraph, &opts.folded, &opts.speedscope, &opts.pprof, &opts.json].into_iter().flatten().map(|p| p.as_path()).collect();
    crate::report::output::check_distinct(&[], &paths)?;
    let mut outputs: Vec<(Format, Output)> = Vec::new();
    let pprof = Format::Pprof { wall: opts.idle };
    for (format, path) in [(Format::Flamegraph, &opts.flamegraph), (Format::Folded, &opts.folded), (Format::Speedscope, &opts.speedscope), (pprof, &opts.pprof), (Format::Json, &opts.json)] {
        if let Some(path) = path {
            outputs.push((format, Output::create(path)?));
        }
    }
    let sample_opts = SampleOptions { hz: opts.hz, kernel: opts.kernel, idle: opts.idle, native: opts.native, threads: opts.threads, gil: opts.gil, states: opts.states };
    match opts.target.take() {
        Some(spec) => {
            let (mut target, python) = Target::prepare(spec)?;
            let pid = target.pid;
            // Its own files are shown relative to where it runs.
            opts.view.cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok().and_then(|p| p.to_str().map(str::to_string));
            let mut progress = Progress::new(opts.threads.then_some(pid));
            let live = Live::new(&mut target, &python, "sample", opts.duration);
            let data = sample_with(&live, Targets::One(pid, &python), &sample_opts, &mut progress)?;
            let elapsed = live.elapsed();
            drop(live);
            write(&opts, outputs, (pid, target.cpu_ns()), python.version.to_string(), elapsed, data, progress.finish())?;
            Ok(target.exit_code())
        }
        None => {
            session::preflight()?;
            let mut progress = Progress::new(None);
            let live = Live::everywhere(opts.duration);
            // Threads are told apart for one target only.
            let data = sample_with(&live, Targets::All, &SampleOptions { threads: false, ..sample_opts }, &mut progress)?;
            write(&opts, outputs, (0, None), "any".into(), live.elapsed(), data, progress.finish())?;
            Ok(0)
        }
    }
}

/// Samples `targets` until `live` says stop, the progress line following.
fn sample_with(live: &Live, targets: Targets, opts: &SampleOptions, progress: &mut Progress) -> Result<sample::SampleData> {
    let mut object = MaybeUninit::uninit();
    let session = sample::Session::start(&mut object, targets, opts)?;
    live.drive(session, |_, target| target.release(), |session| {
        progress.tick(session.total(), live.elapsed());
        Ok(true)
    })
}

fn write(
    opts: &Options,
    mut outputs: Vec<(Format, Output)>,
    (pid, cpu_ns): (u32, Option<u64>),
    version: String,
    elapsed: Duration,
    data: sample::SampleData,
    thread_names: Option<HashMap<u32, String>>,
) -> Result<()> {
    let mut profile = Profile::new(
        pid,
        PythonInfo { version, mode: "sample".into() },
        opts.hz,
        elapsed.as_nanos() as u64,
        data.counters.clone(),
        &data.samples,
        thread_names.as_ref(),
    );
    profile.bpf_ns_per_sample = data.bpf_ns_per_sample;
    profile.cpu_ns = cpu_ns;
    profile.view = opts.view.clone();
    let mut table_on_stdout = true;
    for (format, out) in &mut outputs {
        table_on_stdout &= !matches!(out, Output::Stdout);
        out.write_all(&format.render(&profile, opts.top)?)?;
    }
    if table_on_stdout {
        std::io::stdout().write_all(&Format::Table.render(&profile, opts.top)?)?;
    }
    Ok(())
}
