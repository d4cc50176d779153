//! Cuts the sampler's running profile into intervals: the sampler counts
//! from its start (it is `sample --all`, run for as long as the agent
//! runs), and each interval is what was counted since the last cut, per
//! process. What the last cut saw is kept per stack and pruned as the
//! sampler forgets exited processes' stacks, so it never outgrows the
//! sampler's own profile.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use crate::model::samples::{Frame, Sample};

/// A stack of one thread of one process.
type Key = (u32, u32, Vec<Rc<Frame>>);

#[derive(Default)]
pub struct Cutter {
    seen: HashMap<Key, u64>,
}

impl Cutter {
    /// The samples counted since the last cut, by process, from the
    /// running totals `so_far`, each stack without the process frame that
    /// `--all` puts at its root (the process is the profile's subject).
    pub fn cut(&mut self, so_far: Vec<Sample>) -> BTreeMap<u32, Vec<Sample>> {
        let mut next = HashMap::with_capacity(so_far.len());
        let mut by_pid: BTreeMap<u32, Vec<Sample>> = BTreeMap::new();
        for sample in so_far {
            let key = (sample.pid, sample.tid, sample.frames);
            // A count below what was seen is a stack the sampler forgot and
            // counted anew (a PID reused): all of it is new.
            let before = self.seen.get(&key).copied().filter(|&b| b <= sample.count).unwrap_or(0);
            let new = sample.count - before;
            if new > 0 {
                let frames = match key.2.first().map(|f| f.as_ref()) {
                    Some(Frame::Process(_)) => key.2[1..].to_vec(),
                    _ => key.2.clone(),
                };
                by_pid.entry(key.0).or_default().push(Sample { pid: key.0, tid: key.1, frames, count: new });
            }
            next.insert(key, sample.count);
        }
        // Stacks the sampler no longer holds are dropped here too.
        self.seen = next;
        by_pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, name: &str, count: u64) -> Sample {
        let frames = vec![Rc::new(Frame::Process(format!("python ({pid})"))), Rc::new(Frame::Python { name: name.into(), file: "f.py".into(), line: 1, first_line: 1 })];
        Sample { pid, tid: 0, frames, count }
    }

    #[test]
    fn each_cut_is_the_difference() {
        let mut cutter = Cutter::default();
        let first = cutter.cut(vec![sample(1, "a", 5), sample(2, "b", 3)]);
        assert_eq!(first[&1][0].count, 5);
        assert_eq!(first[&1][0].frames.len(), 1, "the process frame is taken off");
        let second = cutter.cut(vec![sample(1, "a", 9), sample(2, "b", 3), sample(1, "c", 2)]);
        assert_eq!(second[&1].iter().map(|s| s.count).sum::<u64>(), 6);
        assert!(!second.contains_key(&2), "nothing new for process 2");
        // Process 1's stacks forgotten, then counted anew from 1.
        let third = cutter.cut(vec![sample(1, "a", 1)]);
        assert_eq!(third[&1][0].count, 1);
        assert_eq!(cutter.seen.len(), 1);
    }
}
