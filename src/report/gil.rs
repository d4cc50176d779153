//! The `gil` report: per thread, the time it held the GIL, waited for it
//! and ran without it, how often it took it, and its waits' distribution.

use serde::Serialize;

use super::{human_ns, thousands};
use crate::model::counters::Counters;
use crate::tracing::gil::{FunctionGil, Place, ThreadGil, WaitBucket};

#[derive(Serialize, schemars::JsonSchema)]
pub struct WaitDistribution {
    /// Percentiles of the waits before each acquisition: the middle of the
    /// bucket holding them (within 1/16 of the value), never above the max.
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    /// Exact.
    pub max_ns: u64,
}

/// A thread as the probes measured it, with its waits' distribution
/// summarized (the JSON has the thread's fields at the row's top level).
#[derive(Serialize, schemars::JsonSchema)]
pub struct ThreadRow {
    #[serde(flatten)]
    pub thread: ThreadGil,
    pub wait: WaitDistribution,
}

/// A function that held the GIL while another waited, and for how long.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Blocker {
    pub name: String,
    pub file: String,
    pub line: u32,
    pub ns: u64,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct FunctionRow {
    pub name: String,
    pub file: String,
    pub line: u32,
    /// The GIL waits of calls that asked for it in this function.
    pub wait_ns: u64,
    /// The holding periods that ended (the GIL let go) in this function.
    pub held_ns: u64,
    /// Who held the GIL during those waits, most first.
    pub blocked_by: Vec<Blocker>,
}

/// How a place is named in the report: (name, file, line).
fn named(place: &Place) -> (String, String, u32) {
    match place {
        Place::Function(f) => (f.name.clone(), f.file.clone(), f.line),
        Place::NoFrame => ("(no Python frame)".into(), String::new(), 0),
        Place::Unreadable => ("(unreadable code object)".into(), String::new(), 0),
    }
}

/// The share of a wait with no holder to blame.
pub const NO_HOLDER: &str = "(no holder: hand-over)";

/// The functions, most waited in first, then most held.
pub fn function_rows(functions: std::collections::HashMap<Place, FunctionGil>) -> Vec<FunctionRow> {
    let mut rows: Vec<FunctionRow> = functions
        .into_iter()
        .map(|(place, f)| {
            let (name, file, line) = named(&place);
            let mut blocked_by: Vec<Blocker> = f
                .blocked_by
                .iter()
                .map(|(holder, &ns)| {
                    let (name, file, line) = named(holder);
                    Blocker { name, file, line, ns }
                })
                .collect();
            // The rest of the wait nobody held the GIL: a forced switch's
            // hand-over in drop_gil, or the GIL free and the waiter not yet
            // on a CPU.
            let blamed: u64 = blocked_by.iter().map(|b| b.ns).sum();
            if f.wait_ns > blamed {
                blocked_by.push(Blocker { name: NO_HOLDER.into(), file: String::new(), line: 0, ns: f.wait_ns - blamed });
            }
            blocked_by.sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.name.cmp(&b.name)));
            FunctionRow { name, file, line, wait_ns: f.wait_ns, held_ns: f.held_ns, blocked_by }
        })
        .collect();
    rows.sort_by(|a, b| (b.wait_ns, b.held_ns).cmp(&(a.wait_ns, a.held_ns)).then_with(|| (&a.name, &a.file, a.line).cmp(&(&b.name, &b.file, b.line))));
    rows
}

/// Rows of the functions table in the terminal.
const FUNCTION_ROWS: usize = 15;

#[derive(Serialize, schemars::JsonSchema)]
pub struct GilReport {
    pub kind: super::ReportKind,
    pub pid: u32,
    pub python: super::PythonInfo,
    pub duration_ns: u64,
    /// The GIL held by any thread (at most one at a time): the sum of held_ns.
    pub held_ns: u64,
    pub lost_events: u64,
    pub counters: Counters,
    pub threads: Vec<ThreadRow>,
    pub functions: Vec<FunctionRow>,
}

