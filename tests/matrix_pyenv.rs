//! The version matrix's assertions (tests/matrix.rs) on pyenv's CPython
//! 3.10 and 3.12, which Debian does not package: shared libpython, symbol
//! tables, no USDT probes, run from this machine's root (scripts/pythons.sh
//! pyenv-3.10, pyenv-3.12). calls equal to cProfile by `--` and by `-p` and
//! to the profiling hook on four threads, gc equal to gc.callbacks through
//! the watchpoint on the collector's state, the 60/30/10 CPU split sampled
//! and compared, and what `info` reports. (`imports` without probes is
//! tested on these builds in tests/imports.rs.)

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

fn python(version: &str) -> PathBuf {
    let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg(format!("pyenv-{version}")).output().unwrap();
    assert!(out.status.success(), "scripts/pythons.sh pyenv-{version}: {}", String::from_utf8_lossy(&out.stderr));
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(path.exists(), "{}", path.display());
    path
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = pytrace(args);
    assert!(out.status.success(), "pytrace {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a JSON report on stdout")
}

fn assert_counts(version: &str, how: &str, report: &serde_json::Value, truth: &[(u32, String, u64)]) {
    let label = format!("{version} {how}");
    let reported = report["python"]["version"].as_str().unwrap();
    // The patch level too (3.10 keeps it only as the tail of other strings).
    assert!(reported.starts_with(&format!("{version}.")) && reported.len() > version.len() + 1, "{label}: {reported}");
    assert_eq!(report["python"]["mode"], "uprobe", "{label}");
    let rows = rows_for_file(report, "/callgraph.py");
    for (line, name, calls) in truth {
        let row = find_row(&rows, *line, name).unwrap_or_else(|| panic!("{label}: no row for {name} (line {line})"));
        assert_eq!(row["calls"].as_u64().unwrap(), *calls, "{label}: calls of {name} (line {line})");
    }
    assert_eq!(report["lost_events"], 0, "{label}");
    assert!(report.get("caveats").is_none(), "{label}: {}", report["caveats"]);
}

