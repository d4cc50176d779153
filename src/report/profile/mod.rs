//! The `sample` reports: a top-functions table, folded stacks, a
//! flamegraph, a speedscope profile, pprof and JSON, all from one aggregation,
//! one module per format; a new format is a module and a `Format`.

mod flamegraph;
mod folded;
mod json;
mod outputs;
mod pprof;
mod speedscope;
mod table;
pub mod otlp;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use anyhow::Result;
use serde::Serialize;

use crate::model::counters::Counters;
use crate::model::samples::{Frame, Sample};

pub use json::SampleReport;
pub use outputs::Outputs;

/// The formats `sample` writes a profile in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The top `top` functions, for a terminal.
    Table,
    Folded,
    Flamegraph,
    Speedscope,
    /// pprof's gzipped profile.proto; `wall` for --idle's samples (wall
    /// time), on-CPU time otherwise.
    Pprof { wall: bool },
    Json,
}

impl Format {
    pub fn render(self, profile: &Profile, top: usize) -> Result<Vec<u8>> {
        Ok(match self {
            Format::Table => profile.to_table(top).into_bytes(),
            Format::Folded => profile.to_folded(false).into_bytes(),
            Format::Flamegraph => profile.to_flamegraph()?,
            Format::Speedscope => profile.to_speedscope().into_bytes(),
            Format::Pprof { wall } => profile.to_pprof(if wall { "wall" } else { "cpu" })?,
            Format::Json => profile.to_json().into_bytes(),
        })
    }
}

/// Samples aggregated into unique stacks (outermost frame first).
pub struct Profile {
    pub pid: u32,
    pub python: super::PythonInfo,
    pub hz: u64,
    pub duration_ns: u64,
    pub counters: Counters,
    pub total: u64,
    /// The BPF program's run time per sample (with kernel.bpf_stats_enabled).
    pub bpf_ns_per_sample: Option<u64>,
    /// The CPU time the target used while sampled, from the kernel's own
    /// accounting (src/session): what the samples estimate, known exactly.
    pub cpu_ns: Option<u64>,
    /// (thread label or "", stack) -> samples.
    stacks: BTreeMap<(String, Vec<Rc<Frame>>), u64>,
    /// How folded stacks, the flamegraph and speedscope name Python frames.
    pub view: FrameView,
    /// What each stack's count is: samples, or (`memory`) bytes.
    pub weight: Weight,
}

/// What a profile's counts measure, for the formats that name it: the
/// flamegraph's title and tooltips, speedscope's unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Weight {
    #[default]
    Samples,
    /// `memory`'s bytes live at the end of the run, per stack.
    LiveBytes,
}

impl Weight {
    /// The command that measured it, for titles.
    fn command(self) -> &'static str {
        match self {
            Weight::Samples => "sample",
            Weight::LiveBytes => "memory",
        }
    }

    /// The total, said in its unit: "1,234 samples", "12,345,678 bytes live".
    fn counted(self, total: u64) -> String {
        match self {
            Weight::Samples => crate::report::counted(total, "sample"),
            Weight::LiveBytes => format!("{} bytes live", crate::report::thousands(total)),
        }
    }

    /// inferno's name for a count ("samples" in each frame's tooltip).
    fn count_name(self) -> &'static str {
        match self {
            Weight::Samples => "samples",
            Weight::LiveBytes => "bytes",
        }
    }

    /// speedscope's unit for the weights.
    fn speedscope_unit(self) -> &'static str {
        match self {
            Weight::Samples => "none",
            Weight::LiveBytes => "bytes",
        }
    }
}

/// How the stack formats name a Python frame. By default one frame per
/// function, its file shortened: a request handler spread over four lines
/// is one block of a flamegraph, not four, and a label cut to fit keeps
/// the function's name.
#[derive(Debug, Clone, Default)]
pub struct FrameView {
    /// A frame per line running (`--lines`), not per function.
    pub lines: bool,
    /// Files as the code object names them (`--full-paths`).
    pub full_paths: bool,
    /// The target's working directory: its own files are shown relative to it.
    pub cwd: Option<String>,
}

