//! The `calls` report: one row per Python function, as a table or JSON.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::output::{all_written, check_distinct, Output};
use super::{counted, human_ns, thousands, PythonInfo, ReportKind};
use crate::model::counters::Counters;
use crate::model::functions::{CallEdge, CallsData, Function, FunctionId, FunctionStats};
use crate::model::hook::HookOutcome;
use crate::model::samples::Frame;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Calls,
    Total,
    SelfTime,
}

/// A function's row: its statistics and the percentiles of its latencies.
#[derive(Serialize, schemars::JsonSchema)]
pub struct FunctionRow {
    #[serde(flatten)]
    pub function: Function,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct CallsReport {
    pub kind: ReportKind,
    pub pid: u32,
    pub python: PythonInfo,
    pub duration_ns: u64,
    pub lost_events: u64,
    pub counters: Counters,
    /// What this mode cannot be exact about on this interpreter.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub caveats: Vec<String>,
    /// Why the counts are incomplete (the eval-frame hook was changed by
    /// something else while tracing), if they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    pub functions: Vec<FunctionRow>,
    /// Caller->callee edges, when counted (`--pstats`; not in the JSON).
    #[serde(skip)]
    pub edges: Vec<CallEdge>,
}

impl CallsReport {
    /// Rows for the same (name, file, line) are merged, as cProfile does: one
    /// function may have had several code objects (re-executed definitions).
    pub fn new(pid: u32, python: PythonInfo, duration_ns: u64, data: CallsData, sort: SortKey) -> Self {
        let lost_events = data.counters.lost();
        let mut merged: HashMap<(String, String, u32), FunctionStats> = HashMap::new();
        for f in data.functions {
            match merged.entry((f.name, f.file, f.line)) {
                std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().merge(&f.stats),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(f.stats);
                }
            }
        }
        let mut functions: Vec<FunctionRow> = merged
            .into_iter()
            .map(|((name, file, line), stats)| FunctionRow {
                p50_ns: stats.latency_at(0.50),
                p90_ns: stats.latency_at(0.90),
                p99_ns: stats.latency_at(0.99),
                function: Function { name, file, line, stats },
            })
            .collect();
        functions.sort_by(|a, b| {
            let key = |r: &FunctionRow| match sort {
                SortKey::Calls => r.function.stats.calls,
                SortKey::Total => r.function.stats.total_ns,
                SortKey::SelfTime => r.function.stats.self_ns,
            };
            key(b).cmp(&key(a)).then_with(|| a.function.name.cmp(&b.function.name))
        });
        CallsReport {
            kind: ReportKind::Calls,
            pid,
            python,
            duration_ns,
            lost_events,
            counters: data.counters,
            caveats: Vec::new(),
            incomplete: None,
            functions,
            edges: data.edges,
        }
    }

    /// The report saying `caveats` (what its mode cannot be exact about)
    /// and what the eval-frame hook went through.
    pub fn noting(mut self, caveats: Vec<String>, hook: &HookOutcome) -> Self {
        self.caveats = caveats;
        self.caveats.extend(hook.notes.iter().cloned());
        self.incomplete = hook.incomplete.clone();
        self
    }

    /// cProfile's stats file (src/report/pstats.rs).
    pub fn to_pstats(&self) -> Vec<u8> {
        let functions = self.functions.iter().map(|r| {
            let f = &r.function;
            (FunctionId { name: f.name.clone(), file: f.file.clone(), line: f.line }, &f.stats)
        });
        super::pstats::encode(functions, &self.edges)
    }