fn calls_equal_cprofile(version: &str) {
    let python = python(version);
    let py = python.to_str().unwrap();
    let truth = cprofile_calls(&python, "callgraph.py", &["--rounds", "20"]);
    let report = run_json(&["calls", "--json", "-", "--", py, &fixture("callgraph.py"), "--rounds", "20"]);
    assert_counts(version, "calls --", &report, &truth);

    let target = start_waiting(&python, "callgraph.py", &["--rounds", "20"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("calls.json");
    let tracer = start_tracer(&["calls", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    assert!(tracer.stderr_head.contains(&format!("(Python {version}.")), "{}", tracer.stderr_head);
    signal(target.pid(), libc::SIGUSR1);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{stderr}");
    assert_counts(version, "calls -p", &read_json(&json), &truth);
}

fn calls_on_four_threads(version: &str) {
    let python = python(version);
    let args = ["--threads", "4", "--iterations", "300"];
    let truth = hook_calls(&python, "threads.py", &args);
    let script = fixture("threads.py");
    let mut argv = vec!["calls", "--json", "-", "--", python.to_str().unwrap(), &script];
    argv.extend(args);
    let report = run_json(&argv);
    let rows = rows_for_file(&report, "/threads.py");
    for (line, name, calls) in truth.iter().filter(|t| t.1 != "<lambda>") {
        let row = find_row(&rows, *line, name).unwrap_or_else(|| panic!("{version}: no row for {name}"));
        assert_eq!(row["calls"].as_u64().unwrap(), *calls, "{version}: calls of {name} on 4 threads");
    }
    assert_eq!(report["counters"]["unmatched_return"], 0, "{version}");
}

fn gc_equals_gc_callbacks(version: &str) {
    let python = python(version);
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.json");
    let json = dir.path().join("gc.json");
    let mut target = start_waiting(&python, "gc_cycles.py", &["--rounds", "60000", "--truth", truth.to_str().unwrap()]);
    let tracer = start_tracer(&["gc", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    // No USDT probes: a watchpoint on the collector's state.
    assert!(tracer.stderr_head.contains("watchpoint mode"), "{version}: {}", tracer.stderr_head);
    signal(target.pid(), libc::SIGUSR1);
    wait_for_line(&mut target, "done");
    signal(tracer.child.pid(), libc::SIGINT);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{stderr}");
    let key = |v: &serde_json::Value| {
        v.as_array().unwrap().iter().map(|g| (g["generation"].as_u64(), g["collections"].as_u64(), g["collected"].as_i64())).collect::<Vec<_>>()
    };
    let want = key(&read_json(&truth));
    assert_eq!(want.len(), 3, "{version}: the fixture collects all three generations");
    assert_eq!(key(&read_json(&json)["generations"]), want, "{version}: (generation, collections, collected)");
}

fn sample_split(version: &str) {
    let python = python(version);
    let report = run_json(&["sample", "-r", "999", "--json", "-", "--", python.to_str().unwrap(), &fixture("cpu_split.py"), "--cpu-seconds", "4"]);
    let total = |name: &str| {
        report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_samples"].as_u64().unwrap()).unwrap_or(0)
    };
    let split = [("sixty", 60.0), ("thirty", 30.0), ("ten", 10.0)];
    let sum: u64 = split.iter().map(|(f, _)| total(f)).sum();
    assert!(sum > 3000, "{version}: only {sum} samples");
    for (name, want) in split {
        let share = total(name) as f64 * 100.0 / sum as f64;
        assert!((share - want).abs() <= 2.0, "{version}: {name} has {share:.1}% of samples, expected {want}%");
    }
}

fn compare_split(version: &str) {
    let python = python(version);
    let cmp = run_json(&["compare", "-r", "999", "--json", "-", "--", python.to_str().unwrap(), &fixture("cpu_split.py"), "--cpu-seconds", "3"]);
    let row = |name: &str| cmp["functions"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{version}: no {name}")).clone();
    let calls = row("sixty")["calls"].as_u64().unwrap();
    assert!(calls > 100 && row("thirty")["calls"] == calls && row("ten")["calls"] == calls, "{version}: {calls}");
    for field in ["corrected_total_share", "sampled_total_share"] {
        let shares: Vec<f64> = ["sixty", "thirty", "ten"].iter().map(|n| row(n)[field].as_f64().unwrap()).collect();
        let sum: f64 = shares.iter().sum();
        for (got, want) in shares.iter().zip([60.0, 30.0, 10.0]) {
            assert!((got / sum * 100.0 - want).abs() <= 3.0, "{version}: {field}: {got} of {sum} for {want}%");
        }
    }
}

fn info_names_each_mode(version: &str) {
    let python = python(version);
    let target = start_waiting(&python, "callgraph.py", &["--rounds", "1"]);
    let info = run_json(&["info", "-p", &target.pid().to_string(), "--json", "-"]);
    assert!(info["version"].as_str().unwrap().starts_with(&format!("{version}.")), "{info}");
    assert!(info["interpreter"].as_str().unwrap().ends_with(&format!("libpython{version}.so.1.0")), "{info}");
    assert_eq!(info["shared_library"], true);
    assert_eq!(info["calls_mode"], "uprobe");
    assert_eq!(info["function_probes"], "missing", "{info}");
    assert!(info["gc_mode"].as_str().unwrap().starts_with("watchpoint"), "{info}");
    assert_eq!(info["calls_probe"], "emulated by the kernel", "{info}");
    assert!(info["layout"].as_str().unwrap().contains("built-in table"), "{info}");
}

macro_rules! matrix {
    ($($module:ident => $version:literal;)*) => {$(
        mod $module {
            #[test]
            fn calls_equal_cprofile() {
                super::calls_equal_cprofile($version)
            }
            #[test]
            fn calls_on_four_threads() {
                super::calls_on_four_threads($version)
            }
            #[test]
            fn gc_equals_gc_callbacks() {
                super::gc_equals_gc_callbacks($version)
            }
            #[test]
            fn sample_split() {
                super::sample_split($version)
            }
            #[test]
            fn compare_split() {
                super::compare_split($version)
            }
            #[test]
            fn info_names_each_mode() {
                super::info_names_each_mode($version)
            }
        }
    )*};
}

matrix! {
    pyenv_3_10 => "3.10";
    pyenv_3_12 => "3.12";
}