impl FrameView {
    /// `name (file:line)` with --lines, `name (file)` otherwise; other
    /// frames as `label` names them.
    pub fn label(&self, frame: &Frame) -> String {
        match frame {
            Frame::Python { name, file, line, .. } => {
                let file = if self.full_paths { file.clone() } else { short_path(file, self.cwd.as_deref()) };
                if self.lines {
                    format!("{name} ({file}:{line})")
                } else {
                    format!("{name} ({file})")
                }
            }
            other => label(other),
        }
    }
}

/// A source file as a reader knows it: a library's file from its import
/// root (`requests/sessions.py`, as after site-packages or dist-packages),
/// the standard library's from its own (`http/server.py`), the program's
/// own relative to its working directory; anything else unchanged.
pub fn short_path(file: &str, cwd: Option<&str>) -> String {
    for root in ["/site-packages/", "/dist-packages/"] {
        if let Some(at) = file.rfind(root) {
            return file[at + root.len()..].to_string();
        }
    }
    // .../lib/python3.11/ or .../lib/python3.13t/: the standard library.
    if let Some(at) = file.find("/lib/python3.") {
        let rest = &file[at + "/lib/python3.".len()..];
        if let Some(slash) = rest.find('/') {
            if rest[..slash].trim_end_matches('t').chars().all(|c| c.is_ascii_digit()) && slash > 0 {
                return rest[slash + 1..].to_string();
            }
        }
    }
    if let Some(cwd) = cwd.filter(|c| c.len() > 1) {
        if let Some(rest) = file.strip_prefix(cwd).and_then(|r| r.strip_prefix('/')) {
            return rest.to_string();
        }
    }
    file.to_string()
}

pub fn label(frame: &Frame) -> String {
    match frame {
        Frame::Python { name, file, line, .. } => format!("{name} ({file}:{line})"),
        Frame::Native { name, module } => format!("{name} ({module})"),
        Frame::Kernel(name) => name.clone(),
        Frame::Unreadable => "[unreadable frame]".into(),
        Frame::Unsettled => "[stack not read: it changed under every read]".into(),
        Frame::Truncated => "[truncated]".into(),
        Frame::NoPython => "[no Python code]".into(),
        Frame::NativeThread => "[thread started by native code]".into(),
        Frame::Process(name) => name.clone(),
        Frame::ThreadState(state) | Frame::AsyncTask(state) => format!("[{state}]"),
        Frame::Probes => "[pytrace probes]".into(),
        Frame::NativeIncomplete => "[native stack incomplete]".into(),
        Frame::NativeUnmatched => "[native stack unmatched]".into(),
        Frame::NativeUnavailable => "[native stack unavailable]".into(),
    }
}

/// A function with where it is, for a table: `name (file:line)` for
/// Python's; a native function has no line (0), so `name (module)`, or
/// just the name where it already says the module (`libc.so.6+0x85e50`,
/// an unnamed function); a marker, no file, is its name alone.
pub fn named_in(name: &str, file: &str, line: u32) -> String {
    match (file, line) {
        ("", _) => name.to_string(),
        (file, 0) if name.strip_prefix(file).is_some_and(|rest| rest.starts_with('+')) => name.to_string(),
        (file, 0) => format!("{name} ({file})"),
        (file, line) => format!("{name} ({file}:{line})"),
    }
}

