//! `sample --async` against what fixtures/async_tasks.py measures of
//! itself: two named tasks, each running its own coroutine chain on one
//! event-loop thread, awaited by a task named "main" (itself awaited by the
//! unnamed task `asyncio.run` makes, `Task-1`), each timing the CPU it
//! spends (time.thread_time). Every sample taken in a task's code must be
//! under that task's name and awaiter chain, and the tasks' shares of the
//! samples must be their shares of the CPU time. On Debian's 3.14 (the
//! task layout in the `_asyncio` extension module, mapped only once asyncio
//! is imported: after pytrace started sampling) and 3.15 (in the
//! interpreter). Before 3.14, one sentence and a non-zero exit.

use std::collections::HashMap;
use std::path::Path;

use crate::common::matrix::Interpreter;
use crate::common::*;

const RATE: &str = "499";

/// The root frames each task's samples must carry: the task, then the
/// tasks awaiting it, outermost first.
fn roots(task: &str) -> String {
    format!("[task {task}];[awaited by task Task-1];[awaited by task main];")
}

/// Samples by (task whose code ran, the frames before its chain), from
/// folded stacks; the chain must be the task's own, in order.
fn samples_by_task(label: &str, folded: &Path) -> HashMap<(String, String), f64> {
    let chains = [("alpha", "alpha_outer (", &["alpha_middle (", "alpha_spin ("][..]), ("beta", "beta_outer (", &["beta_spin ("][..])];
    let mut by = HashMap::new();
    for line in std::fs::read_to_string(folded).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        for (task, outer, inner) in chains {
            let Some(at) = frames.iter().position(|f| f.starts_with(outer)) else { continue };
            // Inside the outer coroutine: the spin's samples, with the chain
            // leading to it in order.
            let Some(spin) = frames.iter().position(|f| f.starts_with(inner[inner.len() - 1])) else { continue };
            let chain: Vec<&str> = frames[at + 1..=spin].iter().map(|f| f.split(' ').next().unwrap()).collect();
            let want: Vec<&str> = inner.iter().map(|f| f.trim_end_matches(" (")).collect();
            assert_eq!(chain, want, "{label}: {task}'s chain in {line}");
            let before = frames[..at].iter().take_while(|f| f.starts_with('[')).fold(String::new(), |s, f| s + f + ";");
            *by.entry((task.to_string(), before)).or_insert(0.0) += n.parse::<f64>().unwrap();
        }
    }
    by
}

