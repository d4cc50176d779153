//! The `dump` report: every thread's stack at one instant, innermost frame
//! first (as a traceback reads upside down, and as py-spy dump prints).

use std::collections::HashMap;

use serde::Serialize;

use super::profile::label;
use super::PythonInfo;
use crate::model::samples::{Frame, Sample};
use crate::python::reading::asyncio_tasks::{PendingTask, TaskChain, TaskList};
use crate::python::reading::thread_names::NameSource;

#[derive(Serialize, schemars::JsonSchema)]
pub struct ThreadStack {
    pub tid: u32,
    /// The thread's Python name (`threading.Thread.name`) where it could
    /// be read, else the kernel's.
    pub name: String,
    /// The thread's name as the kernel knows it (/proc/PID/task/TID/comm).
    pub os_name: String,
    /// What the kernel says it was doing when read: running, sleeping, …
    pub state: String,
    /// --async: the asyncio task the thread was running when its stack
    /// was read (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<RunningTask>,
    /// Innermost first.
    #[serde(serialize_with = "frames_json")]
    #[schemars(with = "Vec<FrameJson>")]
    pub frames: Vec<std::rc::Rc<Frame>>,
}

/// A thread's running asyncio task, read with its stack.
#[derive(Serialize, schemars::JsonSchema)]
pub struct RunningTask {
    /// None: the task could not be named (it did not check out, or ended
    /// before it was read).
    pub name: Option<String>,
    /// The tasks awaiting it one by one, the nearest first.
    pub awaited_by: Vec<String>,
    /// The tasks awaiting the last of `awaited_by` (or this task) when
    /// several do at once, sorted.
    pub awaited_by_several: Vec<String>,
    /// The awaiters went on past those shown.
    pub more_awaiters: bool,
}

impl RunningTask {
    /// From the root frames `sample --async`'s reader put on the stack
    /// (outermost first), taken off it.
    fn take_from(frames: &mut Vec<std::rc::Rc<Frame>>) -> Option<Self> {
        let roots = frames.iter().take_while(|f| matches!(f.as_ref(), Frame::AsyncTask(_))).count();
        if roots == 0 {
            return None;
        }
        let labels: Vec<String> = frames.drain(..roots).filter_map(|f| if let Frame::AsyncTask(l) = f.as_ref() { Some(l.clone()) } else { None }).collect();
        Some(match TaskChain::from_labels(labels.iter().map(String::as_str)) {
            Some(chain) => RunningTask { name: Some(chain.name), awaited_by: chain.awaiters.into_iter().rev().collect(), awaited_by_several: chain.several, more_awaiters: chain.cut },
            None => RunningTask { name: None, awaited_by: Vec::new(), awaited_by_several: Vec::new(), more_awaiters: false },
        })
    }

    fn describe(&self) -> String {
        let name = self.name.as_deref().unwrap_or("unreadable");
        let awaiters = awaiter_words(&self.awaited_by, &self.awaited_by_several, self.more_awaiters);
        if awaiters.is_empty() { format!("task {name}") } else { format!("task {name}, awaited by {awaiters}") }
    }
}

/// A task's awaiters in a line: the chain nearest first (`main <- Task-1`),
/// then the several awaiting its end at once (`(waiter-1, waiter-2)`), then
/// `more tasks` if cut.
fn awaiter_words(chain: &[String], several: &[String], more: bool) -> String {
    let mut parts: Vec<String> = chain.to_vec();
    if !several.is_empty() {
        parts.push(if parts.is_empty() { several.join(", ") } else { format!("({})", several.join(", ")) });
    }
    if more {
        parts.push("more tasks".into());
    }
    parts.join(" <- ")
}

