//! The `gc` report: collections per generation, pauses, and the share of
//! wall time spent collecting; and the --events log line.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{human_ns, thousands};
use crate::model::counters::Counters;
use crate::model::events::Collection;

/// Pauses to three significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures is a valid precision")
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct GenerationRow {
    pub generation: u32,
    pub collections: u64,
    pub collected: i64,
    pub total_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct GcReport {
    pub kind: super::ReportKind,
    pub pid: u32,
    pub python: super::PythonInfo,
    pub duration_ns: u64,
    pub lost_events: u64,
    pub counters: Counters,
    /// Time spent collecting over the traced wall time.
    pub gc_share: f64,
    pub generations: Vec<GenerationRow>,
}

/// Collections summed per generation as they arrive. Pauses are exact
/// (one event each), so their histogram is hdrhistogram's own.
#[derive(Default)]
pub struct GcTotals {
    per_generation: BTreeMap<u32, Generation>,
}

/// One generation's sums: collections, objects collected, pause total, pauses.
#[derive(Default)]
struct Generation {
    collections: u64,
    collected: i64,
    total_ns: u64,
    pauses: Option<Histogram<u64>>,
}

impl GcTotals {
    pub fn add(&mut self, c: &Collection) {
        let g = self.per_generation.entry(c.generation).or_default();
        g.collections += 1;
        g.collected += c.collected;
        g.total_ns += c.duration_ns;
        let _ = g.pauses.get_or_insert_with(new_histogram).record(c.duration_ns.max(1));
    }

    pub fn into_report(
        self,
        pid: u32,
        python: super::PythonInfo,
        duration_ns: u64,
        counters: Counters,
    ) -> GcReport {
        let generations: Vec<GenerationRow> = self
            .per_generation
            .into_iter()
            .map(|(generation, g)| {
                let hist = g.pauses.unwrap_or_else(new_histogram);
                GenerationRow {
                    generation,
                    collections: g.collections,
                    collected: g.collected,
                    total_ns: g.total_ns,
                    p50_ns: hist.value_at_quantile(0.5),
                    p90_ns: hist.value_at_quantile(0.9),
                    p99_ns: hist.value_at_quantile(0.99),
                    max_ns: hist.max(),
                }
            })
            .collect();
        let paused: u64 = generations.iter().map(|g| g.total_ns).sum();
        GcReport {
            kind: super::ReportKind::Gc,
            pid,
            python,
            duration_ns,
            lost_events: counters.lost(),
            counters,
            gc_share: if duration_ns > 0 { paused as f64 / duration_ns as f64 } else { 0.0 },
            generations,
        }
    }
}

/// One line of the --events log: time since attach, generation, pause,
/// objects collected.
pub fn event_line(since_attach_ns: u64, c: &Collection) -> String {
    format!(
        "{:>12.6}s  gen {}  pause {:>9}  collected {}",
        since_attach_ns as f64 / 1e9,
        c.generation,
        human_ns(c.duration_ns),
        c.collected
    )
}

impl GcReport {
    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    pub fn to_table(&self) -> String {
        let collections: u64 = self.generations.iter().map(|g| g.collections).sum();
        let mut out = format!(
            "pytrace gc: PID {}, Python {} ({} mode), {:.2} s, {}, {:.2}% of wall time in GC, {}\n",
            self.pid,
            self.python.version,
            self.python.mode,
            self.duration_ns as f64 / 1e9,
            super::counted(collections, "collection"),
            self.gc_share * 100.0,
            super::counted(self.lost_events, "lost event"),
        );
        out += &super::counted_line(&self.counters);
        out += &format!(
            "{:>10} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "generation", "collections", "collected", "total", "p50", "p90", "p99", "max"
        );
        for g in &self.generations {
            out += &format!(
                "{:>10} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
                g.generation,
                thousands(g.collections),
                thousands(g.collected.max(0) as u64),
                human_ns(g.total_ns),
                human_ns(g.p50_ns),
                human_ns(g.p90_ns),
                human_ns(g.p99_ns),
                human_ns(g.max_ns),
            );
        }
        let merged = self.counters.get("merged_collections");
        if merged > 0 {
            out += &format!("{merged} collections ran inside another's pause and were each given its whole pause\n");
        }
        out += &super::dropped_line(&self.counters);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_per_generation_and_computes_the_share() {
        let mut totals = GcTotals::default();
        for (generation, duration_ns, collected) in [(0, 1_000, 5), (0, 3_000, 7), (2, 10_000, 100)] {
            totals.add(&Collection { start_ns: 0, duration_ns, collected, generation });
        }
        let info = crate::report::PythonInfo { version: "3.11.2".into(), mode: "usdt".into() };
        let report = totals.into_report(1, info, 1_000_000, Default::default());
        assert_eq!(report.generations.len(), 2);
        let g0 = &report.generations[0];
        assert_eq!((g0.generation, g0.collections, g0.collected, g0.total_ns), (0, 2, 12, 4_000));
        assert!((3_000..=3_003).contains(&g0.max_ns), "hdrhistogram keeps 3 significant digits: {}", g0.max_ns);
        assert!((report.gc_share - 0.014).abs() < 1e-9);
        assert!(report.to_table().contains("1.40% of wall time in GC"));
    }
}
