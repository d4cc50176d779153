//! `pytrace sample` against fixtures whose CPU split, threads and stack
//! depth are known, on both local 3.11 builds.

mod common;

use std::collections::HashMap;

use common::*;

/// Samples per function, from a folded profile: name -> (thread -> samples).
fn per_thread(folded: &str, functions: &[&str]) -> HashMap<String, HashMap<String, u64>> {
    let mut out: HashMap<String, HashMap<String, u64>> = HashMap::new();
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let thread = stack.split(';').next().unwrap().to_string();
        for f in functions {
            if stack.split(';').any(|frame| frame.starts_with(&format!("{f} ("))) {
                *out.entry(f.to_string()).or_default().entry(thread.clone()).or_default() += n;
            }
        }
    }
    out
}

/// The fixture spins 6, 3 and 1 ms of CPU in sixty, thirty and ten each
/// round. At 999 Hz for 5 CPU-seconds (about 5000 samples, however busy
/// the machine) one share's standard error is about 0.7 points, so 2
/// points is a real bound, not noise. pytrace stops when the target ends.
#[test]
fn cpu_shares_match_the_known_split_within_two_points() {
    for (label, python) in pythons() {
        let target = start_waiting(&python, "cpu_split.py", &["--cpu-seconds", "5"]);
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("profile.json");
        let tracer = start_tracer(&["sample", "-p", &target.pid().to_string(), "-r", "999", "--json", json.to_str().unwrap()]);
        signal(target.pid(), libc::SIGUSR1);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        let report = read_json(&json);
        let total = |name: &str| {
            report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_samples"].as_u64().unwrap()).unwrap_or(0)
        };
        let (a, b, c) = (total("sixty"), total("thirty"), total("ten"));
        let sum = (a + b + c) as f64;
        assert!(sum > 3000.0, "{label}: only {sum} samples");
        for (got, want, name) in [(a, 60.0, "sixty"), (b, 30.0, "thirty"), (c, 10.0, "ten")] {
            let share = got as f64 / sum * 100.0;
            assert!((share - want).abs() <= 2.0, "{label}: {name} has {share:.1}% of samples, expected {want}%");
        }
        assert_eq!(report["lost_events"], 0, "{label}");
    }
}

#[test]
fn each_threads_stacks_hold_its_own_function() {
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let folded = dir.path().join("threads.folded");
        let out = pytrace(&[
            "sample", "-r", "499", "--threads", "--folded", folded.to_str().unwrap(), "--",
            python.to_str().unwrap(), &fixture("threads_spin.py"), "2",
        ]);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let seen = per_thread(&std::fs::read_to_string(&folded).unwrap(), &["spin_a", "spin_b", "spin_c"]);
        let mut threads = Vec::new();
        for f in ["spin_a", "spin_b", "spin_c"] {
            let by_thread = seen.get(f).unwrap_or_else(|| panic!("{label}: no samples in {f}"));
            assert_eq!(by_thread.len(), 1, "{label}: {f} sampled on several threads: {by_thread:?}");
            let (thread, n) = by_thread.iter().next().unwrap();
            assert!(*n > 100, "{label}: {f} has only {n} samples");
            threads.push(thread.clone());
        }
        threads.sort();
        threads.dedup();
        assert_eq!(threads.len(), 3, "{label}: each function on its own thread");
    }
}

/// 300 frames deep, more than a sample records (256): every sample at the
/// bottom is marked truncated at its root, with the innermost frames kept.
#[test]
fn deep_stacks_are_marked_truncated_never_cut_silently() {
    for (label, python) in pythons() {
        let out = pytrace(&["sample", "-r", "499", "--folded", "-", "--", python.to_str().unwrap(), &fixture("deep_recursion.py"), "1.5"]);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let folded = String::from_utf8(out.stdout).unwrap();
        let bottom: Vec<&str> = folded.lines().filter(|l| l.contains("spin_at_bottom (")).collect();
        assert!(!bottom.is_empty(), "{label}: no sample at the bottom");
        for line in bottom {
            let frames: Vec<&str> = line.rsplit_once(' ').unwrap().0.split(';').collect();
            assert_eq!(frames[0], "[truncated]", "{label}: {}", &line[..80]);
            assert_eq!(frames.len(), 257, "{label}: 256 frames and the marker");
            assert!(frames[1..frames.len() - 1].iter().all(|f| f.starts_with("descend (")), "{label}");
        }
    }
}

