//! `pytrace heap` against fixtures/heap_known.py's own census: the
//! fixture starts (pytrace reads its interpreter's own objects: the
//! baseline), builds a known heap, takes gc.get_objects() by
//! `module.qualname` and sys.getsizeof sums last, and waits. One fixture
//! run per build is checked every way: --stop counts equal the census
//! exactly, a walk without --stop within 1 %, the built str/int/float/bytes
//! are found above the baseline within 1 %, bytes as getsizeof counts
//! them, --by-module, and the target runs on after the --stop walk.

use std::collections::HashMap;
use std::process::{Command, Stdio};

use crate::common::matrix::Interpreter;
use crate::common::*;
use serde_json::Value;

/// Instances of each of the fixture's two classes, and str/int/float built.
pub(crate) const INSTANCES: u64 = 20_000;
pub(crate) const VALUES: u64 = 50_000;

/// `pytrace heap ARGS -p PID --json -`, which must succeed.
fn heap_json(pid: u32, args: &[&str]) -> Value {
    let pid = pid.to_string();
    let out = pytrace(&[&["heap", "-p", &pid, "--json", "-"], args].concat());
    assert!(out.status.success(), "pytrace heap {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let report = parse_report(&out.stdout);
    assert_eq!(report["kind"], "heap");
    report
}

/// The last walk's rows, by (`module.qualname`, tracked).
fn rows(report: &Value) -> HashMap<(String, bool), (u64, u64)> {
    let snapshot = report["snapshots"].as_array().unwrap().last().unwrap();
    snapshot["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let name = format!("{}.{}", r["module"].as_str().unwrap(), r["qualname"].as_str().unwrap());
            ((name, r["tracked"].as_bool().unwrap()), (r["count"].as_u64().unwrap(), r["bytes"].as_u64().unwrap()))
        })
        .collect()
}

fn census_equals_gc_get_objects(py: Interpreter) {
    check_census(py, true)
}

/// Debian's 3.11 (host's /usr/bin/python3.11) is stripped: obmalloc's
/// static arena table has no symbol, so the tracked objects are counted
/// exactly and the footer says, in a sentence, that small untracked ones
/// were not.
fn stripped_build_counts_tracked_objects(py: Interpreter) {
    check_census(py, false)
}

fn check_census(py: Interpreter, has_arenas: bool) {
    let label = format!("heap {}", py.version);
    let (inside, host) = py.output("heap-truth.json");
    let (instances, values) = (INSTANCES.to_string(), VALUES.to_string());
    let argv = py.argv("heap_known.py", &[&inside, "--instances", &instances, "--values", &values]);
    let mut target = Proc(Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::piped()).spawn().unwrap());
    let pid = target.pid();
    check_census_of(&label, &mut target, pid, &host, has_arenas);
}

