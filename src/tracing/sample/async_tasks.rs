//! --async: the root frames naming the asyncio task a stack's samples ran
//! in (and the tasks awaiting it), read from the target when the stack
//! arrives (src/python/reading/asyncio_tasks.rs reads them).

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::model::samples::Frame;
use crate::python::reading::asyncio_tasks::{TaskLayout, TaskReader, UNREADABLE_LABEL as UNREADABLE};
use crate::python::Python;
use crate::process::proc::Memory;

/// How often a process whose _asyncio module is not mapped yet is looked
/// at again (a `--` target imports asyncio after it starts).
const RETRY_EVERY: Duration = Duration::from_secs(1);


/// One process's task names.
#[derive(Default)]
pub struct TaskNames {
    reader: Option<TaskReader>,
    last_try: Option<Instant>,
    /// Chains read since the last `forget_reads`, by task address: the
    /// stacks of one batch that share a task share its frames.
    read: HashMap<u64, Rc<[Rc<Frame>]>>,
    /// Stacks whose task is shown unreadable (its name or type did not
    /// check out, or the task layout was not found).
    pub unreadable: u64,
}

impl TaskNames {
    /// The root frames of a stack whose thread ran the task at `task`: the
    /// task (so a flamegraph groups by it), then the tasks awaiting it,
    /// outermost first.
    /// `naming`: a new stack is named with them (else an old one's names
    /// are checked), and an unreadable task is counted.
    pub fn frames(&mut self, pid: u32, python: &Python, task: u64, naming: bool) -> Rc<[Rc<Frame>]> {
        let frames = self.read_chain(pid, python, task);
        if naming && matches!(frames.first().map(|f| &**f), Some(Frame::AsyncTask(l)) if l == UNREADABLE) {
            self.unreadable += 1;
        }
        frames
    }

    fn read_chain(&mut self, pid: u32, python: &Python, task: u64) -> Rc<[Rc<Frame>]> {
        if let Some(frames) = self.read.get(&task) {
            return frames.clone();
        }
        if self.reader.is_none() && self.last_try.is_none_or(|t| t.elapsed() >= RETRY_EVERY) {
            self.last_try = Some(Instant::now());
            if let (Ok(layout), Ok(mem)) = (TaskLayout::find(pid, python), Memory::open(pid)) {
                self.reader = Some(TaskReader::new(mem, python.layout.clone(), layout));
            }
        }
        let frames: Rc<[Rc<Frame>]> = match self.reader.as_mut().map(|r| r.chain(task)) {
            Some(Ok(chain)) => chain.labels().into_iter().map(|l| Rc::new(Frame::AsyncTask(l))).collect(),
            _ => [Rc::new(Frame::AsyncTask(UNREADABLE.into()))].into(),
        };
        self.read.insert(task, frames.clone());
        frames
    }

    /// Tasks end and others are made at their addresses: what was read is
    /// read again for the next batch of stacks.
    pub fn forget_reads(&mut self) {
        self.read.clear();
    }
}
