//! Splits an interval's samples by process. The sampler hands the agent
//! what it counted since the last cut and starts counting afresh
//! (Session::take_samples), so an interval costs what it holds: the stacks
//! of processes that exited long ago are neither kept nor copied again at
//! every cut (they were, when the agent diffed the sampler's running
//! totals, and its CPU grew with the processes it had outlived).

use std::collections::BTreeMap;

use crate::model::samples::{Frame, Sample};

/// The samples of one interval by process, each stack without the process
/// frame that `--all` puts at its root (the process is the profile's
/// subject).
pub fn by_process(samples: Vec<Sample>) -> BTreeMap<u32, Vec<Sample>> {
    let mut by_pid: BTreeMap<u32, Vec<Sample>> = BTreeMap::new();
    for mut sample in samples {
        if sample.count == 0 {
            continue;
        }
        if matches!(sample.frames.first().map(|f| f.as_ref()), Some(Frame::Process(_))) {
            sample.frames.remove(0);
        }
        by_pid.entry(sample.pid).or_default().push(sample);
    }
    by_pid
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn sample(pid: u32, name: &str, count: u64) -> Sample {
        let frames = vec![Rc::new(Frame::Process(format!("python ({pid})"))), Rc::new(Frame::Python { name: name.into(), file: "f.py".into(), line: 1, first_line: 1 })];
        Sample { pid, tid: 0, frames, count }
    }

    #[test]
    fn split_by_process_without_the_process_frame() {
        let cut = by_process(vec![sample(1, "a", 5), sample(2, "b", 3), sample(1, "c", 2), sample(3, "d", 0)]);
        assert_eq!(cut.keys().copied().collect::<Vec<_>>(), [1, 2], "a stack not counted is no process's");
        assert_eq!(cut[&1].iter().map(|s| s.count).sum::<u64>(), 7);
        assert!(cut.values().flatten().all(|s| s.frames.len() == 1), "the process frame is taken off");
    }
}