/// The function a frame belongs to, for the table: lines merged, functions
/// told apart by name, file and first line (as `calls` does). Other
/// frames have no file and line 0.
fn function_of(frame: &Frame) -> (String, String, u32) {
    match frame {
        Frame::Python { name, file, first_line, .. } => (name.clone(), file.clone(), *first_line),
        Frame::Native { name, module } => (name.clone(), module.clone(), 0),
        other => (label(other), String::new(), 0),
    }
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct FunctionShare {
    pub name: String,
    pub file: String,
    /// The function's first line (0 for frames that are not Python's).
    pub line: u32,
    pub self_samples: u64,
    pub total_samples: u64,
    pub self_share: f64,
    pub total_share: f64,
}

impl Profile {
    pub fn new(
        pid: u32,
        python: super::PythonInfo,
        hz: u64,
        duration_ns: u64,
        counters: Counters,
        samples: &[Sample],
        thread_names: Option<&HashMap<u32, String>>,
    ) -> Self {
        let mut stacks = BTreeMap::new();
        for s in samples {
            let thread = match thread_names {
                Some(names) => match names.get(&s.tid) {
                    Some(name) => format!("{name} ({})", s.tid),
                    None => format!("thread {} of {}", s.tid, s.pid),
                },
                None => String::new(),
            };
            *stacks.entry((thread, s.frames.clone())).or_insert(0) += s.count;
        }
        let total = samples.iter().map(|s| s.count).sum();
        Profile { pid, python, hz, duration_ns, counters, total, bpf_ns_per_sample: None, cpu_ns: None, stacks, view: FrameView::default(), weight: Weight::Samples }
    }

    /// Self and total samples per function, most total first.
    pub fn functions(&self) -> Vec<FunctionShare> {
        let mut shares: HashMap<(String, String, u32), (u64, u64)> = HashMap::new();
        for ((_, stack), &n) in &self.stacks {
            let mut seen = HashSet::new();
            for frame in stack {
                let f = function_of(frame);
                if seen.insert(f.clone()) {
                    shares.entry(f).or_default().1 += n;
                }
            }
            if let Some(leaf) = stack.last() {
                shares.entry(function_of(leaf)).or_default().0 += n;
            }
        }
        let total = self.total.max(1) as f64;
        let mut out: Vec<FunctionShare> = shares
            .into_iter()
            .map(|((name, file, line), (s, t))| FunctionShare {
                name,
                file,
                line,
                self_samples: s,
                total_samples: t,
                self_share: s as f64 / total,
                total_share: t as f64 / total,
            })
            .collect();
        out.sort_by(|a, b| {
            b.total_samples.cmp(&a.total_samples).then(b.self_samples.cmp(&a.self_samples)).then(a.name.cmp(&b.name)).then(a.line.cmp(&b.line))
        });
        out
    }

    /// What was sampled, for titles: one process, or all (pid 0).
    fn subject(&self) -> String {
        if self.pid == 0 {
            "every CPython process".into()
        } else {
            format!("PID {}, Python {}", self.pid, self.python.version)
        }
    }

    /// Samples taken but not in the profile, whatever dropped them.
    fn lost(&self) -> u64 {
        self.counters.lost()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_functions_have_no_line_and_say_their_module_once() {
        assert_eq!(named_in("leaf", "app.py", 12), "leaf (app.py:12)");
        assert_eq!(named_in("deflate", "libz.so.1", 0), "deflate (libz.so.1)");
        assert_eq!(named_in("libc.so.6+0x85e50", "libc.so.6", 0), "libc.so.6+0x85e50");
        assert_eq!(named_in("[native stack incomplete]", "", 0), "[native stack incomplete]");
    }

    fn py(name: &str, line: u32) -> Rc<Frame> {
        Rc::new(Frame::Python { name: name.into(), file: "f.py".into(), line, first_line: 1 })
    }

    fn profile() -> Profile {
        let main = py("main", 1);
        let samples = vec![
            Sample { pid: 7, tid: 1, frames: vec![main.clone(), py("a", 5)], count: 1 },
            Sample { pid: 7, tid: 1, frames: vec![main.clone(), py("a", 6)], count: 1 },
            Sample { pid: 7, tid: 2, frames: vec![main.clone(), py("b", 9)], count: 1 },
            Sample { pid: 7, tid: 2, frames: vec![main.clone()], count: 1 },
        ];
        let info = crate::report::PythonInfo { version: "3.11.2".into(), mode: "sample".into() };
        Profile::new(7, info, 99, 1, Default::default(), &samples, None)
    }

    #[test]
    fn paths_are_shortened_to_where_a_reader_knows_them_from() {
        let cwd = Some("/srv/app");
        assert_eq!(short_path("/usr/lib/python3/dist-packages/requests/sessions.py", cwd), "requests/sessions.py");
        assert_eq!(short_path("/venv/lib/python3.12/site-packages/flask/app.py", cwd), "flask/app.py");
        assert_eq!(short_path("/usr/lib/python3.11/http/server.py", cwd), "http/server.py");
        assert_eq!(short_path("/opt/py/lib/python3.13t/json/decoder.py", cwd), "json/decoder.py");
        assert_eq!(short_path("/srv/app/handlers/users.py", cwd), "handlers/users.py");
        assert_eq!(short_path("/srv/application/x.py", cwd), "/srv/application/x.py", "a prefix, not a directory");
        assert_eq!(short_path("<frozen importlib._bootstrap>", cwd), "<frozen importlib._bootstrap>");
        assert_eq!(short_path("/home/u/lib/python3.x/mine.py", None), "/home/u/lib/python3.x/mine.py");
    }

    #[test]
    fn shares_merge_lines_and_count_each_function_once_per_stack() {
        let f = profile().functions();
        let get = |n: &str| f.iter().find(|x| x.name == n).unwrap();
        assert_eq!((get("main").self_samples, get("main").total_samples), (1, 4));
        assert_eq!((get("a").self_samples, get("a").total_samples), (2, 2), "lines 5 and 6 are one function");
        assert!((get("b").total_share - 0.25).abs() < 1e-9);
    }

    #[test]
    fn folded_output_is_outermost_first_with_counts() {
        // By default a frame is a function: lines 5 and 6 of `a` are one.
        let folded = profile().to_folded(false);
        assert!(folded.contains("main (f.py);a (f.py) 2\n"), "{folded}");
        assert!(folded.contains("main (f.py) 1\n"), "{folded}");
        let annotated = profile().to_folded(true);
        assert!(annotated.contains("main (f.py)_[j];b (f.py)_[j] 1"), "{annotated}");
        let mut by_line = profile();
        by_line.view.lines = true;
        let folded = by_line.to_folded(false);
        assert!(folded.contains("main (f.py:1);a (f.py:5) 1\n") && folded.contains("main (f.py:1);a (f.py:6) 1\n"), "{folded}");
    }

    /// The flamegraph tells kinds apart by colour: inferno's java palette
    /// reads these suffixes (Python green, native aqua, kernel orange).
    #[test]
    fn frames_are_annotated_with_their_kind() {
        let stack = vec![
            py("main", 1),
            Rc::new(Frame::Native { name: "deflate".into(), module: "libz.so.1".into() }),
            Rc::new(Frame::Kernel("do_syscall_64".into())),
            Rc::new(Frame::NativeIncomplete),
        ];
        let info = crate::report::PythonInfo { version: "3.11.2".into(), mode: "sample".into() };
        let p = Profile::new(7, info, 99, 1, Default::default(), &[Sample { pid: 7, tid: 1, frames: stack, count: 1 }], None);
        assert_eq!(p.to_folded(true), "main (f.py)_[j];deflate (libz.so.1)_[i];do_syscall_64_[k];[native stack incomplete] 1\n");
        let f = p.functions();
        assert!(f.iter().any(|x| x.name == "deflate" && x.file == "libz.so.1" && x.self_samples == 0 && x.total_samples == 1));
    }

    #[test]
    fn speedscope_and_flamegraph_are_well_formed() {
        let p = profile();
        let v: serde_json::Value = serde_json::from_str(&p.to_speedscope()).unwrap();
        assert_eq!(v["profiles"][0]["type"], "sampled");
        assert_eq!(v["profiles"][0]["weights"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()).sum::<u64>(), 4);
        let svg = String::from_utf8(p.to_flamegraph().unwrap()).unwrap();
        assert!(svg.starts_with("<?xml") && svg.contains("<svg") && svg.contains("main (f.py)"));
    }
}