/// The value below which `fraction` of the waits fall, from the buckets
/// (lowest value, width, count), as the middle of its bucket.
fn percentile(buckets: &[WaitBucket], fraction: f64, max: u64) -> u64 {
    let total: u64 = buckets.iter().map(|b| b.2).sum();
    if total == 0 {
        return 0;
    }
    let rank = ((total as f64 * fraction).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for &(low, width, count) in buckets {
        seen += count;
        if seen >= rank {
            return low.saturating_add(width / 2).min(max);
        }
    }
    max
}

impl ThreadRow {
    pub fn from_thread(t: ThreadGil) -> Self {
        let b = &t.wait_buckets;
        let wait = WaitDistribution {
            p50_ns: percentile(b, 0.50, t.max_wait_ns),
            p90_ns: percentile(b, 0.90, t.max_wait_ns),
            p99_ns: percentile(b, 0.99, t.max_wait_ns),
            max_ns: t.max_wait_ns,
        };
        ThreadRow { thread: t, wait }
    }
}

impl GilReport {
    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    pub fn to_table(&self) -> String {
        let mut out = format!(
            "GIL of PID {} (Python {}, {}) over {}: held {} ({:.1}%) by {}\n",
            self.pid,
            self.python.version,
            self.python.mode,
            human_ns(self.duration_ns),
            human_ns(self.held_ns),
            share(self.held_ns, self.duration_ns),
            super::counted(self.threads.len() as u64, "thread"),
        );
        out.push_str(&super::counted_line(&self.counters));
        out.push_str(&format!(
            "{:>8}  {:<16} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "TID", "THREAD", "HELD", "%", "WAITED", "%", "RELEASED", "%", "TAKEN", "SWITCHES", "WAIT p50", "p90", "p99", "max"
        ));
        for row in &self.threads {
            let (t, wait) = (&row.thread, &row.wait);
            let life = t.lifetime_ns;
            out.push_str(&format!(
                "{:>8}  {:<16} {:>9} {:>5.1}% {:>9} {:>5.1}% {:>9} {:>5.1}% {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}{}\n",
                t.tid,
                t.name,
                human_ns(t.held_ns),
                share(t.held_ns, life),
                human_ns(t.wait_ns),
                share(t.wait_ns, life),
                human_ns(t.released_ns),
                share(t.released_ns, life),
                thousands(t.acquisitions),
                thousands(t.switches),
                human_ns(wait.p50_ns),
                human_ns(wait.p90_ns),
                human_ns(wait.p99_ns),
                human_ns(wait.max_ns),
                if t.exited { "  (exited)" } else { "" },
            ));
        }
        out.push_str("% of each thread's time in the session; WAITED includes a forced switch's hand-over in drop_gil\n");
        if !self.functions.is_empty() {
            out.push_str(&format!("\n{:<44} {:>9} {:>9}  BLOCKED BY (share of the wait; the holder's function when it let go)\n", "FUNCTION (where the wait began)", "WAITED", "HELD"));
            for f in self.functions.iter().take(FUNCTION_ROWS) {
                let place = match f.file.rsplit('/').next() {
                    Some(file) if !file.is_empty() => format!("{} ({file}:{})", f.name, f.line),
                    _ => f.name.clone(),
                };
                let blockers: Vec<String> = f.blocked_by.iter().take(3).map(|b| format!("{} {:.0}%", b.name, share(b.ns, f.wait_ns))).collect();
                out.push_str(&format!("{:<44} {:>9} {:>9}  {}\n", place, human_ns(f.wait_ns), human_ns(f.held_ns), blockers.join(", ")));
            }
            if self.functions.len() > FUNCTION_ROWS {
                out.push_str(&format!("({} more in --json)\n", self.functions.len() - FUNCTION_ROWS));
            }
        }
        out.push_str(&super::dropped_line(&self.counters));
        out
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { 100.0 * part as f64 / whole as f64 }
}

#[cfg(test)]
mod tests {
    use super::{function_rows, percentile, NO_HOLDER};
    use crate::tracing::gil::{FunctionGil, FunctionName, Place};

    fn place(name: &str) -> Place {
        Place::Function(FunctionName { name: name.into(), file: "app.py".into(), line: 1 })
    }

    #[test]
    fn blame_adds_up_to_the_wait_with_the_hand_over_as_the_rest() {
        let mut functions = std::collections::HashMap::new();
        let mut waiter = FunctionGil { wait_ns: 1000, held_ns: 5, ..Default::default() };
        waiter.blocked_by.insert(place("holder"), 700);
        waiter.blocked_by.insert(Place::NoFrame, 100);
        functions.insert(place("waiter"), waiter);
        functions.insert(place("holder"), FunctionGil { wait_ns: 0, held_ns: 900, ..Default::default() });
        let rows = function_rows(functions);
        assert_eq!(rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["waiter", "holder"]);
        let blame: Vec<(&str, u64)> = rows[0].blocked_by.iter().map(|b| (b.name.as_str(), b.ns)).collect();
        assert_eq!(blame, [("holder", 700), (NO_HOLDER, 200), ("(no Python frame)", 100)]);
        assert!(rows[1].blocked_by.is_empty());
    }

    #[test]
    fn percentiles_come_from_the_bucket_that_holds_the_rank() {
        // 90 waits in [8, 9), 9 in [1024, 1152), 1 in [65536, 73728).
        let buckets = [(8, 1, 90), (1024, 128, 9), (65536, 8192, 1)];
        assert_eq!(percentile(&buckets, 0.5, 70_000), 8);
        assert_eq!(percentile(&buckets, 0.9, 70_000), 8);
        assert_eq!(percentile(&buckets, 0.91, 70_000), 1088);
        assert_eq!(percentile(&buckets, 0.99, 70_000), 1088);
        // The top bucket's middle is above the exact max: the max wins.
        assert_eq!(percentile(&buckets, 1.0, 66_000), 66_000);
        assert_eq!(percentile(&[], 0.5, 0), 0);
    }
}
