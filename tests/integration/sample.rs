//! `pytrace sample` against fixtures whose CPU split, threads and stack
//! depth are known, on both local 3.11 builds.

use std::collections::HashMap;

use crate::common::*;

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
/// round, and measures what each really took (`--cpu-split`: in an emulated
/// VM every clock read costs enough to stretch the spins unevenly). At 999
/// Hz for 5 CPU-seconds (about 5000 samples, however busy the machine) one
/// share's standard error is about 0.7 points, so 2 points is a real bound,
/// not noise. pytrace stops when the target ends.
#[test]
fn cpu_shares_match_the_known_split_within_two_points() {
    let _machine = shared();
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("profile.json");
        let cpu_split = dir.path().join("cpu-split.json");
        let target = start_waiting(&python, "cpu_split.py", &["--cpu-seconds", &longer(5.0), "--cpu-split", cpu_split.to_str().unwrap()]);
        let tracer = start_tracer(&["sample", "-p", &target.pid().to_string(), "-r", "999", "--json", json.to_str().unwrap()]);
        signal(target.pid(), libc::SIGUSR1);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        let report = read_report(&json);
        assert_sample_split(label, &report, &cpu_split, 3000, 2.0);
        assert_eq!(report["lost_events"], 0, "{label}");
    }
}

/// How one run of the sweep below attaches.
#[derive(Clone, Copy, Debug)]
enum Attach {
    Pid,
    Command,
}

/// Samples in sixty, thirty and ten, from a `sample --json` report.
fn split_of(report: &serde_json::Value) -> [u64; 3] {
    let total = |name: &str| {
        report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_samples"].as_u64().unwrap()).unwrap_or(0)
    };
    [total("sixty"), total("thirty"), total("ten")]
}

