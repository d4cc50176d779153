//! The `dump` report: every thread's stack at one instant, innermost frame
//! first (as a traceback reads upside down, and as py-spy dump prints).

use std::collections::HashMap;

use serde::Serialize;
use serde_json::json;

use super::profile::label;
use super::PythonInfo;
use crate::model::samples::{Frame, Sample};
use crate::python::thread_names::NameSource;

#[derive(Serialize)]
pub struct ThreadStack {
    pub tid: u32,
    /// The thread's Python name (`threading.Thread.name`) where it could
    /// be read, else the kernel's.
    pub name: String,
    /// The thread's name as the kernel knows it (/proc/PID/task/TID/comm).
    pub os_name: String,
    /// What the kernel says it was doing when read: running, sleeping, …
    pub state: String,
    /// Innermost first.
    #[serde(serialize_with = "frames_json")]
    pub frames: Vec<std::rc::Rc<Frame>>,
}

fn frames_json<S: serde::Serializer>(frames: &[std::rc::Rc<Frame>], to: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = to.serialize_seq(Some(frames.len()))?;
    for f in frames {
        seq.serialize_element(&match f.as_ref() {
            Frame::Python { name, file, line, .. } => json!({"kind": "python", "name": name, "file": file, "line": line}),
            Frame::Native { name, module } => json!({"kind": "native", "name": name, "module": module}),
            Frame::Kernel(name) => json!({"kind": "kernel", "name": name}),
            other => json!({"kind": "marker", "name": label(other)}),
        })?;
    }
    seq.end()
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
}

#[derive(Serialize)]
pub struct DumpReport {
    pub pid: u32,
    pub python: PythonInfo,
    pub threads: Vec<ThreadStack>,
    /// How many names came from Python, and why none did if so.
    pub thread_names: NameSource,
}

impl DumpReport {
    /// The main thread (its TID is the PID) first, then by TID; each
    /// stack innermost first.
    pub fn of_snapshot(snapshot: Snapshot) -> Self {
        let Snapshot { pid, version, samples, os_names, names, name_source, states } = snapshot;
        let mut threads: Vec<ThreadStack> = samples
            .into_iter()
            .map(|s| {
                let state = state_words(states.get(&s.tid).cloned().flatten());
                let os_name = os_names.get(&s.tid).cloned().unwrap_or_else(|| "?".into());
                let name = names.get(&s.tid).cloned().unwrap_or_else(|| os_name.clone());
                ThreadStack { tid: s.tid, name, os_name, state, frames: s.frames.into_iter().rev().collect() }
            })
            .collect();
        threads.sort_by_key(|t| (t.tid != pid, t.tid));
        DumpReport { pid, python: PythonInfo { version, mode: "dump".into() }, threads, thread_names: name_source }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the report serializes") + "\n"
    }

    pub fn to_table(&self) -> String {
        let mut out = format!("pytrace dump: PID {}, Python {}, {}\n", self.pid, self.python.version, super::counted(self.threads.len() as u64, "thread"));
        for t in &self.threads {
            let os_name = if t.os_name != t.name { format!(", OS name {}", t.os_name) } else { String::new() };
            out += &format!("\nThread {} ({}{os_name}, {}):\n", t.tid, t.name, t.state);
            if t.frames.is_empty() {
                out += "    [no stack read]\n";
            }
            for f in &t.frames {
                out += &format!("    {}\n", label(f));
            }
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
