//! `calls` and `sample` on one target at once (`pytrace compare`): both
//! programs loaded and attached before the target runs, one poll loop over
//! both ring buffers, both detached before either is read.

use std::mem::MaybeUninit;

use anyhow::{Context, Result};
use libbpf_rs::RingBufferBuilder;

use super::calls::{self, CallsData, Plan};
use super::poll_until;
use super::sample::{self, SampleData, Targets};

/// Attaches both, calls `attached` once both are live, polls until
/// `keep_going` says stop, then detaches both and collects.
pub fn run(
    plan: &Plan,
    sample_opts: &sample::Options,
    attached: impl FnOnce() -> Result<()>,
    mut keep_going: impl FnMut() -> Result<bool>,
) -> Result<(CallsData, SampleData)> {
    let mut calls_object = MaybeUninit::uninit();
    let mut sample_object = MaybeUninit::uninit();
    let tracer = calls::Session::start(&mut calls_object, plan)?;
    let sampler = sample::Session::start(&mut sample_object, Targets::One(plan.pid, plan.python), sample_opts)?;
    let mut builder = RingBufferBuilder::new();
    tracer.add_to(&mut builder)?;
    sampler.add_to(&mut builder)?;
    let ring = builder.build()?;

    attached()?;
    let polled = poll_until(&ring, "calls and sample", || {
        tracer.between_polls(plan);
        sampler.between_polls()?;
        keep_going()
    });
    // Both stop before either is read, so they cover the same time.
    tracer.detach();
    sampler.detach();
    polled?;
    ring.consume().context("failed to drain the calls and sample ring buffers")?;
    drop(ring);
    Ok((tracer.finish()?, sampler.finish()?))
}
