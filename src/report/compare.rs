//! `pytrace compare`: a `calls` report (exact counts, wall-clock time per
//! call) and a `sample` report (CPU samples) of the same target, joined per
//! function (name, file and first line): the shares each gives, their
//! difference, the traced times with pytrace's own probe cost taken out, and
//! a flag wherever one side sees what the other cannot.
//!
//! Both reports are read as the JSON that `calls --json` and `sample --json`
//! write. A live `pytrace compare` writes its two reports the same way and
//! reads them back, so a saved pair (`--traced A --sampled B`) gives exactly
//! the result of the run that wrote it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::calls::CallsReport;
use super::profile::Profile;
use super::{human_ns, thousands, PythonInfo, ReportKind};
use crate::model::functions::{Function, FunctionStats};
use crate::model::samples::{Frame, Sample};

/// What one traced call costs when this run's samples cannot say (fewer
/// than MIN_PROBE_SAMPLES inside the probes). Measured on the development
/// machine (2 CPUs, a VM, Linux 6.18) on both local CPython 3.11 builds: a
/// loop calling a one-line function ran 2.02-2.29 µs a call slower under
/// `pytrace calls` than untraced (six runs), as scripts/bench.sh's 2.0-2.4.
pub const CONSTANT_NS_PER_CALL: u64 = 2_100;

/// The part of a call's probe cost inside the called function's timed
/// interval; the rest is in its caller's self time. (The entry probe takes
/// its timestamp after reading the frame, the return probe before closing
/// the call.) In the same six runs the one-line function's traced self time
/// was 0.80-0.92 µs a call, its caller's 1.26-1.41 µs a call: 39 %.
pub const CALLEE_SHARE: f64 = 0.4;

/// Fewer samples than this inside the probes (±10 % at one standard
/// error) and the cost per call is the constant instead.
pub const MIN_PROBE_SAMPLES: u64 = 100;

/// The name `set_apart_probe_samples` gives samples taken inside pytrace's probes.
pub const PROBES_ROW: &str = "[pytrace probes]";

/// A share difference is flagged beyond this many standard errors of the
/// sampled share, and at least MIN_FLAGGED_DIFF (a fraction, 1 point).
const SIGMAS: f64 = 3.0;
const MIN_FLAGGED_DIFF: f64 = 0.01;

/// Time off CPU above this share of the traced time is named where it
/// explains a sampled share above the traced one.
const OFF_CPU_NOTED: f64 = 0.1;

/// Probes making up at least this much of a function's traced self time
/// get it flagged (when its share is at least MIN_FLAGGED_DIFF).
const INFLATED: f64 = 0.25;

// ---------------------------------------------------------------- inputs

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

/// Reads one report, checking it is the kind wanted ("`pytrace calls
/// --json`"), with one sentence for each way it can be wrong.
fn read_report<T: serde::de::DeserializeOwned>(path: &Path, want: &str, flag: &str) -> Result<(T, serde_json::Value)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
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
        SampledReport { pid: p.pid, python: p.python.clone(), hz: p.hz, duration_ns: p.duration_ns, samples: p.total, lost_events: p.counters.lost(), functions }
    }
}

// ------------------------------------------------- samples in the probes

/// Whether a kernel function belongs to the uprobe machinery: the
/// breakpoint trap of an entry probe (`asm_exc_int3`, `do_int3_user`), the
/// return trampoline (`__x64_sys_uretprobe`) and their handlers, which run
/// the BPF program.
fn is_probe_frame(name: &str) -> bool {
    name.contains("uprobe") || name.contains("uretprobe") || name.contains("int3")
}

/// Sets apart the samples the sampler took while the target's thread was
/// inside one of pytrace's own probes (known by their kernel frames): each
/// becomes a single `[pytrace probes]` frame, so that the probes' time is
/// measured and counts for no Python function. Every other sample loses its
/// kernel frames: time the target spends in the kernel counts for the
/// Python function that entered it, as in `pytrace sample` without
/// --kernel. Returns how many samples were set apart.
pub fn set_apart_probe_samples(samples: &mut [Sample]) -> u64 {
    let probes = Rc::new(Frame::Probes);
    let mut set_apart = 0;
    for s in samples.iter_mut() {
        let in_probes = s.frames.iter().any(|f| matches!(f.as_ref(), Frame::Kernel(name) if is_probe_frame(name)));
        if in_probes {
            s.frames = vec![probes.clone()];
            set_apart += s.count;
        } else {
            s.frames.retain(|f| !matches!(f.as_ref(), Frame::Kernel(_)));
        }
    }
    set_apart
}

// --------------------------------------------------------------- output

#[derive(Serialize, Debug)]
pub struct Comparison {
    pub kind: ReportKind,
    pub pid: u32,
    pub python: PythonInfo,
    pub traced: TracedSummary,
    pub sampled: SampledSummary,
    pub overhead: Overhead,
    /// How rows of the two reports were matched.
    pub matched_by: &'static str,
    /// What the diffs subtract from the sampled shares: "corrected" traced
    /// shares, or "raw" ones when the calls report cannot be corrected.
    pub diff_against: &'static str,
    pub notes: Vec<String>,
    pub functions: Vec<Row>,
}