    /// pprof's gzipped profile.proto: calls has no stacks, so each
    /// function is a one-frame sample valued in calls and self nanoseconds
    /// (self times add up to the traced time; total times would count
    /// nested calls twice).
    pub fn to_pprof(&self) -> anyhow::Result<Vec<u8>> {
        let frames: Vec<[std::rc::Rc<Frame>; 1]> = self
            .functions
            .iter()
            .map(|row| &row.function)
            .map(|f| [std::rc::Rc::new(Frame::Python { name: f.name.clone(), file: f.file.clone(), line: f.line, first_line: f.line })])
            .collect();
        let mut comments = vec![format!("pytrace calls: PID {}, Python {} ({} mode)", self.pid, self.python.version, self.python.mode)];
        comments.extend(self.caveats.iter().map(|c| format!("note: {c}")));
        comments.extend(super::counted_line(&self.counters).lines().map(str::to_string));
        comments.extend(super::dropped_line(&self.counters).lines().map(str::to_string));
        super::pprof::encode(&super::pprof::PprofInput {
            value_types: vec![("calls", "count"), ("self", "nanoseconds")],
            stacks: self
                .functions
                .iter()
                .zip(&frames)
                .map(|(row, frame)| super::pprof::StackValues { thread: "", frames: frame, values: vec![row.function.stats.calls as i64, row.function.stats.self_ns as i64] })
                .collect(),
            period: None,
            start_unix_ns: super::pprof::unix_ns_ago(self.duration_ns),
            duration_ns: self.duration_ns,
            comments,
        })
    }

    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    pub fn to_table(&self, top: Option<usize>) -> String {
        let total_calls: u64 = self.functions.iter().map(|f| f.function.stats.calls).sum();
        let mut out = format!(
            "pytrace calls: PID {}, Python {} ({} mode), {:.2} s, {} in {}, {}\n",
            self.pid,
            self.python.version,
            self.python.mode,
            self.duration_ns as f64 / 1e9,
            counted(total_calls, "call"),
            counted(self.functions.len() as u64, "function"),
            counted(self.lost_events, "lost event"),
        );
        if let Some(why) = &self.incomplete {
            out += &format!("warning: {why}\n");
        }
        for caveat in &self.caveats {
            out += &format!("note: {caveat}\n");
        }
        let untimed = self.counters.get("deep_untimed_calls");
        if untimed > 0 {
            out += &format!("note: {} deeper than the timed stack counted but not timed\n", counted(untimed, "call"));
        }
        out += &super::counted_line(&self.counters);
        out += &format!(
            "{:>12} {:>10} {:>10} {:>10} {:>10} {:>10}  {:>10}   {}\n",
            "calls", "total", "self", "p50", "p90", "p99", "max", "function (file:line)"
        );
        let shown = top.unwrap_or(usize::MAX);
        // A call during which its thread was switched out (preempted on a
        // busy machine, or blocked) took wall time it did not run: its
        // function's tail (p99, max) is marked so a reader does not take a
        // one-line function's 100 ms maximum for time spent in it.
        let (mut marked_functions, mut off_cpu, mut timed) = (0u64, 0u64, 0u64);
        for row in self.functions.iter().take(shown) {
            let (f, stats) = (&row.function, &row.function.stats);
            let mark = if stats.off_cpu_calls > 0 { OFF_CPU_MARK } else { ' ' };
            // The p99 can hold a switched-out call only when over 1% of the
            // calls were (a leaf with 1,144 of 1.6 M kept a 1.7 us p99).
            let p99_mark = if stats.off_cpu_calls * 100 > stats.timed_calls { OFF_CPU_MARK } else { ' ' };
            if stats.off_cpu_calls > 0 {
                marked_functions += 1;
                off_cpu += stats.off_cpu_calls;
                timed += stats.timed_calls;
            }
            out += &format!(
                "{:>12} {:>10} {:>10} {:>10} {:>10} {:>10}{} {:>10}{}  {} ({}:{})\n",
                thousands(stats.calls),
                human_ns(stats.total_ns),
                human_ns(stats.self_ns),
                human_ns(row.p50_ns),
                human_ns(row.p90_ns),
                human_ns(row.p99_ns),
                p99_mark,
                human_ns(stats.max_ns),
                mark,
                f.name,
                f.file,
                f.line,
            );
        }
        if self.functions.len() > shown {
            let hidden = (self.functions.len() - shown) as u64;
            out += &format!("… {} more {} (--top)\n", thousands(hidden), super::plural(hidden, "function"));
        }
        if marked_functions > 0 {
            out += &off_cpu_footnote(off_cpu, timed, marked_functions);
        }
        out += &super::dropped_line(&self.counters);
        out
    }
}

/// The mark after a p99 or max that includes time the thread was off the CPU.
pub const OFF_CPU_MARK: char = '*';

/// The one line under the table that says what the mark means and how many
/// calls carry it: the marked times are wall time, not time run.
fn off_cpu_footnote(off_cpu: u64, timed: u64, functions: u64) -> String {
    format!(
        "{OFF_CPU_MARK} includes time off the CPU: {} of {} timed calls of {} {} were switched out (preempted or blocked), so their max (and p99 where marked) is wall time, not time run\n",
        thousands(off_cpu),
        thousands(timed),
        thousands(functions),
        super::plural(functions, "function"),
    )
}

/// Where `pytrace calls` writes: each file asked for, checked distinct and
/// made before the target is touched (output.rs); the table goes to
/// standard output unless the JSON does.
pub struct CallsOutputs {
    json: Option<Output>,
    pprof: Option<Output>,
    pstats: Option<Output>,
}

impl CallsOutputs {
    pub fn create(json: Option<&Path>, pprof: Option<&Path>, pstats: Option<&Path>) -> Result<Self> {
        let create = |path: Option<&Path>| path.map(Output::create).transpose();
        let outputs = CallsOutputs { json: create(json)?, pprof: create(pprof)?, pstats: create(pstats)? };
        check_distinct(&[], &[&outputs.json, &outputs.pprof, &outputs.pstats].into_iter().flatten().collect::<Vec<_>>())?;
        Ok(outputs)
    }

    /// Whether caller->callee edges are wanted (only the pstats file has them).
    pub fn wants_edges(&self) -> bool {
        self.pstats.is_some()
    }

    /// Writes every output asked for, and the table, even when one fails
    /// (a `-p` trace cannot be repeated); each failure is its own sentence.
    pub fn write(mut self, report: &CallsReport, top: Option<usize>) -> Result<()> {
        let pprof = self.pprof.as_mut().map(|out| out.write_all(&report.to_pprof()?));
        let pstats = self.pstats.as_mut().map(|out| out.write_all(&report.to_pstats()));
        let json = super::emit(self.json.as_mut(), || report.to_json(), || report.to_table(top));
        all_written([pprof, pstats, Some(json)].into_iter().flatten())
    }
}