/// heap_known.py (started with `--instances INSTANCES --values VALUES`,
/// its stdout read from `target`, `pid` as pytrace sees it, writing its
/// census to `truth`, a path on this host) checked every way against its
/// own census. Also run in a container (containers.rs).
pub(crate) fn check_census_of(label: &str, target: &mut Proc, pid: u32, truth: &std::path::Path, has_arenas: bool) {
    // The interpreter's own objects, before the fixture builds anything.
    wait_for_line(target, "base");
    let base = rows(&heap_json(pid, &[]));
    signal(pid, libc::SIGUSR1);
    wait_for_line(target, "ready");
    let truth = read_json(truth);

    // --stop: every type's count equals gc.get_objects()'s.
    let stopped = heap_json(pid, &["--stop"]);
    let walk = &stopped["snapshots"][0];
    assert!(walk["stopped_ns"].as_u64().unwrap() > 0, "{label}: no stop time: {walk}");
    assert_eq!(walk["list_broken"], Value::Null, "{label}");
    // gc.freeze()'s permanent generation, counted apart.
    assert_eq!(walk["frozen_objects"], truth["freeze_count"], "{label}: frozen objects");
    if has_arenas {
        assert_eq!(walk["arenas_not_read"], Value::Null, "{label}");
    } else {
        let why = walk["arenas_not_read"].as_str().unwrap_or_else(|| panic!("{label}: {walk}"));
        assert!(why.contains("a stripped build"), "{label}: {why}");
        assert_eq!(walk["untracked_objects"], 0, "{label}");
    }
    let got = rows(&stopped);
    let census = truth["gc_counts"].as_object().unwrap();
    for (name, want) in census {
        let have = got.get(&(name.clone(), true)).map_or(0, |r| r.0);
        assert_eq!(have, want.as_u64().unwrap(), "{label}: tracked {name}");
    }
    let extra: Vec<_> = got.keys().filter(|(name, tracked)| *tracked && !census.contains_key(name)).collect();
    assert!(extra.is_empty(), "{label}: types gc.get_objects() does not have: {extra:?}");
    for class in ["__main__.Slotted", "__main__.Plain"] {
        assert_eq!(got[&(class.to_string(), true)].0, INSTANCES, "{label}: {class}");
        // Instances of a class are sized by the default rule plus the
        // collector's header (and the managed dict's words, 3.11+): exactly
        // what sys.getsizeof says, summed.
        assert_eq!(got[&(class.to_string(), true)].1, truth["gc_bytes"][class].as_u64().unwrap(), "{label}: bytes of {class}");
    }
    // dict, set and frozenset by their own __sizeof__ (their tables, owned
    // keys, split values), summed: exactly sys.getsizeof's sum over the
    // fixture's dicts of every shape, sets and frozensets of every size.
    for kind in ["builtins.dict", "builtins.set", "builtins.frozenset"] {
        let want = truth["gc_bytes"][kind].as_u64().unwrap_or_else(|| panic!("{label}: the census has no {kind}"));
        assert_eq!(got[&(kind.to_string(), true)].1, want, "{label}: bytes of {kind}");
    }
    assert_eq!(walk["tables_unread"], 0, "{label}");

    // The built untracked objects, above the baseline: counts within 1 %
    // (the interpreter makes a few of its own between the two walks: 8 ints
    // on pyenv's 3.12), bytes within 1 % of their getsizeof sum (str by its
    // kind and length, int by its digits, float and bytes by the default).
    for kind in ["str", "int", "float", "bytes"].into_iter().filter(|_| has_arenas) {
        let key = (format!("builtins.{kind}"), false);
        let (count, bytes) = got.get(&key).copied().unwrap_or_default();
        let (base_count, base_bytes) = base.get(&key).copied().unwrap_or_default();
        let built = &truth["built"][kind];
        let (want_count, want_bytes) = (built["count"].as_u64().unwrap() as f64, built["bytes"].as_u64().unwrap() as f64);
        let found = count as f64 - base_count as f64;
        assert!((found - want_count).abs() <= want_count * 0.01, "{label}: {kind}: {found} found above the baseline, {want_count} built");
        let found_bytes = bytes as f64 - base_bytes as f64;
        assert!((found_bytes - want_bytes).abs() <= want_bytes * 0.01, "{label}: {kind}: {found_bytes} bytes found, {want_bytes} built");
    }

    // Without --stop, on a target that allocates nothing while it waits:
    // within 1 % for every type of 100 objects or more.
    let running = rows(&heap_json(pid, &[]));
    for (name, want) in census {
        let want = want.as_u64().unwrap() as f64;
        let have = running.get(&(name.clone(), true)).map_or(0, |r| r.0) as f64;
        if want >= 100.0 {
            assert!((have - want).abs() <= want * 0.01, "{label}: running walk: {name} {have} of {want}");
        }
    }

    // --by-module: the fixture's own module holds its two classes' instances.
    let by_module = pytrace(&["heap", "-p", &pid.to_string(), "--by-module", "--top", "1000"]);
    let text = String::from_utf8_lossy(&by_module.stdout);
    let main_row = text.lines().find(|l| l.ends_with(" __main__")).unwrap_or_else(|| panic!("{label}: no __main__ row:\n{text}"));
    let main_count: u64 = main_row.split_whitespace().next().unwrap().replace(',', "").parse().unwrap();
    assert!(main_count >= 2 * INSTANCES, "{label}: {main_row}");

    // The target runs on after the --stop walks: it answers a signal.
    signal(pid, libc::SIGUSR1);
    wait_for_line(target, "alive");
}

