//! A live `compare` run: the calls program and the sampler on one target
//! at once, both attached before it runs and both detached before either is
//! read (src/tracing/compare.rs), in the calls run `calls` has (calls.rs),
//! eval-frame hook and all.

use std::time::Duration;

use anyhow::Result;

use super::{CallsOptions, CallsRun, CallsTarget, TargetSpec};
use crate::report::compare::TracedAndSampled;
use crate::tracing::compare::set_apart_probe_samples;
use crate::tracing::sample::{self, Targets};

/// Traces and samples `spec` at `hz` until it exits, the duration runs out
/// or a stop signal comes.
pub fn trace_and_sample(spec: TargetSpec, duration: Option<Duration>, hz: u64) -> Result<TracedAndSampled> {
    let (target, python) = CallsTarget::prepare(spec, None)?;
    let pid = target.pid();
    // Kernel stacks show which samples fell inside the probes.
    let sample_opts = sample::Options { hz, kernel: true, idle: false, native: false, threads: false, gil: false, states: false, async_tasks: false };
    let counting = CallsOptions { duration, ..Default::default() };
    let sampler = sample::Plan { targets: Targets::One(pid, &python), opts: &sample_opts };
    let (run, gathered) = target.trace_beside(&python, &counting, "sample", sampler);
    let (calls, mut samples) = gathered?;
    if let Some(why) = &run.hook.incomplete {
        crate::console::err(&format!("pytrace: warning: {why}\n"));
    }
    let (cpu_ns, exit_code) = (run.cpu_ns(), run.exit_code());
    let CallsRun { pid, version, mode, elapsed, hook, .. } = run;
    set_apart_probe_samples(&mut samples.samples);
    Ok(TracedAndSampled { pid, version, mode, hz, elapsed_ns: elapsed.as_nanos() as u64, calls, samples, hook, cpu_ns, exit_code })
}
