//! `pytrace compare`: `calls` and `sample` on one target at the same time,
//! or two saved reports, compared per function (src/report/compare.rs).

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::calls::{CallsReport, SortKey};
use crate::report::compare::{Comparison, SampledReport, TracedReport};
use crate::report::profile::Profile;
use crate::report::{self, Output, PythonInfo};
use crate::session::{HookedRelease, Live, Target, TargetSpec};
use crate::tracing::calls::{self as tracer, Plan};
use crate::tracing::compare::set_apart_probe_samples;
use crate::tracing::sample::{self, Targets};

pub enum Source {
    /// Trace and sample a target now.
    Live {
        target: TargetSpec,
        duration: Option<Duration>,
        hz: u64,
        /// Where to also write the two reports compared.
        traced_json: Option<PathBuf>,
        sampled_json: Option<PathBuf>,
    },
    /// A `calls --json` and a `sample --json` report written before.
    Saved { traced: PathBuf, sampled: PathBuf },
}

pub struct Options {
    pub source: Source,
    pub top: usize,
    pub json: Option<PathBuf>,
}

pub fn run(opts: Options) -> Result<i32> {
    let (inputs, mut outputs): (Vec<&std::path::Path>, Vec<&std::path::Path>) = match &opts.source {
        Source::Saved { traced, sampled } => (vec![traced, sampled], vec![]),
        Source::Live { traced_json, sampled_json, .. } => (vec![], traced_json.iter().chain(sampled_json).map(|p| p.as_path()).collect()),
    };
    outputs.extend(opts.json.as_deref());
    crate::report::output::check_distinct(&inputs, &outputs)?;
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let (traced, sampled, status) = match opts.source {
        Source::Saved { traced, sampled } => (TracedReport::read(&traced)?, SampledReport::read(&sampled)?, 0),
        Source::Live { target, duration, hz, traced_json, sampled_json } => {
            let mut traced_out = traced_json.as_deref().map(Output::create).transpose()?;
            let mut sampled_out = sampled_json.as_deref().map(Output::create).transpose()?;
            let (traced, sampled, status) = trace_and_sample(target, duration, hz)?;
            if let Some(out) = &mut traced_out {
                out.write_all(traced.to_json().as_bytes())?;
            }
            if let Some(out) = &mut sampled_out {
                out.write_all(sampled.to_json().as_bytes())?;
            }
            // The same numbers a saved pair of these reports gives.
            (TracedReport::from(&traced), SampledReport::from(&sampled), status)
        }
    };
    let comparison = Comparison::new(&traced, &sampled);
    report::emit(json.as_mut(), || comparison.to_json(), || comparison.to_table(opts.top))?;
    Ok(status)
}

/// Runs both programs on the target; returns the two reports (what `calls`
/// and `sample` would) and the target's exit status.
fn trace_and_sample(spec: TargetSpec, duration: Option<Duration>, hz: u64) -> Result<(CallsReport, Profile, i32)> {
    let (mut target, python) = Target::prepare(spec)?;
    let (mode, _why) = tracer::choose_mode(&python, None)?;
    let hook = HookedRelease::new(&target, &python, mode)?;

    let pid = target.pid;
    let on_child = |child| hook.watch_child(child);
    let plan = Plan { pid, python: &python, mode, stop_at_first_eval: hook.stop_at_first_eval(&target), empty_probe: false, count_edges: false, on_child: &on_child };
    // Kernel stacks show which samples fell inside the probes.
    let sample_opts = sample::Options { hz, kernel: true, idle: false, native: false, threads: false, gil: false, states: false };
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
    let elapsed = live.elapsed().as_nanos() as u64;
    drop(live);
    let outcome = hook.restore(&target);
    let (calls, mut samples) = result?;

    let version = python.version.to_string();
    let mut traced = CallsReport::new(pid, PythonInfo { version: version.clone(), mode: mode.name().into() }, elapsed, calls, SortKey::Total);
    traced.caveats.extend(outcome.notes);
    if let Some(why) = &outcome.incomplete {
        eprintln!("pytrace: warning: {why}");
    }
    traced.incomplete = outcome.incomplete;
    set_apart_probe_samples(&mut samples.samples);
    let mut profile =
        Profile::new(pid, PythonInfo { version, mode: "sample".into() }, hz, elapsed, samples.counters.clone(), &samples.samples, None);
    profile.bpf_ns_per_sample = samples.bpf_ns_per_sample;
    profile.cpu_ns = target.cpu_ns();
    let status = target.exit_code();
    Ok((traced, profile, status))
}
