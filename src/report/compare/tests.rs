//! compare's unit tests: a small traced and sampled pair, by hand.

use std::path::Path;
use std::rc::Rc;

use anyhow::Result;

use super::inputs::SampledFunction;
use super::probe_cost::{CALLEE_SHARE, CONSTANT_NS_PER_CALL};
use super::*;
use crate::model::functions::Function;
use crate::model::samples::{Frame, Sample};
use crate::report::calls::CallsReport;
use crate::report::profile::Profile;

fn traced_fn(name: &str, line: u32, calls: u64, total_ns: u64, self_ns: u64, child_calls: u64, nested: u64) -> Function {
    let stats = FunctionStats { calls, primitive_calls: calls, timed_calls: calls, total_ns, self_ns, max_ns: 0, child_calls, outermost_calls: calls, nested_calls: nested, off_cpu_calls: 0, latency: Default::default() };
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
    SampledReport { pid: 7, python, hz: 1000, duration_ns: 1_000_000_000, samples, lost_events: 0, cpu_ns: None, functions }
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
    assert_eq!(c.traced.off_cpu_from, "samples");
}

/// With the target's CPU time measured, off-CPU time is the traced wall
/// time minus the CPU time in Python code (the probes' cost in both, so
/// their estimate plays no part): 50 of the 1000 samples were outside
/// Python code, so 95 % of the 700 ms measured.
#[test]
fn off_cpu_time_comes_from_the_cpu_time_measured_when_there_is_one() {
    let t = traced(example_functions(), 111);
    let mut s = sampled(
        vec![
            sampled_fn("main", "app.py", Some(1), 300, 850),
            sampled_fn("work", "app.py", Some(5), 500, 500),
            sampled_fn("[no Python code]", "", Some(0), 50, 50),
            sampled_fn(PROBES_ROW, "", Some(0), 150, 150),
        ],
        1000,
    );
    s.cpu_ns = Some(700_000_000);
    let c = Comparison::new(&t, &s);
    assert_eq!((c.traced.off_cpu_ns, c.traced.off_cpu_from), (1_000_000_000 - 665_000_000, "cpu_time"));
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
    // A difference says how large sampling's own error is, at how many samples.
    assert!(row(&c, "sleeper", 20).flags[0].message.contains(", beyond sampling's ±"), "{:?}", row(&c, "sleeper", 20).flags);

    // The table says once, in its header, what holds for many rows alike;
    // under each row it only shows what is that row's own.
    let table = c.to_table(100);
    assert!(table.contains("not compared: 1 function too short or rare for sampling to see"), "{table}");
    assert!(table.contains("probe-heavy: 2 functions with a quarter or more"), "{table}");
    assert!(!table.contains("sampling misses it") && !table.contains("pytrace's probes are ~"), "{table}");
    assert!(table.contains("↳ traced self share exceeds sampled"), "{table}");
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
    // A report that says its kind is taken at its word, even where its
    // fields would suggest another.
    assert_eq!(
        err(TracedReport::parse(r#"{"kind": "gc", "functions": []}"#, "c.json")),
        "c.json is a `pytrace gc --json` report, but --traced needs a `pytrace calls --json` report"
    );
    assert_eq!(err(TracedReport::parse(r#"{"kind": "later", "functions": []}"#, "c.json")), "c.json is not a pytrace report: --traced needs a `pytrace calls --json` report");
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
    let data = crate::model::functions::CallsData { functions, edges: Vec::new(), counters: counters.clone() };
    let calls = CallsReport::new(7, python(), 1_000_000_000, data, crate::report::calls::SortKey::Total);
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

/// The samples src/tracing/compare.rs sets apart are this row.
#[test]
fn samples_in_the_probes_are_the_probes_row() {
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
