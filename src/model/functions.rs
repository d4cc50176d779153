//! One function's call statistics: the single definition of the record
//! outside BPF (bpf/calls.h's func_stats is the kernel's). The calls
//! session fills it (src/tracing/calls.rs), the calls report merges and
//! prints it, compare reads it back from a saved report or takes it from a
//! live one. A new statistic is a field here, one in func_stats, and the
//! line that copies it at the BPF edge.

use serde::{Deserialize, Serialize};

use super::counters::Counters;
use super::latency::Latency;

/// What a calls session collected: one record per code object (several
/// may be one function), the caller->callee edges if they were counted
/// (`calls --pstats`), and its counters.
pub struct CallsData {
    pub functions: Vec<Function>,
    pub edges: Vec<CallEdge>,
    pub counters: Counters,
}

/// A function as pstats names it, and as rows are merged: several code
/// objects may be one function.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionId {
    pub name: String,
    pub file: String,
    pub line: u32,
}

/// The calls of `callee` made directly from `caller`: what cProfile keeps
/// for each entry of pstats' callers map.
#[derive(Debug, Clone, PartialEq)]
pub struct CallEdge {
    pub caller: FunctionId,
    pub callee: FunctionId,
    pub stats: EdgeStats,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeStats {
    pub calls: u64,
    /// Calls made while no call of the same caller->callee pair was open.
    pub primitive_calls: u64,
    /// The callee's self time in these calls, and their inclusive time
    /// (outermost calls of the pair only, as cProfile counts it).
    pub self_ns: u64,
    pub total_ns: u64,
}

impl EdgeStats {
    pub fn merge(&mut self, other: &EdgeStats) {
        self.calls += other.calls;
        self.primitive_calls += other.primitive_calls;
        self.self_ns += other.self_ns;
        self.total_ns += other.total_ns;
    }
}

/// A function, as tracing names it, and its statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Function {
    pub name: String,
    pub file: String,
    /// The function's first line.
    pub line: u32,
    #[serde(flatten)]
    pub stats: FunctionStats,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FunctionStats {
    pub calls: u64,
    /// Calls made while no call of the same function was open (cProfile's
    /// primitive calls: `ncalls 21/1` is 21 calls, 1 primitive). Reports
    /// written before it existed read as 0.
    #[serde(default)]
    pub primitive_calls: u64,
    /// Calls whose duration was measured (deeper than the timed stack, or
    /// run inline where no probe sees them end, they are counted but not
    /// timed; those still running at the end are timed to it).
    pub timed_calls: u64,
    pub total_ns: u64,
    pub self_ns: u64,
    /// Reports written before `compare` existed may lack the fields below;
    /// they read as 0 (src/report/compare/inputs.rs says whether they were there).
    #[serde(default)]
    pub max_ns: u64,
    /// Evaluations entered directly from this function's timed calls, the
    /// outermost (not recursive) timed calls, and the evaluations entered
    /// during those: where the probes' own cost sits in self_ns and total_ns
    /// (`pytrace compare` takes it out).
    #[serde(default)]
    pub child_calls: u64,
    #[serde(default)]
    pub outermost_calls: u64,
    #[serde(default)]
    pub nested_calls: u64,
    /// Timed calls during which the thread left its CPU (preempted, or
    /// waiting for the GIL, a lock, I/O, a sleep): their times include that
    /// wait, so a short function's maximum can be one.
    #[serde(default)]
    pub off_cpu_calls: u64,
    /// Reports carry percentiles instead (src/report/calls.rs).
    #[serde(skip)]
    pub latency: Latency,
}

impl FunctionStats {
    /// Adds another code object's statistics to this function's (rows
    /// merged by name, file and line, as cProfile does).
    pub fn merge(&mut self, other: &FunctionStats) {
        self.calls += other.calls;
        self.primitive_calls += other.primitive_calls;
        self.timed_calls += other.timed_calls;
        self.total_ns += other.total_ns;
        self.self_ns += other.self_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
        self.child_calls += other.child_calls;
        self.outermost_calls += other.outermost_calls;
        self.nested_calls += other.nested_calls;
        self.off_cpu_calls += other.off_cpu_calls;
        self.latency.add(&other.latency);
    }

    /// The latency at quantile `q`, never above the longest call (a bucket's
    /// midpoint can be).
    pub fn latency_at(&self, q: f64) -> u64 {
        if self.latency.is_empty() {
            0
        } else {
            self.latency.value_at_quantile(q).min(self.max_ns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_adds_counts_and_times_and_keeps_the_longest_call() {
        let a = FunctionStats { calls: 3, primitive_calls: 2, timed_calls: 2, total_ns: 30, self_ns: 20, max_ns: 15, child_calls: 1, outermost_calls: 2, nested_calls: 4, off_cpu_calls: 1, latency: Latency::from_kernel(&[0, 2]) };
        let b = FunctionStats { calls: 1, primitive_calls: 1, timed_calls: 1, total_ns: 5, self_ns: 5, max_ns: 5, child_calls: 0, outermost_calls: 1, nested_calls: 0, off_cpu_calls: 0, latency: Latency::from_kernel(&[1]) };
        let mut m = a.clone();
        m.merge(&b);
        assert_eq!((m.calls, m.primitive_calls, m.timed_calls, m.total_ns, m.self_ns, m.max_ns), (4, 3, 3, 35, 25, 15));
        assert_eq!((m.child_calls, m.outermost_calls, m.nested_calls), (1, 3, 4));
        assert_eq!(m.latency, Latency::from_kernel(&[1, 2]));
    }

    #[test]
    fn a_function_reads_back_as_written() {
        let f = Function { name: "f".into(), file: "app.py".into(), line: 3, stats: FunctionStats { calls: 2, primitive_calls: 2, timed_calls: 2, total_ns: 9, self_ns: 7, max_ns: 5, child_calls: 1, outermost_calls: 2, nested_calls: 1, off_cpu_calls: 0, latency: Latency::default() } };
        let back: Function = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
    }
}
