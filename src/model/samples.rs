//! What a sampling profile is made of: frames and stacks, as plain data.
//! The sampler (src/tracing/sample.rs) produces them, --native's unwinder
//! (src/native) adds to them, the reports (src/report) read them; none of
//! these depends on another through this module.

use std::rc::Rc;

/// One frame of a sample, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// `line` is the line running; `first_line` the function's first line,
    /// which with name and file tells one function from another.
    Python { name: String, file: String, line: u32, first_line: u32 },
    /// --native: a C function (its symbol, or its start address in a
    /// stripped file) and the file name of its module.
    Native { name: String, module: String },
    Kernel(String),
    /// A frame that could not be read (freed memory, a frame being torn
    /// down while the thread runs): shown, never guessed.
    Unreadable,
    /// `dump`: the thread's stack changed under every read of it (a thread
    /// running on another CPU), so none is shown.
    Unsettled,
    /// The stack went on past what is recorded.
    Truncated,
    /// The thread was running no Python code.
    NoPython,
    /// --native: a thread other than the main one, running no Python code,
    /// whose whole native stack shows native code started it (OpenBLAS's
    /// workers, say): it can have no Python caller.
    NativeThread,
    /// With --all: the process, as the root frame.
    Process(String),
    /// With --idle --states: what the thread was doing (running, waiting
    /// for the GIL, released in a system call), as the root frame (under
    /// the process with --all).
    ThreadState(String),
    /// With --async: the asyncio task the thread was running (`task NAME`),
    /// the root frame (under the process with --all), then the tasks
    /// awaiting it (`awaited by task NAME`), outermost first.
    AsyncTask(String),
    /// A sample taken inside pytrace's own uprobes, while `calls` traces
    /// the same target (`pytrace compare` sets these apart).
    Probes,
    /// --native: the native stack ended early (copied stack too short, or
    /// code without unwind information); frames outside it follow.
    NativeIncomplete,
    /// --native: eval frames and Python calls disagreed; the native frames
    /// are below this marker, the Python frames above it, unpaired.
    NativeUnmatched,
    /// --native: no registers or stack for this sample.
    NativeUnavailable,
}

/// Samples of one stack in one thread: its frames, outermost first, and
/// how many samples found it.
#[derive(Debug, Clone)]
pub struct Sample {
    pub pid: u32,
    pub tid: u32,
    pub frames: Vec<Rc<Frame>>,
    pub count: u64,
}
