//! compare's inputs: what it reads of a `calls --json` and a `sample
//! --json` report, with one sentence for each way a file can be wrong, and
//! the same from a live run's reports in memory.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};
use serde::Deserialize;

use crate::model::functions::{CallsData, Function};
use crate::model::hook::HookOutcome;
use crate::report::calls::{CallsReport, SortKey};
use crate::report::profile::Profile;
use crate::report::{PythonInfo, ReportKind};
use crate::tracing::calls::Mode;
use crate::tracing::sample::SampleData;

/// What a live run (src/session/compare.rs) gathered with both programs
/// over the same time, and about what.
pub struct TracedAndSampled {
    pub pid: u32,
    pub version: String,
    /// How calls saw the calls.
    pub mode: Mode,
    pub hz: u64,
    pub elapsed_ns: u64,
    pub calls: CallsData,
    /// Samples taken inside pytrace's probes are set apart.
    pub samples: SampleData,
    /// What happened to the eval-frame hook.
    pub hook: HookOutcome,
    /// The target's CPU time while traced (`Target::cpu_ns`).
    pub cpu_ns: Option<u64>,
    /// pytrace's exit code (`Target::exit_code`).
    pub exit_code: i32,
}

/// What compare reads of a `pytrace calls --json` report.
#[derive(Deserialize, Debug, PartialEq)]
pub struct TracedReport {
    pub pid: u32,
    pub python: PythonInfo,
    pub duration_ns: u64,
    pub lost_events: u64,
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    pub functions: Vec<Function>,
    /// Whether the functions carry child_calls, outermost_calls and
    /// nested_calls (reports written before `compare` existed do not):
    /// without them no correction for the probes' cost is made.
    #[serde(skip)]
    pub correctable: bool,
}

/// What compare reads of a `pytrace sample --json` report.
#[derive(Deserialize, Debug, PartialEq)]
pub struct SampledReport {
    pub pid: u32,
    pub python: PythonInfo,
    pub hz: u64,
    pub duration_ns: u64,
    pub samples: u64,
    pub lost_events: u64,
    /// The target's CPU time while sampled, measured (reports written
    /// before pytrace measured it lack it: off-CPU time is then estimated
    /// from the samples).
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    pub functions: Vec<SampledFunction>,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
pub struct SampledFunction {
    pub name: String,
    pub file: String,
    /// The first line; reports written before `compare` existed lack it,
    /// and are then matched by name and file only.
    pub line: Option<u32>,
    pub self_samples: u64,
    pub total_samples: u64,
}

/// Which pytrace subcommand wrote a JSON report: its `kind` field, or in
/// a report written before it had one, the fields only that subcommand writes.
fn kind_of(v: &serde_json::Value) -> &'static str {
    if let Some(kind) = v.get("kind") {
        return ReportKind::deserialize(kind).map_or("unknown", ReportKind::command);
    }
    let has = |k: &str| v.get(k).is_some();
    if has("overhead") && has("diff_against") {
        "`pytrace compare --json`"
    } else if has("hz") && has("samples") {
        "`pytrace sample --json`"
    } else if has("generations") {
        "`pytrace gc --json`"
    } else if has("imports") {
        "`pytrace imports --json`"
    } else if has("calls_mode") {
        "`pytrace info --json`"
    } else if has("functions") {
        "`pytrace calls --json`"
    } else {
        "unknown"
    }
}

/// The largest report compare reads. A calls report holds at most 16,384
/// functions (a few MiB); a sample report's stacks are bounded likewise;
/// parsing holds the text and its JSON tree at once, several times its size.
pub const MAX_REPORT_BYTES: u64 = 128 << 20;

