//! What pytrace's own probes cost per call, and traced times with that
//! cost taken out: measured from the samples taken inside the probes when
//! there are enough of them, a constant otherwise.

use serde::Serialize;

use super::inputs::SampledReport;
use crate::model::functions::FunctionStats;
use crate::report::{human_ns, thousands};

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

#[derive(Serialize, Debug, schemars::JsonSchema)]
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

impl Overhead {
    pub fn estimate(sampled: &SampledReport, probe_samples: u64, evaluations: u64, correctable: bool) -> Self {
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

/// Self time without the probes: the callee part of each timed call, and
/// the caller part of each evaluation those calls entered.
pub fn corrected_self(t: &FunctionStats, o: &Overhead) -> Option<u64> {
    if !o.corrected {
        return None;
    }
    let probes = t.timed_calls * o.callee_ns_per_call + t.child_calls * o.caller_ns_per_call;
    Some(t.self_ns.saturating_sub(probes))
}

/// Total time without the probes: the callee part of each outermost call,
/// and the whole cost of every evaluation entered under it.
pub fn corrected_total(t: &FunctionStats, o: &Overhead) -> Option<u64> {
    if !o.corrected {
        return None;
    }
    let probes = t.outermost_calls * o.callee_ns_per_call + t.nested_calls * o.ns_per_call;
    Some(t.total_ns.saturating_sub(probes))
}