#[test]
fn every_output_format_is_written_even_when_the_target_exits_mid_sample() {
    let (_, python) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let out = pytrace(&[
        "sample", "-r", "999", "-d", "600", "--kernel",
        "--flamegraph", &path("p.svg"), "--folded", &path("p.folded"), "--speedscope", &path("p.speedscope.json"), "--json", &path("p.json"),
        "--", python.to_str().unwrap(), &fixture("cpu_split.py"), "--cpu-seconds", "1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(path("p.svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("</svg>") && svg.contains("sixty (") , "an SVG with Python frames");
    let speedscope = read_json(std::path::Path::new(&path("p.speedscope.json")));
    assert_eq!(speedscope["profiles"][0]["type"], "sampled");
    assert!(speedscope["shared"]["frames"].as_array().unwrap().iter().any(|f| f["name"] == "sixty" && f["line"].is_u64()));
    let report = read_json(std::path::Path::new(&path("p.json")));
    assert!(report["samples"].as_u64().unwrap() > 500, "{report}");
    let folded = std::fs::read_to_string(path("p.folded")).unwrap();
    assert!(folded.lines().all(|l| l.rsplit_once(' ').is_some_and(|(_, n)| n.parse::<u64>().is_ok())));
    // --kernel: some samples end in the kernel (the process exiting, page faults).
    assert!(folded.contains("do_syscall_64") || folded.contains("exc_page_fault") || folded.contains("asm_"), "kernel frames");
}

/// --all: one BPF program samples every CPython on the machine, each with
/// its own interpreter's layout (here Debian's and the probe-less build at
/// once); every sample is rooted at its process.
#[test]
fn all_samples_every_python_process_at_once() {
    let targets: Vec<(String, Proc)> = pythons()
        .into_iter()
        .map(|(_, python)| {
            let mut p = start_waiting(&python, "cpu_split.py", &["--seconds", "4"]);
            signal(p.pid(), libc::SIGUSR1);
            let _ = &mut p;
            (format!("({})", p.pid()), p)
        })
        .collect();
    let out = pytrace(&["sample", "--all", "-d", "2", "-r", "499", "--folded", "-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let folded = String::from_utf8(out.stdout).unwrap();
    for (pid, _) in &targets {
        let lines: Vec<&str> = folded.lines().filter(|l| l.split(';').next().is_some_and(|root| root.ends_with(pid.as_str()))).collect();
        let sixty: u64 = lines.iter().filter(|l| l.contains(";sixty (")).map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
        assert!(sixty > 100, "process {pid}: {sixty} samples in sixty");
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("sampling every CPython process"));
}

/// --idle samples every thread at each tick, running or not: a thread that
/// only sleeps shows up as much as one that spins. Without it, sampling is
/// on-CPU and the sleeper is (almost) absent.
#[test]
fn idle_sees_sleeping_threads_and_on_cpu_does_not() {
    for (label, python) in pythons() {
        let script = fixture("sleep_and_spin.py");
        let share = |extra: &[&str]| {
            let mut args = vec!["sample", "-r", "199", "--json", "-"];
            args.extend(extra);
            args.extend(["--", python.to_str().unwrap(), &script]);
            args.push("2");
            let out = pytrace(&args);
            assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let get = |name: &str| {
                report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_share"].as_f64().unwrap()).unwrap_or(0.0)
            };
            (get("sleeper"), get("spinner"))
        };
        let (sleeper, spinner) = share(&["--idle"]);
        assert!((sleeper - 0.5).abs() < 0.08 && (spinner - 0.5).abs() < 0.08, "{label}: --idle gave sleeper {sleeper:.2}, spinner {spinner:.2}");
        let (sleeper, spinner) = share(&[]);
        assert!(sleeper < 0.05 && spinner > 0.9, "{label}: on-CPU gave sleeper {sleeper:.2}, spinner {spinner:.2}");
    }
}
