//! The flags of a row: where one side sees what the other cannot, or the
//! two differ by more than sampling noise.

use serde::Serialize;

use super::probe_cost::{corrected_self, Overhead};
use super::{ratio, Row};
use crate::model::functions::FunctionStats;
use crate::report::thousands;

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

#[derive(Serialize, Debug, Clone, PartialEq, schemars::JsonSchema)]
pub struct Flag {
    pub kind: &'static str,
    pub message: String,
}

/// Flags that hold for many rows alike (short functions sampling cannot
/// see, short functions the probes inflate): the table counts them once in
/// its header instead of repeating them under each row; --json keeps them
/// per row.
pub const SUMMARISED: &[&str] = &["below_sampling", "probe_cost"];

/// What one side sees and the other misses, for one row.
pub fn flags(r: &Row, t: &FunctionStats, n: u64, overhead: &Overhead, off_cpu_share: f64) -> Vec<Flag> {
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
                "{} of its {} calls were not timed (deeper than the timed stack, or run inline and counted untimed): its traced time lacks theirs",
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
        let noise = (SIGMAS * sigma).max(MIN_FLAGGED_DIFF);
        if diff.abs() > noise {
            let beyond = format!(", beyond sampling's ±{:.1} at {} samples", noise * 100.0, thousands(n));
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
                flag("sampled_more", format!("sampled self share exceeds traced by {:.1} points{beyond}{why}", diff * 100.0));
            } else {
                flag("traced_more", format!("traced self share exceeds sampled by {:.1} points{beyond}{why}", -diff * 100.0));
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