/// --async: every pending asyncio task of the target, or why they could
/// not be read.
#[derive(Serialize, schemars::JsonSchema)]
pub struct AsyncioTasks {
    pub tasks: Vec<PendingTask>,
    /// A list was cut (too long, or a link that did not check out).
    pub cut: bool,
    /// Why no task could be read (asyncio not imported, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A frame as the report writes it, told by its `kind`.
#[derive(Serialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FrameJson<'a> {
    Python { name: &'a str, file: &'a str, line: u32 },
    Native { name: &'a str, module: &'a str },
    Kernel { name: &'a str },
    /// A frame that is not code: a cut stack, an unreadable frame, … named
    /// as the tables show it.
    Marker { name: String },
}

impl<'a> FrameJson<'a> {
    fn of(frame: &'a Frame) -> Self {
        match frame {
            Frame::Python { name, file, line, .. } => FrameJson::Python { name, file, line: *line },
            Frame::Native { name, module } => FrameJson::Native { name, module },
            Frame::Kernel(name) => FrameJson::Kernel { name },
            other => FrameJson::Marker { name: label(other) },
        }
    }
}

fn frames_json<S: serde::Serializer>(frames: &[std::rc::Rc<Frame>], to: S) -> Result<S::Ok, S::Error> {
    to.collect_seq(frames.iter().map(|f| FrameJson::of(f)))
}

/// What `dump` read (src/session/snapshot.rs): every thread's stack at one
/// instant, and what names and states it had.
pub struct Snapshot {
    pub pid: u32,
    pub version: String,
    /// One sample per thread, outermost frame first.
    pub samples: Vec<Sample>,
    /// Each thread's name as the kernel knows it.
    pub os_names: HashMap<u32, String>,
    /// Each thread's Python name where it could be read, else the kernel's.
    pub names: HashMap<u32, String>,
    pub name_source: NameSource,
    /// Each thread's state letter (`proc::thread_state`), read after its stack.
    pub states: HashMap<u32, Option<String>>,
    /// --async: every pending task, read after the stacks, or why not.
    pub tasks: Option<Result<TaskList, String>>,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct DumpReport {
    pub kind: super::ReportKind,
    pub pid: u32,
    pub python: PythonInfo,
    pub threads: Vec<ThreadStack>,
    /// How many names came from Python, and why none did if so.
    pub thread_names: NameSource,
    /// --async only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asyncio: Option<AsyncioTasks>,
}

impl DumpReport {
    /// The main thread (its TID is the PID) first, then by TID; each
    /// stack innermost first.
    pub fn of_snapshot(snapshot: Snapshot) -> Self {
        let Snapshot { pid, version, samples, os_names, names, name_source, states, tasks } = snapshot;
        let mut threads: Vec<ThreadStack> = samples
            .into_iter()
            .map(|s| {
                let state = state_words(states.get(&s.tid).cloned().flatten());
                let os_name = os_names.get(&s.tid).cloned().unwrap_or_else(|| "?".into());
                let name = names.get(&s.tid).cloned().unwrap_or_else(|| os_name.clone());
                let mut frames = s.frames;
                let task = RunningTask::take_from(&mut frames);
                ThreadStack { tid: s.tid, name, os_name, state, task, frames: frames.into_iter().rev().collect() }
            })
            .collect();
        threads.sort_by_key(|t| (t.tid != pid, t.tid));
        let asyncio = tasks.map(|read| match read {
            Ok(list) => AsyncioTasks { tasks: list.tasks, cut: list.cut, error: None },
            Err(why) => AsyncioTasks { tasks: Vec::new(), cut: false, error: Some(why) },
        });
        DumpReport { kind: super::ReportKind::Dump, pid, python: PythonInfo { version, mode: "dump".into() }, threads, thread_names: name_source, asyncio }
    }

    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    pub fn to_table(&self) -> String {
        let mut out = format!("pytrace dump: PID {}, Python {}, {}\n", self.pid, self.python.version, super::counted(self.threads.len() as u64, "thread"));
        for t in &self.threads {
            let os_name = if t.os_name != t.name { format!(", OS name {}", t.os_name) } else { String::new() };
            out += &format!("\nThread {} ({}{os_name}, {}):\n", t.tid, t.name, t.state);
            if let Some(task) = &t.task {
                out += &format!("    ({})\n", task.describe());
            }
            if t.frames.is_empty() {
                out += "    [no stack read]\n";
            }
            for f in &t.frames {
                out += &format!("    {}\n", label(f));
            }
        }
        if let Some(asyncio) = &self.asyncio {
            out += &asyncio.to_table();
        }
        let n = &self.thread_names;
        if let Some(why) = &n.failure {
            out += &format!("\nThread names are the kernel's: Python's could not be read ({why}).\n");
        } else if n.refused > 0 {
            let who = if n.refused == 1 { "thread keeps its" } else { "threads keep their" };
            out += &format!("\n{} {who} kernel name: their threading.Thread did not check out.\n", n.refused);
        }
        out
    }
}

impl AsyncioTasks {
    /// One line per pending task, by thread, as `python -m asyncio ps`.
    fn to_table(&self) -> String {
        if let Some(why) = &self.error {
            return format!("\nasyncio tasks: none read ({why}).\n");
        }
        let mut out = format!("\nasyncio tasks: {} pending{}\n", self.tasks.len(), if self.cut { " (a list was cut: more not shown)" } else { "" });
        if self.tasks.is_empty() {
            return out;
        }
        let rows: Vec<[String; 6]> = self
            .tasks
            .iter()
            .map(|t| {
                let awaiters = awaiter_words(&t.awaited_by, &t.awaited_by_several, t.more_awaiters);
                [
                    t.tid.map_or("exited".into(), |tid| tid.to_string()),
                    t.state.into(),
                    t.id.clone(),
                    t.name.clone().unwrap_or_else(|| "[unreadable]".into()),
                    t.coroutine.clone().unwrap_or_else(|| "?".into()),
                    awaiters,
                ]
            })
            .collect();
        let header = ["TID", "STATE", "ID", "NAME", "COROUTINE", "AWAITED BY"].map(String::from);
        let widths: Vec<usize> = (0..6).map(|i| rows.iter().chain([&header]).map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
        for row in [&header].into_iter().chain(rows.iter()) {
            let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            out += &format!("    {}\n", cells.join("  ").trim_end());
        }
        out
    }
}

/// A thread's state letter said in words ("exited" when it has).
fn state_words(code: Option<String>) -> String {
    let Some(code) = code else { return "exited".into() };
    match code.as_str() {
        "R" => "running".into(),
        "S" => "sleeping".into(),
        "D" => "waiting on disk".into(),
        "T" | "t" => "stopped".into(),
        "Z" => "exiting".into(),
        _ => code,
    }
}
