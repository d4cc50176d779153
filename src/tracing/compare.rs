//! `calls` and `sample` on one target at once (`pytrace compare`): both
//! programs loaded and attached before the target runs, one poll loop over
//! both ring buffers, both detached before either is read.

use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Result;
use libbpf_rs::RingBufferBuilder;

use super::{Start, Tracing};
use crate::model::samples::{Frame, Sample};

/// Two plans on one target at once (`pytrace compare`): the second
/// starts, in an object of its own, only once the first is attached, so
/// both are attached before the target is let run.
impl<A: Start, B: Start> Start for (A, B) {
    type Data = (A::Data, B::Data);
    type Objects = (A::Objects, B::Objects);
    type Session<'obj> = (A::Session<'obj>, B::Session<'obj>);

    fn start<'obj>(self, (first, second): &'obj mut Self::Objects) -> Result<Self::Session<'obj>> {
        let first = self.0.start(first)?;
        Ok((first, self.1.start(second)?))
    }
}

/// Two sessions on one target at once, on one poll (`pytrace compare`):
/// both stop before either is read, so they cover the same time.
impl<A: Tracing, B: Tracing> Tracing for (A, B) {
    type Data = (A::Data, B::Data);

    fn what(&self) -> String {
        format!("{} and {}", self.0.what(), self.1.what())
    }

    fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        self.0.add_to(builder)?;
        self.1.add_to(builder)
    }

    fn check_every(&self) -> Duration {
        self.0.check_every().min(self.1.check_every())
    }

    fn between_polls(&self) -> Result<()> {
        self.0.between_polls()?;
        self.1.between_polls()
    }

    fn after_poll(&self) {
        self.0.after_poll();
        self.1.after_poll();
    }

    fn next_due(&self) -> Option<Instant> {
        [self.0.next_due(), self.1.next_due()].into_iter().flatten().min()
    }

    fn run_due(&self) -> Result<()> {
        let now = Instant::now();
        if self.0.next_due().is_some_and(|due| now >= due) {
            self.0.run_due()?;
        }
        if self.1.next_due().is_some_and(|due| now >= due) {
            self.1.run_due()?;
        }
        Ok(())
    }

    fn start_counting(&self) {
        self.0.start_counting();
        self.1.start_counting();
    }

    fn stop_counting(&self) {
        self.0.stop_counting();
        self.1.stop_counting();
    }

    fn hook_set(&self) {
        self.0.hook_set();
        self.1.hook_set();
    }

    /// None: each of the two has its own, dropped by its `detach`.
    fn links(&self) -> Option<&super::Links> {
        None
    }

    fn detach(&self) {
        self.0.detach();
        self.1.detach();
    }

    fn finish(self) -> Result<Self::Data> {
        Ok((self.0.finish()?, self.1.finish()?))
    }
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
