//! sample's JSON report (what `compare --sampled` reads).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{FunctionShare, Profile};
use crate::model::counters::Counters;
use crate::report::{PythonInfo, ReportKind};

/// `pytrace sample --json`, field for field (docs/schema/sample.json).
#[derive(Serialize, schemars::JsonSchema)]
pub struct SampleReport<'a> {
    pub kind: ReportKind,
    pub pid: u32,
    pub python: &'a PythonInfo,
    pub hz: u64,
    pub duration_ns: u64,
    pub samples: u64,
    /// The BPF program's run time per sample (with kernel.bpf_stats_enabled).
    pub bpf_ns_per_sample: Option<u64>,
    /// The CPU time the target used while sampled, by the kernel's accounting.
    pub cpu_ns: Option<u64>,
    pub lost_events: u64,
    pub counters: &'a Counters,
    pub functions: Vec<FunctionShare>,
    /// Samples per named thread (with thread names on).
    pub threads: Vec<ThreadSamples<'a>>,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct ThreadSamples<'a> {
    pub thread: &'a str,
    pub samples: u64,
}

impl Profile {
    pub fn to_json(&self) -> String {
        let threads: BTreeMap<&str, u64> = self.stacks.iter().fold(BTreeMap::new(), |mut m, ((t, _), n)| {
            *m.entry(t.as_str()).or_default() += n;
            m
        });
        crate::report::to_json_text(&SampleReport {
            kind: ReportKind::Sample,
            pid: self.pid,
            python: &self.python,
            hz: self.hz,
            duration_ns: self.duration_ns,
            samples: self.total,
            bpf_ns_per_sample: self.bpf_ns_per_sample,
            cpu_ns: self.cpu_ns,
            lost_events: self.lost(),
            counters: &self.counters,
            functions: self.functions(),
            threads: threads.into_iter().filter(|(t, _)| !t.is_empty()).map(|(thread, samples)| ThreadSamples { thread, samples }).collect(),
        })
    }
}
