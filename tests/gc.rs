//! `pytrace gc` against the collector's own record (gc.callbacks), on both
//! local 3.11 builds: Debian's through the gc USDT probes, the probe-less
//! one through a uprobe session on gc_collect_main.

mod common;

use common::*;

fn generations(v: &serde_json::Value) -> Vec<(u64, u64, i64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| (g["generation"].as_u64().unwrap(), g["collections"].as_u64().unwrap(), g["collected"].as_i64().unwrap()))
        .collect()
}

#[test]
fn collections_and_collected_equal_gc_callbacks_when_attached_by_pid() {
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let truth = dir.path().join("truth.json");
        let json = dir.path().join("gc.json");
        let mut target = start_waiting(&python, "gc_cycles.py", &["--rounds", "100000", "--truth", truth.to_str().unwrap()]);
        let tracer = start_tracer(&["gc", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
        let mode = if label == "debian" { "usdt mode" } else { "uprobe mode" };
        assert!(tracer.stderr_head.contains(mode), "{label}: {}", tracer.stderr_head);
        signal(target.pid(), libc::SIGUSR1);
        wait_for_line(&mut target, "done");
        signal(tracer.child.pid(), libc::SIGINT);
        let (code, table, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        let report = read_json(&json);
        let truth: serde_json::Value = read_json(&truth);
        let (got, want) = (generations(&report["generations"]), generations(&truth));
        assert_eq!(got, want, "{label}: (generation, collections, collected)");
        assert!(want.iter().all(|g| g.1 > 0) && want.len() == 3, "{label}: the fixture exercises all three generations");
        assert_eq!(report["lost_events"], 0);
        for g in report["generations"].as_array().unwrap() {
            let (p50, max, total) = (g["p50_ns"].as_u64().unwrap(), g["max_ns"].as_u64().unwrap(), g["total_ns"].as_u64().unwrap());
            assert!(0 < p50 && p50 <= max && max <= total, "{label}: {g}");
        }
        let share = report["gc_share"].as_f64().unwrap();
        assert!(share > 0.0 && share < 1.0, "{label}: gc_share {share}");
        assert!(table.contains("of wall time in GC"), "{label}: {table}");
    }
}

/// Started by pytrace, the process's start-up may collect too (before the
/// fixture turns automatic collection off), so pytrace sees at least what
/// gc.callbacks saw; and --events prints one line per collection.
#[test]
fn events_stream_one_line_per_collection_when_pytrace_starts_the_command() {
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let truth = dir.path().join("truth.json");
        let json = dir.path().join("gc.json");
        let out = pytrace(&[
            "gc", "--events", "--json", json.to_str().unwrap(), "--",
            python.to_str().unwrap(), &fixture("gc_cycles.py"), "--rounds", "30000", "--truth", truth.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let report = read_json(&json);
        let got = generations(&report["generations"]);
        for (generation, collections, _) in generations(&read_json(&truth)) {
            let seen = got.iter().find(|g| g.0 == generation).map(|g| g.1).unwrap_or(0);
            assert!(seen >= collections, "{label}: generation {generation}: {seen} < {collections}");
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines = stdout.lines().filter(|l| l.contains(" gen ") && l.contains("pause")).count() as u64;
        assert_eq!(lines, got.iter().map(|g| g.1).sum::<u64>(), "{label}: one --events line per collection");
    }
}

/// The probe-less build's uprobe mode without uprobe sessions (kernels
/// before 6.13, forced here): still exact against gc.callbacks.
#[test]
fn gc_uprobe_mode_without_sessions_is_exact_too() {
    let (label, python) = pythons().remove(1);
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.json");
    let json = dir.path().join("gc.json");
    let mut target = start_waiting(&python, "gc_cycles.py", &["--rounds", "60000", "--truth", truth.to_str().unwrap()]);
    let tracer = start_tracer_env(&["gc", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()], &[("PYTRACE_NO_UPROBE_SESSION", "1")]);
    assert!(tracer.stderr_head.contains("uprobe mode"), "{label}: {}", tracer.stderr_head);
    signal(target.pid(), libc::SIGUSR1);
    wait_for_line(&mut target, "done");
    signal(tracer.child.pid(), libc::SIGINT);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{label}: {stderr}");
    assert_eq!(generations(&read_json(&json)["generations"]), generations(&read_json(&truth)), "{label}");
}
