//! `calls` and `sample` on one target at once (`pytrace compare`): both
//! programs loaded and attached before the target runs, one poll loop over
//! both ring buffers, both detached before either is read.

use std::mem::MaybeUninit;
use std::rc::Rc;

use anyhow::{Context, Result};
use libbpf_rs::RingBufferBuilder;

use super::calls::{self, Plan};
use crate::model::functions::CallsData;
use super::poll_until;
use super::sample::{self, SampleData, Targets};
use crate::model::samples::{Frame, Sample};

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

/// Whether a kernel function belongs to the uprobe machinery: the
/// breakpoint trap of an entry probe (`asm_exc_int3`, `do_int3_user`), the
/// return trampoline (`__x64_sys_uretprobe`) and their handlers, which run
/// the BPF program.
fn is_probe_frame(name: &str) -> bool {
    name.contains("uprobe") || name.contains("uretprobe") || name.contains("int3")
}

/// Sets apart the samples the sampler took while the target's thread was
/// inside one of pytrace's own probes (known by their kernel frames): each
/// becomes a single `[pytrace probes]` frame, so that the probes' time is
/// measured and counts for no Python function. Every other sample loses its
/// kernel frames: time the target spends in the kernel counts for the
/// Python function that entered it, as in `pytrace sample` without
/// --kernel. Returns how many samples were set apart.
pub fn set_apart_probe_samples(samples: &mut [Sample]) -> u64 {
    let probes = Rc::new(Frame::Probes);
    let mut set_apart = 0;
    for s in samples.iter_mut() {
        let in_probes = s.frames.iter().any(|f| matches!(f.as_ref(), Frame::Kernel(name) if is_probe_frame(name)));
        if in_probes {
            s.frames = vec![probes.clone()];
            set_apart += s.count;
        } else {
            s.frames.retain(|f| !matches!(f.as_ref(), Frame::Kernel(_)));
        }
    }
    set_apart
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_inside_the_probes_are_set_apart_and_other_kernel_frames_dropped() {
        let py = Rc::new(Frame::Python { name: "loop".into(), file: "app.py".into(), line: 7, first_line: 4 });
        let k = |name: &str| Rc::new(Frame::Kernel(name.into()));
        let mut samples = vec![
            Sample { pid: 1, tid: 1, frames: vec![py.clone(), k("asm_exc_int3"), k("irqentry_exit_to_user_mode")], count: 1 },
            Sample { pid: 1, tid: 1, frames: vec![py.clone(), k("entry_SYSCALL_64_after_hwframe"), k("__x64_sys_uretprobe")], count: 1 },
            Sample { pid: 1, tid: 1, frames: vec![py.clone(), k("entry_SYSCALL_64_after_hwframe"), k("__x64_sys_read")], count: 1 },
            Sample { pid: 1, tid: 1, frames: vec![py.clone()], count: 1 },
        ];
        assert_eq!(set_apart_probe_samples(&mut samples), 2);
        assert_eq!(*samples[0].frames, [Rc::new(Frame::Probes)]);
        assert_eq!(*samples[1].frames, [Rc::new(Frame::Probes)]);
        assert_eq!(*samples[2].frames, *std::slice::from_ref(&py), "a read(2) counts for the Python function");
        assert_eq!(*samples[3].frames, [py]);
    }
}