fn tasks_carry_their_names_chains_and_shares(py: Interpreter) {
    let label = format!("debian {}", py.version);
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("async.folded");
    let json = dir.path().join("async.json");
    let (inside, truth_path) = py.output("async-truth.json");
    let out = py.pytrace(
        &["sample", "--async", "-r", RATE, "--folded", folded.to_str().unwrap(), "--json", json.to_str().unwrap()],
        "async_tasks.py",
        &[&inside, &longer(2.0)],
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let report = read_report(&json);
    let stacks = std::fs::read_to_string(&folded).unwrap();
    // A task that ends before its stack is named (within about 100 ms) is
    // unreadable by design, and asyncio makes such tasks of its own (the
    // runner's shut-down runs `shutdown_asyncgens` in one, 6.12's CI VM
    // sampled it once). The fixture's tasks live on for NAMING_GRACE after
    // their last spin: none of their code may be unreadable, and what is
    // must stay a trace.
    let unreadable: Vec<&str> = stacks.lines().filter(|l| l.starts_with("[task unreadable]")).collect();
    let ours = |l: &str| ["alpha_", "beta_", "spin ("].iter().any(|f| l.contains(f));
    assert!(!unreadable.iter().any(|l| ours(l)), "{label}: the fixture's tasks unreadable: {unreadable:?}\n{table}");
    let count = |l: &str| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap();
    let unreadable_samples: f64 = unreadable.iter().map(|l| count(l)).sum();
    let samples: f64 = stacks.lines().map(count).sum();
    assert!(unreadable_samples <= 0.005 * samples, "{label}: {unreadable_samples} of {samples} samples unreadable: {unreadable:?}\n{table}");
    assert!(report["counters"]["tasks_unreadable"].as_f64().is_some(), "{label}: no tasks_unreadable counter\n{table}");
    let truth: HashMap<String, f64> = serde_json::from_slice(&std::fs::read(&truth_path).unwrap()).unwrap();
    let by = samples_by_task(&label, &folded);
    // Every sample of a task's code is under its own name and awaiters.
    for ((task, before), n) in &by {
        assert_eq!(*before, roots(task), "{label}: {n} samples of {task}'s code under other roots: {by:?}");
    }
    let got = |task: &str| by.get(&(task.to_string(), roots(task))).copied().unwrap_or(0.0);
    let n = got("alpha") + got("beta");
    let cpu = truth["alpha"] + truth["beta"];
    assert!(n >= 300.0, "{label}: {n} samples of the tasks' spins: {by:?}\n{table}");
    for task in ["alpha", "beta"] {
        let p = truth[task] / cpu;
        let share = got(task) / n;
        // Four binomial standard errors, plus two points.
        let bound = 4.0 * (p * (1.0 - p) / n).sqrt() + 0.02;
        assert!((share - p).abs() <= bound, "{label}: {task} has {share:.3} of the samples, {p:.3} of the CPU time (bound {bound:.3}): {by:?}");
    }
}

/// Attached by PID to a loop already running (its `_asyncio` module mapped
/// before pytrace looks): the same names and chains.
#[test]
fn async_tasks_by_pid_debian_3_14() {
    let _machine = shared();
    let py = Interpreter::debian("3.14");
    let (inside, _) = py.output("async-truth.json");
    let target = py.start_waiting("async_tasks.py", &[&inside, &longer(4.0)]);
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("async.folded");
    let pid = target.pid().to_string();
    let out = pytrace(&["sample", "--async", "-r", RATE, "-d", "1", "-p", &pid, "--folded", folded.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let by = samples_by_task("debian 3.14 by PID", &folded);
    for ((task, before), n) in &by {
        assert_eq!(*before, roots(task), "{n} samples of {task}'s code under other roots: {by:?}");
    }
    for task in ["alpha", "beta"] {
        assert!(by.get(&(task.to_string(), roots(task))).copied().unwrap_or(0.0) >= 10.0, "{task}: {by:?}");
    }
}

/// A task awaited by several at once (asyncio keeps them in a set):
/// fixtures/async_dump.py's "shared", awaited by "waiter-1" and
/// "waiter-2", spinning now and then in its own loop's thread, beside the
/// main thread's loop of one-by-one awaiters. Each sample of a task's code
/// carries the awaiters asyncio's own capture_call_graph gives it.
#[test]
fn a_task_awaited_by_several_carries_them_all_debian_3_14() {
    let _machine = shared();
    let py = Interpreter::debian("3.14");
    let (inside, truth_path) = py.output("async-dump-truth.json");
    let target = py.start_waiting("async_dump.py", &[&inside]);
    let truth: serde_json::Value = read_json(&truth_path);
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("several.folded");
    let out = pytrace(&["sample", "--async", "-r", RATE, "-d", &longer(2.0), "-p", &target.pid().to_string(), "--folded", folded.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The roots asyncio's graph gives each task's samples: one-by-one
    // awaiters outermost first, the several at once (sorted) in one frame.
    let roots = |task: &str| {
        let mut chain = Vec::new();
        let mut at = task.to_string();
        let mut several = String::new();
        loop {
            let awaiters: Vec<String> = truth["tasks"][&at]["awaited_by"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
            match awaiters.len() {
                0 => break,
                1 => at = awaiters[0].clone(),
                _ => {
                    several = format!("[awaited by tasks {}];", awaiters.join(", "));
                    break;
                }
            }
            chain.push(format!("[awaited by task {at}];"));
        }
        chain.reverse();
        format!("[task {task}];{several}{}", chain.concat())
    };
    let mut seen: HashMap<&str, f64> = HashMap::new();
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        for (task, code) in [("shared", "shared_work ("), ("alpha", "alpha_spin ("), ("beta", "beta_spin (")] {
            if stack.contains(code) {
                assert!(stack.starts_with(&roots(task)), "{task}'s code not under {}: {line}", roots(task));
                *seen.entry(task).or_insert(0.0) += n.parse::<f64>().unwrap();
            }
        }
    }
    // shared spins 1 ms in 11: about 90 samples in 2 s at 499 Hz.
    assert!(seen.get("shared").copied().unwrap_or(0.0) >= 20.0 && seen.get("alpha").copied().unwrap_or(0.0) >= 20.0, "{seen:?}");
}

/// --async --idle, the wall-clock view of fixtures/async_idle.py's event
/// loop: while it waits in its selector no task runs, so those samples are
/// under no task; while a task's code runs, on CPU or blocked in a system
/// call (the loop stuck in it), they are under the task. The shares of the
/// loop's samples are the shares of its wall time the fixture measured.
fn idle_loop_samples_are_under_a_task_only_while_one_runs(py: Interpreter) {
    let label = format!("debian {} --idle", py.version);
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("idle.folded");
    let (inside, truth_path) = py.output("async-idle-truth.json");
    let json = dir.path().join("idle.json");
    let out = py.pytrace(&["sample", "--async", "--idle", "-r", RATE, "--folded", folded.to_str().unwrap(), "--json", json.to_str().unwrap()], "async_idle.py", &[&inside, &longer(3.0)]);
    assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
    // A thread read while it runs on another CPU may switch tasks during
    // the read: such samples are left out and counted, rare (a walk takes
    // microseconds of the loop's milliseconds between switches; here 0.3 to
    // 0.6 %, in the emulated VMs, whose walks are slower, 1.1 to 1.3 %).
    let report = read_report(&json);
    let switched = report["counters"]["task_switched"].as_f64().unwrap_or_else(|| panic!("{label}: no task_switched counter"));
    // Ticks pytrace was too late to take (a busy machine, the target
    // itself on the CPU meanwhile): a share may lack up to that many.
    let missed = report["counters"]["idle_ticks_missed"].as_f64().unwrap_or_else(|| panic!("{label}: no idle_ticks_missed counter"));
    // Samples of a thread whose stack changed between the two reads of it
    // are dropped and counted (torn): the running task's, mostly, since
    // its innermost calls come and go between the reads, and more of them
    // the slower the walk (a loaded machine): each is one sample a share
    // may lack, as a missed tick is.
    let torn = report["counters"]["torn"].as_f64().unwrap_or_else(|| panic!("{label}: no torn counter"));
    let truth: HashMap<String, f64> = serde_json::from_slice(&std::fs::read(&truth_path).unwrap()).unwrap();
    // The loop's samples: the event loop's own frame is in each, the
    // selector's when it waits, a task's coroutine when it runs.
    let (mut in_loop, mut waiting) = (0.0, 0.0);
    let mut in_task: HashMap<&str, f64> = HashMap::new();
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: f64 = n.parse().unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        let named = |name: &str| frames.iter().any(|f| f.split(' ').next().is_some_and(|q| q == name || q.ends_with(&format!(".{name}"))));
        if !named("_run_once") {
            continue;
        }
        in_loop += n;
        let roots: String = frames.iter().take_while(|f| f.starts_with('[')).fold(String::new(), |s, f| s + f + ";");
        if frames.iter().any(|f| f.ends_with("Selector.select (selectors.py)")) {
            assert_eq!(roots, "", "{label}: the loop waiting in its selector under a task: {line}");
            waiting += n;
        }
        for (task, code) in [("blocker", "blocker_sleep"), ("spinner", "spinner_spin")] {
            if named(code) {
                assert_eq!(roots, format!("[task {task}];[awaited by task Task-1];"), "{label}: {task}'s code not under its task: {line}");
                *in_task.entry(task).or_insert(0.0) += n;
            }
        }
    }
    assert!(in_loop >= 500.0, "{label}: {in_loop} samples of the loop");
    assert!(switched <= 0.01 * slowdown() * in_loop, "{label}: {switched} samples left out as switching tasks, of {in_loop}");
    let loop_wall = truth["loop"];
    let idle_wall = loop_wall - truth["blocker"] - truth["spinner"];
    let (blocker, spinner) = (in_task.get("blocker").copied().unwrap_or(0.0), in_task.get("spinner").copied().unwrap_or(0.0));
    // The rest of the loop's time is its waits and its own code between
    // them (and the tasks' own between their timed parts): mostly waits.
    let rest = in_loop - blocker - spinner;
    for (what, n, seconds) in [("blocker", blocker, truth["blocker"]), ("spinner", spinner, truth["spinner"]), ("neither task", rest, idle_wall)] {
        let p = seconds / loop_wall;
        let share = n / in_loop;
        // Four binomial standard errors, plus three points (the loop's
        // samples before main starts and after it ends are outside its
        // wall time), plus the share of the ticks pytrace missed and of the
        // samples it dropped as torn (each one sample some state lacks).
        let bound = 4.0 * (p * (1.0 - p) / in_loop).sqrt() + 0.03 + (missed + torn) / in_loop;
        assert!((share - p).abs() <= bound, "{label}: {what} has {share:.3} of the loop's samples, {p:.3} of its wall time (bound {bound:.3}, {missed} ticks missed, {torn} torn); truth {truth:?}");
    }
    // Enough of them in the selector that none being under a task says
    // something (most, here; fewer in an emulated VM, where the loop's own
    // code between waits is slower: 70 to 80 %).
    assert!(waiting >= 100.0, "{label}: {waiting} of the {rest} samples outside the tasks' code in the selector");
}

over_builds! {
    debian_3_14(Interpreter::debian("3.14")): tasks_carry_their_names_chains_and_shares, idle_loop_samples_are_under_a_task_only_while_one_runs;
    debian_3_15(Interpreter::debian("3.15")): tasks_carry_their_names_chains_and_shares, idle_loop_samples_are_under_a_task_only_while_one_runs;
}

fn refused(label: &str, argv: Vec<String>, version: &str) {
    let mut args = vec!["sample", "--async", "-d", "1", "--"];
    args.extend(argv.iter().map(String::as_str));
    let out = pytrace(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{label}: {err}");
    let sentence = format!("sample --async needs CPython 3.14 or later, which exposes asyncio's debug offsets; this target runs {version}");
    assert!(err.contains(&sentence) && !err.contains("panicked"), "{label}: {err}");
}

#[test]
fn async_is_refused_before_3_14() {
    let _machine = shared();
    refused("debian 3.11", vec!["/usr/bin/python3.11".into(), "-c".into(), "import time; time.sleep(0.5)".into()], "3.11");
    refused("debian 3.13", Interpreter::debian("3.13").argv("async_tasks.py", &["/dev/null", "0.1"]), "3.13");
}
