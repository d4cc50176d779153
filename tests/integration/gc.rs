//! `pytrace gc` against the collector's own record (gc.callbacks): on both
//! local 3.11 builds (Debian's through the gc USDT probes, the probe-less
//! one through the watchpoint on the collector's state), and in watchpoint
//! mode on pyenv's 3.9 to 3.13 (no probes) and on Debian's 3.11 (whose
//! probes it then leaves alone).

use crate::common::*;

fn generations(v: &serde_json::Value) -> Vec<(u64, u64, i64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| (g["generation"].as_u64().unwrap(), g["collections"].as_u64().unwrap(), g["collected"].as_i64().unwrap()))
        .collect()
}

#[test]
fn collections_and_collected_equal_gc_callbacks_when_attached_by_pid() {
    let _machine = shared();
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let truth = dir.path().join("truth.json");
        let json = dir.path().join("gc.json");
        let mut target = start_waiting(&python, "gc_cycles.py", &["--rounds", "100000", "--truth", truth.to_str().unwrap()]);
        let tracer = start_tracer(&["gc", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
        let mode = if label == "debian" { "usdt mode" } else { "watchpoint mode" };
        assert!(tracer.stderr_head.contains(mode), "{label}: {}", tracer.stderr_head);
        signal(target.pid(), libc::SIGUSR1);
        wait_for_line(&mut target, "done");
        signal(tracer.child.pid(), libc::SIGINT);
        let (code, table, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        let report = read_report(&json);
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
    let _machine = shared();
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let truth = dir.path().join("truth.json");
        let json = dir.path().join("gc.json");
        let out = pytrace(&[
            "gc", "--events", "--json", json.to_str().unwrap(), "--",
            python.to_str().unwrap(), &fixture("gc_cycles.py"), "--rounds", "30000", "--truth", truth.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let report = read_report(&json);
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

/// The watchpoint on every version without probes (pyenv's 3.9 to 3.13,
/// shared libpythons) and on Debian's 3.11 (non-PIE, stripped, probes
/// ignored with --mode watchpoint): each generation's collections and
/// objects equal gc.callbacks'.
#[test]
fn watchpoint_mode_is_exact_on_every_version() {
    let _machine = shared();
    let mut builds: Vec<(String, std::path::PathBuf, &[&str])> = (9..=13).map(|minor| (format!("pyenv 3.{minor}"), pyenv_python(minor), &[][..])).collect();
    builds.push(("debian 3.11".into(), pythons().remove(0).1, &["--mode", "watchpoint"][..]));
    for (label, python, extra) in builds.into_iter().filter(|b| wanted(&b.0)) {
        let dir = tempfile::tempdir().unwrap();
        let truth = dir.path().join("truth.json");
        let json = dir.path().join("gc.json");
        let mut target = start_waiting(&python, "gc_cycles.py", &["--rounds", "60000", "--truth", truth.to_str().unwrap()]);
        let tracer = start_tracer(&[&["gc", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()], extra].concat());
        assert!(tracer.stderr_head.contains("watchpoint mode"), "{label}: {}", tracer.stderr_head);
        signal(target.pid(), libc::SIGUSR1);
        wait_for_line(&mut target, "done");
        signal(tracer.child.pid(), libc::SIGINT);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        let report = read_report(&json);
        let want = generations(&read_json(&truth));
        assert_eq!(want.len(), 3, "{label}: the fixture collects all three generations");
        assert_eq!(generations(&report["generations"]), want, "{label}: (generation, collections, collected)");
        for counter in ["event_lost", "stats_unreadable", "merged_collections", "unmatched_done"] {
            assert_eq!(report["counters"][counter], 0, "{label}: {counter}");
        }
    }
}

/// --mode usdt where there are no probes says so, and what to use instead.
#[test]
fn usdt_mode_without_probes_says_why() {
    let _machine = shared();
    let out = pytrace(&["gc", "--mode", "usdt", "--", pyenv_python(12).to_str().unwrap(), "-c", "pass"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("gc__start and gc__done USDT probes") && stderr.contains("--mode watchpoint"), "{stderr}");
}

/// A thread whose debug registers are all taken (here by four watchpoints
/// this test sets, as a debugger would) cannot get pytrace's: gc says so,
/// in one sentence, and leaves the target running.
#[test]
fn watchpoint_mode_says_when_the_debug_registers_are_taken() {
    let _machine = shared();
    #[repr(C)]
    #[derive(Default)]
    struct BreakpointAttr {
        kind: u32,
        size: u32,
        config: u64,
        sample_period: u64,
        sample_type: u64,
        read_format: u64,
        flags: u64,
        wakeup_events: u32,
        bp_type: u32,
        bp_addr: u64,
        bp_len: u64,
    }
    let python = pyenv_python(12);
    let target = start_waiting(&python, "gc_cycles.py", &["--rounds", "1000"]);
    // Four 8-byte watchpoints on the target's first page: x86 has four debug registers.
    let base = std::fs::read_to_string(format!("/proc/{}/maps", target.pid())).unwrap();
    let base = u64::from_str_radix(base.split('-').next().unwrap(), 16).unwrap();
    let mut fds = Vec::new();
    for i in 0..4u64 {
        let attr = BreakpointAttr { kind: 5, size: std::mem::size_of::<BreakpointAttr>() as u32, sample_period: 1, flags: 1 << 5, bp_type: 2, bp_addr: base + 8 * i, bp_len: 8, ..Default::default() };
        // SAFETY: perf_event_open with a valid attr; closed below.
        let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr, target.pid() as i32, -1i32, -1i32, 0u64) };
        assert!(fd >= 0, "watchpoint {i}: {}", std::io::Error::last_os_error());
        fds.push(fd as i32);
    }
    let out = pytrace(&["gc", "-p", &target.pid().to_string(), "-d", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("every hardware debug register of that thread is taken"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one sentence: {stderr}");
    for fd in fds {
        unsafe { libc::close(fd) };
    }
    assert!(std::path::Path::new(&format!("/proc/{}", target.pid())).exists(), "the target still runs");
}

/// The published schema is a real check: a real report passes it, and the
/// same report with one field of the wrong type, or without its
/// schema_version, is refused with the validator naming the field.
#[test]
fn schema_refuses_a_report_with_a_wrong_field() {
    let _machine = shared();
    let (_, python) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("gc.json");
    let out = pytrace(&["gc", "--json", json.to_str().unwrap(), "--", python.to_str().unwrap(), "-c", "import gc; gc.collect()"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = read_report(&json);

    let mut wrong_type = report.clone();
    wrong_type["pid"] = serde_json::json!("1234");
    let refused = check_report(&wrong_type).expect_err("a string pid passed the schema");
    assert!(refused.contains("\"/pid\"") && refused.contains("\"1234\" is not of type \"integer\""), "{refused}");

    let mut unversioned = report.clone();
    unversioned.as_object_mut().unwrap().remove("schema_version");
    let refused = check_report(&unversioned).expect_err("a report without schema_version passed the schema");
    assert!(refused.contains("\"schema_version\" is a required property"), "{refused}");
}
