//! pprof's profile format (profile.proto, gzipped): what Go's pprof,
//! Pyroscope, Parca, Grafana and the other continuous profilers read.
//!
//! The messages are declared here with prost's derive, field numbers as
//! profile.proto publishes them, and prost encodes them: no protoc at build
//! time, and only the fields pytrace fills. Strings are indices into one
//! table whose entry 0 is "".
//!
//! How pytrace's frames map onto pprof's: a *function* per Python function
//! (name, file, first line: lines merged, as `calls` counts them), per
//! native symbol and per kernel symbol; a *location* per frame as sampled
//! (a Python function at one line); a *mapping* per kind of code, which is
//! how pprof users tell frames apart (`-focus`, `-show_from`, the graph's
//! colours): "[python]" for Python frames, the module's file for native
//! frames, "[kernel.kallsyms]" for the kernel's (the name perf and the
//! eBPF profilers give it), "[pytrace]" for pytrace's markers
//! ("[truncated]", "[no Python code]", …).

use std::collections::HashMap;
use std::io::Write;
use std::rc::Rc;

use anyhow::{Context, Result};
use prost::Message;

use crate::model::samples::Frame;

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
    #[prost(int64, repeated, tag = "13")]
    comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
    #[prost(bool, tag = "8")]
    has_filenames: bool,
    #[prost(bool, tag = "9")]
    has_line_numbers: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
    #[prost(int64, tag = "5")]
    start_line: i64,
}

/// One stack as the report holds it: thread label ("" for none), frames
/// outermost first, and its values, one per `PprofInput::value_types`.
pub struct StackValues<'a> {
    pub thread: &'a str,
    pub frames: &'a [Rc<Frame>],
    pub values: Vec<i64>,
}

/// A whole profile for pprof: what its values measure, (type, unit) each,
/// the last being the default; the stacks; the sampling period, if
/// sampled; when and how long it ran; lines worth keeping with it (what was
/// dropped).
pub struct PprofInput<'a> {
    pub value_types: Vec<(&'static str, &'static str)>,
    pub stacks: Vec<StackValues<'a>>,
    /// (type, unit, period): "cpu", "nanoseconds", 1e9 / rate.
    pub period: Option<(&'static str, &'static str, i64)>,
    pub start_unix_ns: i64,
    pub duration_ns: u64,
    pub comments: Vec<String>,
}

/// Builds the string, function, location and mapping tables once each.
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<Function>,
    function_ids: HashMap<(i64, i64, i64), u64>,
    locations: Vec<Location>,
    location_ids: HashMap<Rc<Frame>, u64>,
    mappings: Vec<Mapping>,
    mapping_ids: HashMap<String, u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    fn mapping(&mut self, file: &str, has_lines: bool) -> u64 {
        if let Some(&id) = self.mapping_ids.get(file) {
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let filename = self.string(file);
        self.mappings.push(Mapping { id, filename, has_functions: true, has_filenames: has_lines, has_line_numbers: has_lines });
        self.mapping_ids.insert(file.to_string(), id);
        id
    }

    /// A function; `python` ones get no system name: pprof demangles a
    /// function whose name equals its system name as C++, which cuts
    /// `<module>`, `<lambda>` and `f.<locals>.g` at their angle brackets.
    fn function(&mut self, name: &str, file: &str, start_line: u32, python: bool) -> u64 {
        let key = (self.string(name), self.string(file), start_line as i64);
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let system_name = if python { 0 } else { key.0 };
        self.functions.push(Function { id, name: key.0, system_name, filename: key.1, start_line: key.2 });
        self.function_ids.insert(key, id);
        id
    }

    fn location(&mut self, frame: &Rc<Frame>) -> u64 {
        if let Some(&id) = self.location_ids.get(frame) {
            return id;
        }
        let (mapping_id, function_id, line) = match frame.as_ref() {
            Frame::Python { name, file, line, first_line } => {
                (self.mapping("[python]", true), self.function(name, file, *first_line, true), *line as i64)
            }
            Frame::Native { name, module } => (self.mapping(module, false), self.function(name, module, 0, false), 0),
            Frame::Kernel(name) => (self.mapping("[kernel.kallsyms]", false), self.function(name, "", 0, false), 0),
            // With --all, the process is the root frame; it has no code.
            Frame::Process(name) => (self.mapping("[process]", false), self.function(name, "", 0, false), 0),
            marker => (self.mapping("[pytrace]", false), self.function(&super::profile::label(marker), "", 0, false), 0),
        };
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location { id, mapping_id, line: vec![Line { function_id, line }] });
        self.location_ids.insert(frame.clone(), id);
        id
    }
}