/// Runs fixtures/cpu_split.py for `cpu_seconds` of its CPU under `pytrace
/// sample` at `hz` (None: the default rate), attached by PID or started by
/// pytrace; returns the samples of its three functions.
fn sample_split(python: &std::path::Path, hz: Option<u64>, attach: Attach, cpu_seconds: f64) -> [u64; 3] {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("profile.json");
    let mut args = vec!["sample".to_string(), "--json".into(), json.to_str().unwrap().into()];
    if let Some(hz) = hz {
        args.extend(["-r".into(), hz.to_string()]);
    }
    let seconds = cpu_seconds.to_string();
    match attach {
        Attach::Pid => {
            let target = start_waiting(python, "cpu_split.py", &["--cpu-seconds", &seconds]);
            args.extend(["-p".into(), target.pid().to_string()]);
            let tracer = start_tracer(&args.iter().map(String::as_str).collect::<Vec<_>>());
            signal(target.pid(), libc::SIGUSR1);
            let (code, _, stderr) = tracer.finish();
            assert_eq!(code, 0, "{stderr}");
        }
        Attach::Command => {
            args.extend(["--".into(), python.to_str().unwrap().into(), fixture("cpu_split.py"), "--cpu-seconds".into(), seconds]);
            let out = pytrace(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let report = read_report(&json);
    assert_eq!(report["lost_events"], 0, "{report}");
    split_of(&report)
}

/// A periodic workload's shares must not depend on the sampling rate. The
/// fixture splits every 10 ms of its CPU time 60/30/10; a strictly periodic
/// clock locks in phase with it at rates whose period is a multiple of 10
/// ms (10, 20, 50, 100 Hz: one function gets every sample) or a divisor
/// (200, 500, 1000 Hz), and nearly so near them (97, 499 Hz: issue #12
/// measured 32 points off at 97 Hz). Swept here on both 3.11 builds, by PID
/// and by command, the default rate (99 Hz) included.
///
/// The bound asserted holds by statistics: with the sampling instants
/// random with respect to the work, each sample is an independent draw, so
/// a share of n samples has a standard error of sqrt(p (1 - p) / n). Each
/// share must be within 4 standard errors, or 2 points when that is more
/// (a false failure is then about 1 in 15,000 per share). Each rate runs
/// long enough in CPU-seconds, whatever the machine's load, for several
/// hundred samples: 4 standard errors are 10 points for the 300 samples at
/// 10 Hz, 4.4 for the 2,000 at 1000 Hz; a locked clock is 30-40 points
/// off. (The jittering itself is checked against 2-point bias at every rate
/// on millions of simulated samples in src/tracing/sample/clock.rs.) The
/// mean rate is checked too: samples per CPU-second of the target at most
/// the rate plus 5 % and 4 standard errors, and at least 60 % of it (a
/// virtual machine whose CPU the host takes away loses samples).
#[test]
fn periodic_work_gets_its_share_at_every_rate() {
    let _machine = shared();
    let pythons = pythons();
    let (debian, nodtrace) = (&pythons[0].1, &pythons[1].1);
    use Attach::*;
    let jobs: Vec<(&str, &std::path::Path, Option<u64>, Attach, f64)> = vec![
        ("debian", debian, Some(10), Command, 30.0),
        ("debian", debian, Some(50), Pid, 8.0),
        ("debian", debian, None, Command, 5.0),
        ("debian", debian, Some(100), Pid, 5.0),
        ("debian", debian, Some(200), Command, 3.0),
        ("debian", debian, Some(499), Pid, 2.0),
        ("debian", debian, Some(500), Command, 2.0),
        ("debian", debian, Some(1000), Pid, 2.0),
        ("nodtrace", nodtrace, Some(20), Pid, 16.0),
        ("nodtrace", nodtrace, Some(50), Command, 8.0),
        ("nodtrace", nodtrace, Some(97), Pid, 5.0),
        ("nodtrace", nodtrace, None, Pid, 5.0),
        ("nodtrace", nodtrace, Some(100), Command, 5.0),
        ("nodtrace", nodtrace, Some(200), Pid, 3.0),
        ("nodtrace", nodtrace, Some(500), Pid, 2.0),
        ("nodtrace", nodtrace, Some(1000), Command, 2.0),
    ];
    // Two at a time, one per CPU of the machine the suite runs on.
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let Some((i, (label, python, hz, attach, seconds))) = queue.lock().unwrap().pop() else { break };
                let split = sample_split(python, hz, attach, seconds);
                results.lock().unwrap().push((i, label, hz.unwrap_or(99), attach, seconds, split));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let mut failures = Vec::new();
    let mut table = String::new();
    for (_, label, hz, attach, seconds, split) in results {
        let n: u64 = split.iter().sum();
        let mut line = format!("{label} {hz} Hz {attach:?}: {n} samples,");
        for (got, want) in split.iter().zip([60.0, 30.0, 10.0]) {
            let share = *got as f64 * 100.0 / n.max(1) as f64;
            let p = want / 100.0;
            let bound = (4.0 * 100.0 * (p * (1.0 - p) / n.max(1) as f64).sqrt()).max(2.0);
            line += &format!(" {share:.1} (want {want} ± {bound:.1})");
            if (share - want).abs() > bound {
                failures.push(format!("{label} at {hz} Hz ({attach:?}): {share:.1} % for {want} %, bound {bound:.1}"));
            }
        }
        let rate = n as f64 / seconds / hz as f64;
        line += &format!(", {:.0} % of the rate\n", rate * 100.0);
        if rate > 1.05 + 4.0 / (n.max(1) as f64).sqrt() || rate < 0.6 {
            failures.push(format!("{label} at {hz} Hz ({attach:?}): {n} samples in {seconds} CPU-seconds"));
        }
        table += &line;
    }
    assert!(failures.is_empty(), "{failures:#?}\n{table}");
    eprint!("{table}");
}

#[test]
fn each_threads_stacks_hold_its_own_function() {
    let _machine = shared();
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let folded = dir.path().join("threads.folded");
        let out = pytrace(&[
            "sample", "-r", "499", "--threads", "--folded", folded.to_str().unwrap(), "--",
            python.to_str().unwrap(), &fixture("threads_spin.py"), "1",
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
    let _machine = shared();
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
    let _machine = shared();
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
    let report = read_report(std::path::Path::new(&path("p.json")));
    assert!(report["samples"].as_u64().unwrap() > 500, "{report}");
    let folded = std::fs::read_to_string(path("p.folded")).unwrap();
    assert!(folded.lines().all(|l| l.rsplit_once(' ').is_some_and(|(_, n)| n.parse::<u64>().is_ok())));
    // --kernel: some samples end in the kernel (the process exiting, page faults).
    assert!(folded.contains("do_syscall_64") || folded.contains("exc_page_fault") || folded.contains("asm_"), "kernel frames");
}

/// --all: one BPF program samples every CPython on the machine, each with
/// its own interpreter's layout (here Debian's and the probe-less build at
/// once); every sample is rooted at its process. The targets run for 2
/// CPU-seconds each (500 samples of sixty each at 499 Hz, however busy the
/// machine); pytrace runs until both have ended, and Pythons that exit
/// while it samples are counted.
#[test]
fn all_samples_every_python_process_at_once() {
    let _machine = shared();
    let mut targets: Vec<Proc> = pythons().into_iter().map(|(_, python)| start_waiting(&python, "cpu_split.py", &["--cpu-seconds", "2"])).collect();
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("all.folded");
    let json = dir.path().join("all.json");
    let mut tracer = std::process::Command::new(PYTRACE)
        .args(["sample", "--all", "-r", "499", "--folded", folded.to_str().unwrap(), "--json", json.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(tracer.stderr.as_mut().unwrap()), &mut line).unwrap();
    assert!(line.contains("sampling every CPython process"), "{line}");
    for t in &targets {
        signal(t.pid(), libc::SIGUSR1);
    }
    for t in &mut targets {
        assert!(t.0.wait().unwrap().success());
    }
    // --all looks for exited processes every second.
    std::thread::sleep(std::time::Duration::from_secs(2));
    signal(tracer.id(), libc::SIGINT);
    assert!(tracer.wait().unwrap().success());
    let folded = std::fs::read_to_string(&folded).unwrap();
    for t in &targets {
        let pid = format!("({})", t.pid());
        let lines: Vec<&str> = folded.lines().filter(|l| l.split(';').next().is_some_and(|root| root.ends_with(pid.as_str()))).collect();
        let sixty: u64 = lines.iter().filter(|l| l.contains(";sixty (")).map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
        assert!(sixty > 250, "process {pid}: {sixty} samples in sixty");
    }
    let counters = &read_report(&json)["counters"];
    assert!(counters["processes_exited"].as_u64().unwrap() >= 2, "{counters}");
}

/// --all --idle samples every process found at start from the run's
/// first tick (issue #22.5: the first second went to finding them, then
/// uncounted). Three sleeping single-thread Pythons: each must have one
/// sample per pass over the threads, the passes due being the rate times
/// the run's own duration (from its JSON), less the ticks pytrace says it
/// skipped (late), within 12:
/// the ticks' periods are uniform in [0.5, 1.5] of the mean, so a count of
/// about 100 of them varies by sqrt(100 / 12) = 2.9 (four of those, and
/// one for the window's ends). Before the fix: 12 to 52 of 100.
#[test]
fn all_idle_samples_each_process_from_the_first_tick() {
    let _machine = shared();
    let sleeper = "import time\nprint('ready', flush=True)\ntime.sleep(60)";
    let targets: Vec<Proc> = (0..3)
        .map(|i| {
            let (_, python) = &pythons()[i % 2];
            let mut target = Proc(std::process::Command::new(python).args(["-c", sleeper]).stdout(std::process::Stdio::piped()).spawn().unwrap());
            wait_for_line(&mut target, "ready");
            target
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("all.folded");
    let out = pytrace(&["sample", "--all", "--idle", "-r", "50", "-d", "2", "--folded", folded.to_str().unwrap(), "--json", "-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = parse_report(&out.stdout);
    let seconds = report["duration_ns"].as_f64().unwrap() / 1e9;
    let counter = |name: &str| report["counters"][name].as_f64().unwrap_or(0.0);
    let missed = counter("idle_ticks_missed");
    let due = 50.0 * seconds - missed;
    assert!(due >= 50.0, "only {due} passes due in {seconds} s: {}", report["counters"]);
    let folded = std::fs::read_to_string(&folded).unwrap();
    for t in &targets {
        let pid = format!("({})", t.pid());
        let samples: u64 = folded.lines().filter(|l| l.split(';').next().is_some_and(|root| root.ends_with(pid.as_str()))).map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
        assert!((samples as f64 - due).abs() <= 12.0, "process {pid}: {samples} samples, {due:.1} passes due ({seconds:.2} s at 50 Hz, {missed} ticks skipped)");
    }
}

/// --idle's passes run on a thread at real-time priority where pytrace may
/// have it (a pass at normal priority waits for the target to free a CPU
/// and under-samples what it runs: docs/commands/sample.md). Where it may
/// not (no CAP_SYS_NICE: dropped here with setpriv, and `chrt` under the
/// same setpriv is refused, the independent check that it is), the run
/// still samples every pass due and says so in `idle_not_realtime`; where
/// it may (`chrt` works), the counter is absent. A sleeping Python, 2 s at
/// 50 Hz: one sample per pass due, within 12 as in the test above (at
/// least 50 passes due).
#[test]
fn idle_without_realtime_priority_still_samples_and_says_so() {
    let _machine = shared();
    let sleeper = "import time\nprint('ready', flush=True)\ntime.sleep(60)";
    let (_, python) = &pythons()[0];
    let mut target = Proc(std::process::Command::new(python).args(["-c", sleeper]).stdout(std::process::Stdio::piped()).spawn().unwrap());
    wait_for_line(&mut target, "ready");
    let pid = target.pid().to_string();
    let no_nice = ["setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice"];
    for refused in [false, true] {
        let run = |argv: &[&str]| {
            let argv: Vec<&str> = if refused { no_nice.iter().chain(argv).copied().collect() } else { argv.to_vec() };
            std::process::Command::new(argv[0]).args(&argv[1..]).output().unwrap()
        };
        let chrt = run(&["chrt", "-f", "1", "true"]);
        assert_eq!(chrt.status.success(), !refused, "chrt -f 1 with{} CAP_SYS_NICE", if refused { "out" } else { "" });
        let out = run(&[PYTRACE, "sample", "--idle", "-r", "50", "-d", "2", "-p", &pid, "--json", "-"]);
        assert!(out.status.success(), "refused {refused}: {}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = parse_report(&out.stdout);
        let counters = &report["counters"];
        assert_eq!(counters.get("idle_not_realtime").and_then(|c| c.as_u64()), refused.then_some(1), "refused {refused}: {counters}");
        let due = 50.0 * report["duration_ns"].as_f64().unwrap() / 1e9 - counters["idle_ticks_missed"].as_f64().unwrap();
        assert!(due >= 50.0, "refused {refused}: only {due} passes due: {counters}");
        let samples = report["samples"].as_f64().unwrap();
        assert!((samples - due).abs() <= 12.0, "refused {refused}: {samples} samples, {due:.1} passes due");
    }
}

/// Issue #27: --idle has no bias on a loaded machine. fixtures/idle_split.py
/// works 3 ms of CPU, sleeps 7 ms, and measures the wall time of each; with
/// a CPU-bound neighbour on each of two CPUs its work takes longer, and the
/// share of its samples in which `--states` says it runs (holding the GIL,
/// on a CPU or waiting for one) must be the share of the loop's wall time
/// it spent working, within 2 points, at 99 Hz and at 999 Hz. The ticks are
/// pytrace's own (a real-time thread, idle_pacer.rs): late ticks would land
/// after the work and read it short. A binomial draw at p = 0.5 has a
/// standard error of 0.65 points over 6,000 samples: 60 s at 99 Hz, 8 s at
/// 999 Hz, and at least 5,000 samples are required. Measured here (30 s at
/// 99 Hz, three runs): +2.0, +0.7 and +0.2 points; at 999 Hz, +0.1, +0.2
/// and +0.5 (the work's share 0.46 under load, 0.30 without).
#[test]
fn idle_split_matches_the_fixtures_wall_time_under_load() {
    let _machine = shared();
    let python = std::path::PathBuf::from("/usr/bin/python3.11");
    let _neighbours = cpu_bound_neighbours(&python, 2);
    for (rate, seconds) in [("99", "60"), ("999", "8")] {
        let truth_file = tempfile::NamedTempFile::new().unwrap();
        let out = pytrace(&["sample", "--idle", "--states", "-r", rate, "--json", "-", "--", python.to_str().unwrap(), &fixture("idle_split.py"), seconds, truth_file.path().to_str().unwrap()]);
        assert!(out.status.success(), "{rate} Hz: {}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = parse_report(&out.stdout);
        let share = |name: &str| report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map_or(0.0, |f| f["total_share"].as_f64().unwrap());
        let (working, sleeping) = (share("[running (GIL held)]"), share("[released: clock_nanosleep]"));
        let samples = (working + sleeping) * report["samples"].as_f64().unwrap();
        assert!(samples >= 5000.0, "{rate} Hz: only {samples:.0} samples of the loop");
        let truth = read_json(truth_file.path());
        let (work_wall, sleep_wall) = (truth["work_wall"].as_f64().unwrap(), truth["sleep_wall"].as_f64().unwrap());
        let want = work_wall / (work_wall + sleep_wall);
        let got = working / (working + sleeping);
        eprintln!("{rate} Hz: working in {got:.4} of {samples:.0} samples, {want:.4} of the wall time");
        assert!((got - want).abs() <= 0.02, "{rate} Hz: working in {got:.4} of {samples:.0} samples, against {want:.4} of the loop's wall time");
    }
}

/// --idle samples every thread at each tick, running or not: a thread that
/// mostly sleeps shows up as much as one that spins. Without it, sampling
/// is on-CPU: each thread's share of the two threads' samples is its share
/// of their CPU time (time.thread_time, measured by the fixture). The
/// sleeper works 1 ms after each 10 ms sleep: a known part of its CPU time
/// is Python work that samples must see, whatever its wake-ups cost (an
/// emulated VM inflates those where samples rarely land: 6.12 sampled a
/// quarter of a bare sleeper's 0.32 s).
#[test]
fn idle_sees_sleeping_threads_and_on_cpu_does_not() {
    let _machine = shared();
    for (label, python) in pythons() {
        let script = fixture("sleep_and_spin.py");
        let cpu_times = tempfile::NamedTempFile::new().unwrap();
        // Start-up is neither thread's: in a VM on a busy host it took more
        // than half of 2 s runs' samples (6.12: --idle saw the two threads
        // in 45 %), so the threads run 2.5 times longer there.
        let seconds = longer(2.0);
        let share = |extra: &[&str]| {
            let mut args = vec!["sample", "-r", "199", "--json", "-"];
            args.extend(extra);
            args.extend(["--", python.to_str().unwrap(), &script, &seconds, cpu_times.path().to_str().unwrap(), "1"]);
            let out = pytrace(&args);
            assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
            let report: serde_json::Value = parse_report(&out.stdout);
            let get = |name: &str| {
                report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_share"].as_f64().unwrap()).unwrap_or(0.0)
            };
            (get("sleeper"), get("spinner"), report["samples"].as_f64().unwrap())
        };
        // Half each of the two threads' samples (start-up, seconds of the
        // whole in an emulated VM, is neither's). The two threads must be a
        // good part of the whole, but only a guard: an emulated VM beside
        // busy builds spent twice the threads' 5 s in start-up (6.12: the
        // two had 49 % of the samples, in halves of 27 and 22 %).
        let (sleeper, spinner, _) = share(&["--idle"]);
        let of_both = sleeper / (sleeper + spinner);
        assert!((of_both - 0.5).abs() < 0.08 && sleeper + spinner > 0.3, "{label}: --idle gave sleeper {sleeper:.2}, spinner {spinner:.2}");
        // On CPU, of the two threads' samples (start-up, a larger part of
        // the samples when a busy machine gives the spinner less CPU, is
        // neither's), against their CPU times in that run.
        let (sleeper, spinner, samples) = share(&[]);
        let of_both = sleeper / (sleeper + spinner);
        // The two threads' samples, a binomial draw: 250 to 400 on the
        // host in 2 s at 199 Hz, where four points are only two to three
        // standard errors (a CI run saw 0.140 against 0.093). Four
        // standard errors, never under the four points.
        let n = (sleeper + spinner) * samples;
        let truth = read_json(cpu_times.path());
        let (sleeper_cpu, spinner_cpu) = (truth["sleeper"].as_f64().unwrap(), truth["spinner"].as_f64().unwrap());
        let want = sleeper_cpu / (sleeper_cpu + spinner_cpu);
        // Far from --idle's half (in an emulated VM the sleeper's wake-ups
        // and GIL hand-overs cost more: 6.1 gave it 30 % with 2 ms bursts).
        assert!(want < 0.3, "{label}: the sleeper used {sleeper_cpu:.3} s of CPU, the spinner {spinner_cpu:.3} s");
        // In a VM (PYTRACE_TEST_SLOWDOWN above 1) the sleeper's wake-ups
        // and GIL hand-overs cost most of its CPU time, and samples land in
        // that kernel work less often than in Python's (6.1 and 6.12: the
        // share came 1 to 4 points under its CPU share). There its
        // CPU-time share is the upper bound, and the lower one is its
        // share with only its bursts of Python work counted. What the host
        // takes from a virtual CPU is counted as CPU time of whichever
        // thread it interrupted, both alike, so it leaves the share as is.
        let bursts = truth["sleeper_bursts"].as_f64().unwrap();
        let lowest = if slowdown() > 1.0 { bursts / (bursts + spinner_cpu) } else { want };
        let margin = |p: f64| (4.0 * (p * (1.0 - p) / n).sqrt()).max(0.04);
        assert!(
            of_both > lowest - margin(lowest) && of_both < want + margin(want),
            "{label}: on-CPU gave sleeper {sleeper:.3}, spinner {spinner:.3} ({n:.0} samples of the two); CPU times {sleeper_cpu:.3} s ({bursts:.3} s of it in its bursts of work), {spinner_cpu:.3} s"
        );
    }
}

/// A target that makes code objects with huge line tables and long names
/// without end (issue #11: 1 MiB tables cached per object drove pytrace to
/// 3 GiB): pytrace's memory stays bounded whatever it makes. The fixture
/// makes 1.25 GiB of line tables (counted in bytes, not seconds: in 8
/// CPU-seconds a slower CI machine made only 0.93 GiB), half of them 1 MiB
/// each (too large to cache: used and dropped), half 60 KiB each and kept
/// alive by the target (so a cache of them grows past its 32 MiB cap and
/// is emptied). Both are counted, the target ends as it would have, and
/// pytrace's peak RSS stays under 150 MiB.
#[test]
fn a_code_object_flood_keeps_memory_bounded() {
    let _machine = shared();
    let (_, python) = pythons().remove(0);
    let mut target = start_waiting(&python, "code_flood.py", &["--table-bytes", &(5u64 << 28).to_string()]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let tracer = start_tracer_measured(&["sample", "-p", &target.pid().to_string(), "-r", "999", "--json", json.to_str().unwrap()]);
    signal(target.pid(), libc::SIGUSR1);
    let mut made = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(target.0.stdout.as_mut().unwrap()), &mut made).unwrap();
    assert!(target.0.wait().unwrap().success(), "the target did not end as it would have");
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "pytrace failed: {stderr}");
    let table_bytes: u64 = made.split_whitespace().nth(4).and_then(|b| b.parse().ok()).unwrap_or_else(|| panic!("{made}"));
    assert!(table_bytes > 1 << 30, "the flood made only {table_bytes} bytes of line tables: {made}");
    let peak_mib = peak_kib(&stderr) / 1024;
    assert!(peak_mib < 150, "pytrace peaked at {peak_mib} MiB while the target made {table_bytes} bytes of line tables");
    let report = read_report(&json);
    let counters = &report["counters"];
    assert!(counters["line_tables_not_kept"].as_u64().unwrap() > 0, "{counters}");
    assert!(counters["code_cache_flushes"].as_u64().unwrap() > 0, "{counters}");
    let named = report["functions"].as_array().unwrap().iter().filter(|f| f["name"].as_str().unwrap().starts_with("flood_")).count();
    assert!(named > 100, "only {named} of the flood's functions named");
}

/// While `pytrace compare`'s call probes fire (about half of the target's
/// CPU time is spent in them), the sampler's count still measures the
/// target's CPU time: samples / rate against the CPU time
/// fixtures/compare_mix.py measures around its work (the target sleeps in
/// sigwait until pytrace is attached, and exits right after), within four
/// binomial standard errors (each sample catches the target or not, with
/// odds CPU time / wall time) plus 3 % for its exit: 8 % at 999 Hz when
/// the target gets 2 CPU-s in 3 s. At two rates and both 3.11 builds (USDT
/// and uprobe probes). Each sample counts for its clock window's period:
/// counted alike, 3 s runs at 999 Hz were 8 % to 25 % off.
#[test]
fn sampled_cpu_matches_the_targets_cpu_time_while_probes_fire() {
    let _machine = shared();
    for (label, python) in pythons() {
        for hz in [999u64, 397] {
            let dir = tempfile::tempdir().unwrap();
            let times = dir.path().join("times.json");
            let cmp = dir.path().join("cmp.json");
            let target = start_waiting(&python, "compare_mix.py", &["--seconds", &longer(3.0), "--times", times.to_str().unwrap()]);
            let pid = target.pid().to_string();
            let rate = hz.to_string();
            let tracer = start_tracer(&["compare", "-p", &pid, "-r", &rate, "--json", cmp.to_str().unwrap()]);
            signal(target.pid(), libc::SIGUSR1);
            let (code, _, stderr) = tracer.finish();
            assert_eq!(code, 0, "{label} at {hz} Hz: {stderr}");
            let (cmp, times) = (read_report(&cmp), read_json(&times));
            let samples = cmp["sampled"]["samples"].as_u64().expect("sampled.samples");
            let in_probes = cmp["sampled"]["probe_samples"].as_u64().expect("sampled.probe_samples");
            let cpu = times["cpu"].as_f64().expect("the fixture's CPU seconds");
            let wall = times["wall"].as_f64().expect("the fixture's wall seconds");
            let sampled = samples as f64 / hz as f64;
            let expected = cpu * hz as f64;
            let standard_error = (expected * (1.0 - (cpu / wall).min(1.0))).sqrt() / expected;
            let bound = 4.0 * standard_error + 0.03;
            assert!(in_probes * 5 > samples, "{label} at {hz} Hz: only {in_probes} of {samples} samples inside the probes: they did not fire as meant");
            assert!(
                (sampled / cpu - 1.0).abs() < bound,
                "{label} at {hz} Hz: {samples} samples ({in_probes} inside the probes) are {sampled:.3} CPU-s, the target used {cpu:.3} in {wall:.3} s (bound {:.1} %)",
                bound * 100.0
            );
        }
    }
}

/// A command's start is mostly imports, and each module's code object is
/// freed as its import ends: named at user space's next periodic read
/// (every 250 ms) instead, 62-78 % of this command's samples had an
/// unreadable frame. For a process's first seconds new stacks wake pytrace
/// at once (at most every millisecond): 3-15 % with two CPU hogs beside
/// it. Ground truth for the names: every module whose body a sample shows
/// is one `-X importtime` says the same command imports.
#[test]
fn a_commands_imports_are_named_before_their_code_is_freed() {
    let _machine = shared();
    let (_, python) = pythons().remove(0);
    let imports = "import json, email.parser, http.client, asyncio, decimal, argparse, logging, unittest, xml.dom.minidom, sqlite3, csv, tarfile";
    let truth = std::process::Command::new(&python).args(["-X", "importtime", "-c", imports]).output().unwrap();
    assert!(truth.status.success());
    let imported: std::collections::HashSet<String> = String::from_utf8_lossy(&truth.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("import time:"))
        .filter_map(|l| l.rsplit('|').next())
        .map(|name| name.trim().to_string())
        .collect();
    assert!(imported.contains("asyncio") && imported.len() > 50, "{imported:?}");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("imports.json");
    let out = pytrace(&["sample", "-r", "1000", "--json", json.to_str().unwrap(), "--", python.to_str().unwrap(), "-c", imports]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = read_report(&json);
    let samples = report["samples"].as_u64().unwrap();
    assert!(samples >= 40, "enough samples to judge ({samples})");
    let functions = report["functions"].as_array().unwrap();
    let unreadable: f64 = functions.iter().filter(|f| f["name"] == "[unreadable frame]").map(|f| f["total_share"].as_f64().unwrap()).sum();
    assert!(unreadable <= 0.35, "{:.0} % of {samples} samples have an unreadable frame", unreadable * 100.0);
    let stdlib = "/usr/lib/python3.11/";
    let mut modules = 0;
    for f in functions.iter().filter(|f| f["name"] == "<module>") {
        let file = f["file"].as_str().unwrap();
        let Some(relative) = file.strip_prefix(stdlib) else { continue };
        let module = relative.trim_end_matches(".py").trim_end_matches("/__init__").replace('/', ".");
        assert!(imported.contains(&module), "{file} is named as a module body, but -X importtime saw no import of {module}");
        modules += 1;
    }
    assert!(modules >= 5, "module bodies named: {modules}");
}