#[derive(Serialize, Debug)]
pub struct TracedSummary {
    pub duration_ns: u64,
    pub functions: usize,
    pub calls: u64,
    /// Frame evaluations the probes saw (calls, and generator creations
    /// cProfile does not count); each is one entry and one return probe.
    pub evaluations: u64,
    /// Every function's self time added up: the traced shares' denominator.
    pub self_ns: u64,
    pub corrected_self_ns: Option<u64>,
    /// Traced self time (corrected if it can be) minus the CPU time of the
    /// samples in Python code outside the probes: when positive, about the
    /// time spent off CPU (sleeping, waiting for I/O, a lock, the GIL or a
    /// CPU), which tracing counts and CPU sampling does not.
    pub off_cpu_ns: i64,
    pub lost_events: u64,
}

#[derive(Serialize, Debug)]
pub struct SampledSummary {
    pub duration_ns: u64,
    pub hz: u64,
    pub samples: u64,
    /// Samples taken inside pytrace's probes.
    pub probe_samples: u64,
    /// The others: the sampled shares' denominator.
    pub compared_samples: u64,
    pub lost_events: u64,
}

#[derive(Serialize, Debug)]
pub struct Overhead {
    /// "sampled": measured in this run, from the samples inside the probes;
    /// "constant": CONSTANT_NS_PER_CALL.
    pub source: &'static str,
    /// The estimate in a sentence, as the table says it.
    pub basis: String,
    pub ns_per_call: u64,
    /// Inside the called function's self time, and in its caller's.
    pub callee_ns_per_call: u64,
    pub caller_ns_per_call: u64,
    /// evaluations × ns_per_call, and what the samples in the probes measure.
    pub estimated_probe_ns: u64,
    pub sampled_probe_ns: u64,
    /// False when the calls report has no child_calls, outermost_calls
    /// and nested_calls (written before compare existed).
    pub corrected: bool,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Flag {
    pub kind: &'static str,
    pub message: String,
}

/// One function. Shares are fractions (0.25 is 25 %): traced ones of all
/// traced self time, sampled ones of the samples outside the probes. Traced
/// fields are null for what tracing cannot see (not Python code).
#[derive(Serialize, Debug)]
pub struct Row {
    pub name: String,
    pub file: String,
    pub line: u32,
    pub calls: Option<u64>,
    pub traced_total_share: Option<f64>,
    pub traced_self_share: Option<f64>,
    pub corrected_total_share: Option<f64>,
    pub corrected_self_share: Option<f64>,
    pub total_samples: u64,
    pub self_samples: u64,
    pub sampled_total_share: f64,
    pub sampled_self_share: f64,
    /// Sampled share minus the corrected (or raw) traced share.
    pub total_diff: Option<f64>,
    pub self_diff: Option<f64>,
    /// The samples the traced total share predicts.
    pub expected_total_samples: Option<f64>,
    pub flags: Vec<Flag>,
}

/// Self time without the probes: the callee part of each timed call, and
/// the caller part of each evaluation those calls entered.
fn corrected_self(t: &FunctionStats, o: &Overhead) -> Option<u64> {
    if !o.corrected {
        return None;
    }
    let probes = t.timed_calls * o.callee_ns_per_call + t.child_calls * o.caller_ns_per_call;
    Some(t.self_ns.saturating_sub(probes))
}

/// Total time without the probes: the callee part of each outermost call,
/// and the whole cost of every evaluation entered under it.
fn corrected_total(t: &FunctionStats, o: &Overhead) -> Option<u64> {
    if !o.corrected {
        return None;
    }
    let probes = t.outermost_calls * o.callee_ns_per_call + t.nested_calls * o.ns_per_call;
    Some(t.total_ns.saturating_sub(probes))
}

type Key = (String, String, Option<u32>);

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

impl Overhead {
    fn estimate(sampled: &SampledReport, probe_samples: u64, evaluations: u64, correctable: bool) -> Self {
        let sampled_probe_ns = (probe_samples as f64 * 1e9 / sampled.hz.max(1) as f64).round() as u64;
        let (source, ns_per_call, basis) = if probe_samples >= MIN_PROBE_SAMPLES && evaluations > 0 {
            let ns = (sampled_probe_ns as f64 / evaluations as f64).round() as u64;
            let basis = format!(
                "measured in this run: {} samples inside the probes at {} Hz ({}) over {} evaluations",
                thousands(probe_samples),
                sampled.hz,
                human_ns(sampled_probe_ns),
                thousands(evaluations)
            );
            ("sampled", ns, basis)
        } else {
            let basis = format!(
                "a constant measured on the development machine ({} samples inside the probes, too few to measure it here)",
                thousands(probe_samples)
            );
            ("constant", CONSTANT_NS_PER_CALL, basis)
        };
        let callee = (ns_per_call as f64 * CALLEE_SHARE).round() as u64;
        Overhead {
            source,
            basis,
            ns_per_call,
            callee_ns_per_call: callee,
            caller_ns_per_call: ns_per_call - callee,
            estimated_probe_ns: evaluations * ns_per_call,
            sampled_probe_ns,
            corrected: correctable,
        }
    }
}

impl Comparison {
    pub fn new(traced: &TracedReport, sampled: &SampledReport) -> Self {
        let mut notes = Vec::new();
        if traced.pid != sampled.pid {
            notes.push(format!(
                "the reports are of different processes (PID {} traced, PID {} sampled): the shares still compare, the probe measurement does not",
                traced.pid, sampled.pid
            ));
        }
        if traced.python.version != sampled.python.version {
            notes.push(format!(
                "the reports are of different Pythons ({} traced, {} sampled)",
                traced.python.version, sampled.python.version
            ));
        }
        if traced.lost_events > 0 {
            notes.push(format!("tracing lost {} events: some rows may be missing or low", thousands(traced.lost_events)));
        }
        if sampled.lost_events > 0 {
            notes.push(format!("sampling lost {} samples", thousands(sampled.lost_events)));
        }

        // Sampled rows: the probes' own row set apart.
        let probe_samples: u64 =
            sampled.functions.iter().filter(|f| f.name == PROBES_ROW && f.file.is_empty()).map(|f| f.self_samples).sum();
        let compared_samples = sampled.samples.saturating_sub(probe_samples);
        let by_line = sampled.functions.iter().all(|f| f.line.is_some() || f.file.is_empty());
        let matched_by = if by_line { "name, file and first line" } else { "name and file" };
        if !by_line {
            notes.push("the sample report has no first lines (written by an older pytrace): functions matched by name and file only".into());
        }
        let key_of = |name: &str, file: &str, line: u32| -> Key {
            let line = if file.is_empty() { Some(0) } else { by_line.then_some(line) };
            (name.to_string(), file.to_string(), line)
        };

        // Traced rows, merged by key (several code objects of one function
        // are one row already; merging only happens without first lines).
        let mut traced_rows: HashMap<Key, (FunctionStats, u32)> = HashMap::new();
        for f in &traced.functions {
            let entry = traced_rows.entry(key_of(&f.name, &f.file, f.line)).or_insert((FunctionStats::default(), f.line));
            entry.0.merge(&f.stats);
            entry.1 = entry.1.min(f.line);
        }
        let correctable = traced.correctable;
        if !correctable {
            notes.push(
                "the calls report has no child_calls, outermost_calls and nested_calls (written by an older pytrace): traced times are not corrected for the probes' cost"
                    .into(),
            );
        }
        let calls: u64 = traced.functions.iter().map(|f| f.stats.calls).sum();
        let evaluations = traced.counters.get("evaluations").copied().unwrap_or(calls);
        let overhead = Overhead::estimate(sampled, probe_samples, evaluations, correctable);

        let self_ns: u64 = traced_rows.values().map(|(t, _)| t.self_ns).sum();
        let corrected_self_ns: Option<u64> = traced_rows.values().map(|(t, _)| corrected_self(t, &overhead)).sum();
        let diff_against = if correctable { "corrected" } else { "raw" };

        let mut keys: Vec<Key> = traced_rows.keys().cloned().collect();
        let mut sampled_rows: HashMap<Key, (u64, u64)> = HashMap::new();
        for f in sampled.functions.iter().filter(|f| !(f.name == PROBES_ROW && f.file.is_empty())) {
            let key = key_of(&f.name, &f.file, f.line.unwrap_or(0));
            keys.push(key.clone());
            let entry = sampled_rows.entry(key).or_default();
            entry.0 += f.self_samples;
            entry.1 += f.total_samples;
        }
        keys.sort();
        keys.dedup();

        let n = compared_samples;
        let not_python: u64 = sampled_rows.iter().filter(|((_, file, _), _)| file.is_empty()).map(|(_, (s, _))| s).sum();
        let python_cpu_ns = (n.saturating_sub(not_python) as f64 * 1e9 / sampled.hz.max(1) as f64).round() as i64;
        let traced_ns = corrected_self_ns.unwrap_or(self_ns);
        let off_cpu_ns = traced_ns as i64 - python_cpu_ns;
        let off_cpu_share = if traced_ns > 0 { off_cpu_ns.max(0) as f64 / traced_ns as f64 } else { 0.0 };
        let mut functions: Vec<Row> = keys
            .into_iter()
            .map(|key| {
                let (self_samples, total_samples) = sampled_rows.get(&key).copied().unwrap_or((0, 0));
                let traced_side = traced_rows.get(&key);
                // Tracing's own nameless rows (an unreadable code object)
                // have no file either, but are its rows.
                let python = traced_side.is_some() || !key.1.is_empty();
                let line = traced_side.map(|(_, l)| *l).or(key.2).unwrap_or(0);
                let (name, file, _) = key;
                let t = traced_side.map_or_else(FunctionStats::default, |(t, _)| t.clone());
                let share = |v: Option<u64>, of: Option<u64>| Some(ratio(v?, of?));
                let (traced_total, traced_self, corrected_total, corrected_self) = if python {
                    (
                        share(Some(t.total_ns), Some(self_ns)),
                        share(Some(t.self_ns), Some(self_ns)),
                        share(corrected_total(&t, &overhead), corrected_self_ns),
                        share(corrected_self(&t, &overhead), corrected_self_ns),
                    )
                } else {
                    (None, None, None, None)
                };
                let sampled_total = ratio(total_samples, n);
                let sampled_self = ratio(self_samples, n);
                let base_total = if correctable { corrected_total } else { traced_total };
                let base_self = if correctable { corrected_self } else { traced_self };
                let has_samples = n > 0;
                let mut row = Row {
                    name,
                    file,
                    line,
                    calls: python.then_some(t.calls),
                    traced_total_share: traced_total,
                    traced_self_share: traced_self,
                    corrected_total_share: corrected_total,
                    corrected_self_share: corrected_self,
                    total_samples,
                    self_samples,
                    sampled_total_share: sampled_total,
                    sampled_self_share: sampled_self,
                    total_diff: base_total.filter(|_| has_samples).map(|b| sampled_total - b),
                    self_diff: base_self.filter(|_| has_samples).map(|b| sampled_self - b),
                    expected_total_samples: base_total.filter(|_| has_samples).map(|b| b * n as f64),
                    flags: Vec::new(),
                };
                row.flags = flags(&row, &t, n, &overhead, off_cpu_share);
                row
            })
            .collect();
        functions.sort_by(|a, b| {
            let weight = |r: &Row| r.corrected_total_share.or(r.traced_total_share).unwrap_or(0.0).max(r.sampled_total_share);
            let self_weight = |r: &Row| r.corrected_self_share.or(r.traced_self_share).unwrap_or(0.0).max(r.sampled_self_share);
            weight(b)
                .total_cmp(&weight(a))
                .then(self_weight(b).total_cmp(&self_weight(a)))
                .then_with(|| (&a.name, &a.file, a.line).cmp(&(&b.name, &b.file, b.line)))
        });
        if n == 0 {
            notes.push("no samples outside the probes: nothing to compare the traced shares with".into());
        }

        Comparison {
            kind: ReportKind::Compare,
            pid: traced.pid,
            python: traced.python.clone(),
            traced: TracedSummary {
                duration_ns: traced.duration_ns,
                functions: traced_rows.len(),
                calls,
                evaluations,
                self_ns,
                corrected_self_ns,
                off_cpu_ns,
                lost_events: traced.lost_events,
            },
            sampled: SampledSummary {
                duration_ns: sampled.duration_ns,
                hz: sampled.hz,
                samples: sampled.samples,
                probe_samples,
                compared_samples,
                lost_events: sampled.lost_events,
            },
            overhead,
            matched_by,
            diff_against,
            notes,
            functions,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the comparison serializes") + "\n"
    }

    pub fn to_table(&self, top: usize) -> String {
        let t = &self.traced;
        let s = &self.sampled;
        let o = &self.overhead;
        let mut out = format!(
            "pytrace compare: PID {}, Python {} ({} mode), {:.2} s\n",
            self.pid,
            self.python.version,
            self.python.mode,
            t.duration_ns as f64 / 1e9
        );
        out += &format!(
            "traced:  {} ({}) in {}, {} of self time, {}\n",
            super::counted(t.calls, "call"),
            super::counted(t.evaluations, "evaluation"),
            super::counted(t.functions as u64, "function"),
            human_ns(t.self_ns),
            super::counted(t.lost_events, "lost event")
        );
        out += &format!(
            "sampled: {} samples at {} Hz, {} lost; {} inside pytrace's probes ({:.1}%), set apart\n",
            thousands(s.samples),
            s.hz,
            thousands(s.lost_events),
            thousands(s.probe_samples),
            ratio(s.probe_samples, s.samples) * 100.0
        );
        out += &format!(
            "probe cost: {} per call ({} in the called function's self time, {} in its caller's), {}\n",
            human_ns(o.ns_per_call),
            human_ns(o.callee_ns_per_call),
            human_ns(o.caller_ns_per_call),
            o.basis
        );
        match t.corrected_self_ns {
            Some(c) => {
                out += &format!(
                    "corrected (*): {} of the {} traced self time is the probes' ({:.1}%)\n",
                    human_ns(t.self_ns - c),
                    human_ns(t.self_ns),
                    ratio(t.self_ns - c, t.self_ns) * 100.0
                )
            }
            None => out += "corrected (*): not available\n",
        }
        let traced_ns = t.corrected_self_ns.unwrap_or(t.self_ns);
        if t.off_cpu_ns > 0 {
            out += &format!(
                "off CPU: {} of the {} traced time ({:.0}%) was not on a CPU (sleep, I/O, locks, the GIL, a busy machine): sampling does not see it\n",
                human_ns(t.off_cpu_ns as u64),
                human_ns(traced_ns),
                ratio(t.off_cpu_ns as u64, traced_ns) * 100.0
            );
        }
        for note in &self.notes {
            out += &format!("note: {note}\n");
        }
        out += &format!(
            "\n{:>12}  {:-^31}  {:-^15}  {:-^15}\n",
            "", " traced (wall time) ", " sampled (CPU) ", &format!(" diff vs {} ", if self.diff_against == "corrected" { "*" } else { "raw" })
        );
        out += &format!(
            "{:>12}  {:>7}{:>8}{:>8}{:>8}  {:>7}{:>8}  {:>7}{:>8}  {}\n",
            "calls", "total", "total*", "self", "self*", "total", "self", "total", "self", "function (file:line)"
        );
        let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.1}%", v * 100.0));
        let pts = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:+.1}", v * 100.0));
        for r in self.functions.iter().take(top) {
            let place = if r.file.is_empty() { String::new() } else { format!(" ({}:{})", r.file, r.line) };
            out += &format!(
                "{:>12}  {:>7}{:>8}{:>8}{:>8}  {:>7}{:>8}  {:>7}{:>8}  {}{}\n",
                r.calls.map_or("–".to_string(), thousands),
                pct(r.traced_total_share),
                pct(r.corrected_total_share),
                pct(r.traced_self_share),
                pct(r.corrected_self_share),
                pct(Some(r.sampled_total_share)),
                pct(Some(r.sampled_self_share)),
                pts(r.total_diff),
                pts(r.self_diff),
                r.name,
                place
            );
            for f in &r.flags {
                out += &format!("{:>14} {}\n", "↳", f.message);
            }
        }
        if self.functions.len() > top {
            let hidden = &self.functions[top..];
            let flagged = hidden.iter().filter(|r| !r.flags.is_empty()).count();
            out += &format!("… {} more {} (--top), {} of them flagged (--json has every row)\n", hidden.len(), super::plural(hidden.len() as u64, "function"), flagged);
        }
        out += "\nShares: traced of all traced self time (wall clock, every thread); sampled of the samples outside pytrace's\n\
                probes (CPU time). *: without the probes' estimated cost. diff: sampled minus traced share, in points.\n";
        out
    }
}

