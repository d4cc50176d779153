//! A live `compare` run: the calls program and the sampler on one target
//! at once, both attached before it runs and both detached before either is
//! read (src/tracing/compare.rs), with the eval-frame hook set around them
//! as for `calls`.

use std::mem::MaybeUninit;
use std::time::Duration;

use anyhow::Result;

use super::{HookOutcome, HookedRelease, Live, Target, TargetSpec};
use crate::model::functions::CallsData;
use crate::tracing::calls::{self as tracer, Mode, Plan};
use crate::tracing::compare::set_apart_probe_samples;
use crate::tracing::sample::{self, SampleData, Targets};

/// What both programs gathered over the same time, and about what.
pub struct TracedAndSampled {
    pub pid: u32,
    pub version: String,
    /// How calls saw the calls.
    pub mode: Mode,
    pub hz: u64,
    pub elapsed_ns: u64,
    pub calls: CallsData,
    /// Samples taken inside pytrace's probes are set apart.
    pub samples: SampleData,
    /// What happened to the eval-frame hook.
    pub hook: HookOutcome,
    /// The target's CPU time while traced (`Target::cpu_ns`).
    pub cpu_ns: Option<u64>,
    /// pytrace's exit code (`Target::exit_code`).
    pub exit_code: i32,
}

/// Traces and samples `spec` at `hz` until it exits, the duration runs out
/// or a stop signal comes.
pub fn trace_and_sample(spec: TargetSpec, duration: Option<Duration>, hz: u64) -> Result<TracedAndSampled> {
    let (mut target, python) = Target::prepare(spec)?;
    let (mode, _why) = tracer::choose_mode(&python, None)?;
    let hook = HookedRelease::new(&target, &python, mode)?;

    let pid = target.pid;
    let on_child = |child| hook.watch_child(child);
    let plan = Plan { pid, python: &python, mode, stop_at_first_eval: hook.stop_at_first_eval(&target), empty_probe: false, count_edges: false, on_child: &on_child };
    // Kernel stacks show which samples fell inside the probes.
    let sample_opts = sample::Options { hz, kernel: true, idle: false, native: false, threads: false, gil: false, states: false, async_tasks: false };
    let live = Live::new(&mut target, &python, &format!("{} and sample", mode.name()), duration);
    let (mut calls_object, mut sample_object) = (MaybeUninit::uninit(), MaybeUninit::uninit());
    let result = tracer::Session::start(&mut calls_object, &plan)
        .and_then(|traced| Ok((traced, sample::Session::start(&mut sample_object, Targets::One(pid, &python), &sample_opts)?)))
        .and_then(|both| {
            live.drive(both, |_, target| hook.release(target), |_| {
                hook.watch();
                Ok(true)
            })
        });
    let elapsed_ns = live.elapsed().as_nanos() as u64;
    drop(live);
    let outcome = hook.restore(&target);
    let (calls, mut samples) = result?;
    if let Some(why) = &outcome.incomplete {
        eprintln!("pytrace: warning: {why}");
    }
    set_apart_probe_samples(&mut samples.samples);
    let version = python.version.to_string();
    Ok(TracedAndSampled { pid, version, mode, hz, elapsed_ns, calls, samples, hook: outcome, cpu_ns: target.cpu_ns(), exit_code: target.exit_code() })
}
