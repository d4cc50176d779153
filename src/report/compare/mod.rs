//! `pytrace compare`: a `calls` report (exact counts, wall-clock time per
//! call) and a `sample` report (CPU samples) of the same target, joined per
//! function (name, file and first line): the shares each gives, their
//! difference, the traced times with pytrace's own probe cost taken out, and
//! a flag wherever one side sees what the other cannot.
//!
//! One room per job: `inputs` (the two reports, saved or live),
//! `probe_cost` (the probes' cost per call and the corrected times),
//! `flags` (what one side sees and the other cannot), `table` (the terminal
//! output), `outputs` (the files it writes); here, the join itself. A live `pytrace compare` hands its
//! reports over in memory, equal to what they read back as when saved, so
//! a saved pair (`--traced A --sampled B`) gives exactly the result of the
//! run that wrote it.

mod flags;
mod inputs;
mod outputs;
mod probe_cost;
mod table;

use std::collections::HashMap;

use serde::Serialize;

use super::{thousands, PythonInfo, ReportKind};
use crate::model::functions::FunctionStats;
pub use flags::Flag;
use flags::flags;
pub use inputs::{live_reports, SampledReport, TracedAndSampled, TracedReport};
pub use outputs::CompareOutputs;
pub use probe_cost::Overhead;
use probe_cost::{corrected_self, corrected_total};

/// The row of the samples taken inside pytrace's probes, which
/// src/tracing/compare.rs sets apart (src/report/profile.rs names them so).
pub const PROBES_ROW: &str = "[pytrace probes]";

#[derive(Serialize, Debug, schemars::JsonSchema)]
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

#[derive(Serialize, Debug, schemars::JsonSchema)]
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
    /// Traced self time minus the target's CPU time in Python code: when
    /// positive, about the time spent off CPU (sleeping, waiting for I/O, a
    /// lock, the GIL or a CPU), which tracing counts and CPU sampling does
    /// not.
    pub off_cpu_ns: i64,
    /// Where that CPU time came from: "cpu_time", the kernel's accounting
    /// of the target (a live comparison, or a sample report that has
    /// `cpu_ns`), the share outside Python code taken from the samples;
    /// or "samples", estimated from the samples outside the probes (then
    /// against the corrected traced time).
    pub off_cpu_from: &'static str,
    pub lost_events: u64,
}

#[derive(Serialize, Debug, schemars::JsonSchema)]
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

/// One function. Shares are fractions (0.25 is 25 %): traced ones of all
/// traced self time, sampled ones of the samples outside the probes. Traced
/// fields are null for what tracing cannot see (not Python code).
#[derive(Serialize, Debug, schemars::JsonSchema)]
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

type Key = (String, String, Option<u32>);

pub(crate) fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
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
        let traced_ns = corrected_self_ns.unwrap_or(self_ns);
        let (off_cpu_ns, off_cpu_from) = match sampled.cpu_ns {
            // Wall time traced minus the CPU time measured, both with the
            // probes' cost in them, so that the probes' estimate (a
            // sampled one) plays no part; samples only say which share
            // of the CPU time was outside Python code.
            Some(cpu_ns) => {
                let python = 1.0 - ratio(not_python, sampled.samples);
                (self_ns as i64 - (cpu_ns as f64 * python).round() as i64, "cpu_time")
            }
            None => {
                let python_cpu_ns = (n.saturating_sub(not_python) as f64 * 1e9 / sampled.hz.max(1) as f64).round() as i64;
                (traced_ns as i64 - python_cpu_ns, "samples")
            }
        };
        let off_cpu_of = if off_cpu_from == "cpu_time" { self_ns } else { traced_ns };
        let off_cpu_share = ratio(off_cpu_ns.max(0) as u64, off_cpu_of);
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
                off_cpu_from,
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
        crate::report::to_json_text(self)
    }
}

#[cfg(test)]
mod tests;
