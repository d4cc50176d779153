//! sample's profile for OpenTelemetry's profiles signal (OTLP proto
//! v1.10.0, `v1development`): one `ExportProfilesServiceRequest` holding
//! one profile and its dictionary, encoded with the OpenTelemetry project's
//! own generated messages (the opentelemetry-proto crate).
//!
//! Frames map as for pprof (pprof.rs): a function per Python function
//! (name, file, first line), a location per frame as sampled, a mapping
//! per kind of code. Every dictionary table starts with its zero entry, as
//! the protocol requires; stacks are leaf first.

use std::collections::HashMap;
use std::rc::Rc;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::Profile;
use crate::model::samples::Frame;

/// A resource attribute's value.
pub enum Attribute {
    Text(String),
    Int(i64),
}

#[derive(Default)]
struct Dictionary {
    table: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<String, i32>,
    functions: HashMap<(i32, i32, i64), i32>,
    locations: HashMap<Rc<Frame>, i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl Dictionary {
    fn new() -> Self {
        let mut d = Dictionary::default();
        d.string("");
        d.table.mapping_table.push(otlp::Mapping::default());
        d.table.location_table.push(otlp::Location::default());
        d.table.function_table.push(otlp::Function::default());
        d.table.link_table.push(otlp::Link::default());
        d.table.attribute_table.push(otlp::KeyValueAndUnit::default());
        d.table.stack_table.push(otlp::Stack::default());
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.table.string_table.len() as i32;
        self.table.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn mapping(&mut self, file: &str) -> i32 {
        if let Some(&i) = self.mappings.get(file) {
            return i;
        }
        let i = self.table.mapping_table.len() as i32;
        let filename_strindex = self.string(file);
        self.table.mapping_table.push(otlp::Mapping { filename_strindex, ..Default::default() });
        self.mappings.insert(file.to_string(), i);
        i
    }

    /// A function; Python ones get no system name (as in pprof.rs).
    fn function(&mut self, name: &str, file: &str, start_line: u32, python: bool) -> i32 {
        let key = (self.string(name), self.string(file), start_line as i64);
        if let Some(&i) = self.functions.get(&key) {
            return i;
        }
        let i = self.table.function_table.len() as i32;
        let system_name_strindex = if python { 0 } else { key.0 };
        self.table.function_table.push(otlp::Function { name_strindex: key.0, system_name_strindex, filename_strindex: key.1, start_line: key.2 });
        self.functions.insert(key, i);
        i
    }

    fn location(&mut self, frame: &Rc<Frame>) -> i32 {
        if let Some(&i) = self.locations.get(frame) {
            return i;
        }
        let (mapping_index, function_index, line) = match frame.as_ref() {
            Frame::Python { name, file, line, first_line } => (self.mapping("[python]"), self.function(name, file, *first_line, true), *line as i64),
            Frame::Native { name, module } => (self.mapping(module), self.function(name, module, 0, false), 0),
            Frame::Kernel(name) => (self.mapping("[kernel.kallsyms]"), self.function(name, "", 0, false), 0),
            Frame::Process(name) => (self.mapping("[process]"), self.function(name, "", 0, false), 0),
            marker => (self.mapping("[pytrace]"), self.function(&super::label(marker), "", 0, false), 0),
        };
        let i = self.table.location_table.len() as i32;
        self.table.location_table.push(otlp::Location { mapping_index, lines: vec![otlp::Line { function_index, line, column: 0 }], ..Default::default() });
        self.locations.insert(frame.clone(), i);
        i
    }

    /// A stack, leaf first.
    fn stack(&mut self, frames: &[Rc<Frame>]) -> i32 {
        let location_indices: Vec<i32> = frames.iter().rev().map(|f| self.location(f)).collect();
        if let Some(&i) = self.stacks.get(&location_indices) {
            return i;
        }
        let i = self.table.stack_table.len() as i32;
        self.table.stack_table.push(otlp::Stack { location_indices: location_indices.clone() });
        self.stacks.insert(location_indices, i);
        i
    }
}

impl Profile {
    /// The request an OTLP profiles endpoint takes, encoded: this profile
    /// (sample counts, the period in `time`: "cpu", or "wall" for every
    /// thread's samples) over the window that began at `start_unix_ns`,
    /// under a resource with `resource` attributes.
    pub fn to_otlp(&self, time: &str, start_unix_ns: i64, resource: &[(String, Attribute)]) -> Vec<u8> {
        let mut d = Dictionary::new();
        let samples = self
            .stacks
            .iter()
            .map(|((_, frames), &n)| otlp::Sample { stack_index: d.stack(frames), values: vec![n as i64], ..Default::default() })
            .collect();
        let sample_type = Some(otlp::ValueType { type_strindex: d.string("samples"), unit_strindex: d.string("count") });
        let period_type = Some(otlp::ValueType { type_strindex: d.string(time), unit_strindex: d.string("nanoseconds") });
        let profile = otlp::Profile {
            sample_type,
            samples,
            time_unix_nano: start_unix_ns.max(0) as u64,
            duration_nano: self.duration_ns,
            period_type,
            period: (1_000_000_000 / self.hz.max(1)) as i64,
            ..Default::default()
        };
        let attributes = resource
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    Attribute::Text(s) => any_value::Value::StringValue(s.clone()),
                    Attribute::Int(i) => any_value::Value::IntValue(*i),
                };
                KeyValue { key: key.clone(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
            })
            .collect();
        let scope = InstrumentationScope { name: "pytrace".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
        let request = ExportProfilesServiceRequest {
            resource_profiles: vec![otlp::ResourceProfiles {
                resource: Some(Resource { attributes, ..Default::default() }),
                scope_profiles: vec![otlp::ScopeProfiles { scope: Some(scope), profiles: vec![profile], ..Default::default() }],
                ..Default::default()
            }],
            dictionary: Some(d.table),
        };
        request.encode_to_vec()
    }
}
