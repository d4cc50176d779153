//! `pytrace dump --async` against what fixtures/async_dump.py's own asyncio
//! says of itself (asyncio.all_tasks, asyncio.capture_call_graph, each
//! task's coroutine): two event loops in two threads, one spinning through
//! two tasks, one mostly idle with a task awaited by two others at once
//! (their names read from the set asyncio keeps them in). Each
//! thread's running task must be the one whose code its stack is in, with
//! its awaiters; the pending tasks must be exactly the fixture's, each
//! under the thread that made it, with its coroutine and awaiters. On
//! Debian's 3.14 and 3.15; before 3.14, one sentence and a non-zero exit.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::matrix::Interpreter;
use crate::common::*;
use serde_json::Value;

/// Dumps taken of one target: enough that its spinning thread is found
/// running a task in most of them.
const DUMPS: usize = 5;

/// The awaiters asyncio gives `task`: those awaiting it one by one, the
/// nearest first, then (sorted) the several awaiting the last of them at
/// once, where the chain forks.
fn awaiter_chain(truth: &Value, task: &str) -> (Vec<String>, Vec<String>) {
    let mut chain = Vec::new();
    let mut at = task.to_string();
    loop {
        let awaiters = strings(&truth["tasks"][&at]["awaited_by"]);
        match awaiters.len() {
            0 => return (chain, Vec::new()),
            1 => at = awaiters[0].clone(),
            _ => return (chain, awaiters),
        }
        chain.push(at.clone());
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

/// A reported task's awaiters, as awaiter_chain gives them; never cut here.
fn awaiters(task: &Value) -> (Vec<String>, Vec<String>) {
    assert_eq!(task["more_awaiters"], false, "{task}");
    (strings(&task["awaited_by"]), strings(&task["awaited_by_several"]))
}

fn tasks_and_awaiters_are_asyncios_own(py: Interpreter) {
    let label = format!("debian {}", py.version);
    let (inside, truth_path) = py.output("async-dump-truth.json");
    let target = py.start_waiting("async_dump.py", &[&inside]);
    let truth: Value = read_json(&truth_path);
    let tid_of = |thread: &str| truth["threads"][thread].as_u64().unwrap();
    let pid = target.pid().to_string();
    let mut found_running = 0;
    for _ in 0..DUMPS {
        let out = pytrace(&["dump", "--async", "-p", &pid, "--json", "-"]);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let dump: Value = parse_report(&out.stdout);
        let thread = |tid: u64| dump["threads"].as_array().unwrap().iter().find(|t| t["tid"] == tid).unwrap_or_else(|| panic!("{label}: no thread {tid}: {dump}"));
        // The spinning loop's thread: in a task's code, that task is the
        // one it runs, with asyncio's awaiters.
        let main = thread(tid_of("main"));
        let names: Vec<&str> = main["frames"].as_array().unwrap().iter().filter_map(|f| f["name"].as_str()).collect();
        for (task, code) in [("alpha", "alpha_spin"), ("beta", "beta_spin")] {
            if names.contains(&code) {
                assert_eq!(main["task"]["name"], task, "{label}: main thread in {code}: {main}");
                assert_eq!(awaiters(&main["task"]), awaiter_chain(&truth, task), "{label}: {main}");
                found_running += 1;
            }
        }
        // The mostly idle loop runs shared now and then, else no task.
        let side = thread(tid_of("side-loop"));
        let in_shared = side["frames"].as_array().unwrap().iter().any(|f| f["name"] == "shared_work");
        match side.get("task") {
            Some(task) => {
                assert_eq!(task["name"], "shared", "{label}: {side}");
                assert_eq!(awaiters(task), awaiter_chain(&truth, "shared"), "{label}: {side}");
            }
            None => assert!(!in_shared, "{label}: the side loop's thread in shared's code without its task: {side}"),
        }
        // Every pending task, under the thread that made it.
        let listed: BTreeMap<String, &Value> = dump["asyncio"]["tasks"].as_array().unwrap().iter().map(|t| (t["name"].as_str().unwrap_or("?").to_string(), t)).collect();
        let want: BTreeSet<&String> = truth["tasks"].as_object().unwrap().keys().collect();
        assert_eq!(listed.keys().collect::<BTreeSet<_>>(), want, "{label}: {}", dump["asyncio"]);
        assert_eq!(dump["asyncio"]["cut"], false, "{label}");
        let mut running = BTreeMap::new();
        for (name, task) in &listed {
            let t = &truth["tasks"][name];
            assert_eq!(task["tid"].as_u64(), Some(tid_of(t["thread"].as_str().unwrap())), "{label}: {name}: {task}");
            assert_eq!(task["coroutine"], t["coroutine"], "{label}: {name}: {task}");
            assert_eq!(awaiters(task), awaiter_chain(&truth, name), "{label}: {name}: {task}");
            if task["state"] == "running" {
                *running.entry(task["tid"].as_u64()).or_insert(0) += 1;
            } else {
                assert_eq!(task["state"], "waiting", "{label}: {task}");
            }
        }
        assert!(running.values().all(|&n| n <= 1), "{label}: several tasks running on one thread: {}", dump["asyncio"]);
    }
    // alpha and beta spin nearly all the time: most dumps find one of them.
    assert!(found_running >= DUMPS / 2, "{label}: the main thread ran a task's code in {found_running} of {DUMPS} dumps");
    // The table lists every task too.
    let table = pytrace(&["dump", "--async", "-p", &pid]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains(&format!("asyncio tasks: {} pending", truth["tasks"].as_object().unwrap().len())), "{label}: {text}");
    for name in truth["tasks"].as_object().unwrap().keys() {
        assert!(text.lines().any(|l| l.split_whitespace().nth(3) == Some(name)), "{label}: no row for {name}:\n{text}");
    }
}

over_builds! {
    debian_3_14(Interpreter::debian("3.14")): tasks_and_awaiters_are_asyncios_own;
    debian_3_15(Interpreter::debian("3.15")): tasks_and_awaiters_are_asyncios_own;
}

/// Before 3.14 CPython publishes no task layout: one sentence, a non-zero
/// exit, and the target runs on.
#[test]
fn dump_async_is_refused_before_3_14() {
    let _machine = shared();
    let py = Interpreter::debian("3.13");
    let sleep = ["-c", "import time; time.sleep(30)"];
    let mut chrooted = py.argv("sleep_and_spin.py", &[]);
    chrooted.truncate(3);
    let sleepers = [("3.13", chrooted), ("3.11", vec!["/usr/bin/python3.11".to_string()])];
    for (version, mut argv) in sleepers {
        argv.extend(sleep.iter().map(|a| a.to_string()));
        let mut target = Proc(std::process::Command::new(&argv[0]).args(&argv[1..]).spawn().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(500));
        let out = pytrace(&["dump", "--async", "-p", &target.pid().to_string()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{version}: {err}");
        let sentence = format!("dump --async needs CPython 3.14 or later, which exposes asyncio's debug offsets; this target runs {version}");
        assert!(err.contains(&sentence) && !err.contains("panicked"), "{version}: {err}");
        assert!(target.0.try_wait().unwrap().is_none(), "{version}: the target did not survive");
    }
}

/// A 3.14 program that never imported asyncio: its stacks, and one
/// sentence saying why there are no tasks, with a zero exit (nothing is
/// wrong with the target).
#[test]
fn dump_async_without_asyncio_says_why() {
    let _machine = shared();
    let py = Interpreter::debian("3.14");
    let mut argv = py.argv("sleep_and_spin.py", &[]);
    argv.truncate(3);
    argv.extend(["-c".to_string(), "import time; time.sleep(30)".to_string()]);
    let target = Proc(std::process::Command::new(&argv[0]).args(&argv[1..]).spawn().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = pytrace(&["dump", "--async", "-p", &target.pid().to_string(), "--json", "-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dump: Value = parse_report(&out.stdout);
    assert_eq!(dump["asyncio"]["tasks"].as_array().map(Vec::len), Some(0), "{dump}");
    assert_eq!(dump["asyncio"]["error"], "the target has not imported asyncio's C module (_asyncio) yet", "{dump}");
    assert!(dump["threads"][0]["frames"].as_array().is_some_and(|f| !f.is_empty()), "{dump}");
}