/// What one side sees and the other misses, for one row.
fn flags(r: &Row, t: &FunctionStats, n: u64, overhead: &Overhead, off_cpu_share: f64) -> Vec<Flag> {
    let mut flags = Vec::new();
    let mut flag = |kind: &'static str, message: String| flags.push(Flag { kind, message });
    let Some(calls) = r.calls else {
        let message = if r.name == "[no Python code]" {
            "no Python code running (native code, interpreter start-up or exit): tracing cannot see this time".to_string()
        } else {
            format!("{}: not a Python function, so not in the traced report", r.name)
        };
        flag("not_seen_by_tracing", message);
        return flags;
    };
    if calls == 0 {
        flag(
            "not_traced",
            "sampled, but no call of it was traced: it was running before tracing began (its time is missing from the traced side) or its calls were lost"
                .into(),
        );
        return flags;
    }
    if t.timed_calls < calls {
        flag(
            "untimed_calls",
            format!(
                "{} of its {} calls were not timed (still running at the end, or deeper than the timed stack): its traced time lacks theirs",
                thousands(calls - t.timed_calls),
                thousands(calls)
            ),
        );
        return flags;
    }
    let Some(expected) = r.expected_total_samples else { return flags };
    if expected < 1.0 {
        let seen = if r.total_samples == 0 { "none seen".to_string() } else { format!("{} seen", r.total_samples) };
        flag(
            "below_sampling",
            format!("sampling misses it: {} calls, {:.2} samples expected ({seen})", thousands(calls), expected),
        );
        return flags;
    }
    let probe_heavy = match (r.traced_self_share, corrected_self(t, overhead)) {
        (Some(raw), Some(corrected)) if raw >= MIN_FLAGGED_DIFF => Some(ratio(t.self_ns - corrected, t.self_ns)).filter(|&i| i >= INFLATED),
        _ => None,
    };
    if let (Some(diff), Some(base)) = (r.self_diff, r.corrected_self_share.or(r.traced_self_share)) {
        let p = base.clamp(1.0 / n as f64, 1.0 - 1.0 / n as f64);
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        if diff.abs() > (SIGMAS * sigma).max(MIN_FLAGGED_DIFF) {
            let why = if probe_heavy.is_some() {
                ": its traced time is mostly the probes', and their cost per call is an estimate".to_string()
            } else if diff < 0.0 {
                ": tracing counts wall time, waits off CPU (sleep, I/O, locks, the GIL) included".to_string()
            } else if off_cpu_share >= OFF_CPU_NOTED {
                format!(": {:.0}% of the traced time is off CPU, which lowers the traced share of CPU work", off_cpu_share * 100.0)
            } else {
                String::new()
            };
            if diff > 0.0 {
                flag("sampled_more", format!("sampled self share exceeds traced by {:.1} points{why}", diff * 100.0));
            } else {
                flag("traced_more", format!("traced self share exceeds sampled by {:.1} points{why}", -diff * 100.0));
            }
        }
    }
    if let Some(inflation) = probe_heavy {
        flag(
            "probe_cost",
            format!(
                "pytrace's probes are ~{:.0}% of its traced self time ({} calls, {} made): read the corrected share",
                inflation * 100.0,
                thousands(t.timed_calls),
                thousands(t.child_calls)
            ),
        );
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traced_fn(name: &str, line: u32, calls: u64, total_ns: u64, self_ns: u64, child_calls: u64, nested: u64) -> Function {
        let stats = FunctionStats { calls, timed_calls: calls, total_ns, self_ns, max_ns: 0, child_calls, outermost_calls: calls, nested_calls: nested, latency: Default::default() };
        Function { name: name.into(), file: "app.py".into(), line, stats }
    }

    fn sampled_fn(name: &str, file: &str, line: Option<u32>, self_samples: u64, total_samples: u64) -> SampledFunction {
        SampledFunction { name: name.into(), file: file.into(), line, self_samples, total_samples }
    }

    fn python() -> PythonInfo {
        PythonInfo { version: "3.11.2".into(), mode: "uprobe".into() }
    }

    fn traced(functions: Vec<Function>, evaluations: u64) -> TracedReport {
        let counters = [("evaluations".to_string(), evaluations)].into_iter().collect();
        TracedReport { pid: 7, python: python(), duration_ns: 1_000_000_000, lost_events: 0, counters, functions, correctable: true }
    }

    fn sampled(functions: Vec<SampledFunction>, samples: u64) -> SampledReport {
        let python = PythonInfo { version: "3.11.2".into(), mode: "sample".into() };
        SampledReport { pid: 7, python, hz: 1000, duration_ns: 1_000_000_000, samples, lost_events: 0, functions }
    }

    fn row<'a>(c: &'a Comparison, name: &str, line: u32) -> &'a Row {
        c.functions.iter().find(|r| r.name == name && r.line == line).unwrap_or_else(|| panic!("no row {name}:{line}"))
    }

    fn kinds(r: &Row) -> Vec<&'static str> {
        r.flags.iter().map(|f| f.kind).collect()
    }

    /// main (line 1) calls work (line 5) 100 times; a second `work` at line
    /// 9 is another function. 1000 samples, 100 of them in the probes.
    fn example_functions() -> Vec<Function> {
        vec![
            traced_fn("main", 1, 1, 1_000_000_000, 400_000_000, 110, 110),
            traced_fn("work", 5, 100, 500_000_000, 500_000_000, 0, 0),
            traced_fn("work", 9, 10, 100_000_000, 100_000_000, 0, 0),
        ]
    }

    fn example() -> Comparison {
        let t = traced(example_functions(), 111);
        let s = sampled(
            vec![
                sampled_fn("main", "app.py", Some(1), 300, 850),
                sampled_fn("work", "app.py", Some(5), 500, 500),
                sampled_fn("work", "app.py", Some(9), 50, 50),
                sampled_fn("[no Python code]", "", Some(0), 50, 50),
                sampled_fn(PROBES_ROW, "", Some(0), 100, 100),
            ],
            1000,
        );
        Comparison::new(&t, &s)
    }

    #[test]
    fn shares_are_of_all_self_time_and_of_the_samples_outside_the_probes() {
        let c = example();
        assert_eq!(c.traced.self_ns, 1_000_000_000);
        assert_eq!((c.sampled.probe_samples, c.sampled.compared_samples), (100, 900));
        let main = row(&c, "main", 1);
        assert_eq!(main.calls, Some(1));
        assert_eq!(main.traced_self_share, Some(0.4));
        assert_eq!(main.traced_total_share, Some(1.0));
        assert_eq!(main.sampled_self_share, 300.0 / 900.0);
        assert_eq!(main.sampled_total_share, 850.0 / 900.0);
        // Two functions named `work`, told apart by their first line.
        assert_eq!(row(&c, "work", 5).traced_self_share, Some(0.5));
        assert_eq!(row(&c, "work", 9).sampled_self_share, 50.0 / 900.0);
        assert!(c.functions.iter().all(|r| r.name != PROBES_ROW), "the probes are no function");
        assert_eq!(c.matched_by, "name, file and first line");
        assert_eq!(c.diff_against, "corrected");
    }

    /// 100 samples at 1000 Hz in the probes are 100 ms over 111
    /// evaluations: 900.9 µs each, 40 % of it in the callee.
    #[test]
    fn probe_cost_is_measured_from_the_samples_in_the_probes_and_taken_out() {
        let c = example();
        let o = &c.overhead;
        assert_eq!((o.source, o.sampled_probe_ns, o.ns_per_call), ("sampled", 100_000_000, 900_901));
        assert_eq!((o.callee_ns_per_call, o.caller_ns_per_call), (360_360, 540_541));
        // work@5: 100 calls, each with the callee part inside it.
        let work_self = 500_000_000 - 100 * 360_360;
        // main: its own call's callee part, and the caller part of 110 calls it made.
        let main_self = 400_000_000 - 360_360 - 110 * 540_541;
        let main_total = 1_000_000_000 - 360_360 - 110 * 900_901;
        let work9_self = 100_000_000 - 10 * 360_360;
        let all = (work_self + main_self + work9_self) as f64;
        assert_eq!(c.traced.corrected_self_ns, Some(work_self + main_self + work9_self));
        assert_eq!(row(&c, "work", 5).corrected_self_share, Some(work_self as f64 / all));
        assert_eq!(row(&c, "main", 1).corrected_self_share, Some(main_self as f64 / all));
        assert_eq!(row(&c, "main", 1).corrected_total_share, Some(main_total as f64 / all));
        let main = row(&c, "main", 1);
        assert_eq!(main.self_diff, Some(main.sampled_self_share - main_self as f64 / all));
        // 850 samples in Python code (not the probes', not [no Python code]) at 1000 Hz.
        assert_eq!(c.traced.off_cpu_ns, (work_self + main_self + work9_self) as i64 - 850_000_000);
    }

    #[test]
    fn too_few_samples_in_the_probes_fall_back_to_the_constant() {
        let t = traced(vec![traced_fn("f", 1, 1000, 10_000_000, 10_000_000, 0, 0)], 1000);
        let s = sampled(vec![sampled_fn("f", "app.py", Some(1), 10, 10), sampled_fn(PROBES_ROW, "", Some(0), 3, 3)], 13);
        let c = Comparison::new(&t, &s);
        assert_eq!((c.overhead.source, c.overhead.ns_per_call), ("constant", CONSTANT_NS_PER_CALL));
        assert_eq!(c.overhead.estimated_probe_ns, 1000 * CONSTANT_NS_PER_CALL);
        let callee = (CONSTANT_NS_PER_CALL as f64 * CALLEE_SHARE).round() as u64;
        assert_eq!(c.traced.corrected_self_ns, Some(10_000_000 - 1000 * callee));
    }

    #[test]
    fn each_side_flags_what_the_other_cannot_see() {
        let c = example();
        assert_eq!(kinds(row(&c, "[no Python code]", 0)), ["not_seen_by_tracing"]);
        assert_eq!(row(&c, "[no Python code]", 0).calls, None, "tracing cannot see it: no count, not zero");

        let t = traced(
            vec![
                traced_fn("main", 1, 1, 1_000_000_000, 300_000_000, 100_004, 100_004),
                traced_fn("hot", 3, 100_000, 300_000_000, 300_000_000, 0, 0),
                traced_fn("rare", 8, 2, 20_000, 20_000, 0, 0),
                {
                    let mut endless = traced_fn("endless", 12, 1, 0, 0, 0, 0);
                    endless.stats.timed_calls = 0;
                    endless
                },
                traced_fn("sleeper", 20, 1, 100_000_000, 100_000_000, 0, 0),
            ],
            100_005,
        );
        let s = sampled(
            vec![
                sampled_fn("<module>", "app.py", Some(0), 0, 1000),
                sampled_fn("main", "app.py", Some(1), 900, 1000),
                sampled_fn("hot", "app.py", Some(3), 100, 100),
                sampled_fn("endless", "app.py", Some(12), 0, 0),
            ],
            1000,
        );
        let c = Comparison::new(&t, &s);
        assert_eq!(kinds(row(&c, "<module>", 0)), ["not_traced"]);
        assert_eq!(kinds(row(&c, "rare", 8)), ["below_sampling"]);
        assert!(row(&c, "rare", 8).flags[0].message.contains("2 calls"), "{:?}", row(&c, "rare", 8).flags);
        assert_eq!(kinds(row(&c, "endless", 12)), ["untimed_calls"]);
        assert_eq!(kinds(row(&c, "main", 1)), ["sampled_more", "probe_cost"], "{:?}", row(&c, "main", 1).flags);
        assert_eq!(kinds(row(&c, "sleeper", 20)), ["traced_more"]);
        // 100,000 calls at 840 ns inside each: 84 of its 300 ms.
        assert_eq!(kinds(row(&c, "hot", 3)), ["traced_more", "probe_cost"]);
        assert!(row(&c, "hot", 3).flags[1].message.starts_with("pytrace's probes are ~28% of its traced self time"));
    }

    /// One standard error of a 30 % share over 1000 samples is 1.45 points:
    /// 3 points off is within three of them, 5 points is not.
    #[test]
    fn differences_within_sampling_noise_are_not_flagged() {
        let t = |line| traced_fn("f", line, 1, 300_000_000, 300_000_000, 0, 0);
        let rest = traced_fn("rest", 50, 1, 700_000_000, 700_000_000, 0, 0);
        for (samples, flagged) in [(330, false), (350, true), (250, true)] {
            let s = sampled(
                vec![sampled_fn("f", "app.py", Some(1), samples, samples), sampled_fn("rest", "app.py", Some(50), 1000 - samples, 1000 - samples)],
                1000,
            );
            let c = Comparison::new(&traced(vec![t(1), rest.clone()], 2), &s);
            let f = row(&c, "f", 1);
            assert_eq!(!f.flags.is_empty(), flagged, "{samples} samples: {:?}", f.flags);
        }
    }

    #[test]
    fn reports_from_before_compare_are_matched_and_not_corrected() {
        let old = |name: &str, line| traced_fn(name, line, 1, 10, 10, 0, 0);
        let t = TracedReport { correctable: false, ..traced(vec![old("f", 1), old("f", 7), old("g", 3)], 3) };
        let s = sampled(vec![sampled_fn("f", "app.py", None, 6, 6), sampled_fn("g", "app.py", None, 4, 4)], 10);
        let c = Comparison::new(&t, &s);
        assert_eq!(c.matched_by, "name and file");
        assert_eq!(c.diff_against, "raw");
        assert!(!c.overhead.corrected);
        assert_eq!(c.traced.corrected_self_ns, None);
        let f = c.functions.iter().find(|r| r.name == "f").unwrap();
        assert_eq!((f.calls, f.line, f.traced_self_share), (Some(2), 1, Some(20.0 / 30.0)), "both f merged");
        assert_eq!(f.corrected_self_share, None);
        assert_eq!(f.self_diff, Some(0.6 - 20.0 / 30.0));
        assert_eq!(c.notes.len(), 2, "{:?}", c.notes);
    }

    #[test]
    fn wrong_or_broken_input_is_one_sentence() {
        let sample_json = r#"{"pid": 1, "python": {"version": "3.11.2", "mode": "sample"}, "hz": 99, "duration_ns": 1, "samples": 0, "lost_events": 0, "functions": []}"#;
        let calls_json = r#"{"pid": 1, "python": {"version": "3.11.2", "mode": "uprobe"}, "duration_ns": 1, "lost_events": 0, "functions": []}"#;
        let err = |r: Result<TracedReport>| format!("{:#}", r.err().unwrap());
        assert_eq!(
            err(TracedReport::parse(sample_json, "b.json")),
            "b.json is a `pytrace sample --json` report, but --traced needs a `pytrace calls --json` report"
        );
        assert!(err(TracedReport::parse("{oops", "a.json")).starts_with("a.json is not JSON ("));
        assert_eq!(err(TracedReport::parse("[1, 2]", "a.json")), "a.json is not a pytrace report: --traced needs a `pytrace calls --json` report");
        assert!(err(TracedReport::parse(r#"{"functions": [{"name": "f"}]}"#, "a.json"))
            .starts_with("a.json is not a complete `pytrace calls --json` report (missing field"));
        let e = SampledReport::parse(calls_json, "a.json").err().unwrap();
        assert_eq!(format!("{e:#}"), "a.json is a `pytrace calls --json` report, but --sampled needs a `pytrace sample --json` report");
        assert!(TracedReport::parse(calls_json, "a.json").is_ok() && SampledReport::parse(sample_json, "b.json").is_ok());
        // An older calls report, without the counts the correction needs.
        let old = r#"{"pid": 1, "python": {"version": "3.11.2", "mode": "uprobe"}, "duration_ns": 1, "lost_events": 0, "functions": [{"name": "f", "file": "a.py", "line": 1, "calls": 1, "timed_calls": 1, "total_ns": 5, "self_ns": 5}]}"#;
        assert!(!TracedReport::parse(old, "a.json").unwrap().correctable);
        assert!(TracedReport::parse(calls_json, "a.json").unwrap().correctable);
        let missing = format!("{:#}", TracedReport::read(Path::new("/nonexistent/a.json")).err().unwrap());
        assert!(missing.starts_with("cannot read /nonexistent/a.json: No such file"), "{missing}");
    }

    /// A live compare takes its inputs from memory: they must be what the
    /// same reports give when saved and read back.
    #[test]
    fn live_inputs_equal_the_saved_reports_read_back() {
        use crate::model::counters::{Counters, Kind};
        use crate::model::latency::Latency;
        let mut counters = Counters::default();
        counters.push("evaluations", Kind::Informational, "frame evaluations", 111);
        counters.push("function_map_full", Kind::Lost, "calls not counted", 2);
        let mut functions = example_functions();
        functions[0].stats.latency = Latency::from_kernel(&[0, 3, 1]);
        let data = crate::tracing::calls::CallsData { functions, counters: counters.clone() };
        let calls = CallsReport::new(7, python(), 1_000_000_000, data, super::super::calls::SortKey::Total);
        let live = TracedReport::from(&calls);
        assert_eq!(live, TracedReport::parse(&calls.to_json(), "calls.json").unwrap());
        assert_eq!(live.lost_events, 2);

        let py = |name: &str, line| Rc::new(Frame::Python { name: name.into(), file: "app.py".into(), line, first_line: line });
        let samples = vec![
            Sample { pid: 7, tid: 1, frames: vec![py("main", 1), py("work", 5)], count: 30 },
            Sample { pid: 7, tid: 1, frames: vec![py("main", 1)], count: 5 },
            Sample { pid: 7, tid: 1, frames: vec![Rc::new(Frame::Probes)], count: 4 },
        ];
        let info = PythonInfo { version: "3.11.2".into(), mode: "sample".into() };
        let profile = Profile::new(7, info, 1000, 1_000_000_000, counters, &samples, None);
        let live = SampledReport::from(&profile);
        assert_eq!(live, SampledReport::parse(&profile.to_json(), "sample.json").unwrap());
        assert_eq!((live.samples, live.lost_events), (39, 2));
    }

    #[test]
    fn samples_inside_the_probes_are_set_apart_and_other_kernel_frames_dropped() {
        let py = Rc::new(Frame::Python { name: "loop".into(), file: "app.py".into(), line: 7, first_line: 4 });
        let k = |name: &str| Rc::new(Frame::Kernel(name.into()));
        let mut samples = vec![
            Sample { pid: 1, tid: 1, frames: vec![py.clone(), k("asm_exc_int3"), k("irqentry_exit_to_user_mode")], count: 1 },
            Sample { pid: 1, tid: 1, frames: vec![py.clone(), k("entry_SYSCALL_64_after_hwframe"), k("__x64_sys_uretprobe")], count: 1 },
            Sample { pid: 1, tid: 1, frames: vec![py.clone(), k("entry_SYSCALL_64_after_hwframe"), k("__x64_sys_read")], count: 1 },
            Sample { pid: 1, tid: 1, frames: vec![py.clone()], count: 1 },
        ];
        assert_eq!(set_apart_probe_samples(&mut samples), 2);
        assert_eq!(*samples[0].frames, [Rc::new(Frame::Probes)]);
        assert_eq!(*samples[1].frames, [Rc::new(Frame::Probes)]);
        assert_eq!(*samples[2].frames, *std::slice::from_ref(&py), "a read(2) counts for the Python function");
        assert_eq!(*samples[3].frames, [py]);
        assert_eq!(crate::report::profile::label(&Frame::Probes), PROBES_ROW);
    }

    #[test]
    fn the_table_shows_every_column_and_flag() {
        let c = example();
        let table = c.to_table(2);
        assert!(table.contains("probe cost: 900.90µs per call (360.36µs in the called function's self time, 540.54µs in its caller's), measured in this run"), "{table}");
        assert!(table.contains("function (file:line)"));
        assert!(table.contains("main (app.py:1)"));
        // work@9 (10 % traced, 5.6 % sampled) and [no Python code] are flagged.
        assert!(table.contains("… 2 more functions (--top), 2 of them flagged"), "{table}");
        let table = c.to_table(10);
        assert!(table.contains("↳ no Python code running (native code, interpreter start-up or exit): tracing cannot see this time"), "{table}");
        assert!(table.contains("      –       –       –       –"), "tracing has no numbers for it: {table}");
        let json: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(json["overhead"]["source"], "sampled");
        assert_eq!(json["functions"].as_array().unwrap().len(), 4);
    }
}