over_builds! {
    pyenv_3_9(Interpreter::pyenv("3.9")): census_equals_gc_get_objects;
    pyenv_3_10(Interpreter::pyenv("3.10")): census_equals_gc_get_objects;
    pyenv_3_11(Interpreter::pyenv("3.11")): census_equals_gc_get_objects;
    pyenv_3_12(Interpreter::pyenv("3.12")): census_equals_gc_get_objects;
    pyenv_3_13(Interpreter::pyenv("3.13")): census_equals_gc_get_objects;
    debian_3_13(Interpreter::debian("3.13")): census_equals_gc_get_objects;
    debian_3_14(Interpreter::debian("3.14")): census_equals_gc_get_objects;
    debian_3_15(Interpreter::debian("3.15")): census_equals_gc_get_objects;
    debian_3_11(Interpreter::host("3.11", "/usr/bin/python3.11".into())): stripped_build_counts_tracked_objects;
}

/// A `-- command`, or no -p: one sentence and a non-zero exit.
#[test]
fn heap_needs_a_running_process() {
    let _machine = shared();
    let out = pytrace(&["heap", "--", "python3", "-c", "pass"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(error_lines(&err).len(), 1, "{err}");
    assert!(err.contains("already running") && err.contains("-p"), "{err}");
    let out = pytrace(&["heap", "-p", "999999999"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(error_lines(&err).len(), 1, "{err}");
}

/// `--interval 2 -n 3` on fixtures/heap_growing.py (2,000 `Leaked` a
/// second on its own schedule, a list of str growing slower, a dict a tick
/// made and freed): the growth table names Leaked first, at the rate the
/// fixture measures itself within 10 %, with every walk whole while the
/// target runs.
#[test]
fn growth_names_the_leaking_class_first() {
    let _machine = shared();
    let python = pyenv_python(12);
    let mut target = Proc(Command::new(&python).arg(fixture("heap_growing.py")).stdout(Stdio::piped()).spawn().unwrap());
    wait_for_line(&mut target, "ready");
    let report = heap_json(target.pid(), &["--interval", "2", "-n", "3"]);
    signal(target.pid(), libc::SIGUSR1);
    let stdout = target.0.stdout.as_mut().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let own_rate: f64 = line.trim().strip_prefix("rate ").unwrap_or_else(|| panic!("{line:?}")).parse().unwrap();
    let snapshots = report["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 3);
    for s in snapshots {
        assert_eq!(s["list_broken"], Value::Null, "{s}");
        assert_eq!(s["partial"], false);
    }
    let first = &report["growth"][0];
    assert_eq!(first["qualname"], "Leaked", "{}", report["growth"]);
    assert_eq!(first["module"], "__main__");
    let rate = first["count_per_s"].as_f64().unwrap();
    // At least 4 s of walks at 2,000 a second: 8,000 objects counted.
    assert!(first["count_delta"].as_i64().unwrap() >= 7_000, "{first}");
    assert!((rate - own_rate).abs() <= own_rate * 0.10, "pytrace's rate {rate}/s, the fixture's own {own_rate}/s");
}

/// pytrace SIGKILLed while it holds the target stopped (--stop, seen as
/// the target's TracerPid): the kernel detaches it and the target runs on,
/// untraced, and answers a signal.
#[test]
fn a_killed_stop_walk_leaves_the_target_running() {
    let _machine = shared();
    let python = pyenv_python(12);
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.json");
    // 300,000 instances of each class: a walk of about a second.
    let mut target = big_heap(&python, &truth);
    let pid = target.pid();
    let mut tracer = Proc(Command::new(PYTRACE).args(["heap", "--stop", "-p", &pid.to_string()]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    let tracer_pid = tracer.pid();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tracer_pid_of(pid) != Some(tracer_pid) {
        assert!(std::time::Instant::now() < deadline, "pytrace never held the target");
        assert!(tracer.0.try_wait().unwrap().is_none(), "pytrace ended before it was killed: make the heap bigger");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    tracer.0.kill().unwrap();
    tracer.0.wait().unwrap();
    assert_eq!(tracer_pid_of(pid), Some(0), "the target is still traced");
    signal(pid, libc::SIGUSR1);
    wait_for_line(&mut target, "alive");
}

/// heap_known.py with 300,000 instances of each class (a walk of about a
/// second), built and waiting.
fn big_heap(python: &std::path::Path, truth: &std::path::Path) -> Proc {
    let mut target = Proc(
        Command::new(python)
            .arg(fixture("heap_known.py"))
            .args([truth.to_str().unwrap(), "--instances", "300000", "--values", "10"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_for_line(&mut target, "base");
    signal(target.pid(), libc::SIGUSR1);
    wait_for_line(&mut target, "ready");
    target
}

fn tracer_pid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("TracerPid:")?.trim().parse().ok())
}

/// A target killed while pytrace walks its heap: one sentence and a
/// non-zero exit, never a census of half a heap. The walk of this heap
/// takes a fraction of a second, so the kill is timed by what the target
/// shows: with --stop it is traced by pytrace exactly while the walk runs.
#[test]
fn a_target_that_exits_mid_walk_is_one_sentence() {
    let _machine = shared();
    let python = pyenv_python(12);
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.json");
    let mut target = big_heap(&python, &truth);
    let pid = target.pid();
    let mut tracer = Command::new(PYTRACE).args(["heap", "--stop", "-p", &pid.to_string()]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tracer_pid_of(pid) != Some(tracer.id()) {
        assert!(std::time::Instant::now() < deadline, "pytrace never held the target");
        assert!(tracer.try_wait().unwrap().is_none(), "pytrace ended before the target was killed: make the heap bigger");
        std::thread::yield_now();
    }
    target.0.kill().unwrap();
    let out = tracer.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a census of an exited process: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(error_lines(&err).len(), 1, "{err}");
    assert!(err.contains(&format!("process {pid} exited during the heap walk")) || err.contains("has exited"), "{err}");
}

/// Every numeric flag of heap given extreme values: each run ends with a
/// census (exit 0) or one `pytrace: ` sentence (exit 1 or clap's 2),
/// never a panic, and the target is neither killed nor left traced.
#[test]
fn extreme_numbers_for_every_heap_flag() {
    let _machine = shared();
    let python = pyenv_python(12);
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.json");
    let mut target = Proc(
        Command::new(&python).arg(fixture("heap_known.py")).args([truth.to_str().unwrap()]).stdout(Stdio::piped()).spawn().unwrap(),
    );
    wait_for_line(&mut target, "base");
    let pid = target.pid().to_string();
    let values = ["0", "-5", "1e20", "NaN", "inf", "-inf", "18446744073709551616", "18446744073709551615", "4294967296", ""];
    for flag in ["-p", "--interval", "-n", "--top", "--timeout"] {
        for value in values {
            let mut args = vec!["heap", flag, value];
            if flag != "-p" {
                args.extend(["-p", &pid, "--stop"]);
            }
            let out = pytrace(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let what = format!("pytrace {args:?}");
            assert!(matches!(out.status.code(), Some(0..=2)), "{what}: {:?}: {stderr}", out.status);
            assert!(!stderr.contains("panicked"), "{what}: {stderr}");
            if !out.status.success() {
                let said = error_lines(&stderr);
                assert!(said.len() == 1 && said[0].starts_with("pytrace: "), "{what}: one sentence, not {stderr:?}");
            }
            assert_eq!(tracer_pid_of(target.pid()), Some(0), "{what}: the target is left traced");
        }
    }
    signal(target.pid(), libc::SIGUSR1);
    wait_for_line(&mut target, "ready");
}

/// `--diff A.json B.json` of two saved walks of fixtures/heap_growing.py
/// 2 s apart: Leaked first, at the fixture's own rate within 10 %; a report
/// of another kind is refused in one sentence.
#[test]
fn diff_of_two_saved_reports_names_the_leak() {
    let _machine = shared();
    let python = pyenv_python(12);
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let mut target = Proc(Command::new(&python).arg(fixture("heap_growing.py")).stdout(Stdio::piped()).spawn().unwrap());
    wait_for_line(&mut target, "ready");
    let pid = target.pid().to_string();
    for (i, file) in [&a, &b].into_iter().enumerate() {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
        let out = pytrace(&["heap", "-p", &pid, "--json", file.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    signal(target.pid(), libc::SIGUSR1);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(target.0.stdout.as_mut().unwrap()), &mut line).unwrap();
    let own_rate: f64 = line.trim().strip_prefix("rate ").unwrap_or_else(|| panic!("{line:?}")).parse().unwrap();
    let out = pytrace(&["heap", "--diff", a.to_str().unwrap(), b.to_str().unwrap(), "--json", "-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = parse_report(&out.stdout);
    let first = &report["growth"][0];
    assert_eq!(first["qualname"], "Leaked", "{}", report["growth"]);
    let rate = first["count_per_s"].as_f64().unwrap();
    assert!(first["count_delta"].as_i64().unwrap() >= 3_000, "{first}");
    assert!((rate - own_rate).abs() <= own_rate * 0.10, "--diff's rate {rate}/s, the fixture's own {own_rate}/s");
    // Another kind of report: one sentence.
    let info = dir.path().join("info.json");
    assert!(pytrace(&["info", "--json", info.to_str().unwrap()]).status.success());
    let out = pytrace(&["heap", "--diff", info.to_str().unwrap(), b.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && error_lines(&err).len() == 1 && err.contains("not a heap report"), "{err}");
}

/// How far the heap changed during a walk (the collector's young count
/// just after less just before) against what the target did meanwhile:
/// fixtures/heap_growing.py logs the wall-clock span of each tick, in
/// which it makes PER_TICK tracked `Leaked` (and a generator and a dict
/// it frees within the tick; outside ticks the count does not move). The
/// report says when the walk started and how long it took, the span of
/// its two reads of the count, so a walk without --stop reports at least
/// PER_TICK × the ticks wholly inside it (less 2 for a tick's transient
/// objects) and at most PER_TICK × the ticks that touch it (plus 2). No
/// bound depends on how the target or pytrace were scheduled, except that
/// the lower one allows SLACK between a reading of the clock and the read
/// of the count beside it (and the log's clock is the same one). A
/// --stop walk reports 0.
#[test]
fn a_walk_says_how_far_the_heap_changed_during_it() {
    walk_change_is_the_targets(&pyenv_python(12));
}

/// The same on a free-threaded build, whose count is buffered per thread.
#[test]
fn a_walk_says_how_far_a_free_threaded_heap_changed_during_it() {
    walk_change_is_the_targets(&crate::free_threaded::free_threaded());
}

fn walk_change_is_the_targets(python: &std::path::Path) {
    const PER_TICK: i64 = 500;
    const SLACK_NS: i64 = 50_000_000;
    // unix_s is an f64 of seconds: a few hundred nanoseconds of rounding.
    const ROUNDING_NS: i64 = 1_000_000;
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ticks.log");
    let per_tick = PER_TICK.to_string();
    // 2,500,000 tuples beside the growth: walks of about 0.3 s here, some
    // 30 ticks, so that ticks fit inside the walk's span less its slack.
    let args = ["--per-tick", &per_tick, "--tick", "0.01", "--base", "2500000", "--log", log.to_str().unwrap()];
    let mut target = Proc(Command::new(python).arg(fixture("heap_growing.py")).args(args).stdout(Stdio::piped()).spawn().unwrap());
    wait_for_line(&mut target, "ready");
    let ticks_until = |end: i64| -> Vec<(i64, i64)> {
        // The tick under way at the walk's end may not be logged yet.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let ticks: Vec<(i64, i64)> = std::fs::read_to_string(&log)
                .unwrap()
                .lines()
                .filter_map(|l| l.split_once(' ').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())))
                .collect();
            if ticks.last().is_some_and(|&(t0, _)| t0 > end) {
                return ticks;
            }
            assert!(std::time::Instant::now() < deadline, "the fixture logged no tick after the walk's end in 30 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let mut inside_total = 0;
    for _ in 0..4 {
        let walk = heap_json(target.pid(), &[]);
        let snapshot = &walk["snapshots"][0];
        let change = snapshot["young_change"].as_i64().unwrap_or_else(|| panic!("no young_change: {snapshot}"));
        let start = (snapshot["unix_s"].as_f64().unwrap() * 1e9) as i64;
        let end = start + snapshot["walk_ns"].as_i64().unwrap();
        let ticks = ticks_until(end + ROUNDING_NS);
        let inside = ticks.iter().filter(|&&(t0, t1)| t0 >= start + SLACK_NS && t1 <= end - SLACK_NS).count() as i64;
        let touching = ticks.iter().filter(|&&(t0, t1)| t1 >= start - ROUNDING_NS && t0 <= end + ROUNDING_NS).count() as i64;
        assert!(
            change >= inside * PER_TICK - 2 && change <= touching * PER_TICK + 2,
            "{change} objects during a walk of {} ms: {inside} ticks of {PER_TICK} inside it, {touching} touching it",
            (end - start) / 1_000_000
        );
        inside_total += inside;
        let stopped = heap_json(target.pid(), &["--stop"]);
        assert_eq!(stopped["snapshots"][0]["young_change"], 0, "a --stop walk: {}", stopped["snapshots"][0]);
    }
    // Else the lower bound was never put to the test.
    assert!(inside_total > 0, "no tick of the fixture fell wholly inside any of the four walks");
}