/// When a run of `duration_ns` that ends now began, in ns since the epoch.
pub fn unix_ns_ago(duration_ns: u64) -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
    now - duration_ns as i64
}

/// The profile, encoded and gzipped.
pub fn encode(input: &PprofInput) -> Result<Vec<u8>> {
    let mut b = Builder::default();
    b.string("");
    let sample_type: Vec<ValueType> = input.value_types.iter().map(|(t, u)| ValueType { r#type: b.string(t), unit: b.string(u) }).collect();
    let period_type = input.period.map(|(t, u, _)| ValueType { r#type: b.string(t), unit: b.string(u) });
    let thread_key = b.string("thread");
    let mut samples = Vec::with_capacity(input.stacks.len());
    for stack in &input.stacks {
        let location_id = stack.frames.iter().rev().map(|f| b.location(f)).collect();
        let label = if stack.thread.is_empty() { Vec::new() } else { vec![Label { key: thread_key, str: b.string(stack.thread), num: 0 }] };
        samples.push(Sample { location_id, value: stack.values.clone(), label });
    }
    let comment = input.comments.iter().map(|c| b.string(c)).collect();
    let default_sample_type = sample_type.last().map_or(0, |t| t.r#type);
    let profile = Profile {
        sample_type,
        sample: samples,
        mapping: b.mappings,
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
        time_nanos: input.start_unix_ns,
        duration_nanos: input.duration_ns as i64,
        period_type,
        period: input.period.map_or(0, |p| p.2),
        comment,
        default_sample_type,
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec()).context("failed to compress the pprof profile")?;
    gz.finish().context("failed to compress the pprof profile")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> Profile {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut raw).unwrap();
        Profile::decode(raw.as_slice()).unwrap()
    }

    fn py(name: &str, line: u32) -> Rc<Frame> {
        Rc::new(Frame::Python { name: name.into(), file: "app.py".into(), line, first_line: 10 })
    }

    /// Two lines of one function are two locations of one function; the
    /// leaf comes first; values and period are kept.
    #[test]
    fn frames_become_functions_locations_and_mappings_once() {
        let root = py("main", 12);
        let (a, b) = (py("work", 20), py("work", 21));
        let native = Rc::new(Frame::Native { name: "deflate".into(), module: "/usr/lib/libz.so.1".into() });
        let first = [root.clone(), a.clone()];
        let second = [root.clone(), b.clone(), native.clone()];
        let input = PprofInput {
            value_types: vec![("samples", "count"), ("cpu", "nanoseconds")],
            stacks: vec![
                StackValues { thread: "", frames: &first, values: vec![3, 30_000_000] },
                StackValues { thread: "worker (7)", frames: &second, values: vec![2, 20_000_000] },
            ],
            period: Some(("cpu", "nanoseconds", 10_000_000)),
            start_unix_ns: 1,
            duration_ns: 2,
            comments: vec!["dropped: none".into()],
        };
        let p = decode(&encode(&input).unwrap());
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample.len(), 2);
        assert_eq!(p.sample[0].value, vec![3, 30_000_000]);
        assert_eq!(p.period, 10_000_000);
        // main and work (Python), deflate (native).
        assert_eq!(p.function.len(), 3);
        assert_eq!(p.location.len(), 4);
        let leaf = &p.location[(p.sample[1].location_id[0] - 1) as usize];
        let mapping = &p.mapping[(leaf.mapping_id - 1) as usize];
        assert_eq!(s(mapping.filename), "/usr/lib/libz.so.1");
        assert_eq!(s(p.function[(leaf.line[0].function_id - 1) as usize].name), "deflate");
        let label = &p.sample[1].label[0];
        assert_eq!((s(label.key), s(label.str)), ("thread", "worker (7)"));
        assert_eq!(s(p.comment[0]), "dropped: none");
        assert_eq!(s(p.default_sample_type), "cpu");
    }
}