/// Reads one report, checking it is the kind wanted ("`pytrace calls
/// --json`"), with one sentence for each way it can be wrong.
fn read_report<T: serde::de::DeserializeOwned>(path: &Path, want: &str, flag: &str) -> Result<(T, serde_json::Value)> {
    let bytes = crate::process::files::read_local_report(path, MAX_REPORT_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{} is not JSON (it is not UTF-8 text)", path.display()))?;
    parse_report(&text, &path.display().to_string(), want, flag)
}

/// The report, and its JSON for what the type does not say (which fields
/// an older pytrace did not write).
fn parse_report<T: serde::de::DeserializeOwned>(text: &str, name: &str, want: &str, flag: &str) -> Result<(T, serde_json::Value)> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| anyhow::anyhow!("{name} is not JSON ({e})"))?;
    match kind_of(&value) {
        kind if kind == want => {}
        "unknown" => bail!("{name} is not a pytrace report: {flag} needs a {want} report"),
        kind => bail!("{name} is a {kind} report, but {flag} needs a {want} report"),
    }
    let report = serde_json::from_str(text).map_err(|e| anyhow::anyhow!("{name} is not a complete {want} report ({e})"))?;
    Ok((report, value))
}

impl TracedReport {
    pub fn read(path: &Path) -> Result<Self> {
        Ok(Self::with_correctable(read_report(path, "`pytrace calls --json`", "--traced")?))
    }

    #[cfg(test)]
    pub fn parse(text: &str, name: &str) -> Result<Self> {
        Ok(Self::with_correctable(parse_report(text, name, "`pytrace calls --json`", "--traced")?))
    }

    fn with_correctable((mut report, json): (Self, serde_json::Value)) -> Self {
        let has_all = |f: &serde_json::Value| ["child_calls", "outermost_calls", "nested_calls"].iter().all(|k| f.get(k).is_some());
        report.correctable = json["functions"].as_array().is_none_or(|functions| functions.iter().all(has_all));
        report
    }
}

impl SampledReport {
    pub fn read(path: &Path) -> Result<Self> {
        Ok(read_report(path, "`pytrace sample --json`", "--sampled")?.0)
    }

    #[cfg(test)]
    pub fn parse(text: &str, name: &str) -> Result<Self> {
        Ok(parse_report(text, name, "`pytrace sample --json`", "--sampled")?.0)
    }
}

/// A live run's two reports: what `calls --json` and `sample --json`
/// would have written for the same time (what `--traced-json` and
/// `--sampled-json` save).
pub fn live_reports(run: TracedAndSampled) -> (CallsReport, Profile) {
    let python = |mode: &str| PythonInfo { version: run.version.clone(), mode: mode.into() };
    let traced = CallsReport::new(run.pid, python(run.mode.name()), run.elapsed_ns, run.calls, SortKey::Total).noting(Vec::new(), &run.hook);
    let samples = &run.samples;
    let mut profile = Profile::new(run.pid, python("sample"), run.hz, run.elapsed_ns, samples.counters.clone(), &samples.samples, None);
    profile.bpf_ns_per_sample = samples.bpf_ns_per_sample;
    profile.cpu_ns = run.cpu_ns;
    (traced, profile)
}

/// A live run's calls report, as compare would read it saved: the same
/// numbers, without the latencies it does not use.
impl From<&CallsReport> for TracedReport {
    fn from(r: &CallsReport) -> Self {
        let functions = r
            .functions
            .iter()
            .map(|row| {
                let mut f = row.function.clone();
                f.stats.latency = Default::default();
                f
            })
            .collect();
        TracedReport {
            pid: r.pid,
            python: r.python.clone(),
            duration_ns: r.duration_ns,
            lost_events: r.lost_events,
            counters: r.counters.iter().map(|c| (c.name.to_string(), c.value)).collect(),
            functions,
            correctable: true,
        }
    }
}

/// A live run's profile, as compare would read it saved.
impl From<&Profile> for SampledReport {
    fn from(p: &Profile) -> Self {
        let functions = p
            .functions()
            .into_iter()
            .map(|f| SampledFunction { name: f.name, file: f.file, line: Some(f.line), self_samples: f.self_samples, total_samples: f.total_samples })
            .collect();
        SampledReport { pid: p.pid, python: p.python.clone(), hz: p.hz, duration_ns: p.duration_ns, samples: p.total, lost_events: p.counters.lost(), cpu_ns: p.cpu_ns, functions }
    }
}
